"""Loss aggregation: hand values and micro-batch invariance of the loss and its gradient."""

import math

import pytest
import torch

from rlvr.algorithms import AGGREGATIONS, aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
# masked row sums: 1+2 = 3, 4, 0 (the third row has no token); token counts 2, 1, 0


def _close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_token_mean_hand_value():
    # (3 + 4 + 0) / 3 tokens
    _close(aggregate("token_mean", VALUES, MASK, num_tokens=3, num_seqs=3, max_len=4), 7 / 3)
    # the global count may include other micro-batches' tokens: 7 / 10
    _close(aggregate("token_mean", VALUES, MASK, num_tokens=10, num_seqs=3, max_len=4), 0.7)


def test_seq_mean_token_mean_hand_value():
    # per-sequence means 3/2 = 1.5, 4/1 = 4, empty → 0; (1.5 + 4 + 0) / 3 sequences
    out = aggregate("seq_mean_token_mean", VALUES, MASK, num_tokens=3, num_seqs=3, max_len=4)
    _close(out, 5.5 / 3)
    out = aggregate("seq_mean_token_mean", VALUES, MASK, num_tokens=3, num_seqs=11, max_len=4)
    _close(out, 0.5)  # 5.5 / 11


def test_seq_mean_token_sum_hand_value():
    # (3 + 4 + 0) / (3 sequences · 4 max_len) = 7/12
    out = aggregate("seq_mean_token_sum", VALUES, MASK, num_tokens=3, num_seqs=3, max_len=4)
    _close(out, 7 / 12)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_one_token_in_one_sequence_is_its_own_loss(mode):
    """Counts of 1 are valid: one sequence whose one trained token carries 2 gives 2 in
    every mode (2/1 token, (2/1)/1 sequence, 2/(1 sequence · max_len 1))."""
    one = torch.tensor([[0, 1, 0]])
    out = aggregate(mode, VALUES[:1], one, num_tokens=1, num_seqs=1, max_len=1)
    _close(out, 2.0)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_masked_nan_and_inf_do_not_leak(mode):
    values = VALUES.clone().requires_grad_(True)
    poisoned = values + torch.tensor(
        [[0, 0, math.nan], [0, math.inf, 0], [math.nan] * 3], dtype=torch.float64
    )
    out = aggregate(mode, poisoned, MASK, num_tokens=3, num_seqs=3, max_len=4)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(values.grad).all()
    assert (values.grad[MASK == 0] == 0).all()


@pytest.mark.parametrize("bad", [{"num_tokens": 0}, {"num_seqs": 0}, {"max_len": 0}])
def test_non_positive_counts_are_refused(bad):
    counts = {"num_tokens": 3, "num_seqs": 3, "max_len": 4, **bad}
    modes = {
        "num_tokens": "token_mean",
        "num_seqs": "seq_mean_token_mean",
        "max_len": "seq_mean_token_sum",
    }
    with pytest.raises(ValueError, match=next(iter(bad))):
        aggregate(modes[next(iter(bad))], VALUES, MASK, **counts)


def test_unknown_mode_names_the_closest():
    with pytest.raises(KeyError, match="did you mean 'seq_mean_token_mean'"):
        aggregate("seq_mean_tokens_mean", VALUES, MASK, num_tokens=3, num_seqs=3, max_len=4)


B, T = 8, 7
LENGTHS = [7, 3, 0, 5, 1, 7, 2, 6]  # row 2 has no response token


def _problem():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(B, T, generator=gen, dtype=torch.float64).requires_grad_(True)
    scale = torch.rand(B, T, generator=gen, dtype=torch.float64) + 0.5
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return weight, scale, mask


def _token_values(weight, scale):
    # any differentiable, non-linear per-token function of the parameter
    return torch.tanh(weight) * scale + weight.square()


SPLITS = {
    "rows_of_1": [[i] for i in range(B)],
    "rows_of_3": [[0, 1, 2], [3, 4, 5], [6, 7]],
    "one_micro_batch": [list(range(B))],
    "uneven_1_3_4": [[0], [1, 2, 3], [4, 5, 6, 7]],
    "shuffled_3_5": [[5, 2, 7], [0, 3, 6, 1, 4]],
}


@pytest.mark.parametrize("split", list(SPLITS), ids=list(SPLITS))
@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_micro_batch_invariance_of_loss_and_gradient(mode, split):
    weight, scale, mask = _problem()
    counts = {"num_tokens": float(mask.sum()), "num_seqs": float(B), "max_len": T}

    full = aggregate(mode, _token_values(weight, scale), mask, **counts)
    (full_grad,) = torch.autograd.grad(full, weight)

    total = torch.zeros((), dtype=torch.float64)
    for rows in SPLITS[split]:
        # like the training loop: each micro-batch is cut to its own longest response
        width = int(mask[rows].sum(-1).max())
        values = _token_values(weight[rows, :width], scale[rows, :width])
        loss = aggregate(mode, values, mask[rows, :width], **counts)
        loss.backward()  # gradient accumulation
        total = total + loss.detach()

    torch.testing.assert_close(total, full.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(weight.grad, full_grad, atol=1e-6, rtol=0)
    assert full_grad[2].abs().sum() == 0  # the empty row gets no gradient


def test_per_micro_batch_normalisation_would_break_invariance():
    # The bug rule 4 forbids: dividing by each micro-batch's own token count.
    weight, scale, mask = _problem()
    values = _token_values(weight, scale).detach()
    full = aggregate(
        "token_mean", values, mask, num_tokens=float(mask.sum()), num_seqs=B, max_len=T
    )
    wrong = sum(
        aggregate(
            "token_mean",
            values[rows],
            mask[rows],
            num_tokens=float(mask[rows].sum().clamp(min=1)),
            num_seqs=B,
            max_len=T,
        )
        for rows in SPLITS["rows_of_3"]
    ) / len(SPLITS["rows_of_3"])
    assert abs(float(wrong) - float(full)) > 1e-3
