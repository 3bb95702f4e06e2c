r"""Importance weights that correct for the rollout engine's distribution differing from the
trainer's (DESIGN rule 8).

The samples come from the rollout engine's π_rollout, but the policy gradient assumes they
come from π_old, the trainer's policy before the update. The two differ wherever the engines
compute differently (vLLM's kernels, bf16 decode against a differently fused training
forward), and the difference biases the gradient. Truncated importance sampling (TIS; Yao et
al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training") weights
each token's policy loss by

    w_t = min(π_old(y_t) / π_rollout(y_t), C),

a stop-gradient factor capped at C to bound the variance. Masked importance sampling (MIS, as
TRL's `token_mask`) instead drops the tokens whose ratio lies outside [C_min, C] and keeps the
others' ratio. The sequence variants use one ratio per sample, the product of its tokens'
ratios (the sum of their log-ratios), as TRL's `sequence_*` modes do.

Departure: the log-ratio is clamped to ±`LOG_RATIO_CLAMP` before `exp`, so a token the
trainer finds impossible cannot overflow to inf (its weight is the cap, or 0 when masked).

Off-policy sequence masking (`off_policy_sequence_mask`) drops whole samples instead: those
with a negative advantage that the policy being trained has moved far from.
"""

from __future__ import annotations

from torch import Tensor

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""The correction modes (`algorithm.rollout_is.mode`, besides `none`)."""
LOG_RATIO_CLAMP = 20.0
"""Bound of the log-ratio before `exp`."""


def rollout_is_ratio(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, sequence: bool = False
) -> Tensor:
    """π_old / π_rollout of each token [N, T] (1 outside `mask`), or of each sequence [N, 1]
    (the product over its `mask` tokens), without gradient."""
    log_ratio = (old_logprobs.detach() - rollout_logprobs) * mask
    if sequence:
        log_ratio = log_ratio.sum(-1, keepdim=True)
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def rollout_is_weights(
    ratio: Tensor, mask: Tensor, *, mode: str, min_ratio: float = 0.0, max_ratio: float = 2.0
) -> Tensor:
    """[N, T] stop-gradient weights of the token losses (zero outside `mask`), from
    `rollout_is_ratio`'s ratio ([N, T] for the `token_*` modes, [N, 1] for `sequence_*`).

    `*_truncate`: w = clamp(π_old / π_rollout, min_ratio, max_ratio) (TIS when min_ratio is 0);
    `*_mask`: w = π_old / π_rollout inside [min_ratio, max_ratio], else 0 (MIS)."""
    if mode not in MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r} (choose from {MODES})")
    if mode.endswith("truncate"):
        weights = ratio.clamp(min_ratio, max_ratio)
    else:
        weights = ratio.masked_fill((ratio < min_ratio) | (ratio > max_ratio), 0.0)
    return weights.expand_as(mask) * mask


def off_policy_sequence_mask(
    advantages: Tensor, logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """``[B, 1]`` 1.0 to keep a sample, 0.0 to leave it out of the policy loss: off-policy
    sequence masking (DeepSeek-AI 2025, *DeepSeek-V3.2*, §3.1; TRL's
    ``off_policy_mask_threshold``) drops a sample when both its advantage is negative and

        (1/|o|) Σ_t (log π_sampling(o_t) − log π_θ(o_t)) > δ,

    the sampled tokens' estimate of KL(π_sampling ‖ π_θ): a negative sample the policy has
    moved far from teaches little and destabilises. `advantages` ``[B, T]``: a sample is
    negative when a token's advantage is below 0 (they are sequence-constant in the loop);
    `logprobs` are the current policy's (detached here), `sampling_logprobs` the rollout
    engine's."""
    valid = mask.bool()
    lengths = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    gap = (sampling_logprobs - logprobs.detach()).masked_fill(~valid, 0.0)
    far = gap.sum(dim=-1, keepdim=True) / lengths > threshold
    negative = (advantages.masked_fill(~valid, 0.0) < 0).any(dim=-1, keepdim=True)
    return (~(far & negative)).to(logprobs.dtype)
