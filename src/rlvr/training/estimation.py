"""This step's advantages: from outcome rewards and groups, from a critic with GAE, or from
PRIME's implicit process rewards and the outcome rewards.

The KL penalty, when it sits in the reward, is subtracted here: per token before GAE
(``outcome_token_rewards``), summed over the sequence for the outcome estimators.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from rlvr.algorithms import ADVANTAGES, KL_ESTIMATORS, decoupled_group_advantages
from rlvr.algorithms.controllers import high_entropy_mask
from rlvr.algorithms.distillation import teacher_token_advantages
from rlvr.algorithms.implicit_prm import prime_advantages
from rlvr.algorithms.value import (
    gae_advantages,
    length_adaptive_lambda,
    outcome_token_rewards,
    whiten,
)
from rlvr.config import AlgorithmConfig
from rlvr.models import lora
from rlvr.training.batch import RolloutBatch
from rlvr.training.critic import Critic
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.implicit_prm import ImplicitPRM
from rlvr.training.update import LossSettings, batch_logprobs, batch_token_stats

CRITIC_ADVANTAGE = "gae"
"""The `algorithm.advantage` value that turns the critic on."""
PRIME_ADVANTAGE = "prime"
"""The `algorithm.advantage` value that turns PRIME's implicit PRM on."""


def kl_reward_penalty(
    batch: RolloutBatch, algo: AlgorithmConfig, kl_coef: float
) -> torch.Tensor | None:
    """[N, T] β·KL per token when the KL is in the reward, else None."""
    if batch.ref_logprobs is None or not algo.kl.in_reward:
        return None
    kl = KL_ESTIMATORS.get(algo.kl.estimator)(batch.rollout_logprobs, batch.ref_logprobs)
    if algo.kl.clamp_in_reward:
        kl = kl.clamp(min=0.0)
    return kl_coef * kl * batch.response_mask


def batch_advantages(
    batch: RolloutBatch,
    algo: AlgorithmConfig,
    kl_coef: float,
    reward_weights: dict[str, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N, T] advantages, [N, T] critic returns or None) for the batch: the outcome
    advantages (`outcome_advantages`), and with a distillation teacher (`batch.teacher_logprobs`)
    `algorithm.distill.outcome_weight` times them plus `coef` times the teacher's per-token
    term."""
    advantages, returns = outcome_advantages(batch, algo, kl_coef, reward_weights)
    if batch.teacher_logprobs is None:
        return advantages, returns
    d = algo.distill
    teacher = teacher_token_advantages(
        batch.rollout_logprobs, batch.teacher_logprobs, batch.response_mask, discount=d.discount
    )
    return d.outcome_weight * advantages + d.coef * teacher, returns


def outcome_advantages(
    batch: RolloutBatch,
    algo: AlgorithmConfig,
    kl_coef: float,
    reward_weights: dict[str, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N, T] advantages, [N, T] critic returns or None) from the batch's rewards.

    With `advantage: prime`, `batch.process_rewards` must hold the implicit PRM's rewards.
    With `advantage: gae`, `batch.values` must hold the critic's values; the policy's λ is
    `critic.lam` or VAPO's length-adaptive λ, the critic's targets use `critic.critic_lam`
    (VAPO's decoupled GAE). With `reward_aggregation: normalize_then_sum` the advantages are
    GDPO's over the batch's `reward_parts` of non-zero weight in `reward_weights`.
    """
    mask = batch.response_mask
    penalty = kl_reward_penalty(batch, algo, kl_coef)
    if algo.advantage == CRITIC_ADVANTAGE:
        c = algo.critic
        token_rewards = outcome_token_rewards(batch.rewards, mask, penalty)
        lam = c.lam
        if c.length_adaptive_alpha is not None:
            lam = length_adaptive_lambda(mask.sum(-1), c.length_adaptive_alpha)
        advantages, _ = gae_advantages(token_rewards, batch.values, mask, gamma=c.gamma, lam=lam)
        critic_lam = c.lam if c.critic_lam is None else c.critic_lam
        _, returns = gae_advantages(
            token_rewards, batch.values, mask, gamma=c.gamma, lam=critic_lam
        )
        if c.whiten_advantages:
            advantages = whiten(advantages, mask)
        return advantages, returns
    if algo.advantage == PRIME_ADVANTAGE:
        p = algo.prime
        advantages = prime_advantages(
            batch.process_rewards,
            batch.rewards,
            mask,
            batch.group_ids,
            p.process_coef,
            p.outcome_coef,
        )
        return advantages, None
    if algo.reward_aggregation == "normalize_then_sum":
        weights = {k: w for k, w in (reward_weights or {}).items() if w and k in batch.reward_parts}
        columns = [batch.reward_parts[k] for k in weights]
        parts = torch.stack(columns, dim=1) if columns else torch.zeros(len(batch), 0)
        advantages = decoupled_group_advantages(
            parts, torch.tensor(list(weights.values())), batch.group_ids, epsilon=algo.epsilon
        )
        return advantages[:, None] * mask, None
    rewards = batch.rewards if penalty is None else batch.rewards - penalty.sum(-1)
    estimator = ADVANTAGES.get(algo.advantage)
    available = {  # what an estimator may read besides the rewards, if its signature asks
        "lengths": mask.sum(-1),
        "baselines": batch.greedy_rewards,
        "k": algo.pass_k,
        "positive_weight": algo.positive_weight,
    }
    wanted = inspect.signature(estimator).parameters
    advantages = estimator(
        rewards,
        batch.group_ids,
        std_normalization=algo.std_normalization,
        epsilon=algo.epsilon,
        **{name: value for name, value in available.items() if name in wanted},
    )
    return advantages[:, None] * mask, None


def keep_high_entropy_tokens(
    advantages: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, top_frac: float
) -> torch.Tensor:
    """Zero the advantages outside the top `top_frac` entropy tokens of the batch.

    Wang et al. 2025 ("Beyond the 80/20 Rule") keep the policy gradient of the forking tokens
    only; zeroing the other tokens' advantages does that for every token-level loss, while the
    aggregation still divides by all response tokens, as in their DAPO-based setup.
    """
    return advantages * high_entropy_mask(entropy, mask, top_frac)


def prepare_update(
    batch: RolloutBatch,
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    critic: Critic | None,
    settings: LossSettings,
    needs_old_logprobs: bool,
    ranks: Ranks = ONE_PROCESS,
    teacher: torch.nn.Module | None = None,
    prm: ImplicitPRM | None = None,
) -> dict[str, float | None]:
    """Add what the update reads to `batch`: reference / teacher / old log-probs, values,
    process rewards, advantages; return the implicit PRM's statistics (`ImplicitPRM.step`:
    PRIME scores with the PRM updated on the batch), or nothing.

    A `reference` that is the policy itself (a LoRA policy's, `Regularization`) is scored with
    its adapters off. With several ranks each scores its share of the rows and every rank
    gets the whole batch's scores."""
    algo, budget, pad = settings.algorithm, settings.micro_batch_tokens, settings.pad_id
    if teacher is not None:
        batch.teacher_logprobs = batch_logprobs(
            teacher, batch, settings.temperature, budget, pad, ranks
        )
    if reference is not None:
        base = lora.adapters_disabled(model) if reference is model else nullcontext()
        with base:
            batch.ref_logprobs = batch_logprobs(
                reference, batch, settings.temperature, budget, pad, ranks
            )
    top_frac = algo.entropy.top_frac
    entropy = None
    if needs_old_logprobs or top_frac < 1.0:
        old, entropy = batch_token_stats(
            model, batch, settings.temperature, budget, pad, top_frac < 1.0, ranks
        )
        if needs_old_logprobs:
            batch.old_logprobs = old
    if critic is not None:
        batch.values = critic.predict(batch)
    prm_stats: dict[str, float | None] = {}
    if prm is not None:
        batch.process_rewards, prm_stats = prm.step(batch)
    batch.advantages, batch.returns = batch_advantages(
        batch, algo, settings.kl_coef, settings.reward_weights
    )
    if entropy is not None:
        batch.advantages = keep_high_entropy_tokens(
            batch.advantages, entropy, batch.response_mask, top_frac
        )
    return prm_stats
