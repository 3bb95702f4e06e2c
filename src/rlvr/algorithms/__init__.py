"""Pure tensor functions of RLVR, selected by name through registries.

- :data:`ADVANTAGES` — ``grpo`` (group / batch / no std normalisation), ``rloo``.
- :data:`POLICY_LOSSES` — ``ppo_clip`` (decoupled clip, optional dual clip), ``reinforce``.
- :data:`AGGREGATIONS` — ``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum``,
  always normalised over the whole optimizer step (:func:`aggregate`).
- :data:`KL_ESTIMATORS` — Schulman's ``k1``, ``k2``, ``k3``.

Nothing here imports :mod:`rlvr.training`; every function takes tensors and plain keyword
arguments, never a config object.
"""

from rlvr.algorithms.advantages import group_normalized_advantages, rloo_advantages
from rlvr.algorithms.aggregation import (
    aggregate,
    seq_mean_token_mean,
    seq_mean_token_sum,
    token_mean,
)
from rlvr.algorithms.kl import kl_k1, kl_k2, kl_k3
from rlvr.algorithms.policy_losses import PolicyLossOutput, ppo_clip_loss, reinforce_loss
from rlvr.algorithms.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "Registry",
    "aggregate",
    "group_normalized_advantages",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "ppo_clip_loss",
    "reinforce_loss",
    "rloo_advantages",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "token_mean",
]
