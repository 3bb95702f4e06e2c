"""Reward-shaping functions against hand-computed numbers."""

import pytest
import torch

from rlvr.algorithms.shaping import (
    apply_truncation_reward,
    kimi_length_reward,
    repetition_penalty,
    soft_overlong_penalty,
)

T, F = True, False


def _close(actual, expected, atol=1e-7):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_soft_overlong_penalty_each_regime():
    # L_max = 20, L_cache = 4 → L_max - L_cache = 16
    # L=10 ≤ 16 → 0;  L=16 (boundary) → 0;  L=17 → (16-17)/4 = -0.25;  L=18 → -0.5;
    # L=20 = L_max → (16-20)/4 = -1;  L=21 > L_max → -1
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    out = soft_overlong_penalty(lengths, max_len=20, buffer=4)
    _close(out, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    assert out.dtype == torch.get_default_dtype()
    # penalty scales every regime: ×0.5
    _close(
        soft_overlong_penalty(lengths, max_len=20, buffer=4, penalty=0.5),
        [0.0, 0.0, -0.125, -0.25, -0.5, -0.5],
    )


def test_soft_overlong_penalty_buffer_zero_and_full_buffer():
    # buffer = 0: no ramp; 0 up to and at L_max, -penalty beyond
    out = soft_overlong_penalty(torch.tensor([5, 20, 21]), max_len=20, buffer=0, penalty=2.0)
    _close(out, [0.0, 0.0, -2.0])
    # buffer = max_len = 10: ramp from 0: L=0 → 0, L=5 → -5/10 = -0.5, L=10 → -1
    out = soft_overlong_penalty(torch.tensor([0.0, 5.0, 10.0], dtype=torch.float64), 10, 10)
    assert out.dtype == torch.float64
    _close(out, [0.0, -0.5, -1.0])
    # the smallest settings: L_max = 1, a one-token ramp (L = L_max gets the full -penalty
    # from the ramp itself), penalty 0 (allowed: no shaping)
    _close(soft_overlong_penalty(torch.tensor([0, 1, 2]), 1, 1, 2.0), [0.0, -2.0, -2.0])
    _close(soft_overlong_penalty(torch.tensor([3, 5, 6]), 5, 2, 0.0), [0.0, 0.0, 0.0])


def test_soft_overlong_penalty_bad_args():
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(torch.tensor([1]), max_len=10, buffer=11)
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(torch.tensor([1]), max_len=10, buffer=-1)
    with pytest.raises(ValueError, match="max_len"):
        soft_overlong_penalty(torch.tensor([1]), max_len=0, buffer=0)
    with pytest.raises(ValueError, match="penalty"):
        soft_overlong_penalty(torch.tensor([1]), max_len=10, buffer=2, penalty=-1.0)


def test_apply_truncation_reward():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    truncated = torch.tensor([T, F, T])
    _close(apply_truncation_reward(rewards, truncated), [-1.0, 0.0, -1.0])
    _close(apply_truncation_reward(rewards, truncated, value=0.0), [0.0, 0.0, 0.0])
    _close(rewards, [1.0, 0.0, 0.5])  # input untouched
    as_int = apply_truncation_reward(torch.tensor([1, 1]), torch.tensor([F, T]))
    assert as_int.is_floating_point()
    _close(as_int, [1.0, -1.0])
    with pytest.raises(ValueError, match="bool"):
        apply_truncation_reward(rewards, torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="shape"):
        apply_truncation_reward(rewards, torch.tensor([T, F]))


def test_kimi_length_reward_by_hand():
    # group 8 (4 samples, 2 correct): lengths 10, 20, 40, 50 → min 10, max 50, span 40
    #   λ = 0.5 - (len - 10)/40 = 0.5, 0.25, -0.25, -0.5
    #   correct [T, F, T, F] → λ for correct, min(0, λ) otherwise:
    #   0.5, min(0, 0.25) = 0, -0.25, min(0, -0.5) = -0.5
    # group -3 (all length 7) → max == min → λ = 0 → 0 for all
    # The two groups are interleaved to check vectorised, non-contiguous grouping.
    lengths = torch.tensor([10, 7, 20, 7, 40, 7, 50])
    correct = torch.tensor([T, T, F, F, T, T, F])
    ids = torch.tensor([8, -3, 8, -3, 8, -3, 8])
    out = kimi_length_reward(lengths, correct, ids)
    _close(out, [0.5, 0.0, 0.0, 0.0, -0.25, 0.0, -0.5])
    assert out.dtype == torch.get_default_dtype()


def test_kimi_length_reward_singleton_empty_and_bad_inputs():
    # a span of exactly 1 token still ranks: lengths 3 and 4 give λ = 0.5 and -0.5
    _close(kimi_length_reward(torch.tensor([3, 4]), torch.tensor([T, T]), torch.tensor([0, 0])),
           [0.5, -0.5])  # fmt: skip
    # a group of one has max == min → 0
    _close(kimi_length_reward(torch.tensor([3.0]), torch.tensor([T]), torch.tensor([0])), [0.0])
    empty = kimi_length_reward(
        torch.zeros(0), torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long)
    )
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="bool"):
        kimi_length_reward(torch.tensor([1, 2]), torch.tensor([1, 0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="integer"):
        kimi_length_reward(torch.tensor([1, 2]), torch.tensor([T, F]), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        kimi_length_reward(torch.tensor([1, 2]), torch.tensor([T]), torch.tensor([0, 0]))


def test_repetition_penalty_by_hand():
    seqs = [
        # trigrams (1,2,3) (2,3,1) (3,1,2) (1,2,3): the 4th repeats the 1st → -1/4
        [1, 2, 3, 1, 2, 3],
        # trigrams (1,2,3) (2,3,4) (3,4,5): none repeat → 0
        [1, 2, 3, 4, 5],
        # trigrams (7,7,7) ×3: the 2nd and 3rd repeat → -2/3
        [7, 7, 7, 7, 7],
        # exactly one trigram → 0
        [1, 2, 3],
        # shorter than n → 0
        [5, 6],
        [],
    ]
    out = repetition_penalty(seqs, n=3)
    _close(out, [-0.25, 0.0, -2 / 3, 0.0, 0.0, 0.0])
    torch.testing.assert_close(repetition_penalty(seqs), out)  # n = 3 is the default
    assert out.dtype == torch.get_default_dtype()


def test_repetition_penalty_other_n_and_tensor_input():
    # n = 1: unigrams 4, 4, 5 → the second 4 repeats → -1/3
    _close(repetition_penalty([[4, 4, 5]], n=1), [-1 / 3])
    # n = 2 on [1,2,3,1,2,3]: bigrams 12 23 31 12 23 → 2 of 5 repeat → -0.4
    _close(repetition_penalty([torch.tensor([1, 2, 3, 1, 2, 3])], n=2), [-0.4])
    assert repetition_penalty([]).shape == (0,)
    with pytest.raises(ValueError, match="positive int"):
        repetition_penalty([[1, 2]], n=0)
