r"""Critic-side estimators: token rewards, GAE, VAPO's length-adaptive λ, the value loss.

Tensors are completion-aligned ``[N, T]`` with ``response_mask`` marking each sequence's
response tokens (a prefix of the row). ``values[i, t]`` is the critic's estimate of the return
*before* emitting token t, i.e. from the state that scores token t (DESIGN rule 3).

How this code departs from the papers:

- The episode of sequence i ends after its last response token: the bootstrap value there is 0
  whether the response finished with EOS or was truncated (outcome rewards score what was
  generated; nothing follows a truncated response either).
- ``lam`` may be one number or one per sequence (VAPO's length-adaptive λ); the recursion
  runs backwards over the T columns once, vectorised over sequences.
- Computation happens in float64 and is cast back to ``values``' dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"tensors must share one 2-D [N, T] shape, got {shapes}")


def outcome_token_rewards(
    rewards: Tensor, response_mask: Tensor, token_penalty: Tensor | None = None
) -> Tensor:
    r"""Per-token rewards of an outcome-reward episode: r_i on the last response token (the
    last one the mask keeps: a tool's result after it is not the policy's).

    .. math::

        r_{i,t} = \mathbb{1}[t = |o_i|]\; r_i \;-\; p_{i,t}

    where :math:`p_{i,t}` is an optional per-token penalty, e.g. β·KL(t) when the KL sits in
    the reward (Ouyang et al. 2022, *Training language models to follow instructions with
    human feedback*, arXiv:2203.02155, eq. 2). A sequence with no response token gets no
    reward.
    """
    if rewards.ndim != 1 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be [N] with N = response_mask.shape[0]; got {tuple(rewards.shape)} "
            f"and {tuple(response_mask.shape)}"
        )
    mask = response_mask != 0
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask, positions, -1).amax(dim=-1)
    out = torch.zeros(response_mask.shape, dtype=torch.float64, device=rewards.device)
    has_tokens = last >= 0
    rows = torch.arange(len(rewards), device=rewards.device)[has_tokens]
    out[rows, last[has_tokens]] = rewards[has_tokens].to(torch.float64)
    if token_penalty is not None:
        _check_same_shape(token_penalty=token_penalty, response_mask=response_mask)
        out = out - token_penalty.to(torch.float64) * mask
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    return out.to(dtype)


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    r"""Generalised advantage estimation and the critic's return targets.

    .. math::

        \delta_t = r_t + \gamma V_{t+1} - V_t, \qquad
        \hat A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l}
                 = \delta_t + \gamma\lambda \hat A_{t+1}, \qquad
        \hat R_t = \hat A_t + V_t

    with :math:`V = 0` after the last response token (Schulman et al. 2016, *High-Dimensional
    Continuous Control Using Generalized Advantage Estimation*, arXiv:1506.02438, eq. 16).
    λ = 1 gives the Monte-Carlo return minus the value; λ = 0 the one-step TD error. The
    recursion runs over the tokens the mask keeps: t + 1 is the next kept token, so a tool's
    result inside a completion (mask 0) is a step of the environment, skipped, and the
    advantages equal those of the kept tokens alone.

    Args:
        token_rewards: ``[N, T]`` reward of each token (see :func:`outcome_token_rewards`).
        values: ``[N, T]`` critic values V_t (no gradient is taken through them).
        response_mask: ``[N, T]`` response tokens.
        gamma: discount γ in [0, 1].
        lam: λ in [0, 1], one number or an ``[N]`` tensor (one λ per sequence).

    Returns:
        ``(advantages, returns)``, both ``[N, T]`` and 0 outside the mask.
    """
    _check_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    n, width = values.shape
    lam_t = torch.as_tensor(lam, dtype=torch.float64, device=values.device).expand(n)
    if bool(((lam_t < 0) | (lam_t > 1)).any()):
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    mask = (response_mask != 0).to(torch.float64)
    v = values.detach().to(torch.float64) * mask
    r = token_rewards.detach().to(torch.float64) * mask
    advantages = torch.zeros_like(v)
    next_value = torch.zeros(n, dtype=torch.float64, device=values.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(width)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = (delta + gamma * lam_t * next_adv) * mask[:, t]
        advantages[:, t] = adv_t
        kept = mask[:, t] > 0
        next_value = torch.where(kept, v[:, t], next_value)
        next_adv = torch.where(kept, adv_t, next_adv)
    returns = (advantages + v) * mask
    return advantages.to(values.dtype), returns.to(values.dtype)


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    r"""VAPO's per-sequence GAE λ for the policy: :math:`\lambda = 1 - \frac{1}{\alpha\,l}`.

    Yuan et al. 2025, *VAPO: Efficient and Reliable Reinforcement Learning for Advanced
    Reasoning Tasks* (arXiv:2504.05118), eq. 8, with α = 0.05 in the paper: the sum of the GAE
    weights, :math:`1/(1-\lambda) = \alpha l`, grows with the response length l, so long
    responses keep a low-bias estimate and short ones a low-variance one. Clamped to [0, 1]
    (α·l ≤ 1 gives λ = 0, a one-step estimate).
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = lengths.to(torch.float64)
    lam = 1.0 - 1.0 / (alpha * lengths.clamp(min=1e-12))
    return lam.clamp(0.0, 1.0)


def whiten(values: Tensor, mask: Tensor, epsilon: float = 1e-8) -> Tensor:
    r"""Masked whitening :math:`(x - \mu) / (\sigma + \epsilon)` over all masked entries.

    The usual PPO normalisation of GAE advantages over the batch; the std is the unbiased
    one, and 0 stays outside the mask. Fewer than two entries have no spread to divide by
    and are returned as they are.
    """
    _check_same_shape(values=values, mask=mask)
    m = (mask != 0).to(torch.float64)
    n = m.sum()
    if n < 2:
        return values * m.to(values.dtype)
    x = values.to(torch.float64)
    mean = (x * m).sum() / n
    var = ((x - mean).square() * m).sum() / (n - 1)
    return (((x - mean) / (var.sqrt() + epsilon)) * m).to(values.dtype)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor, clip: float | None
) -> tuple[Tensor, Tensor]:
    r"""PPO's clipped value loss per token, and where clipping bound.

    .. math::

        \ell_t = \tfrac12 \max\bigl((V_t - \hat R_t)^2,\;
                 (V^{\text{old}}_t + \operatorname{clip}(V_t - V^{\text{old}}_t, -c, c)
                  - \hat R_t)^2\bigr)

    (the value clipping of OpenAI's PPO2 baselines; Schulman et al. 2017 §5 give the unclipped
    squared error). ``clip=None`` gives the plain ½(V − R̂)².

    Returns:
        ``(token_loss, clipped)``, ``[N, T]``, 0 / False outside the mask.
    """
    _check_same_shape(
        values=values, old_values=old_values, returns=returns, response_mask=response_mask
    )
    mask = response_mask != 0
    target = returns.detach()
    loss = 0.5 * (values - target).square()
    clipped = torch.zeros_like(mask)
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0, got {clip}")
        old = old_values.detach()
        clipped_values = old + (values - old).clamp(-clip, clip)
        clipped_loss = 0.5 * (clipped_values - target).square()
        clipped = clipped_loss > loss
        loss = torch.maximum(loss, clipped_loss)
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return torch.where(mask, loss, zero), clipped & mask


def positive_example_nll(logprobs: Tensor, response_mask: Tensor, correct: Tensor) -> Tensor:
    r"""VAPO's positive-example LM loss per token: −log π on the tokens of correct samples.

    .. math::

        \mathcal{L}_{\text{NLL}} = -\frac{1}{\sum_{o_i \in \mathcal{T}} |o_i|}
            \sum_{o_i \in \mathcal{T}} \sum_{t} \log \pi_\theta(a_t \mid s_t)

    over the set :math:`\mathcal{T}` of correct responses, added to the policy loss with a
    weight μ = 0.1 (Yuan et al. 2025, VAPO, arXiv:2504.05118, eq. 9–10). Returns the token
    values; the caller divides by the number of correct-sample tokens of the mini-batch.
    """
    _check_same_shape(logprobs=logprobs, response_mask=response_mask)
    if correct.shape != logprobs.shape[:1]:
        raise ValueError(f"correct must be [N], got {tuple(correct.shape)}")
    keep = (response_mask != 0) & correct.bool()[:, None]
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(keep, -logprobs, zero)
