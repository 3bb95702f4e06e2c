"""Scoring a rollout batch: the configured weighted rewards plus the task's verifier."""

from __future__ import annotations

import torch

from rlvr.algorithms.shaping import soft_overlong_penalty
from rlvr.config import RLConfig
from rlvr.data.problem import Problem
from rlvr.data.tasks import Task
from rlvr.rewards import RewardOutput, compose_rewards
from rlvr.training.batch import RolloutBatch


def reward_columns(problems: list[Problem]) -> dict[str, list]:
    """TRL-style keyword columns: `answer` plus every extra column of the problems."""
    columns: dict[str, list] = {"answer": [p.answer for p in problems]}
    for name in sorted({key for p in problems for key in p.columns}):
        columns[name] = [p.columns.get(name) for p in problems]
    return columns


class RewardScorer:
    """Adds `rewards`, `reward_parts` and `correct` to a batch.

    The task's verifier always runs (with weight 0 when the user's reward list leaves it out),
    so `accuracy` means the same thing whatever the rewards are.
    """

    def __init__(self, cfg: RLConfig, task: Task) -> None:
        specs = [(s.name, s.weight) for s in cfg.reward.functions or []] or [(task.reward, 1.0)]
        if task.reward not in {name for name, _ in specs}:
            specs.append((task.reward, 0.0))
        self.verifier = task.reward
        self.compose = compose_rewards(specs, timeout_s=cfg.reward.timeout_s)
        self.max_len = cfg.rollout.max_new_tokens
        self.overlong = cfg.algorithm.overlong

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        """Score every sample of `batch` in place; return the raw output (errors, timeouts)."""
        out = self.compose(
            batch.prompt_texts, batch.completion_texts, reward_columns(batch.problems)
        )
        batch.rewards = torch.tensor(out.total, dtype=torch.float32)
        batch.reward_parts = {
            k: torch.tensor(v, dtype=torch.float32) for k, v in out.per_reward.items()
        }
        batch.correct = batch.reward_parts[self.verifier] >= 1.0
        if self.overlong.buffer > 0:
            penalty = soft_overlong_penalty(
                torch.tensor(batch.lengths),
                max_len=self.max_len,
                buffer=max(1, round(self.overlong.buffer * self.max_len)),
                penalty=self.overlong.penalty,
            )
            batch.reward_parts["overlong"] = penalty
            batch.rewards = batch.rewards + penalty
        return out
