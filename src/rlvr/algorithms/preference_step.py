"""Preference losses that read more than their own pair, f-DPO's scores and WPO's weights.

KTO values each response against a reference point z0 estimated from mismatched pairs, and
AOT compares each pair with the one it meets once both sides' values are sorted over the
step: what they read from the step's other pairs the trainer computes before the step's
micro-batches (`rlvr.training.preference.PairScorer.prepare`) and passes in (``z0``,
``matched``), so a loss and its gradient do not depend on the micro-batch split. f-DPO puts
f'(π_θ/π_ref) where DPO has the log-ratio, for the losses of the chosen-minus-rejected
difference. The signature and the caller's averaging are those of
`rlvr.algorithms.preference`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from rlvr.algorithms.preference import (
    PreferenceLossOutput,
    check_pair_inputs,
    smoothed_logistic,
)
from rlvr.algorithms.registry import PREFERENCE_LOSSES

SORTED_ACROSS_PAIRS = frozenset({"aot", "aot_unpaired"})
"""Losses that match each pair to others by rank over the optimizer step's pairs (``matched``,
from `aot_matching`), which the trainer computes before the step's micro-batches."""


def aot_matching(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    unpaired: bool,
) -> Tensor:
    """``[P, 2]``: for each of the step's P pairs, what AOT compares it with once each
    distribution is sorted (Melnyk et al. 2024, *Distributional Preference Alignment of LLMs
    via Optimal Transport*, arXiv:2406.05882; TRL's ``aot`` and ``aot_unpaired``). AOT sorts
    the P values of each side and scores the i-th smallest against the i-th smallest (the 1-D
    optimal transport plan). Paired: column 0 is the sorted reference margin at the rank of
    this pair's policy margin ℓ_w − ℓ_l. Unpaired: column 0 is the sorted rejected log-ratio
    at the rank of this pair's chosen log-ratio, column 1 the sorted chosen log-ratio at the
    rank of its rejected one. Values, without gradient."""
    with torch.no_grad():
        if unpaired:
            left = chosen_logps - ref_chosen_logps
            right = rejected_logps - ref_rejected_logps
        else:
            left = chosen_logps - rejected_logps
            right = ref_chosen_logps - ref_rejected_logps
        left_rank = torch.argsort(torch.argsort(left, stable=True), stable=True)
        right_rank = torch.argsort(torch.argsort(right, stable=True), stable=True)
        sorted_left, sorted_right = torch.sort(left).values, torch.sort(right).values
        return torch.stack([sorted_right[left_rank], sorted_left[right_rank]], dim=-1)


@PREFERENCE_LOSSES.register("aot")
def aot_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
    matched: Tensor,
) -> PreferenceLossOutput:
    """AOT on paired data (Melnyk et al. 2024, arXiv:2406.05882; TRL's ``aot``): DPO's
    (smoothed) logistic loss on β (u_(i) − v_(i)), the i-th smallest policy margin
    u = ℓ_θ(y_w) − ℓ_θ(y_l) against the i-th smallest reference margin, over the step's pairs.
    Per pair: u_j against ``matched[:, 0]``, the reference margin at u_j's rank
    (`aot_matching`), so the pairs' mean is the step's loss in value and gradient."""
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    z = beta * ((chosen_logps - rejected_logps) - matched[:, 0].to(chosen_logps))
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    return PreferenceLossOutput(
        smoothed_logistic(z, label_smoothing), chosen.detach(), rejected.detach()
    )


@PREFERENCE_LOSSES.register("aot_unpaired")
def aot_unpaired_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
    matched: Tensor,
) -> PreferenceLossOutput:
    """AOT on unpaired data (TRL's ``aot_unpaired``, formerly ``aot_pair``): the logistic
    loss on β (a_(i) − b_(i)), the i-th smallest chosen log-ratio against the i-th smallest
    rejected one. Pair j holds two terms, a_j against the rejected log-ratio at a_j's rank and
    the chosen log-ratio at b_j's rank against b_j, each with the other side fixed: their sum
    S_j has the step loss's gradient (each side's value enters one sorted term) but twice its
    value, so the pair's loss is S_j − ½ sg[S_j]: the step's value and gradient."""
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    a = chosen_logps - ref_chosen_logps
    b = rejected_logps - ref_rejected_logps
    matched = matched.to(a)
    both = smoothed_logistic(beta * (a - matched[:, 0]), label_smoothing) + smoothed_logistic(
        beta * (matched[:, 1] - b), label_smoothing
    )
    return PreferenceLossOutput(
        both - 0.5 * both.detach(), (beta * a).detach(), (beta * b).detach()
    )


REFERENCE_POINT = frozenset({"kto"})
"""Losses that read KTO's reference point z0 (``z0``), which the trainer estimates each step
from mismatched prompt/response pairs."""


@PREFERENCE_LOSSES.register("kto")
def kto_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
    z0: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> PreferenceLossOutput:
    """KTO (Ethayarajh et al. 2024, *KTO: Model Alignment as Prospect Theoretic Optimization*,
    arXiv:2402.01306, eq. 8; TRL's ``KTOTrainer``) on a pair or a one-sided pair: the chosen
    response is a desirable example and the rejected one an undesirable example, each valued
    against the reference point z0 rather than against each other,

        L = [λ_D h_w (1 − σ(β (a − z0))) + λ_U h_l (1 − σ(β (z0 − b)))] / (h_w + h_l)

    with a and b the log-ratios, z0 ≥ 0 the detached estimate of KL(π_θ ‖ π_ref) the trainer
    makes (the mean log-ratio of mismatched pairs, clamped at 0), and h_w, h_l 1 where the
    side is present (its length > 0): ½ [...] on a pair, one term on a labelled response of an
    unpaired file. The mean over a step's rows is then the mean over its examples, as TRL
    averages them."""
    tensors = (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    check_pair_inputs(label_smoothing, *tensors)
    if label_smoothing:
        raise ValueError("kto has no label smoothing; set it to 0")
    has_chosen = (chosen_lengths > 0).to(chosen_logps.dtype)
    has_rejected = (rejected_lengths > 0).to(chosen_logps.dtype)
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    point = beta * z0
    losses = (
        desirable_weight * has_chosen * (1 - torch.sigmoid(chosen - point))
        + undesirable_weight * has_rejected * (1 - torch.sigmoid(point - rejected))
    ) / (has_chosen + has_rejected).clamp(min=1.0)
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


F_DIVERGENCE_LOSSES = frozenset({"dpo", "ln_dpo", "ipo", "hinge", "robust", "exo_pair", "discopop"})
"""Losses of the chosen-minus-rejected difference alone, which f-DPO generalises: the
β log Z(x) its reparameterisation leaves cancels only in that difference."""


def f_divergence_scores(log_ratio: Tensor, divergence: str, alpha: float = 0.5) -> Tensor:
    """f'(π_θ/π_ref) as a function of u = log π_θ/π_ref, which f-DPO puts where DPO has u
    (Wang et al. 2023, *Beyond Reverse KL: Generalizing Direct Preference Optimization with
    Diverse Divergence Constraints*, arXiv:2309.16240; TRL's ``f_divergence_type``):

        reverse_kl: u    forward_kl: 1 − e^(−u)    js_divergence: log 2 + log σ(u)
        alpha_divergence: (e^((α−1) u) − 1)/(α − 1), u at α = 1

    (the α-divergence as TRL parameterises it, ``f_alpha_divergence_coef``). Each is 0 at
    u = 0, so a loss still starts where the policy is its reference."""
    if divergence == "reverse_kl":
        return log_ratio
    if divergence == "forward_kl":
        return -torch.expm1(-log_ratio)
    if divergence == "js_divergence":
        return math.log(2) + F.logsigmoid(log_ratio)
    if divergence == "alpha_divergence":
        if abs(alpha - 1.0) < 1e-6:
            return log_ratio
        return torch.expm1((alpha - 1.0) * log_ratio) / (alpha - 1.0)
    raise ValueError(f"unknown f-divergence {divergence!r}")


def wpo_weights(logits: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """``[b]`` WPO's weight of each response (Zhou et al. 2024, *WPO: Enhancing RLHF with
    Weighted Preference Optimization*, arXiv:2406.11827, eq. 2; TRL's ``use_weighting``):

        w(y) = exp( (1/|y|) Σ_t [ log π(y_t) − log Σ_v π(v)² ] )

    from the policy's ``[b, T, vocab]`` `logits` scoring the ``[b, T]`` `tokens` (`mask` 1 on
    the response's tokens): the geometric mean of each token's probability over Σ_v π(v)²,
    the chance that two of the policy's own draws agree, so responses the current policy would
    produce weigh more and off-policy pairs count as on-policy ones. A token's ratio is 1
    under a uniform policy and above 1 for its most likely token (Σ_v π(v)² ≤ max_v π(v)).
    No gradient."""
    with torch.no_grad():
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))
        log_norm = torch.logsumexp(z, dim=-1)
        logp = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_norm
        log_square_mass = torch.logsumexp(2 * z, dim=-1) - 2 * log_norm
        valid = mask.to(z.dtype)
        lengths = valid.sum(-1).clamp(min=1.0)
        return torch.exp(((logp - log_square_mass) * valid).sum(-1) / lengths)
