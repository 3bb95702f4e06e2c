"""Controllers and schedules around the loss: adaptive entropy / KL coefficients, an EMA
reference model, the stall watch that times ProRL's resets, the high-entropy ("forking") token
mask and the entropy-based advantage term.

The two coefficient controllers and the stall watch are tiny stateful classes with ``update`` and
``state_dict``/``load_state_dict``: their state is part of a checkpoint, so a resumed run
continues the same coefficient trajectory (DESIGN.md, correctness rule 10).

How this code departs from the papers:

- :class:`AdaptiveEntropyCoef` (Skywork-OR1) updates its coefficient from this step's entropy
  and returns the *updated* value (or 0 when the entropy is already at or above the target),
  so the first step below the target already gets an entropy bonus. An entropy exactly equal
  to the target counts as "high enough": the coefficient falls and the bonus is off.
- :class:`AdaptiveKLCoef` (Ziegler et al.) floors the coefficient at 0: with
  ``n_steps > 5 * horizon`` the multiplier ``1 - 0.2 * n_steps / horizon`` would be negative.
- :func:`high_entropy_mask` keeps ``ceil(top_frac * n)`` tokens (at least one), plus every
  token tied with the last one kept, so it may keep slightly more than the fraction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _check_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class AdaptiveEntropyCoef:
    """Skywork-OR1 adaptive entropy control (He et al. 2025, arXiv:2505.22312, §4).

    A coefficient ``c`` tracks a target entropy with a fixed step ``Δ``; the entropy bonus is
    only switched on while the entropy is below the target::

        c_{k+1} = clip(c_k + Δ, 0, c_max)   if e_k < target
                  clip(c_k − Δ, 0, c_max)   if e_k ≥ target
        α_k     = c_{k+1} · 1{e_k < target}

    where ``e_k`` is the mean token entropy of step ``k``'s rollouts and ``α_k`` is the
    coefficient of the entropy bonus in the loss (``loss = pg_loss − α_k · entropy``).
    :meth:`update` returns ``α_k``; :attr:`coef` is the controller state ``c``.
    """

    def __init__(self, *, init_coef: float, target: float, delta: float, max_coef: float) -> None:
        self.target = _check_finite("target", target)
        self.delta = _check_finite("delta", delta)
        self.max_coef = _check_finite("max_coef", max_coef)
        init = _check_finite("init_coef", init_coef)
        if self.delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")
        if not 0.0 <= init <= self.max_coef:
            raise ValueError(f"init_coef must be in [0, max_coef={max_coef}], got {init_coef}")
        self._coef = init

    @property
    def coef(self) -> float:
        """The controller state ``c`` (not zeroed above the target)."""
        return self._coef

    def update(self, entropy: float) -> float:
        """Step the controller with this step's mean entropy; return the coefficient to use."""
        entropy = _check_finite("entropy", entropy)
        below = entropy < self.target
        step = self.delta if below else -self.delta
        self._coef = min(max(self._coef + step, 0.0), self.max_coef)
        return self._coef if below else 0.0

    def state_dict(self) -> dict:
        return {"coef": self._coef}

    def load_state_dict(self, state: dict) -> None:
        self._coef = _check_finite("state['coef']", state["coef"])


class AdaptiveKLCoef:
    """Adaptive KL controller of Ziegler et al. 2019 (arXiv:1909.08593, §2.2).

    A proportional controller that moves the KL coefficient ``β`` towards a target KL::

        e_t     = clip(KL_t / KL_target − 1, −0.2, 0.2)
        β_{t+1} = β_t · (1 + e_t · n_steps / horizon)

    (the paper's ``K_β`` is ``n_steps / horizon``, as in its released code and in TRL /
    OpenRLHF). ``n_steps`` is the number of samples (or steps) since the last update.
    """

    def __init__(self, *, init_coef: float, target: float, horizon: float) -> None:
        self._coef = _check_finite("init_coef", init_coef)
        self.target = _check_finite("target", target)
        self.horizon = _check_finite("horizon", horizon)
        if self._coef < 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef}")
        if self.target <= 0 or self.horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got {target} and {horizon}")

    @property
    def coef(self) -> float:
        """The current KL coefficient ``β``."""
        return self._coef

    def update(self, kl: float, n_steps: int) -> float:
        """Step the controller with the measured KL; return the new coefficient."""
        kl = _check_finite("kl", kl)
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
            raise ValueError(f"n_steps must be a non-negative int, got {n_steps!r}")
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self._coef = max(self._coef * (1.0 + error * n_steps / self.horizon), 0.0)
        return self._coef

    def state_dict(self) -> dict:
        return {"coef": self._coef}

    def load_state_dict(self, state: dict) -> None:
        self._coef = _check_finite("state['coef']", state["coef"])


class StallWatch:
    """When held-out accuracy has stopped rising: ProRL's cue for a hard reset of the
    reference and the optimizer (Liu et al. 2025, "ProRL: Prolonged Reinforcement Learning
    Expands Reasoning Boundaries in Large Language Models", arXiv:2505.24864, §2.3.1, resets
    by hand when the validation scores stop rising or fall).

    The first score sets the best. Each later score either beats it (the new best; the count
    of stalled evaluations goes back to 0) or not (the count goes up by 1); when the count
    reaches ``patience``, :meth:`update` answers True and the count starts again, the best
    kept. A tie does not beat the best.
    """

    def __init__(self, patience: int) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {patience!r}")
        self.patience = patience
        self.best: float | None = None
        self.stalled = 0

    def update(self, score: float) -> bool:
        """Record this evaluation's score; whether it ends a stall of ``patience`` evaluations."""
        score = _check_finite("score", score)
        if self.best is None or score > self.best:
            self.best, self.stalled = score, 0
            return False
        self.stalled += 1
        if self.stalled < self.patience:
            return False
        self.stalled = 0
        return True

    def state_dict(self) -> dict:
        return {"best": self.best, "stalled": self.stalled}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.stalled = state["best"], state["stalled"]


@torch.no_grad()
def ema_update_(reference: nn.Module, policy: nn.Module, decay: float) -> None:
    """Move the reference model towards the policy in place (EMA reference, T1).

    T1 (Hou et al. 2025, arXiv:2501.11651) keeps the KL penalty from pinning the policy to
    its initialisation by updating the reference model as an exponential moving average::

        θ_ref ← decay · θ_ref + (1 − decay) · θ_policy

    over every parameter, matched by name. ``decay=1`` leaves the reference unchanged and
    ``decay=0`` copies the policy exactly. Policy values are cast to each reference
    parameter's dtype and device. Buffers are not touched.

    Raises:
        ValueError: if ``decay`` is outside [0, 1], or the two models' parameter names or
            shapes differ.
    """
    decay = _check_finite("decay", decay)
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}")
    ref_params = dict(reference.named_parameters())
    pol_params = dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        missing = sorted(ref_params.keys() - pol_params.keys())
        extra = sorted(pol_params.keys() - ref_params.keys())
        raise ValueError(
            f"parameter names differ: only in reference {missing}, only in policy {extra}"
        )
    for name, ref in ref_params.items():
        if ref.shape != pol_params[name].shape:
            raise ValueError(
                f"parameter {name!r} has shape {tuple(ref.shape)} in reference and "
                f"{tuple(pol_params[name].shape)} in policy"
            )
    if decay == 1.0:
        return
    for name, ref in ref_params.items():
        pol = pol_params[name].detach().to(device=ref.device, dtype=ref.dtype)
        if decay == 0.0:
            ref.copy_(pol)
        else:
            ref.lerp_(pol, 1.0 - decay)  # ref + (1 − decay)(pol − ref)


def high_entropy_mask(entropy: Tensor, response_mask: Tensor, top_frac: float) -> Tensor:
    """Keep only the highest-entropy response tokens of the batch ("forking tokens").

    Wang et al. 2025, "Beyond the 80/20 Rule" (arXiv:2506.01939), restrict the policy
    gradient to the top 20% of tokens by entropy in each batch::

        J(θ) = E[ Σ_t 1{H_t ≥ τ_ρ} · ℓ_t(θ) ],   τ_ρ = the (1 − ρ)-quantile of {H_t}

    with ``ρ = top_frac`` and the quantile taken over all response tokens of the batch (not
    per sequence). Use the result as the ``response_mask`` of the policy loss.

    Here ``k = max(1, ceil(top_frac · n))`` of the ``n`` response tokens are kept: the
    threshold is the k-th largest entropy, and every response token with entropy ≥ the
    threshold is kept, so all tokens tied at the threshold are kept (possibly more than k).

    Args:
        entropy: ``[B, T]`` per-token entropy (values at masked positions are ignored).
        response_mask: ``[B, T]`` mask of response tokens (any dtype, nonzero = response).
        top_frac: fraction of response tokens to keep, in (0, 1].

    Returns:
        ``[B, T]`` in ``response_mask``'s dtype: 1 on kept tokens, 0 elsewhere. With
        ``top_frac=1`` every response token is kept.
    """
    if isinstance(top_frac, bool) or not isinstance(top_frac, (int, float)):
        raise ValueError(f"top_frac must be a number in (0, 1], got {top_frac!r}")
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"top_frac must be in (0, 1], got {top_frac}")
    if entropy.ndim != 2 or entropy.shape != response_mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and response_mask {tuple(response_mask.shape)} "
            "must both be [B, T]"
        )
    is_response = response_mask != 0
    n = int(is_response.sum())
    if top_frac == 1.0 or n == 0:
        return is_response.to(response_mask.dtype)
    # 1e-6 absorbs float error: 0.2 * 10 must give 2, not 3
    k = max(1, math.ceil(top_frac * n - 1e-6))
    values = entropy.detach()[is_response]
    threshold = torch.topk(values, k).values[-1]
    keep = is_response & (entropy.detach() >= threshold)
    return keep.to(response_mask.dtype)


def entropy_advantage_bonus(
    advantages: Tensor, entropy: Tensor, alpha: float, kappa: float = 2.0
) -> Tensor:
    """The entropy-based term each token's advantage gets (Cheng et al. 2025, "Reasoning with
    Exploration: An Entropy Perspective", arXiv:2506.14758, eqs. 5–6)::

        ψ(H_t) = min(α · H_t^detach, |A_t| / κ),    A_t^shaped = A_t + ψ(H_t),   α > 0, κ > 1

    with H_t the policy's entropy at token t, detached: ψ moves the advantage only, not the
    gradient's form (no ∇H term, unlike an entropy bonus in the loss). The clip at |A_t| / κ
    keeps ψ below the advantage's own size, so a negative advantage stays negative and a
    zero one stays zero. The paper fixes κ = 2 and takes α = 0.4 with GRPO, 0.1 with PPO.

    Args:
        advantages: ``[B, T]`` token advantages (0 outside the response).
        entropy: ``[B, T]`` per-token entropy of the policy.
        alpha: α ≥ 0 (0 gives a zero term).
        kappa: κ > 1.

    Returns:
        ``[B, T]`` ψ, to add to ``advantages``; no gradient flows through it.
    """
    if alpha < 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if kappa <= 1.0:
        raise ValueError(f"kappa must be > 1, got {kappa}")
    if entropy.shape != advantages.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and advantages {tuple(advantages.shape)} must "
            "have one shape"
        )
    return torch.minimum(alpha * entropy.detach(), advantages.detach().abs() / kappa)
