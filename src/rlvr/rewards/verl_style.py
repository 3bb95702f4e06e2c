"""verl's reward functions, called the way verl's reward manager calls them.

verl scores one response at a time with ``compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)`` (its `custom_reward_function`; the dataset's
``data_source`` and ``extra_info`` columns, the ground truth of ``reward_model``) and takes a
float, or a dict whose ``"score"`` is the reward and whose other entries verl logs beside it.
`as_trl_reward` turns such a function into a TRL-signature reward for the composer: a function
whose parameters include ``solution_str`` is called once per completion with the keywords it
accepts; the ground truth is the problem's answer (`data.answer_column`, e.g.
``reward_model.ground_truth``), and the other entries of a returned dict are logged with
`log_extra` (every one) and `log_metric` (the mean of the numbers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr.rewards import foreign

VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


def is_verl_reward(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has verl's signature (a ``solution_str`` parameter)."""
    return foreign.takes(fn, "solution_str")


def _score(
    call: Callable[..., Any],
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, Any],
) -> tuple[list[Any], dict[str, list[Any]]]:
    """verl's way: one call per completion; a dict's `score` is the reward, its other entries
    logged beside it."""
    n = len(completions)
    answers = columns.get("answer", [None] * n)
    sources = columns.get("data_source", [None] * n)
    extras = columns.get("extra_info", [None] * n)
    scores: list[Any] = []
    logged: dict[str, list[Any]] = {}
    for i, completion in enumerate(completions):
        out = call(
            data_source=sources[i],
            solution_str=completion,
            ground_truth=answers[i],
            extra_info=extras[i],
        )
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError(f"returned a dict without 'score' (keys {sorted(out)})")
            for key, value in out.items():
                if key != "score":
                    logged.setdefault(key, [None] * n)[i] = value
            out = out["score"]
        scores.append(out)
    return scores, logged


def as_trl_reward(fn: Callable[..., Any]) -> Callable[..., list[Any]]:
    """`fn` itself, or for a verl ``compute_score`` a TRL-signature reward calling it once per
    completion."""
    return foreign.as_trl_reward(fn, VERL_ARGUMENTS, _score) if is_verl_reward(fn) else fn
