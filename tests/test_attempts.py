"""Multi-attempt rollouts (`rollout.attempts`): a wrong attempt is told so and tries again."""

import pytest

from rlvr.config import ConfigError, resolve_config
from rlvr.rollout.attempts import Attempts, retry_turn
from rlvr.rollout.base import SamplingParams
from rlvr.training.rl import train
from scripted_engine import TOK, Scripted, ids
from test_call_formats import qwen_like_tokenizer
from tiny_run import TINY_RUN

END = TOK.convert_tokens_to_ids("<|im_end|>")


def test_the_retry_turn_is_the_chat_templates_user_turn_after_the_end_of_turn():
    end, tokens = retry_turn(TOK, "Wrong.")
    assert end == END
    assert TOK.decode(tokens) == "<|user|>Wrong.<|im_end|><|assistant|>"
    qwen = qwen_like_tokenizer()
    end, tokens = retry_turn(qwen, "Wrong.")
    assert qwen.decode([end]) == "<|im_end|>"
    assert qwen.decode(tokens) == "\n<|im_start|>user\nWrong.<|im_end|>\n<|im_start|>assistant\n"
    plain = qwen_like_tokenizer("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    with pytest.raises(ConfigError, match="ends an assistant turn with '\\\\n', not a special"):
        retry_turn(plain, "Wrong.")


def _right_if_five(rows, texts):
    return ["5" in text for text in texts]


def test_a_wrong_attempt_gets_the_user_turn_and_another_sample():
    """Row 0 answers 3 (wrong): the retry turn (masked, log-prob 0) and a second attempt
    follow, sampled from the prompt and everything before it; row 1 answers 5 (right) and
    stops; the judge reads each attempt's own text, without its end-of-turn token."""
    first, second = "<answer>3</answer><|im_end|>", "<answer>5</answer><|im_end|>"
    engine = Scripted([first, second], [second])
    seen = []

    def judge(rows, texts):
        seen.append((rows, texts))
        return _right_if_five(rows, texts)

    turn = retry_turn(TOK, "Wrong.")
    out = Attempts(engine, TOK, 2, judge, turn).generate(
        [ids("Q")], SamplingParams(n=2, max_new_tokens=100)
    )
    retry = turn[1]
    assert out.completion_ids[0] == ids(first) + retry + ids(second)
    assert out.completion_ids[1] == ids(second)
    assert out.tool_mask[0] == [False] * len(ids(first)) + [True] * len(retry) + [False] * len(
        ids(second)
    )
    assert out.logprobs[0][len(ids(first)) : len(ids(first)) + len(retry)] == [0.0] * len(retry)
    assert out.attempts == [2, 1] and out.finish_reason == ["stop", "stop"]
    assert seen == [([0, 0], ["<answer>3</answer>", "<answer>5</answer>"])]
    (again, params) = engine.asked[1]
    assert again == [ids("Q") + ids(first) + retry]
    assert (params.n, params.max_new_tokens) == (1, 100 - len(ids(first)) - len(retry))


def test_each_attempt_may_call_tools_and_their_results_stay_masked():
    """Attempts around a tool caller: the first attempt calls the calculator and answers
    wrong, the second answers right; the tool's result and the retry turn are masked, the
    calls of every attempt are counted, and the judge reads the attempt with its result."""
    from rlvr.rollout.tools import ToolCaller

    call = "<calculator>2+3</calculator>"
    engine = Scripted([call], ["<answer>4</answer><|im_end|>"], ["<answer>5</answer><|im_end|>"])
    caller = ToolCaller(engine, TOK, ["calculator"])
    seen = []

    def judge(rows, texts):
        seen.extend(texts)
        return _right_if_five(rows, [text.rsplit("<answer>", 1)[-1] for text in texts])

    turn = retry_turn(TOK, "Wrong.")
    out = Attempts(caller, TOK, 2, judge, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=200)
    )
    result = "<result>5</result>"
    first = call + result + "<answer>4</answer><|im_end|>"
    assert seen == [call + result + "<answer>4</answer>"]
    assert out.completion_ids[0] == ids(first) + turn[1] + ids("<answer>5</answer><|im_end|>")
    assert out.tool_mask[0] == (
        [False] * len(ids(call))
        + [True] * len(ids(result))
        + [False] * len(ids("<answer>4</answer><|im_end|>"))
        + [True] * len(turn[1])
        + [False] * len(ids("<answer>5</answer><|im_end|>"))
    )
    assert (out.tool_calls, out.failed_calls, out.attempts) == ([1], [0], [2])


def test_attempts_stop_at_the_limit_the_budget_and_a_cut_off_attempt():
    wrong = "<answer>3</answer><|im_end|>"
    turn = retry_turn(TOK, "Wrong.")
    # two attempts at most: a second wrong one ends the completion
    engine = Scripted([wrong], [wrong])
    out = Attempts(engine, TOK, 2, _right_if_five, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=100)
    )
    assert out.attempts == [2] and len(engine.asked) == 2
    # no room for the retry turn, or an attempt cut off by the budget: no retry
    for budget, text in ((len(ids(wrong)) + 5, wrong), (100, "<answer>3")):
        engine = Scripted([text])
        out = Attempts(engine, TOK, 3, _right_if_five, turn).generate(
            [ids("Q")], SamplingParams(n=1, max_new_tokens=budget)
        )
        assert out.attempts == [1] and len(engine.asked) == 1
    # a second attempt longer than the room left is cut and ends by length
    budget = len(ids(wrong)) + len(turn[1]) + 2
    engine = Scripted([wrong], [wrong])
    out = Attempts(engine, TOK, 2, _right_if_five, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=budget)
    )
    assert len(out.completion_ids[0]) == budget and out.finish_reason == ["length"]


def test_attempts_need_the_chat_template():
    with pytest.raises(ConfigError, match=r"set data\.template=chat"):
        resolve_config(preset="grpo", overrides=["rollout.attempts=2", "data.template=r1"])
    with pytest.raises(ConfigError, match=r"set data\.template=chat"):
        resolve_config(preset="grpo", overrides=["eval.attempts=2", "data.template=r1"])


def test_an_rl_run_masks_the_retry_turns_and_logs_the_attempts(tmp_path):
    """The retry turns of every sample are out of the response mask, exactly
    (attempts − 1) × the turn's length of them; `attempts/mean` is the mean count; the
    held-out evaluations allow `eval.attempts`."""
    from rlvr.tracking.jsonl import read_jsonl

    seen = []

    def record(batch):
        seen.append(batch)
        return batch

    settings = [
        *TINY_RUN,
        "data.template=chat",
        "rollout.max_new_tokens=40",
        "rollout.attempts=3",
        "rollout.retry_message=No.",
        "train.steps=2",
        f"train.output_dir={tmp_path}",
        "eval.every_steps=2",
        "eval.samples=4",
        "eval.k=2",
        "eval.attempts=2",
    ]
    run = train(resolve_config(preset="grpo", overrides=settings), filters=(record,))
    metrics = read_jsonl(run / "metrics.jsonl")
    retry = len(retry_turn(TOK, "No.")[1])
    for batch, logged in zip(seen, metrics, strict=True):
        lengths = [len(c) for c in batch.completion_ids]
        masked = [n - int(m.sum()) for n, m in zip(lengths, batch.response_mask, strict=True)]
        assert masked == [(a - 1) * retry for a in batch.attempts.tolist()]
        assert logged["attempts/mean"] == pytest.approx(batch.attempts.float().mean().item())
    assert any(batch.attempts.max() > 1 for batch in seen)  # a random model is mostly wrong
    evaluations = read_jsonl(run / "eval.jsonl")  # held out with eval.attempts, steps 0 and 2
    assert [e["step"] for e in evaluations] == [0, 2]
    assert all(1.0 < e["attempts/mean"] <= 2.0 for e in evaluations)
    _evaluated_with_attempts(run, tmp_path)


def _evaluated_with_attempts(run, tmp_path):
    """`rlvr eval --attempts`: the line says how many attempts were allowed and made; the
    option is refused, named, with another template."""
    import json

    from typer.testing import CliRunner

    from rlvr.cli import app

    runner = CliRunner()
    base = ["eval", "--model", str(run), "--samples", "4", "--k", "2", "--max-new-tokens", "40"]
    out = tmp_path / "cli_eval.jsonl"
    result = runner.invoke(
        app, [*base, "--attempts", "2", "--retry-message", "No.", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    line = json.loads(out.read_text())
    assert line["attempts"] == 2 and 1.0 <= line["attempts/mean"] <= 2.0
    result = runner.invoke(app, [*base, "--attempts", "2", "--template", "r1"])
    assert result.exit_code == 2 and "--attempts 2 tells a wrong attempt so" in result.stderr


WRONG = "<answer>3</answer><|im_end|>"


def _wrong(rows, texts):
    return [False] * len(texts)


def test_no_retry_when_the_retry_turn_leaves_no_room_for_a_token():
    turn = retry_turn(TOK, "Wrong.")
    engine = Scripted([WRONG])
    out = Attempts(engine, TOK, 3, _wrong, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=len(ids(WRONG)) + len(turn[1]))
    )
    assert out.attempts == [1] and len(engine.asked) == 1


def test_an_attempt_that_exactly_fills_the_room_ends_by_its_own_stop():
    turn = retry_turn(TOK, "Wrong.")
    budget = 2 * len(ids(WRONG)) + len(turn[1])
    engine = Scripted([WRONG], [WRONG])
    out = Attempts(engine, TOK, 2, _wrong, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=budget)
    )
    assert len(out.completion_ids[0]) == budget and out.finish_reason == ["stop"]


def test_the_judge_reads_only_the_latest_attempt():
    turn, seen = retry_turn(TOK, "Wrong."), []

    def judge(rows, texts):
        seen.extend(texts)
        return [False] * len(texts)

    engine = Scripted([WRONG], ["<answer>4</answer><|im_end|>"], [WRONG])
    params = SamplingParams(n=1, max_new_tokens=200)
    Attempts(engine, TOK, 3, judge, turn).generate([ids("Q")], params)
    assert seen == ["<answer>3</answer>", "<answer>4</answer>"]


def test_only_an_end_of_turn_stop_is_an_attempt():
    """A completion that stopped on another stop sequence ("?" here) is not judged or retried."""
    turn = retry_turn(TOK, "Wrong.")
    engine = Scripted(["<answer>3</answer>?"])
    out = Attempts(engine, TOK, 2, _wrong, turn).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=100)
    )
    assert out.finish_reason == ["stop"] and out.attempts == [1] and len(engine.asked) == 1


def score_is_text(prompts, completions, **columns):
    """A verifier whose score is the completion itself, read as a number."""
    return [float(text) for text in completions]


def test_the_loops_judge_counts_a_verifier_score_of_one_or_more_as_right():
    """`attempts_around` judges by the task's verifier alone, unweighted: 1 and 1.5 are right,
    0.5 (partial credit) and 0 are wrong; one attempt leaves the engine as it is."""
    from rlvr.data.problem import Problem
    from rlvr.training.rewarding import attempts_around

    engine = Scripted(["1"])
    problems = [Problem(f"Q{i}", "1") for i in range(4)]
    prompts = [f"Q{i}" for i in range(4)]
    verifier = ("test_attempts:score_is_text", 5.0)
    assert attempts_around(engine, TOK, (1, "No."), problems, prompts, verifier) is engine
    wrapped = attempts_around(engine, TOK, (2, "No."), problems, prompts, verifier)
    assert wrapped.judge([0, 1, 2, 3], ["1", "1.5", "0.5", "0"]) == [True, True, False, False]


def test_a_template_that_drops_the_retry_message_is_refused():
    only_assistant = qwen_like_tokenizer(
        "{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}<|im_end|>"
        "{% endif %}{% endfor %}"
    )
    with pytest.raises(ConfigError, match="does not render a user turn after an assistant"):
        retry_turn(only_assistant, "Wrong.")


def test_the_calls_of_every_attempt_add_up_and_a_retry_may_stop_at_once():
    """Both attempts call the calculator (no 5 in the first: wrong), the second's call fails:
    2 calls, 1 failed. The retry is sampled with min_new_tokens 0 whatever the first
    attempt's minimum."""
    from rlvr.rollout.tools import ToolCaller

    call, bad = "<calculator>2+2</calculator>", "<calculator>2+</calculator>"
    engine = Scripted(
        [call], ["<answer>4</answer><|im_end|>"], [bad], ["<answer>5</answer><|im_end|>"]
    )
    caller = ToolCaller(engine, TOK, ["calculator"])
    out = Attempts(caller, TOK, 2, _right_if_five, retry_turn(TOK, "Wrong.")).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=300, min_new_tokens=5)
    )
    assert (out.tool_calls, out.failed_calls, out.attempts) == ([2], [1], [2])
    assert engine.asked[2][1].min_new_tokens == 0
