"""Answer verification: exact fast path, math-verify, and the hard, killable timeout."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from rlvr.rewards import (
    VerifierError,
    VerifierTimeout,
    answers_match,
    compose_rewards,
    extract_answer,
    math_score,
    normalize_answer,
    parse_number,
    verify as verify_module,
)
from rlvr.rewards.verify import _run_with_timeout

MATCH_CASES = [
    # exact numbers (fast path)
    ("42", "42", True),
    ("1,234", "1234", True),
    ("12.0", "12", True),
    ("0.75", "3/4", True),
    ("-3", "-3.000", True),
    ("$18$", "18", True),
    ("2/4", "1/2", True),
    # wrong but similar: must NOT match
    ("12", "1.2", False),
    ("3/4", "4/3", False),
    ("-5", "5", False),
    ("100", "1000", False),
    ("0.333", "1/3", False),
    ("1,234", "1.234", False),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("\\sqrt{2}", "\\sqrt{3}", False),
    ("x+1", "x-1", False),
    ("(1, 2)", "(2, 1)", False),
    ("\\pi", "3.14159", False),
    ("", "5", False),
    # normalised string identity
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("\\text{(B)}", "\\text{(B)}", True),
    # math-verify: equal values written differently
    ("0.5", "\\frac{1}{2}", True),
    ("1.5", "\\dfrac{3}{2}", True),
    ("\\tfrac{3}{2}", "1.5", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True),
    ("3\\sqrt{2}", "\\sqrt{18}", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("1+x", "x+1", True),
    ("10^{3}", "1000", True),
    ("\\{2, 1\\}", "\\{1,2\\}", True),
    ("[1, 2)", "[1,2)", True),
    ("x = 3", "3", True),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
]


@pytest.mark.parametrize(("predicted", "gold", "expected"), MATCH_CASES)
def test_answers_match(predicted: str, gold: str, expected: bool) -> None:
    assert answers_match(predicted, gold) is expected


END_TO_END_CASES = [
    # (completion, gold, correct): extraction and verification together
    ("<think>half</think><answer>0.5</answer>", "\\frac{1}{2}", True),
    ("Therefore $x = \\boxed{\\dfrac{7}{2}}$.", "\\frac{7}{2}", True),
    ("\\boxed{3} hmm, actually \\boxed{4}", "4", True),
    ("\\boxed{3} hmm, actually \\boxed{4}", "3", False),
    ("The answer is 1,000.", "1000", True),
    ("The answer is 100.", "1000", False),
    ("so we get 12 apples", "1.2", False),
    ("#### -7", "7", False),
    ("<answer>\\boxed{\\sqrt{8}}</answer>", "2\\sqrt{2}", True),
    ("no answer here", "5", False),
]


@pytest.mark.parametrize(("completion", "gold", "correct"), END_TO_END_CASES)
def test_math_score_end_to_end(completion: str, gold: str, correct: bool) -> None:
    assert math_score(completion, gold) == (1.0 if correct else 0.0)
    assert extract_answer(completion) is not None or not correct


def test_a_row_without_a_gold_answer_scores_zero() -> None:
    assert math_score("\\boxed{4}", None) == 0.0


def test_parse_number_and_normalize() -> None:
    assert parse_number("1,234.5") == parse_number("2469/2")
    assert parse_number("1/0") is None
    assert parse_number("1,23") is None
    assert parse_number("9" * 5000) is None  # more digits than int() converts
    assert parse_number("1e99999") is None  # not expanded: left to math-verify's timeout
    assert parse_number("-\\frac{3}{4}") == parse_number("−0.75") == Fraction(-3, 4)
    assert parse_number("1.5 \\times 10^{-3}") == Fraction(3, 2000)
    assert parse_number("50\\%") == parse_number("50 percent") == Fraction(1, 2)
    assert parse_number("\\$1{,}250 dollars") == 1250
    assert parse_number("2 million") == 2_000_000
    assert parse_number("1 2") is None  # a space is no thousands separator
    assert parse_number("5 pi") is None
    assert normalize_answer(" $\\dfrac{1}{2}$. ") == "\\frac{1}{2}"
    assert normalize_answer("1 2") != normalize_answer("12")
    assert normalize_answer("a1 2") == "a1 2"  # the space between the digits 1 and 2 stays
    assert parse_number(".5") == Fraction(1, 2)  # no integer part
    assert parse_number(".") is None and parse_number("e5") is None  # no digits at all


def test_the_fast_path_decides_plain_numbers_without_math_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never(predicted: str, gold: str, timeout_s: float) -> bool:
        raise AssertionError(f"sent to math-verify: {predicted!r} vs {gold!r}")

    monkeypatch.setattr(verify_module, "_verify_in_worker", never)
    # one side's "x =" is dropped when the other has none
    assert answers_match("x = 3", "3") and answers_match("3", "y = 3")
    # an empty side matches nothing, before any parsing
    assert not answers_match("", "3") and not answers_match("3", "  ")
    assert answers_match(".5", "0.5")
    # the places of a scientific decimal count its exponent: 14.14214e-1 and 1414214e-6 are
    # 1.414214, six places, which round 1.41421356; 1.414214e2 has four
    assert answers_match("14.14214e-1", "1.41421356")
    assert answers_match("1414214e-6", "1.41421356")
    assert not answers_match("1.414214e2", "141.421356")
    # lists match as sets: every member on each side is on the other
    assert answers_match("2, 1", "1, 2") and not answers_match("1, 2", "1, 2, 3")


# ------------------------------------------------------------------------------- timeouts


def hanging_verifier(predicted: str, gold: str) -> bool:
    """Stands in for math-verify in the worker process and never returns in time.

    The worker unpickles it by module name, which works with pytest's default (prepend)
    import mode that this project uses.
    """
    time.sleep(60)
    return True


def test_run_with_timeout_kills_a_hang_and_the_pool_recovers() -> None:
    assert _run_with_timeout(divmod, (7, 2), 10.0) == (3, 1)  # pool started (not timed)
    start = time.monotonic()
    with pytest.raises(VerifierTimeout):
        _run_with_timeout(time.sleep, (60,), 0.5)
    assert time.monotonic() - start < 3.0
    assert _run_with_timeout(divmod, (9, 4), 10.0) == (2, 1)
    assert answers_match("0.25", "\\frac{1}{4}")


def test_an_exception_in_the_worker_is_a_verifier_error() -> None:
    with pytest.raises(VerifierError, match="ValueError") as info:
        _run_with_timeout(int, ("not a number",), 10.0)
    assert not isinstance(info.value, VerifierTimeout)
    assert _run_with_timeout(divmod, (8, 3), 10.0) == (2, 2)  # the pool is still usable


def test_a_crashed_worker_raises_verifier_error_and_the_pool_recovers() -> None:
    with pytest.raises(VerifierError) as info:
        _run_with_timeout(os._exit, (3,), 10.0)
    assert not isinstance(info.value, VerifierTimeout)
    assert _run_with_timeout(divmod, (5, 5), 10.0) == (1, 0)


def test_the_workers_outlive_a_ctrl_c_at_the_terminal() -> None:
    """Ctrl-C reaches the whole process group; a run that stops after its step still needs the
    workers for that step's rewards (`rlvr.training.stopping`)."""
    assert _run_with_timeout(divmod, (7, 2), 10.0) == (3, 1)
    pool, generation = verify_module._get_pool()
    workers = list(pool._processes.values())
    for worker in workers:
        os.kill(worker.pid, signal.SIGINT)
    time.sleep(0.5)
    assert all(worker.is_alive() for worker in workers)
    assert _run_with_timeout(divmod, (9, 4), 10.0) == (2, 1)
    assert verify_module._get_pool() == (pool, generation)  # the same pool served it


def test_answers_match_times_out_on_a_hanging_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    answers_match("0.125", "\\frac{1}{8}")  # pool warm, as during training
    monkeypatch.setattr(verify_module, "_VERIFY_FN", hanging_verifier)
    start = time.monotonic()
    with pytest.raises(VerifierTimeout):
        answers_match("\\sqrt{5}", "hang-me", timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    monkeypatch.undo()
    assert answers_match("\\sqrt{4}", "2")  # the recreated pool verifies again


def test_a_call_killed_by_a_concurrent_timeout_is_retried() -> None:
    _run_with_timeout(divmod, (1, 1), 10.0)
    results: dict[str, object] = {}

    def hang() -> None:
        try:
            _run_with_timeout(time.sleep, (60,), 0.5)
        except VerifierTimeout as exc:
            results["hang"] = exc

    def slow_but_fine() -> None:
        time.sleep(0.1)  # in flight (sleeping 1 s in a worker) when the hang is killed at 0.5 s
        results["fine"] = _run_with_timeout(time.sleep, (1.0,), 5.0)

    threads = [threading.Thread(target=hang), threading.Thread(target=slow_but_fine)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert isinstance(results["hang"], VerifierTimeout)
    assert "fine" in results and results["fine"] is None  # retried on the new pool


def test_composer_counts_timeouts_and_keeps_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    answers_match("0.375", "\\frac{3}{8}")
    monkeypatch.setattr(verify_module, "_VERIFY_FN", hanging_verifier)
    composer = compose_rewards([("math", 1.0)], max_workers=1, timeout_s=0.5)
    completions = ["\\boxed{7}", "\\boxed{\\sqrt{7}}", "\\boxed{8}"]
    start = time.monotonic()
    out = composer(["p"] * 3, completions, {"answer": ["7", "\\sqrt{7.0}", "9"]})
    assert time.monotonic() - start < 3.0
    # "7" vs "7" and "8" vs "9" are decided on the exact path; only the middle one hangs.
    assert out.per_reward["math"] == [1.0, 0.0, 0.0]
    assert out.total == [1.0, 0.0, 0.0]
    assert (out.timeouts, out.errors) == (1, 0)
    assert out.error_examples == [f"math: timeout: NaN (verifier timed out) for {completions[1]!r}"]


# ----------------------------------------------------------------------- worker start-up

MAIN_SCRIPT = """
import os
import threading
import time

import sibling  # found through the script's own directory, as vs_trl.py is by its A/B scripts

with open(os.environ["RUN_LOG"], "a") as log:  # every process that runs this file logs its pid
    log.write(f"{os.getpid()}\\n")

if __name__ == "__main__":
    from rlvr.rewards import verify

    print(os.getpid())
    print(verify._run_with_timeout(sibling.triple, (7,), 60.0))  # unpickled in a worker
    threads = [
        threading.Thread(target=verify._run_with_timeout, args=(time.sleep, (0.5,), 60.0))
        for _ in range(verify._WORKERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    workers = getattr(verify._pool, "_processes", {})
    print(len(workers))
    verify.shutdown_verifier_pool()
"""


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="needs forkserver"
)
def test_verifier_processes_never_run_the_main_script(tmp_path: Path) -> None:
    """A script's module-level code (its imports, e.g. torch) runs in the script's own process
    only: neither the fork server nor its workers re-run it, whatever the Python version, and
    the workers still import modules from the script's directory."""
    script, log = tmp_path / "train_script.py", tmp_path / "runs.log"
    script.write_text(MAIN_SCRIPT)
    (tmp_path / "sibling.py").write_text("def triple(x):\n    return 3 * x\n")
    env = {**os.environ, "RUN_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pid, tripled, workers = (int(word) for word in done.stdout.split()[-3:])
    assert tripled == 21
    assert workers >= 2  # the pool did start several workers
    assert log.read_text().split() == [str(pid)]  # the script's own process only


@pytest.mark.parametrize("text", ["2 log", "3 sin", "4 mod", "5 sqrt", "2 times", "7 infinity"])
def test_a_math_word_is_no_unit(text: str) -> None:
    # "5 pi" cannot test this: a word of 2 letters is never read as a unit in the first place
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        ("33.3333\\%", "\\frac{1}{3}", True),  # 0.333333: 4 places + 2 for the percent
        ("66.6667%", "2/3", True),
        ("33.33%", "1/3", False),  # 0.3333: 4 places only
    ],
)
def test_a_percentage_has_two_more_decimal_places(predicted: str, gold: str, expected: bool):
    assert answers_match(predicted, gold) is expected


def test_a_long_predicted_answer_is_never_sent_to_math_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []
    monkeypatch.setattr(verify_module, "_verify_in_worker", lambda p, g, t: sent.append(p) or True)
    short, long = "x+" * 10 + "y", "x+" * 500 + "y"  # 21 and 1001 characters
    assert answers_match(short, "y") is True and sent == [short]
    assert answers_match(long, "y") is False
    assert sent == [short]
