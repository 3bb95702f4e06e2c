"""One step's data: sample completions, score them, and keep sampling while DAPO's dynamic
sampling still needs informative groups."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.algorithms.advantages import GREEDY_BASELINES
from rlvr.algorithms.filters import (
    GROUP_FILTER_SCORES,
    DynamicSampling,
    informative_quota,
    overlong_mask,
    top_k_per_group,
    top_up_with_constant_groups,
)
from rlvr.algorithms.groups import group_pass_rates
from rlvr.config import RLConfig
from rlvr.data.problem import Problem
from rlvr.data.sampler import PromptSampler
from rlvr.data.tasks import Task
from rlvr.data.templates import encode_prompts, longest_prompt
from rlvr.models.loading import decode_completions, eos_token_ids
from rlvr.rewards import RewardOutput, concat_outputs
from rlvr.rollout.base import RolloutEngine, SamplingParams
from rlvr.rollout.tools import ToolUse
from rlvr.training.batch import RolloutBatch, concat_batches
from rlvr.training.batching import response_mask_from_lengths
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.rewarding import RewardScorer, attempts_around


def rollout_batch(
    engine: RolloutEngine,
    tokenizer,
    task: Task,
    indices: list[int],
    cfg: RLConfig,
    greedy: bool = False,
) -> RolloutBatch:
    """Sample G completions for each chosen problem; group g holds the samples of
    `indices[g]`. `greedy`: one argmax completion each instead (ReMax's baselines)."""
    problems = [task.train[i] for i in indices]
    d = cfg.data
    chat_kwargs = ToolUse.of(cfg.rollout).chat_kwargs(d.chat_template_kwargs)
    texts, prompt_ids = encode_prompts(
        d.template, [p.prompt for p in problems], tokenizer, chat_kwargs
    )
    r = cfg.rollout
    params = SamplingParams(
        r.samples_per_prompt,
        r.temperature,
        r.top_p,
        r.top_k,
        r.max_new_tokens,
        r.min_new_tokens,
        r.min_p,
        r.repetition_penalty,
    )
    if greedy:
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=r.max_new_tokens)
    else:  # a greedy baseline makes one attempt
        settings = (r.attempts, r.retry_message)
        verifier = (task.reward, cfg.reward.timeout_s)
        engine = attempts_around(
            engine, tokenizer, settings, problems, texts, verifier, chat_kwargs
        )
    out = engine.generate(prompt_ids, params)
    lengths = [len(c) for c in out.completion_ids]
    width = max(lengths)
    logprobs = torch.zeros(len(lengths), width)
    for i, lp in enumerate(out.logprobs):
        logprobs[i, : len(lp)] = torch.tensor(lp)
    completions = decode_completions(
        tokenizer, out.completion_ids, eos_token_ids(engine.model, tokenizer)
    )
    response_mask = response_mask_from_lengths(lengths, width)
    tool_calls = failed_calls = None
    if out.tool_mask is not None:  # a tool's result, a retry turn: context, not the policy's
        for i, by_tool in enumerate(out.tool_mask):
            response_mask[i, : len(by_tool)] *= ~torch.tensor(by_tool, dtype=torch.bool)
    if out.tool_calls is not None:
        tool_calls = torch.tensor(out.tool_calls)
        failed_calls = torch.tensor(out.failed_calls)
    attempts = None if out.attempts is None else torch.tensor(out.attempts)
    return RolloutBatch(
        problems=[problems[g] for g in out.prompt_index],
        prompt_ids=[prompt_ids[g] for g in out.prompt_index],
        completion_ids=out.completion_ids,
        prompt_texts=[texts[g] for g in out.prompt_index],
        completion_texts=completions,
        group_ids=torch.tensor(out.prompt_index),
        truncated=torch.tensor([f == "length" for f in out.finish_reason]),
        response_mask=response_mask,
        rollout_logprobs=logprobs,
        tool_calls=tool_calls,
        failed_calls=failed_calls,
        attempts=attempts,
    )


@dataclass
class StepData:
    """Everything sampled in one step, and the part of it the update trains on."""

    sampled: RolloutBatch
    """Every scored sample of every round (rollout metrics come from these)."""
    kept: RolloutBatch
    """The samples dynamic sampling kept (all of them when it is off)."""
    rewards: RewardOutput
    """The reward functions' output for `sampled`: errors, timeouts, what they logged."""
    rounds: int = 1
    """Rollout rounds it took."""
    rollout_seconds: float = 0.0
    """Time spent sampling."""
    reward_seconds: float = 0.0
    """Time spent scoring."""


def config_for_step(cfg: RLConfig, step: int) -> RLConfig:
    """`cfg` with the rollout budget and temperature of the schedule stage `step` is in.

    Stages apply from their `from_step` on, in order; a stage's None keeps the value before it
    (multi-stage context: Skywork-OR1, AceReason; temperature schedules).
    """
    budget, temperature = cfg.rollout.max_new_tokens, cfg.rollout.temperature
    for stage in sorted(cfg.rollout.schedule, key=lambda s: s.from_step):
        if stage.from_step <= step:
            if stage.budget_scale is not None:
                budget = max(1, round(stage.budget_scale * cfg.rollout.max_new_tokens))
            budget = stage.max_new_tokens or budget
            temperature = stage.temperature if stage.temperature is not None else temperature
    if (budget, temperature) == (cfg.rollout.max_new_tokens, cfg.rollout.temperature):
        return cfg
    rollout = cfg.rollout.model_copy(update={"max_new_tokens": budget, "temperature": temperature})
    return cfg.model_copy(update={"rollout": rollout})


def longest_sequence(cfg: RLConfig, task: Task, held_out: list[Problem], tokenizer) -> int:
    """The most tokens a sequence of this run holds, prompt and completion: its longest
    templated training prompt (`rollout.max_prompt_tokens` where set: none is longer) plus
    the largest generation budget of any schedule stage, or a held-out prompt plus the
    evaluation's budget. Tool results and retry turns count against the budget."""
    chat_kwargs = ToolUse.of(cfg.rollout).chat_kwargs(cfg.data.chat_template_kwargs)
    prompt = cfg.rollout.max_prompt_tokens or longest_prompt(
        cfg.data.template, task.train, tokenizer, chat_kwargs
    )
    stages = (config_for_step(cfg, s.from_step) for s in cfg.rollout.schedule)
    budget = max([cfg.rollout.max_new_tokens, *(c.rollout.max_new_tokens for c in stages)])
    longest = prompt + budget
    if held_out:
        prompt = longest_prompt(cfg.data.template, held_out, tokenizer, chat_kwargs)
        longest = max(longest, prompt + (cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens))
    return longest


def config_filters(cfg: RLConfig) -> list[Callable[[RolloutBatch], RolloutBatch]]:
    """The batch filters the config asks for, in the order the loop applies them."""
    filters = []
    group_filter = cfg.algorithm.group_filter
    if group_filter.keep:
        score = GROUP_FILTER_SCORES.get(group_filter.by)

        def keep_best_of_group(batch: RolloutBatch) -> RolloutBatch:
            scores = score(batch.rewards, torch.tensor(batch.lengths))
            keep = top_k_per_group(scores, batch.group_ids, group_filter.keep)
            return batch.select(keep.nonzero().squeeze(-1))

        filters.append(keep_best_of_group)
    if cfg.algorithm.overlong.filter:

        def drop_truncated(batch: RolloutBatch) -> RolloutBatch:
            batch.response_mask = overlong_mask(batch.response_mask, batch.truncated)
            return batch

        filters.append(drop_truncated)
    return filters


def collect_step(
    engine: RolloutEngine,
    tokenizer,
    task: Task,
    sampler: PromptSampler,
    cfg: RLConfig,
    rewarder: RewardScorer,
    ranks: Ranks = ONE_PROCESS,
) -> StepData:
    """Sample and score `prompts_per_step` prompts; with dynamic sampling, repeat until
    `prompts_per_step` informative groups are kept or `max_sampling_rounds` is reached; with
    `min_informative_fraction` (GPG's β_th), until that share of them is, then fill the step
    with constant groups.

    With several ranks, each samples and scores its chunk of the drawn prompts and the chunks
    are gathered, so every rank returns the same whole step."""
    r, algo = cfg.rollout, cfg.algorithm
    top_up = algo.min_informative_fraction > 0
    quota = informative_quota(algo.min_informative_fraction, r.prompts_per_step) if top_up else None
    dynamic = DynamicSampling(r.prompts_per_step, algo.max_sampling_rounds, quota)
    sampled, kept, outputs, accepted = [], [], [], []
    rounds = 0
    seconds = [0.0, 0.0]
    while True:
        offset = rounds * r.prompts_per_step
        t0 = time.perf_counter()
        drawn = sampler.next(r.prompts_per_step)
        mine = ranks.chunk(len(drawn))
        batch = rollout_batch(engine, tokenizer, task, drawn[mine.start : mine.stop], cfg)
        greedy = None
        if algo.advantage in GREEDY_BASELINES:  # ReMax: each prompt's argmax completion
            greedy = rollout_batch(
                engine, tokenizer, task, drawn[mine.start : mine.stop], cfg, greedy=True
            )
        t1 = time.perf_counter()
        if greedy is not None:
            rewarder(greedy)
            batch.greedy_rewards = greedy.rewards[batch.group_ids]
        batch.group_ids += offset + mine.start
        scored = rewarder(batch)
        if ranks.world > 1:
            parts = ranks.gather((batch, scored))
            batch = concat_batches([part[0] for part in parts])
            scored = concat_outputs([part[1] for part in parts])
        sampler.observe(
            drawn, group_pass_rates(batch.correct, batch.group_ids - offset, len(drawn))
        )
        seconds[0], seconds[1] = seconds[0] + t1 - t0, seconds[1] + time.perf_counter() - t1
        rounds += 1
        sampled.append(batch)
        outputs.append(scored)
        if not (algo.dynamic_sampling or top_up):
            kept.append(batch)
            break
        accepted.append(dynamic.add(batch.rewards, batch.group_ids))
        if dynamic.full:
            break
    if accepted:
        if top_up:  # GPG's β_th: fill the step with constant groups
            rounds_kept = [(b.rewards, b.group_ids, keep) for b, keep in zip(sampled, accepted)]
            accepted = top_up_with_constant_groups(rounds_kept, r.prompts_per_step)
        kept = [b.select(keep.nonzero().squeeze(-1)) for b, keep in zip(sampled, accepted)]
    return StepData(
        concat_batches(sampled), concat_batches(kept), concat_outputs(outputs), rounds, *seconds
    )
