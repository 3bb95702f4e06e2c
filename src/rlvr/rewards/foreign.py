"""What verl's and OpenRLHF's rewards share in rlvr: each is told apart from a TRL reward by
one parameter name (`verl_style`, `openrlhf_style`), called with only the keywords of its
framework that it takes, and what it returns beside the rewards is logged the same way.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

Scorer = Callable[
    [Callable[..., Any], Sequence[Any], Sequence[str], dict[str, Any]],
    tuple[list[Any], dict[str, list[Any]]],
]
"""``score(call, prompts, completions, columns) -> (rewards, {key: one value per completion})``,
where ``call(**keywords)`` calls the framework's function with those of its keywords it takes."""


def takes(fn: Callable[..., Any], parameter: str) -> bool:
    """Whether `fn` has a parameter named `parameter` (False for a builtin or other callable
    whose signature cannot be read)."""
    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def accepted(fn: Callable[..., Any], names: tuple[str, ...]) -> set[str]:
    """The keywords among `names` that `fn` takes (all of them when it takes ``**kwargs``)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return set(names)
    return {p.name for p in parameters} & set(names)


def as_trl_reward(
    fn: Callable[..., Any], names: tuple[str, ...], score: Scorer
) -> Callable[..., list[Any]]:
    """A TRL-signature reward that scores a chunk with `score`, calling `fn` with only the
    keywords among `names` that it takes, and logs each value `score` returns beside the
    rewards (`log_values`)."""
    taken = accepted(fn, names)

    def call(**given: Any) -> Any:
        return fn(**{key: value for key, value in given.items() if key in taken})

    @functools.wraps(fn)
    def reward(
        prompts: Sequence[Any],
        completions: Sequence[str],
        log_extra: Callable[[str, list], None],
        log_metric: Callable[[str, float], None],
        **columns: Any,
    ) -> list[Any]:
        scores, logged = score(call, prompts, completions, columns)
        for key, values in logged.items():
            log_values(log_extra, log_metric, key, values)
        return scores

    return reward


def log_values(
    log_extra: Callable[[str, list], None],
    log_metric: Callable[[str, float], None],
    key: str,
    values: list[Any],
) -> None:
    """One value per completion of `key`: each on its sample's line (`log_extra`), the mean of
    the finite numbers among them (not bools) as the step's metric (`log_metric`)."""
    log_extra(key, values)
    numbers = [
        v
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    if numbers:
        log_metric(key, sum(numbers) / len(numbers))
