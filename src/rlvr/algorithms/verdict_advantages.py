"""Advantage estimators for a verifier's verdicts (rewards of 0 or 1 only).

``pass_at_k`` (PKPO) and ``w_reinforce`` read each reward as pass or fail, and refuse any
other value naming it: the one turns the verdicts of a group into the policy gradient of
pass@k, the other weighs passes and failures apart without a baseline. They share the
conventions of :mod:`rlvr.algorithms.advantages` (float64 statistics, integer group ids,
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
    _refuse_group_std,
    _ungrouped,
)
from rlvr.algorithms.registry import ADVANTAGES


def _check_verdicts(rewards: Tensor, name: str) -> None:
    """A ValueError naming the first reward that is neither 0 nor 1."""
    binary = (rewards == 0) | (rewards == 1)
    if not bool(binary.all()):
        bad = float(rewards[~binary][0])
        raise ValueError(f"{name} needs rewards of 0 or 1 (a verifier's verdict); got {bad}")


def _log_comb(a: Tensor, b: Tensor | int) -> tuple[Tensor, Tensor]:
    """(log C(a, b), whether 0 <= b <= a) elementwise in float64."""
    a = a.to(torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64, device=a.device).expand_as(a)
    valid = (b >= 0) & (b <= a)
    a, b = a.clamp(min=0), b.clamp(min=0)
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma((a - b).clamp(min=0) + 1), valid


def pass_at_k_estimate(n: Tensor, c: Tensor, k: Tensor | int) -> Tensor:
    """ρ(n, c, k) = 1 − C(n − c, k) / C(n, k): the unbiased pass@k of n samples of which c
    pass (Chen et al. 2021), elementwise, float64; 0 for k = 0, NaN for k > n. The ratio is
    taken in log space, so hundreds of samples do not overflow the binomials."""
    log_fail, some_fail = _log_comb(n - c, k)
    log_all, defined = _log_comb(n, k)
    ratio = torch.where(some_fail, (log_fail - log_all).exp(), torch.zeros_like(log_all))
    return torch.where(defined, 1.0 - ratio, torch.full_like(log_all, float("nan")))


@ADVANTAGES.register("pass_at_k")
def pass_at_k_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    k: int = 1,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""PKPO: advantages whose policy gradient is that of pass@k, for any k below the group size.

    With n samples of a prompt, c of them passing, and ρ(n, c, k) the unbiased pass@k
    estimate, Walder & Karkhanis (2025, *Pass@K Policy Optimization: Solving Harder
    Reinforcement Learning Problems*, arXiv:2505.15201) show that the effective rewards
    :math:`r_i = \tfrac{k}{n}` for a passing sample and
    :math:`\tfrac{k}{n}\,\rho(n-1, c, k-1)` for a failing one give an unbiased estimate
    :math:`\sum_i r_i \nabla\log\pi(y_i)` of ∇ pass@k. Here each is scaled by n/k and
    given the baseline of the pass@k of the other n − 1 samples, which does not depend on
    :math:`y_i` (so the estimate stays unbiased):

    .. math::

        A_i = 1 - \rho(n-1,\, c-1,\, k) \ \text{(passing)}, \qquad
        A_i = \rho(n-1,\, c,\, k-1) - \rho(n-1,\, c,\, k) \ \text{(failing)}

    so that :math:`\mathbb{E}[\sum_i A_i \nabla\log\pi(y_i)] = \tfrac{n}{k}\nabla
    \text{pass@}k` (tested by enumeration on a Bernoulli policy). k = 1 is RLOO's advantage.
    A passing sample gains less, and a failing one loses less, the more of the group passes:
    past a few passes another pass adds little to pass@k. A group whose samples all pass or
    all fail gets 0. The scaled rewards and the baseline are ours (the paper's own
    variance-reduced forms differ); the unbiasedness is the paper's result.

    Args:
        rewards: ``[N]`` 0 or 1 (a verifier's verdict) for each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        k: the k of pass@k, below every group's size.
        std_normalization: ``"group"``, ``"batch"`` or ``"none"`` (as for ``grpo``).
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    _check_verdicts(rewards, "pass_at_k")
    r, counts, _, group_var, constant, inverse = _group_statistics(rewards, group_ids)
    if k < 1 or bool((counts <= k).any()):
        raise ValueError(
            f"pass_at_k: k={k} must be at least 1 and below every group's size "
            f"(smallest {int(counts.min())})"
        )
    passes = _group_sums(r, inverse)
    others = counts - 1
    adv = torch.where(
        r == 1,
        1.0 - pass_at_k_estimate(others, passes - 1, k),
        pass_at_k_estimate(others, passes, k - 1) - pass_at_k_estimate(others, passes, k),
    )
    adv = _normalize(adv, r, group_var, std_normalization, epsilon)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))


@ADVANTAGES.register("w_reinforce")
def weighted_reinforce_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    positive_weight: float = 0.1,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""Weighted REINFORCE: a passing sample gets λ, a failing one −1, no baseline.

    .. math::

        A_i = \lambda \ \text{(pass)}, \qquad A_i = -1 \ \text{(fail)}

    (Zhu et al. 2025, *The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning*, arXiv:2506.01347: the RLVR objective with rewards ±1 split into positive and
    negative sample reinforcement, PSR and NSR, and PSR down-weighted to λ = 0.1.) NSR alone
    (λ = 0) pushes probability off wrong answers onto the model's other candidates and keeps
    pass@k at large k; PSR alone sharpens pass@1 and narrows the samples. Every sample counts,
    a group that all passes included, so unlike the group baselines nothing here is 0 for a
    constant group. ``std_normalization``: ``"none"`` (the paper) or ``"batch"``; ``"group"``
    is refused (a constant group has no spread but a nonzero signal).

    Args:
        rewards: ``[N]`` 0 or 1 (a verifier's verdict) for each sequence.
        group_ids: ``[N]`` integer group ids (checked, otherwise unused).
        positive_weight: λ, the advantage of a passing sample (≥ 0).
        std_normalization: ``"none"`` or ``"batch"``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    _refuse_group_std(
        "w_reinforce", std_normalization, "would divide a constant group's signal by 0"
    )
    _check_verdicts(rewards, "w_reinforce")
    r = rewards.detach().to(torch.float64)
    adv = torch.where(r == 1, torch.full_like(r, positive_weight), torch.full_like(r, -1.0))
    adv = _ungrouped(adv, r, std_normalization, epsilon)
    return adv.to(_out_dtype(rewards))
