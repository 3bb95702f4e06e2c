"""The RL loop's bookkeeping, pinned by value (found by mutating training/rl.py).

Which steps evaluate and checkpoint, the LR schedule's length, when old log-probs are
computed, the skipping of non-finite updates and the count that stops a run, the reward-error
warning and samples, the per-step totals and timings, the critic's warm-up, and the config
checks that refuse a run before its model loads. Each run is the tiny model for 1-3 steps,
with the slow parts (held-out evaluation, vLLM) replaced where only their calls matter.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from rlvr.config import ConfigError, resolve_config
from rlvr.rewards import register_reward, registry as registry_module
from rlvr.rewards.compose import PASSED_KEYWORDS
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import rl
from rlvr.training.checkpoint import load_trainer_state
from rlvr.training.critic import Critic
from rlvr.training.rl import NonFiniteError, check_choices, train
from tiny_run import TINY_RUN


def tiny(tmp_path, *extra):
    return resolve_config(
        preset="grpo", overrides=[*TINY_RUN, f"train.output_dir={tmp_path}", *extra]
    )


def run(tmp_path, *extra, **kwargs):
    kwargs.setdefault("show_progress", False)
    return train(tiny(tmp_path, *extra), **kwargs)


def steps_of(run_dir, name):
    return [r["step"] for r in read_jsonl(run_dir / name)]


def checkpoints(run_dir):
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))


@pytest.fixture
def spy(monkeypatch):
    """Records the arguments and results of the loop's pieces, which still run."""
    seen = {"several": [], "settings": [], "stats": [], "totals": [], "data": [], "critic": []}

    def wrap(name, record):
        real = getattr(rl, name)

        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            record(args, result)
            return result

        monkeypatch.setattr(rl, name, wrapper)

    wrap("prepare_update", lambda args, _: seen["several"].append(args[5]))
    wrap("collect_step", lambda _, data: seen["data"].append(data))

    def backward(args, stats):
        seen["settings"].append(args[3].skip_zero_advantage)
        seen["stats"].append(dict(stats))

    wrap("minibatch_backward", backward)
    wrap("step_metrics", lambda args, _: seen["totals"].append(dict(args[2])))
    real_update = Critic.update

    def critic_update(self, batch, rows):
        stats = real_update(self, batch, rows)
        seen["critic"].append(dict(stats))
        return stats

    monkeypatch.setattr(Critic, "update", critic_update)
    return seen


@pytest.fixture
def fake_eval(monkeypatch):
    """Held-out evaluation replaced by a fixed score; records the vLLM engine it was given."""
    engines = []

    def evaluate(model, tokenizer, held_out, reward, cfg, ranks, on_vllm):
        engines.append(on_vllm)
        return {"pass@1": 0.5, "problems": len(held_out)}

    monkeypatch.setattr(rl, "evaluate_as_configured", evaluate)
    return engines


def summed(dicts):
    totals = {}
    for stats in dicts:
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


# ----------------------------------------------------------------------------- cadence


def test_held_out_evaluation_gets_eval_samples_problems_and_no_vllm_engine(tmp_path, fake_eval):
    """What each evaluation is given (its cadence, before step 1, every N steps, at the end and
    across a resume, is checked on real evaluations in test_rl_loop.py)."""
    run_dir = run(tmp_path, "train.steps=2", "eval.every_steps=2", "eval.samples=3")
    assert read_jsonl(run_dir / "eval.jsonl") == [
        {"step": step, "pass@1": 0.5, "problems": 3} for step in (0, 2)
    ]
    assert fake_eval == [None, None]  # the HF engine: no vLLM engine to evaluate on


def test_checkpoints_every_save_every_steps_and_at_the_end(tmp_path):
    run_dir = run(tmp_path / "a", "train.steps=3", "train.save_every=2")
    assert checkpoints(run_dir) == [2, 3]
    # one process: the generator and RNG states are the checkpoint's own, not a per-rank list
    assert load_trainer_state(run_dir / "checkpoints" / "step-2")["ranks"] is None
    assert checkpoints(run(tmp_path / "b", "train.steps=2")) == [2]


def test_one_prompt_per_step_is_enough_for_one_process(tmp_path):
    run_dir = run(tmp_path, "train.steps=1", "rollout.prompts_per_step=1")
    assert steps_of(run_dir, "metrics.jsonl") == [1]


# ----------------------------------------------------------------------------- updates


def test_the_lr_schedule_spans_every_optimizer_step_and_old_logprobs_follow_them(tmp_path, spy):
    """3 steps of 2 mini-batches: a cosine over 6 optimizer steps, logged after 2, 4 and 6;
    with more than one update a step the old log-probs are the trainer's own."""
    cosine = ("train.steps=3", "train.mini_batches=2", "train.schedule=cosine", "train.lr=1e-3")
    rows = read_jsonl(run(tmp_path / "a", *cosine) / "metrics.jsonl")
    expected = [1e-3 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in (1, 2, 3)]
    assert [r["lr"] for r in rows] == pytest.approx(expected, abs=1e-12)
    assert spy["several"] == [True] * 3
    run(tmp_path / "b", "train.steps=1", "train.epochs=2")
    run(tmp_path / "c", "train.steps=1")
    assert spy["several"][3:] == [True, False]


def test_totals_are_the_sums_of_the_mini_batches_and_timings_add_up(tmp_path, spy):
    # an entropy bonus trains every sample (the tiny model earns no reward)
    bonus = ("train.steps=1", "train.mini_batches=2", "algorithm.entropy.coef=0.05")
    (row,) = read_jsonl(run(tmp_path, *bonus) / "metrics.jsonl")
    assert len(spy["stats"]) == 2 and spy["totals"] == [summed(spy["stats"])]
    assert all(stats["tokens"] > 0 and stats["loss"] != 0 for stats in spy["stats"])
    parts = row["time/rollout"] + row["time/reward"] + row["time/train"]
    assert row["time/step"] == pytest.approx(parts, rel=1e-9)
    assert 0 < row["time/step"] < 600 and min(row["time/reward"], row["time/train"]) >= 0
    (data,) = spy["data"]
    assert row["tokens_per_s"] == pytest.approx(sum(data.sampled.lengths) / row["time/step"])


def reward_one(batch):
    batch.rewards = torch.ones_like(batch.rewards)
    return batch


def test_the_critic_trains_alone_through_its_warmup(tmp_path, spy):
    critic = ("algorithm.advantage=gae", "algorithm.critic.warmup_steps=1", "train.steps=2")
    run_dir = run(tmp_path, *critic, "train.mini_batches=2", filters=(reward_one,))
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert all(stats["value_loss"] > 0 for stats in spy["critic"])  # the values move to 1
    # no policy update at step 1: no gradient norm (NaN, logged as null)
    assert rows[0]["grad_norm"] is None and rows[1]["grad_norm"] is not None
    assert len(spy["critic"]) == 4 and len(spy["stats"]) == 2  # the policy at step 2 only
    assert spy["totals"][0] == summed(spy["critic"][:2])
    assert spy["totals"][1] == summed(spy["critic"][2:] + spy["stats"])


def test_skip_zero_advantage_is_off_when_asked_and_under_an_entropy_target(tmp_path, spy):
    target = ("algorithm.entropy.coef=0.01", "algorithm.entropy.target=5.0")
    for i, extra in enumerate([(), ("train.skip_zero_advantage=false",), target]):
        run(tmp_path / str(i), "train.steps=1", *extra)
    assert spy["settings"] == [True, False, False]


def test_gradients_are_clipped_to_max_grad_norm_else_not_at_all(tmp_path, monkeypatch):
    norms = []
    real = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm):
        norms.append(max_norm)
        return real(parameters, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    run(tmp_path / "a", "train.steps=1", "train.max_grad_norm=0.5")
    run(tmp_path / "b", "train.steps=1", "train.max_grad_norm=0")
    assert norms == [0.5, math.inf]


def test_an_infinite_gradient_with_a_finite_loss_is_skipped(tmp_path, monkeypatch):
    real = torch.nn.utils.clip_grad_norm_
    calls = itertools.count()

    def clip(parameters, max_norm):
        norm = real(parameters, max_norm)
        return torch.tensor(math.inf) if next(calls) == 0 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    with pytest.warns(UserWarning, match=r"^step 1: non-finite loss or gradient, 1 update\(s\)"):
        run_dir = run(tmp_path, "train.steps=2")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["skipped_updates"] for r in rows] == [1, 0]
    assert rows[0]["grad_norm"] is None and rows[1]["grad_norm"] is not None


def nan_rewards(batch):
    batch.rewards = torch.full_like(batch.rewards, float("nan"))
    return batch


def test_non_finite_steps_are_counted_across_a_resume_until_the_limit(tmp_path):
    """Two mini-batches skipped a step; the count of bad steps is saved, so the resumed run
    stops at its first step, the third in a row."""
    settings = ("train.mini_batches=2", "train.max_nonfinite_steps=3")
    with pytest.warns(UserWarning) as seen:
        run_dir = run(tmp_path, "train.steps=2", *settings, filters=(nan_rewards,))
    messages = [str(w.message) for w in seen if "non-finite" in str(w.message)]
    assert messages == [
        f"step {s}: non-finite loss or gradient, 2 update(s) skipped" for s in (1, 2)
    ]
    assert [r["skipped_updates"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [2, 2]
    assert load_trainer_state(run_dir / "checkpoints" / "step-2")["bad_steps"] == 2
    with (
        warnings.catch_warnings(),
        pytest.raises(NonFiniteError, match=r"^3 consecutive steps had a non-finite"),
    ):
        warnings.simplefilter("ignore")
        run(tmp_path, "train.steps=4", *settings, filters=(nan_rewards,), resume=True)
    assert steps_of(run_dir, "metrics.jsonl") == [1, 2]


# ----------------------------------------------------------------------------- rewards


@pytest.fixture
def logging_and_failing_rewards():
    """`test_logs` logs a metric per call; `test_fails` raises, naming its call."""
    before = dict(registry_module._REGISTRY)
    calls = itertools.count()

    @register_reward("test_logs")
    def logs(completions, log_metric, **_):
        log_metric("chars", sum(len(c) for c in completions))
        return [0.0] * len(completions)

    @register_reward("test_fails")
    def fails(completions, **_):
        raise RuntimeError(f"failure {next(calls)}")

    yield
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(before)


def test_reward_errors_warn_once_and_log_two_examples_a_step(
    tmp_path, spy, logging_and_failing_rewards
):
    functions = "reward.functions=[{name: verifier}, {name: test_logs}, {name: test_fails}]"
    with pytest.warns(UserWarning, match="rewards failed") as seen:
        run_dir = run(tmp_path, "train.steps=2", functions)
    first = spy["data"][0].rewards
    assert len(first.error_examples) >= 3 and len(set(first.error_examples)) >= 2
    (warning,) = [str(w.message) for w in seen if "rewards failed" in str(w.message)]
    assert warning.startswith(
        f"step 1: rewards failed ({first.errors} error(s), 0 timeout(s), each scored 0; "
        f"the first: {first.error_examples[0]}); later"
    )
    errors = [r for r in read_jsonl(run_dir / "samples.jsonl") if "reward_error" in r]
    assert errors == [
        {"step": step + 1, "reward_error": message}
        for step, data in enumerate(spy["data"])
        for message in data.rewards.error_examples[:2]
    ]
    assert len(errors) == 4
    rows = read_jsonl(run_dir / "metrics.jsonl")
    for row, data in zip(rows, spy["data"], strict=True):
        chars = data.rewards.metrics["reward/test_logs/chars"]
        assert len(chars) > 1 and row["reward/test_logs/chars"] == sum(chars) / len(chars)
        assert row["reward/errors"] == data.rewards.errors > 0


# ----------------------------------------------------------------------------- output


def test_without_progress_nothing_is_shown(tmp_path, capsys, monkeypatch):
    shown = []
    real = rl.StepProgress

    def progress(total, start, enabled):
        shown.append((total, start, enabled))
        return real(total, start, enabled=enabled)

    monkeypatch.setattr(rl, "StepProgress", progress)
    left_out = ("data.min_terms=2", "data.max_terms=3", "rollout.max_prompt_tokens=15")
    run(tmp_path / "a", "train.steps=1", *left_out)
    assert "left out" not in capsys.readouterr().out
    run(tmp_path / "a", "train.steps=2", *left_out, resume=True, show_progress=True)
    assert "training prompts are longer and left out" in capsys.readouterr().out
    run(tmp_path / "b", "train.steps=1", "rollout.max_prompt_tokens=100", show_progress=True)
    assert "left out" not in capsys.readouterr().out  # none was
    assert shown == [(1, 0, False), (2, 1, True), (1, 0, True)]


# ----------------------------------------------------------------------------- vLLM


class Stop(Exception):
    pass


def test_the_vllm_context_is_max_model_len_else_the_longest_sequence(tmp_path, monkeypatch):
    contexts = []

    def engine(model, eos, generator, memory, kv_cache, context):
        contexts.append(context)
        raise Stop

    monkeypatch.setattr(rl, "require_vllm", lambda what: None)
    monkeypatch.setattr(rl, "VLLMRolloutEngine", engine)
    monkeypatch.setattr(rl, "context_length", lambda longest, model: ("fits", longest))
    monkeypatch.setattr(rl, "longest_sequence", lambda cfg, task, held_out, tokenizer: 42)
    for i, extra in enumerate([(), ("rollout.vllm_max_model_len=77",)]):
        with pytest.raises(Stop):
            run(tmp_path / str(i), "train.steps=1", "rollout.engine=vllm", *extra)
    assert contexts == [("fits", 42), 77]


# ----------------------------------------------------------------------------- checks


def test_two_samples_are_a_group_for_every_check():
    """The smallest groups the checks accept: 2 samples (or 2 kept of 3) for a group
    baseline, pass@1 of 2 samples, dynamic sampling of pairs."""
    for overrides in (
        ["rollout.samples_per_prompt=2"],
        ["rollout.samples_per_prompt=2", "algorithm.dynamic_sampling=true"],
        ["rollout.samples_per_prompt=3", "algorithm.group_filter.keep=2"],
        ["rollout.samples_per_prompt=2", "algorithm.advantage=pass_at_k", "algorithm.pass_k=1"],
    ):
        check_choices(resolve_config(preset="grpo", overrides=overrides))
    with pytest.raises(ConfigError, match=r"group_filter\.keep=1 would train nothing; keep at"):
        check_choices(
            resolve_config(
                preset="grpo",
                overrides=["rollout.samples_per_prompt=3", "algorithm.group_filter.keep=1"],
            )
        )


def test_the_rollout_engine_captures_cuda_graphs_only_where_asked(tmp_path, monkeypatch):
    asked = []
    real = rl.HFRolloutEngine

    def engine(*args, cuda_graphs):
        asked.append(cuda_graphs)
        return real(*args, cuda_graphs=cuda_graphs)

    monkeypatch.setattr(rl, "HFRolloutEngine", engine)
    run(tmp_path / "a", "train.steps=1")
    run(tmp_path / "b", "train.steps=1", "rollout.cuda_graphs=false")
    assert asked == [True, False]


def test_a_reward_no_call_can_reach_is_refused_and_one_naming_every_keyword_scores(tmp_path):
    """A reward file without **kwargs: one that lacks a keyword every call passes fails before
    a model loads, naming what it lacks; one naming exactly those keywords scores in a run
    (the arithmetic task has no other columns), so the list is not longer than the call's."""
    lacking = tmp_path / "lacking.py"
    lacking.write_text("def score(completion, answer):\n    return 1.0\n")
    names = ", ".join(PASSED_KEYWORDS)
    exact = tmp_path / "exact.py"
    exact.write_text(f"def score({names}):\n    return [1.0] * len(completions)\n")
    with pytest.raises(ConfigError) as info:
        check_choices(tiny(tmp_path, f"reward.functions=[{{name: '{lacking}:score'}}]"))
    assert str(info.value).startswith(
        f"reward.functions[0].name: reward '{lacking}:score': it takes (completion, answer) and "
        "no **kwargs"
    )
    assert "(no prompts, completions, completion_ids, trainer_state, log_extra, log_metric)" in (
        str(info.value)
    )
    out = tmp_path / "run"
    run(out, "train.steps=1", f"reward.functions=[{{name: '{exact}:score'}}]")
    (step,) = read_jsonl(out / "metrics.jsonl")
    assert step["reward/errors"] == 0 and step["reward/mean"] == 1.0
