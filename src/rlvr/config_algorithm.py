"""The `algorithm` section of `rlvr train`'s configuration: the advantage estimator, the
policy loss and its clipping, KL and entropy regularisation, overlong and length shaping,
GFPO's filter, the critic, rollout correction and distillation, with their bounds. `rlvr.config`
builds the whole tree from it and re-exports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config_files import Section


def _below(low_key: str, low: float, high_key: str, high: float) -> None:
    """A ValueError naming both keys unless `low` < `high` (a band of equal ends is empty)."""
    if low >= high:
        raise ValueError(f"{low_key} ({low}) must be below {high_key} ({high})")


class ClipConfig(Section):
    low: float = Field(default=0.2, ge=0.0)
    """Lower PPO clip range: the ratio is clipped at 1 - low."""
    high: float = Field(default=0.2, ge=0.0)
    """Upper PPO clip range: the ratio is clipped at 1 + high (DAPO clip-higher raises it)."""
    dual: float | None = Field(default=None, gt=1.0)
    """Dual-clip constant c > 1 capping the loss of negative-advantage tokens (None = off)."""


class CovarianceConfig(Section):
    fraction: float = Field(default=0.0002, gt=0.0, le=1.0)
    """Share of a mini-batch's response tokens that `clip_cov` leaves out or `kl_cov`
    penalises (at least one; verl's clip_cov_ratio / kl_cov_ratio)."""
    low: float = 1.0
    """`clip_cov` draws from the tokens whose log-prob/advantage covariance is above this."""
    high: float = 5.0
    """... and below this (the paper's ω_low = 1, ω_high = 5)."""
    kl_coef: float = Field(default=1.0, ge=0.0)
    """`kl_cov`'s weight β of |log π_θ − log π_old| on the picked tokens."""

    @model_validator(mode="after")
    def _band(self) -> CovarianceConfig:
        _below("algorithm.covariance.low", self.low, "algorithm.covariance.high", self.high)
        return self


class KLConfig(Section):
    coef: float = Field(default=0.0, ge=0.0)
    """KL coefficient beta to the frozen reference (0 = no reference model is loaded)."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman 2020): k1 in the reward or k2 in the loss are unbiased."""
    in_reward: bool = False
    """Subtract beta * KL from the reward instead of adding it to the loss."""
    clamp_in_reward: bool = False
    """In the reward, clamp each token's KL estimate at 0 (AlpacaFarm)."""
    adaptive_target: float | None = Field(default=None, gt=0.0)
    """Adaptive KL coefficient (Ziegler et al. 2019) steering the KL to this value; None = fixed."""
    horizon: int = Field(default=10000, ge=1)
    """Horizon, in steps, of the adaptive KL coefficient."""
    reference_ema: float | None = Field(default=None, ge=0.0, le=1.0)
    """EMA decay of the reference towards the policy after every step (T1); None = frozen."""
    reference_reset_every: int = Field(default=0, ge=0)
    """Reset the reference to the current policy every N steps (0 = never)."""
    reference_reset_mix: float = Field(default=1.0, gt=0.0, le=1.0)
    """At each reset, the policy's share alpha of the new reference, θ_ref ← α·θ + (1 − α)·θ_ref
    (TR-DPO's soft update, TRL's ref_model_mixup_alpha); 1.0 = a copy of the policy."""
    reference_reset_patience: int = Field(default=0, ge=0)
    """Reset the reference to the policy when the held-out pass@1 has not beaten its best for
    this many evaluations in a row (`eval.every_steps` apart), ProRL's reset when validation
    stalls; the count starts again after each reset (0 = never)."""
    reset_optimizer: bool = False
    """At each reference reset, also forget the optimizer's state (AdamW's moments and step
    count), as a fresh optimizer would start: ProRL's hard reset. The learning-rate schedule
    goes on."""

    @model_validator(mode="after")
    def _mix_needs_resets(self) -> KLConfig:
        resets = self.reference_reset_every or self.reference_reset_patience
        if self.reference_reset_mix != 1.0 and not resets:
            raise ValueError(
                "algorithm.kl.reference_reset_mix mixes the policy into the reference at each "
                "reset; set algorithm.kl.reference_reset_every or reference_reset_patience too"
            )
        if self.reset_optimizer and not resets:
            raise ValueError(
                "algorithm.kl.reset_optimizer clears the optimizer's state at each reference "
                "reset; set algorithm.kl.reference_reset_every or reference_reset_patience too"
            )
        if self.reference_reset_patience and not self.coef:
            raise ValueError(
                "algorithm.kl.reference_reset_patience resets the reference of the KL term, "
                "which algorithm.kl.coef=0 leaves out: set algorithm.kl.coef above 0"
            )
        return self


class EntropyConfig(Section):
    coef: float = Field(default=0.0, ge=0.0)
    """Entropy bonus coefficient (the loss subtracts coef * entropy); start value if adaptive."""
    target: float | None = Field(default=None, gt=0.0)
    """Adaptive entropy control (Skywork-OR1): the token entropy to hold; None = fixed coef."""
    delta: float = Field(default=0.005, ge=0.0)
    """Adaptive entropy control: change of the coefficient per step."""
    max_coef: float = Field(default=0.05, ge=0.0)
    """Adaptive entropy control: the largest coefficient."""
    top_frac: float = Field(default=1.0, gt=0.0, le=1.0)
    """Train the policy loss only on this fraction of highest-entropy tokens (80/20 rule: 0.2)."""
    advantage_alpha: float = Field(default=0.0, ge=0.0)
    """α of the entropy-based advantage (Cheng et al. 2025): each token's advantage A_t plus
    min(α·H_t, |A_t|/κ), H_t the policy's entropy at the update, detached; 0 = off (the
    paper: 0.4 with GRPO, 0.1 with PPO)."""
    advantage_kappa: float = Field(default=2.0, gt=1.0)
    """κ of the entropy-based advantage: the term stays at most |A_t|/κ (the paper: 2)."""


class OverlongConfig(Section):
    filter: bool = False
    """Mask truncated responses out of the loss (DAPO overlong filtering)."""
    buffer: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Soft overlong punishment zone as a fraction of rollout.max_new_tokens (DAPO: 0.2)."""
    penalty: float = Field(default=1.0, ge=0.0)
    """Largest soft overlong punishment, reached at rollout.max_new_tokens."""
    truncation_reward: float | None = None
    """Replace the reward of truncated responses with this value (e.g. -1); None = off."""


class GroupFilterConfig(Section):
    keep: int = Field(default=0, ge=0)
    """Train on this many samples of each group, the best by `by` (GFPO; 0 = off, all)."""
    by: str = "length"
    """The ranking score: `length` (shortest first), `token_efficiency` (reward / length) or
    `first` (the first sampled: TTRL trains on part of the samples that voted)."""


class ShapingConfig(Section):
    length_coef: float = 0.0
    """Weight of Kimi k1.5's per-group length reward (0 = off)."""
    length_start_step: int = Field(default=0, ge=0)
    """Step from which the length reward is added (Kimi warms it up)."""
    repetition_coef: float = 0.0
    """Weight of the n-gram repetition penalty (T1); 0 = off."""
    repetition_ngram: int = Field(default=3, ge=1)
    """n of the repetition penalty's n-grams."""


class CriticConfig(Section):
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE discount."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE lambda of the policy's advantages."""
    critic_lam: float | None = Field(default=None, ge=0.0, le=1.0)
    """GAE lambda of the critic's return targets (VAPO decoupled GAE: 1.0); None = lam."""
    length_adaptive_alpha: float | None = Field(default=None, gt=0.0)
    """VAPO length-adaptive policy lambda = 1 - 1/(alpha * length) (paper: 0.05); None = lam."""
    value_clip: float | None = Field(default=0.2, gt=0.0)
    """Clip range of the value loss around the old values (None = unclipped)."""
    lr: float = Field(default=1e-5, gt=0.0)
    """Critic learning rate."""
    warmup_steps: int = Field(default=0, ge=0)
    """First steps train only the critic (ORZ critic warm-up, VAPO value pretraining)."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the batch's response tokens."""
    model: str | None = None
    """Initialise the critic from this causal LM (same tokenizer) instead of the policy."""


class PrimeConfig(Section):
    beta: float = Field(default=0.05, gt=0.0)
    """β of the implicit PRM's token reward β·log π_φ/π_ref (verl's PRIME recipe: 0.05)."""
    lr: float = Field(default=1e-6, gt=0.0)
    """The implicit PRM's learning rate (the recipe: 1e-6)."""
    max_grad_norm: float = Field(default=10.0, gt=0.0)
    """Gradient-norm clip of the PRM's update (the recipe: 10)."""
    process_coef: float = Field(default=5.0, ge=0.0)
    """Weight of the process rewards' leave-one-out returns in the advantage (the recipe: 5)."""
    outcome_coef: float = Field(default=5.0, ge=0.0)
    """Weight of the outcome rewards' leave-one-out advantage (the recipe: 5)."""
    scale_returns: bool = True
    """Divide the process rewards by the batch's largest absolute return (the recipe's
    `prime_norm: batch_norm`)."""
    model: str | None = None
    """Initialise the PRM and its reference from this causal LM (same tokenizer) instead of
    the policy."""


class RolloutISConfig(Section):
    mode: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        "none"
    )
    """Correct the policy loss for the rollout engine's log-probs differing from the
    trainer's: `token_truncate` weights each token by min(π_old/π_rollout, max_ratio) (TIS);
    `token_mask` drops tokens whose ratio is outside [min_ratio, max_ratio]; `sequence_*` use
    one ratio per sample. The mismatch is logged in every mode (`rollout/*`)."""
    min_ratio: float = Field(default=0.0, ge=0.0)
    """Lower bound of the ratio (truncated up to it, or masked below it)."""
    max_ratio: float = Field(default=2.0, gt=0.0)
    """Upper bound of the ratio, the cap C (truncated down to it, or masked above it)."""

    @model_validator(mode="after")
    def _ordered(self) -> RolloutISConfig:
        low, high = "algorithm.rollout_is.min_ratio", "algorithm.rollout_is.max_ratio"
        _below(low, self.min_ratio, high, self.max_ratio)
        return self


class VespoConfig(Section):
    """VESPO's gamma-shaped weight φ(w) = e^λ w^k e^(−λ w) of a sequence's importance ratio
    w, one shape for advantages ≥ 0 and one for the others (TRL's vespo_* defaults)."""

    k_pos: float = Field(default=2.0, ge=0.0)
    """k where the advantage is ≥ 0 (TRL's vespo_k_pos)."""
    lambda_pos: float = Field(default=3.0, gt=0.0)
    """λ where the advantage is ≥ 0 (TRL's vespo_lambda_pos); φ peaks at w = k/λ."""
    k_neg: float = Field(default=3.0, ge=0.0)
    """k where the advantage is negative (TRL's vespo_k_neg)."""
    lambda_neg: float = Field(default=2.0, gt=0.0)
    """λ where the advantage is negative (TRL's vespo_lambda_neg)."""


class DistillConfig(Section):
    teacher: str | None = None
    """On-policy distillation: a teacher model (a local model directory or a hub name, with
    the policy's tokenizer) that scores every sampled token; its log-prob minus the student's
    is added to each token's advantage (`rlvr.algorithms.distillation`). None = off."""
    coef: float = Field(default=1.0, gt=0.0)
    """Weight of the teacher's per-token term in the advantages."""
    discount: float = Field(default=0.0, ge=0.0, le=1.0)
    """γ over the following tokens' terms: 0 = each token's own (Thinking Machines' on-policy
    distillation), 1 = the unbiased gradient of the sequence-level reverse KL."""
    outcome_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the outcome advantage (`algorithm.advantage` over the rewards) beside the
    teacher's term: 1 = RL plus distillation, 0 = distillation alone (the rewards are still
    scored and logged)."""


class AlgorithmConfig(Section):
    advantage: str = "grpo"
    """Advantage estimator (see `rlvr.algorithms.ADVANTAGES`), `gae` for a learned critic, or
    `prime` for PRIME's implicit process reward model."""
    std_normalization: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the group std, the batch std, or not at all (Dr. GRPO)."""
    epsilon: float = Field(default=1e-6, ge=0.0)
    """Added to the std before dividing."""
    pass_k: int = Field(default=1, ge=1)
    """The k of `advantage: pass_at_k` (PKPO): train for pass@k, k below
    rollout.samples_per_prompt (1 = RLOO's advantage)."""
    positive_weight: float = Field(default=0.1, ge=0.0)
    """λ of `advantage: w_reinforce`: the advantage of a passing sample (a failing one's is
    −1; 0 = negative sample reinforcement alone)."""
    reward_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """Several rewards: normalise their weighted sum (the default), or each reward within its
    group, then the weighted sum over the batch (GDPO; TRL's multi_objective_aggregation)."""
    loss: str = "ppo_clip"
    """Policy loss (see `rlvr.algorithms.POLICY_LOSSES`)."""
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = "token_mean"
    """How token losses become one number, over the whole optimizer step."""
    clip: ClipConfig = Field(default_factory=ClipConfig)
    """PPO ratio clipping."""
    kl: KLConfig = Field(default_factory=KLConfig)
    """KL regularisation to the reference model."""
    entropy: EntropyConfig = Field(default_factory=EntropyConfig)
    """Entropy regularisation."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal and sample more prompts until the batch is full."""
    max_sampling_rounds: int = Field(default=4, ge=1)
    """Most rollout rounds per step under dynamic sampling or `min_informative_fraction`
    (then train on what was kept)."""
    min_informative_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """GPG's β_th: while fewer than this share of the step's `rollout.prompts_per_step` groups
    have rewards that differ, sample another round; the step trains on those groups, topped up
    to `prompts_per_step` with the constant ones first sampled (0 = off)."""
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    """Treatment of responses that reach the generation budget."""
    group_filter: GroupFilterConfig = Field(default_factory=GroupFilterConfig)
    """GFPO: sample rollout.samples_per_prompt, train on the `keep` best of each group."""
    shaping: ShapingConfig = Field(default_factory=ShapingConfig)
    """Length and repetition reward shaping."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """Value model and GAE, used when `advantage` is `gae`."""
    prime: PrimeConfig = Field(default_factory=PrimeConfig)
    """PRIME's implicit process reward model, used when `advantage` is `prime`."""
    positive_lm_coef: float = Field(default=0.0, ge=0.0)
    """Weight of VAPO's NLL loss on correct samples (paper: 0.1); 0 = off."""
    omd_tau: float = Field(default=0.1, gt=0.0)
    """Kimi k1.5 mirror-descent tau of the `kimi_omd` loss."""
    sapo_tau_pos: float = Field(default=1.0, gt=0.0)
    """τ_pos of the `sapo` loss's gate on tokens with a positive advantage."""
    sapo_tau_neg: float = Field(default=1.05, gt=0.0)
    """τ_neg of the `sapo` loss's gate on the other tokens (the paper's is above τ_pos)."""
    vespo: VespoConfig = Field(default_factory=VespoConfig)
    """The shape of the `vespo` loss's weight of a sequence's importance ratio."""
    off_policy_mask: float | None = Field(default=None, ge=0.0)
    """δ of DeepSeek-V3.2's off-policy sequence masking (TRL's off_policy_mask_threshold): a
    sample with a negative advantage whose mean log π_rollout − log π_θ over its tokens is
    above δ is left out of the policy loss; None = off."""
    covariance: CovarianceConfig = Field(default_factory=CovarianceConfig)
    """Which tokens the `clip_cov` and `kl_cov` losses treat, and `kl_cov`'s weight."""
    rollout_is: RolloutISConfig = Field(default_factory=RolloutISConfig)
    """Importance weights for the rollout engine's mismatch with the trainer (DESIGN rule 8)."""
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """On-policy distillation from a teacher model (off unless `distill.teacher` is set)."""

    @model_validator(mode="after")
    def _decoupled_rewards_are_grpos(self) -> AlgorithmConfig:
        if self.reward_aggregation == "sum_then_normalize":
            return self
        clashes = {
            "algorithm.advantage": self.advantage != "grpo",
            "algorithm.std_normalization": self.std_normalization != "group",
            "algorithm.kl.in_reward": self.kl.in_reward,
            "algorithm.overlong.truncation_reward": self.overlong.truncation_reward is not None,
        }
        if any(clashes.values()):
            keys = ", ".join(key for key, clash in clashes.items() if clash)
            raise ValueError(
                "algorithm.reward_aggregation=normalize_then_sum (GDPO) normalises each reward "
                "in its group and the sum over the batch: it needs algorithm.advantage=grpo, "
                "algorithm.std_normalization=group, no KL in the reward and no truncation "
                f"reward; change {keys}"
            )
        return self

    @model_validator(mode="after")
    def _prime_builds_its_own_returns(self) -> AlgorithmConfig:
        if self.advantage == "prime" and self.kl.in_reward and self.kl.coef > 0:
            raise ValueError(
                "algorithm.advantage=prime builds its returns from the implicit PRM's rewards "
                "and the outcome rewards alone, as PRIME does, so a KL penalty in the reward "
                "would be dropped: set algorithm.kl.in_reward=false (the KL as a loss term)"
            )
        return self

    @model_validator(mode="after")
    def _verdict_estimators_score_verdicts(self) -> AlgorithmConfig:
        if self.advantage not in ("pass_at_k", "w_reinforce"):
            return self
        clashes = {
            "algorithm.kl.in_reward": self.kl.in_reward and self.kl.coef > 0,
            "algorithm.overlong.buffer": self.overlong.buffer > 0,
            "algorithm.overlong.truncation_reward": self.overlong.truncation_reward is not None,
            "algorithm.shaping.length_coef": self.shaping.length_coef != 0,
            "algorithm.shaping.repetition_coef": self.shaping.repetition_coef != 0,
        }
        if any(clashes.values()):
            keys = ", ".join(key for key, clash in clashes.items() if clash)
            raise ValueError(
                f"algorithm.advantage={self.advantage} counts passes, so its rewards must be "
                f"the verifier's 0 or 1; these add to them: {keys}"
            )
        return self
