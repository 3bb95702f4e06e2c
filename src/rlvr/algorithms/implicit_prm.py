"""PRIME: dense process rewards from an implicit PRM trained on outcome labels alone.

Cui et al. 2025, "Process Reinforcement through Implicit Rewards" (arXiv:2502.01456). The
implicit process reward model (PRM) is a causal LM π_φ, initialised from the policy, scored
against a frozen reference π_ref (the same initial weights). Each token's process reward is
the scaled log-ratio (eq. 3)

    r_φ(y_t) = β · log π_φ(y_t | y_<t) / π_ref(y_t | y_<t),

and the PRM is trained online on the rollouts' outcome labels r_o ∈ {0, 1} with the cross
entropy of the sequence's summed reward (eq. 4)

    L_CE(φ) = −E[ r_o · log σ(r_φ(y)) + (1 − r_o) · log(1 − σ(r_φ(y))) ],  r_φ(y) = Σ_t r_φ(y_t).

The policy's advantages are RLOO's leave-one-out (`rloo_advantages`) on both kinds of
reward, the process part taken on each sequence's mean token reward, summed to returns with
γ = 1 (eq. 5):

    A_t^i = Σ_{s≥t} [ r_φ(y_s^i) − 1/(K−1) Σ_{j≠i} r_φ(y^j) / |y^j| ]
            + r_o(y^i) − 1/(K−1) Σ_{j≠i} r_o(y^j),

each part weighted (verl's PRIME recipe: 5 and 5) and the sum whitened over the batch's
tokens, as verl's recipe does. verl's recipe also divides the process rewards by the largest
absolute return in the batch (``prime_norm: batch_norm``), `scale_by_largest_return` here.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from rlvr.algorithms.advantages import rloo_advantages
from rlvr.algorithms.value import whiten


def implicit_process_rewards(
    prm_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, beta: float
) -> Tensor:
    """[N, T] r_φ(y_t) = β (log π_φ(y_t) − log π_ref(y_t)) on the response tokens, 0 elsewhere
    (PRIME eq. 3)."""
    return beta * (prm_logprobs - ref_logprobs) * mask


def implicit_prm_loss(
    prm_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, labels: Tensor, beta: float
) -> Tensor:
    """[N] cross entropy of each sequence's outcome label `labels` (0 or 1) against
    σ(Σ_t r_φ(y_t)) (PRIME eq. 4); the mean over the batch is L_CE."""
    summed = implicit_process_rewards(prm_logprobs, ref_logprobs, mask, beta).sum(-1)
    return F.binary_cross_entropy_with_logits(summed, labels.to(summed.dtype), reduction="none")


def scale_by_largest_return(rewards: Tensor, mask: Tensor, epsilon: float = 1e-6) -> Tensor:
    """[N, T] `rewards` divided by the largest |Σ_{s≥t} r_s| of the batch, plus `epsilon`
    (verl's PRIME recipe, ``prime_norm: batch_norm``): the returns of the process rewards
    stay within [−1, 1]."""
    masked = rewards * mask
    if masked.numel() == 0:
        return masked
    return masked / (returns_to_go(masked).abs().max() + epsilon)


def returns_to_go(rewards: Tensor) -> Tensor:
    """[N, T] Σ_{s≥t} r_s along the last axis (γ = 1)."""
    return rewards.flip(-1).cumsum(-1).flip(-1)


def prime_advantages(
    process_rewards: Tensor,
    outcome_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    process_coef: float,
    outcome_coef: float,
) -> Tensor:
    """[N, T] PRIME's advantages (eq. 5), whitened over the batch's response tokens.

    Args:
        process_rewards: [N, T] r_φ(y_t) (`implicit_process_rewards`), 0 outside `mask`.
        outcome_rewards: [N] r_o of each sample.
        mask: [N, T] response tokens.
        group_ids: [N] samples of one prompt share an id; every group has two or more.
        process_coef, outcome_coef: the weights of the two parts.
    """
    mask = mask.to(process_rewards.dtype)
    lengths = mask.sum(-1).clamp(min=1)
    means = (process_rewards * mask).sum(-1) / lengths
    process_baseline = means - rloo_advantages(means, group_ids, std_normalization="none")
    process = (process_rewards - process_baseline[:, None]) * mask
    outcome = rloo_advantages(outcome_rewards, group_ids, std_normalization="none")
    returns = process_coef * returns_to_go(process)
    returns = returns + outcome_coef * outcome.to(returns.dtype)[:, None] * mask
    return whiten(returns, mask)


def pairwise_accuracy(scores: Tensor, labels: Tensor, group_ids: Tensor) -> float | None:
    """The share of same-prompt pairs with different labels that `scores` order as the labels
    do (verl's ``dpo_acc`` of the PRM, pooled over the batch); None without such a pair."""
    same = group_ids[:, None] == group_ids[None, :]
    label_gap = labels[:, None].float() - labels[None, :].float()
    pairs = same & (label_gap > 0)
    if not bool(pairs.any()):
        return None
    right = (scores[:, None] - scores[None, :]) > 0
    return float((right & pairs).sum() / pairs.sum())
