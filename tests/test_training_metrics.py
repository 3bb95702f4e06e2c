"""Per-step metrics computed by hand."""

import math

import pytest
import torch

from rlvr.config import resolve_config
from rlvr.training.batch import RolloutBatch
from rlvr.training.metrics import step_metrics, zero_std_fraction


def test_zero_std_fraction_counts_groups_not_samples():
    # group 7: [1, 1, 1] constant; group 2: [0, 1] mixed; group 5: [0] singleton (constant)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([7, 2, 7, 7, 5, 2])
    assert zero_std_fraction(rewards, groups) == 2 / 3
    assert zero_std_fraction(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0


def test_zero_std_fraction_is_per_group_with_unequal_group_sizes():
    # group 0: [1, 0, 0] mixed; group 1: [0] constant: 1 of 2 groups = 0.5 (per sample, 1 of 4)
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 1])
    assert zero_std_fraction(rewards, groups) == 0.5


def four_samples(**fields) -> RolloutBatch:
    """Four samples of lengths 2, 4, 6 and 8, the first one right, in groups 0, 0, 1, 1, none
    truncated and all rewarded 0; `fields` replace any of these."""
    n = 4
    values = {
        "problems": [None] * n,
        "prompt_ids": [[1]] * n,
        "completion_ids": [[5] * 2, [5] * 4, [5] * 6, [5] * 8],
        "prompt_texts": [""] * n,
        "completion_texts": [""] * n,
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "truncated": torch.zeros(n, dtype=torch.bool),
        "response_mask": torch.ones(n, 8),
        "rollout_logprobs": torch.zeros(n, 8),
        "rewards": torch.zeros(n),
        "correct": torch.tensor([True, False, False, False]),
    }
    return RolloutBatch(**{**values, **fields})


def test_step_metrics_by_hand():
    cfg = resolve_config(overrides=["train.epochs=2", "train.mini_batches=2"])
    batch = four_samples(
        group_ids=torch.tensor([0, 0, 0, 1]),
        truncated=torch.tensor([False, False, False, True]),
        rewards=torch.tensor([0.5, 0.2, 0.2, 0.0]),
    )
    totals = {"tokens": 12.0, "clip_tokens": 3.0, "entropy_sum": 6.0, "loss": 2.0}
    m = step_metrics(batch, batch, totals, [1.0, 3.0], cfg)
    assert m["reward/mean"] == pytest.approx(0.225)  # (0.5 + 0.2 + 0.2 + 0) / 4
    assert m["accuracy"] == 0.25  # 1 correct of 4 (3 rewards are > 0: not the same thing)
    assert m["response_length/mean"] == 5.0  # (2 + 4 + 6 + 8) / 4
    assert m["response_length/correct"] == 2.0  # sample 0 only
    assert m["response_length/incorrect"] == 6.0  # (4 + 6 + 8) / 3
    assert m["truncated_frac"] == 0.25  # sample 3 only
    assert m["zero_std_frac"] == 0.5  # group 1 ([0.0]) of groups {0, 1}
    assert m["clip_frac"] == 0.25  # 3 clipped / 12 tokens (the totals already span both epochs)
    assert m["entropy"] == 0.5  # 6 / 12
    assert m["grad_norm"] == 2.0  # (1 + 3) / 2
    assert m["loss"] == 0.5  # 2 / (2 epochs · 2 mini-batches)


def test_accuracy_is_over_the_samples_the_verifier_could_judge():
    """Rows without a gold answer (`data.answer_column=null`: the math verifier returns None
    for them) are left out of `accuracy` and `response_length/incorrect`; a batch of only
    such rows has no accuracy (NaN, null in metrics.jsonl), not 0."""
    cfg = resolve_config()
    batch = four_samples(judged=torch.tensor([True, True, False, False]))
    m = step_metrics(batch, batch, {}, [], cfg)
    assert m["accuracy"] == 0.5  # 1 right of the 2 judged
    assert m["response_length/correct"] == 2.0
    assert m["response_length/incorrect"] == 4.0  # sample 1 only: 2 and 3 were not judged
    batch.judged = torch.zeros(4, dtype=torch.bool)
    m = step_metrics(batch, batch, {}, [], cfg)
    assert math.isnan(m["accuracy"]) and math.isnan(m["response_length/incorrect"])
    assert m["response_length/mean"] == 5.0
