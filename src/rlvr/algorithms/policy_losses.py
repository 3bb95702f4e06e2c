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
  gets no gradient" are the same statement. CISPO is the exception by design: it clips a
  stop-gradient weight, so its ``clipped`` tokens keep a (smaller) gradient.
- SAPO's tokens with advantage exactly 0 take τ_neg, as TRL's do; their loss is 0 either way.

The sequence-level losses (GSPO, GMPO) are in :mod:`rlvr.algorithms.sequence_losses`, the
covariance-picked ones (Clip-Cov, KL-Cov) in :mod:`rlvr.algorithms.covariance`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlvr.algorithms.registry import POLICY_LOSSES

LOG_RATIO_CLAMP = 20.0
"""|log π_θ − log π_old| is clamped to this before exponentiating (numerical safety)."""

VANISH_AT_ZERO_ADVANTAGE = frozenset(
    {"ppo_clip", "reinforce", "gspo", "gmpo", "luspo", "vespo", "cispo", "sapo", "clip_cov"}
)
"""Losses whose value and gradient on a sample are 0 when all of its advantages are 0 (every
term is a multiple of A). The update skips such samples (`train.skip_zero_advantage`); a loss
with another term (`kimi_omd`'s squared log-ratio) or a user-registered loss is never skipped."""


@dataclass
class PolicyLossOutput:
    """What a policy loss returns: per-token values, the caller aggregates."""

    token_loss: Tensor
    """``[B, T]`` loss of each token, not aggregated; 0 where ``response_mask`` is 0."""
    clipped: Tensor
    """``[B, T]`` bool, True where clipping removed the token's gradient (for ``clip_frac``;
    CISPO: where its importance weight was truncated)."""
    ratio: Tensor | None = None
    """``[B, T]`` detached importance ratio π_θ / π_old (1 where masked), or None if unused;
    GSPO gives its sequence ratio s_i on every token of sequence i."""


def check_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"policy-loss inputs must share one shape [B, T], got {shapes}")


def check_clip(clip_low: float, clip_high: float) -> None:
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")


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
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    check_clip(clip_low, clip_high)
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
    check_shapes(
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


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance weight.

    .. math::

        \ell_t = -\operatorname{sg}\bigl[\hat\rho_t\bigr]\,A_t\,\log\pi_\theta(o_t),
        \qquad \hat\rho_t = \operatorname{clip}\bigl(\rho_t,\,
        1-\varepsilon^{IS}_{\text{low}},\, 1+\varepsilon^{IS}_{\text{high}}\bigr),
        \qquad \nabla_\theta\ell_t = -\hat\rho_t A_t \nabla_\theta\log\pi_\theta(o_t)

    (MiniMax 2025, *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention*, arXiv:2506.13585, §3.1.) PPO clipping drops the gradient of a token whose
    ratio left the trust region; CISPO clips the importance-sampling *weight* instead and
    stops its gradient, so every token keeps a gradient, only a bounded one. The paper
    normalises by the total token count (``token_mean`` aggregation).

    MiniMax applies no lower clip in practice (ε_low^IS set to a large value, e.g.
    ``clip_low`` ≥ 1 makes the lower bound ≤ 0) and tunes only ε_high^IS, which is
    ``clip_high`` here. ``clipped`` marks the tokens whose weight was truncated
    (ρ < 1 − ε_low or ρ > 1 + ε_high); unlike :func:`ppo_clip_loss`, they still get gradient
    −ρ̂·A. The log-ratio is clamped to [−20, 20] before ``exp``.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token.
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        clip_low: ε_low^IS, the weight is clipped below at 1 − ε_low.
        clip_high: ε_high^IS, the weight is clipped above at 1 + ε_high.
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    check_clip(clip_low, clip_high)
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    safe_logprobs = torch.where(mask, logprobs, zero)
    log_ratio = torch.where(mask, logprobs.detach() - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # built from detached inputs: sg[ρ̂]
    clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    return PolicyLossOutput(
        token_loss=-weight * adv * safe_logprobs,
        clipped=clipped & mask,
        ratio=ratio,
    )


@POLICY_LOSSES.register("sapo")
def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""SAPO: a smooth, temperature-controlled gate on the importance ratio instead of a clip.

    .. math::

        \ell_t = -\frac{4}{\tau}\,\sigma\bigl(\tau(\rho_t - 1)\bigr)\,A_t,
        \qquad \nabla_\theta\ell_t = -4\,p_t(1-p_t)\,\rho_t\,A_t\,
        \nabla_\theta\log\pi_\theta(o_t),\quad p_t = \sigma\bigl(\tau(\rho_t-1)\bigr)

    with τ = τ_pos where A_t > 0 and τ_neg otherwise (Qwen Team 2025, *Soft Adaptive Policy
    Optimization*, arXiv:2511.20347; τ_pos = 1, τ_neg = 1.05 there, the negative side damped
    faster). At ρ = 1 the gradient weight 4p(1 − p)ρ is 1, the on-policy policy gradient; it
    decays smoothly as ρ leaves 1, where PPO's clip cuts the gradient to 0. Nothing is
    clipped, so ``clipped`` is all False. The log-ratio is clamped to [−20, 20] before ``exp``.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token.
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        tau_pos: τ of tokens with a positive advantage (> 0).
        tau_neg: τ of the other tokens (> 0).
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return PolicyLossOutput(
        token_loss=torch.where(mask, -gate * adv, zero),
        clipped=torch.zeros_like(mask),
        ratio=ratio.detach(),
    )


@POLICY_LOSSES.register("kimi_omd")
def kimi_omd_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau: float = 0.1,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""Kimi k1.5's online-mirror-descent surrogate: policy gradient plus a squared log-ratio.

    Kimi k1.5 regresses :math:`r_j - \bar r` onto :math:`\tau \log(\pi_\theta/\pi_{\theta_i})`
    and trains with the surrogate gradient (Kimi Team 2025, *Kimi k1.5: Scaling Reinforcement
    Learning with LLMs*, arXiv:2501.12599, §2.3.2, eq. 3):

    .. math::

        \frac{1}{k}\sum_{j=1}^{k}\Bigl(\nabla_\theta\log\pi_\theta(y_j\mid x)\,(r_j-\bar r)
        - \frac{\tau}{2}\,\nabla_\theta\Bigl(\log\frac{\pi_\theta(y_j\mid x)}
        {\pi_{\theta_i}(y_j\mid x)}\Bigr)^2\Bigr)

    with :math:`\pi_{\theta_i}` the policy that sampled (``old_logprobs``) and the mean
    reward :math:`\bar r` as baseline (advantage ``grpo`` with ``std_normalization: none``).
    The log-ratio is of the whole sequence, :math:`S_j = \sum_t (\log\pi_\theta(o_t) -
    \log\pi_{\theta_i}(o_t))`.

    Token layout: token t of sequence j carries
    :math:`\ell_t = -A_t \log\pi_\theta(o_t) + \frac{\tau}{2|o_j|} S_j^2`, so the token *sum*
    of sequence j is the sequence's negated surrogate and its gradient is the paper's; use
    ``seq_mean_token_sum`` to average over sequences. At the first update of a step
    :math:`S_j = 0`, and the penalty only acts on later mini-batches or epochs. ``clipped``
    is all False; ``ratio`` is the per-token ratio, for logging.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_θi of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token (r − r̄ for Kimi).
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        tau: τ ≥ 0, the strength of the mirror-descent regulariser (0: no regulariser).
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    safe_logprobs = torch.where(mask, logprobs, zero)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    penalty = 0.5 * tau * seq_log_ratio.square() / lengths
    token_loss = torch.where(mask, -adv * safe_logprobs + penalty, zero)
    ratio = torch.exp(log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return PolicyLossOutput(token_loss=token_loss, clipped=torch.zeros_like(mask), ratio=ratio)
