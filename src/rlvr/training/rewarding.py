"""Scoring a rollout batch: the configured weighted rewards plus the task's verifier."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlvr.algorithms.shaping import (
    apply_truncation_reward,
    kimi_length_reward,
    repetition_penalty,
    soft_overlong_penalty,
)
from rlvr.config import ConfigError, RewardSpec, RLConfig
from rlvr.data.problem import Problem
from rlvr.data.tasks import Task, require_gold_answers
from rlvr.rewards import RewardOutput, TrainerState, compose_rewards
from rlvr.rewards.model_based import (
    RewardContext,
    add_model_rewards,
    build_model_rewards,
    model_reward_builder,
)
from rlvr.rewards.registry import TASK_VERIFIER
from rlvr.rollout.attempts import Attempts, retry_turn
from rlvr.rollout.base import RolloutEngine
from rlvr.training.batch import RolloutBatch


def reward_columns(problems: list[Problem]) -> dict[str, list]:
    """TRL-style keyword columns: `answer` plus every extra column of the problems."""
    columns: dict[str, list] = {"answer": [p.answer for p in problems]}
    for name in sorted({key for p in problems for key in p.columns}):
        columns[name] = [p.columns.get(name) for p in problems]
    return columns


def attempts_around(
    engine: RolloutEngine,
    tokenizer,
    settings: tuple[int, str],
    problems: list[Problem],
    prompt_texts: list[str],
    verifier: tuple[str, float],
    chat_kwargs: Mapping[str, Any] | None = None,
) -> RolloutEngine:
    """`engine`, or with `settings` = (attempts, retry message) above one attempt, `engine`
    giving each wrong attempt at `problems` (templated as `prompt_texts`) another one, judged
    by the task's verifier = (reward name, timeout in seconds): a score of 1 or more is right
    (`rlvr.rollout.attempts`)."""
    attempts, message = settings
    if attempts == 1:
        return engine
    verify = compose_rewards([(verifier[0], 1.0)], timeout_s=verifier[1])

    def judge(rows: list[int], texts: list[str]) -> list[bool]:
        chosen = [problems[i] for i in rows]
        scored = verify([prompt_texts[i] for i in rows], texts, reward_columns(chosen))
        return [score >= 1.0 for score in scored.total]

    turn = retry_turn(tokenizer, message, chat_kwargs)
    return Attempts(engine, tokenizer, attempts, judge, turn)


def prompt_messages(problem: Problem) -> list[dict[str, str]]:
    """The prompt as TRL's conversational rewards see it: its messages, or its question as
    the one user turn."""
    return list(problem.messages or [{"role": "user", "content": problem.question}])


def named_rewards(functions: list[RewardSpec], task_reward: str) -> list[tuple[str, RewardSpec]]:
    """Each configured reward with the name it runs under: an entry named `TASK_VERIFIER`
    (`verifier`) runs as the task's own reward, `task_reward`. A reward listed twice is a
    ConfigError (the train loop asks before it writes the run directory)."""
    named = [(task_reward if s.name == TASK_VERIFIER else s.name, s) for s in functions]
    names = [name for name, _ in named]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        aliased = task_reward in twice and any(s.name == TASK_VERIFIER for s in functions)
        raise ConfigError(
            f"reward.functions lists {', '.join(map(repr, twice))} twice"
            + (f" ({TASK_VERIFIER!r} is this task's verifier, {task_reward!r})" if aliased else "")
            + ": keep one entry of each, with the weight it should have"
        )
    return named


def check_gold_answers(functions: list[RewardSpec], task: Task, source: object) -> None:
    """Refuse a run whose rows have no gold answer (`data.answer_column=null`) when the
    `math` verifier, which needs one, is its only weighted reward: every sample would score
    0 (the verifier does not apply) and nothing would train. `source` names the data."""
    if all(s.name in (TASK_VERIFIER, task.reward) for s in functions if s.weight != 0):
        require_gold_answers(
            task,
            task.train,
            source,
            "the task's verifier, 'math', the only reward, would score every sample 0",
            "name the answer column (data.answer_column=...) or train without answers: "
            "--preset ttrl or --preset intuitor, or a reward of your own in reward.functions",
        )


class RewardScorer:
    """Adds `rewards`, `reward_parts`, `correct` and `judged` to a batch.

    The task's verifier always runs (with weight 0 when the user's reward list leaves it out),
    so `accuracy` means the same thing whatever the rewards are.
    """

    def __init__(
        self,
        cfg: RLConfig,
        task: Task,
        *,
        policy: torch.nn.Module | None = None,
        tokenizer=None,
        generator: torch.Generator | None = None,
    ) -> None:
        """`policy`, `tokenizer` and `generator` are needed only by model rewards (`brpo`,
        `reference_likelihood`, see `rlvr.rewards.model_based`)."""
        functions = cfg.reward.functions or []
        named = named_rewards(functions, task.reward)
        plain = [(name, s) for name, s in named if model_reward_builder(name) is None]
        specs = [(name, s.weight) for name, s in plain]
        if not functions:
            specs = [(task.reward, 1.0)]
        if task.reward not in {name for name, _ in specs}:
            specs.append((task.reward, 0.0))
        self.verifier = task.reward
        conversational = frozenset(name for name, s in plain if s.conversational)
        self.compose = compose_rewards(
            specs, timeout_s=cfg.reward.timeout_s, conversational=conversational
        )
        context = RewardContext(
            policy, tokenizer, generator, cfg.model, cfg.train.seed, cfg.train.micro_batch_tokens
        )
        self.model_rewards = build_model_rewards(functions, context)
        self.weights = {
            **dict(specs),
            **{name: weight for name, (weight, _) in self.model_rewards.items()},
            "overlong": 1.0,
            "length": cfg.algorithm.shaping.length_coef,
            "repetition": cfg.algorithm.shaping.repetition_coef,
        }
        """The weight in the total reward of each entry of `reward_parts` (GDPO reads them)."""
        self.answer_column = cfg.data.answer_column if cfg.data.task == "file" else None
        """A data file's name for the gold answer, passed under it as well as `answer`."""
        self.max_len = cfg.rollout.max_new_tokens
        """This step's generation budget (the loop sets it when a schedule changes it)."""
        self.step = 0
        """The current RL step (the loop sets it; the length reward switches on by step)."""
        self.max_steps = cfg.train.steps
        self.overlong = cfg.algorithm.overlong
        self.shaping = cfg.algorithm.shaping

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        """Score every sample of `batch` in place; return the raw output (errors, timeouts)."""
        columns = {**reward_columns(batch.problems), "completion_ids": batch.completion_ids}
        if self.answer_column not in (None, "answer") and "." not in self.answer_column:
            columns[self.answer_column] = columns["answer"]  # TRL's `solution=`, by its name
        if batch.failed_calls is not None:
            columns["failed_calls"] = batch.failed_calls.tolist()
        messages = [prompt_messages(p) for p in batch.problems]
        state = TrainerState(global_step=max(self.step - 1, 0), max_steps=self.max_steps)
        out = self.compose(batch.prompt_texts, batch.completion_texts, columns, messages, state)
        if self.model_rewards:
            columns.setdefault("question", [p.question for p in batch.problems])
            columns.setdefault("prompt_messages", messages)
            columns.setdefault("prompt_ids", batch.prompt_ids)
            columns.setdefault(
                "completion_mask",
                [row[:n] > 0 for row, n in zip(batch.response_mask, batch.lengths)],
            )
            add_model_rewards(
                out,
                self.model_rewards,
                batch.prompt_texts,
                batch.completion_texts,
                batch.group_ids,
                columns,
            )
        batch.rewards = torch.tensor(out.total, dtype=torch.float32)
        batch.reward_parts = {
            k: torch.tensor(v, dtype=torch.float32) for k, v in out.per_reward.items()
        }
        batch.reward_applied = {k: torch.tensor(out.applied(k)) for k in out.per_reward}
        batch.correct = batch.reward_parts[self.verifier] >= 1.0
        batch.judged = batch.reward_applied[self.verifier]
        if self.overlong.buffer > 0:
            penalty = soft_overlong_penalty(
                torch.tensor(batch.lengths),
                max_len=self.max_len,
                buffer=max(1, round(self.overlong.buffer * self.max_len)),
                penalty=self.overlong.penalty,
            )
            batch.reward_parts["overlong"] = penalty
            batch.rewards = batch.rewards + penalty
        self._shape(batch)
        return out

    def _shape(self, batch: RolloutBatch) -> None:
        """Truncation reward, Kimi length reward and the repetition penalty, as configured."""
        shaping = self.shaping
        if shaping.length_coef and self.step >= shaping.length_start_step:
            length = kimi_length_reward(torch.tensor(batch.lengths), batch.correct, batch.group_ids)
            batch.reward_parts["length"] = length
            batch.rewards = batch.rewards + shaping.length_coef * length
        if shaping.repetition_coef:
            repetition = repetition_penalty(batch.completion_ids, shaping.repetition_ngram)
            batch.reward_parts["repetition"] = repetition
            batch.rewards = batch.rewards + shaping.repetition_coef * repetition
        if self.overlong.truncation_reward is not None:
            batch.rewards = apply_truncation_reward(
                batch.rewards, batch.truncated, self.overlong.truncation_reward
            )
