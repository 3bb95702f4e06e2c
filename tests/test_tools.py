"""Tool calls during rollouts: the tools, the call loop and the masks the trainer gets."""

import threading
import time

import pytest
import torch

from rlvr.config import ConfigError, RLConfig, resolve_config
from rlvr.data.tasks import load_task
from rlvr.models.tiny import build_tiny_model
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.tools import (
    MAX_OUTPUT_CHARS,
    TOOLS,
    ToolCaller,
    ToolUse,
    calculator,
    python,
    run_tool,
)
from rlvr.training.sampling import rollout_batch
from scripted_engine import TOK, Scripted, ids


@TOOLS.register("test_raises")
def _raises(arguments: str, *, timeout_s: float = 5.0) -> str:
    raise RuntimeError(f"cannot {arguments}")


@pytest.mark.parametrize(
    ("expression", "output"),
    [
        ("12*(3+4)", "84"),
        (" 7/2 ", "3.5"),
        ("-5//2", "-3"),
        ("17%5", "2"),
        ("3.0*2", "6"),
        ("2**10", "1024"),
        ("1/3", "0.3333333333"),
        ("1/0", "error: division by zero"),
        ("2**100", "error: the power is too large"),
        ("9**9**9", "error: the power is too large"),
        ("1e300*1e300", "error: the result is too large"),
        ("__import__('os').system('ls')", "error: not arithmetic: Call("),
        ("(lambda: 1)()", "error: not arithmetic: Call("),
        ("x+1", "error: not arithmetic: Name("),
        ("'a'*3", "error: not arithmetic: Constant(value='a')"),
        ("1+", "error: invalid syntax"),
        ("1" * 201, "error: the expression is over 200 characters"),
    ],
)
def test_calculator_evaluates_arithmetic_and_nothing_else(expression, output):
    assert calculator(expression).startswith(output)


def test_python_tool_prints_in_the_sandbox_and_reports_failures():
    assert python("print(sum(range(10)))") == "45"
    assert python("raise ValueError('bad input')") == "error: ValueError: bad input"
    assert python("while True: pass", timeout_s=0.5) == "error: timed out after 0.5 s"


def test_a_tool_that_raises_or_talks_too_much_cannot_stop_the_rollout():
    assert run_tool("test_raises", "fly", 1.0) == "error: RuntimeError: cannot fly"
    assert run_tool("python", "print('x' * 1000)", 5.0) == "x" * MAX_OUTPUT_CHARS


def test_a_call_runs_between_turns_and_its_result_is_marked_as_the_tools():
    """Sample 0 calls the calculator, reads the result and answers; sample 1 never calls.
    The continuation starts from the prompt, the call and its result, one sample per row, with
    the budget left; the result's tokens are marked and have log-prob 0."""
    engine = Scripted(["<calculator>6*7</calculator>", "no call?"], ["so <answer>42</answer>"])
    caller = ToolCaller(engine, TOK, ["calculator"])
    prompt = ids("Q")
    out = caller.generate([prompt], SamplingParams(n=2, max_new_tokens=64))
    call, result, answer = (
        "<calculator>6*7</calculator>",
        "<result>42</result>",
        "so <answer>42</answer>",
    )
    assert out.completion_ids[0] == ids(call + result + answer)
    n_call, n_result, n_answer = len(ids(call)), len(ids(result)), len(ids(answer))
    assert out.tool_mask[0] == [False] * n_call + [True] * n_result + [False] * n_answer
    assert out.logprobs[0] == [-0.5] * n_call + [0.0] * n_result + [-0.5] * n_answer
    assert out.completion_ids[1] == ids("no call?") and not any(out.tool_mask[1])
    assert out.finish_reason == ["length", "stop"] and out.prompt_index == [0, 0]
    (_, first), (again, params) = engine.asked
    assert first.stop_sequences == (tuple(ids("</calculator>")),) and first.n == 2
    assert again == [prompt + ids(call + result)]
    assert params.n == 1 and params.max_new_tokens == 64 - n_call - n_result
    assert out.tool_calls == [1, 0] and out.failed_calls == [0, 0]


def test_the_budget_counts_the_results_and_calls_stop_at_the_limit():
    """A result that does not fit is cut at the budget (finish `length`, no continuation);
    a call past `max_calls` ends the completion without a result; a closing tag without its
    opening tag gets an error as its result."""
    call = "<calculator>1+1</calculator>"
    cut = ToolCaller(Scripted([call]), TOK, ["calculator"])
    out = cut.generate([ids("Q")], SamplingParams(n=1, max_new_tokens=len(ids(call)) + 5))
    assert out.completion_ids[0] == ids(call + "<resu") and out.finish_reason == ["length"]
    limited = ToolCaller(Scripted([call], [call]), TOK, ["calculator"], max_calls=1)
    out = limited.generate([ids("Q")], SamplingParams(n=1, max_new_tokens=200))
    assert out.completion_ids[0] == ids(call + "<result>2</result>" + call)
    assert out.tool_calls == [1] and out.finish_reason == ["stop"]
    orphan = ToolCaller(Scripted(["1+1</calculator>"], ["?"]), TOK, ["calculator"])
    out = orphan.generate([ids("Q")], SamplingParams(n=1, max_new_tokens=200))
    assert TOK.decode(out.completion_ids[0]) == (
        "1+1</calculator><result>error: no <calculator> before </calculator></result>?"
    )


SEEN_THREADS: set[int] = set()


@TOOLS.register("test_slow")
def _slow(arguments: str, *, timeout_s: float = 5.0) -> str:
    SEEN_THREADS.add(threading.get_ident())
    time.sleep(0.05)
    return arguments.upper()


def test_the_calls_of_a_turn_run_at_once_and_keep_their_order():
    """Four samples call a slow tool in the same turn: the calls run on several threads, and
    each sample gets its own call's output."""
    turns = [[f"<test_slow>{c}</test_slow>" for c in "abcd"], ["?"] * 4]
    caller = ToolCaller(Scripted(*turns), TOK, ["test_slow"])
    out = caller.generate([ids("Q")] * 4, SamplingParams(n=1, max_new_tokens=64))
    texts = [TOK.decode(c) for c in out.completion_ids]
    assert texts == [f"<test_slow>{c}</test_slow><result>{c.upper()}</result>?" for c in "abcd"]
    assert len(SEEN_THREADS) > 1


def test_the_trainer_does_not_train_on_a_tools_result():
    """rollout_batch: the response mask is 0 on the result's tokens, 1 on the policy's; the
    rollout log-probs there are 0; the calls are counted per sample."""
    cfg = resolve_config(overrides=["data.train_size=4", "rollout.samples_per_prompt=2"])
    task = load_task(cfg.data)
    engine = Scripted(["<calculator>2+3</calculator>", "5?"], ["<answer>5</answer>?"])
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    batch = rollout_batch(ToolCaller(engine, TOK, ["calculator"]), TOK, task, [0], cfg)
    call, result, answer = (
        "<calculator>2+3</calculator>",
        "<result>5</result>",
        "<answer>5</answer>?",
    )
    n_call, n_result, n_answer = len(ids(call)), len(ids(result)), len(ids(answer))
    mask = batch.response_mask[0].tolist()
    assert mask == [1] * n_call + [0] * n_result + [1] * n_answer
    assert batch.response_mask[1].tolist() == [1, 1] + [0] * (len(mask) - 2)
    assert batch.rollout_logprobs[0, n_call : n_call + n_result].eq(0).all()
    assert batch.tool_calls.tolist() == [1, 0]
    assert batch.completion_texts[0].startswith(call + result)


def test_tool_settings_are_checked_before_anything_loads():
    from rlvr.config_offline import CurateConfig

    with pytest.raises(ValueError, match="unknown tool 'calc'; did you mean 'calculator'"):
        RLConfig.model_validate({"rollout": {"tools": ["calc"]}})
    with pytest.raises(ValueError, match="a tool is listed twice"):
        RLConfig.model_validate({"rollout": {"tools": ["python", "python"]}})
    hermes = {"tools": ["calculator"], "tool_format": "hermes"}
    for config, section in ((RLConfig, "rollout"), (CurateConfig, "curate")):
        with pytest.raises(ValueError) as error:
            config.model_validate({section: hermes, "data": {"template": "r1"}})
        assert (
            f"{section}.tool_format=hermes passes the tools' schemas through the chat template, "
            "which data.template=r1 does not use: set data.template=chat"
        ) in str(error.value)
        config.model_validate({section: hermes})  # the chat template: fine
    assert ToolUse.of(RLConfig().rollout).around(engine := Scripted(), TOK) is engine


def test_an_rl_run_with_tools_logs_its_calls_and_is_evaluated_with_them(tmp_path):
    """Two steps of the tiny model with the calculator on: the wiring from the config to the
    engine and the metrics (the untrained model calls no tool; the learning is measured in
    `benchmarks/tool_learning.py`). `rlvr eval` of the run calls the run's tools unless
    --tools says otherwise, and names a tool it does not know."""
    import json

    from typer.testing import CliRunner

    from rlvr.cli import app
    from rlvr.data.tasks import trained_on
    from rlvr.run_layout import latest_checkpoint
    from rlvr.tracking.jsonl import read_jsonl
    from rlvr.training.rl import train
    from tiny_run import TINY_RUN

    overrides = [*TINY_RUN, "train.steps=2", "rollout.tools=[calculator]"]
    cfg = resolve_config(overrides=[*overrides, f"train.output_dir={tmp_path / 'run'}"])
    run_dir = train(cfg, show_progress=False)
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    assert [m["tool_calls/mean"] for m in metrics] == [0.0, 0.0]
    assert [m["tool_calls/frac"] for m in metrics] == [0.0, 0.0]
    assert torch.isfinite(torch.tensor([m["loss"] for m in metrics])).all()
    saved = trained_on(latest_checkpoint(run_dir))
    assert saved.tools == {
        "tools": ["calculator"],
        "max_tool_calls": 4,
        "tool_timeout": 5.0,
        "tool_format": "tags",
    }
    runner = CliRunner()
    base = ["eval", "--model", str(run_dir), "--samples", "2", "--k", "1"]
    for n, (extra, shown) in enumerate(
        (
            ([], ("calculator", "tags")),
            (["--tools", "none"], (None, None)),
            (["--tool-format", "hermes"], ("calculator", "hermes")),
        )
    ):
        out = tmp_path / f"eval{n}.jsonl"
        result = runner.invoke(app, [*base, *extra, "--output", str(out)])
        assert result.exit_code == 0, result.output
        line = json.loads(out.read_text())
        assert (line.get("tools"), line.get("tool_format")) == shown
    result = runner.invoke(app, [*base, "--tools", "calculator,calc"])
    assert result.exit_code == 2
    assert "--tools: unknown tool 'calc'; did you mean 'calculator'?" in result.stderr
    result = runner.invoke(app, [*base, "--tool-format", "xml"])
    assert result.exit_code == 2 and "--tool-format: Input should be 'tags'" in result.stderr
    result = runner.invoke(app, [*base, "--tool-format", "hermes", "--template", "r1"])
    assert result.exit_code == 2
    assert "which data.template=r1 does not use: set --template chat" in result.stderr


def test_sft_can_leave_a_tools_results_out_of_its_loss(tmp_path, monkeypatch):
    """sft.mask_tool_results: the `<result>...</result>` tokens of a solution are marked, and
    summed_nll then sums the log-probs of the other tokens only (by hand from one forward); a
    run masks by default (its first loss differs from the unmasked run's), and with a slow
    tokenizer, which has no offsets, it is refused unless turned off."""
    import json

    from rlvr.config_offline import SFTConfig
    from rlvr.rollout.call_formats import Code, Tags
    from rlvr.rollout.tools import result_tokens
    from rlvr.training import sft
    from rlvr.training.sft import run_sft, summed_nll

    text = "<calculator>1+2</calculator><result>3</result><answer>3</answer>"
    target, marks = result_tokens(TOK, text, Tags())
    assert target == ids(text)
    assert TOK.decode([t for t, m in zip(target, marks) if m]) == "<result>3</result>"
    model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64, seed=2)
    prompt = ids("What is 1+2?")
    with torch.no_grad():
        logp = model(torch.tensor([prompt + target])).logits[0].log_softmax(-1)
        per_token = logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(target)[:, None])[:, 0]
        kept = [not m for m in marks]
        full = summed_nll(model, [prompt], [target], [0], TOK.pad_token_id)
        masked = summed_nll(model, [prompt], [target], [0], TOK.pad_token_id, [kept])
    torch.testing.assert_close(full, -per_token.sum(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(
        masked, -(per_token * torch.tensor(kept)).sum(), atol=1e-4, rtol=1e-5
    )
    code = "```python\nprint(1+2)\n```\n```output\n3\n```\n<answer>3</answer>"
    for file, solution in (("tool.jsonl", text), ("code.jsonl", code)):
        rows = [
            {"prompt": f"What is {a}+2?", "answer": "3", "solution": solution} for a in range(8)
        ]
        (tmp_path / file).write_text("".join(json.dumps(r) + "\n" for r in rows))

    def first_loss(name, file="tool.jsonl", **sft):
        cfg = SFTConfig.model_validate(
            {
                "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
                "data": {
                    "task": "file",
                    "path": str(tmp_path / file),
                    "solution_column": "solution",
                    "test_size": 2,
                },
                "sft": {"steps": 1, "batch_size": 4, "output_dir": str(tmp_path / name), **sft},
            }
        )
        run_sft(cfg, show_progress=False)
        return json.loads((tmp_path / name / "metrics.jsonl").read_text())["loss"]

    seen = []

    def recording(*args):
        seen.append(args[5] if len(args) > 5 else None)  # the marks of the trained tokens
        return summed_nll(*args)

    monkeypatch.setattr(sft, "summed_nll", recording)
    assert 0 < first_loss("masked") < 10
    assert seen and all(t == [[*kept, True]] * len(t) for t in seen)  # + EOS, trained
    seen.clear()
    first_loss("plain", mask_tool_results=False)
    assert seen and all(trained is None for trained in seen)
    seen.clear()
    first_loss("code", "code.jsonl", tool_format="code")
    kept_code = [not mark for mark in result_tokens(TOK, code, Code())[1]]
    assert sum(kept_code) == len(ids(code)) - len(ids("\n3\n```\n"))
    assert seen and all(t == [[*kept_code, True]] * len(t) for t in seen)
    seen.clear()
    first_loss("code_as_tags", "code.jsonl")  # no <result> in them: nothing left out
    assert seen and all(trained is None for trained in seen)
    monkeypatch.setattr(type(TOK), "is_fast", property(lambda self: False))
    with pytest.raises(
        ConfigError,
        match=r"sft\.mask_tool_results: the solutions have tool results \(sft\.tool_format=tags",
    ):
        first_loss("slow")
    first_loss("slow_plain", mask_tool_results=False)


def test_failed_calls_are_counted_and_can_be_penalised():
    """One sample's call fails (`2+` is not an expression), the other's works: the step's
    tool_calls/failed_frac is 1/2, and the `tool_error` reward (ToRL's penalty at weight 0.5)
    scores the failing sample -1 from the rollout's count of failed calls. Without tools that
    reward is refused in the config."""
    from rlvr.training.metrics import step_metrics
    from rlvr.training.rewarding import RewardScorer

    overrides = [
        "data.train_size=4",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=200",
        "reward.functions=[{name: math}, {name: tool_error, weight: 0.5}]",
    ]
    with pytest.raises(ConfigError, match="reward\\.functions has tool_error, which scores"):
        resolve_config(overrides=overrides)
    cfg = resolve_config(overrides=[*overrides, "rollout.tools=[calculator]"])
    task = load_task(cfg.data)
    engine = Scripted(["<calculator>2+</calculator>", "<calculator>2+3</calculator>"], ["?", "?"])
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    batch = rollout_batch(ToolCaller(engine, TOK, ["calculator"]), TOK, task, [0], cfg)
    assert batch.completion_texts[0].startswith("<calculator>2+</calculator><result>error: ")
    assert batch.failed_calls.tolist() == [1, 0]
    RewardScorer(cfg, task)(batch)
    assert batch.reward_parts["tool_error"].tolist() == [-1.0, 0.0]
    assert batch.rewards.tolist() == [-0.5, 0.0]  # neither answers
    metrics = step_metrics(batch, batch, {}, [], cfg)
    assert (metrics["tool_calls/mean"], metrics["tool_calls/frac"]) == (1.0, 1.0)
    assert metrics["tool_calls/failed_frac"] == 0.5


def test_the_torl_preset_scores_torls_reward_plus_one():
    """ToRL's reward: +1 for the right answer, -1 for a wrong one, and -0.5 more when the code
    fails. The preset weighs the task's 0/1 verifier (`verifier`: `math` here) 2 and
    tool_error 0.5, which is ToRL's reward + 1, so GRPO's advantages are ToRL's. Four samples
    of one prompt, each calling Python once in ToRL's fences: code that runs, then the right
    answer; code that fails, then a wrong one; code that fails, then the right one; code that
    runs, then a wrong one."""
    from rlvr.algorithms import group_normalized_advantages
    from rlvr.training.rewarding import RewardScorer

    overrides = ["data.train_size=4", "rollout.samples_per_prompt=4"]
    cfg = resolve_config(preset="torl", overrides=[*overrides, "rollout.max_new_tokens=200"])
    assert (cfg.rollout.tools, cfg.rollout.tool_format, cfg.rollout.max_tool_calls) == (
        ["python"],
        "code",
        1,
    )
    task = load_task(cfg.data)
    gold = task.train[0].answer
    calls = ["print(2 + 3)", "print(2 +)", "raise ValueError('no')", "print(7)"]
    answers = [gold, f"{gold}1", gold, f"{gold}1"]
    engine = Scripted(
        [f"```python\n{code}\n```\n```output" for code in calls],
        [f"<answer>{a}</answer>?" for a in answers],
    )
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    batch = rollout_batch(ToolUse.of(cfg.rollout).around(engine, TOK), TOK, task, [0], cfg)
    assert batch.failed_calls.tolist() == [0, 1, 1, 0]
    RewardScorer(cfg, task)(batch)
    torl = torch.tensor([1.0, -1.5, 0.5, -1.0], dtype=torch.float64)
    assert batch.reward_parts["math"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch.rewards.tolist() == (torl + 1).tolist()
    torch.testing.assert_close(
        group_normalized_advantages(batch.rewards.double(), batch.group_ids),
        group_normalized_advantages(torl, batch.group_ids),
        atol=1e-12,
        rtol=0,
    )


def test_sft_on_hermes_solutions_prompts_with_the_schemas_and_eval_calls_its_tools(
    tmp_path, monkeypatch
):
    """`sft.tools` with `sft.tool_format=hermes`: the prompts are rendered with the tools'
    schemas (as RL's are), the tool turns are left out of the loss, and `rlvr eval` of the
    SFT model calls the same tools in the same format."""
    import json

    from typer.testing import CliRunner

    from rlvr.cli import app
    from rlvr.config_offline import SFTConfig
    from rlvr.data.tasks import trained_on
    from rlvr.data.templates import encode_prompts
    from rlvr.rollout.call_formats import Hermes, tool_schema
    from rlvr.training import sft
    from rlvr.training.sft import run_sft

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
    solution = call + "<|im_end|>" + Hermes(TOK).result(["3"]) + "<answer>3</answer>"
    rows = [{"prompt": f"What is {a}+2?", "answer": "3", "solution": solution} for a in range(6)]
    (tmp_path / "hermes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rendered = []

    def recording(template, questions, tokenizer, chat_kwargs=None):
        rendered.append(chat_kwargs)
        return encode_prompts(template, questions, tokenizer, chat_kwargs)

    monkeypatch.setattr(sft, "encode_prompts", recording)
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"task": "file", "path": str(tmp_path / "hermes.jsonl"),
                     "solution_column": "solution", "test_size": 2},
            "sft": {"steps": 1, "batch_size": 4, "output_dir": str(tmp_path / "sft"),
                    "tools": ["calculator"], "tool_format": "hermes"},
        }
    )  # fmt: skip
    model_dir = run_sft(cfg, show_progress=False)
    assert rendered == [{"tools": [tool_schema("calculator")]}] * 2  # training, held-out
    assert trained_on(model_dir).tools == {
        "tools": ["calculator"],
        "max_tool_calls": 4,
        "tool_timeout": 5.0,
        "tool_format": "hermes",
    }
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", str(model_dir), "--samples", "2", "--k", "1", "--output", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = json.loads(out.read_text())
    assert (line["tools"], line["tool_format"]) == ("calculator", "hermes")


def test_rollout_batch_marks_only_length_finishes_truncated():
    cfg = resolve_config(overrides=["data.train_size=4", "rollout.samples_per_prompt=2"])
    engine = Scripted(["<answer>5</answer>?", "<answer>5"])  # "?" ends: stop; else length
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    batch = rollout_batch(engine, TOK, load_task(cfg.data), [0], cfg)
    assert batch.truncated.tolist() == [False, True]


def test_a_turn_that_exactly_fills_the_budget():
    # a turn ending in a call with no room left: the call does not run, the finish stays "stop"
    call = "<calculator>1+1</calculator>"
    engine = Scripted([call])
    out = ToolCaller(engine, TOK, ["calculator"]).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=len(ids(call)))
    )
    assert out.completion_ids[0] == ids(call)
    assert out.tool_calls == [0] and out.finish_reason == ["stop"] and len(engine.asked) == 1


def test_a_result_that_exactly_fills_the_budget_ends_by_length_without_a_new_turn():
    call, result = "<calculator>1+1</calculator>", "<result>2</result>"
    engine = Scripted([call])  # a second generate would fail: no turn is scripted
    out = ToolCaller(engine, TOK, ["calculator"]).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=len(ids(call + result)))
    )
    assert out.completion_ids[0] == ids(call + result)
    assert out.finish_reason == ["length"] and len(engine.asked) == 1


@pytest.mark.parametrize(
    ("expression", "output"),
    [
        ("2**64", "18446744073709551616"),  # the largest exponent allowed
        ("2**65", "error: the power is too large"),
        ("1000000000000**2", "1" + "0" * 24),  # the largest base allowed, 10**12
        ("1000000000001**2", "error: the power is too large"),
        ("10**30", "1" + "0" * 30),  # a result of exactly 1e30 is allowed
        ("2*10**30", "error: the result is too large"),
        ("1+" * 99 + "11", "110"),  # exactly MAX_EXPRESSION_CHARS (200) characters
        (
            "__import__('os').system('ls')",
            "error: not arithmetic: Call(func=Attribute(value=Call(func=Name",  # 40 characters
        ),
    ],
)
def test_the_calculators_limits_are_inclusive(expression, output):
    assert calculator(expression) == output


def test_a_tools_output_is_cut_at_200_characters():
    assert len(run_tool("python", "print('x' * 1000)", 5.0)) == MAX_OUTPUT_CHARS == 200


def test_the_budget_boundaries_of_a_call_and_its_result():
    """A call whose last token is the budget's last gets no result (it is not run, not counted,
    and the completion stopped); a result that fills the budget exactly ends the completion
    without asking the engine for 0 more tokens. A continuation may stop at once
    (min_new_tokens 0) whatever the first turn's minimum."""
    call = "<calculator>1+1</calculator>"
    result = "<result>2</result>"
    exact = ToolCaller(Scripted([call]), TOK, ["calculator"])
    out = exact.generate([ids("Q")], SamplingParams(n=1, max_new_tokens=len(ids(call))))
    assert out.completion_ids[0] == ids(call)
    assert (out.tool_calls, out.finish_reason) == ([0], ["stop"])
    engine = Scripted([call])
    full = ToolCaller(engine, TOK, ["calculator"])
    budget = len(ids(call)) + len(ids(result))
    out = full.generate([ids("Q")], SamplingParams(n=1, max_new_tokens=budget))
    assert out.completion_ids[0] == ids(call + result)
    assert (out.tool_calls, out.finish_reason, len(engine.asked)) == ([1], ["length"], 1)
    engine = Scripted([call], ["?"])
    ToolCaller(engine, TOK, ["calculator"]).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=64, min_new_tokens=5)
    )
    assert engine.asked[1][1].min_new_tokens == 0
    # an engine that writes past the room left: the continuation is cut at the budget
    engine = Scripted([call], ["so <answer>2</answer>"])
    out = ToolCaller(engine, TOK, ["calculator"]).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=budget + 2)
    )
    assert out.completion_ids[0] == ids(call + result) + ids("so <answer>2</answer>")[:2]
    assert out.finish_reason == ["length"]


def test_a_second_call_right_after_a_result_is_read_whole():
    """The policy's turn starts right after the last result: a call whose opening tag is the
    continuation's first token still runs."""
    call, again = "<calculator>1+1</calculator>", "<calculator>2*3</calculator>"
    engine = Scripted([call], [again], ["?"])
    out = ToolCaller(engine, TOK, ["calculator"]).generate(
        [ids("Q")], SamplingParams(n=1, max_new_tokens=200)
    )
    expected = call + "<result>2</result>" + again + "<result>6</result>?"
    assert TOK.decode(out.completion_ids[0]) == expected
    assert (out.tool_calls, out.failed_calls) == ([2], [0])


def test_the_python_tool_keeps_64_kib_of_output_and_fails_past_it():
    assert python("print('x' * 65000)") == "x" * 65000
    assert python("print('x' * 66000)").startswith("error:")


def test_tool_use_defaults_are_the_configs():
    """`ToolUse()` built in code calls as often and waits as long as the config's defaults."""
    assert ToolUse.of(RLConfig().rollout) == ToolUse() == ToolUse((), 4, 5.0, "tags")
    caller = ToolCaller(Scripted(), TOK, ["calculator"])
    assert (caller.max_calls, caller.timeout_s) == (4, 5.0)


def test_tool_use_stops_at_its_formats_calls_and_nowhere_without_tools():
    assert ToolUse(("calculator",)).stop_sequences(TOK) == (tuple(ids("</calculator>")),)
    # hermes would stop at every end of turn: without tools, not at all
    assert ToolUse((), format="hermes").stop_sequences(TOK) == ()


def test_the_confidence_reward_leaves_a_tools_result_out():
    """Intuitor's self-certainty of a completion with a calculator call is the mean over the
    tokens the policy wrote: the `<result>…</result>` the tool appended is context. The
    trainer hands the model reward the prompt ids and that mask (`completion_mask`)."""
    from rlvr.rewards.certainty import certainty_rewards
    from rlvr.training.rewarding import RewardScorer

    cfg = resolve_config(
        overrides=[
            "data.train_size=4",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=200",
            "rollout.tools=[calculator]",
            "reward.functions=[{name: confidence}]",
        ]
    )
    task = load_task(cfg.data)
    turns = ["<calculator>2+3</calculator>", "<answer>5</answer>"], ["<answer>5</answer>"]
    engine = Scripted(*turns)
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    with torch.no_grad():  # far from uniform: an untrained model is unsure of every token
        engine.model.lm_head.weight.mul_(30)
    batch = rollout_batch(ToolCaller(engine, TOK, ["calculator"]), TOK, task, [0], cfg)
    tool_tokens = batch.response_mask[0, : batch.lengths[0]] == 0
    assert tool_tokens.any() and batch.response_mask[1, : batch.lengths[1]].all()
    RewardScorer(cfg, task, policy=engine.model, tokenizer=TOK)(batch)
    pad = TOK.pad_token_id
    policys = [[bool(m) for m in row[:n]] for row, n in zip(batch.response_mask, batch.lengths)]
    masked = certainty_rewards(
        engine.model, batch.prompt_ids, batch.completion_ids, pad, token_masks=policys
    )
    every_token = certainty_rewards(engine.model, batch.prompt_ids, batch.completion_ids, pad)
    assert batch.reward_parts["confidence"].tolist() == pytest.approx(masked, abs=1e-6)
    assert abs(masked[0] - every_token[0]) > 1e-3 and masked[1] == pytest.approx(every_token[1])
