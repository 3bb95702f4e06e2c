"""Reward shaping: length, truncation and repetition terms added to (or replacing) rewards.

Pure functions on tensors of lengths and rewards; the reward stage composes them with the
verifier's score. For the mask-side alternative to penalising truncation (overlong filtering)
see ``filters.py``.

How this code departs from the papers:

- ``soft_overlong_penalty`` returns the additive penalty only (DAPO's R_length); the caller adds
  it to the correctness reward. Lengths above ``max_len`` (impossible when the rollout caps
  generation at ``max_len``) get the full ``-penalty``.
- ``kimi_length_reward`` takes min/max length over all samples of a group, correct or not, as
  Kimi k1.5 does; a group whose samples all have one length gets λ = 0 (the paper leaves 0/0
  undefined).
- ``repetition_penalty`` is in the spirit of T1's penalty on repetitive responses; the exact
  form (minus the fraction of n-grams that repeat an earlier one) is ours.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _float_dtype(t: Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.get_default_dtype()


def _check_1d(name: str, t: Tensor) -> None:
    if t.ndim != 1:
        raise ValueError(f"{name} must be 1-D [N], got shape {tuple(t.shape)}")


def soft_overlong_penalty(
    lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment: a length penalty that ramps up inside a buffer.

    DAPO (Yu et al. 2025, arXiv:2503.14476), eq. (13), with L_max = ``max_len``,
    L_cache = ``buffer`` and the penalty scaled by ``penalty``::

        R_length(y) = 0                                      if |y| ≤ L_max − L_cache
                    = ((L_max − L_cache) − |y|) / L_cache · p  if L_max − L_cache < |y| ≤ L_max
                    = −p                                     if |y| > L_max

    The ramp reaches −p exactly at |y| = L_max. With ``buffer = 0`` there is no ramp: 0 up to
    ``max_len``, −p beyond.

    Args:
        lengths: ``[N]`` response lengths in tokens.
        max_len: L_max, the maximum response length (``rollout.max_new_tokens``).
        buffer: L_cache, the length of the ramp, ``0 ≤ buffer ≤ max_len``.
        penalty: p, the magnitude of the full penalty (≥ 0).

    Returns:
        ``[N]`` the additive penalty, ≤ 0; float dtype of ``lengths`` (default dtype if int).
    """
    _check_1d("lengths", lengths)
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    if not 0 <= buffer <= max_len:
        raise ValueError(f"buffer must be in [0, max_len={max_len}], got {buffer}")
    if penalty < 0:
        raise ValueError(f"penalty must be ≥ 0 (it is subtracted), got {penalty}")
    dtype = _float_dtype(lengths)
    length = lengths.detach().to(torch.float64)
    expected = max_len - buffer
    out = torch.zeros_like(length)
    if buffer > 0:
        ramp = (expected - length) / buffer * penalty
        out = torch.where(length > expected, ramp, out)
    out = torch.where(length > max_len, torch.full_like(length, -penalty), out)
    return out.to(dtype)


def apply_truncation_reward(rewards: Tensor, truncated: Tensor, value: float = -1.0) -> Tensor:
    """Replace the reward of truncated responses with ``value`` (the alternative to filtering).

    Where overlong filtering (:func:`rlvr.algorithms.filters.overlong_mask`) removes truncated
    responses from the loss, this keeps them and scores them as failures, so the policy learns
    to finish within the limit (the punitive reward that DAPO §3.4 contrasts with filtering).

    Args:
        rewards: ``[N]`` rewards.
        truncated: ``[N]`` bool, True where the response hit the length limit without EOS.
        value: the reward a truncated response gets.

    Returns:
        ``[N]`` a new tensor, float dtype of ``rewards`` (default dtype if int).
    """
    _check_1d("rewards", rewards)
    if truncated.shape != rewards.shape:
        raise ValueError(
            f"truncated shape {tuple(truncated.shape)} must equal rewards shape "
            f"{tuple(rewards.shape)}"
        )
    if truncated.dtype != torch.bool:
        raise ValueError(f"truncated must be a bool tensor, got {truncated.dtype}")
    r = rewards.to(_float_dtype(rewards))
    return torch.where(truncated, torch.full_like(r, value), r)


def kimi_length_reward(lengths: Tensor, correct: Tensor, group_ids: Tensor) -> Tensor:
    """Kimi k1.5's length reward: shorter than the group's others is better.

    Kimi k1.5 (Kimi Team 2025, arXiv:2501.12599, §2.3.3 "Length Penalty"): for the k responses
    of one prompt with min_len / max_len the shortest and longest of them,

        λ = 0.5 − (len(i) − min_len) / (max_len − min_len)
        len_reward(i) = λ             if response i is correct
                      = min(0, λ)     otherwise

    so correct short answers are rewarded, long ones penalised, and wrong answers are only ever
    penalised. A group whose responses all have the same length gets 0.

    Args:
        lengths: ``[N]`` response lengths in tokens.
        correct: ``[N]`` bool, True where the answer is correct.
        group_ids: ``[N]`` integer prompt-group ids (any values, any order).

    Returns:
        ``[N]`` the length reward in [−0.5, 0.5], float dtype of ``lengths`` (default if int).
    """
    _check_1d("lengths", lengths)
    for name, t in (("correct", correct), ("group_ids", group_ids)):
        if t.shape != lengths.shape:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} must equal lengths shape {tuple(lengths.shape)}"
            )
    if correct.dtype != torch.bool:
        raise ValueError(f"correct must be a bool tensor, got {correct.dtype}")
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    dtype = _float_dtype(lengths)
    if lengths.numel() == 0:
        return torch.zeros(0, dtype=dtype, device=lengths.device)
    length = lengths.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1
    empty = torch.empty(num_groups, dtype=torch.float64, device=length.device)
    gmax = empty.scatter_reduce(0, inverse, length, reduce="amax", include_self=False)[inverse]
    gmin = empty.scatter_reduce(0, inverse, length, reduce="amin", include_self=False)[inverse]
    span = gmax - gmin
    lam = 0.5 - (length - gmin) / torch.where(span > 0, span, torch.ones_like(span))
    lam = torch.where(span > 0, lam, torch.zeros_like(lam))
    out = torch.where(correct, lam, lam.clamp(max=0.0))
    return out.to(dtype)


def repetition_penalty(token_ids: Sequence[Sequence[int]], n: int = 3) -> Tensor:
    """Minus the fraction of a sequence's n-grams that repeat an earlier n-gram of it.

    In the spirit of T1 (Hou et al. 2025, arXiv:2501.11651), which penalises repetitive
    responses during RL. For a sequence of length L ≥ n with M = L − n + 1 n-grams,

        penalty = −|{j : ngram_j = ngram_i for some i < j}| / M

    (0 for no repetition, approaching −1 for a sequence stuck in a loop); 0 when L < n.

    Args:
        token_ids: N sequences of token ids (lists, tuples or 1-D tensors), response only.
        n: the n-gram size (≥ 1).

    Returns:
        ``[N]`` the penalty in (−1, 0], default float dtype.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    out = []
    for seq in token_ids:
        ids = seq.tolist() if isinstance(seq, Tensor) else list(seq)
        total = len(ids) - n + 1
        if total <= 0:
            out.append(0.0)
            continue
        seen: set[tuple[int, ...]] = set()
        repeated = 0
        for j in range(total):
            gram = tuple(ids[j : j + n])
            if gram in seen:
                repeated += 1
            else:
                seen.add(gram)
        out.append(-repeated / total if repeated else 0.0)
    return torch.tensor(out, dtype=torch.get_default_dtype())
