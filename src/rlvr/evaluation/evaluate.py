"""Evaluate a policy on held-out problems: pass@1, pass@k, maj@k, sc@k, lengths, truncation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from rlvr.data.problem import Problem
from rlvr.data.templates import encode_prompts
from rlvr.evaluation.metrics import mean_best_of_k, mean_majority_at_k, mean_pass_at_k
from rlvr.models.loading import decode_completions, eos_token_ids
from rlvr.rewards import compose_rewards, extract_answer
from rlvr.rewards.certainty import certainty_rewards
from rlvr.rewards.compose import RewardOutput
from rlvr.rollout.base import Rollout, RolloutEngine, SamplingParams
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.tools import ToolUse
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.rewarding import attempts_around, reward_columns

if TYPE_CHECKING:
    from rlvr.config import RLConfig


@dataclass
class VerifiedSamples:
    """k samples of each problem, verified: what evaluation and curation are computed from."""

    prompt_ids: list[list[int]]
    """The templated prompt of each problem, as token ids."""
    correct: list[list[bool]]
    """Per problem, whether each of its k samples was accepted by the verifier."""
    completions: list[str]
    """The text of every sample, problem-major (k per problem)."""
    answers: list[str | None]
    """The extracted final answer of every sample, problem-major."""
    rollout: Rollout
    """The raw rollout (token ids, finish reasons)."""
    scored: RewardOutput
    """The verifier's scores, errors and timeouts."""


def sample_and_verify(
    model: PreTrainedModel,
    tokenizer,
    problems: list[Problem],
    reward: str,
    template: str,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 512,
    chat_kwargs: Mapping[str, Any] | None = None,
    tools: ToolUse = ToolUse(),
    attempts: tuple[int, str] = (1, ""),
    engine: RolloutEngine | None = None,
) -> VerifiedSamples:
    """Sample `k` completions per problem from a seeded generator and score them with the
    `reward` verifier (a score of 1 or more is correct); `chat_kwargs` go to the chat
    template; the completions may call `tools` (whose schemas join `chat_kwargs` in the
    `hermes` format); `attempts` = (attempts, retry message) gives a wrong attempt another
    one (`rlvr.rollout.attempts`). `engine`: sample with it (the vLLM engine a run or `rlvr
    eval --engine vllm` holds, its weights `model`'s), its draws from the seeded generator
    for this call only; None: a fresh in-process engine."""
    chat_kwargs = tools.chat_kwargs(chat_kwargs or {})
    prompts = [p.prompt for p in problems]
    texts, prompt_ids = encode_prompts(template, prompts, tokenizer, chat_kwargs)
    generator = torch.Generator().manual_seed(seed)
    eos = eos_token_ids(model, tokenizer)
    base = engine or HFRolloutEngine(model, eos, tokenizer.pad_token_id, batch_size, generator)
    sampler = tools.around(base, tokenizer, chat_kwargs)
    sampler = attempts_around(
        sampler, tokenizer, attempts, problems, texts, (reward, 5.0), chat_kwargs
    )
    params = SamplingParams(k, temperature, top_p, 0, max_new_tokens)
    kept, base.generator = base.generator, generator
    try:
        out = sampler.generate(prompt_ids, params)
    finally:
        base.generator = kept
    completions = decode_completions(tokenizer, out.completion_ids, eos)
    sample_problems = [problems[i] for i in out.prompt_index]
    scored = compose_rewards([(reward, 1.0)])(
        [texts[i] for i in out.prompt_index], completions, reward_columns(sample_problems)
    )
    correct = [score >= 1.0 for score in scored.total]
    return VerifiedSamples(
        prompt_ids,
        [correct[i * k : (i + 1) * k] for i in range(len(problems))],
        completions,
        [extract_answer(c) for c in completions],
        out,
        scored,
    )


def sample_certainties(
    model: PreTrainedModel, pad_id: int, samples: VerifiedSamples
) -> list[list[float]]:
    """Per problem, the self-certainty of each of its samples under `model`: the mean over the
    tokens the policy wrote (not a tool's output or a retry turn) of KL(U ‖ p_t), as the
    `confidence` reward measures it (`rlvr.rewards.certainty`)."""
    out, k = samples.rollout, len(samples.correct[0])
    masks = None
    if out.tool_mask is not None:
        masks = [
            [not t for t in by_tool] + [True] * (len(ids) - len(by_tool))
            for by_tool, ids in zip(out.tool_mask, out.completion_ids, strict=True)
        ]
    prompts = [samples.prompt_ids[i] for i in out.prompt_index]
    values = certainty_rewards(model, prompts, out.completion_ids, pad_id, token_masks=masks)
    return [values[i * k : (i + 1) * k] for i in range(len(samples.correct))]


def sample_records(
    problems: list[Problem], samples: VerifiedSamples, k: int, first: int = 0
) -> list[dict]:
    """One record per sample, problem-major (`problem` counts from `first`): the question, the
    gold answer, the completion, its extracted answer, the verdict, its length in tokens and
    why it ended (what `rlvr eval --log-samples` writes)."""
    out = samples.rollout
    return [
        {
            "problem": first + n // k,
            "question": problems[n // k].question,
            "answer": problems[n // k].answer,
            "completion": samples.completions[n],
            "extracted": samples.answers[n],
            "correct": samples.correct[n // k][n % k],
            "length": len(out.completion_ids[n]),
            "finish_reason": out.finish_reason[n],
            **({"attempts": out.attempts[n]} if out.attempts is not None else {}),
        }
        for n in range(len(problems) * k)
    ]


def evaluate(
    model: PreTrainedModel,
    tokenizer,
    problems: list[Problem],
    *,
    reward: str,
    template: str = "chat",
    k: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 512,
    ranks: Ranks = ONE_PROCESS,
    records: list[dict] | None = None,
    chat_kwargs: Mapping[str, Any] | None = None,
    tools: ToolUse = ToolUse(),
    attempts: tuple[int, str] = (1, ""),
    engine: RolloutEngine | None = None,
    self_certainty: bool = False,
) -> dict[str, float]:
    """Sample `k` completions per problem and score them with the `reward` verifier; append
    every sample's `sample_records` to `records` when it is given; sample with `engine`
    when one is given (`sample_and_verify`). With `self_certainty`, also sc@k: how often the
    most self-certain of a problem's samples is right (`sample_certainties`, `mean_best_of_k`).

    pass@1 is the mean correctness over all k samples (the unbiased pass@1 estimate), pass@k
    uses the unbiased estimator of Chen et al. (2021), maj@k votes over extracted answers.
    With several ranks, rank r samples its chunk of the problems (`Ranks.chunk`) with seed +
    r, and every rank returns the metrics of all of them. With `attempts` = (n > 1, retry
    message) a sample is right when its last attempt is, and `attempts/mean` is reported.
    """
    start = time.perf_counter()
    chunk = ranks.chunk(len(problems))
    mine = problems[chunk.start : chunk.stop]
    part: tuple[list, list, list[int], int, int, int, list[dict], list[int], list]
    part = ([], [], [], 0, 0, 0, [], [], [])
    if mine:
        s = sample_and_verify(
            model,
            tokenizer,
            mine,
            reward,
            template,
            k,
            temperature,
            top_p,
            max_new_tokens,
            seed + ranks.rank,
            batch_size,
            chat_kwargs,
            tools,
            attempts,
            engine,
        )
        out = s.rollout
        part = (
            s.correct,
            [s.answers[i * k : (i + 1) * k] for i in range(len(mine))],
            [len(c) for c in out.completion_ids],
            sum(f == "length" for f in out.finish_reason),
            s.scored.errors,
            s.scored.timeouts,
            sample_records(mine, s, k, chunk.start) if records is not None else [],
            out.attempts or [],
            sample_certainties(model, tokenizer.pad_token_id, s) if self_certainty else [],
        )
    parts = ranks.gather(part)
    if records is not None:
        records.extend(record for p in parts for record in p[6])
    per_problem, votes, lengths = ([x for p in parts for x in p[i]] for i in range(3))
    truncated, errors, timeouts = (sum(p[i] for p in parts) for i in range(3, 6))
    tries = [n for p in parts for n in p[7]]
    certainties = [x for p in parts for x in p[8]]
    return {
        "problems": len(problems),
        "k": k,
        "pass@1": mean_pass_at_k(per_problem, 1),
        f"pass@{k}": mean_pass_at_k(per_problem, k),
        f"maj@{k}": mean_majority_at_k(votes, per_problem, k),
        **({f"sc@{k}": mean_best_of_k(certainties, per_problem)} if self_certainty else {}),
        "response_length/mean": sum(lengths) / len(lengths),
        "truncated_frac": truncated / len(lengths),
        **({"attempts/mean": sum(tries) / len(tries)} if tries else {}),
        "reward/errors": errors,
        "reward/timeouts": timeouts,
        "seconds": time.perf_counter() - start,
    }


def evaluate_as_configured(
    model: PreTrainedModel,
    tokenizer,
    problems: list[Problem],
    reward: str,
    cfg: RLConfig,
    ranks: Ranks = ONE_PROCESS,
    engine: RolloutEngine | None = None,
) -> dict[str, float]:
    """`evaluate` with the `eval` settings of a run's config: k, temperature, top-p and budget
    (`eval.max_new_tokens`, else `rollout.max_new_tokens`), its template, seeded by
    `train.seed`; split over `ranks`; sampled by `engine` when one is given."""
    return evaluate(
        model,
        tokenizer,
        problems,
        reward=reward,
        template=cfg.data.template,
        chat_kwargs=cfg.data.chat_template_kwargs,
        k=cfg.eval.k,
        temperature=cfg.eval.temperature,
        top_p=cfg.eval.top_p,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        seed=cfg.train.seed,
        ranks=ranks,
        tools=ToolUse.of(cfg.rollout),
        attempts=(cfg.eval.attempts, cfg.rollout.retry_message),
        engine=engine,
        self_certainty=cfg.eval.self_certainty,
    )
