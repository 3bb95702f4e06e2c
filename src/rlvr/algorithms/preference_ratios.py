"""Preference losses of the log-ratios a = log π_θ(y_w|x) − log π_ref(y_w|x) and b (the same
for y_l), each written as a function of (a, b) alone: APO-zero and APO-down, NCA, SPPO (hard
labels), BCO and DiscoPOP. `on_log_ratios` gives each the registry's signature and DPO's
implicit rewards β a and β b; the conventions of `rlvr.algorithms.preference` hold.

How this code departs from the papers: BCO on a pair leaves out the paper's reward shift δ (a
running mean of the rewards), as TRL's ``bco_pair`` now does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rlvr.algorithms.preference import PreferenceLossOutput, check_pair_inputs
from rlvr.algorithms.registry import PREFERENCE_LOSSES


def on_log_ratios(name: str) -> Callable[[Callable], Callable]:
    """Register `core(a, b, beta, **settings) -> [P] losses`, a loss of the log-ratios
    a = log π_θ(y_w|x) − log π_ref(y_w|x) and b (the same for y_l), as preference loss `name`,
    with DPO's implicit rewards β a and β b. Lengths and γ are unused, and label smoothing must
    be 0; other keyword settings go to `core`."""

    def register(core: Callable[..., Tensor]) -> Callable:
        def loss(
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
            **settings: float,
        ) -> PreferenceLossOutput:
            tensors = (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
            check_pair_inputs(label_smoothing, *tensors)
            if label_smoothing:
                raise ValueError(f"{name} has no label smoothing; set it to 0")
            a, b = chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps
            losses = core(a, b, beta, **settings)
            return PreferenceLossOutput(losses, (beta * a).detach(), (beta * b).detach())

        loss.__name__, loss.__qualname__ = core.__name__, core.__qualname__
        loss.__doc__ = core.__doc__
        return PREFERENCE_LOSSES.register(name)(loss)

    return register


@on_log_ratios("apo_zero")
def apo_zero_loss(a: Tensor, b: Tensor, beta: float) -> Tensor:
    """APO-zero (D'Oosterlinck et al. 2024, Anchored Preference Optimization, arXiv:2408.06266,
    eq. 7), for chosen responses better than the model's own:

        L = 1 − σ(β a) + σ(β b)

    raises the chosen likelihood and lowers the rejected one, each anchored to the reference
    on its own rather than through their difference."""
    return 1 - torch.sigmoid(beta * a) + torch.sigmoid(beta * b)


@on_log_ratios("apo_down")
def apo_down_loss(a: Tensor, b: Tensor, beta: float) -> Tensor:
    """APO-down (D'Oosterlinck et al. 2024, eq. 8), for chosen responses worse than the
    model's own:

        L = σ(β a) + 1 − σ(β (a − b))

    lowers the chosen likelihood, and the rejected one more."""
    return torch.sigmoid(beta * a) + 1 - torch.sigmoid(beta * (a - b))


@on_log_ratios("nca_pair")
def nca_pair_loss(a: Tensor, b: Tensor, beta: float) -> Tensor:
    """NCA on a pair (Chen et al. 2024, Noise Contrastive Alignment, arXiv:2402.05369; TRL's
    ``nca_pair``):

        L = −log σ(β a) − ½ log σ(−β a) − ½ log σ(−β b)

    scores each response's own reward, where DPO scores only their difference, so the chosen
    likelihood does not fall with the rejected one."""
    return -F.logsigmoid(beta * a) - 0.5 * F.logsigmoid(-beta * a) - 0.5 * F.logsigmoid(-beta * b)


@on_log_ratios("sppo_hard")
def sppo_hard_loss(a: Tensor, b: Tensor, beta: float) -> Tensor:
    """SPPO with hard labels (Wu et al. 2024, Self-Play Preference Optimization,
    arXiv:2405.00675; TRL's ``sppo_hard``): the winner's probability of winning taken as 1 and
    the loser's as 0,

        L = (a − 1/(2β))² + (b + 1/(2β))²

    pushes each log-ratio to its own target, ± 1/(2β)."""
    return (a - 0.5 / beta) ** 2 + (b + 0.5 / beta) ** 2


@on_log_ratios("bco_pair")
def bco_pair_loss(a: Tensor, b: Tensor, beta: float) -> Tensor:
    """BCO on a pair (Jung et al. 2024, Binary Classifier Optimization, arXiv:2404.04656,
    without its reward shift δ; TRL's ``bco_pair``): a binary classifier whose logit is the
    implicit reward, the chosen response labelled 1 and the rejected one 0,

        L = −log σ(β a) − log σ(−β b)."""
    return -F.logsigmoid(beta * a) - F.logsigmoid(-beta * b)


@on_log_ratios("discopop")
def discopop_loss(a: Tensor, b: Tensor, beta: float, tau: float = 0.05) -> Tensor:
    """DiscoPOP, the log-ratio modulated loss (Lu et al. 2024, Discovering Preference
    Optimization Algorithms, arXiv:2406.08414, eq. 5; TRL's ``discopop``): with
    ρ = β (a − b),

        L = (1 − σ(ρ/τ)) · (−log σ(ρ)) + σ(ρ/τ) · exp(−ρ)

    DPO's logistic loss for pairs ranked wrong, the exponential loss for pairs ranked right;
    τ (the paper's 0.05) sets how sharply it switches."""
    rho = beta * (a - b)
    mix = torch.sigmoid(rho / tau)
    return (1 - mix) * -F.logsigmoid(rho) + mix * torch.exp(-rho)
