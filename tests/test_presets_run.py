"""Every shipped preset runs a few RL steps on the tiny default task."""

import zlib

import pytest
import torch

from rlvr.config import preset_names, resolve_config
from rlvr.models.loading import save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from tiny_run import TINY_RUN


def recording(seen: list):
    """A batch filter that keeps every batch it sees in `seen` and changes nothing."""

    def record(batch):
        seen.append(batch)
        return batch

    return record


ALL_PRESETS = {
    "cispo",
    "clip_cov",
    "dapo",
    "dr_grpo",
    "gfpo",
    "gmpo",
    "gpg",
    "grpo",
    "gspo",
    "intuitor",
    "kimi",
    "kl_cov",
    "lite_ppo",
    "luspo",
    "opd",
    "opo",
    "orz",
    "ppo",
    "prime",
    "prorl",
    "reinforce_pp",
    "remax",
    "rloo",
    "sapo",
    "skywork_or1",
    "t1",
    "torl",
    "ttrl",
    "vapo",
    "vespo",
    "w_reinforce",
}


def test_every_recipe_of_the_issue_ships_as_a_preset():
    assert set(preset_names()) == ALL_PRESETS


@pytest.mark.parametrize("preset", preset_names())
def test_preset_runs_twenty_steps(preset, tmp_path):
    overrides = [*TINY_RUN, "train.steps=20", f"train.output_dir={tmp_path / 'run'}"]
    if preset == "opd":  # distillation needs a teacher: another tiny model of the same shape
        tok = build_tiny_tokenizer()
        teacher = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=5)
        save_pretrained(teacher, tok, tmp_path / "teacher")
        overrides.append(f"algorithm.distill.teacher={tmp_path / 'teacher'}")
    if preset == "gfpo":  # TINY_RUN samples 4 a prompt: keep 2 of them
        overrides.append("algorithm.group_filter.keep=2")
    cfg = resolve_config(preset=preset, overrides=overrides)
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 21))
    warmup = cfg.algorithm.critic.warmup_steps if cfg.algorithm.advantage == "gae" else 0
    trained = [m for m in metrics if m["trained_samples"] and m["step"] > warmup]
    assert all(m["loss"] is not None for m in trained)
    if cfg.algorithm.advantage == "gae":
        assert all(m["value_loss"] is not None for m in metrics)


def test_dynamic_sampling_trains_only_on_informative_groups(tmp_path):
    seen = []
    record = recording(seen)
    cfg = resolve_config(
        preset="dapo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            "algorithm.max_sampling_rounds=3",
            f"train.output_dir={tmp_path}",
            # a reward that is random per sample, so some groups are all-equal and some are not
            f"reward.functions=[{{name: '{__name__}:coin_reward', weight: 1.0}}]",
        ],
    )
    metrics = read_jsonl(train(cfg, filters=(record,), show_progress=False) / "metrics.jsonl")
    assert len(seen) == 2 and any(len(batch) for batch in seen)  # not vacuous
    for batch in seen:
        for g in batch.group_ids.unique():
            rewards = batch.rewards[batch.group_ids == g]
            assert len(rewards) == 4 and rewards.max() > rewards.min()
        assert len(batch.group_ids.unique()) <= 3
    assert all(1 <= m["sampling_rounds"] <= 3 for m in metrics)
    assert "reward/overlong" in metrics[0]


def coin_reward(prompts, completions, **columns):
    """A deterministic coin per completion text: some groups mix 0s and 1s, some do not."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def heads_only(prompts, completions, **columns):
    """1 where `coin_reward` gives 1, else None: TRL's "does not apply"."""
    return [1.0 if zlib.crc32(c.encode()) % 2 else None for c in completions]


def test_a_rewards_mean_leaves_out_the_samples_it_does_not_apply_to(tmp_path):
    """As TRL's `rewards/<name>/mean`: `reward/<name>` is 1 (every sample it applied to
    scored 1), while the total reward counts the others as 0."""
    name = f"{__name__}:heads_only"
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=1",
            f"train.output_dir={tmp_path}",
            f"reward.functions=[{{name: '{name}', weight: 1.0}}]",
        ],
    )
    (metrics,) = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert 0.0 < metrics["reward/mean"] < 1.0  # not vacuous: it applied to some, not all
    assert metrics[f"reward/{name}"] == 1.0


def test_overlong_filter_masks_truncated_responses(tmp_path):
    seen = []
    record = recording(seen)
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=1",
            "algorithm.overlong.filter=true",
            "rollout.max_new_tokens=3",
            f"train.output_dir={tmp_path}",
        ],
    )
    train(cfg, filters=(record,), show_progress=False)
    batch = seen[0]
    assert batch.truncated.any()
    assert torch.all(batch.response_mask[batch.truncated] == 0)
