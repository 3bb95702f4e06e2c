"""An advantage for the best of a group: the gradient of the expected max reward of n samples.

Registered as ``best_of_group`` (verl's ``grpo_passk``). It follows the conventions of
:mod:`rlvr.algorithms.advantages` (float64 statistics, integer group ids,
``std_normalization``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.advantages import (
    _check_inputs,
    _group_statistics,
    _group_sums,
    _normalize,
    _out_dtype,
)
from rlvr.algorithms.registry import ADVANTAGES


@ADVANTAGES.register("best_of_group")
def best_of_group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""Leave-one-out advantages of the group's best reward: only the best sample moves.

    .. math::

        A_i = \max_{j \in g} r_j - \max_{j \in g,\, j \ne i} r_j

    which is :math:`r_{(1)} - r_{(2)}` (the best reward minus the second best) for the one
    sample holding the strict maximum and 0 for every other sample, a tie at the top
    included. The baseline :math:`\max_{j \ne i} r_j` does not depend on :math:`y_i`, so
    :math:`\mathbb{E}[\sum_i A_i \nabla\log\pi(y_i)] = \nabla\,\mathbb{E}[\max_j r_j]`, the
    gradient of max@n (pass@n for 0/1 rewards) over the group's n samples (Tang et al. 2025,
    *Optimizing Language Models for Inference Time Objectives using Reinforcement Learning*,
    arXiv:2503.19595, the unbiased leave-one-out estimator for k = n; tested by enumerating
    every outcome of four samples with three reward levels). Any rewards, not only verdicts.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        std_normalization: ``"group"`` (verl's ``norm_adv_by_std_in_grpo``), ``"batch"`` or
            ``"none"`` (the paper), as for ``grpo``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient; a group of one
        gets 0.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    r, counts, _, group_var, constant, inverse = _group_statistics(rewards, group_ids)
    lowest = torch.full((int(inverse.max()) + 1,), -torch.inf, dtype=r.dtype, device=r.device)
    best = lowest.scatter_reduce(0, inverse, r, "amax")[inverse]
    below = torch.where(r == best, -torch.inf, r)
    second = lowest.scatter_reduce(0, inverse, below, "amax")[inverse]
    sole = (r == best) & (_group_sums((r == best).double(), inverse) == 1) & (counts > 1)
    adv = torch.where(sole, r - second, torch.zeros_like(r))
    adv = _normalize(adv, r, group_var, std_normalization, epsilon)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))
