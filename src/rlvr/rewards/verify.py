"""Answer verification: an exact fast path, then math-verify under a hard, killable timeout.

`answers_match(predicted, gold)` decides most cases in-process and exactly: when both sides are
plain numbers (``12``, ``-0.5``, ``1,234``, ``3/4``) they are compared as `fractions.Fraction`,
so ``12`` never matches ``1.2`` and no float rounding is involved; identical normalised strings
match. Everything else goes to math-verify (``parse`` then ``verify(gold, predicted)``), which
handles LaTeX, symbolic equality, sets, intervals and equations.

math-verify runs in a worker process of a lazily created, reused `ProcessPoolExecutor`
(``forkserver`` start method where available, else ``spawn``; math-verify is preloaded in the
fork server so a replacement worker starts in milliseconds). Its own ``signal.alarm`` timeouts
are switched off in the worker (``parsing_timeout=None``, ``timeout_seconds=None``): they need the
main thread and do not cover every hang. Instead the caller waits at most ``timeout_s``; on a
timeout the pool's workers are killed, the pool is recreated on the next call, and
`VerifierTimeout` is raised for the caller to count. A call whose worker was killed because a
*concurrent* call timed out is retried once with a fresh timeout, so one hang costs only its own
score. A worker that dies on its own (e.g. out of memory) raises `VerifierError` (the parent
of `VerifierTimeout`); a pool that cannot start at all raises a plain `RuntimeError`. Verdicts
(not timeouts) are cached, since the samples of one group often share an answer.

As with any ``spawn``/``forkserver`` multiprocessing, a script that calls the verifier must
guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from fractions import Fraction
from typing import Any, TypeVar

T = TypeVar("T")

_WORKERS = min(4, max(2, os.cpu_count() or 1))
_STARTUP_TIMEOUT_S = 120.0
_CACHE_SIZE = 8192


class VerifierError(RuntimeError):
    """The verifier could not give an answer (its worker process died)."""


class VerifierTimeout(VerifierError, TimeoutError):
    """A verifier call ran past its timeout; its worker process was killed."""


# --------------------------------------------------------------------------- exact fast path

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_RATIO = re.compile(r"([+-]?\d+)/(\d+)")
_LATEX_NOISE = re.compile(r"\\left|\\right|\\[,;!: ]|\s|\$")


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number if it is a plain int, decimal or ratio ``a/b``; else None.

    Thousands commas (``1,234``) are allowed; ``$`` and whitespace are ignored.
    """
    s = re.sub(r"[\s$]", "", text)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    try:
        if _DECIMAL.fullmatch(s):
            return Fraction(s)
        ratio = _RATIO.fullmatch(s)
        if ratio and int(ratio.group(2)) != 0:
            return Fraction(int(ratio.group(1)), int(ratio.group(2)))
    except ValueError:  # e.g. more digits than int() accepts
        return None
    return None


def normalize_answer(text: str) -> str:
    """`text` without whitespace, ``$``, ``\\left``/``\\right``, spacing commands or final period;
    ``\\dfrac`` and ``\\tfrac`` become ``\\frac``."""
    s = _LATEX_NOISE.sub("", text)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


# --------------------------------------------------------------------------- worker process


def _math_verify_worker(predicted: str, gold: str) -> bool:
    """math-verify's verdict on `predicted` against `gold`; runs inside a worker process.

    Both strings are wrapped in ``$...$`` so that bare LaTeX (``\\frac{1}{2}``) is recognised.
    """
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings
    gold_parsed = parse(f"${gold.strip().strip('$')}$", parsing_timeout=None)
    predicted_parsed = parse(f"${predicted.strip().strip('$')}$", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=None))


def _ping() -> int:
    """Returns the worker's pid; used to wait until a new pool has started."""
    return os.getpid()


# The function answers_match runs in the worker; a test may swap it for one that hangs.
_VERIFY_FN: Callable[[str, str], bool] = _math_verify_worker

_pool_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_generation = 0


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context (math-verify preloaded) where available, else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["math_verify"])
        return ctx
    return multiprocessing.get_context("spawn")


def _get_pool() -> tuple[ProcessPoolExecutor, int]:
    """The shared worker pool and its generation number, started (and warmed up) if needed."""
    global _pool
    with _pool_lock:
        if _pool is None:
            pool = ProcessPoolExecutor(max_workers=_WORKERS, mp_context=_context())
            try:  # start the workers now, so start-up time never counts against a timeout
                pool.submit(_ping).result(timeout=_STARTUP_TIMEOUT_S)
            except Exception as exc:
                _kill(pool)
                # Not a VerifierError: this is no per-answer failure to score as a timeout.
                raise RuntimeError(f"could not start the verifier worker pool: {exc}") from exc
            _pool = pool
        return _pool, _generation


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill every worker of `pool` (a hung verifier ignores politer requests) and drop it."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # CPython's own field
    for process in workers:
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.join(timeout=1.0)


def _reset_pool(generation: int) -> bool:
    """Kill the pool if it is still the one of `generation`; False if another call already did."""
    global _pool, _generation
    with _pool_lock:
        if _generation != generation or _pool is None:
            return False
        _kill(_pool)
        _pool = None
        _generation += 1
        return True


def shutdown_verifier_pool() -> None:
    """Kill the verifier worker processes now; the next call starts new ones."""
    _reset_pool(_generation)


def _run_with_timeout(fn: Callable[..., T], args: tuple[Any, ...], timeout_s: float) -> T:
    """Run picklable, module-level `fn(*args)` in the worker pool; wait at most `timeout_s`.

    Raises `VerifierTimeout` (after killing the workers) on a timeout and `VerifierError` when
    the worker died. A call whose worker was killed by another call's timeout is retried once
    with a fresh timeout, so a call never takes longer than about twice `timeout_s`.
    """
    for _attempt in range(2):
        pool, generation = _get_pool()
        try:
            future = pool.submit(fn, *args)
        except (BrokenProcessPool, RuntimeError):  # killed by another call since _get_pool
            _reset_pool(generation)
            continue
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            _reset_pool(generation)
            raise VerifierTimeout(f"verifier call timed out after {timeout_s:g} s") from None
        except BrokenProcessPool as exc:
            if _reset_pool(generation):  # nobody else killed it: the worker itself died
                raise VerifierError(f"verifier worker died: {exc}") from exc
    raise VerifierError("verifier worker pool was killed twice during one call")


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _verify_in_worker(predicted: str, gold: str, timeout_s: float) -> bool:
    """Cached verdict of `_VERIFY_FN` (timeouts and errors raise, so they are never cached)."""
    return _run_with_timeout(_VERIFY_FN, (predicted, gold), timeout_s)


def answers_match(predicted: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether `predicted` is mathematically the same answer as `gold`.

    Plain numbers on both sides are compared exactly; identical normalised strings match;
    anything else is decided by math-verify in a worker process. Raises `VerifierTimeout` when
    math-verify takes longer than `timeout_s` seconds (the caller scores 0 and counts it).
    """
    predicted, gold = str(predicted).strip(), str(gold).strip()
    if not predicted or not gold:
        return False
    predicted_number, gold_number = parse_number(predicted), parse_number(gold)
    if predicted_number is not None and gold_number is not None:
        return predicted_number == gold_number
    if normalize_answer(predicted) == normalize_answer(gold):
        return True
    return _verify_in_worker(predicted, gold, float(timeout_s))


# --------------------------------------------------------------------------- timeout setting

_TIMEOUT_S: ContextVar[float] = ContextVar("rlvr_verifier_timeout_s", default=5.0)


@contextmanager
def verifier_timeout(seconds: float) -> Iterator[None]:
    """Within this block (and this thread), `current_verifier_timeout()` returns `seconds`.

    The reward composer sets it around each reward call, so a reward function keeps TRL's
    signature and still honours the configured ``reward.timeout_s``.
    """
    token = _TIMEOUT_S.set(float(seconds))
    try:
        yield
    finally:
        _TIMEOUT_S.reset(token)


def current_verifier_timeout() -> float:
    """The verifier timeout in force here (5 s unless set by `verifier_timeout`)."""
    return _TIMEOUT_S.get()
