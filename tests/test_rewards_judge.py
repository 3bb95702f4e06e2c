"""Pairwise judges and BRPO: verdict parsing, the bootstrapped ±1 rewards, the local and HTTP
judges (against a stub server), the model-reward wiring, and short RL runs that use them."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from rlvr.config import ConfigError, RewardSpec, resolve_config
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rewards import model_based
from rlvr.rewards.compose import RewardOutput
from rlvr.rewards.judge import (
    HFJudge,
    JudgeStats,
    OpenAIJudge,
    brpo_outcome,
    brpo_references,
    brpo_rewards,
    chat_completions_url,
    judge_prompt,
    parse_judgement,
)
from rlvr.rewards.model_based import (
    BRPOOptions,
    ModelRewardResult,
    RewardContext,
    add_model_rewards,
    build_model_rewards,
    make_judge,
    score_model_reward,
)
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from tiny_run import TINY_RUN

API_KEY = "sk-test-secret-0123"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[A]]", (1.0, 0.0)),
        ("Both are fine, but [[B]]", (0.0, 1.0)),
        ("[[C]]", (0.5, 0.5)),  # MT-Bench's tie
        ("[[tie]]", (0.5, 0.5)),
        ("Output [[A]] or [[B]]. My verdict: [[B]]", (0.0, 1.0)),  # the last verdict counts
        ("Winner: B", (0.0, 1.0)),
        ("The better response is A.", (1.0, 0.0)),
        ("Verdict: tie", (0.5, 0.5)),
        ("Score A: 7/10, Score B: 3", (7.0, 3.0)),  # only one maximum: raw scores
        ("Score A: 8/10, Score B: 3/5", (0.8, 0.6)),  # both maxima: fractions
        ("score for response a = 4.5\nscore for response b = 6", (4.5, 6.0)),
        ("Score A: 5, Score B: 5", (5.0, 5.0)),  # a tie by scores
        ("Score A: 3/0, Score B: 2/5", (3.0, 2.0)),  # a maximum of 0: raw scores, no 3/0
        ("Score A: 3/5, Score B: 2/0", (3.0, 2.0)),
        ("Score A: 0.9/1, Score B: 0.3/0.5", (0.9, 0.6)),  # maxima of 1 and below divide too
        ("Score A: 7, and B gets no score. [[B]]", (0.0, 1.0)),  # one side only: not scores
        ('{"a": 7, "b": 3}', (7.0, 3.0)),
        ('reasoning... {"score_a": "2", "score_b": 9}', (2.0, 9.0)),
        ('{"winner": "B"}', (0.0, 1.0)),
        ('{"a": 7, "b": ', None),  # truncated JSON, nothing else
        ('{"a": true, "b": 3}', None),
        ('{"a": Infinity, "b": 1}', None),
        ("I cannot decide.", None),
        ("", None),
        (None, None),
        ("<|assistant|><|assistant|>", None),
    ],
)
def test_parse_judgement(text, expected):
    assert parse_judgement(text) == expected


def test_judge_prompt_contains_the_pair():
    text = judge_prompt("What is 2+2?", "4", "5")
    assert "[Prompt]\nWhat is 2+2?" in text and "[Response A]\n4" in text
    assert "[Response B]\n5" in text and "Score A:" in text


class ScriptedJudge:
    """Prefers the longer response; None when either response contains "??"."""

    def __init__(self):
        self.calls = []

    def compare(self, prompts, responses_a, responses_b):
        self.calls.append((list(prompts), list(responses_a), list(responses_b)))
        return [
            None if "??" in a + b else (float(len(a)), float(len(b)))
            for a, b in zip(responses_a, responses_b)
        ]


class FirstPositionJudge:
    """Always prefers response A (maximal position bias)."""

    def compare(self, prompts, responses_a, responses_b):
        return [(1.0, 0.0)] * len(prompts)


def test_brpo_references_are_reproducible_and_within_the_group():
    group_ids = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    first = brpo_references(group_ids, torch.Generator().manual_seed(0))
    again = brpo_references(group_ids, torch.Generator().manual_seed(0))
    assert first == again
    for index, reference in enumerate(first):
        assert group_ids[reference] == group_ids[index]
        assert first[reference] == reference  # one reference per group, its own reference
    # torch.Generator().manual_seed(0): randint(4) -> 0, randint(4) -> 3, randint(2) -> 1
    assert first == [0, 0, 0, 0, 7, 7, 7, 7, 9, 9]


def test_brpo_rewards_exact_pattern():
    # Groups (by id) and their references for seed 0 (test above): group 0 -> "bb" (index 0),
    # group 1 -> "ddd" (index 7), group 2 -> "ee" (index 9).
    completions = ["bb", "a", "ccc", "bb", "d", "dddd", "ddd", "ddd", "eee", "ee"]
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    prompts = [f"q{g}" for g in group_ids.tolist()]
    judge = ScriptedJudge()
    result = brpo_rewards(prompts, completions, group_ids, judge, torch.Generator().manual_seed(0))
    # vs "bb": "a" shorter -1, "ccc" longer +1, "bb" tie -1 (a tie is not a win);
    # vs "ddd": "d" -1, "dddd" +1, "ddd" (index 6) tie -1; vs "ee": "eee" +1. References: 0.
    assert result.rewards == [0.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 0.0, 1.0, 0.0]
    assert result.references == [0, 0, 0, 0, 7, 7, 7, 7, 9, 9]
    assert result.failed == 0
    (call,) = judge.calls  # one batched call; the rollout is response A, the reference B
    assert call[0] == ["q0", "q0", "q0", "q1", "q1", "q1", "q2"]
    assert call[1] == ["a", "ccc", "bb", "d", "dddd", "ddd", "eee"]
    assert call[2] == ["bb", "bb", "bb", "ddd", "ddd", "ddd", "ee"]


def test_brpo_unusable_judgements_score_the_failure_score_and_are_counted():
    completions = ["ref", "??", "longer", "x"]
    generator = torch.Generator().manual_seed(0)  # randint(4) -> 0: "ref" is the reference
    result = brpo_rewards(["q"] * 4, completions, [5, 5, 5, 5], ScriptedJudge(), generator)
    assert result.rewards == [0.0, -1.0, 1.0, -1.0] and result.failed == 1
    result = brpo_rewards(
        ["q"] * 4,
        completions,
        [5, 5, 5, 5],
        ScriptedJudge(),
        torch.Generator().manual_seed(0),
        failure_score=0.0,
    )
    assert result.rewards == [0.0, 0.0, 1.0, -1.0] and result.failed == 1


def test_brpo_both_orders_cancel_position_bias():
    completions, ids = ["a", "b", "c", "d"], [0, 0, 1, 1]
    one = brpo_rewards(["q"] * 4, completions, ids, FirstPositionJudge(), torch.Generator())
    assert sorted(one.rewards) == [0.0, 0.0, 1.0, 1.0]  # the biased judge lets every rollout win
    both = brpo_rewards(
        ["q"] * 4, completions, ids, FirstPositionJudge(), torch.Generator(), both_orders=True
    )
    assert sorted(both.rewards) == [-1.0, -1.0, 0.0, 0.0]  # it wins as A, loses as B: no win
    judge = ScriptedJudge()  # seed 0: randint(3) -> 2, so "xx" is the reference
    generator = torch.Generator().manual_seed(0)
    result = brpo_rewards(
        ["q"] * 3, ["xxx", "x", "xx"], [0, 0, 0], judge, generator, both_orders=True
    )
    assert result.rewards == [1.0, -1.0, 0.0]
    (call,) = judge.calls  # the pairs, then the same pairs swapped, in one call
    assert call[1] == ["xxx", "x", "xx", "xx"] and call[2] == ["xx", "xx", "xxx", "x"]


class OrderJudge:
    """The verdicts on "wt" and "ln" (judged against "ref"): "wt" wins as response A and ties
    as B; "ln" loses as A and gets an unusable judgement as B."""

    VERDICTS: ClassVar[dict[tuple[str, bool], tuple[float, float] | None]] = {
        ("wt", True): (1.0, 0.0),
        ("wt", False): (0.5, 0.5),
        ("ln", True): (0.0, 1.0),
        ("ln", False): None,
    }

    def compare(self, prompts, responses_a, responses_b):
        return [
            self.VERDICTS[(a, True)] if b == "ref" else self.VERDICTS[(b, False)]
            for a, b in zip(responses_a, responses_b)
        ]


def test_brpo_both_orders_needs_a_win_and_a_usable_judgement_in_each_order():
    generator = torch.Generator().manual_seed(2)  # randint(3) -> 0: "ref" is the reference
    result = brpo_rewards(
        ["q"] * 3,
        ["ref", "wt", "ln"],
        [0, 0, 0],
        OrderJudge(),
        generator,
        both_orders=True,
        failure_score=-0.5,
    )
    # "wt": a tie as B is no win (-1); "ln": a loss then an unusable judgement is unusable
    assert result.rewards == [0.0, -1.0, -0.5] and result.failed == 1


def test_judge_defaults_and_the_80_character_sample_of_an_unusable_answer(tiny, monkeypatch):
    local = HFJudge(*tiny)  # greedy, 128 new tokens, 64 sequences at once
    assert (local.params.temperature, local.params.max_new_tokens) == (0.0, 128)
    assert local.engine.batch_size == 64
    http = OpenAIJudge("http://localhost:1", "m")
    settings = (http.temperature, http.max_tokens, http.timeout_s, http.max_workers)
    assert settings == (0.0, 512, 60.0, 8)
    monkeypatch.setattr(http, "_request", lambda content: "x" * 100)
    assert http.compare(["q"], ["a"], ["b"]) == [None]
    assert http.stats.last_error == f"unparseable judgement '{'x' * 80}'"


def test_brpo_singletons_are_references_and_nothing_is_judged():
    judge = ScriptedJudge()
    result = brpo_rewards(["p", "q"], ["a", "b"], [0, 1], judge, torch.Generator())
    assert result.rewards == [0.0, 0.0] and judge.calls == [([], [], [])]


def test_brpo_outcome():
    assert brpo_outcome(True) == 1.0 and brpo_outcome(False) == -1.0
    assert brpo_outcome(None) == -1.0 and brpo_outcome(None, failure_score=0.0) == 0.0


def test_brpo_input_errors():
    with pytest.raises(ValueError, match="2 prompts for 3 completions"):
        brpo_rewards(["p"] * 2, ["a"] * 3, [0, 0, 0], ScriptedJudge(), torch.Generator())
    with pytest.raises(ValueError, match="2 group ids for 3 completions"):
        brpo_rewards(["p"] * 3, ["a"] * 3, [0, 0], ScriptedJudge(), torch.Generator())

    class ShortJudge:
        def compare(self, prompts, a, b):
            return []

    with pytest.raises(ValueError, match="0 judgements for 1 pairs"):
        brpo_rewards(["p"] * 2, ["a", "b"], [0, 0], ShortJudge(), torch.Generator())


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0
    )
    return model, tokenizer


def test_hf_judge_on_the_tiny_model_counts_garbage(tiny):
    model, tokenizer = tiny
    model.train()
    judge = HFJudge(model, tokenizer, max_new_tokens=6)
    results = judge.compare(["What is 1+1?"] * 2, ["2", "3"], ["3", "2"])
    assert len(results) == 2 and len(judge.last_outputs) == 2
    assert model.training  # generation put the module back in train mode
    assert judge.stats.unparseable == sum(r is None for r in results)
    judge = HFJudge(model, tokenizer, max_new_tokens=12)  # over 80 characters of garbage
    assert judge.compare(["What is 1+1?"], ["2"], ["3"]) == [None]
    assert len(judge.last_outputs[0]) > 80
    assert judge.stats.last_error == f"unparseable judgement {judge.last_outputs[0][:80]!r}"
    assert judge.compare([], [], []) == []
    with pytest.raises(ValueError, match="1 prompts, 2 responses A, 1 responses B"):
        judge.compare(["p"], ["a", "b"], ["c"])


def test_hf_judge_reads_a_verdict_it_generates(tiny):
    class Scripted(torch.nn.Module):
        """A stand-in causal LM that generates "[[B]]" then EOS, whatever the prompt."""

        def __init__(self, tokenizer, base):
            super().__init__()
            self.script = [*tokenizer("[[B]]")["input_ids"], tokenizer.eos_token_id]
            self.vocab, self.generation_config = len(tokenizer), base.generation_config
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.prompt_width = 0

        def forward(self, input_ids, attention_mask, **_):
            if input_ids.shape[1] > 1:  # prefill: the prompt
                self.prompt_width = attention_mask.shape[1]
            generated = attention_mask.shape[1] - self.prompt_width  # tokens so far
            logits = torch.full((input_ids.shape[0], 1, self.vocab), -1e9)
            logits[:, :, self.script[min(generated, len(self.script) - 1)]] = 0.0
            return SimpleNamespace(logits=logits)

    model, tokenizer = tiny
    judge = HFJudge(Scripted(tokenizer, model), tokenizer, max_new_tokens=10)
    assert judge.compare(["q"], ["a"], ["b"]) == [(0.0, 1.0)]
    assert judge.last_outputs == ["[[B]]"] and judge.stats.unparseable == 0


# --------------------------------------------------------------------------- HTTP judge


class StubHandler(BaseHTTPRequestHandler):
    """/ok: scores from the request; /badjson: a malformed body; /hang: no answer until
    released; /error: HTTP 500; /garbage: a valid body whose verdict is unreadable."""

    release = threading.Event()
    seen: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StubHandler.seen.append((self.path, self.headers.get("Authorization"), body))
        mode = self.path.split("/")[1]
        if mode == "hang":
            StubHandler.release.wait(10)
            return
        if mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        content = body["messages"][0]["content"]
        a = content.split("[Response A]\n")[1].split("\n[Response B]")[0]
        b = content.split("[Response B]\n")[1].split("\n[End]")[0]
        verdict = f"Score A: {len(a)}, Score B: {len(b)}" if mode == "ok" else "hmm, both?"
        payload = {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
        raw = b"{not json" if mode == "badjson" else json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture(scope="module")
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    StubHandler.release.set()
    server.shutdown()
    server.server_close()


def test_chat_completions_url():
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("https://api.x.com/v1/") == "https://api.x.com/v1/chat/completions"
    with pytest.raises(ValueError, match="must start with http"):
        chat_completions_url("ftp://h")


def test_openai_judge_ok_sends_key_and_model(stub_url, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", API_KEY)
    judge = OpenAIJudge(f"{stub_url}/ok", "judge-7b", api_key_env="MY_JUDGE_KEY", timeout_s=5)
    StubHandler.seen.clear()
    results = judge.compare(["q", "q", "q"], ["long answer", "x", "same"], ["short", "xx", "emas"])
    assert results == [(11.0, 5.0), (1.0, 2.0), (4.0, 4.0)]
    path, auth, body = StubHandler.seen[0]
    assert path == "/ok/v1/chat/completions" and auth == f"Bearer {API_KEY}"
    assert body["model"] == "judge-7b" and body["temperature"] == 0.0
    monkeypatch.delenv("MY_JUDGE_KEY")
    StubHandler.seen.clear()
    judge.compare(["q"], ["a"], ["b"])
    assert StubHandler.seen[0][1] is None  # no key in the environment: no header


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("badjson", "errors"), ("error", "errors"), ("garbage", "unparseable"), ("hang", "timeouts")],
)
def test_openai_judge_failures_are_none_and_counted(stub_url, monkeypatch, mode, kind):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    judge = OpenAIJudge(f"{stub_url}/{mode}", "m", timeout_s=0.5)
    start = time.perf_counter()
    assert judge.compare(["q", "q"], ["a", "b"], ["c", "d"]) == [None, None]
    assert time.perf_counter() - start < 5
    assert getattr(judge.stats, kind) == 2
    others = {"errors", "unparseable", "timeouts"} - {kind}
    assert all(getattr(judge.stats, other) == 0 for other in others)
    assert judge.stats.last_error and API_KEY not in judge.stats.last_error
    assert API_KEY not in repr(judge)


def test_openai_judge_unreachable_server_is_an_error():
    judge = OpenAIJudge("http://127.0.0.1:9", "m", timeout_s=2)  # the discard port: refused
    assert judge.compare(["q"], ["a"], ["b"]) == [None]
    assert judge.stats.errors + judge.stats.timeouts == 1


# --------------------------------------------------------------------------- wiring


def test_model_reward_option_errors(tiny):
    model, tokenizer = tiny
    context = RewardContext(model, tokenizer)

    def build(*specs):
        return build_model_rewards([RewardSpec(**s) for s in specs], context)

    with pytest.raises(ConfigError, match=r"unknown option 'jduge' \(did you mean 'judge'\?"):
        build({"name": "brpo", "options": {"jduge": "policy"}})
    with pytest.raises(ConfigError, match=r"option 'judge' is required \(`policy`, `frozen`"):
        build({"name": "brpo"})
    with pytest.raises(ConfigError, match=r"option 'both_orders'"):
        build({"name": "brpo", "options": {"judge": "policy", "both_orders": "maybe"}})
    with pytest.raises(
        ConfigError, match=r"'judge_model' \(the model name the server serves\) is required"
    ):
        build({"name": "brpo", "options": {"judge": "http://localhost:8000"}})
    with pytest.raises(ConfigError, match="reward 'math' takes no options"):
        build({"name": "math", "options": {"judge": "policy"}})
    with pytest.raises(ConfigError, match="'brpo' is listed twice"):
        build(*[{"name": "brpo", "options": {"judge": "policy"}}] * 2)
    with pytest.raises(ConfigError, match="needs the policy"):
        build_model_rewards([RewardSpec(name="brpo", options={"judge": "policy"})], RewardContext())
    with pytest.raises(ConfigError, match=r"judge './no/such/judge' could not be loaded"):
        build({"name": "brpo", "options": {"judge": "./no/such/judge"}})
    assert build({"name": "math"}) == {}


def test_score_model_reward_never_raises():
    def raising(prompts, completions, group_ids, columns):
        raise RuntimeError("judge exploded")

    result = score_model_reward("brpo", raising, ["p"] * 2, ["a", "b"], torch.tensor([0, 0]), {})
    assert result.scores == [0.0, 0.0] and result.errors == 1
    assert result.error_examples == ["brpo: RuntimeError: judge exploded"]


def test_non_finite_model_scores_are_zero_and_each_an_error():
    def scores(prompts, completions, group_ids, columns):
        return ModelRewardResult([float("nan"), float("inf"), 2])

    result = score_model_reward("r", scores, ["p"] * 3, ["a", "b", "c"], torch.tensor([0] * 3), {})
    assert result.scores == [0.0, 0.0, 2.0]
    assert (result.errors, result.timeouts) == (2, 0)
    assert result.error_examples == [
        "r: ValueError: non-finite score nan",
        "r: ValueError: non-finite score inf",
    ]


def test_add_model_rewards_weighs_the_scores_and_keeps_five_examples():
    def nan_then_ones(prompts, completions, group_ids, columns):
        return ModelRewardResult([float("nan")] * 6 + [1.0])

    output = RewardOutput(total=[0.5] * 7, per_reward={"format": [0.5] * 7})
    added = add_model_rewards(
        output, {"r": (2.0, nan_then_ones)}, ["p"] * 7, ["c"] * 7, torch.zeros(7), {}
    )
    assert added.total == [0.5] * 6 + [2.5]
    assert added.per_reward["r"] == [0.0] * 6 + [1.0]
    assert (added.errors, added.timeouts, len(added.error_examples)) == (6, 0, 5)


class CountingJudge:
    """Judges "t" as a timed-out request and "u" as an unparseable answer (both None), and
    prefers any other rollout; `stats` (when kept) starts with 2 timeouts of earlier steps."""

    def __init__(self, with_stats: bool):
        if with_stats:
            self.stats = JudgeStats(timeouts=2)

    def compare(self, prompts, responses_a, responses_b):
        results = []
        for a in responses_a:
            if a in ("t", "u") and hasattr(self, "stats"):
                kind = "timeouts" if a == "t" else "unparseable"
                self.stats.record(kind, f"{kind} on {a}")
            results.append(None if a in ("t", "u") else (1.0, 0.0))
        return results


@pytest.mark.parametrize(
    ("with_stats", "counts", "example"),
    [
        (True, (1, 1), "brpo: 2 of 3 judgements unusable, scored -1 (last: unparseable on u)"),
        (False, (2, 0), "brpo: 2 of 3 judgements unusable, scored -1"),
    ],
)
def test_brpo_counts_this_call_s_judge_timeouts_apart_from_its_errors(
    monkeypatch, with_stats, counts, example
):
    # Each group's two rollouts are equal, so whichever is the reference, the other is judged:
    # one timeout, one unparseable, one win. Only this call's timeouts count as timeouts; a
    # judge without stats has none.
    judge = CountingJudge(with_stats)
    monkeypatch.setattr(model_based, "make_judge", lambda opts, context: judge)
    spec = RewardSpec(name="brpo", options={"judge": "policy"})
    [(_, reward)] = build_model_rewards([spec], RewardContext()).values()
    completions = ["t", "t", "u", "u", "w", "w"]
    result = reward(["q"] * 6, completions, torch.tensor([0, 0, 1, 1, 2, 2]), {})
    assert sorted(result.scores) == [-1.0, -1.0, 0.0, 0.0, 0.0, 1.0]
    assert (result.errors, result.timeouts) == counts
    assert result.error_examples == [example]


def test_brpo_s_default_judge_settings(tiny):
    # Greedy judging (temperature 0), 128 new tokens; HTTP: 60 s per request, 8 in flight.
    http = make_judge(BRPOOptions(judge="http://localhost:1", judge_model="m"), RewardContext())
    assert isinstance(http, OpenAIJudge)
    settings = (http.temperature, http.max_tokens, http.timeout_s, http.max_workers)
    assert settings == (0.0, 128, 60.0, 8)
    local = make_judge(BRPOOptions(judge="policy"), RewardContext(*tiny))
    assert isinstance(local, HFJudge)
    assert (local.params.temperature, local.params.max_new_tokens) == (0.0, 128)
    assert local.engine.batch_size == 64


def test_a_reward_context_without_a_generator_draws_from_seed_zero():
    assert RewardContext().rng().initial_seed() == 0


def run_config(tmp_path, functions):
    return resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            f"train.output_dir={tmp_path}",
            f"reward.functions={functions}",
        ],
    )


def test_brpo_end_to_end_with_the_tiny_policy_as_judge(tmp_path):
    # The random tiny model judges in garbage: every judgement is unusable, counted, not fatal.
    cfg = run_config(tmp_path, "[{name: brpo, options: {judge: policy, max_new_tokens: 8}}]")
    run_dir = train(cfg, show_progress=False)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # 3 groups of 4: 3 references score 0, the 9 others -1 (the failure score).
        assert m["reward/brpo"] == pytest.approx(-0.75)
        assert m["reward/errors"] == 9 and m["reward/timeouts"] == 0
        assert m["reward/math"] >= 0.0  # the verifier still runs (weight 0) for accuracy
    errors = [r for r in read_jsonl(run_dir / "samples.jsonl") if "reward_error" in r]
    assert errors and errors[0]["reward_error"].startswith("brpo: 9 of 9 judgements unusable")


def test_brpo_end_to_end_with_an_http_judge(tmp_path, stub_url):
    functions = f"[{{name: brpo, options: {{judge: '{stub_url}/ok', judge_model: stub}}}}]"
    run_dir = train(run_config(tmp_path, functions), show_progress=False)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    for m in metrics:
        assert m["reward/errors"] == 0 and -1.0 <= m["reward/brpo"] <= 0.75
        assert m["reward/mean"] == pytest.approx(m["reward/brpo"])
    samples = [r for r in read_jsonl(run_dir / "samples.jsonl") if "reward" in r]
    assert {r["reward"] for r in samples} <= {-1.0, 0.0, 1.0}
