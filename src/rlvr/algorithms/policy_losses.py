"""Per-token policy-gradient losses.

Every loss returns the loss of each token, *not* aggregated: turning token losses into one
number is the job of :mod:`rlvr.algorithms.aggregation`, which divides by counts taken over the
whole optimizer step (DESIGN rule 4). Masked positions get loss 0 and gradient 0 (never NaN,
even if the log-probs there are garbage or infinite).

How this code departs from the papers:

- The log-ratio ``logprobs - old_logprobs`` is clamped into [−20, 20] before ``exp`` (as verl
  does) so that a stale or mismatched old log-prob cannot overflow the ratio; the clamp only
  bites at ratios beyond e^20, far outside any clip range.
- ``clipped`` flags exactly the tokens whose gradient the clipping removed (the clipped branch
  is strictly the larger, or the dual-clip cap is active), so ``clip_frac`` and "this token
  gets no gradient" are the same statement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlvr.algorithms.registry import POLICY_LOSSES

LOG_RATIO_CLAMP = 20.0
"""|log π_θ − log π_old| is clamped to this before exponentiating (numerical safety)."""


@dataclass
class PolicyLossOutput:
    """What a policy loss returns: per-token values, the caller aggregates."""

    token_loss: Tensor
    """``[B, T]`` loss of each token, not aggregated; 0 where ``response_mask`` is 0."""
    clipped: Tensor
    """``[B, T]`` bool, True where clipping removed the token's gradient (for ``clip_frac``)."""
    ratio: Tensor | None = None
    """``[B, T]`` detached importance ratio π_θ / π_old (1 where masked), or None if unused."""


def _check_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"policy-loss inputs must share one shape [B, T], got {shapes}")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""PPO's clipped surrogate, with DAPO's decoupled clip range and optional dual clip.

    With :math:`\rho_t = \exp(\log\pi_\theta(o_t) - \log\pi_{\text{old}}(o_t))`:

    .. math::

        \ell_t = \max\bigl(-A_t\,\rho_t,\;
                 -A_t\,\operatorname{clip}(\rho_t,\, 1-\varepsilon_{\text{low}},\,
                 1+\varepsilon_{\text{high}})\bigr)

    i.e. the negative of PPO's :math:`\min(\rho A, \operatorname{clip}(\rho) A)` (Schulman et
    al. 2017, *Proximal Policy Optimization Algorithms*, arXiv:1707.06347, eq. 7). DAPO's
    "clip-higher" decouples the two ends, ε_low = 0.2 and ε_high = 0.28 in the paper (Yu et al.
    2025, *DAPO: An Open-Source LLM Reinforcement Learning System at Scale*, arXiv:2503.14476,
    §3.1).

    Dual clip (Ye et al. 2020, *Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning*, arXiv:1912.09729): for :math:`A_t < 0` the loss is also capped,
    :math:`\ell_t \leftarrow \min(\ell_t, -c\,A_t)` with :math:`c > 1`, so a token whose ratio
    exploded cannot dominate the update.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token.
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        clip_low: ε_low, the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high, the ratio is clipped above at 1 + ε_high.
        dual_clip: c > 1 to enable dual clipping, or None.
        **kwargs: ignored (lets the loop pass extras that other losses use).

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``.
    """
    _check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. 2020), got {dual_clip}")
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)

    unclipped_loss = -adv * ratio
    clipped_loss = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped_loss, clipped_loss)
    clipped = clipped_loss > unclipped_loss
    if dual_clip is not None:
        cap = -adv * dual_clip
        capped = (adv < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        clipped = clipped | capped

    return PolicyLossOutput(
        token_loss=torch.where(mask, loss, zero),
        clipped=clipped & mask,
        ratio=ratio.detach(),
    )


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""Plain REINFORCE: the score-function estimator with no ratio and no clipping.

    .. math::

        \ell_t = -A_t \log\pi_\theta(o_t), \qquad
        \nabla_\theta \ell_t = -A_t \nabla_\theta \log\pi_\theta(o_t)

    (Williams 1992, *Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning*.) It is on-policy: it equals PPO's gradient at ρ = 1 (one update
    per rollout batch) and is biased if reused for several updates. ``old_logprobs``,
    ``clip_low`` and ``clip_high`` are accepted for the common signature and ignored;
    ``clipped`` is all False.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio=None)``.
    """
    _check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    safe_logprobs = torch.where(mask, logprobs, zero)
    return PolicyLossOutput(
        token_loss=-adv * safe_logprobs,
        clipped=torch.zeros_like(mask),
        ratio=None,
    )
