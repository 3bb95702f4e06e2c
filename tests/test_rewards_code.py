"""The code reward: program extraction, test-case formats, scores, and timeouts in the composer."""

from __future__ import annotations

import json
import math

import pytest

from rlvr.rewards import (
    TIMED_OUT,
    code_reward,
    code_score,
    compose_rewards,
    extract_program,
    get_reward,
    parse_tests,
)
from rlvr.rewards.code import AssertCase, StdioCase

DOUBLE = "n = int(input())\nprint(2 * n)"
DOUBLE_TESTS = [{"input": "1\n", "output": "2\n"}, {"input": "5", "output": "10"}]


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nDone."


# ------------------------------------------------------------------------------ extraction


def test_extract_program_takes_the_last_python_block() -> None:
    completion = (
        "<think>try ```python\nprint(1)\n``` first</think>\n```python\nprint(2)\n```\n"
        "and the output:\n```\n2\n```"
    )
    assert extract_program(completion) == "print(2)\n"  # a tagged block beats a later untagged one
    assert extract_program("```py\nx = 1\n```") == "x = 1\n"
    assert extract_program("```Python3\nx = 3\n```") == "x = 3\n"
    assert extract_program("text\n```\nx = 2\n```") == "x = 2\n"
    assert extract_program("print('no fence')") == "print('no fence')"


# ------------------------------------------------------------------------------ test formats


def test_parse_stdin_stdout_formats() -> None:
    expected = [StdioCase("1\n", "2\n"), StdioCase("5", "10")]
    assert parse_tests(DOUBLE_TESTS) == expected
    assert parse_tests(json.dumps(DOUBLE_TESTS)) == expected
    assert parse_tests({"inputs": ["1\n", "5"], "outputs": ["2\n", "10"]}) == expected
    assert parse_tests({"input": "1\n", "output": "2\n"}) == expected[:1]


def test_parse_assert_style_keeps_the_statements_before_each_assert() -> None:
    tests = (
        "import math\n"
        "assert root(4) == 2\n"
        "def check(x):\n    return root(x * x) == x\n"
        "assert check(3)\n"
        "@staticmethod\ndef unused():\n    pass\n"
    )
    assert parse_tests(tests) == [
        AssertCase("import math", "assert root(4) == 2"),
        AssertCase("import math\ndef check(x):\n    return root(x * x) == x", "assert check(3)"),
    ]
    assert parse_tests(["assert f(1) == 1; assert f(2) == 4"]) == [
        AssertCase("", "assert f(1) == 1"),
        AssertCase("", "assert f(2) == 4"),
    ]


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([{"input": "1"}], "lacks output"),
        ([{"input": "1", "output": 2}], "'output' must be a string"),
        ("[{'input': 1}]", "do not parse"),
        ("print('no asserts')", "no top-level assert"),
        ("assert (", "not valid Python"),
        ([], "no test cases"),
        (42, "got int"),
        ([3], "got int"),
        ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
    ],
)
def test_malformed_tests_are_refused(tests: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tests(tests)


def test_inputs_and_outputs_need_both_keys_and_both_lists() -> None:
    # only one of the two keys: read as a single stdin/stdout case, which lacks its keys
    with pytest.raises(ValueError, match=r"lacks input, output$"):
        parse_tests({"inputs": ["1"]})
    with pytest.raises(ValueError, match=r"lacks input, output$"):
        parse_tests({"outputs": ["2"]})
    # either one not a list is refused, even when the lengths agree
    for raw in ({"inputs": "1", "outputs": ["2"]}, {"inputs": ["1"], "outputs": "2"}):
        with pytest.raises(ValueError, match=r"^'inputs' and 'outputs' must be lists$"):
            parse_tests(raw)


# ------------------------------------------------------------------------------ scores


def test_stdin_stdout_scores() -> None:
    assert code_score(fenced(DOUBLE), DOUBLE_TESTS, timeout_s=3) == 1.0
    # extra spaces and a missing final newline are fine; each output line is stripped
    assert code_score(fenced("print(' ', 2 * int(input()), ' ')"), DOUBLE_TESTS, timeout_s=3) == 1.0
    only_small = "n = int(input())\nprint(2 * n if n < 3 else n)"
    assert code_score(fenced(only_small), DOUBLE_TESTS, timeout_s=3) == 0.5
    assert code_score(fenced("print(3)"), DOUBLE_TESTS, timeout_s=3) == 0.0
    assert code_score(fenced("print(2)\nraise SystemExit(1)"), DOUBLE_TESTS, timeout_s=3) == 0.0
    assert code_score("I cannot solve this.", DOUBLE_TESTS, timeout_s=3) == 0.0


def test_raising_program_scores_zero() -> None:
    assert code_score(fenced("print(2)\n1 / 0"), DOUBLE_TESTS, timeout_s=3) == 0.0


def test_timeouts() -> None:
    hangs = fenced("while True:\n    pass")
    assert math.isnan(code_score(hangs, DOUBLE_TESTS, timeout_s=1))  # every case timed out
    hangs_on_five = "n = int(input())\nwhile n == 5:\n    pass\nprint(2 * n)"
    assert code_score(fenced(hangs_on_five), DOUBLE_TESTS, timeout_s=1) == 0.5


def test_assert_style_scores() -> None:
    program = fenced("def add(a, b):\n    return a + b if a < 10 else 0")
    tests = "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(10, 1) == 11"
    assert code_score(program, tests, timeout_s=3) == pytest.approx(2 / 3)
    more = [tests, "import operator\nassert add(3, 3) == operator.mul(2, 3)"]
    assert code_score(program, more, timeout_s=3) == 0.75
    assert code_score(fenced("def add(a, b):\n    raise ValueError"), tests, timeout_s=3) == 0.0


@pytest.mark.parametrize(
    "escape",
    ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"],
)
def test_exiting_early_does_not_pass_asserts(escape: str) -> None:
    program = fenced(f"def add(a, b):\n    return 0\n{escape}")
    assert code_score(program, "assert add(1, 2) == 3", timeout_s=3) == 0.0


def test_the_program_cannot_read_its_tests_from_disk() -> None:
    snoop = "import os\nprint(sorted(os.listdir('.')))"
    result = code_score(fenced(snoop), [{"input": "", "output": "[]"}], timeout_s=3)
    assert result == 1.0  # the scratch dir is empty: the program file was deleted


# ------------------------------------------------------------------------------ registry, composer


def test_code_reward_is_registered_and_checks_its_column() -> None:
    assert get_reward("code") is code_reward
    with pytest.raises(ValueError, match="'tests' column"):
        code_reward(["p"], [fenced(DOUBLE)])
    with pytest.raises(ValueError, match="row 1 of the 'tests' column"):
        code_reward(["p", "q"], [fenced(DOUBLE)] * 2, tests=[DOUBLE_TESTS, "not python ("])
    assert code_reward(["p"], [fenced(DOUBLE)], tests=[json.dumps(DOUBLE_TESTS)]) == [1.0]


def test_a_malformed_row_is_shown_whole_up_to_80_characters() -> None:
    no_assert = "assert-style tests contain no top-level assert statement"
    at_limit = "x" * 78  # its repr, with the quotes, is 80 characters: shown whole
    with pytest.raises(ValueError) as caught:
        code_reward(["p"], ["c"], tests=[at_limit])
    assert str(caught.value) == f"row 0 of the 'tests' column ('{at_limit}'): {no_assert}"
    past_limit = "y" * 79  # 81: its first 77 characters and "..."
    with pytest.raises(ValueError) as caught:
        code_reward(["p", "q"], ["c"] * 2, tests=[DOUBLE_TESTS, past_limit])
    shown = "'" + "y" * 76 + "..."
    assert str(caught.value) == f"row 1 of the 'tests' column ({shown}): {no_assert}"


def test_composed_hang_is_a_timeout_and_a_crash_scores_zero() -> None:
    completions = [
        fenced(DOUBLE),
        fenced("while True:\n    pass"),
        fenced("print(2)\n1 / 0"),
        fenced("n = int(input())\nprint(2 * n if n < 3 else n)"),
    ]
    composer = compose_rewards([("code", 1.0)], max_workers=2, timeout_s=1.0)
    output = composer(["p"] * 4, completions, {"tests": [DOUBLE_TESTS] * 4})
    assert output.per_reward["code"] == [1.0, 0.0, 0.0, 0.5]
    assert output.total == [1.0, 0.0, 0.0, 0.5]
    assert (output.timeouts, output.errors) == (1, 0)
    assert math.isnan(TIMED_OUT)


def test_composed_malformed_row_is_an_error_not_a_crash() -> None:
    composer = compose_rewards([("code", 1.0)], max_workers=2, timeout_s=1.0)
    columns = {"tests": [DOUBLE_TESTS, [{"input": "1"}]]}
    output = composer(["p", "q"], [fenced(DOUBLE)] * 2, columns)
    assert output.per_reward["code"] == [1.0, 0.0]
    assert output.errors == 1
    # the row number is within the composer's chunk, so the row itself is shown too
    assert "of the 'tests' column ([{'input': '1'}]): " in output.error_examples[0]
