"""Sequence-level policy losses: one importance ratio per sequence (GSPO, GMPO, LUSPO, VESPO).

Their value is laid out on the tokens (the sequence's value on each of its tokens, with
GSPO-token's gradient form) so that the loop's aggregation applies unchanged; the conventions
of :mod:`rlvr.algorithms.policy_losses` (masked tokens 0, the log-ratio clamp, ``clipped``)
hold here too.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.algorithms.policy_losses import (
    LOG_RATIO_CLAMP,
    PolicyLossOutput,
    check_clip,
    check_shapes,
)
from rlvr.algorithms.registry import POLICY_LOSSES


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""GSPO: one length-normalised importance ratio per sequence, clipped per sequence.

    With :math:`|o_i|` the number of response tokens of sequence i and

    .. math::

        s_i = \Bigl(\frac{\pi_\theta(o_i)}{\pi_{\text{old}}(o_i)}\Bigr)^{1/|o_i|}
            = \exp\Bigl(\frac{1}{|o_i|}\sum_{t=1}^{|o_i|}
              \bigl(\log\pi_\theta(o_{i,t}) - \log\pi_{\text{old}}(o_{i,t})\bigr)\Bigr),

    GSPO maximises :math:`\frac{1}{G}\sum_i \min\bigl(s_i A_i,\,
    \operatorname{clip}(s_i, 1-\varepsilon_{\text{low}}, 1+\varepsilon_{\text{high}})
    A_i\bigr)` (Zheng et al. 2025, *Group Sequence Policy Optimization*, arXiv:2507.18071,
    eq. 5), whose gradient for an unclipped sequence is
    :math:`s_i A_i \frac{1}{|o_i|}\sum_t \nabla\log\pi_\theta(o_{i,t})`.

    Token layout: every response token of sequence i carries the sequence's loss
    :math:`\ell_i = -\min(\cdot)`, so the aggregation ``seq_mean_token_mean`` (mean over the
    tokens of a sequence, then over sequences) reproduces the paper's per-sequence mean
    exactly, in value and gradient; other aggregations weight sequences by length. The value is
    built in the paper's GSPO-token form:
    :math:`s_{i,t} = \operatorname{sg}[s_i]\,\pi_\theta(o_{i,t}) /
    \operatorname{sg}[\pi_\theta(o_{i,t})]`, which equals :math:`s_i` in value and has
    :math:`\partial s_{i,t}/\partial\log\pi_\theta(o_{i,t}) = s_i`, so each token's
    gradient after ``seq_mean_token_mean`` is :math:`-A_i s_i / (G\,|o_i|)`, the paper's
    GSPO gradient; with per-token advantages A_{i,t} it is GSPO-token's. ``clipped`` is
    per token but, with the loop's sequence-constant advantages, marks every token of a clipped
    sequence (their gradient is 0).

    The published clip ranges are tiny because :math:`s_i` is a per-token geometric mean:
    ε_low = 3e-4 and ε_high = 4e-4 (the defaults here) — not PPO's 0.2; set
    ``algorithm.clip.low`` / ``.high`` accordingly. The mean log-ratio is clamped to
    [−20, 20] before ``exp``; a sequence with no response token gets s = 1 and loss 0.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token (sequence-constant for GSPO proper).
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        clip_low: ε_low, s_i is clipped below at 1 − ε_low.
        clip_high: ε_high, s_i is clipped above at 1 + ε_high.
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)`` with ``ratio`` = s_i on each token.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    check_clip(clip_low, clip_high)
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    safe_logprobs = torch.where(mask, logprobs, zero)
    log_ratio = torch.where(mask, logprobs.detach() - old_logprobs.detach(), zero)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (log_ratio.sum(dim=-1, keepdim=True) / lengths).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    seq_ratio = torch.exp(seq_log_ratio)  # [B, 1], no gradient: sg[s_i]
    # GSPO-token: value s_i, d/d logπ_t = s_i (π/sg(π) = exp(logπ − sg(logπ)) = 1 in value)
    token_ratio = seq_ratio * torch.exp(safe_logprobs - safe_logprobs.detach())
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)

    unclipped_loss = -adv * token_ratio
    clipped_loss = -adv * token_ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped_loss, clipped_loss)
    clipped = clipped_loss > unclipped_loss
    return PolicyLossOutput(
        token_loss=torch.where(mask, loss, zero),
        clipped=clipped & mask,
        ratio=torch.where(mask, seq_ratio.expand_as(log_ratio), torch.ones_like(log_ratio)),
    )


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""GMPO: the geometric mean of the token ratios, each clipped in log space first.

    With :math:`l_t = \log\pi_\theta(o_t) - \log\pi_{\text{old}}(o_t)` and the PPO trust
    region taken one-sidedly by the sign of the advantage,
    :math:`\tilde l_t = \min(l_t, \varepsilon_{\text{high}})` where A > 0 and
    :math:`\max(l_t, -\varepsilon_{\text{low}})` where A < 0, GMPO maximises
    :math:`\frac{1}{G}\sum_i A_i \exp\bigl(\frac{1}{|o_i|}\sum_t \tilde l_{i,t}\bigr)`
    (Zhao et al. 2025, *Geometric-Mean Policy Optimization*, arXiv:2507.20673; ε = 0.4 in
    log space there, ratios within (e^−0.4, e^0.4)): an outlier token moves the geometric mean
    far less than the arithmetic mean GRPO takes, so the range can be wider. A token whose
    log-ratio is clipped gets no gradient; the others get
    :math:`-A_i r_i / |o_i|` (r_i the sequence's clipped geometric-mean ratio).

    Token layout as :func:`gspo_loss`: each response token carries
    :math:`-A\,\operatorname{sg}[r_i]\,\exp(\tilde l_t - \operatorname{sg}[\tilde l_t])`,
    the sequence's loss in value with the token's own gradient, so ``seq_mean_token_mean``
    gives the paper's objective and gradient. ``clip_low`` / ``clip_high`` are log-space
    bounds here (``algorithm.clip``; the ``gmpo`` preset sets 0.4). ``clipped`` marks the
    tokens whose log-ratio was clipped; ``ratio`` is r_i on each token.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token (sequence-constant).
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        clip_low: ε_low, the log-ratio's floor −ε_low where A < 0.
        clip_high: ε_high, its cap where A > 0.
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
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)
    positive = adv > 0
    clipped = torch.where(positive, log_ratio > clip_high, log_ratio < -clip_low) & mask
    kept = torch.where(clipped, log_ratio.detach().clamp(-clip_low, clip_high), log_ratio)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (kept.detach().sum(dim=-1, keepdim=True) / lengths).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    seq_ratio = torch.exp(seq_log_ratio)  # [B, 1], sg[r_i]
    token_ratio = seq_ratio * torch.exp(kept - kept.detach())
    return PolicyLossOutput(
        token_loss=torch.where(mask, -adv * token_ratio, zero),
        clipped=clipped,
        ratio=torch.where(mask, seq_ratio.expand_as(log_ratio), torch.ones_like(log_ratio)),
    )


@POLICY_LOSSES.register("luspo")
def luspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""LUSPO: GSPO's sequence loss weighted by the sequence's length.

    GSPO averages its per-sequence losses :math:`\ell_i`, so a long response's gradient is
    spread over its tokens (each gets :math:`1/|o_i|` of it): correct short responses and wrong
    long ones are favoured, and response lengths drift. LUSPO (Length-Unbiased Sequence Policy
    Optimization; Liu et al. 2026, arXiv:2602.05261; TRL's ``loss_type="luspo"``) minimises
    :math:`\frac{1}{G}\sum_i |o_i|\,\ell_i`, which gives every token of every sequence the
    gradient :math:`-A_i s_i \nabla\log\pi_\theta(o_{i,t})` whatever its length.

    Token layout: each response token of sequence i carries :math:`|o_i|\,\ell_i`, so with the
    aggregation ``seq_mean_token_mean`` (the `luspo` preset's) the mean over the sequences is
    the objective above, in value and gradient; :func:`gspo_loss` gives ℓ_i, its ratio and
    its clipping (the same per-sequence clip ranges, 3e-4 / 4e-4 by default).
    """
    out = gspo_loss(
        logprobs,
        old_logprobs,
        advantages,
        response_mask,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    lengths = response_mask.sum(dim=-1, keepdim=True).to(out.token_loss.dtype)
    return PolicyLossOutput(out.token_loss * lengths, out.clipped, out.ratio)


VESPO_LOG_RATIO_FLOOR = math.log(1e-8)
"""log w of VESPO's sequence ratio is clamped below at log 1e-8 (and above at 20)."""


def vespo_weights(
    log_ratio: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    r"""``[B, T]`` VESPO's detached weight of each token: the gamma-shaped function of the
    whole sequence's importance ratio :math:`w_i = \pi_\theta(o_i)/\pi_{\text{old}}(o_i)`,

    .. math::

        \varphi(w) = e^{\lambda}\, w^{k}\, e^{-\lambda w} = \exp(\lambda + k \log w - \lambda w),

    with (k, λ) = (k_pos, λ_pos) where the token's advantage is ≥ 0 and (k_neg, λ_neg)
    elsewhere (Shen et al. 2026, *VESPO: Variational Sequence-Level Soft Policy Optimization*,
    arXiv:2602.10693; TRL's ``get_gamma_weights``). φ(1) = 1, so on-policy VESPO is REINFORCE;
    φ peaks at w = k/λ and falls to 0 as w → 0 or ∞, a soft trust region on the whole
    sequence. log w (the sum, not the mean, of the token log-ratios) is clamped to
    [log 1e-8, 20], as TRL does; 0 on masked tokens."""
    mask = response_mask.bool()
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float32, device=log_ratio.device)
        token_log_ratio = torch.where(mask, log_ratio.float(), zero).clamp(
            -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
        )
        log_w = token_log_ratio.sum(dim=-1, keepdim=True).clamp(VESPO_LOG_RATIO_FLOOR, 20.0)
        nonneg = advantages >= 0
        k = torch.where(nonneg, k_pos, k_neg)
        lam = torch.where(nonneg, lambda_pos, lambda_neg)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return torch.where(mask, phi, zero)


@POLICY_LOSSES.register("vespo")
def vespo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""VESPO: REINFORCE on each token scaled by a smooth, detached function of the sequence's
    importance ratio,

    .. math::

        \ell_t = -\operatorname{sg}[\varphi(w_i)]\, A_t \log\pi_\theta(o_{i,t}),

    φ from :func:`vespo_weights` with ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``,
    ``vespo_lambda_neg`` (TRL's defaults 2, 3, 3, 2). No gradient flows through the ratio (as
    CISPO), and nothing is clipped (``clipped`` is all False); ``clip_low`` / ``clip_high``
    are ignored. TRL normalises it as DAPO does: the `vespo` preset's ``token_mean``.
    ``ratio`` is φ on each token.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    phi = vespo_weights(
        logprobs.detach() - old_logprobs.detach(),
        advantages.detach(),
        response_mask,
        k_pos=vespo_k_pos,
        lambda_pos=vespo_lambda_pos,
        k_neg=vespo_k_neg,
        lambda_neg=vespo_lambda_neg,
    ).to(logprobs.dtype)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    safe_logprobs = torch.where(mask, logprobs, zero)
    return PolicyLossOutput(
        token_loss=-phi * adv * safe_logprobs,
        clipped=torch.zeros_like(mask),
        ratio=torch.where(mask, phi, torch.ones_like(phi)),
    )
