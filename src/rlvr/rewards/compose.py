"""Weighted composition of reward functions, robust to errors, verifier timeouts and hangs.

`compose_rewards([("math", 1.0), ("format", 0.1)])` returns a `RewardComposer`; calling it on a
batch gives a `RewardOutput`: the weighted total per completion, each reward's unweighted
scores, and counts of what went wrong. Nothing a reward function does stops training:

- a call that raises (or returns the wrong number of scores) scores 0.0 for the completions of
  that call and counts one error in `errors`, with its message in `error_examples`;
- a score of NaN means "the verifier timed out" (the built-in ``math`` reward returns NaN for
  a math-verify timeout): it scores 0.0 and counts one in `timeouts`;
- a call that has not returned by its deadline is abandoned: its completions score 0.0 and
  each counts one in `timeouts`;
- ``None`` (TRL's "this reward does not apply to this sample") scores 0.0, is not counted and
  is left out of that reward's mean (`RewardOutput.not_applied`); an infinite score scores 0.0
  and counts as an error.

A reward is called as TRL calls its `reward_funcs`, by keyword: ``f(prompts=...,
completions=..., **columns, trainer_state=..., log_extra=..., log_metric=...)``; an `async
def` one is awaited in its call's thread, and a verl ``compute_score`` is called per
completion as verl calls it (`rlvr.rewards.verl_style`). One named in `conversational` gets
TRL's conversational shapes instead of texts: each prompt as its messages (`messages`, given
with the batch) and each completion as ``[{"role": "assistant", "content": text}]`` (what
`trl.rewards` expect). `trainer_state` is a `TrainerState` (the step, for rewards that change
over training); ``log_metric(name, value)`` adds a number to the step's
`reward/<reward>/<name>` metric (the mean of every value logged in the step) and
``log_extra(column, values)`` a value per completion of the call to its sample's line in
samples.jsonl (`RewardOutput.metrics`, `RewardOutput.extra`).

Completions are split into at most `max_workers` contiguous chunks; each (reward, chunk) call
runs in its own daemon thread and all of them run at once; results are put back in order, so
the output does not depend on the scheduling. Reward functions must therefore be thread-safe.

The deadline of a call on ``n`` completions is ``timeout_s * (2 * n + 2)`` (``call_timeout_s``
overrides it): each completion may take two verifier timeouts (one retry), plus two for the
call. A Python thread cannot be killed, so an abandoned call keeps running in the background
until it returns; being a daemon thread it never delays interpreter exit, and the messages of
later timeouts say how many abandoned calls are still alive. A reward that bounds every wait
itself with a killable timeout (the built-in ``math``: a verifier process is killed after
``timeout_s``) sets the attribute ``self_timed = True`` and gets no call deadline, so that a
slow start of the verifier pool never abandons it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from rlvr.rewards import openrlhf_style, verl_style
from rlvr.rewards.registry import RewardFn, get_reward
from rlvr.rewards.verify import verifier_timeout
from rlvr.tracking.jsonl import to_jsonable

_MAX_ERROR_EXAMPLES = 5
_SAMPLE_CHARS = 80
SAMPLE_KEYS = frozenset({"step", "prompt", "completion", "answer", "reward", "reward_error"})
"""The keys of a samples.jsonl line that `log_extra` columns may not take."""

PASSED_KEYWORDS = (
    "prompts",
    "completions",
    "answer",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)
"""The keywords every call of a reward in training passes (with the problem's other columns)."""


def called_their_way(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a verl ``compute_score`` or an OpenRLHF ``reward_func``, which the
    composer calls as their frameworks do rather than with TRL's keywords."""
    return verl_style.is_verl_reward(fn) or openrlhf_style.is_openrlhf_reward(fn)


def signature_mismatch(fn: Callable[..., Any]) -> str | None:
    """Why every call of reward `fn` would raise a `TypeError`, or None: a function without
    ``**kwargs`` that does not name each of `PASSED_KEYWORDS` (a verl ``compute_score`` and an
    OpenRLHF ``reward_func`` are called their own way, and a callable without a readable
    signature is given the benefit)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if called_their_way(fn) or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [name for name in PASSED_KEYWORDS if name not in named]
    if not missing:
        return None
    return (
        f"it takes ({', '.join(p.name for p in parameters)}) and no **kwargs, but a reward is "
        f"called by keyword with {', '.join(k + '=' for k in PASSED_KEYWORDS)} and the "
        f"problem's other columns, so every call would fail (no {', '.join(missing)}); take "
        "**kwargs, as TRL's rewards do (def f(prompts, completions, answer, **kwargs)), or "
        "write verl's compute_score(data_source, solution_str, ground_truth, extra_info)"
    )


_abandoned_lock = threading.Lock()
_abandoned: list[threading.Thread] = []


def _abandon(thread: threading.Thread) -> int:
    """Remember `thread` as abandoned; return how many abandoned threads are still alive."""
    with _abandoned_lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        _abandoned.append(thread)
        return len(_abandoned)


def _in_daemon_thread(fn: Callable[[], Any]) -> tuple[Future, threading.Thread]:
    """Start `fn()` in a new daemon thread; its result (or exception) arrives in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # delivered to the waiting caller, never lost
            future.set_exception(exc)

    thread = threading.Thread(target=run, name="rlvr-reward", daemon=True)
    thread.start()
    return future, thread


async def _awaited(awaitable: Any) -> Any:
    """The result of `awaitable` (asyncio.run takes coroutines only)."""
    return await awaitable


@dataclass(frozen=True)
class TrainerState:
    """Where training stands, given to every reward as `trainer_state` (TRL's keyword; the
    fields of `transformers.TrainerState` that a reward schedule reads)."""

    global_step: int = 0
    """RL steps completed before the one being scored (0 while the first is scored)."""
    max_steps: int = 0
    """Steps the run trains for (`train.steps`; 0 outside training)."""


class _CallLog:
    """What one reward call logs through TRL's `log_metric` and `log_extra` keywords."""

    def __init__(self, completions: int) -> None:
        self.completions = completions
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def log_metric(self, name: str, value: float) -> None:
        """Add `value` to metric `name` (a bad name or a value that is not a number raises,
        which makes the call an error)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"log_metric needs a metric name, got {name!r}")
        try:
            number = float(value)
        except (TypeError, ValueError) as exc:
            kind = type(value).__name__
            raise TypeError(f"log_metric({name!r}, ...) needs a number, got {kind}") from exc
        self.metrics.setdefault(name, []).append(number)

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """Set column `column` of this call's completions, one JSON value each."""
        if not isinstance(column, str) or not column or column in SAMPLE_KEYS:
            taken = sorted(SAMPLE_KEYS)
            raise ValueError(f"log_extra needs a column name other than {taken}, got {column!r}")
        values = list(values)
        if len(values) != self.completions:
            raise ValueError(
                f"log_extra({column!r}, ...) got {len(values)} values "
                f"for {self.completions} completions"
            )
        self.extra[column] = to_jsonable(values, column)


@dataclass
class RewardOutput:
    """Scores of one batch of completions."""

    total: list[float]
    """Weighted sum of the rewards, one per completion."""
    per_reward: dict[str, list[float]]
    """Unweighted scores of each reward, by name, one per completion."""
    errors: int = 0
    """Reward-function calls that raised or returned malformed scores (scored 0.0)."""
    timeouts: int = 0
    """Completions whose verifier timed out or whose verifier worker died (scored 0.0)."""
    error_examples: list[str] = field(default_factory=list)
    """A few error messages, ``"name: ExceptionType: message"``."""
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """Every value the rewards logged with `log_metric`, by ``reward/<reward>/<name>``."""
    extra: dict[str, list] = field(default_factory=dict)
    """The columns the rewards logged with `log_extra`, each a value per completion (None
    where no call logged it; where two rewards log one column, the later in the list wins)."""
    not_applied: dict[str, list[int]] = field(default_factory=dict)
    """By reward, the completions (indices, ascending) it returned None for, TRL's "does not
    apply": scored 0 in `total` and `per_reward`, left out of the reward's mean in the step's
    metrics as TRL leaves them out of `rewards/<name>/mean`. Only rewards that did."""

    def applied(self, name: str) -> list[bool]:
        """Per completion, whether reward `name` applied to it (did not return None)."""
        mask = [True] * len(self.total)
        for index in self.not_applied.get(name, ()):
            mask[index] = False
        return mask


def _put_column(extra: dict[str, list], column: str, values: list, start: int, n: int) -> None:
    """Write `values` into `extra[column]` (n values, None until written) from `start` on."""
    extra.setdefault(column, [None] * n)[start : start + len(values)] = values


def concat_outputs(outputs: Sequence[RewardOutput]) -> RewardOutput:
    """One output for the completions of `outputs`, in order (a step's sampling rounds, the
    ranks' chunks): scores, counts, examples and logged values put end to end."""
    n = sum(len(out.total) for out in outputs)
    merged = RewardOutput(total=[], per_reward={name: [] for name in outputs[0].per_reward})
    for out in outputs:
        start = len(merged.total)
        merged.total.extend(out.total)
        for name, scores in out.per_reward.items():
            merged.per_reward[name].extend(scores)
        merged.errors += out.errors
        merged.timeouts += out.timeouts
        merged.error_examples.extend(out.error_examples)
        for name, values in out.metrics.items():
            merged.metrics.setdefault(name, []).extend(values)
        for column, values in out.extra.items():
            _put_column(merged.extra, column, values, start, n)
        for name, indices in out.not_applied.items():
            merged.not_applied.setdefault(name, []).extend(start + i for i in indices)
    return merged


@dataclass
class _ChunkResult:
    scores: list[float]
    errors: int = 0
    timeouts: int = 0
    messages: list[str] = field(default_factory=list)
    log: _CallLog | None = None
    """What the call logged (None when it failed: its values are dropped with its scores)."""
    not_applied: list[int] = field(default_factory=list)
    """The completions of the chunk (indices) the reward returned None for."""


def _chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """`chunks` contiguous, near-equal [start, end) ranges covering range(n)."""
    chunks = max(1, min(chunks, n))
    size, extra = divmod(n, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + size + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _convert(name: str, raw: Any, completions: list[str]) -> _ChunkResult:
    """Validate a reward function's return value and turn it into floats."""
    n = len(completions)
    if raw is None or isinstance(raw, (str, bytes)) or len(raw) != n:
        got = "None" if raw is None else f"{len(raw)} scores" if hasattr(raw, "__len__") else raw
        raise ValueError(f"returned {got} for {n} completions")
    result = _ChunkResult(scores=[])
    for index, (value, completion) in enumerate(zip(raw, completions, strict=True)):
        if value is None:
            result.not_applied.append(index)
        score = 0.0 if value is None else float(value)
        message = None
        if math.isnan(score):
            result.timeouts += 1
            sample = completion[:_SAMPLE_CHARS]
            message = f"{name}: timeout: NaN (verifier timed out) for {sample!r}"
            score = 0.0
        elif math.isinf(score):
            result.errors += 1
            message = f"{name}: ValueError: non-finite score {score}"
            score = 0.0
        if message is not None and len(result.messages) < _MAX_ERROR_EXAMPLES:
            result.messages.append(message)
        result.scores.append(score)
    return result


class RewardComposer:
    """Weighted sum of named reward functions; call it on a batch to get a `RewardOutput`."""

    def __init__(
        self,
        specs: Sequence[tuple[str, float]],
        max_workers: int = 4,
        timeout_s: float = 5.0,
        call_timeout_s: float | None = None,
        conversational: frozenset[str] = frozenset(),
    ) -> None:
        """Resolve every reward name now, so a typo fails before training starts."""
        if not specs:
            raise ValueError("compose_rewards needs at least one (name, weight) pair")
        names = [name for name, _ in specs]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"reward(s) listed twice: {', '.join(duplicates)}")
        self.weights: dict[str, float] = {name: float(weight) for name, weight in specs}
        self.functions: dict[str, RewardFn] = {
            name: openrlhf_style.as_trl_reward(verl_style.as_trl_reward(get_reward(name)))
            for name in names
        }
        self.max_workers = max(1, int(max_workers))
        self.timeout_s = float(timeout_s)
        self.call_timeout_s = None if call_timeout_s is None else float(call_timeout_s)
        unknown = sorted(set(conversational) - set(names))
        if unknown:
            raise ValueError(f"conversational reward(s) {unknown} are not among {names}")
        self.conversational = frozenset(conversational)

    def __repr__(self) -> str:
        specs = ", ".join(f"{name}×{weight:g}" for name, weight in self.weights.items())
        return f"RewardComposer({specs})"

    def deadline(self, name: str, n: int) -> float | None:
        """Seconds a call of reward `name` on `n` completions may take; None: no deadline."""
        if getattr(self.functions[name], "self_timed", False):
            return None
        if self.call_timeout_s is not None:
            return self.call_timeout_s
        return self.timeout_s * (2 * n + 2)

    def _score_chunk(
        self,
        name: str,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list],
        messages: list[list[dict[str, str]]] | None,
        state: TrainerState,
    ) -> _ChunkResult:
        """One call of reward `name` on one chunk; never raises."""
        shown: tuple[list, list] = (prompts, completions)
        if name in self.conversational:
            replies = [[{"role": "assistant", "content": text}] for text in completions]
            shown = (messages or [[{"role": "user", "content": p}] for p in prompts], replies)
        log = _CallLog(len(completions))
        keywords = {
            **columns,
            "trainer_state": state,
            "log_extra": log.log_extra,
            "log_metric": log.log_metric,
        }
        try:
            with verifier_timeout(self.timeout_s):
                raw = self.functions[name](prompts=shown[0], completions=shown[1], **keywords)
                if inspect.isawaitable(raw):  # an `async def` reward (TRL awaits them too)
                    raw = asyncio.run(_awaited(raw))
            result = _convert(name, raw, completions)
            result.log = log
            return result
        except (Exception, SystemExit) as exc:  # a reward calling sys.exit() is an error too
            message = f"{name}: {type(exc).__name__}: {exc}"
            return _ChunkResult([0.0] * len(completions), errors=1, messages=[message])

    def _abandoned_result(
        self, name: str, completions: list[str], seconds: float, thread: threading.Thread
    ) -> _ChunkResult:
        """The result of a call that missed its deadline: zeros, each completion a timeout."""
        alive = _abandon(thread)
        sample = completions[0][:_SAMPLE_CHARS] if completions else ""
        message = (
            f"{name}: timeout: no result after {seconds:.3g} s for {len(completions)} "
            f"completion(s), call abandoned ({alive} abandoned call(s) still running); "
            f"first completion {sample!r}"
        )
        n = len(completions)
        return _ChunkResult([0.0] * n, timeouts=n, messages=[message])

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: dict[str, Sequence[Any]] | None = None,
        messages: Sequence[list[dict[str, str]]] | None = None,
        state: TrainerState = TrainerState(),
    ) -> RewardOutput:
        """Score `completions` (aligned with `prompts`, with every list in `columns` and with
        `messages`, each prompt's conversation, which the `conversational` rewards get; without
        it, a prompt stands for its one user turn); every call gets `state` as
        `trainer_state`."""
        n = len(completions)
        columns = columns or {}
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        for key, values in columns.items():
            if len(values) != n:
                rows = len(values)
                raise ValueError(f"reward column {key!r} has {rows} rows for {n} completions")
        bounds = _chunk_bounds(n, self.max_workers)
        tasks = [
            (name, list(prompts[a:b]), list(completions[a:b]),
             {key: list(values[a:b]) for key, values in columns.items()},
             None if messages is None else list(messages[a:b]), state)
            for name in self.functions
            for a, b in bounds
        ]  # fmt: skip
        starts = [a for _ in self.functions for a, _ in bounds]
        started = time.monotonic()
        running = [_in_daemon_thread(lambda task=task: self._score_chunk(*task)) for task in tasks]
        results = []
        for (name, _, chunk, *_), (future, thread) in zip(tasks, running, strict=True):
            deadline = self.deadline(name, len(chunk))
            wait = None if deadline is None else max(0.0, started + deadline - time.monotonic())
            try:
                results.append(future.result(timeout=wait))
            except FutureTimeout:
                results.append(self._abandoned_result(name, chunk, deadline or 0.0, thread))

        output = RewardOutput(total=[0.0] * n, per_reward={name: [] for name in self.functions})
        for (name, *_), start, result in zip(tasks, starts, results, strict=True):
            output.per_reward[name].extend(result.scores)
            if result.not_applied:
                output.not_applied.setdefault(name, []).extend(
                    start + i for i in result.not_applied
                )
            if result.log is not None:
                for metric, values in result.log.metrics.items():
                    output.metrics.setdefault(f"reward/{name}/{metric}", []).extend(values)
                for column, values in result.log.extra.items():
                    _put_column(output.extra, column, values, start, n)
            output.errors += result.errors
            output.timeouts += result.timeouts
            room = _MAX_ERROR_EXAMPLES - len(output.error_examples)
            output.error_examples.extend(result.messages[: max(room, 0)])
        for name, scores in output.per_reward.items():
            weight = self.weights[name]
            output.total = [t + weight * s for t, s in zip(output.total, scores, strict=True)]
        return output


def compose_rewards(
    specs: Sequence[tuple[str, float]],
    max_workers: int = 4,
    timeout_s: float = 5.0,
    call_timeout_s: float | None = None,
    conversational: frozenset[str] = frozenset(),
) -> RewardComposer:
    """A `RewardComposer` for `(name, weight)` pairs (registered names or import paths).

    `max_workers` chunks of completions are scored in parallel per reward (1 = one call per
    reward); `timeout_s` is the hard timeout of one verifier call (see `rlvr.rewards.verify`);
    `call_timeout_s` replaces the deadline ``timeout_s * (2 * n + 2)`` of a reward call on
    ``n`` completions (rewards marked ``self_timed`` have none); the rewards named in
    `conversational` get TRL's conversational shapes.
    """
    return RewardComposer(
        specs,
        max_workers=max_workers,
        timeout_s=timeout_s,
        call_timeout_s=call_timeout_s,
        conversational=conversational,
    )
