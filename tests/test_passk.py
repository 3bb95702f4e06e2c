"""pass@k against brute-force enumeration of k-subsets; maj@k worked out by hand."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from rlvr.evaluation import majority_at_k, mean_majority_at_k, mean_pass_at_k, pass_at_k


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force_for_all_small_n():
    checked = 0
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = brute_force_pass_at_k(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
                checked += 1
    assert checked == sum(n * (n + 1) for n in range(1, 9))  # 240 cases


def test_pass_at_k_matches_exact_binomial_formula_for_large_n():
    # The product form must stay accurate where C(n, k) has hundreds of digits.
    for n, c, k in [(200, 3, 100), (1000, 1, 1), (1000, 17, 64), (512, 500, 8), (300, 0, 50)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 3, 8) == 1.0  # n - c = 7 < k: every 8-subset holds a correct one
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is the plain accuracy c / n
    assert pass_at_k(np.int64(4), np.int64(2), 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (4, 1, 5),
        (4, 1, 0),
        (4, 1, -1),
        (0, 0, 1),
        (4, 5, 1),
        (4, -1, 1),
        (4.0, 1, 1),
        (4, 1, 1.5),
        (4, True, 1),
    ],
)
def test_pass_at_k_rejects_invalid_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    correct = [[True, False, False, False], [True, True, False, False], [False] * 4]
    # pass@2 per problem: 1 - C(3,2)/C(4,2) = 1/2, 1 - C(2,2)/C(4,2) = 5/6, 0
    assert mean_pass_at_k(correct, 2) == pytest.approx((1 / 2 + 5 / 6 + 0) / 3, abs=1e-12)
    assert mean_pass_at_k(correct, 1) == pytest.approx((1 / 4 + 2 / 4 + 0) / 3, abs=1e-12)
    with pytest.raises(ValueError, match="problem 1"):
        mean_pass_at_k([[True, False], [True]], 2)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)


def test_majority_at_k_by_hand():
    # Plain majority: "4" x2 beats "5" x1; the first "4" sample (index 1) is correct.
    assert majority_at_k(["5", "4", "4"], [False, True, True], 3) == 1.0
    # Majority is wrong even though one sample is right (pass@3 would be 1).
    assert majority_at_k(["5", "4", "5"], [False, True, False], 3) == 0.0
    # Only the first k samples vote: with k=2, "7" and "3" tie and "7" came first.
    assert majority_at_k(["7", "3", "3", "3"], [False, True, True, True], 2) == 0.0
    assert majority_at_k(["7", "3", "3", "3"], [False, True, True, True], 4) == 1.0
    # Tie 2-2: the answer that occurs first wins ("b" at index 0).
    assert majority_at_k(["b", "a", "a", "b"], [True, False, False, True], 4) == 1.0
    assert majority_at_k(["a", "b", "b", "a"], [False, True, True, False], 4) == 0.0
    # k = 1 is the first sample's correctness.
    assert majority_at_k(["x", "y"], [True, False], 1) == 1.0


def test_majority_at_k_none_answers():
    # None never wins: three Nones lose to a single extracted answer.
    assert majority_at_k([None, None, "2", None], [False, False, True, False], 4) == 1.0
    assert majority_at_k([None, None, "3", None], [True, False, False, False], 4) == 0.0
    # ... unless every answer is None: the vote falls to the first sample.
    assert majority_at_k([None, None], [False, True], 2) == 0.0
    assert majority_at_k([None, None], [True, False], 2) == 1.0


def test_majority_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="answers"):
        majority_at_k(["1", "2"], [True], 1)
    with pytest.raises(ValueError, match="k=3"):
        majority_at_k(["1", "2"], [True, False], 3)
    with pytest.raises(ValueError):
        majority_at_k(["1", "2"], [True, False], 0)


def test_mean_majority_at_k():
    answers = [["1", "1", "2"], ["3", "4", "4"], [None, None, None]]
    correct = [[True, True, False], [True, False, False], [False, False, False]]
    assert mean_majority_at_k(answers, correct, 3) == pytest.approx(1 / 3)
    assert mean_majority_at_k(answers, correct, 1) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="problem 0"):
        mean_majority_at_k([["1"]], [[True]], 2)
    with pytest.raises(ValueError):
        mean_majority_at_k([["1"]], [], 1)
    with pytest.raises(ValueError, match="no problems"):
        mean_majority_at_k([], [], 1)


def test_majority_at_k_scores_the_first_sample_carrying_the_vote():
    # "A" wins 2–1 and its first sample (index 0) is correct: 1.0 (its last, index 1, is not)
    assert majority_at_k(["A", "A", "B"], [True, False, False], 3) == 1.0
    # "A" wins 2–1 and its first sample (index 0) is wrong: 0.0 (its last, index 2, is right)
    assert majority_at_k(["A", "B", "A"], [False, True, True], 3) == 0.0


def test_evaluate_scores_scripted_samples_by_hand():
    """Two problems, k = 3 scripted samples each, verified by `math`: problem 0 right once
    (votes 5, 4, 4: the majority is wrong), problem 1 right twice (votes 2, 2, 7). pass@1 =
    (1/3 + 2/3)/2 = 0.5, pass@3 = 1, maj@3 = 0.5; two samples ran out of tokens (no end of
    turn): truncated_frac = 2/6; the mean length counts the tokens. The records are
    problem-major, numbered from the problem's place in the list. One attempt by default (in
    `sample_and_verify` too): a wrong sample is not asked again."""
    from types import SimpleNamespace

    from rlvr.data.problem import Problem
    from rlvr.evaluation.evaluate import evaluate, sample_and_verify
    from scripted_engine import TOK, Scripted, ids

    texts = [
        "<answer>5</answer><|im_end|>",
        "<answer>4</answer>",
        "<answer>4</answer><|im_end|>",
        "<answer>2</answer><|im_end|>",
        "<answer>2</answer><|im_end|>",
        "<answer>7</answer>",
    ]
    engine = Scripted(texts)
    engine.generator = None
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    problems = [Problem("What is 2+3?", "5"), Problem("What is 1+1?", "2")]
    records: list[dict] = []
    metrics = evaluate(model, TOK, problems, reward="math", k=3, engine=engine, records=records)
    # one call: 3 samples a prompt, unfiltered (no top-k or top-p), the default budget 64
    ((prompts, params),) = engine.asked
    assert len(prompts) == 2
    assert (params.n, params.temperature, params.top_p, params.top_k) == (3, 1.0, 1.0, 0)
    assert params.max_new_tokens == 64
    lengths = [len(ids(t)) for t in texts]
    assert {key: metrics[key] for key in ("problems", "k", "pass@1", "pass@3", "maj@3")} == {
        "problems": 2,
        "k": 3,
        "pass@1": pytest.approx(0.5),
        "pass@3": 1.0,
        "maj@3": 0.5,
    }
    assert metrics["truncated_frac"] == pytest.approx(2 / 6)
    assert metrics["response_length/mean"] == pytest.approx(sum(lengths) / 6)
    assert "attempts/mean" not in metrics and 0 <= metrics["seconds"] < 60
    assert [r["problem"] for r in records] == [0, 0, 0, 1, 1, 1]
    assert [r["correct"] for r in records] == [True, False, False, True, True, False]
    assert [r["extracted"] for r in records] == ["5", "4", "4", "2", "2", "7"]
    assert [r["length"] for r in records] == lengths
    again = Scripted(texts)
    again.generator = None
    s = sample_and_verify(model, TOK, problems, "math", "chat", 3, 1.0, 1.0, 64, 0, engine=again)
    assert s.correct == [[True, False, False], [True, True, False]] and len(again.asked) == 1
    assert [r["finish_reason"] for r in records] == [
        "stop",
        "length",
        "stop",
        "stop",
        "stop",
        "length",
    ]


def test_a_runs_evaluation_budget_is_evals_own_else_the_rollouts():
    """`evaluate_as_configured` samples `eval.max_new_tokens` tokens when set, else the
    rollout's budget."""
    from types import SimpleNamespace

    from rlvr.config import resolve_config
    from rlvr.data.problem import Problem
    from rlvr.evaluation.evaluate import evaluate_as_configured
    from scripted_engine import TOK, Scripted

    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    problems = [Problem("What is 2+3?", "5")]
    for overrides, budget in ((["eval.max_new_tokens=5"], 5), ([], 7)):
        cfg = resolve_config(overrides=["eval.k=1", "rollout.max_new_tokens=7", *overrides])
        engine = Scripted(["<answer>5</answer><|im_end|>"])
        engine.generator = None
        metrics = evaluate_as_configured(model, TOK, problems, "math", cfg, engine=engine)
        assert metrics["pass@1"] == 1.0
        assert engine.asked[0][1].max_new_tokens == budget


def test_a_partial_credit_below_one_is_wrong():
    """The verifier's own score decides, unweighted: 1 is right, 0.5 is not."""
    from types import SimpleNamespace

    from rlvr.data.problem import Problem
    from rlvr.evaluation.evaluate import sample_and_verify
    from scripted_engine import TOK, Scripted

    engine = Scripted(["1<|im_end|>", "0.5<|im_end|>"])
    engine.generator = None
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    problems = [Problem("Q", "1")]
    verifier = "test_attempts:score_is_text"
    s = sample_and_verify(model, TOK, problems, verifier, "chat", 2, 1.0, 1.0, 8, 0, engine=engine)
    assert s.scored.total == [1.0, 0.5] and s.correct == [[True, False]]


def test_evaluate_draws_eight_samples_by_default_and_means_the_attempts():
    """`evaluate`'s default k is 8 (its metric names follow it); with two attempts a wrong
    first sample is asked again, the problem counts as right when its last attempt is, and
    `attempts/mean` is the mean number of attempts over the samples: (2 + 1) / 2."""
    from types import SimpleNamespace

    from rlvr.data.problem import Problem
    from rlvr.evaluation.evaluate import evaluate
    from scripted_engine import TOK, Scripted

    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    problems = [Problem("What is 2+3?", "5")]
    right, wrong = "<answer>5</answer><|im_end|>", "<answer>4</answer><|im_end|>"
    engine = Scripted([right] * 7 + [wrong])
    engine.generator = None
    metrics = evaluate(model, TOK, problems, reward="math", engine=engine)
    assert engine.asked[0][1].n == 8
    assert (metrics["k"], metrics["pass@1"], metrics["pass@8"]) == (8, 7 / 8, 1.0)
    assert "attempts/mean" not in metrics
    engine = Scripted([wrong, right], [right])
    engine.generator = None
    metrics = evaluate(
        model, TOK, problems, reward="math", k=2, attempts=(2, "Try again."), engine=engine
    )
    assert len(engine.asked) == 2 and len(engine.asked[1][0]) == 1  # only the wrong one again
    assert (metrics["pass@1"], metrics["attempts/mean"]) == (1.0, 1.5)


def test_mean_best_of_k_by_hand():
    from rlvr.evaluation.metrics import mean_best_of_k

    scores = [[0.1, 0.9, 0.3], [0.5, 0.5, 0.2], [2.0]]
    correct = [[True, False, True], [True, False, False], [True]]
    # problem 0 picks sample 1 (wrong); problem 1 the first of the tie (right); problem 2 right
    assert mean_best_of_k(scores, correct) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="problem 1 has 2 scores and 3 verdicts"):
        mean_best_of_k([[0.1], [0.1, 0.2]], [[True], [True, False, True]])
    with pytest.raises(ValueError, match="scores for 0 problems"):
        mean_best_of_k([], [])


def test_evaluate_picks_the_most_self_certain_sample_for_sc_at_k(monkeypatch):
    """sc@3 with scripted samples and certainties: problem 0's most certain sample is its
    right one, problem 1's a wrong one, so sc@3 = 0.5; the certainties are asked for every
    sample once, each with its own problem's prompt."""
    from types import SimpleNamespace

    from rlvr.data.problem import Problem
    from rlvr.evaluation import evaluate as evaluation
    from scripted_engine import TOK, Scripted, ids

    texts = ["<answer>5</answer>", "<answer>4</answer>", "<answer>4</answer>"]
    texts += ["<answer>2</answer>", "<answer>2</answer>", "<answer>7</answer>"]
    asked = []

    def certainties(model, prompt_ids, completion_ids, pad_id, token_masks=None):
        asked.append((prompt_ids, completion_ids, token_masks))
        return [0.9, 0.1, 0.3, 0.2, 0.1, 0.8]

    monkeypatch.setattr(evaluation, "certainty_rewards", certainties)
    engine = Scripted(texts)
    engine.generator = None
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    problems = [Problem("What is 2+3?", "5"), Problem("What is 1+1?", "2")]
    kwargs = {"reward": "math", "k": 3, "engine": engine}
    metrics = evaluation.evaluate(model, TOK, problems, self_certainty=True, **kwargs)
    assert metrics["sc@3"] == 0.5 and metrics["maj@3"] == 0.5
    ((prompts, completions, masks),) = asked
    assert [ids(t) for t in texts] == [c[: len(ids(t))] for c, t in zip(completions, texts)]
    assert prompts[0] == prompts[2] != prompts[3] == prompts[5] and masks is None
    engine = Scripted(texts)
    engine.generator = None
    assert "sc@3" not in evaluation.evaluate(model, TOK, problems, **{**kwargs, "engine": engine})


def test_sc_at_k_ranks_the_samples_by_the_models_own_self_certainty(monkeypatch):
    """On the tiny model, the certainties sc@4 ranks each problem's samples by are those
    `certainty_rewards` measures apart on the same samples (the untrained model is never
    right, so the ranking is compared, not the score)."""
    from rlvr.config import DataConfig
    from rlvr.data.tasks import load_task
    from rlvr.evaluation import evaluate as evaluation
    from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
    from rlvr.rewards.certainty import certainty_rewards

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    task = load_task(DataConfig(max_digits=1, train_size=10, test_size=6))
    problems = task.test
    s = evaluation.sample_and_verify(model, tok, problems, task.reward, "chat", 4, 1.0, 1.0, 8, 0)
    out = s.rollout
    prompts = [s.prompt_ids[i] for i in out.prompt_index]
    values = certainty_rewards(model, prompts, out.completion_ids, tok.pad_token_id)
    ranked = []
    monkeypatch.setattr(
        evaluation, "mean_best_of_k", lambda scores, correct: ranked.append(scores) or 0.25
    )
    kwargs = {"reward": task.reward, "max_new_tokens": 8, "self_certainty": True}
    assert evaluation.evaluate(model, tok, problems, k=4, **kwargs)["sc@4"] == 0.25
    (scores,) = ranked
    assert len(scores) == 6 and len(set(values)) == 24
    for i, problem_scores in enumerate(scores):
        assert problem_scores == pytest.approx(values[4 * i : 4 * i + 4], abs=1e-6)
