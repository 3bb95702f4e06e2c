"""Fuzzing the answer checker: random and hostile strings never crash it and never hang it.

Extraction must never raise and stays fast on any text. Verification may raise only the
documented `VerifierError` (of which `VerifierTimeout` is a kind); every call returns within
its bound: twice the verifier timeout (a call killed by a concurrent timeout is retried once)
plus a margin for restarting the worker pool. The ``math`` reward, through the composer,
never raises at all. Examples are derandomised, so the file runs the same cases every time.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rlvr.rewards import (
    VerifierError,
    answers_match,
    compose_rewards,
    extract_answer,
    format_lenient_score,
    format_score,
    format_strict_score,
)

TIMEOUT_S = 1.0
CALL_BOUND_S = 2 * TIMEOUT_S + 3.0  # one retry, plus killing and restarting the workers
EXTRACT_BOUND_S = 1.0

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

FRAGMENTS = [
    "\\boxed{", "\\fbox{", "{", "}", "\\{", "\\}", "\\frac", "\\dfrac", "\\sqrt", "^", "_", "9",
    "0", "1", "-", "−", ".", ",", "%", "\\%", "e", "/", "$", "\\(", "\\)", "\\[", "\\]", "**",
    "(", ")", "[", "]", "\\left(", "\\right]", "\\text{", "cm", " dollars", "the answer is ",
    "Answer: ", "####", " not ", "<answer>", "</answer>", "<think>", "</think>", " ", "\n",
    "\\,", "{,}", "\\infty", "\\pi", "x", "=", " and ", " or ", "\x00", "∞", "é", "🙂", "\\\\",
]  # fmt: skip
GOLDS = ["5", "-3", "\\frac{1}{2}", "0.5", "50\\%", "(1, 2]", "1, 2", "x^2 + 1", "\\sqrt{2}"]

hostile_text = st.lists(st.sampled_from(FRAGMENTS), max_size=120).map("".join)
any_text = st.one_of(st.text(max_size=400), hostile_text)


def _timed(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` and the seconds it took."""
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


def _checked_match(predicted: str, gold: str) -> bool | None:
    """`answers_match` within its bound; None when it raised the documented VerifierError."""
    start = time.monotonic()
    try:
        verdict = answers_match(predicted, gold, timeout_s=TIMEOUT_S)
    except VerifierError:
        verdict = None
    elapsed = time.monotonic() - start
    assert elapsed < CALL_BOUND_S, f"answers_match took {elapsed:.1f} s on {predicted[:80]!r}"
    assert verdict is None or isinstance(verdict, bool)
    return verdict


# ------------------------------------------------------------------------------- extraction


@FUZZ
@given(any_text)
def test_extraction_never_raises_and_is_fast(text: str) -> None:
    answer, seconds = _timed(extract_answer, text)
    assert answer is None or (isinstance(answer, str) and answer.strip() == answer and answer)
    assert seconds < EXTRACT_BOUND_S


@FUZZ
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8), st.integers(50, 3000))
def test_extraction_is_fast_on_long_repetitions(pieces: list[str], repeats: int) -> None:
    text = "".join(pieces) * repeats  # up to ~100 KB of one hostile motif
    answer, seconds = _timed(extract_answer, text)
    assert answer is None or isinstance(answer, str)
    assert seconds < EXTRACT_BOUND_S


# ------------------------------------------------------------------------------- verification


@settings(FUZZ, max_examples=100)
@given(any_text, st.one_of(st.sampled_from(GOLDS), any_text))
def test_verification_raises_only_verifier_errors_within_its_bound(
    predicted: str, gold: str
) -> None:
    _checked_match(predicted, gold)


PATHOLOGICAL = [
    "9" * 10000,
    "1e99999",
    "9e-99999",
    "\\frac" * 5000,
    "\\frac" * 150,
    "9^9^9^9",
    "9^{9^{9^{9}}}",  # sympy would compute it forever: killed at the timeout
    "2^{2^{40}}",
    "10^{10^{10}}",
    "{" * 900,
    "\\sqrt{" * 150 + "2" + "}" * 150,
    "(" * 900,
    "\\left(" * 150,
    "\\boxed{" * 5000 + "1",
    "1/0",
    "\\frac{1}{0}",
    "0^{-1}",
    "\x00" * 100,
    "7\x00",
    "∞" * 300,
    "x" * 100000,
    "<answer>" * 20000,
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=range(len(PATHOLOGICAL)))
def test_pathological_inputs_are_bounded(text: str) -> None:
    answer, seconds = _timed(extract_answer, text)
    assert seconds < EXTRACT_BOUND_S
    assert _checked_match(text, "5") is not True
    if answer is not None and answer != text:
        assert _checked_match(answer, "5") is not True


@settings(FUZZ, max_examples=60)
@given(st.lists(st.tuples(any_text, st.sampled_from(GOLDS)), min_size=1, max_size=6))
def test_math_reward_never_raises_and_stays_bounded(rows: list[tuple[str, str]]) -> None:
    composer = compose_rewards([("math", 1.0)], max_workers=2, timeout_s=TIMEOUT_S)
    completions, golds = [c for c, _ in rows], [g for _, g in rows]
    out, seconds = _timed(composer, [""] * len(rows), completions, {"answer": golds})
    # worst case: every completion of the larger chunk needs its full bound
    assert seconds < CALL_BOUND_S * math.ceil(len(rows) / 2)
    assert all(score in (0.0, 1.0) for score in out.total)
    assert out.errors == 0
    assert 0 <= out.timeouts <= len(rows)


# ------------------------------------------------------------------------------- properties


@FUZZ
@given(st.integers(-(10**12), 10**12))
def test_an_integer_matches_its_written_forms_and_not_its_neighbour(n: int) -> None:
    assert answers_match(f"{n:,}", str(n))
    assert answers_match(f"${n}$", f"{n}.0")
    assert not answers_match(str(n + 1), str(n))
    assert not answers_match(str(n * 10), str(n)) or n == 0


def decimal(value: Fraction, places: int) -> str:
    """`value` rounded half to even to `places` decimals, written out exactly."""
    scaled = round(value * 10**places)
    digits = str(abs(scaled)).rjust(places + 1, "0")
    return f"{'-' if scaled < 0 else ''}{digits[:-places]}.{digits[-places:]}"


@FUZZ
@given(st.fractions(max_denominator=10**6))
def test_a_fraction_matches_its_latex_and_rounded_forms(value: Fraction) -> None:
    latex = f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
    assert answers_match(latex, f"{value.numerator}/{value.denominator}")
    assert answers_match(decimal(value, 8), latex)
    assert answers_match(decimal(value, 6), latex)
    assert not answers_match(decimal(value + Fraction(1, 10**5), 6), latex)
    assert not answers_match(latex, str(value + 1))


R1_PIECES = ["<think>", "</think>", "<answer>", "</answer>", "\n", " ", "4", "reason", "x"]


@FUZZ
@given(st.lists(st.sampled_from(R1_PIECES), max_size=14).map("".join), st.booleans())
def test_format_rewards_are_nested(completion: str, opened_in_prompt: bool) -> None:
    prompt = "Question?\n<think>\n" if opened_in_prompt else "Question?\n"
    strict = format_strict_score(completion, prompt)
    assert strict <= format_score(completion) <= format_lenient_score(completion)
