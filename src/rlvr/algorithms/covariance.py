"""Tokens picked by the covariance of their log-probability and advantage (Clip-Cov, KL-Cov).

Cui et al. 2025 (*The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models*, arXiv:2505.22617) show that the policy's entropy falls at a rate set by the covariance,
over the tokens, of a token's log-probability and its advantage, and that a small share of
tokens with a large covariance drives the collapse. Clip-Cov stops the gradient of a few of
them chosen at random; KL-Cov puts a KL penalty on the ones with the largest covariance. This
module picks them, and its losses ``clip_cov`` and ``kl_cov`` apply the treatment.

How this code departs from the paper and verl:

- The tokens are picked once per mini-batch, over all its tokens, from the log-probs of the
  policy that sampled it (π_old when the step makes several updates, the rollout engine's
  otherwise), before any micro-batch runs: the pick does not depend on the micro-batch split
  (DESIGN rule 4). verl picks inside each micro-batch from the current policy's log-probs; on a
  step's first update the two log-probs are the same policy's.
- Clip-Cov's draw is seeded by the run's seed, the step and the mini-batch's rows, so a resumed
  run draws what the straight run drew. verl also leaves out tokens the PPO clip already
  clipped; before the forward they are unknown here, and such a token loses its gradient to
  the clip either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.policy_losses import (
    LOG_RATIO_CLAMP,
    PolicyLossOutput,
    check_shapes,
    ppo_clip_loss,
)
from rlvr.algorithms.registry import POLICY_LOSSES


def token_covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """``[R, T]`` centred product (A_t − Ā)(log π_t − mean log π), the means over the masked
    tokens (the summands of their covariance); −inf where the mask is 0."""
    valid = mask.bool()
    count = valid.sum().clamp(min=1)
    adv = torch.where(valid, advantages.to(torch.float64), 0.0)
    logp = torch.where(valid, logprobs.to(torch.float64), 0.0)
    centred = (adv - adv.sum() / count) * (logp - logp.sum() / count)
    return torch.where(valid, centred, -torch.inf)


def _count(valid: Tensor, fraction: float) -> int:
    """How many tokens to pick: `fraction` of the valid ones, at least one (as verl)."""
    return max(int(fraction * int(valid.sum())), 1)


def kl_cov_tokens(covariance: Tensor, mask: Tensor, fraction: float) -> Tensor:
    """``[R, T]`` bool: the `fraction` of the masked tokens with the largest covariance
    (KL-Cov's top-k, at least one)."""
    valid = mask.bool()
    picked = torch.zeros_like(valid)
    if not valid.any():
        return picked
    top = torch.topk(covariance.flatten(), _count(valid, fraction)).indices
    picked.view(-1)[top] = True
    return picked & valid


def clip_cov_tokens(
    covariance: Tensor,
    mask: Tensor,
    fraction: float,
    low: float,
    high: float,
    generator: torch.Generator,
) -> Tensor:
    """``[R, T]`` bool: `fraction` of the masked tokens (at least one), drawn uniformly from
    those whose covariance lies in (low, high) (Clip-Cov's ω_low, ω_high; fewer if fewer lie
    there)."""
    valid = mask.bool()
    candidates = torch.nonzero((covariance > low) & (covariance < high) & valid)
    order = torch.randperm(len(candidates), generator=generator)
    chosen = candidates[order[: _count(valid, fraction)]]
    picked = torch.zeros_like(valid)
    picked[chosen[:, 0], chosen[:, 1]] = True
    return picked


COVARIANCE_LOSSES = frozenset({"clip_cov", "kl_cov"})
"""Losses that treat the tokens `rlvr.algorithms.covariance` picks (``selected``)."""


@POLICY_LOSSES.register("clip_cov")
def clip_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    selected: Tensor | None = None,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""Clip-Cov: PPO's clipped loss, with the tokens in ``selected`` left out entirely.

    Cui et al. 2025 (*The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models*, arXiv:2505.22617, §4): a small random share r of the tokens whose
    log-prob/advantage covariance lies in (ω_low, ω_high) (r = 2e-4, ω = 1 and 5 there) get
    loss 0 and no gradient, which slows the entropy's collapse. ``selected`` is that pick
    (`covariance.clip_cov_tokens`, made by the update over the mini-batch); None picks none
    (PPO's loss). Selected tokens count as ``clipped``.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token.
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        clip_low: ε_low of the PPO clip.
        clip_high: ε_high of the PPO clip.
        selected: ``[B, T]`` bool, the tokens to leave out, or None.
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``.
    """
    out = ppo_clip_loss(
        logprobs, old_logprobs, advantages, response_mask, clip_low=clip_low, clip_high=clip_high
    )
    if selected is None:
        return out
    check_shapes(logprobs=logprobs, selected=selected)
    left_out = selected.bool() & response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return PolicyLossOutput(
        token_loss=torch.where(left_out, zero, out.token_loss),
        clipped=out.clipped | left_out,
        ratio=out.ratio,
    )


@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    kl_coef: float = 1.0,
    selected: Tensor | None = None,
    **kwargs: object,
) -> PolicyLossOutput:
    r"""KL-Cov: the unclipped surrogate, plus a KL penalty on the tokens in ``selected``.

    .. math::

        \ell_t = -A_t\,\rho_t + \beta\,\mathbb{1}[t \in S]\,
                 \lvert\log\pi_\theta(o_t) - \log\pi_{\text{old}}(o_t)\rvert

    (Cui et al. 2025, arXiv:2505.22617, §4: S the top-k share of the tokens by log-prob/advantage
    covariance, `covariance.kl_cov_tokens`; β = 1 there.) No token is clipped: the penalty holds
    the high-covariance tokens near π_old instead. On a step's first update π_θ = π_old and the
    penalty has no gradient (|·| at 0), so it acts from the second update of a step on
    (``train.mini_batches`` or ``train.epochs`` above 1). ``selected`` None penalises nothing.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (no gradient).
        advantages: ``[B, T]`` advantage of each token.
        response_mask: ``[B, T]`` 1 on response tokens that are trained, 0 elsewhere.
        kl_coef: β ≥ 0, the weight of the penalty.
        selected: ``[B, T]`` bool, the penalised tokens, or None.
        **kwargs: ignored.

    Returns:
        ``PolicyLossOutput(token_loss, clipped, ratio)``; ``clipped`` is all False.
    """
    check_shapes(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=response_mask
    )
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), zero)
    loss = -adv * ratio
    if selected is not None:
        check_shapes(logprobs=logprobs, selected=selected)
        loss = loss + torch.where(selected.bool() & mask, kl_coef * log_ratio.abs(), zero)
    return PolicyLossOutput(
        token_loss=torch.where(mask, loss, zero),
        clipped=torch.zeros_like(mask),
        ratio=ratio.detach(),
    )
