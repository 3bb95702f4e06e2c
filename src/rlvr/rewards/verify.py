"""Answer verification: an exact fast path, then math-verify under a hard, killable timeout.

`answers_match(predicted, gold)` decides most cases in-process and exactly: when both sides are
plain numbers (``12``, ``-0.5``, ``1,234``, ``3/4``, ``\\frac{3}{4}``, ``1.5e-3``, ``50\\%``,
``5 \\text{cm}``; see `parse_number`) or lists of them, they are compared as
`fractions.Fraction`, so ``12`` never matches ``1.2`` and no float rounding is involved.
The rules of the fast path:

- equal values match; a decimal matches a value it rounds (half to even) or truncates to its
  own places only when it has at least 6 places: ``0.333333`` and ``0.3333333`` match ``1/3``,
  ``0.333`` does not, and ``5.0000001`` never matches ``5`` (math-verify's ``float_rounding=6``,
  without its absolute rounding of both sides, which would make ``0.0000001`` equal ``0``);
- ``p%`` is ``p/100``, and the percent sign may be dropped on either side (``50\\%`` matches
  ``0.5`` and ``50``; math-verify does the latter for integers only);
- one trailing unit is dropped (``\\text{cm}``, ``5 dollars``, ``90^\\circ``, ``\\$5``);
  ``2 million`` is 2000000;
- lists (``1, 2``, ``\\{1; 2\\}``, ``1 and 2``) match as sets, so ``1`` never matches ``1, 2``;
- when only one side is an assignment (``x = 3``) its left side is dropped.

Then identical normalised strings match, and everything else goes to math-verify (``parse``
then ``verify(gold, predicted)``), which handles LaTeX, symbolic equality, sets, intervals and
equations; a predicted answer over 1,000 characters is not sent (it matches nothing).

math-verify runs in a worker process of a lazily created, reused `ProcessPoolExecutor`
(``forkserver`` start method where available, else ``spawn``). The fork server preloads a
warmed-up math-verify (`rlvr.rewards._verifier_preload`), so a worker, first or replacement,
starts in milliseconds, and it never runs the parent's main script: neither does a worker,
which multiprocessing would otherwise make re-run it before its first task (for a script that
imports torch, about 1.5 s of CPU). The workers run only this module's functions.
math-verify's own ``signal.alarm`` timeouts are switched off in the worker
(``parsing_timeout=None``, ``timeout_seconds=None``): they need the main thread and do not
cover every hang. Instead the caller waits at most ``timeout_s``; on a
timeout the pool's workers are killed, the pool is recreated on the next call, and
`VerifierTimeout` is raised for the caller to count. A call whose worker was killed because a
*concurrent* call timed out is retried once with a fresh timeout, so one hang costs only its own
score. A worker that dies on its own (e.g. out of memory) raises `VerifierError` (the parent
of `VerifierTimeout`); a pool that cannot start at all raises a plain `RuntimeError`. Verdicts
(not timeouts) are cached, since the samples of one group often share an answer. The workers
ignore SIGINT: a Ctrl-C at the terminal reaches the whole process group, and the parent decides
what it means (`rlvr.training.stopping` finishes the step, whose rewards need the workers).

So with ``forkserver`` a script that calls the verifier needs no ``if __name__ ==
"__main__":`` guard; with ``spawn`` (no fork server: macOS, Windows) it needs one, as with
any ``spawn`` multiprocessing.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import multiprocessing.spawn
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
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

_MAX_NUMBER_CHARS = 4000  # below CPython's 4300-digit limit on int(str)
_MAX_EXPONENT = 1000  # "1e99999" is left to math-verify (and its timeout), not expanded here
_MAX_VERIFY_CHARS = 1000  # a longer predicted answer is never sent to math-verify
_APPROX_MIN_PLACES = 6

_SPACING = re.compile(r"\\(?:left|right|displaystyle|q?quad)\b|\\[,;:! ]|~")
_WHITESPACE = re.compile(r"\s+")
_THIN_THOUSANDS = re.compile(r"(?<=\d)(?:\\,|\{,\})(?=\d{3}(?!\d))")
_MATH_DELIMITER = re.compile(r"(?<!\\)\$")
_CURRENCY = re.compile(r"^(?:\\\$|[$€£¥]|\\(?:pounds|euro)\b)")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathbf|mathrm|textrm|mbox)\{([^{}]*)\}")
_DEGREES = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)$")
_UNIT_POWER = r"(?:\^\{?[23]\}?|[²³])?"
_TEXT_UNIT = re.compile(
    r"\\(?:text|mathrm|textrm|mbox)\{\s*([A-Za-z][A-Za-z /.]*)\}" + _UNIT_POWER + r"$"
)
_WORD_UNIT = re.compile(r"(?<=[\d%}\s])\s*\b([A-Za-z]{3,}(?:/[A-Za-z]+)?)\.?" + _UNIT_POWER + r"$")
_NOT_UNITS = frozenset(
    {"and", "not", "mod", "pmod", "times", "cdot", "div", "over", "choose", "sqrt", "inf"}
    | {"infty", "infinity", "pi", "log", "ln", "exp", "sin", "cos", "tan", "sec", "csc", "cot"}
)
_SCALE_WORDS = {
    "hundred": 100,
    "thousand": 10**3,
    "million": 10**6,
    "billion": 10**9,
    "trillion": 10**12,
}
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")
_NUMBER_CORE = re.compile(
    r"(?P<sign>[+-]?)(?:"
    r"\\[dt]?frac(?:\{(?P<fnum>\d+)\}\{(?P<fden>\d+)\}|(?P<fnum1>\d)(?P<fden1>\d))"
    r"|(?P<num>\d+)/(?P<den>\d+)"
    r"|(?P<int>\d{1,3}(?:,\d{3})+|\d+)?(?:\.(?P<frac>\d*))?"
    r"(?:[eE](?P<exp>[+-]?\d+)"
    r"|(?:\\times|\\cdot|\*|×)10\^(?:\{(?P<exp2>[+-]?\d+)\}|(?P<exp3>\d)))?"
    r")"
)
_LIST_SEPARATOR = re.compile(r";|,(?!\d{3}(?!\d))|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b")
_SET_BRACES = re.compile(r"^\\\{(.*)\\\}$", re.DOTALL)


@dataclass(frozen=True)
class _Number:
    """A plain number as written: its value, and how it was written."""

    value: Fraction
    """The value; ``p/100`` for a percentage ``p%``."""
    percent: Fraction | None = None
    """``p`` when written as ``p%``."""
    places: int | None = None
    """Decimal places of a decimal (``0.250`` → 3, ``1.5e-3`` → 4); None for ints and ratios."""

    def readings(self) -> list[tuple[Fraction, int | None]]:
        """The values this number may stand for, each with its decimal places."""
        if self.percent is None:
            return [(self.value, self.places)]
        places = None if self.places is None else self.places + 2
        return [(self.value, places), (self.percent, self.places)]


def _squeeze(text: str) -> str:
    """`text` without LaTeX spacing commands and whitespace, except that a space between two
    digits stays (one space): ``1 2`` is not ``12``. A thin space or ``{,}`` before three
    digits is a thousands separator: ``1\\,000`` → ``1000``."""
    s = _SPACING.sub(" ", _THIN_THOUSANDS.sub("", text))

    def keep_between_digits(match: re.Match[str]) -> str:
        before, after = s[match.start() - 1 : match.start()], s[match.end() : match.end() + 1]
        return " " if before.isdigit() and after.isdigit() else ""

    return _WHITESPACE.sub(keep_between_digits, s)


def _strip_unit(s: str) -> tuple[str, Fraction, bool]:
    """`s` without one trailing unit, the scale the unit implied (``5 million`` → 10**6) and
    whether it was the word ``percent``."""
    match = _TEXT_UNIT.search(s) or _WORD_UNIT.search(s)
    if match is None:
        return s, Fraction(1), False
    word = match.group(1).strip().lower()
    if word in _NOT_UNITS:
        return s, Fraction(1), False
    return s[: match.start()].rstrip(), Fraction(_SCALE_WORDS.get(word, 1)), word == "percent"


def _core_number(s: str) -> _Number | None:
    """`s` (no spacing, no units) as a number: int, decimal, scientific or ratio."""
    match = _NUMBER_CORE.fullmatch(s)
    if match is None or not s.strip("+-"):
        return None
    sign = -1 if match["sign"] == "-" else 1
    if match["fnum"] or match["fnum1"]:
        numerator = int(match["fnum"] or match["fnum1"])
        denominator = int(match["fden"] or match["fden1"])
    elif match["num"]:
        numerator, denominator = int(match["num"]), int(match["den"])
    else:
        if match["int"] is None and not match["frac"]:
            return None  # "." or "e5"
        digits = (match["int"] or "0").replace(",", "") + "." + (match["frac"] or "")
        exponent = int(match["exp"] or match["exp2"] or match["exp3"] or 0)
        if abs(exponent) > _MAX_EXPONENT:
            return None
        value = Fraction(digits) * Fraction(10) ** exponent
        written_as_decimal = match["frac"] is not None or exponent != 0
        places = max(0, len(match["frac"] or "") - exponent) if written_as_decimal else None
        return _Number(sign * value, places=places)
    if denominator == 0:
        return None
    return _Number(Fraction(sign * numerator, denominator))


def _parse_plain(text: str) -> _Number | None:
    """`text` as a plain number, or None: see `parse_number` for what counts."""
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    s = _MATH_DELIMITER.sub("", text.replace("−", "-")).strip()
    text_wrapped = _TEXT_WRAPPER.fullmatch(s)
    s = text_wrapped.group(1).strip() if text_wrapped else s
    s = _CURRENCY.sub("", s).strip()
    s = _DEGREES.sub("", s).rstrip()
    s, scale, percent = _strip_unit(s)
    for suffix in ("\\%", "%"):
        if not percent and s.endswith(suffix):
            s, percent = s[: -len(suffix)], True
    s = _squeeze(s)
    try:
        number = _core_number(s)
    except (ValueError, OverflowError):  # e.g. more digits than int() accepts
        return None
    if number is None:
        return None
    value = number.value * scale
    places = number.places if scale == 1 else None
    if percent:
        return _Number(value / 100, percent=value, places=places)
    return _Number(value, places=places)


def _parse_plain_list(text: str) -> list[_Number] | None:
    """`text` as a list of plain numbers (``1, 2``, ``\\{1; 2\\}``, ``1 and 2``), or None."""
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    s = text.strip().strip("$").strip()
    braces = _SET_BRACES.fullmatch(s)
    s = braces.group(1) if braces else s
    numbers = []
    for part in _LIST_SEPARATOR.split(s):
        number = _parse_plain(part)
        if number is None:
            return None
        numbers.append(number)
    return numbers


def _approximations(value: Fraction, places: int) -> tuple[Fraction, Fraction]:
    """`value` rounded (half to even) and truncated (toward zero) to `places` decimals."""
    scale = 10**places
    return round(value, places), Fraction(math.trunc(value * scale), scale)


def _numbers_match(a: _Number, b: _Number) -> bool:
    """Equal values, or a decimal of 6 or more places that rounds or truncates the other."""
    for x, x_places in a.readings():
        for y, y_places in b.readings():
            if x == y:
                return True
            if (x_places or 0) >= _APPROX_MIN_PLACES and x in _approximations(y, x_places):
                return True
            if (y_places or 0) >= _APPROX_MIN_PLACES and y in _approximations(x, y_places):
                return True
    return False


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number if it is a plain number; else None.

    Plain: an int or decimal (``-3``, ``2.50``, ``.5``, thousands ``1,234``, ``1\\,234`` or
    ``1{,}234``), scientific (``1.5e-3``, ``1.5 \\times 10^{-3}``), a ratio (``3/4``,
    ``\\frac{3}{4}``, ``\\dfrac34``), with an optional sign (``-`` or ``−``), ``$``
    delimiters, a currency sign (``\\$5``), a degree sign, a percent sign (``50\\%`` → 1/2)
    and one trailing unit (``5 \\text{cm}``, ``5 dollars``; a plain word needs 3 letters and
    must not be a math word such as ``pi``; ``2 million`` → 2000000). LaTeX spacing commands
    are ignored.
    """
    number = _parse_plain(text)
    return None if number is None else number.value


def normalize_answer(text: str) -> str:
    """`text` without ``$``, ``\\left``/``\\right``, spacing commands, a final period and
    whitespace (but one space stays between two digits); ``\\dfrac`` and ``\\tfrac`` become
    ``\\frac``."""
    s = _squeeze(text).replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


def _plain_verdict(predicted: str, gold: str) -> bool | None:
    """The fast path's verdict when both sides are plain numbers or lists of them, else None.

    One side's ``x =`` is dropped when the other side has none (``x = 3`` matches ``3``; two
    assignments go to math-verify, which compares the variables too). Lists match as sets.
    """
    has_assignment = (_ASSIGNMENT.match(predicted), _ASSIGNMENT.match(gold))
    if bool(has_assignment[0]) != bool(has_assignment[1]):
        predicted = _ASSIGNMENT.sub("", predicted, count=1)
        gold = _ASSIGNMENT.sub("", gold, count=1)
    a, b = _parse_plain(predicted), _parse_plain(gold)
    if a is not None and b is not None:
        return _numbers_match(a, b)
    many_a, many_b = _parse_plain_list(predicted), _parse_plain_list(gold)
    if many_a is None or many_b is None:
        return None
    return all(any(_numbers_match(x, y) for y in many_b) for x in many_a) and all(
        any(_numbers_match(x, y) for x in many_a) for y in many_b
    )


def _for_math_verify(text: str) -> str:
    """`text` with ``1\\,000`` / ``1{,}000`` written ``1000`` (math-verify reads ``1\\,000`` as
    ``1 * 000``)."""
    return _THIN_THOUSANDS.sub("", text)


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

MAIN_PATH_ENV = "RLVR_FORKSERVER_MAIN"
"""The parent's main script and ``sys.path`` while the fork server starts
(`_main_path_for_fork_server`)."""

_pool_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_generation = 0


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context (`rlvr.rewards._verifier_preload` preloaded) where available,
    else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["rlvr.rewards._verifier_preload"])
        return ctx
    return multiprocessing.get_context("spawn")


@contextmanager
def _main_path_for_fork_server() -> Iterator[None]:
    """Within this block, ``RLVR_FORKSERVER_MAIN`` holds the main script and ``sys.path`` that
    a fork server started now preloads (`rlvr.rewards._verifier_preload`), as JSON."""
    data = multiprocessing.spawn.get_preparation_data("verifier")
    before = os.environ.get(MAIN_PATH_ENV)
    if "init_main_from_path" in data:
        parent = {"main_path": data["init_main_from_path"], "sys_path": data["sys_path"]}
        os.environ[MAIN_PATH_ENV] = json.dumps(parent)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MAIN_PATH_ENV, None)
        else:
            os.environ[MAIN_PATH_ENV] = before


def _get_pool() -> tuple[ProcessPoolExecutor, int]:
    """The shared worker pool and its generation number, started (and warmed up) if needed."""
    global _pool
    with _pool_lock:
        if _pool is None:
            pool = ProcessPoolExecutor(
                max_workers=_WORKERS,
                mp_context=_context(),
                initializer=signal.signal,
                initargs=(signal.SIGINT, signal.SIG_IGN),
            )
            try:  # start the workers now, so start-up time never counts against a timeout
                with _main_path_for_fork_server():  # the fork server starts with the first one
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
    the worker died or `fn` raised. A call whose worker was killed by another call's timeout is
    retried once with a fresh timeout, so a call never takes longer than about twice
    `timeout_s`.
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
        except Exception as exc:  # raised by `fn` in the worker (e.g. RecursionError)
            raise VerifierError(f"verifier raised {type(exc).__name__}: {exc}") from exc
    raise VerifierError("verifier worker pool was killed twice during one call")


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _verify_in_worker(predicted: str, gold: str, timeout_s: float) -> bool:
    """Cached verdict of `_VERIFY_FN` (timeouts and errors raise, so they are never cached)."""
    return _run_with_timeout(_VERIFY_FN, (predicted, gold), timeout_s)


def answers_match(predicted: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether `predicted` is mathematically the same answer as `gold`.

    Plain numbers (or lists of them) on both sides are decided in-process by the rules of the
    module docstring; identical normalised strings match; a predicted answer longer than
    1,000 characters matches nothing else; anything else is decided by math-verify in a worker
    process. Raises `VerifierTimeout` when math-verify takes longer than `timeout_s` seconds
    and `VerifierError` when its worker died or raised (the caller scores 0 and counts it).
    """
    predicted, gold = str(predicted).strip(), str(gold).strip()
    if not predicted or not gold:
        return False
    verdict = _plain_verdict(predicted, gold)
    if verdict is not None:
        return verdict
    if normalize_answer(predicted) == normalize_answer(gold):
        return True
    if len(predicted) > _MAX_VERIFY_CHARS:
        return False
    return _verify_in_worker(_for_math_verify(predicted), _for_math_verify(gold), float(timeout_s))


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
