"""OpenRLHF's reward functions, called the way OpenRLHF calls them.

OpenRLHF scores a whole batch with ``reward_func(queries, prompts, labels)`` (the file its
``--remote_rm_url`` names): ``queries`` are the prompts with their responses appended,
``labels`` the dataset's ``--label_key`` column, and the result is a tensor of rewards or a
dict whose ``"rewards"`` are the rewards, with ``"scores"`` (which its dynamic filtering
reads) and ``"extra_logs"`` (logged beside them). `as_trl_reward` turns such a function into
a TRL-signature reward for the composer: a function whose parameters include ``queries`` is
called once per chunk with the keywords it accepts; the labels are the problems' answers
(`data.answer_column`), and each entry of ``extra_logs`` is logged with `log_extra` (one value
per completion) and `log_metric` (their mean). ``scores`` is not read: rlvr's dynamic
sampling compares the rewards themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr.rewards import foreign

OPENRLHF_ARGUMENTS = ("queries", "prompts", "labels")


def is_openrlhf_reward(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has OpenRLHF's signature (a ``queries`` parameter)."""
    return foreign.takes(fn, "queries")


def _values(out: Any, n: int, what: str) -> list[Any]:
    """`out` (a tensor, array or sequence of n numbers) as a list of n Python values."""
    values = out.tolist() if hasattr(out, "tolist") else out
    if not isinstance(values, list | tuple) or len(values) != n:
        raise ValueError(f"{what}: expected {n} values, one per completion, got {out!r:.80}")
    return list(values)


def _score(
    call: Callable[..., Any],
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, Any],
) -> tuple[list[Any], dict[str, list[Any]]]:
    """OpenRLHF's way: one call per chunk, the queries each prompt with its completion
    appended; a dict's `rewards` are the rewards, its `extra_logs` logged beside them."""
    n = len(completions)
    out = call(
        queries=[f"{p}{c}" for p, c in zip(prompts, completions, strict=True)],
        prompts=list(prompts),
        labels=list(columns.get("answer", [None] * n)),
    )
    logged = {}
    if isinstance(out, dict):
        if "rewards" not in out:
            raise ValueError(f"returned a dict without 'rewards' (keys {sorted(out)})")
        for key, values in (out.get("extra_logs") or {}).items():
            logged[key] = _values(values, n, f"extra_logs[{key!r}]")
        out = out["rewards"]
    return _values(out, n, "rewards"), logged


def as_trl_reward(fn: Callable[..., Any]) -> Callable[..., list[Any]]:
    """`fn` itself, or for an OpenRLHF ``reward_func`` a TRL-signature reward calling it once
    per chunk of completions."""
    return foreign.as_trl_reward(fn, OPENRLHF_ARGUMENTS, _score) if is_openrlhf_reward(fn) else fn
