"""Prompt curation (`rlvr curate`): drop duplicate problems, then keep those whose pass rate
under the model lies in a band.

Kimi k1.5 (§2.1, RL prompt set curation) estimates each prompt's difficulty as the pass rate
of an SFT model's samples and balances the set by it; Skywork-OR1's data preparation likewise
filters prompts by the starting model's pass rate. A prompt whose samples all score alike gives
group-baseline advantages of zero, so the always- and never-solved ones cost rollouts for
nothing. Here: `curate.samples_per_prompt` samples per problem, verified by the
task's reward; a problem is kept when `curate.min_pass_rate <= p <= curate.max_pass_rate`.

Duplicates are questions equal after case folding and whitespace collapsing (exact match, not
the n-gram or embedding near-duplicate search of large pipelines); the first one is kept.
The output is a JSONL file in the format of `data.task=file` (`prompt`, `answer`, then the
problem's `solution` when it has one, its extra columns and its measured `pass_rate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.config_offline import CurateConfig
from rlvr.data.problem import Problem
from rlvr.data.tasks import load_task, require_gold_answers
from rlvr.evaluation.engines import sampling_engine
from rlvr.evaluation.evaluate import sample_and_verify
from rlvr.models.loading import load_model_and_tokenizer
from rlvr.rollout.tools import ToolUse
from rlvr.tracking.jsonl import JsonlWriter


def normalized_question(text: str) -> str:
    """The question as duplicates are compared: case-folded, runs of whitespace made one space."""
    return " ".join(text.casefold().split())


def drop_duplicates(problems: list[Problem]) -> list[Problem]:
    """The problems in order, without those whose normalised question came earlier."""
    seen: set[str] = set()
    kept = []
    for problem in problems:
        key = normalized_question(
            problem.question if problem.messages is None else json.dumps(problem.messages)
        )
        if key not in seen:
            seen.add(key)
            kept.append(problem)
    return kept


@dataclass
class CurationSummary:
    """What curation did to the problems, by reason."""

    problems: int
    duplicates: int
    too_hard: int
    """Pass rate below `curate.min_pass_rate`."""
    too_easy: int
    """Pass rate above `curate.max_pass_rate`."""
    kept: int
    output: str


def curate_row(problem: Problem, pass_rate: float) -> dict:
    """One output row in the `data.task=file` format."""
    row = {"prompt": problem.prompt, "answer": problem.answer}
    if problem.solution is not None:
        row["solution"] = problem.solution
    return {**row, **problem.columns, "pass_rate": pass_rate}


def _check_output(path: Path) -> None:
    """Make the folder of `curate.output` now, so that a path that cannot take the file is
    refused before the sampling, not after it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"curate.output={str(path)!r}: cannot make its folder: {error}") from None
    if path.is_dir():
        raise ConfigError(f"curate.output={str(path)!r} is a directory; name a JSONL file")


def run_curate(cfg: CurateConfig) -> CurationSummary:
    """Deduplicate the task's training problems, measure their pass rates with the model, and
    write the problems within the band to `curate.output`."""
    c = cfg.curate
    output = Path(c.output)
    _check_output(output)
    task = load_task(cfg.data)
    problems = task.train[: c.max_problems] if c.max_problems else task.train
    require_gold_answers(task, problems, cfg.data.path, "pass rates are measured against one")
    unique = drop_duplicates(problems) if c.dedup else problems
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=c.seed)
    tools, chat_kwargs = ToolUse.of(c), cfg.data.chat_template_kwargs
    engine = sampling_engine(
        c, model, tokenizer, unique, cfg.data.template, c.max_new_tokens, chat_kwargs, tools,
        engine_named=f"curate.engine={c.engine}",
    )  # fmt: skip
    try:
        verified = sample_and_verify(
            model,
            tokenizer,
            unique,
            task.reward,
            cfg.data.template,
            c.samples_per_prompt,
            c.temperature,
            1.0,
            c.max_new_tokens,
            c.seed,
            chat_kwargs=chat_kwargs,
            tools=tools,
            engine=engine,
        )
    finally:
        if engine is not None:
            engine.close()
    rates = [sum(correct) / len(correct) for correct in verified.correct]
    keep = [c.min_pass_rate <= rate <= c.max_pass_rate for rate in rates]
    summary = CurationSummary(
        problems=len(problems),
        duplicates=len(problems) - len(unique),
        too_hard=sum(rate < c.min_pass_rate for rate in rates),
        too_easy=sum(rate > c.max_pass_rate for rate in rates),
        kept=sum(keep),
        output=c.output,
    )
    if not summary.kept:
        raise ConfigError(
            f"curate: no problem had a pass rate in [{c.min_pass_rate}, {c.max_pass_rate}] "
            f"({summary.too_hard} below, {summary.too_easy} above, {summary.duplicates} "
            "duplicates); widen curate.min_pass_rate / curate.max_pass_rate"
        )
    output.unlink(missing_ok=True)
    with JsonlWriter(output) as writer:
        for problem, rate, kept in zip(unique, rates, keep):
            if kept:
                writer.write(curate_row(problem, rate))
    return summary
