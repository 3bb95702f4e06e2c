"""Dynamic-sampling and overlong filters against hand-worked masks."""

import pytest
import torch

from rlvr.algorithms.filters import DynamicSampling, informative_groups, overlong_mask

T, F = True, False


def test_informative_groups_non_contiguous_ids_and_singletons():
    # group 7: rewards {1, 0, 1} → mixed → informative
    # group -2: {0, 0} → all equal → not informative
    # groups 40 and 11: one sample each → singleton → not informative
    ids = torch.tensor([7, -2, 7, 40, -2, 7, 11])
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0, 0.0, 1.0, 2.0])
    mask = informative_groups(rewards, ids)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [T, F, T, F, F, T, F]


def test_informative_groups_shaped_rewards_and_all_equal():
    # non-binary rewards: group 3 = {0.2, 0.3} differs; group 4 = {0.1, 0.1, 0.1} does not
    ids = torch.tensor([3, 4, 3, 4, 4])
    rewards = torch.tensor([0.2, 0.1, 0.3, 0.1, 0.1], dtype=torch.float64)
    assert informative_groups(rewards, ids).tolist() == [T, F, T, F, F]
    # an all-correct batch has nothing to learn from
    assert not informative_groups(torch.ones(4), torch.tensor([0, 0, 1, 1])).any()
    # integer rewards work as well
    assert informative_groups(torch.tensor([1, 0]), torch.tensor([0, 0])).tolist() == [T, T]


def test_informative_groups_empty_and_bad_inputs():
    empty = informative_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,) and empty.dtype == torch.bool
    with pytest.raises(ValueError, match="integer"):
        informative_groups(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        informative_groups(torch.zeros(2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        informative_groups(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long))


def test_dynamic_sampling_reaches_target_over_three_rounds():
    ds = DynamicSampling(target_groups=4, max_rounds=5)
    assert not ds.full and ds.rounds == 0 and ds.accepted == 0

    # round 1: group 0 = {1, 0} yes, group 1 = {1, 1} no, group 2 = {0, 1} yes → 2 accepted
    keep = ds.add(torch.tensor([1.0, 0, 1, 1, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert keep.tolist() == [T, T, F, F, T, T]
    assert (ds.accepted, ds.rounds, ds.full) == (2, 1, False)

    # round 2: every group all-equal → nothing accepted, but the round counts
    keep = ds.add(torch.tensor([0.0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert keep.tolist() == [F, F, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (2, 2, False)

    # round 3: interleaved ids 5, 9, 3, 8 — all four informative, only 4 - 2 = 2 places left.
    # Accepted in order of first appearance (5 at position 0, 9 at 1), not by id (3 < 5),
    # each with both of its samples: group 5 = positions {0, 3}, group 9 = positions {1, 4}.
    ids = torch.tensor([5, 9, 3, 5, 9, 3, 8, 8])
    rewards = torch.tensor([1.0, 1, 0, 0, 0, 1, 1, 0])
    keep = ds.add(rewards, ids)
    assert keep.tolist() == [T, T, F, T, T, F, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (4, 3, True)

    with pytest.raises(RuntimeError, match="full"):
        ds.add(rewards, ids)


def test_dynamic_sampling_stops_at_max_rounds_short_of_target():
    ds = DynamicSampling(target_groups=3, max_rounds=2)
    # round 1: group 1 = {0, 1} informative, group 2 = {1, 1} not → 1 of 3
    keep = ds.add(torch.tensor([0.0, 1, 1, 1]), torch.tensor([1, 1, 2, 2]))
    assert keep.tolist() == [T, T, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (1, 1, False)
    # round 2: nothing informative; max_rounds reached → full, with 1 group instead of 3
    keep = ds.add(torch.tensor([0.0, 0]), torch.tensor([1, 1]))
    assert keep.tolist() == [F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (1, 2, True)
    with pytest.raises(RuntimeError):
        ds.add(torch.tensor([0.0, 1]), torch.tensor([1, 1]))


def test_dynamic_sampling_properties_are_read_only_and_args_checked():
    ds = DynamicSampling(target_groups=1, max_rounds=1)
    with pytest.raises(AttributeError):
        ds.full = True
    with pytest.raises(AttributeError):
        ds.rounds = 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            DynamicSampling(target_groups=bad, max_rounds=1)
        with pytest.raises(ValueError, match="positive int"):
            DynamicSampling(target_groups=1, max_rounds=bad)


def test_overlong_mask_zeroes_truncated_rows():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0]])
    truncated = torch.tensor([F, T, F])
    out = overlong_mask(mask, truncated)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]]))
    assert mask[1].sum() == 3  # input untouched
    # a bool mask stays bool
    out_bool = overlong_mask(mask.bool(), truncated)
    assert out_bool.dtype == torch.bool
    assert out_bool.tolist() == [[T, T, F], [F, F, F], [T, F, F]]


def test_overlong_mask_bad_inputs():
    with pytest.raises(ValueError, match="2-D"):
        overlong_mask(torch.ones(3), torch.tensor([F, F, F]))
    with pytest.raises(ValueError, match="shape"):
        overlong_mask(torch.ones(3, 2), torch.tensor([F, F]))
    with pytest.raises(ValueError, match="bool"):
        overlong_mask(torch.ones(2, 2), torch.tensor([0, 1]))


def test_dynamic_sampling_orders_groups_by_first_not_last_sample():
    # group 5 at positions {0, 3}, group 3 at {1, 2}, both informative ({1, 0} and {0, 1}):
    # by first appearance 5 (position 0) comes before 3 (position 1), so with room for one
    # group, 5 is kept (by last appearance 3, at position 2, would come before 5, at 3)
    ds = DynamicSampling(target_groups=1, max_rounds=1)
    keep = ds.add(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([5, 3, 3, 5]))
    assert keep.tolist() == [T, F, F, T]
    assert ds.accepted == 1
