"""Code reward: run the program in a completion against test cases in the sandbox.

`code_score(completion, tests)` takes the last fenced Python block of the completion (else the
whole text) and runs it once per test case with `rlvr.rewards.sandbox.run_python`; the score
is the fraction of cases passed. Two kinds of case:

- stdin/stdout, ``{"input": "1 2\\n", "output": "3\\n"}``: passed when the program exits with 0
  and its output equals the expected one line by line, each line stripped (trailing blank lines
  ignored). ``{"inputs": [...], "outputs": [...]}`` (APPS/TACO) is read as the same.
- assert-style, a string of Python such as ``"assert add(1, 2) == 3\\nassert add(0, 0) == 0"``:
  each top-level ``assert`` is one case, run after the program together with the statements
  that precede it (imports, helpers). Passed when the program and the assert run and a
  random marker printed after the assert arrives, so ``sys.exit(0)`` or ``os._exit(0)`` at
  the top of the program does not pass. The marker is not on disk (the sandbox deletes the
  program file), though a program that inspects its own code object could still find it. An
  assert compares with the program's own objects, so one whose ``__eq__`` is always true
  passes; stdin/stdout cases compare text and have no such hole.

A case that raises, exits non-zero, times out or prints too much fails. When every case of a
completion timed out the score is ``TIMED_OUT`` (NaN), which the composer counts in
``timeouts`` and scores 0.

Departures from the papers' code rewards (DeepSeek-R1, Kimi k1.5 use pass/fail on all tests):
the score here is the fraction passed, a denser signal; use ``score == 1.0`` for pass/fail.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.builtin import TIMED_OUT
from rlvr.rewards.registry import register_reward
from rlvr.rewards.sandbox import run_python
from rlvr.rewards.verify import current_verifier_timeout

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


@dataclass(frozen=True)
class StdioCase:
    """Feed `input` to the program; its stdout must match `output` line by line."""

    input: str
    output: str


@dataclass(frozen=True)
class AssertCase:
    """Run the program, then `setup` (the test's statements before the assert), then `check`."""

    setup: str
    check: str


CodeTestCase = StdioCase | AssertCase
"""One test case of a code problem."""


def extract_program(completion: str) -> str:
    """The last ```python (or ```py) fenced block; else the last untagged fenced block; else
    the whole completion."""
    blocks = _FENCE.findall(completion)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    untagged = [body for tag, body in blocks if not tag]
    if python:
        return python[-1]
    return untagged[-1] if untagged else completion


def _source_of(node: ast.stmt, source: str) -> str:
    """The source of a top-level statement, with its decorators."""
    decorators = getattr(node, "decorator_list", [])
    lines = [f"@{ast.get_source_segment(source, d)}" for d in decorators]
    return "\n".join([*lines, ast.get_source_segment(source, node) or ""])


def _assert_cases(source: str) -> list[AssertCase]:
    """One case per top-level ``assert`` in `source`, each with the statements before it."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"assert-style tests are not valid Python: {exc}") from exc
    cases, setup = [], []
    for node in tree.body:
        if isinstance(node, ast.Assert):
            cases.append(AssertCase("\n".join(setup), _source_of(node, source)))
        else:
            setup.append(_source_of(node, source))
    if not cases:
        raise ValueError("assert-style tests contain no top-level assert statement")
    return cases


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _stdio_case(case: Mapping[str, Any]) -> StdioCase:
    missing = {"input", "output"} - set(case)
    if missing:
        raise ValueError(f"a stdin/stdout case needs keys 'input' and 'output'; {case!r} lacks "
                         f"{', '.join(sorted(missing))}")  # fmt: skip
    return StdioCase(_text(case["input"], "'input'"), _text(case["output"], "'output'"))


def parse_tests(raw: Any) -> list[CodeTestCase]:
    """The test cases of one row of the ``tests`` column; ValueError if malformed or empty.

    Accepted: a list of ``{"input", "output"}`` dicts and/or strings of assert statements; one
    such dict; ``{"inputs": [...], "outputs": [...]}``; a string of assert statements; or any
    of these encoded as a JSON string.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if text[:1] in ("[", "{"):
            try:
                return parse_tests(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"tests look like JSON but do not parse: {exc}") from exc
        return _assert_cases(text)
    if isinstance(raw, Mapping):
        if "inputs" in raw and "outputs" in raw:
            inputs, outputs = raw["inputs"], raw["outputs"]
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError("'inputs' and 'outputs' must be lists")
            if len(inputs) != len(outputs):
                raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
            raw = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
        else:
            return [_stdio_case(raw)]
    if not isinstance(raw, Sequence) or isinstance(raw, bytes):
        raise ValueError(f"tests must be a list, a dict or a string, got {type(raw).__name__}")
    cases: list[CodeTestCase] = []
    for item in raw:
        if isinstance(item, Mapping):
            cases.append(_stdio_case(item))
        elif isinstance(item, str):
            cases.extend(_assert_cases(item))
        else:
            raise ValueError(f"a test case must be a dict or a string, got {type(item).__name__}")
    if not cases:
        raise ValueError("no test cases")
    return cases


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


@dataclass(frozen=True)
class CaseOutcome:
    """Whether a case passed, and whether it ran out of time."""

    passed: bool
    timed_out: bool


def run_case(program: str, case: CodeTestCase, timeout_s: float, **limits: Any) -> CaseOutcome:
    """Run `program` on one test `case` in the sandbox (`limits` go to `run_python`)."""
    if isinstance(case, StdioCase):
        result = run_python(program, case.input, timeout_s=timeout_s, **limits)
        passed = result.ok and _lines(result.stdout) == _lines(case.output)
        return CaseOutcome(passed, result.timed_out)
    marker = f"rlvr-assert-passed-{secrets.token_hex(16)}"
    source = f"{program}\n\n{case.setup}\n{case.check}\nprint({marker!r})\n"
    result = run_python(source, timeout_s=timeout_s, **limits)
    return CaseOutcome(result.ok and result.stdout.rstrip().endswith(marker), result.timed_out)


def code_score(
    completion: str, tests: Any, *, timeout_s: float | None = None, **limits: Any
) -> float:
    """Fraction of `tests` (see `parse_tests`) that the program in `completion` passes.

    `timeout_s` is the wall-clock limit of each case (default: `current_verifier_timeout()`);
    `limits` go to `run_python`. NaN (`TIMED_OUT`) when every case timed out.
    """
    timeout_s = current_verifier_timeout() if timeout_s is None else timeout_s
    return _score_cases(extract_program(completion), parse_tests(tests), timeout_s, **limits)


def _score_cases(program: str, cases: list[CodeTestCase], timeout_s: float, **limits: Any) -> float:
    outcomes = [run_case(program, case, timeout_s, **limits) for case in cases]
    if all(outcome.timed_out for outcome in outcomes):
        return TIMED_OUT
    return sum(outcome.passed for outcome in outcomes) / len(outcomes)


@register_reward("code")
def code_reward(
    prompts: list[str], completions: list[str], tests: list[Any] | None = None, **_: Any
) -> list[float]:
    """Fraction of the ``tests`` column's cases passed (NaN when all of them timed out)."""
    if tests is None:
        raise ValueError("the 'code' reward needs a 'tests' column")
    parsed = []
    for row, raw in enumerate(tests):
        try:
            parsed.append(parse_tests(raw))
        except ValueError as exc:
            shown = repr(raw) if len(repr(raw)) <= 80 else repr(raw)[:77] + "..."
            raise ValueError(f"row {row} of the 'tests' column ({shown}): {exc}") from exc
    timeout_s = current_verifier_timeout()
    return [
        _score_cases(extract_program(completion), cases, timeout_s)
        for completion, cases in zip(completions, parsed, strict=True)
    ]


# Every program runs under the sandbox's own wall-clock kill, so the composer's call deadline
# (meant for rewards that could hang) would only cut long test lists short.
code_reward.self_timed = True  # type: ignore[attr-defined]
