"""What verl's and OpenRLHF's rewards share in rlvr: each is told apart from a TRL reward by
one parameter name (`verl_style`, `openrlhf_style`), called with only the keywords of its
framework that it takes, and what it returns beside the rewards is logged the same way.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any


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
