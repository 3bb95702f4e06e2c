"""The RL loop end to end on the tiny model: run directory contract, resume, non-finite guard."""

import json
import math

import pytest
import torch

from rlvr.config import ConfigError, resolve_config
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import NonFiniteError, train
from tiny_run import TINY_RUN

CONTRACT_METRICS = [
    "step",
    "reward/mean",
    "reward/std",
    "accuracy",
    "response_length/mean",
    "response_length/correct",
    "response_length/incorrect",
    "truncated_frac",
    "entropy",
    "kl",
    "clip_frac",
    "grad_norm",
    "loss",
    "zero_std_frac",
    "time/rollout",
    "time/reward",
    "time/train",
    "time/step",
    "tokens_per_s",
]
TIMING = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}


def small_config(tmp_path, *extra):
    return resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "rollout.max_new_tokens=12",
            "train.mini_batches=2",
            "train.micro_batch_tokens=64",
            f"train.output_dir={tmp_path}",
            *extra,
        ],
    )


def test_run_directory_contract(tmp_path):
    cfg = small_config(tmp_path / "run", "train.steps=2", "train.save_every=1")
    run_dir = train(cfg, show_progress=False)
    assert (run_dir / "config.yaml").is_file()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for name in CONTRACT_METRICS:
        assert name in metrics[0], name
    assert metrics[0]["kl"] >= 0.0 and 0.0 <= metrics[0]["clip_frac"] <= 1.0
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {"prompt", "completion", "reward", "answer"} <= set(samples[0])
    for step in (1, 2):
        assert (run_dir / "checkpoints" / f"step-{step}" / "model.safetensors").is_file()
    assert not list((run_dir / "checkpoints").glob(".*tmp"))


ADAPTIVE = (
    "algorithm.entropy.coef=0.01",
    "algorithm.entropy.target=5.0",
    "algorithm.entropy.delta=0.01",
    "algorithm.kl.adaptive_target=0.001",
    "algorithm.kl.horizon=10",
    "algorithm.kl.reference_ema=0.5",
)


CRITIC = (
    "algorithm.advantage=gae",
    "algorithm.critic.lr=1e-3",
    "algorithm.critic.warmup_steps=1",
    "algorithm.kl.in_reward=true",
    "algorithm.kl.estimator=k1",
)


@pytest.mark.parametrize(
    "extra",
    [(), ADAPTIVE, CRITIC],
    ids=["fixed", "adaptive_controllers_and_ema", "gae_critic_with_warmup"],
)
def test_resume_continues_the_same_trajectory(tmp_path, extra):
    straight = train(small_config(tmp_path / "a", "train.steps=4", *extra), show_progress=False)
    train(small_config(tmp_path / "b", "train.steps=2", *extra), show_progress=False)
    resumed = train(
        small_config(tmp_path / "b", "train.steps=4", *extra), resume=True, show_progress=False
    )
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl")
    if extra == CRITIC:  # the critic learned, so the comparison covers its saved state
        assert all(m["value_loss"] > 0 for m in a[1:])
    if extra == ADAPTIVE:  # the controllers really moved, so the comparison covers their state
        assert len({m["kl_coef"] for m in a}) > 1 and len({m["entropy_coef"] for m in a}) > 1
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for left, right in zip(a, b):
        for key in left:
            if key in TIMING:
                continue
            l_val, r_val = left[key], right[key]
            if isinstance(l_val, float) and math.isnan(l_val):
                assert math.isnan(r_val), key
            else:
                assert l_val == r_val, (left["step"], key, l_val, r_val)


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(small_config(tmp_path / "none", "train.steps=1"), resume=True, show_progress=False)


def test_non_finite_rewards_skip_steps_then_stop(tmp_path):
    def poison(batch):
        batch.rewards = torch.full_like(batch.rewards, float("nan"))
        return batch

    cfg = small_config(tmp_path / "nan", "train.steps=5", "train.max_nonfinite_steps=2")
    with (
        pytest.warns(UserWarning, match="non-finite"),
        pytest.raises(NonFiniteError, match="2 consecutive steps"),
    ):
        train(cfg, filters=(poison,), show_progress=False)
    assert len(read_jsonl(tmp_path / "nan" / "metrics.jsonl")) == 1


def test_gradient_checkpointing_follows_the_same_trajectory(tmp_path, recomputed_regions):
    plain = train(small_config(tmp_path / "plain", "train.steps=3"), show_progress=False)
    assert not recomputed_regions
    checkpointed = train(
        small_config(tmp_path / "ck", "train.steps=3", "train.gradient_checkpointing=true"),
        show_progress=False,
    )
    assert recomputed_regions  # the layers really were recomputed
    a, b = read_jsonl(plain / "metrics.jsonl"), read_jsonl(checkpointed / "metrics.jsonl")
    assert len(a) == len(b) == 3
    for left, right in zip(a, b):
        for key in left.keys() - TIMING:
            assert left[key] == right[key] or (math.isnan(left[key]) and math.isnan(right[key])), (
                left["step"],
                key,
            )


def test_gradient_checkpointing_without_the_fused_forward_is_a_config_error(tmp_path):
    extra = ("train.steps=1", "train.gradient_checkpointing=true", "model.fused_forward=false")
    cfg = small_config(tmp_path / "hf", *extra)
    with pytest.raises(ConfigError, match=r"train\.gradient_checkpointing: .*fused forward"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "hf").exists()  # nothing written, no earlier run's config replaced
