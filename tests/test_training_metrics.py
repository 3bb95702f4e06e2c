"""Per-step metrics computed by hand."""

import torch

from rlvr.training.metrics import zero_std_fraction


def test_zero_std_fraction_counts_groups_not_samples():
    # group 7: [1, 1, 1] constant; group 2: [0, 1] mixed; group 5: [0] singleton (constant)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([7, 2, 7, 7, 5, 2])
    assert zero_std_fraction(rewards, groups) == 2 / 3
    assert zero_std_fraction(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0
