"""Name → function registries for the choices that multiply (verl's pattern, simplified).

A registry maps a config string (``algorithm.advantage: grpo``) to a plain function. Adding an
estimator or a loss is one decorated function; a duplicate name is refused at import time, and
an unknown name fails with the valid names and the closest match, so a typo in a YAML file
reads as a typo rather than a stack trace.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


def same_definition(old: Callable, new: Callable) -> bool:
    """Whether `new` is `old`'s definition run again: a notebook cell run twice, or a module
    reloaded (the same module and qualified name, not a lambda's, which any two lambdas of a
    scope share); a registry lets it replace `old`."""
    name = getattr(new, "__qualname__", None)
    if not isinstance(name, str) or name.endswith("<lambda>"):
        return False
    where = [(getattr(f, "__module__", None), getattr(f, "__qualname__", None)) for f in (old, new)]
    return where[0] == where[1]


class Registry(Generic[F]):
    """A named collection of functions of one kind (``"advantage estimator"``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register the function under ``name``; a name already taken is refused,
        unless by the same definition run again (`same_definition`), which replaces it.

        Raises:
            ValueError: if ``name`` is already registered in this registry by another function.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._entries and not same_definition(self._entries[name], fn):
                existing = self._entries[name]
                raise ValueError(
                    f"{self.kind} {name!r} is already registered "
                    f"(by {getattr(existing, '__module__', '?')}."
                    f"{getattr(existing, '__qualname__', existing)!s})"
                )
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered as ``name``.

        Raises:
            KeyError: naming the valid choices and, when there is one, the closest match.
        """
        try:
            return self._entries[name]
        except KeyError:
            pass
        valid = self.names()
        close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"unknown {self.kind} {name!r}{hint} (valid choices: {', '.join(valid) or 'none'})"
        ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


ADVANTAGES: Registry = Registry("advantage estimator")
"""Outcome-reward advantage estimators: ``fn(rewards[N], group_ids[N], *, std_normalization,
epsilon) -> advantages[N]``."""

POLICY_LOSSES: Registry = Registry("policy loss")
"""Per-token policy-gradient losses: ``fn(logprobs, old_logprobs, advantages, response_mask, *,
clip_low, clip_high, **kwargs) -> PolicyLossOutput``."""

AGGREGATIONS: Registry = Registry("loss aggregation")
"""Token values → one scalar over the global optimizer step: ``fn(token_values, mask, *,
num_tokens, num_seqs, max_len) -> Tensor[]``."""

KL_ESTIMATORS: Registry = Registry("KL estimator")
"""Per-token estimators of KL(π_θ ‖ π_ref): ``fn(logprobs, ref_logprobs) -> Tensor``."""

PREFERENCE_LOSSES: Registry = Registry("preference loss")
"""Offline pairwise preference losses: ``fn(chosen_logps[P], rejected_logps[P],
ref_chosen_logps[P], ref_rejected_logps[P], chosen_lengths[P], rejected_lengths[P], *, beta,
gamma, label_smoothing) -> PreferenceLossOutput``."""
