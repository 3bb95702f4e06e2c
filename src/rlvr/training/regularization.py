"""The reference model and the KL / entropy coefficients, which may change from step to step.

Fixed coefficients are the default; `algorithm.kl.adaptive_target` (Ziegler et al. 2019) and
`algorithm.entropy.target` (Skywork-OR1) make them follow the measured KL / entropy, and
`algorithm.kl.reference_ema` / `reference_reset_every` move the reference (T1; with
`reference_reset_mix`, TR-DPO's soft update; with `reset_optimizer`, ProRL's hard reset,
which the loop applies to its optimizer), and `reference_reset_patience` resets it when the
held-out pass@1 stalls (ProRL's cue). The fixed
reference of a LoRA policy is the policy itself with its adapters off (TRL's choice), no
copy; a moving one is a copy, adapters included. Everything
here is saved in checkpoints, so a resumed run continues with the same coefficients and
reference (DESIGN rule 10).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from torch import nn

from rlvr.algorithms.controllers import (
    AdaptiveEntropyCoef,
    AdaptiveKLCoef,
    StallWatch,
    ema_update_,
)
from rlvr.config import AlgorithmConfig
from rlvr.models import lora


class Regularization:
    """Owns the reference model and this step's `kl_coef` and `entropy_coef`."""

    def __init__(self, algo: AlgorithmConfig, policy: nn.Module) -> None:
        kl, entropy = algo.kl, algo.entropy
        self.kl_settings = kl
        self.reference = None
        resets = kl.reference_reset_every or kl.reference_reset_patience
        moves = kl.reference_ema is not None or bool(resets)
        self.follows_policy = kl.coef > 0 and moves
        """Whether `after_step` reads the policy's weights (a reference that moves)."""
        if kl.coef > 0 and lora.has_lora(policy) and not moves:
            self.reference = policy  # scored with its adapters off (`prepare_update`)
        elif kl.coef > 0:
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.kl_control = None
        if kl.adaptive_target is not None:
            self.kl_control = AdaptiveKLCoef(
                init_coef=kl.coef, target=kl.adaptive_target, horizon=kl.horizon
            )
        self.entropy_control = None
        if entropy.target is not None:
            self.entropy_control = AdaptiveEntropyCoef(
                init_coef=entropy.coef,
                target=entropy.target,
                delta=entropy.delta,
                max_coef=entropy.max_coef,
            )
        self.stalls = None
        if kl.reference_reset_patience:
            self.stalls = StallWatch(kl.reference_reset_patience)
        self.kl_coef, self.entropy_coef = kl.coef, entropy.coef

    def after_step(self, step: int, policy: nn.Module, kl: float, entropy: float) -> bool:
        """Update the coefficients from this step's measurements and move the reference;
        whether the reference was reset (`algorithm.kl.reference_reset_every`) this step.

        `entropy` is NaN when no token was trained (the filters left nothing); the entropy
        coefficient then stays where it is."""
        if self.kl_control is not None:
            self.kl_coef = self.kl_control.update(kl, n_steps=1)
        if self.entropy_control is not None and math.isfinite(entropy):
            self.entropy_coef = self.entropy_control.update(entropy)
        if self.reference is None:
            return False
        if self.kl_settings.reference_ema is not None:
            ema_update_(self.reference, policy, self.kl_settings.reference_ema)
        every = self.kl_settings.reference_reset_every
        if every and step % every == 0:  # whole weights under FSDP
            self._reset(policy)
            return True
        return False

    def after_eval(self, pass_at_1: float, policy: nn.Module) -> bool:
        """Count this held-out evaluation; reset the reference when pass@1 has not beaten its
        best for `algorithm.kl.reference_reset_patience` evaluations (`StallWatch`). Whether
        it was reset."""
        if self.stalls is None or not self.stalls.update(pass_at_1):
            return False
        self._reset(policy)  # whole weights under FSDP
        return True

    def _reset(self, policy: nn.Module) -> None:
        """The reference becomes the policy (with `reference_reset_mix` < 1, moves towards it)."""
        ema_update_(self.reference, policy, 1.0 - self.kl_settings.reference_reset_mix)

    def state_dict(self) -> dict[str, Any]:
        """Coefficients, controller states and (when it moves) the reference weights."""
        return {
            "kl_coef": self.kl_coef,
            "entropy_coef": self.entropy_coef,
            "kl_control": self.kl_control.state_dict() if self.kl_control else None,
            "entropy_control": self.entropy_control.state_dict() if self.entropy_control else None,
            "reference": self.reference.state_dict() if self.follows_policy else None,
            "stalls": self.stalls.state_dict() if self.stalls else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`."""
        self.kl_coef, self.entropy_coef = state["kl_coef"], state["entropy_coef"]
        if self.kl_control is not None:
            self.kl_control.load_state_dict(state["kl_control"])
        if self.entropy_control is not None:
            self.entropy_control.load_state_dict(state["entropy_control"])
        if self.stalls is not None and state.get("stalls"):  # absent before 12-06
            self.stalls.load_state_dict(state["stalls"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
