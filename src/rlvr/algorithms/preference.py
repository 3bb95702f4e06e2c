"""Offline pairwise preference losses: DPO, length-normalised DPO, IPO, SimPO, CPO, ORPO, the
SLiC hinge, robust DPO and EXO. The losses of the two log-ratios each on its own (APO-zero and
APO-down, NCA, SPPO with hard labels, BCO, DiscoPOP) are in `rlvr.algorithms.preference_ratios`;
KTO and AOT, which read more than their own pair, and f-DPO's scores in
`rlvr.algorithms.preference_step`.

Each loss takes, for P pairs (x, y_w, y_l), the policy's summed log-probabilities of the chosen
(y_w) and rejected (y_l) responses, the reference model's, and the response lengths in tokens,
and returns the loss of each pair with the implicit rewards whose difference it scores. The
caller averages the pair losses over the optimizer step.

How this code departs from the papers:

- ``label_smoothing`` ε is the conservative DPO of Mitchell (2023), as in TRL: the pair's label
  is taken to be flipped with probability ε, ``(1-ε)·ℓ(z) + ε·ℓ(-z)``. ε = 0 is the paper.
- IPO scores length-averaged log-ratios, as TRL does on the IPO authors' advice; the paper's
  eq. 17 writes sums. Summed log-ratios are ``ipo`` with lengths of one.
- The hinge loss is SLiC-HF's calibration loss on DPO's log-ratios with margin 1/β, as TRL's
  ``hinge``; the paper compares the policy's own log-likelihoods, without a reference.
- SimPO's γ is the paper's target margin in reward units (its repository sets γ = β·ratio
  with ``gamma_beta_ratio``): β = 2, γ = 1 is its ratio of 0.5.
- ORPO's probability of a response, exp of its mean token log-prob, is held below 1 − 1e-6 so
  that its odds stay finite (a response every token of which has probability 1 in fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlvr.algorithms.registry import PREFERENCE_LOSSES

REFERENCE_FREE = frozenset({"simpo", "cpo", "orpo"})
"""Losses that never read the reference log-probs: the trainer skips the reference pass."""

SMOOTHED = frozenset({"dpo", "ln_dpo", "simpo", "cpo", "robust", "exo_pair", "aot", "aot_unpaired"})
"""Losses that read ``label_smoothing`` ε; the others refuse an ε above 0."""


@dataclass
class PreferenceLossOutput:
    """What a preference loss returns: one loss per pair, and the implicit rewards."""

    losses: Tensor
    """``[P]`` loss of each pair; the caller averages over the optimizer step."""
    chosen_rewards: Tensor
    """``[P]`` detached implicit reward of the chosen response."""
    rejected_rewards: Tensor
    """``[P]`` detached implicit reward of the rejected response; the loss is a function of
    ``chosen_rewards - rejected_rewards`` (less SimPO's γ)."""


def check_pair_inputs(label_smoothing: float, *tensors: Tensor) -> None:
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"preference-loss inputs must share one shape [P], got {sorted(shapes)}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")


def smoothed_logistic(z: Tensor, label_smoothing: float) -> Tensor:
    """``-(1-ε) log σ(z) - ε log σ(-z)``: DPO's logistic loss of a margin z, its label flipped
    with probability ε (conservative DPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)


def _bradley_terry(
    chosen: Tensor, rejected: Tensor, margin: float, label_smoothing: float
) -> PreferenceLossOutput:
    """`smoothed_logistic` of ``z = chosen - rejected - margin``, the two as the rewards."""
    losses = smoothed_logistic(chosen - rejected - margin, label_smoothing)
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("dpo")
def dpo_loss(
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
) -> PreferenceLossOutput:
    """DPO (Rafailov et al. 2023, eq. 7):

        L = -log σ( β log π_θ(y_w|x)/π_ref(y_w|x) - β log π_θ(y_l|x)/π_ref(y_l|x) )

    Implicit rewards r = β log π_θ(y|x)/π_ref(y|x). Lengths and γ are unused.
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    return _bradley_terry(chosen, rejected, 0.0, label_smoothing)


@PREFERENCE_LOSSES.register("ln_dpo")
def length_normalized_dpo_loss(
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
) -> PreferenceLossOutput:
    """Length-normalised DPO (Meng et al. 2024, SimPO §5 "LN-DPO"; Tülu 3's ``dpo_norm``):

        L = -log σ( β/|y_w| log π_θ(y_w|x)/π_ref(y_w|x) - β/|y_l| log π_θ(y_l|x)/π_ref(y_l|x) )

    The per-token log-ratio removes DPO's pull towards longer chosen responses. γ is unused.
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, chosen_lengths, rejected_lengths
    )
    chosen = beta * (chosen_logps - ref_chosen_logps) / chosen_lengths
    rejected = beta * (rejected_logps - ref_rejected_logps) / rejected_lengths
    return _bradley_terry(chosen, rejected, 0.0, label_smoothing)


@PREFERENCE_LOSSES.register("ipo")
def ipo_loss(
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
) -> PreferenceLossOutput:
    """IPO (Azar et al. 2024, eq. 17), β playing the paper's τ:

        h = 1/|y_w| log π_θ(y_w|x)/π_ref(y_w|x) - 1/|y_l| log π_θ(y_l|x)/π_ref(y_l|x)
        L = (h - 1/(2β))²

    A squared loss that stops pushing once the margin reaches 1/(2β), where DPO's logistic loss
    keeps driving it to infinity on deterministic preferences. Rewards are the per-token
    log-ratios; γ and label smoothing are unused (label smoothing must be 0).
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, chosen_lengths, rejected_lengths
    )
    if label_smoothing:
        raise ValueError("ipo has no label smoothing; set it to 0")
    chosen = (chosen_logps - ref_chosen_logps) / chosen_lengths
    rejected = (rejected_logps - ref_rejected_logps) / rejected_lengths
    losses = (chosen - rejected - 1.0 / (2.0 * beta)) ** 2
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("simpo")
def simpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
) -> PreferenceLossOutput:
    """SimPO (Meng et al. 2024, eq. 6), reference-free:

        L = -log σ( β/|y_w| log π_θ(y_w|x) - β/|y_l| log π_θ(y_l|x) - γ )

    The implicit reward is the length-averaged log-likelihood (what sampling ranks by), and γ
    is a target reward margin. The reference log-probs are ignored (may be None).
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, chosen_lengths, rejected_lengths
    )
    chosen = beta * chosen_logps / chosen_lengths
    rejected = beta * rejected_logps / rejected_lengths
    return _bradley_terry(chosen, rejected, gamma, label_smoothing)


@PREFERENCE_LOSSES.register("cpo")
def cpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
) -> PreferenceLossOutput:
    """CPO's preference term (Xu et al. 2024, Contrastive Preference Optimization,
    arXiv:2401.08417; TRL's ``CPOTrainer``), DPO with a uniform reference:

        L = -log σ( β log π_θ(y_w|x) - β log π_θ(y_l|x) )

    CPO adds the chosen response's NLL (``dpo.nll_coef``, the ``cpo`` preset). The reference
    log-probs are ignored (may be None)."""
    check_pair_inputs(label_smoothing, chosen_logps, rejected_logps)
    return _bradley_terry(beta * chosen_logps, beta * rejected_logps, 0.0, label_smoothing)


ORPO_MAX_LOG_P = math.log1p(-1e-6)
"""ORPO's mean token log-prob is clamped to at most this: P(y|x) ≤ 1 − 1e-6, finite odds."""


@PREFERENCE_LOSSES.register("orpo")
def orpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    *,
    beta: float,
    gamma: float = 0.0,
    label_smoothing: float = 0.0,
) -> PreferenceLossOutput:
    """ORPO's odds-ratio term (Hong et al. 2024, ORPO: Monolithic Preference Optimization
    without Reference Model, arXiv:2403.07691; TRL's ``ORPOTrainer``), with
    P(y|x) = exp(log π_θ(y|x) / |y|) and odds(y) = P / (1 − P):

        L = -λ log σ( log odds(y_w) - log odds(y_l) ),    λ = β

    ORPO adds the chosen response's NLL (``dpo.nll_coef``, the ``orpo`` preset). The implicit
    rewards are β times the mean token log-probs, as TRL logs them; the reference log-probs
    are ignored (may be None)."""
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, chosen_lengths, rejected_lengths
    )
    if label_smoothing:
        raise ValueError("orpo has no label smoothing; set it to 0")

    def log_odds(mean_logp: Tensor) -> Tensor:  # log P - log(1 - P), stable as P -> 1
        mean_logp = mean_logp.clamp(max=ORPO_MAX_LOG_P)
        return mean_logp - torch.log(-torch.expm1(mean_logp))

    chosen, rejected = chosen_logps / chosen_lengths, rejected_logps / rejected_lengths
    losses = -beta * F.logsigmoid(log_odds(chosen) - log_odds(rejected))
    return PreferenceLossOutput(losses, (beta * chosen).detach(), (beta * rejected).detach())


@PREFERENCE_LOSSES.register("hinge")
def hinge_loss(
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
) -> PreferenceLossOutput:
    """SLiC-HF's calibration loss (Zhao et al. 2023, arXiv:2305.10425; its margin δ = 1/β) on
    DPO's log-ratios:

        L = max(0, 1 − β log π_θ(y_w|x)/π_ref(y_w|x) + β log π_θ(y_l|x)/π_ref(y_l|x))

    No loss and no gradient once the reward margin reaches 1, where DPO's logistic loss keeps
    pushing. Implicit rewards r = β log π_θ(y|x)/π_ref(y|x), as DPO's. γ is unused, and label
    smoothing must be 0.
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    if label_smoothing:
        raise ValueError("hinge has no label smoothing; set it to 0")
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    losses = F.relu(1.0 - (chosen - rejected))
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("robust")
def robust_dpo_loss(
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
) -> PreferenceLossOutput:
    """Robust DPO (Chowdhury et al. 2024, Provably Robust DPO, arXiv:2403.00409), for labels
    flipped with probability ε:

        L = ((1 − ε)(−log σ(z)) − ε(−log σ(−z))) / (1 − 2ε),
        z = β log π_θ(y_w|x)/π_ref(y_w|x) − β log π_θ(y_l|x)/π_ref(y_l|x)

    with ε = `label_smoothing`: an unbiased estimate of the clean-label DPO loss, where
    conservative DPO's average of the two labels is biased towards z = 0. ε = 0 is DPO. γ is
    unused.
    """
    check_pair_inputs(
        label_smoothing, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    z = chosen - rejected
    eps = label_smoothing
    losses = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("exo_pair")
def exo_pair_loss(
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
) -> PreferenceLossOutput:
    """EXO on a pair (Ji et al. 2024, Towards Efficient Exact Optimization of Language Model
    Alignment, arXiv:2402.00856, eq. 16 with K = 2; TRL's ``exo_pair``): the reverse KL from
    the policy's preference p = softmax(β a, β b) = (σ(z), σ(−z)) over the pair to the labels'
    (1 − ε, ε), with z = β (a − b) and ε = ``label_smoothing``:

        L = σ(z) (log σ(z) − log(1 − ε)) + σ(−z) (log σ(−z) − log ε)

    It is 0 where σ(z) = 1 − ε, so ε must be above 0 (the paper uses 1e-3)."""
    tensors = (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    check_pair_inputs(label_smoothing, *tensors)
    if label_smoothing <= 0:
        raise ValueError("exo_pair needs label_smoothing ε > 0 (the EXO paper's is 1e-3)")
    chosen = beta * (chosen_logps - ref_chosen_logps)
    rejected = beta * (rejected_logps - ref_rejected_logps)
    z = chosen - rejected
    eps = label_smoothing
    losses = torch.sigmoid(z) * (F.logsigmoid(z) - math.log1p(-eps)) + torch.sigmoid(-z) * (
        F.logsigmoid(-z) - math.log(eps)
    )
    return PreferenceLossOutput(losses, chosen.detach(), rejected.detach())


def preference_loss(
    name: str,
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    chosen_lengths: Tensor,
    rejected_lengths: Tensor,
    **kwargs: float,
) -> PreferenceLossOutput:
    """The registered loss `name`; reference log-probs may be None only for `REFERENCE_FREE`."""
    if name not in REFERENCE_FREE and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"preference loss {name!r} needs the reference log-probs")
    fn = PREFERENCE_LOSSES.get(name)
    return fn(
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        chosen_lengths.to(chosen_logps.dtype),
        rejected_lengths.to(rejected_logps.dtype),
        **kwargs,
    )
