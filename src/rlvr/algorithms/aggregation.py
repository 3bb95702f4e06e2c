"""Loss aggregation: per-token values → the one scalar that is back-propagated.

DESIGN rule 4: aggregation is over the GLOBAL optimizer step. Each function is called once per
micro-batch with ``num_tokens`` / ``num_seqs`` counted over *all* micro-batches (and ranks) of
the optimizer step, and returns that micro-batch's share of the loss; the shares sum to the
full-batch loss, so the accumulated gradient is the full-batch gradient whatever the split.
(The popular bug divides by the micro-batch's own token count, which weights a token of a
short micro-batch more than one of a long micro-batch.)

How this code departs from the papers: the papers write the normalisers over "the batch";
here they are explicit arguments so that gradient accumulation and data parallelism keep the
paper's objective. Masked positions contribute exactly 0 (never NaN, even where the values are
infinite or NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.registry import AGGREGATIONS


def _masked(token_values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if token_values.shape != mask.shape:
        raise ValueError(
            f"token_values shape {tuple(token_values.shape)} must equal mask shape "
            f"{tuple(mask.shape)}"
        )
    if token_values.ndim != 2:
        raise ValueError(f"token_values must be [B, T], got shape {tuple(token_values.shape)}")
    keep = mask.bool()
    zero = torch.zeros((), dtype=token_values.dtype, device=token_values.device)
    return torch.where(keep, token_values, zero), keep


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(
            f"{name} must be > 0 (a count over the whole optimizer step), got {value!r}"
        )
    return float(value)


@AGGREGATIONS.register("token_mean")
def token_mean(
    token_values: Tensor,
    mask: Tensor,
    *,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
) -> Tensor:
    r"""Every token of the optimizer step weighs the same (DAPO's token-level loss).

    .. math::

        L = \frac{1}{\sum_{i}|o_i|} \sum_{i}\sum_{t=1}^{|o_i|} \ell_{i,t}

    (Yu et al. 2025, *DAPO*, arXiv:2503.14476, §3.3.) The micro-batch returns its
    masked token sum divided by ``num_tokens``, the response-token count of the whole
    optimizer step. ``num_seqs`` and ``max_len`` are unused.
    """
    values, _ = _masked(token_values, mask)
    return values.sum() / _positive("num_tokens", num_tokens)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    token_values: Tensor,
    mask: Tensor,
    *,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
) -> Tensor:
    r"""Mean over tokens within each sequence, then mean over sequences (original GRPO).

    .. math::

        L = \frac{1}{G}\sum_{i=1}^{G} \frac{1}{|o_i|}\sum_{t=1}^{|o_i|} \ell_{i,t}

    (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300, eq. 3.) The 1/|o_i| weighting is the
    length bias Dr. GRPO removes: a wrong long answer is penalised less per token than a wrong
    short one. The micro-batch returns the sum of its per-sequence means divided by
    ``num_seqs``, the sequence count of the whole optimizer step. A sequence with no response
    token contributes 0 (but still counts in ``num_seqs`` if the caller counted it).
    ``num_tokens`` and ``max_len`` are unused.
    """
    values, keep = _masked(token_values, mask)
    lengths = keep.sum(dim=-1).clamp(min=1).to(values.dtype)
    return (values.sum(dim=-1) / lengths).sum() / _positive("num_seqs", num_seqs)


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(
    token_values: Tensor,
    mask: Tensor,
    *,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
) -> Tensor:
    r"""Token sum per sequence over a constant normaliser (Dr. GRPO).

    .. math::

        L = \frac{1}{G \cdot L_{\max}} \sum_{i=1}^{G}\sum_{t=1}^{|o_i|} \ell_{i,t}

    (Liu et al. 2025, *Understanding R1-Zero-Like Training: A Critical Perspective*,
    arXiv:2503.20783, §3.1.) L_max is the
    generation budget (``max_new_tokens``), a constant, so no response length changes any
    token's weight. ``num_tokens`` is unused.
    """
    values, _ = _masked(token_values, mask)
    denominator = _positive("num_seqs", num_seqs) * _positive("max_len", max_len)
    return values.sum() / denominator


def aggregate(
    mode: str,
    token_values: Tensor,
    mask: Tensor,
    *,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
) -> Tensor:
    """Aggregate with the registered mode ``mode`` (see :data:`AGGREGATIONS`).

    ``num_tokens`` (masked tokens) and ``num_seqs`` (sequences) are totals over the whole
    optimizer step, every micro-batch and rank included; ``max_len`` is the generation budget.
    """
    fn = AGGREGATIONS.get(mode)
    return fn(token_values, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
