"""Final-answer extraction: priority order, nested braces, hostile and degenerate text."""

from __future__ import annotations

import pytest

from rlvr.rewards import extract_answer, last_boxed_content, last_number

EXTRACTION_CASES = [
    # <answer> tags: the last one wins, a box inside it is unwrapped
    ("<think>2+2</think><answer>4</answer>", "4"),
    ("<answer>1</answer> then <answer> 7 </answer>", "7"),
    ("<answer>$\\boxed{\\frac{1}{2}}$</answer>", "\\frac{1}{2}"),
    ("<answer>\n  x = 3.\n</answer>", "x = 3"),
    ("<answer>5</answer> and later \\boxed{6}", "5"),  # tags beat boxes
    ("<answer></answer> the answer is 5", None),  # an explicit empty answer stays empty
    ("<answer>3</answer><answer>", "3"),  # an unclosed tag is ignored
    # \boxed / \fbox with nested braces; the last box wins
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} no wait \\boxed{2}", "2"),
    ("\\boxed{\\sqrt{\\frac{a}{b}}} is it", "\\sqrt{\\frac{a}{b}}"),
    ("\\fbox{x^{2}+1}", "x^{2}+1"),
    ("\\boxed{\\boxed{3}}", "3"),
    ("The answer is $\\boxed{-5}$.", "-5"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not nest
    ("\\boxed {42}", "42"),
    ("\\boxed 7$ done", "7"),
    ("\\boxed{unclosed 3 and 4", "4"),  # unclosed box: fall back to the last number
    ("\\boxed{1} then \\boxed{2", "1"),  # only closed boxes count
    # "the answer is" / "answer:" / "####"
    ("So the answer is 42.", "42"),
    ("The final answer is: 3.5. Let me double check.", "3.5"),
    ("**Answer:** 18", "18"),
    ("Answer: $\\frac{3}{4}$", "\\frac{3}{4}"),
    ("I think the answer is 5\nwait, the answer is 7.", "7"),
    ("Natalia sold 48 clips.\n#### 72", "72"),
    ("the answer is x + 1.", "x + 1"),
    # last number
    ("There are 3 cats and 12 dogs", "12"),
    ("the total is 1,234,567 apples", "1234567"),
    ("It is -5 degrees", "-5"),
    ("10-3 = 7", "7"),
    ("x - 3", "3"),  # a binary minus is not a sign
    ("costs 2.50 dollars.", "2.50"),
    ("the value is .5", ".5"),
    ("12,34", "34"),  # not a thousands group
    # nothing to extract
    ("no digits here", None),
    ("", None),
    ("\\boxed{}", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION_CASES)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("Thus $x = \\boxed{\\dfrac{7}{2}}$.", "\\dfrac{7}{2}"),
        ("\\boxed{a} and \\boxed{\\text{(B)}}", "\\text{(B)}"),
        ("no box at all: 5", None),
        ("\\fbox{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ],
)
def test_last_boxed_content(solution: str, expected: str | None) -> None:
    assert last_boxed_content(solution) == expected


def test_last_number_none_and_plain() -> None:
    assert last_number("abc") is None
    assert last_number("1 2 3") == "3"


def test_extraction_is_fast_on_hostile_text() -> None:
    # Deeply nested / unbalanced braces and a very long number must not blow up.
    assert extract_answer("\\boxed{" * 5000 + "1") == "1"
    assert extract_answer("\\boxed{" + "{" * 2000 + "}" * 2000 + "}") == "{" * 2000 + "}" * 2000
    assert extract_answer("\\boxed{" * 3000 + "8" + "}" * 3000) == "8"
    assert extract_answer("\\boxed 1 " * 3000) == "1"
    assert extract_answer("9" * 10000) == "9" * 10000


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("\\boxed{\\boxed{3} + \\boxed{4}}", "\\boxed{3} + \\boxed{4}"),  # two boxes: kept whole
        ("\\boxed{ \\boxed{3} }", "3"),  # a box of one box is unwrapped
    ],
)
def test_a_box_of_two_boxes_is_not_unwrapped(solution: str, expected: str) -> None:
    assert last_boxed_content(solution) == expected
    assert extract_answer(solution) == expected
