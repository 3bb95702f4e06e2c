"""Tokens picked by the covariance of their log-probability and advantage (Clip-Cov, KL-Cov).

Cui et al. 2025 (*The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models*, arXiv:2505.22617) show that the policy's entropy falls at a rate set by the covariance,
over the tokens, of a token's log-probability and its advantage, and that a small share of
tokens with a large covariance drives the collapse. Clip-Cov stops the gradient of a few of
them chosen at random; KL-Cov puts a KL penalty on the ones with the largest covariance. This
module picks them; the losses ``clip_cov`` and ``kl_cov`` apply the treatment.

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
