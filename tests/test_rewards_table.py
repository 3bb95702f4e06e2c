"""The answer-checking tables: extraction, matching, the two together, and the format rewards.

Every row states one rule of `rlvr.rewards.extract` or `rlvr.rewards.verify`; rows marked
"trap" are answers that look right and must score 0 (or look wrong and must score 1). The
rules themselves, with their reasons, are in docs/rewards.md.
"""

from __future__ import annotations

import pytest

from rlvr.rewards import (
    answers_match,
    compose_rewards,
    extract_answer,
    format_lenient_score,
    format_score,
    format_strict_score,
    list_rewards,
    math_score,
)

EXTRACTION_TABLE = [
    # boxes: nested braces, \fbox, the last one wins, a box of a box is unwrapped
    ("Thus \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),
    ("\\fbox{42}", "42"),
    ("$\\boxed{x^{2}}$", "x^{2}"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{ \\boxed{ 12 } }", "12"),
    ("\\boxed{(1, 2]}", "(1, 2]"),
    ("\\boxed{\\left[ \\frac{1}{2}, 3 \\right)}", "\\left[ \\frac{1}{2}, 3 \\right)"),
    ("\\boxed{1{,}000}", "1{,}000"),
    ("**Answer:** \\boxed{50\\%}", "50\\%"),
    ("\\boxed{5 \\text{ cm}}", "5 \\text{ cm}"),
    # trap: an empty box echoes the instruction; it is skipped, before or after the answer
    ("\\boxed{5}. Remember to put your final answer within \\boxed{}.", "5"),
    ("Put the final answer in \\boxed{}.\nSo 3 + 4 = \\boxed{7}", "7"),
    # the boxes of one answer are joined; boxes separated by words are not
    ("x = \\boxed{1} or x = \\boxed{2}", "1, 2"),
    ("\\boxed{1}, \\boxed{2}", "1, 2"),
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "1, 2, 3"),  # every box back to the first
    ("\\boxed{1}\\boxed{2}", "2"),  # adjacent, no joiner: the last; the search finds it
    ("\\boxed{1}," + " " * 99 + "\\boxed{2}", "1, 2"),  # a joiner of 100 characters joins,
    ("\\boxed{1}," + " " * 100 + "\\boxed{2}", "2"),  # one of 101 does not
    ("\\boxed{\\(**\\(3\\)**\\)}", "3"),  # wrappers in wrappers take two rounds
    ("\\boxed{\\left\\{ x = 1 \\right.}", "\\left\\{ x = 1 \\right."),  # "\\right." kept
    ("x_1 = \\boxed{-1}, x_2 = \\boxed{3}", "-1, 3"),
    ("$\\boxed{2}$ and $\\boxed{5}$", "2, 5"),
    ("\\boxed{3} hmm, actually \\boxed{4}", "4"),
    ("\\boxed{1} \\boxed{2}", "2"),
    ("\\boxed{2} is wrong; so \\boxed{3}", "3"),
    ("maybe \\boxed{5}? or \\boxed{6}", "6"),
    # <answer> tags beat everything; inside them: box, then phrase, then the whole content
    ("<think>a</think>\n<answer>\n\\frac{3}{4}\n</answer>", "\\frac{3}{4}"),
    ("<answer>The final answer is 12.</answer>", "12"),
    ("<answer>5 apples</answer>", "5 apples"),
    ("<answer>$-3$</answer>", "-3"),
    ("<answer>\\boxed{1}, \\boxed{2}</answer>", "1, 2"),
    ("<think>maybe <answer>4</answer> no</think><answer>5</answer>", "5"),
    ("<answer>7</answer> The answer is 8.", "7"),
    ("<answer>   </answer> \\boxed{9}", None),  # an explicit empty answer stays empty
    ("<answer>1</answer><answer>2</answer>", "2"),
    ("<answer>\\(x = 2\\)</answer>", "x = 2"),
    # "the answer is": corrections, reasons and negations
    ("The answer is 3, not 5.", "3"),
    ("The answer is 3 and not 5.", "3"),
    ("The answer is not 5.", None),  # trap: a negation is no answer, and 5 is not taken
    ("The answer is not 5, it is 7.", "7"),
    ("I think the answer is 5, wait, the answer is 7.", "7"),
    ("The answer is 12 because 3 * 4 = 12.", "12"),
    ("The answer is 5, as computed above.", "5"),
    ("The answers are 1 and 2.", "1 and 2"),
    ("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
    ("answer = 17", "17"),
    ("The answer is **42**.", "42"),
    ("The answer is \\(x = 2\\).", "x = 2"),
    ("The answer is: 3/4", "3/4"),
    ("The answer is\n5", "5"),  # nothing after the phrase: the last number
    ("The answer is.", None),
    ("#### 1,234", "1,234"),
    # the last number: signs, separators, scientific, ratios, LaTeX fractions, percentages
    ("So we get 3/4 of the pie", "3/4"),
    ("so $x = -\\frac{3}{2}$", "-\\frac{3}{2}"),
    ("The speed of light is 3e8 m/s", "3e8"),
    ("It takes 1.5e-3 seconds", "1.5e-3"),
    ("Temperature: −7 degrees", "-7"),
    ("It grew by 50% in total", "50%"),
    ("It grew by 50\\% in total", "50\\%"),
    ("between 2 and 10-3", "3"),  # a binary minus is not a sign
    ("the prize is 1,000,000 dollars", "1000000"),
    ("x^2 = 16 gives x = -4", "-4"),
    ("the value is 0.5.", "0.5"),
    ("\\boxed{}", None),
    ("", None),
]

MATCH_TABLE = [
    # separators, signs and written forms of one number
    ("1,000", "1000", True),
    ("1\\,000", "1000", True),
    ("1{,}000", "1000", True),
    ("1 000", "1000", False),  # a space is no thousands separator ("1 2" is not 12)
    ("1,2", "12", False),  # trap: not a thousands group, a list
    ("−5", "-5", True),
    ("+5", "5", True),
    ("0.50", "0.5", True),
    (".5", "0.5", True),
    ("1e3", "1000", True),
    ("1.5e-3", "0.0015", True),
    ("1.5 \\times 10^{-3}", "0.0015", True),
    ("3 \\cdot 10^{8}", "300000000", True),
    ("1e3", "100", False),
    ("-5", "5", False),
    # fractions
    ("\\frac{3}{4}", "0.75", True),
    ("\\dfrac{3}{4}", "3/4", True),
    ("\\tfrac34", "0.75", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("6/8", "3/4", True),
    ("\\frac{1}{2}", "\\frac{2}{4}", True),
    ("1\\frac{1}{2}", "\\frac{3}{2}", True),  # a mixed number (math-verify)
    ("1/2", "12", False),  # trap
    ("\\frac{1}{2}", "12", False),  # trap
    ("1/2", "2/1", False),
    # tolerance: a decimal of >= 6 places matches a value it rounds or truncates
    ("0.333", "1/3", False),  # trap: too few places
    ("0.33", "\\frac{1}{3}", False),
    ("0.333333", "1/3", True),
    ("0.3333333", "\\frac{1}{3}", True),
    ("0.333334", "1/3", False),  # neither rounds nor truncates 1/3
    ("0.666667", "2/3", True),  # rounded
    ("0.666666", "\\frac{2}{3}", True),  # truncated
    ("0.667", "2/3", False),
    ("1/3", "0.333333", True),  # the same rule when the gold is the decimal
    ("5.0000001", "5", False),  # trap: an exact gold needs the exact value
    ("0.0000001", "0", False),  # trap
    ("12", "1.2", False),
    ("3.14", "\\pi", False),  # math-verify: equal after rounding both to 6 places
    ("3.141593", "\\pi", True),
    ("1.414214", "\\sqrt{2}", True),
    # percentages: p% is p/100, and the sign may be dropped on either side
    ("50\\%", "0.5", True),
    ("50%", "50", True),
    ("50", "50\\%", True),
    ("0.5", "50\\%", True),
    ("\\frac{1}{2}", "50\\%", True),
    ("12.5\\%", "12.5", True),
    ("12.5\\%", "0.125", True),
    ("5 percent", "5\\%", True),
    ("50\\%", "5", False),
    ("50\\%", "0.05", False),
    ("0.5\\%", "50", False),
    # units, currency and degrees
    ("5 \\text{ cm}", "5", True),
    ("5\\text{cm}^2", "5", True),
    ("5 dollars", "5", True),
    ("\\$5.00", "5", True),
    ("5 \\mathrm{m}", "5", True),
    ("5 meters", "5 \\text{ m}", True),
    ("5~\\text{cm}", "5", True),
    ("90^\\circ", "90", True),
    ("90°", "90", True),
    ("2 million", "2000000", True),
    ("\\frac{1}{2}\\text{ dollars}", "0.5", True),
    ("5 cm", "50", False),
    ("2 million", "2", False),  # trap: a scale word is no unit
    ("5 pi", "5", False),  # trap: pi is no unit
    ("5x", "5", False),  # trap: a variable is no unit
    # intervals
    ("(1, 2]", "(1,2]", True),
    ("\\left[1, 2\\right]", "[1,2]", True),
    ("x \\in (1, 2]", "(1, 2]", True),
    ("(-\\infty, 0) \\cup (1, \\infty)", "(1, \\infty) \\cup (-\\infty, 0)", True),
    ("(1, 2]", "[1, 2]", False),  # trap: the ends matter
    ("(1, 2]", "(1, 2)", False),
    ("[1, 2)", "(1, 2]", False),
    ("(-\\infty, 3]", "(-\\infty, 3)", False),
    ("[0, 10]", "5", False),  # trap: an interval that contains the answer
    # several answers: compared as sets
    ("1, 2", "2, 1", True),
    ("2, 1", "\\{1, 2\\}", True),
    ("1 and 2", "1, 2", True),
    ("1; 2", "2; 1", True),
    ("-1, 3", "3, -1", True),
    ("\\frac{1}{2}, 3", "3, 0.5", True),
    ("x = 1 \\text{ or } x = 2", "1, 2", True),
    ("1", "1, 2", False),  # trap: half of the answers
    ("1, 2, 3", "1, 2", False),  # trap: a superset
    ("5 or 6", "5", False),  # trap: a hedge
    ("5, 6", "5", False),
    ("\\pm 5", "5", False),
    # equations and variables
    ("x = 3", "3", True),
    ("3", "x = 3", True),
    ("y = 3", "x = 3", False),
    ("x = -3", "3", False),
    # symbolic (math-verify)
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("x^2 - 1", "(x-1)(x+1)", True),
    ("2^{10}", "1024", True),
    ("\\infty", "\\infty", True),
    ("\\sqrt{2}", "2", False),
    ("\\frac{\\pi}{2}", "90", False),
    ("-\\infty", "\\infty", False),
    # multiple choice
    ("\\text{(B)}", "B", True),
    ("(B)", "B", True),
    ("\\textbf{(C)}", "C", True),
    ("B", "C", False),
    # LaTeX spacing and sizing commands
    ("\\frac{1}{2}\\,", "\\frac{1}{2}", True),
    ("\\left( 3, 4 \\right)", "(3,4)", True),
    ("\\displaystyle\\frac{1}{2}", "0.5", True),
    ("\\!5", "5", True),
    # degenerate and hostile
    ("", "5", False),
    ("5", "", False),
    ("\\boxed{", "5", False),
    ("9" * 5000, "9", False),  # too long to verify: no worker call at all
    ("1e99999", "1", False),
]

END_TO_END_TABLE = [
    # (completion, gold, scores 1): extraction and verification together
    ("The answer is 3, not 5.", "5", False),  # trap
    ("The answer is 3, not 5.", "3", True),
    ("The answer is not 5.", "5", False),  # trap
    ("Put your final answer within \\boxed{}.\n2 + 2 = 4, so \\boxed{4}", "4", True),
    ("\\boxed{4}\nRemember: put your final answer within \\boxed{}.", "4", True),
    ("For example, \\boxed{7} is the format. Here 3 + 5 = \\boxed{8}", "7", False),  # trap
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}, \\boxed{4}, \\boxed{5}", "3", False),  # trap
    ("x = \\boxed{2} or x = \\boxed{-2}", "2, -2", True),
    ("The answer is 5 or 6.", "5", False),  # trap
    ("The ratio is 1/2", "12", False),  # trap
    ("It is 12.", "1/2", False),  # trap
    ("We get 0.333", "\\frac{1}{3}", False),  # trap
    ("We get 0.333333", "\\frac{1}{3}", True),
    ("<answer>50%</answer>", "0.5", True),
    ("<answer>50%</answer>", "5", False),
    ("The answer is $3.5$ meters.", "3.5", True),
    ("<answer>5 apples</answer>", "5", True),
    ("The total cost is \\$1,250.", "1250", True),
    ("#### 1,234", "1234", True),
    ("#### 1,234", "1.234", False),  # trap
    ("The answer is 1e3.", "1000", True),
    ("The final answer is $(1, 2]$.", "(1,2]", True),
    ("The final answer is $(1, 2)$.", "(1,2]", False),
    ("The answers are 2 and 3.", "3, 2", True),
    ("The answers are 2 and 3.", "2", False),
    ("<think>it is 7</think><answer>8</answer>", "7", False),  # trap: the tag decides
    ("<answer></answer> 42", "42", False),  # trap
    ("Answer: \\dfrac{7}{2}", "3.5", True),
    ("so $x = -\\frac{3}{2}$", "-1.5", True),
    ("The probability is 0.5", "\\frac{1}{2}", True),
    ("The answer is \\frac{1}{2}, not \\frac{1}{3}.", "\\frac{1}{3}", False),  # trap
    ("the answer is -5", "5", False),
    ("\\boxed{5^\\circ}", "5", True),
    ("\\boxed{10\\%}", "0.1", True),
    ("\\boxed{\\text{B}}", "B", True),
    ("\\boxed{A}", "B", False),
    ("\\boxed{5, 6, 7, 8}", "5", False),  # trap: a shotgun answer
    ("\\boxed{[0, 100]}", "50", False),  # trap
    ("\\boxed{x}", "5", False),
    ("The answer is 5.0000001", "5", False),  # trap
]


FORMAT_TABLE = [
    # (completion, format_strict, format, format_lenient), with a prompt that opens no block
    ("<think>\nreason\n</think>\n<answer>\n4\n</answer>", 1, 1, 1),
    ("<think>\nreason\n</think>\n<answer>\n4\n</answer>\n", 1, 1, 1),  # a final newline
    ("<think>reason</think><answer>4</answer>", 0, 1, 1),  # no newlines
    ("  <think>\nreason\n</think>\n<answer>\n4\n</answer>", 0, 1, 1),  # leading space
    ("<think>\nreason\n</think>\n\n<answer>\n4\n</answer>", 0, 1, 1),  # a blank line
    ("reason</think>\n<answer>4</answer>", 0, 1, 1),  # the opening tag is missing
    ("</think><answer>4</answer>", 0, 1, 1),  # the completion opens with the closing tag
    ("<think>\n\n</think>\n<answer>\n4\n</answer>", 0, 1, 1),  # no reasoning
    ("intro <think>x</think> then <answer>4</answer> outro", 0, 0, 1),
    ("<think>a</think><think>b</think><answer>1</answer>", 0, 0, 1),
    ("<think>a</think><answer>1</answer><answer>2</answer>", 0, 0, 1),
    ("<think>a</think> <answer>1</answer> and again <answer>2</answer>", 0, 0, 1),
    ("<think>\nreason\n</think>\n<answer>\n\n</answer>", 0, 0, 0),  # an empty answer
    ("<think>a</think><answer><think>1</answer>", 0, 0, 0),  # a tag inside the answer
    ("<answer>4</answer><think>a</think>", 0, 0, 0),  # the wrong order
    ("<answer>4</answer>", 0, 0, 0),
    ("<think>reason</think>", 0, 0, 0),
    ("<THINK>a</THINK><ANSWER>4</ANSWER>", 0, 0, 0),  # the tags are lower case
    ("", 0, 0, 0),
]


@pytest.mark.parametrize(("completion", "strict", "default", "lenient"), FORMAT_TABLE)
def test_format_table(completion: str, strict: int, default: int, lenient: int) -> None:
    scores = (format_strict_score(completion), format_score(completion))
    assert (*scores, format_lenient_score(completion)) == (strict, default, lenient)


def test_strict_format_continues_a_block_the_prompt_opened() -> None:
    prompt = "<|user|>What is 2 + 2?<|assistant|><think>\n"
    continued = "reason\n</think>\n<answer>\n4\n</answer>"
    reopened = "<think>\nreason\n</think>\n<answer>\n4\n</answer>"
    assert {"format", "format_strict", "format_lenient"} <= set(list_rewards())
    composer = compose_rewards([("format_strict", 1.0), ("format_lenient", 0.5)])
    out = composer([prompt, prompt, "no tag"], [continued, reopened, reopened], {})
    assert out.per_reward["format_strict"] == [1.0, 0.0, 1.0]
    assert out.per_reward["format_lenient"] == [1.0, 1.0, 1.0]
    assert out.total == [1.5, 0.5, 1.5]
    assert format_strict_score(continued, "<think>") == 0.0  # the newline after the tag


@pytest.mark.parametrize(("text", "expected"), EXTRACTION_TABLE)
def test_extraction_table(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(("predicted", "gold", "expected"), MATCH_TABLE)
def test_match_table(predicted: str, gold: str, expected: bool) -> None:
    assert answers_match(predicted, gold) is expected


@pytest.mark.parametrize(("completion", "gold", "correct"), END_TO_END_TABLE)
def test_end_to_end_table(completion: str, gold: str, correct: bool) -> None:
    assert math_score(completion, gold) == (1.0 if correct else 0.0)


def test_the_tables_hold_at_least_150_cases() -> None:
    rows = len(EXTRACTION_TABLE) + len(MATCH_TABLE) + len(END_TO_END_TABLE)
    assert rows >= 150
    traps = [row for row in MATCH_TABLE + END_TO_END_TABLE if row[2] is False]
    assert len(traps) >= 50
