"""Advantage estimators against hand-computed numbers and a slow per-group reference."""

import math
import statistics

import pytest
import torch

from rlvr.algorithms import (
    ADVANTAGES,
    best_of_group_advantages,
    decoupled_group_advantages,
    gpg_advantages,
    group_normalized_advantages,
    opo_advantages,
    pass_at_k_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
    weighted_reinforce_advantages,
)
from rlvr.algorithms.verdict_advantages import pass_at_k_estimate

EPS = 1e-6

# Two groups of four; group 0 = [1, 0, 0, 0], group 1 = [1, 1, 0, 0].
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
# group 0: mean 0.25, centred [0.75, -0.25, -0.25, -0.25],
#          Σ(centred²) = 0.5625 + 3·0.0625 = 0.75, unbiased var = 0.75/3 = 0.25, std = 0.5
# group 1: mean 0.5, centred [0.5, 0.5, -0.5, -0.5], Σ = 1, var = 1/3, std = 0.5773503
CENTRED = [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
GROUP_STD = [0.5] * 4 + [math.sqrt(1 / 3)] * 4
# batch: mean 3/8 = 0.375; centred 0.625 (×3), -0.375 (×5);
#        Σ = 3·0.390625 + 5·0.140625 = 1.875, unbiased var = 1.875/7, std = 0.5175492
BATCH_STD = math.sqrt(1.875 / 7)


def _close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_grpo_group_std():
    adv = group_normalized_advantages(REWARDS, GROUPS, std_normalization="group")
    # group 0: 0.75/0.5 = 1.5, -0.25/0.5 = -0.5; group 1: ±0.5/0.57735 = ±0.8660254
    _close(adv, [c / (s + EPS) for c, s in zip(CENTRED, GROUP_STD, strict=True)])
    _close(adv, [1.5, -0.5, -0.5, -0.5, 0.8660254, 0.8660254, -0.8660254, -0.8660254], atol=1e-5)
    assert adv.dtype == torch.float64


def test_grpo_batch_std():
    adv = group_normalized_advantages(REWARDS, GROUPS, std_normalization="batch")
    # group mean, batch std: 0.75/0.5175492 = 1.4491377, 0.5/0.5175492 = 0.9660918
    _close(adv, [c / (BATCH_STD + EPS) for c in CENTRED])
    _close(adv[0], 1.4491377, atol=1e-5)
    _close(adv[4], 0.9660918, atol=1e-5)


def test_grpo_no_std_is_dr_grpo():
    adv = group_normalized_advantages(REWARDS, GROUPS, std_normalization="none")
    _close(adv, CENTRED)


def test_grpo_default_is_group_std():
    torch.testing.assert_close(
        ADVANTAGES.get("grpo")(REWARDS, GROUPS),
        group_normalized_advantages(REWARDS, GROUPS, std_normalization="group"),
    )


@pytest.mark.parametrize("mode", ["group", "batch", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gpg"])
def test_zero_variance_and_singleton_groups_get_exactly_zero(mode, estimator):
    # group 3: [0.1, 0.1, 0.1] (mean 0.1 is inexact in floating point, the result must not be),
    # group 9: a single sample; group 4: [1, 0] has variance and keeps its advantages.
    # (in float64, 0.1 - (0.1 + 0.1 + 0.1)/3 = -1.4e-17, which /ε would leave at -1.4e-11)
    rewards = torch.tensor([0.1, 0.1, 0.1, 5.0, 1.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([3, 3, 3, 9, 4, 4])
    adv = ADVANTAGES.get(estimator)(rewards, groups, std_normalization=mode)
    assert torch.equal(adv[:4], torch.zeros(4, dtype=torch.float64))
    assert adv[4] > 0 > adv[5]


def test_all_equal_batch_with_batch_std_is_zero():
    adv = group_normalized_advantages(
        torch.ones(6), torch.tensor([0, 0, 0, 1, 1, 1]), std_normalization="batch"
    )
    assert torch.equal(adv, torch.zeros(6))


def test_non_contiguous_ids_in_any_order():
    # The same two groups as REWARDS/GROUPS, ids 42 and -7, interleaved.
    order = torch.tensor([4, 0, 5, 1, 6, 2, 7, 3])
    ids = torch.where(GROUPS == 0, 42, -7)[order]
    for mode in ("group", "batch", "none"):
        expected = group_normalized_advantages(REWARDS, GROUPS, std_normalization=mode)[order]
        actual = group_normalized_advantages(REWARDS[order], ids, std_normalization=mode)
        torch.testing.assert_close(actual, expected, atol=1e-12, rtol=0)
    # hand values for the group-std case: position 1 holds reward 1 of group 42 → 1.5
    adv = group_normalized_advantages(REWARDS[order], ids)
    _close(adv[1], 0.75 / (0.5 + EPS))
    _close(adv[3], -0.25 / (0.5 + EPS))


def test_rloo_hand_values():
    adv = rloo_advantages(REWARDS, GROUPS)
    # group 0: r=1 vs mean(0,0,0) = 0 → 1;   r=0 vs mean(1,0,0) = 1/3 → -1/3
    # group 1: r=1 vs mean(1,0,0) = 1/3 → 2/3; r=0 vs mean(1,1,0) = 2/3 → -2/3
    _close(adv, [1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3])
    # = G/(G-1)·(r - mean) = 4/3 · CENTRED
    _close(adv, [4 / 3 * c for c in CENTRED])


def test_rloo_unequal_group_sizes():
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([1, 1, 2, 2, 2])
    # group 1 (G=2): 1 - 0 = 1, 0 - 1 = -1
    # group 2 (G=3): 3 - mean(0, 0) = 3, 0 - mean(3, 0) = -1.5
    _close(rloo_advantages(rewards, groups), [1.0, -1.0, 3.0, -1.5, -1.5])


def test_rloo_std_normalization_is_applied_like_grpo():
    # "group": LOO advantage / group std; "batch": / batch std (see rloo_advantages' docstring)
    group = rloo_advantages(REWARDS, GROUPS, std_normalization="group")
    _close(group, [4 / 3 * c / (s + EPS) for c, s in zip(CENTRED, GROUP_STD, strict=True)])
    batch = rloo_advantages(REWARDS, GROUPS, std_normalization="batch")
    _close(batch, [4 / 3 * c / (BATCH_STD + EPS) for c in CENTRED])


def _reference(rewards, groups, estimator, mode, eps):
    """Slow, independent implementation: a Python loop over groups with `statistics`."""
    rewards, groups = rewards.tolist(), groups.tolist()
    batch_std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    valid = [len({x for x, h in zip(rewards, groups, strict=True) if h == g}) > 1 for g in groups]
    alpha = len(rewards) / sum(valid) if estimator == "gpg" and any(valid) else 1.0
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        if len(set(members)) == 1:
            out.append(0.0)
            continue
        if estimator in ("grpo", "gpg"):
            value = r - statistics.fmean(members)
        else:
            others = list(members)
            others.remove(r)
            value = r - statistics.fmean(others)
        if mode == "group":
            value /= statistics.stdev(members) + eps
        elif mode == "batch":
            value /= batch_std + eps
        out.append(alpha * value)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("mode", ["group", "batch", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gpg"])
def test_matches_slow_reference_on_random_batches(estimator, mode):
    gen = torch.Generator().manual_seed(1234)
    for trial in range(5):
        n = 40
        groups = torch.randint(-50, 50, (n,), generator=gen) * 3  # sparse, negative ids
        if trial % 2:
            rewards = torch.randint(0, 2, (n,), generator=gen).double()  # many constant groups
        else:
            rewards = torch.randn(n, generator=gen, dtype=torch.float64)
        expected = _reference(rewards, groups, estimator, mode, 1e-4)
        actual = ADVANTAGES.get(estimator)(rewards, groups, std_normalization=mode, epsilon=1e-4)
        torch.testing.assert_close(actual, expected, atol=1e-9, rtol=1e-9)


def test_gpg_scales_by_the_batch_over_its_learning_samples():
    # groups: [1, 0, 0, 0] (learns), [1, 1, 1, 1] (constant: M = 4), [1, 0] (learns); B = 10
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 1, 0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    alpha = 10 / (10 - 4)
    adv = gpg_advantages(rewards, groups)  # F_norm = 1: alpha * (r - group mean)
    _close(adv, [alpha * c for c in [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0, 0.5, -0.5]])
    _close(adv[:2], [1.25, -5 / 12])
    # the F_norm = std variant: group 0's std is 0.5, group 2's is sqrt(0.5)
    adv = gpg_advantages(rewards, groups, std_normalization="group")
    _close(adv[[0, 8]], [alpha * 0.75 / (0.5 + EPS), alpha * 0.5 / (math.sqrt(0.5) + EPS)])
    # every group constant: nothing to scale
    assert torch.equal(gpg_advantages(torch.ones(4), torch.tensor([0, 0, 1, 1])), torch.zeros(4))


def test_gpg_over_the_whole_batch_is_the_mean_over_its_learning_samples():
    """What alpha is for: a per-sample mean of A_i * x_i over the whole batch, constant groups
    counted, equals Dr. GRPO's over the learning samples alone."""
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1], dtype=torch.float64)
    groups = torch.arange(16) // 4  # groups 1 and 2 constant
    x = torch.randn(16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    learning = (groups == 0) | (groups == 3)
    whole = (gpg_advantages(rewards, groups) * x).mean()
    dr_grpo = group_normalized_advantages(rewards, groups, std_normalization="none")
    torch.testing.assert_close(whole, (dr_grpo * x)[learning].mean(), atol=1e-12, rtol=0)


def test_float32_integer_and_empty_inputs():
    adv = group_normalized_advantages(REWARDS.float(), GROUPS)
    assert adv.dtype == torch.float32
    _close(adv, [c / (s + EPS) for c, s in zip(CENTRED, GROUP_STD, strict=True)])
    as_int = group_normalized_advantages(REWARDS.long(), GROUPS, std_normalization="none")
    assert as_int.is_floating_point()
    _close(as_int.double(), CENTRED)
    empty = group_normalized_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="std_normalization must be one of group, batch, none"):
        group_normalized_advantages(REWARDS, GROUPS, std_normalization="grp")
    with pytest.raises(ValueError, match="integer"):
        rloo_advantages(REWARDS, GROUPS.double())
    with pytest.raises(ValueError, match="1-D"):
        group_normalized_advantages(REWARDS[None], GROUPS[None])
    with pytest.raises(ValueError, match="shape"):
        group_normalized_advantages(REWARDS, GROUPS[:3])


def test_reinforce_pp_hand_values():
    adv = reinforce_pp_advantages(REWARDS, GROUPS)
    # batch mean 0.375, unbiased batch std 0.5175492 (see BATCH_STD); no group baseline:
    # r=1 → 0.625/0.5175492 = 1.2076147; r=0 → -0.375/0.5175492 = -0.7245688
    r1, r0 = 0.625 / (BATCH_STD + EPS), -0.375 / (BATCH_STD + EPS)
    _close(adv, [r1, r0, r0, r0, r1, r1, r0, r0])
    _close(adv[:2], [1.2076147, -0.7245688], atol=1e-5)
    assert adv.dtype == torch.float64
    assert ADVANTAGES.get("reinforce_pp") is reinforce_pp_advantages
    # whitened: mean 0, unbiased std 1 (up to ε)
    _close(adv.mean(), 0.0)
    _close(adv.std(), 1.0, atol=1e-5)


def test_reinforce_pp_zero_variance_batch_is_exactly_zero():
    # float64: mean([0.1]*3) = 0.10000000000000002, so r - mean = -1.39e-17 and dividing by
    # (std + 1e-6) would leave -1.4e-11; the all-equal rule must still give exactly 0 (the mean
    # of [0.1]*5 happens to be exact, so it would not test the rule)
    for rewards in (torch.full((3,), 0.1, dtype=torch.float64), torch.ones(3), torch.tensor([2.0])):
        groups = torch.arange(rewards.numel())
        adv = reinforce_pp_advantages(rewards, groups)
        assert torch.equal(adv, torch.zeros_like(rewards))
    empty = reinforce_pp_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_reinforce_pp_ignores_groups_and_std_normalization():
    # constant groups (which grpo zeroes) keep their batch-whitened advantages here
    expected = reinforce_pp_advantages(REWARDS, GROUPS)
    gen = torch.Generator().manual_seed(7)
    for ids in (
        torch.zeros(8, dtype=torch.long),  # one group
        torch.arange(8),  # every sample alone
        torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]),
        torch.randint(-100, 100, (8,), generator=gen),
    ):
        for mode in ("group", "batch", "none"):
            actual = reinforce_pp_advantages(REWARDS, ids, std_normalization=mode)
            torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="std_normalization must be one of"):
        reinforce_pp_advantages(REWARDS, GROUPS, std_normalization="grp")
    with pytest.raises(ValueError, match="integer"):
        reinforce_pp_advantages(REWARDS, GROUPS.double())


def test_reinforce_pp_baseline_by_hand():
    # groups: {0: [1, 0]}, {1: [1, 1, 0, 0]}, {2: [1, 1]} (constant)
    # centred: [0.5, -0.5, 0.5, 0.5, -0.5, -0.5, 0, 0]; mean 0, sum of squares 6*0.25 = 1.5
    # unbiased batch std = sqrt(1.5 / 7) = 0.46291005; A = centred / (0.46291005 + 1e-6)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2])
    adv = ADVANTAGES.get("reinforce_pp_baseline")(rewards, groups)
    std = (1.5 / 7) ** 0.5
    expected = torch.tensor([0.5, -0.5, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0]) / (std + 1e-6)
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.equal(adv[6:], torch.zeros(2))
    # LitePPO's batch std uses the raw rewards (std of [1,0,1,1,0,0,1,1] = 0.5175) instead
    lite = ADVANTAGES.get("grpo")(rewards, groups, std_normalization="batch")
    assert not torch.allclose(adv, lite, atol=1e-3)


def test_reinforce_pp_baseline_inexact_constant_group_is_exactly_zero():
    # group 0 = [0.1]*3 (mean inexact: residue -1.39e-17), group 1 = [1, 0] (centred ±0.5);
    # centred, the constant group zeroed: [0, 0, 0, 0.5, -0.5]; batch mean 0,
    # unbiased std = sqrt((0.25 + 0.25) / 4) = sqrt(0.125) = 0.35355339
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float64)
    adv = ADVANTAGES.get("reinforce_pp_baseline")(rewards, torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(adv[:3], torch.zeros(3, dtype=torch.float64))
    a = 0.5 / (math.sqrt(0.125) + EPS)  # 1.4142095
    _close(adv[3:], [a, -a])


def test_reinforce_pp_baseline_all_constant_groups_give_zero():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv = ADVANTAGES.get("reinforce_pp_baseline")(rewards, torch.tensor([0, 0, 1, 1]))
    assert torch.equal(adv, torch.zeros(4))


def test_gdpo_hand_values():
    """Three groups, rewards r1 and r2 weighted 1 and 0.5 (ε = 0). Group A: r1 = [1, 0, 1, 0]
    (±√3/2 normalised), r2 constant; group B: r1 constant, r2 = [0, 1, 0, 1] (∓√3/2, × 0.5);
    group C: both constant. Â = [±√3/2 in A, ∓√3/4 in B, 0 in C], whose unbiased batch std
    over 10 samples is √(3.75/9) = √(5/12): A gets ±3/√5, B ∓1.5/√5, C exactly 0. GRPO on
    the weighted sum gives A and B advantages of one magnitude."""
    r1 = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    r2 = [0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    parts = torch.tensor([r1, r2]).T
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 2)
    adv = decoupled_group_advantages(parts, torch.tensor([1.0, 0.5]), groups, epsilon=0.0)
    a, b = 3 / math.sqrt(5), 1.5 / math.sqrt(5)
    _close(adv, [a, -a, a, -a, -b, b, -b, b, 0.0, 0.0])
    assert adv.dtype == torch.float32 and (adv[8:] == 0).all()
    summed = group_normalized_advantages(parts @ torch.tensor([1.0, 0.5]), groups, epsilon=0.0)
    assert summed[0].abs() == pytest.approx(summed[4].abs())  # the sum loses B's smaller scale


def test_gdpo_equals_trls_normalize_then_sum():
    """TRL's formula (per-reward group mean and std, ε = 1e-4, the weighted sum, then minus
    the batch mean over the batch std), written out here, on random rewards of 8 groups of 4."""
    g = torch.Generator().manual_seed(0)
    parts = torch.randint(0, 3, (32, 3), generator=g).double()
    weights = torch.tensor([1.0, 0.3, -0.2], dtype=torch.float64)
    grouped = parts.view(8, 4, 3)
    normalized = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    total = (normalized.view(32, 3) * weights).sum(1)
    trl = (total - total.mean()) / (total.std() + 1e-4)
    ours = decoupled_group_advantages(parts, weights, torch.arange(32) // 4, epsilon=1e-4)
    _close(ours, trl, atol=1e-9)
    with pytest.raises(ValueError, match=r"parts must be \[N, K\] and weights \[K\]"):
        decoupled_group_advantages(parts, weights[:2], torch.arange(32) // 4)


def test_opo_weights_the_baseline_by_length():
    """Group 0: rewards [1, 0, 0, 0] of lengths [2, 2, 4, 8]: b = 2/16 = 0.125; group 1:
    [1, 1, 0, 0] of lengths [1, 3, 2, 2]: b = 4/8 = 0.5. Equal lengths give Dr. GRPO's
    advantage; a constant group gets 0; `std_normalization` divides as for grpo."""
    lengths = torch.tensor([2, 2, 4, 8, 1, 3, 2, 2])
    adv = opo_advantages(REWARDS, GROUPS, lengths=lengths)
    _close(adv, [0.875, -0.125, -0.125, -0.125, 0.5, 0.5, -0.5, -0.5])
    equal = opo_advantages(REWARDS, GROUPS, lengths=torch.full((8,), 5))
    _close(equal, group_normalized_advantages(REWARDS, GROUPS, std_normalization="none"))
    constant = opo_advantages(
        torch.ones(3), torch.tensor([0, 0, 0]), lengths=torch.tensor([1, 2, 9])
    )
    assert constant.tolist() == [0.0, 0.0, 0.0]
    group = opo_advantages(REWARDS, GROUPS, lengths=lengths, std_normalization="group")
    _close(group[:4], [a / (0.5 + EPS) for a in [0.875, -0.125, -0.125, -0.125]])
    with pytest.raises(ValueError, match=r"opo needs lengths of shape \(8,\), got None"):
        opo_advantages(REWARDS, GROUPS)
    assert ADVANTAGES.get("opo") is opo_advantages


def test_opo_inexact_constant_group_is_exactly_zero():
    # group 0 = [0.1]*3, lengths [1, 1, 1]: b = 0.3/3 = 0.10000000000000002, r - b = -1.39e-17
    # ("group": / (0 + 1e-6) would leave -1.4e-11): exactly 0 in every mode;
    # group 1 = [1, 0], lengths [1, 3]: b = 1/4, so [0.75, -0.25]
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    lengths = torch.tensor([1, 1, 1, 1, 3])
    for mode in ("none", "group", "batch"):
        adv = opo_advantages(rewards, groups, lengths=lengths, std_normalization=mode)
        assert torch.equal(adv[:3], torch.zeros(3, dtype=torch.float64)), mode
    _close(opo_advantages(rewards, groups, lengths=lengths)[3:], [0.75, -0.25])


def test_opo_baseline_is_the_variance_minimising_one_for_length_proportional_norms():
    """The minimiser over b of E[l (r - b)^2] (the gradient's second moment when its squared
    norm is proportional to the length l), found by a dense search, is OPO's baseline."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    lengths = torch.tensor([3.0, 10.0, 1.0, 6.0, 2.0], dtype=torch.float64)
    grid = torch.linspace(0, 1, 100001, dtype=torch.float64)
    second_moment = (lengths[None] * (rewards[None] - grid[:, None]) ** 2).sum(-1)
    best = grid[second_moment.argmin()]
    baseline = (
        rewards[0] - opo_advantages(rewards, torch.zeros(5, dtype=torch.long), lengths=lengths)[0]
    )
    _close(baseline, best.item(), atol=1e-5)


def test_the_loop_gives_opo_the_trained_token_counts():
    """`batch_advantages` with `advantage: opo` weights by each row's trained tokens (its
    response mask: a tool's result inside a completion is not counted), on every token."""
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = token_batch(
        [[5]] * 4, [[7] * 2, [7] * 6, [7] * 4, [7] * 4], torch.tensor([0, 0, 1, 1]), torch.zeros(4)
    )
    batch.response_mask[1, 1:4] = 0  # three tool tokens: 3 trained tokens of 6
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    algo = AlgorithmConfig(advantage="opo", std_normalization="none")
    advantages, _ = batch_advantages(batch, algo, kl_coef=0.0)
    # group 0: b = (2·1 + 3·0) / 5 = 0.4; group 1: equal lengths, b = 0.5
    expected = torch.tensor([0.6, -0.4, -0.5, 0.5])
    torch.testing.assert_close(advantages, expected[:, None] * batch.response_mask)


def test_remax_subtracts_the_greedy_reward():
    """A_i = r_i − r(greedy completion of prompt i), one sample per prompt or several; the
    batch normalisation divides by the std of the rewards; the group one is refused."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    greedy = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    adv = remax_advantages(rewards, torch.arange(4), baselines=greedy)
    _close(adv, [1.0, 0.0, 0.0, -1.0])
    batch = remax_advantages(rewards, torch.arange(4), baselines=greedy, std_normalization="batch")
    _close(batch, [a / (math.sqrt(1 / 3) + EPS) for a in [1.0, 0.0, 0.0, -1.0]])
    with pytest.raises(ValueError, match="std_normalization='group' has no spread"):
        remax_advantages(rewards, torch.arange(4), baselines=greedy, std_normalization="group")
    with pytest.raises(ValueError, match=r"remax needs baselines of shape \(4,\), got None"):
        remax_advantages(rewards, torch.arange(4))


def test_the_loop_gives_remax_each_prompts_greedy_reward():
    """`batch_advantages` with `advantage: remax` subtracts the batch's `greedy_rewards`."""
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = token_batch([[5]] * 3, [[7] * 2] * 3, torch.tensor([0, 0, 1]), torch.zeros(3))
    batch.rewards = torch.tensor([1.0, 0.0, 1.0])
    batch.greedy_rewards = torch.tensor([0.0, 0.0, 1.0])
    algo = AlgorithmConfig(advantage="remax", std_normalization="none")
    advantages, _ = batch_advantages(batch, algo, kl_coef=0.0)
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_a_remax_step_scores_each_prompts_greedy_completion():
    """`collect_step` with `advantage: remax` asks the engine for one argmax completion per
    prompt after the samples, scores it with the same rewards, and gives every sample its
    prompt's greedy reward; the greedy completions are not in the batch."""
    from rlvr.config import resolve_config
    from rlvr.data.sampler import build_sampler
    from rlvr.data.tasks import load_task
    from rlvr.models.tiny import build_tiny_model
    from rlvr.training.rewarding import RewardScorer
    from rlvr.training.sampling import collect_step
    from scripted_engine import TOK, Scripted

    cfg = resolve_config(
        preset="remax",
        overrides=[
            "data.train_size=8",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
        ],
    )
    task = load_task(cfg.data)
    sampler = build_sampler("sequential", len(task.train), seed=0)
    first, second = task.train[0].answer, task.train[1].answer
    sampled = [f"<answer>{first}</answer>", "<answer>x</answer>", "<answer>x</answer>", "?"]
    greedy = ["<answer>x</answer>", f"<answer>{second}</answer>"]
    engine = Scripted(sampled, greedy)
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    step = collect_step(engine, TOK, task, sampler, cfg, RewardScorer(cfg, task))
    (_, sampling), (_, argmax) = engine.asked
    assert (sampling.n, sampling.temperature) == (2, cfg.rollout.temperature)
    assert (argmax.n, argmax.temperature) == (1, 0.0)
    assert step.kept.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert step.kept.greedy_rewards.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert len(step.kept) == 4


def _expected_pkpo_gradient(n: int, k: int, p: float) -> float:
    """E[Σ_i A_i ∂log π(y_i)/∂θ] for n Bernoulli(p = sigmoid θ) samples of one prompt, by
    enumerating all 2^n outcomes (∂log π/∂θ is 1 − p for a pass, −p for a fail)."""
    import itertools

    total = 0.0
    for outcome in itertools.product([0.0, 1.0], repeat=n):
        c = sum(outcome)
        probability = p**c * (1 - p) ** (n - c)
        rewards = torch.tensor(outcome, dtype=torch.float64)
        adv = pass_at_k_advantages(rewards, torch.zeros(n, dtype=torch.long), k=k)
        score = rewards * (1 - p) - (1 - rewards) * p
        total += probability * float((adv * score).sum())
    return total


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pass_at_k_advantages_follow_the_gradient_of_pass_at_k(k):
    """PKPO (Walder & Karkhanis 2025): in expectation the advantages' policy gradient is
    n/k × d pass@k / dθ, pass@k = 1 − (1 − p)^k, for each k below the group size."""
    n, p = 6, 0.3
    exact = k * (1 - p) ** (k - 1) * p * (1 - p)  # d/dθ [1 − (1 − p)^k], dp/dθ = p(1 − p)
    assert _expected_pkpo_gradient(n, k, p) == pytest.approx(n / k * exact, rel=1e-9)


def test_pass_at_k_hand_values_and_k1_is_rloo():
    """n = 4, c = 1: the pass gets 1 − ρ(3, 0, 2) = 1, each fail ρ(3, 1, 1) − ρ(3, 1, 2) =
    1/3 − 2/3 = −1/3; c = 2: a pass 1 − ρ(3, 1, 2) = 1/3, a fail ρ(3, 2, 1) − ρ(3, 2, 2) =
    2/3 − 1 = −1/3. k = 1 is RLOO; non-binary rewards and k ≥ the group size are refused."""
    adv = pass_at_k_advantages(REWARDS, GROUPS, k=2)
    _close(adv, [1, -1 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -1 / 3, -1 / 3])
    _close(pass_at_k_advantages(REWARDS, GROUPS), rloo_advantages(REWARDS, GROUPS))  # k = 1
    assert pass_at_k_estimate(torch.tensor(8.0), torch.tensor(2.0), 3) == pytest.approx(
        1 - math.comb(6, 3) / math.comb(8, 3)
    )
    with pytest.raises(ValueError, match=r"needs rewards of 0 or 1 .*got 0\.5"):
        pass_at_k_advantages(torch.tensor([0.5, 1.0]), torch.tensor([0, 0]), k=1)
    with pytest.raises(ValueError, match=r"k=4 must be at least 1 and below every group's size"):
        pass_at_k_advantages(REWARDS, GROUPS, k=4)
    with pytest.raises(ValueError, match=r"k=1 .*\(smallest 1\)"):  # a lone sample
        pass_at_k_advantages(torch.tensor([1.0]), torch.tensor([0]), k=1)


def test_pass_at_k_estimate_of_hundreds_and_thousands_of_samples_matches_exact_fractions():
    """ρ(n, c, k) = 1 − C(n − c, k) / C(n, k) for n = 300 samples and k = 150, against exact
    integer binomials: C(300, 150) ≈ 9e88 is far inside float64, while 300! (3e614) is not,
    so the estimate must not pass through a factorial that large on its way to the ratio."""
    from fractions import Fraction

    n = torch.tensor([300.0, 300.0, 300.0], dtype=torch.float64)
    c = torch.tensor([1.0, 5.0, 150.0], dtype=torch.float64)
    exact = [1 - Fraction(math.comb(300 - int(p), 150), math.comb(300, 150)) for p in (1, 5, 150)]
    _close(pass_at_k_estimate(n, c, 150), [float(e) for e in exact], atol=1e-9)
    assert float(exact[0]) == 0.5  # one pass among 300: half of all 150-subsets hold it
    # C(3000, 1500) ≈ 1e901 overflows float64 itself: the ratio is taken in log space; float32
    # counts are read in float64; k = 0 is 0 and k > n undefined
    big = 1 - Fraction(math.comb(2997, 1500), math.comb(3000, 1500))
    estimate = pass_at_k_estimate(torch.tensor([3000.0]), torch.tensor([3.0]), 1500)
    _close(estimate, [float(big)], atol=1e-9)
    as_float32 = pass_at_k_estimate(n.float(), c.float(), 150)
    _close(as_float32, [float(e) for e in exact], atol=1e-9)
    assert pass_at_k_estimate(n, c, 0).tolist() == [0.0, 0.0, 0.0]
    assert torch.isnan(pass_at_k_estimate(torch.tensor([3.0]), torch.tensor([1.0]), 4)).all()


def test_weighted_reinforce_gives_passes_lambda_and_fails_minus_one():
    """W-REINFORCE: +λ for a pass and −1 for a fail, whatever the group (an all-pass group
    keeps its signal); λ = 0 is negative samples alone; batch normalisation divides by the
    rewards' std; group normalisation and non-binary rewards are refused."""
    adv = weighted_reinforce_advantages(REWARDS, GROUPS)
    _close(adv, [0.1, -1, -1, -1, 0.1, 0.1, -1, -1])
    all_pass = weighted_reinforce_advantages(torch.ones(3), torch.zeros(3, dtype=torch.long))
    _close(all_pass, [0.1, 0.1, 0.1])
    nsr = weighted_reinforce_advantages(REWARDS, GROUPS, positive_weight=0.0)
    _close(nsr, [0, -1, -1, -1, 0, 0, -1, -1])
    batch = weighted_reinforce_advantages(REWARDS, GROUPS, std_normalization="batch")
    _close(batch, [a / (BATCH_STD + EPS) for a in [0.1, -1, -1, -1, 0.1, 0.1, -1, -1]])
    with pytest.raises(
        ValueError, match=r"std_normalization='group' would divide a constant group"
    ):
        weighted_reinforce_advantages(REWARDS, GROUPS, std_normalization="group")
    with pytest.raises(ValueError, match=r"w_reinforce needs rewards of 0 or 1 .*got 2\.0"):
        weighted_reinforce_advantages(torch.tensor([2.0, 1.0]), torch.tensor([0, 0]))


def test_the_loop_gives_w_reinforce_its_positive_weight():
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = token_batch([[5]] * 2, [[7] * 2] * 2, torch.tensor([0, 0]), torch.zeros(2))
    batch.rewards = torch.tensor([1.0, 0.0])
    algo = AlgorithmConfig(advantage="w_reinforce", positive_weight=0.5, std_normalization="none")
    advantages, _ = batch_advantages(batch, algo, kl_coef=0.0)
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.5], [-1.0, -1.0]]))


def test_best_of_group_moves_only_the_sole_best_sample():
    """A_i = max_g r − max_{j≠i} r: the best reward minus the second best for the sole best
    sample, 0 for the others and for a tie at the top; a group of one gets 0; group std
    normalisation divides by the group's std."""
    rewards = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, 0.7], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    _close(best_of_group_advantages(rewards, groups), [0, 0.4, 0, 0, 0, 0, 0])
    pair = torch.tensor([0.8, 0.3], dtype=torch.float64)  # a group of two: 0.8 − 0.3 for 0.8
    _close(best_of_group_advantages(pair, torch.tensor([4, 4])), [0.5, 0])
    verdicts = best_of_group_advantages(REWARDS, GROUPS)  # one pass in group 0, two in 1
    _close(verdicts, [1, 0, 0, 0, 0, 0, 0, 0])
    normalised = best_of_group_advantages(rewards, groups, std_normalization="group")
    std = torch.tensor([0.2, 0.9, 0.5]).std().item()
    _close(normalised, [0, 0.4 / (std + EPS), 0, 0, 0, 0, 0])


def test_best_of_group_follows_the_gradient_of_the_expected_max():
    """Tang et al. 2025's leave-one-out estimator for k = n: enumerating all 3^4 outcomes of
    four samples with rewards 0, 0.5 or 1 (probabilities softmax θ), E[Σ_i A_i ∇log π(y_i)]
    equals ∇ E[max_i r_i], computed by autograd of the enumerated expectation."""
    import itertools

    levels = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    theta = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    logp = theta.log_softmax(-1)
    expected_max = torch.zeros((), dtype=torch.float64)
    estimate = torch.zeros((), dtype=torch.float64)
    for outcome in itertools.product(range(3), repeat=4):
        index = torch.tensor(outcome)
        probability = logp[index].sum().exp()
        rewards = levels[index]
        expected_max = expected_max + probability * rewards.max()
        adv = best_of_group_advantages(rewards, torch.zeros(4, dtype=torch.long))
        estimate = estimate + probability.detach() * (adv * logp[index]).sum()
    (want,) = torch.autograd.grad(expected_max, theta, retain_graph=True)
    (got,) = torch.autograd.grad(estimate, theta)
    torch.testing.assert_close(got, want)


def test_pass_at_k_std_normalization_divides_as_for_grpo():
    # k = 2, "none" (test_pass_at_k_hand_values_and_k1_is_rloo):
    #   [1, -1/3, -1/3, -1/3, 1/3, 1/3, -1/3, -1/3]
    # "group": / GROUP_STD (0.5 and 0.5773503) → [2, -2/3, -2/3, -2/3, ±0.5773503 …]
    # "batch": / BATCH_STD of the raw rewards (0.5175492)
    raw = [1, -1 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -1 / 3, -1 / 3]
    group = pass_at_k_advantages(REWARDS, GROUPS, k=2, std_normalization="group")
    _close(group, [a / (s + EPS) for a, s in zip(raw, GROUP_STD, strict=True)])
    _close(group[[0, 1, 4]], [2.0, -2 / 3, 0.5773503], atol=1e-5)
    batch = pass_at_k_advantages(REWARDS, GROUPS, k=2, std_normalization="batch")
    _close(batch, [a / (BATCH_STD + EPS) for a in raw])


# A sample alone in its group, by hand: no group baseline, so 0, except ReMax (r − the greedy
# response's reward 0.25) and W-REINFORCE (a right answer weighted λ = 0.1, a wrong one −1).
ALONE = {"remax": ([0.75], [-0.25]), "w_reinforce": ([0.1], [-1.0])}


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_estimator_maps_an_empty_batch_to_an_empty_one_and_a_lone_sample_by_hand(name):
    """Every registered estimator, on no samples (a step whose groups were all filtered out)
    and on one sample in a group of its own: float32 in, float32 out, one advantage a
    sample. `pass_at_k` refuses a group no larger than k, so it has no lone-sample case."""
    extra = {"opo": "lengths", "remax": "baselines"}.get(name)

    def advantages(rewards: list[float], side: list[float]) -> torch.Tensor:
        kwargs = {extra: torch.tensor(side)} if extra else {}
        group_ids = torch.full((len(rewards),), 7, dtype=torch.long)
        return ADVANTAGES.get(name)(torch.tensor(rewards), group_ids, **kwargs)

    empty = advantages([], [])
    assert empty.shape == (0,) and empty.dtype == torch.float32
    if name == "pass_at_k":
        return
    right, wrong = ALONE.get(name, ([0.0], [0.0]))
    side = [0.25] if name == "remax" else [3.0]
    assert advantages([1.0], side).tolist() == pytest.approx(right)
    assert advantages([0.0], side).tolist() == pytest.approx(wrong)


def _kl_batch():
    """Three samples of one group, lengths [2, 1, 2], rewards [1, 0, 1], log π = 0 on every
    token and log π_ref = −k1: k1 = [[0.5, −0.25], [−1, pad], [−0.5, 1]] (the pad's 9 is
    outside the mask and must not count)."""
    from batches import token_batch

    groups = torch.zeros(3, dtype=torch.long)
    batch = token_batch([[5]] * 3, [[7] * 2, [7], [7] * 2], groups, torch.zeros(3))
    batch.rewards = torch.tensor([1.0, 0.0, 1.0])
    batch.ref_logprobs = -torch.tensor([[0.5, -0.25], [-1.0, -9.0], [-0.5, 1.0]])
    return batch


def test_a_kl_in_the_reward_subtracts_beta_times_each_samples_summed_kl():
    """`kl.in_reward`: r_i ← r_i − β Σ_t k1_t over the sample's own response tokens, before
    the group baseline. β = 0.2: penalties [0.05, −0.2, 0.1], shaped rewards [0.95, 0.2, 0.9]
    of mean 0.68333. With `clamp_in_reward` each token's k1 is first clamped at 0: penalties
    [0.1, 0, 0.2], shaped [0.9, 0, 0.8] of mean 0.56667. A KL in the loss leaves the rewards
    alone although the batch has reference log-probs."""
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = _kl_batch()

    def advantages(**kl) -> torch.Tensor:
        algo = AlgorithmConfig.model_validate(
            {"std_normalization": "none", "kl": {"coef": 0.2, "estimator": "k1", **kl}}
        )
        return batch_advantages(batch, algo, kl_coef=0.2)[0]

    mask = batch.response_mask
    shaped = torch.tensor([0.95 - 2.05 / 3, 0.2 - 2.05 / 3, 0.9 - 2.05 / 3])
    torch.testing.assert_close(advantages(in_reward=True), shaped[:, None] * mask)
    clamped = torch.tensor([0.9 - 1.7 / 3, -1.7 / 3, 0.8 - 1.7 / 3])
    torch.testing.assert_close(
        advantages(in_reward=True, clamp_in_reward=True), clamped[:, None] * mask
    )
    plain = torch.tensor([1 / 3, -2 / 3, 1 / 3])
    torch.testing.assert_close(advantages(in_reward=False), plain[:, None] * mask)


def test_normalize_then_sum_zeroes_the_padding_and_counts_only_weighted_parts():
    """GDPO in `batch_advantages`: one part [1, 0] in a group of two normalises to ±1/√2 (std
    1/√2, then the batch std 1), on each sample's own tokens only (lengths [2, 1]); a part of
    weight 0, or no weights at all, gives every sample 0."""
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = token_batch([[5]] * 2, [[7] * 2, [7]], torch.tensor([0, 0]), torch.zeros(2))
    batch.rewards = torch.tensor([1.0, 0.0])
    batch.reward_parts = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 1.0])}
    algo = AlgorithmConfig(reward_aggregation="normalize_then_sum")
    advantages, returns = batch_advantages(batch, algo, 0.0, {"a": 1.0, "b": 0.0})
    h = math.sqrt(0.5)
    torch.testing.assert_close(advantages, torch.tensor([[h, h], [-h, 0.0]]), atol=1e-5, rtol=0)
    assert returns is None
    for weights in ({"b": 0.0}, None):
        none, _ = batch_advantages(batch, algo, 0.0, weights)
        assert none.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_vapos_length_adaptive_lambda_is_each_samples_own():
    """`critic.length_adaptive_alpha` α = 0.5 on lengths [2, 4]: λ = 1 − 1/(α l) = [0, 0.5];
    with V = 0, γ = 1 and reward 1 on the last token, A_t = λ^(l−1−t): [0, 1] and
    [0.125, 0.25, 0.5, 1]. The critic's targets use `critic_lam` = 1: the return 1 on every
    token."""
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import batch_advantages

    batch = token_batch([[5]] * 2, [[7] * 2, [7] * 4], torch.tensor([0, 1]), torch.zeros(2))
    batch.rewards = torch.tensor([1.0, 1.0])
    batch.values = torch.zeros(2, 4)
    critic = {"length_adaptive_alpha": 0.5, "critic_lam": 1.0, "whiten_advantages": False}
    algo = AlgorithmConfig.model_validate({"advantage": "gae", "critic": critic})
    advantages, returns = batch_advantages(batch, algo, kl_coef=0.0)
    assert advantages.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.125, 0.25, 0.5, 1.0]]
    assert returns.tolist() == [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]


def test_an_on_policy_step_without_an_entropy_filter_runs_no_policy_forward():
    """`prepare_update` needs the policy's log-probs only for several updates per step (the
    old log-probs) or for `entropy.top_frac` below 1: otherwise the policy is not run."""
    from batches import token_batch
    from rlvr.config import AlgorithmConfig
    from rlvr.training.estimation import prepare_update
    from rlvr.training.update import LossSettings

    class NoForward(torch.nn.Linear):
        def forward(self, *args, **kwargs):
            raise AssertionError("the policy was run")

    batch = token_batch([[5]] * 2, [[7] * 2, [7]], torch.tensor([0, 0]), torch.zeros(2))
    batch.rewards = torch.tensor([1.0, 0.0])
    settings = LossSettings(AlgorithmConfig(std_normalization="none"), 1.0, 4, 64, 0)
    prepare_update(batch, NoForward(1, 1), None, None, settings, needs_old_logprobs=False)
    assert batch.old_logprobs is None
    assert batch.advantages.tolist() == [[0.5, 0.5], [-0.5, 0.0]]
