"""The per-step metrics of `metrics.jsonl` (names are a user-facing contract, see DESIGN.md)."""

from __future__ import annotations

import torch

from rlvr.algorithms.distillation import reverse_kl_estimate
from rlvr.algorithms.groups import constant_groups
from rlvr.config import RLConfig
from rlvr.training.batch import RolloutBatch


def _mean(values: torch.Tensor) -> float:
    return float(values.float().mean()) if values.numel() else float("nan")


def judged_samples(batch: RolloutBatch) -> torch.Tensor:
    """[N] bool: the samples the task's verifier could judge (`RolloutBatch.judged`); the
    accuracy of a batch of unlabelled rows is NaN (null in metrics.jsonl), not 0."""
    if batch.judged is None:
        return torch.ones(len(batch), dtype=torch.bool)
    return batch.judged


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Share of groups whose rewards are all equal (they carry no GRPO signal)."""
    if rewards.numel() == 0:
        return 0.0
    _, inverse, sizes = torch.unique(group_ids, return_inverse=True, return_counts=True)
    constant = constant_groups(rewards, group_ids).double()
    per_group = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, inverse, constant)
    return float((per_group == sizes).double().mean())


def step_metrics(
    sampled: RolloutBatch,
    trained: RolloutBatch,
    totals: dict[str, float],
    grad_norms: list[float],
    cfg: RLConfig,
) -> dict[str, float]:
    """Rollout statistics from every sample, update statistics from the trained ones."""
    lengths = torch.tensor(sampled.lengths, dtype=torch.float32)
    correct, judged = sampled.correct, judged_samples(sampled)
    trained_tokens = totals.get("tokens", 0.0)
    tokens = max(trained_tokens, 1.0)
    passes = cfg.train.epochs
    metrics = {
        "reward/mean": _mean(sampled.rewards),
        "reward/std": float(sampled.rewards.std()) if len(sampled) > 1 else 0.0,
        "accuracy": _mean(correct[judged]),
        "response_length/mean": _mean(lengths),
        "response_length/correct": _mean(lengths[correct]),
        "response_length/incorrect": _mean(lengths[judged & ~correct]),
        "truncated_frac": _mean(sampled.truncated),
        "zero_std_frac": zero_std_fraction(sampled.rewards, sampled.group_ids),
        "entropy": totals.get("entropy_sum", float("nan")) / trained_tokens
        if trained_tokens
        else float("nan"),
        "kl": totals.get("kl_sum", 0.0) / tokens if trained.ref_logprobs is not None else 0.0,
        "clip_frac": totals.get("clip_tokens", 0.0) / tokens,
        "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "loss": totals.get("loss", float("nan")) / max(passes * cfg.train.mini_batches, 1),
        "trained_samples": len(trained),
        "skipped_samples": totals.get("skipped_samples", 0.0) / max(passes, 1),
    }
    if trained_tokens:  # the rollout engine against the trainer (DESIGN rule 8)
        metrics["rollout/logprob_diff"] = totals.get("rollout_diff_sum", 0.0) / trained_tokens
        metrics["rollout/kl"] = totals.get("rollout_kl_sum", 0.0) / trained_tokens
        if cfg.algorithm.rollout_is.mode != "none":
            weight_sum = totals.get("rollout_weight_sum", 0.0)
            metrics["rollout/is_weight"] = weight_sum / trained_tokens
            metrics["rollout/is_capped_frac"] = (
                totals.get("rollout_capped_tokens", 0.0) / trained_tokens
            )
        if cfg.algorithm.off_policy_mask is not None:
            masked = totals.get("off_policy_masked_tokens", 0.0)
            metrics["rollout/off_policy_masked_frac"] = masked / trained_tokens
    if cfg.algorithm.entropy.advantage_alpha:  # Cheng et al.'s figure 7: Σ ψ(H_t) / Σ |A_t|
        absolute = totals.get("abs_advantage_sum", 0.0)
        bonus = totals.get("entropy_bonus_sum", 0.0)
        metrics["entropy_advantage_ratio"] = bonus / absolute if absolute else 0.0
    if cfg.algorithm.group_filter.keep:  # GFPO: what the update trained on, against `sampled`
        metrics["response_length/trained"] = _mean(
            torch.tensor(trained.lengths, dtype=torch.float32)
        )
        metrics["accuracy/trained"] = _mean(trained.correct[judged_samples(trained)])
    if "value_loss" in totals:
        value_tokens = max(float(trained.response_mask.sum()) * passes, 1.0)
        metrics["value_loss"] = totals["value_loss"] / max(passes * cfg.train.mini_batches, 1)
        metrics["value_clip_frac"] = totals["value_clip_tokens"] / value_tokens
    if sampled.tool_calls is not None:
        metrics["tool_calls/mean"] = _mean(sampled.tool_calls)
        metrics["tool_calls/frac"] = _mean(sampled.tool_calls > 0)
        failed = int(sampled.failed_calls.sum())
        metrics["tool_calls/failed_frac"] = failed / max(int(sampled.tool_calls.sum()), 1)
    for name, values in sampled.reward_parts.items():  # TRL's mean: where the reward applied
        applied = sampled.reward_applied.get(name)
        metrics[f"reward/{name}"] = _mean(values if applied is None else values[applied])
    if sampled.greedy_rewards is not None:
        metrics["reward/greedy"] = _mean(sampled.greedy_rewards)
    if sampled.attempts is not None:
        metrics["attempts/mean"] = _mean(sampled.attempts)
    if trained.teacher_logprobs is not None:
        metrics["distill/reverse_kl"] = reverse_kl_estimate(
            trained.rollout_logprobs, trained.teacher_logprobs, trained.response_mask
        )
    return metrics
