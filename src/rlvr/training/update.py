"""The policy update: losses over token-budget micro-batches, normalised over the optimizer step.

Every micro-batch loss is divided by the token / sequence count of the WHOLE mini-batch
(DESIGN rule 4), so accumulating gradients over any micro-batch split gives the gradient of the
full-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from rlvr.algorithms import KL_ESTIMATORS, POLICY_LOSSES, aggregate
from rlvr.algorithms.controllers import entropy_advantage_bonus
from rlvr.algorithms.covariance import (
    COVARIANCE_LOSSES,
    clip_cov_tokens,
    kl_cov_tokens,
    token_covariance,
)
from rlvr.algorithms.kl import kl_k3
from rlvr.algorithms.policy_losses import VANISH_AT_ZERO_ADVANTAGE
from rlvr.algorithms.rollout_correction import (
    off_policy_sequence_mask,
    rollout_is_ratio,
    rollout_is_weights,
)
from rlvr.algorithms.value import positive_example_nll
from rlvr.config import AlgorithmConfig
from rlvr.models import fused
from rlvr.training import sharding
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import (
    collate_shared_prefix,
    completion_token_stats,
    model_device,
    on_device,
    packed_micro_batches,
    rows_on,
    to_device,
    token_budget_micro_batches,
)
from rlvr.training.distributed import ONE_PROCESS, Ranks


@dataclass
class LossSettings:
    """What the loss needs besides the batch (plain values, no config objects in the maths)."""

    algorithm: AlgorithmConfig
    temperature: float
    max_len: int
    micro_batch_tokens: int
    pad_id: int
    kl_coef: float = 0.0
    """This step's KL coefficient (fixed, or set by the adaptive controller)."""
    entropy_coef: float = 0.0
    """This step's entropy coefficient (fixed, or set by the adaptive controller)."""
    skip_zero_advantage: bool = False
    """Whether samples with all-zero advantages may skip forward/backward (`trainable_rows`)."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """The weight of each of the batch's `reward_parts` (`RewardScorer.weights`), which
    `algorithm.reward_aggregation=normalize_then_sum` normalises one by one."""
    seed: int = 0
    """The run's seed (`train.seed`): with `step`, it seeds `clip_cov`'s draw."""
    step: int = 0
    """The step being trained."""


def rank_share(batch: RolloutBatch, rows: list[int], ranks: Ranks) -> list[int]:
    """This rank's part of `rows` (`Ranks.share`), whole groups weighed by their tokens."""
    costs = [len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    return ranks.share(rows, batch.group_ids.tolist(), costs)


def micro_batches(
    batch: RolloutBatch, rows: list[int], budget: int, model: nn.Module
) -> list[list[int]]:
    """Token-budget micro-batches of `rows`.

    With the padding-free forward (`fused.supports`), rows stay in group order and the budget
    counts the tokens computed: each group's prompt once, plus the completions
    (`packed_micro_batches`). Otherwise rows are sorted by length to keep padding low and the
    budget counts rows × longest prompt + completion, padding included."""
    if fused.supports(model):
        group = batch.group_ids.tolist()
        rows = sorted(rows, key=lambda r: (group[r], r))
        prompts = [len(p) for p in batch.prompt_ids]
        completions = [len(c) for c in batch.completion_ids]
        return packed_micro_batches(rows, group, prompts, completions, budget)
    seq_lengths = [len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    return token_budget_micro_batches(rows, seq_lengths, budget)


def trainable_rows(batch: RolloutBatch, rows: list[int], s: LossSettings) -> list[int]:
    """The rows whose loss can have a gradient: all of them, or, when `s.skip_zero_advantage`
    and nothing but the advantage-weighted policy loss is trained (no reference model, whose
    KL term and metric need every sample; no entropy bonus; no positive-example NLL; a loss in
    `VANISH_AT_ZERO_ADVANTAGE`), the rows with
    a nonzero advantage. The loss is still normalised over all `rows` (DESIGN rule 4), so the
    gradient is exactly that of the full mini-batch."""
    algo = s.algorithm
    skippable = (
        s.skip_zero_advantage
        and algo.loss in VANISH_AT_ZERO_ADVANTAGE
        and batch.ref_logprobs is None
        and not s.entropy_coef
        and not algo.positive_lm_coef
    )
    if not skippable:
        return rows
    signal = (batch.advantages[rows] * batch.response_mask[rows]).abs().sum(-1) > 0
    return [r for r, keep in zip(rows, signal.tolist()) if keep]


@torch.no_grad()
def batch_token_stats(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    budget: int,
    pad_id: int,
    with_entropy: bool = False,
    ranks: Ranks = ONE_PROCESS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N, T] log-probs (and entropies when asked) of every completion token, no gradient; on
    the batch's device (the CPU), whatever the model's. Each rank scores its share of the rows
    and the ranks' results are summed, rows being zero where a rank did not score them."""
    device = model_device(model)
    logprobs = torch.zeros_like(batch.response_mask)
    entropy = torch.zeros_like(batch.response_mask) if with_entropy else None
    mine = rank_share(batch, list(range(len(batch))), ranks)
    for rows in micro_batches(batch, mine, budget, model):
        mb = to_device(
            collate_shared_prefix(batch.prompt_ids, batch.completion_ids, rows, pad_id), device
        )
        lp, ent = completion_token_stats(model, mb, temperature, entropy is not None)
        width = lp.shape[1]
        logprobs[rows, :width] = lp.to(logprobs)
        if entropy is not None:
            entropy[rows, :width] = ent.to(entropy)
    ranks.sum_(logprobs)
    if entropy is not None:
        ranks.sum_(entropy)
    return logprobs, entropy


def batch_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    budget: int,
    pad_id: int,
    ranks: Ranks = ONE_PROCESS,
) -> torch.Tensor:
    """[N, T] log-probs of every completion token under `model` (no gradient)."""
    return batch_token_stats(model, batch, temperature, budget, pad_id, ranks=ranks)[0]


class RolloutMismatch(NamedTuple):
    """A micro-batch's rollout importance weights and the statistics `SUMMED` adds up."""

    weights: torch.Tensor
    """[b, T] the weights of the token losses (`rollout_is_weights`; ones when off)."""
    sums: tuple[torch.Tensor, ...]
    """|log π_old − log π_rollout|, k3 of KL(π_rollout ‖ π_old), the weights, and the tokens
    whose weight is not their ratio (truncated or masked), each [b, T] over the mask."""


def rollout_mismatch(
    old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, algo: AlgorithmConfig
) -> RolloutMismatch:
    """How far the rollout engine's log-probs are from the trainer's π_old on the `mask`
    tokens, and the correcting weights `algo.rollout_is` asks for (DESIGN rule 8)."""
    settings = algo.rollout_is
    with torch.no_grad():
        diff = (old - rollout) * mask
        kl = kl_k3(rollout, old) * mask  # samples from π_rollout: KL(π_rollout ‖ π_old)
        weights, changed = mask, mask * 0
        if settings.mode != "none":
            sequence = settings.mode.startswith("sequence")
            ratio = rollout_is_ratio(old, rollout, mask, sequence=sequence)
            weights = rollout_is_weights(
                ratio,
                mask,
                mode=settings.mode,
                min_ratio=settings.min_ratio,
                max_ratio=settings.max_ratio,
            )
            changed = (weights != ratio.expand_as(mask) * mask).float() * mask
    return RolloutMismatch(weights, (diff.abs(), kl, weights, changed))


SUMMED = (
    "loss",
    "clip_tokens",
    "entropy_sum",
    "kl_sum",
    "tokens",
    "rollout_diff_sum",
    "rollout_kl_sum",
    "rollout_weight_sum",
    "rollout_capped_tokens",
    "off_policy_masked_tokens",
    "entropy_bonus_sum",
    "abs_advantage_sum",
)
"""`minibatch_backward`'s statistics summed over the micro-batches on the model's device and
read back once, after the last backward: a read per micro-batch would make the host wait for
each backward before it prepares the next micro-batch, and leave a GPU idle meanwhile."""


def zero_weighted_backward(
    model: nn.Module, batch: RolloutBatch, rows: list[int], s: LossSettings, device: torch.device
) -> None:
    """A forward and backward of `rows` that adds nothing to the gradient: under FSDP, a rank
    with fewer micro-batches than another runs these, since every pass gathers weights
    (`sharding.passes`)."""
    width = sharding.min_width(model)
    mb = collate_shared_prefix(batch.prompt_ids, batch.completion_ids, rows, s.pad_id, width)
    logprobs, _ = completion_token_stats(model, to_device(mb, device), s.temperature, False)
    (logprobs.sum() * 0.0).backward()


def covariance_pick(batch: RolloutBatch, rows: list[int], s: LossSettings) -> torch.Tensor:
    """``[N, T]`` bool: the tokens of mini-batch `rows` that `clip_cov` leaves out or `kl_cov`
    penalises, picked over the whole mini-batch from the sampling policy's log-probs (π_old if
    computed, else the rollout engine's), so the pick does not depend on the micro-batches."""
    algo, cov = s.algorithm, s.algorithm.covariance
    logprobs = batch.rollout_logprobs if batch.old_logprobs is None else batch.old_logprobs
    index = torch.tensor(rows)
    mask = batch.response_mask[index]
    covariance = token_covariance(batch.advantages[index], logprobs[index], mask)
    if algo.loss == "kl_cov":
        mine = kl_cov_tokens(covariance, mask, cov.fraction)
    else:  # a draw every rank and a resumed run repeat: seeded by the run, step and rows
        generator = torch.Generator().manual_seed(hash((s.seed, s.step, *rows)) & (2**62 - 1))
        mine = clip_cov_tokens(covariance, mask, cov.fraction, cov.low, cov.high, generator)
    picked = torch.zeros(batch.response_mask.shape, dtype=torch.bool)
    picked[index] = mine
    return picked


def minibatch_backward(
    model: nn.Module,
    batch: RolloutBatch,
    rows: list[int],
    s: LossSettings,
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, float]:
    """Accumulate the gradient of the mini-batch `rows`; return summed statistics.

    Rows that `trainable_rows` leaves out get no forward/backward; when none is left, the
    gradient is set to zeros, so the optimizer steps as it would on the full mini-batch.
    With several ranks, each runs its share of the rows (`rank_share`) and the gradients and
    statistics are summed over the ranks: every rank ends with those of the whole mini-batch
    (its shard of the gradient under FSDP, where the last pass reduce-scatters and every rank
    runs as many passes: `sharding.passes`)."""
    algo = s.algorithm
    policy_loss: Callable = POLICY_LOSSES.get(algo.loss)
    num_tokens = float(batch.response_mask[rows].sum().clamp(min=1))
    norm = {"num_tokens": num_tokens, "num_seqs": float(len(rows)), "max_len": s.max_len}
    positive_tokens = 0.0
    if algo.positive_lm_coef:
        correct = batch.correct[rows].float()[:, None]
        positive_tokens = float((batch.response_mask[rows] * correct).sum())
    trained = trainable_rows(batch, rows, s)
    skipped = float(len(rows) - len(trained))
    parts = micro_batches(batch, rank_share(batch, trained, ranks), s.micro_batch_tokens, model)
    every = sharding.passes(model, parts, ranks)
    least = sharding.min_width(model)
    if not every:
        for param in model.parameters():
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    device = model_device(model)
    picked = covariance_pick(batch, rows, s) if algo.loss in COVARIANCE_LOSSES else None
    sums = torch.zeros(len(SUMMED), dtype=torch.float64, device=device)
    for i, mb_rows in enumerate(every):
        sharding.sync_gradients(model, last=i == len(every) - 1)
        if mb_rows is None:
            zero_weighted_backward(model, batch, rows[:1], s, device)
            continue
        mb = collate_shared_prefix(batch.prompt_ids, batch.completion_ids, mb_rows, s.pad_id, least)
        mb = to_device(mb, device)
        width = mb.completion_ids.shape[1]
        mask = rows_on(batch.response_mask, mb_rows, width, device)
        logprobs, entropy = completion_token_stats(model, mb, s.temperature)
        old = (
            logprobs.detach()
            if batch.old_logprobs is None
            else rows_on(batch.old_logprobs, mb_rows, width, device)
        )
        advantages = rows_on(batch.advantages, mb_rows, width, device)
        shaped, bonus, absolute = advantages, mask.new_zeros(()), mask.new_zeros(())
        if algo.entropy.advantage_alpha:  # off: no work beside the forward
            bonus = entropy_advantage_bonus(
                advantages, entropy, algo.entropy.advantage_alpha, algo.entropy.advantage_kappa
            )
            shaped, absolute = advantages + bonus, advantages.abs() * mask
            bonus = bonus * mask
        out = policy_loss(
            logprobs,
            old,
            shaped,
            mask,
            clip_low=algo.clip.low,
            clip_high=algo.clip.high,
            dual_clip=algo.clip.dual,
            tau=algo.omd_tau,
            tau_pos=algo.sapo_tau_pos,
            tau_neg=algo.sapo_tau_neg,
            kl_coef=algo.covariance.kl_coef,
            vespo_k_pos=algo.vespo.k_pos,
            vespo_lambda_pos=algo.vespo.lambda_pos,
            vespo_k_neg=algo.vespo.k_neg,
            vespo_lambda_neg=algo.vespo.lambda_neg,
            selected=None if picked is None else rows_on(picked, mb_rows, width, device),
        )
        rollout = rows_on(batch.rollout_logprobs, mb_rows, width, device)
        token_loss, mismatch = out.token_loss, rollout_mismatch(old, rollout, mask, algo)
        if algo.rollout_is.mode != "none":
            token_loss = token_loss * mismatch.weights
        dropped = mask.new_zeros(())
        if algo.off_policy_mask is not None:
            keep = off_policy_sequence_mask(
                advantages, logprobs, rollout, mask, algo.off_policy_mask
            )
            token_loss, dropped = token_loss * keep, mask * (1 - keep)
        loss = aggregate(algo.aggregation, token_loss, mask, **norm)
        if positive_tokens:
            nll = positive_example_nll(logprobs, mask, on_device(batch.correct[mb_rows], device))
            loss = loss + algo.positive_lm_coef * nll.sum() / positive_tokens
        kl_sum = loss.new_zeros(())
        if batch.ref_logprobs is not None:
            kl = KL_ESTIMATORS.get(algo.kl.estimator)(
                logprobs, rows_on(batch.ref_logprobs, mb_rows, width, device)
            )
            if not algo.kl.in_reward:
                loss = loss + s.kl_coef * aggregate(algo.aggregation, kl, mask, **norm)
            kl_sum = (kl.detach() * mask).sum()
        if s.entropy_coef:
            loss = loss - s.entropy_coef * aggregate(algo.aggregation, entropy, mask, **norm)
        loss.backward()
        summed = (
            loss.detach(),
            out.clipped.float() * mask,
            entropy.detach() * mask,
            kl_sum,
            mask,
            *mismatch.sums,
            dropped,
            bonus,
            absolute,
        )
        sums += torch.stack([x.sum().double() for x in summed])
    sharding.sum_gradients(model, ranks)
    ranks.sum_(sums)
    return {**dict(zip(SUMMED, sums.tolist(), strict=True)), "skipped_samples": skipped}
