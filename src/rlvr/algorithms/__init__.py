"""Pure tensor functions of RLVR, selected by name through registries.

- :data:`ADVANTAGES` — ``grpo`` (group / batch / no std normalisation), ``rloo``,
  ``gpg`` (Dr. GRPO's, scaled by the batch over its learning samples), ``reinforce_pp``
  (global batch whitening), ``opo`` (length-weighted group baseline),
  ``remax`` (the greedy completion's reward), ``pass_at_k`` (PKPO), ``w_reinforce`` (±1 with passes
  down-weighted), ``best_of_group`` (max@n, leave-one-out).
- :data:`POLICY_LOSSES` — ``ppo_clip`` (decoupled clip, optional dual clip), ``reinforce``,
  ``gspo`` (sequence-level ratio), ``cispo`` (clipped stop-gradient IS weight).
- :data:`AGGREGATIONS` — ``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum``,
  always normalised over the whole optimizer step (:func:`aggregate`).
- :data:`KL_ESTIMATORS` — Schulman's ``k1``, ``k2``, ``k3``.
- :data:`PREFERENCE_LOSSES` — offline pairwise losses ``dpo``, ``ln_dpo``, ``ipo``, ``simpo``.

Nothing here imports :mod:`rlvr.training`; every function takes tensors and plain keyword
arguments, never a config object.
"""

from rlvr.algorithms.advantages import (
    decoupled_group_advantages,
    gpg_advantages,
    group_normalized_advantages,
    opo_advantages,
    rloo_advantages,
)
from rlvr.algorithms.aggregation import (
    aggregate,
    seq_mean_token_mean,
    seq_mean_token_sum,
    token_mean,
)
from rlvr.algorithms.best_of_group import best_of_group_advantages
from rlvr.algorithms.controllers import (
    AdaptiveEntropyCoef,
    AdaptiveKLCoef,
    ema_update_,
    entropy_advantage_bonus,
    high_entropy_mask,
)
from rlvr.algorithms.covariance import clip_cov_loss, kl_cov_loss
from rlvr.algorithms.distillation import reverse_kl_estimate, teacher_token_advantages
from rlvr.algorithms.filters import DynamicSampling, informative_groups, overlong_mask
from rlvr.algorithms.kl import kl_k1, kl_k2, kl_k3
from rlvr.algorithms.policy_losses import (
    PolicyLossOutput,
    cispo_loss,
    ppo_clip_loss,
    reinforce_loss,
    sapo_loss,
)
from rlvr.algorithms.preference import (
    REFERENCE_FREE,
    SMOOTHED,
    PreferenceLossOutput,
    cpo_loss,
    dpo_loss,
    exo_pair_loss,
    hinge_loss,
    ipo_loss,
    length_normalized_dpo_loss,
    orpo_loss,
    preference_loss,
    robust_dpo_loss,
    simpo_loss,
)
from rlvr.algorithms.preference_ratios import (
    apo_down_loss,
    apo_zero_loss,
    bco_pair_loss,
    discopop_loss,
    nca_pair_loss,
    sppo_hard_loss,
)
from rlvr.algorithms.preference_step import (
    aot_loss,
    aot_matching,
    aot_unpaired_loss,
    f_divergence_scores,
    kto_loss,
)
from rlvr.algorithms.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    Registry,
)
from rlvr.algorithms.reinforce_advantages import (
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from rlvr.algorithms.sequence_losses import (
    gmpo_loss,
    gspo_loss,
    luspo_loss,
    vespo_loss,
    vespo_weights,
)
from rlvr.algorithms.shaping import (
    apply_truncation_reward,
    kimi_length_reward,
    repetition_penalty,
    soft_overlong_penalty,
)
from rlvr.algorithms.verdict_advantages import (
    pass_at_k_advantages,
    weighted_reinforce_advantages,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "REFERENCE_FREE",
    "SMOOTHED",
    "AdaptiveEntropyCoef",
    "AdaptiveKLCoef",
    "DynamicSampling",
    "PolicyLossOutput",
    "PreferenceLossOutput",
    "Registry",
    "aggregate",
    "aot_loss",
    "aot_matching",
    "aot_unpaired_loss",
    "apo_down_loss",
    "apo_zero_loss",
    "apply_truncation_reward",
    "bco_pair_loss",
    "best_of_group_advantages",
    "cispo_loss",
    "clip_cov_loss",
    "cpo_loss",
    "decoupled_group_advantages",
    "discopop_loss",
    "dpo_loss",
    "ema_update_",
    "entropy_advantage_bonus",
    "exo_pair_loss",
    "f_divergence_scores",
    "gmpo_loss",
    "gpg_advantages",
    "group_normalized_advantages",
    "gspo_loss",
    "high_entropy_mask",
    "hinge_loss",
    "informative_groups",
    "ipo_loss",
    "kimi_length_reward",
    "kl_cov_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kto_loss",
    "length_normalized_dpo_loss",
    "luspo_loss",
    "nca_pair_loss",
    "opo_advantages",
    "orpo_loss",
    "overlong_mask",
    "pass_at_k_advantages",
    "ppo_clip_loss",
    "preference_loss",
    "reinforce_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "repetition_penalty",
    "reverse_kl_estimate",
    "rloo_advantages",
    "robust_dpo_loss",
    "sapo_loss",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "simpo_loss",
    "soft_overlong_penalty",
    "sppo_hard_loss",
    "teacher_token_advantages",
    "token_mean",
    "vespo_loss",
    "vespo_weights",
    "weighted_reinforce_advantages",
]
