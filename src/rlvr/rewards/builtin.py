"""Built-in rewards: ``math``, ``format`` / ``format_strict`` / ``format_lenient`` (R1 tags),
``countdown``, ``tool_error``.

Each has TRL's signature ``f(prompts, completions, **columns) -> list[float]`` and scores 1.0 or
0.0. A math-verify timeout is reported as ``float("nan")`` for that completion: the composer
turns every NaN into a score of 0 and counts it in ``RewardOutput.timeouts``.

The three format rewards are nested: whatever ``format_strict`` accepts, ``format`` accepts,
and whatever ``format`` accepts, ``format_lenient`` accepts. ``math`` is marked
``self_timed``: every wait in it is bounded by the verifier's killable timeout, so the composer
does not also put a deadline on the whole call (see `rlvr.rewards.compose`).
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from rlvr.rewards.extract import extract_answer
from rlvr.rewards.registry import register_reward
from rlvr.rewards.verify import (
    VerifierError,
    answers_match,
    current_verifier_timeout,
    parse_number,
)

TIMED_OUT = float("nan")
"""The score a reward returns for a completion whose verifier timed out (counted, scores 0)."""


# --------------------------------------------------------------------------- math


def math_score(completion: str, gold: Any, timeout_s: float = 5.0) -> float:
    """1.0 if the extracted answer of `completion` matches `gold`, 0.0 if not, NaN on timeout."""
    if gold is None:
        return 0.0
    predicted = extract_answer(completion)
    if predicted is None:
        return 0.0
    try:
        return 1.0 if answers_match(predicted, str(gold), timeout_s=timeout_s) else 0.0
    except VerifierError:  # a timeout, or a verifier worker that died
        return TIMED_OUT


@register_reward("math")
def math_reward(
    prompts: list[str], completions: list[str], answer: list[Any] | None = None, **_: Any
) -> list[float]:
    """Answer correctness against the ``answer`` column (NaN marks a verifier timeout; None,
    TRL's "does not apply", a row without a gold answer: `data.answer_column=null`)."""
    if answer is None:
        raise ValueError("the 'math' reward needs an 'answer' column")
    timeout_s = current_verifier_timeout()
    return [
        None if gold in (None, "") else math_score(c, gold, timeout_s)
        for c, gold in zip(completions, answer, strict=True)
    ]


math_reward.self_timed = True  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- format

_TAG = re.compile(r"</?(?:think|answer)>")
_OPENED_IN_PROMPT = re.compile(r"<think>\s*\Z")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_FULL = [_THINK_OPEN, _THINK_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE]


def _tags(text: str) -> tuple[list[str], list[int], list[int]]:
    """The think/answer tags of `text` in order, with their start and end offsets."""
    matches = list(_TAG.finditer(text))
    return [m.group(0) for m in matches], [m.start() for m in matches], [m.end() for m in matches]


def format_score(completion: str) -> float:
    """1.0 if `completion` is ``<think>…</think>`` then ``<answer>…</answer>`` and nothing else.

    The opening ``<think>`` may be missing (the prompt template often emits it); each tag may
    appear only once, the answer must not be empty, and only whitespace may surround the blocks.
    """
    names, starts, ends = _tags(completion)
    if names not in (_FULL, _FULL[1:]):
        return 0.0
    if names[0] == _THINK_OPEN and completion[: starts[0]].strip():
        return 0.0
    close, answer_open, answer_close = -3, -2, -1
    between = completion[ends[close] : starts[answer_open]]
    answer = completion[ends[answer_open] : starts[answer_close]]
    after = completion[ends[answer_close] :]
    return 1.0 if not between.strip() and answer.strip() and not after.strip() else 0.0


def format_strict_score(completion: str, prompt: str = "") -> float:
    """1.0 only for the exact layout ``<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>``.

    This is open-r1's ``format_reward``
    (``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$``) with non-blank reasoning and
    answer: each tag once, the newlines as shown, nothing before, only whitespace after. When
    `prompt` ends with ``<think>`` (and whitespace), the template has opened the block: the
    completion continues it and must not open it again.
    """
    opened = _OPENED_IN_PROMPT.search(prompt)
    text = (prompt[opened.start() :] if opened else "") + completion
    names, starts, ends = _tags(text)
    if names != _FULL or starts[0] != 0:
        return 0.0
    think, answer = text[ends[0] : starts[1]], text[ends[2] : starts[3]]
    layout_ok = (
        think.startswith("\n")
        and think.endswith("\n")
        and text[ends[1] : starts[2]] == "\n"
        and answer.startswith("\n")
        and answer.endswith("\n")
    )
    filled = bool(think.strip()) and bool(answer.strip())
    return 1.0 if layout_ok and filled and not text[ends[3] :].strip() else 0.0


def format_lenient_score(completion: str) -> float:
    """1.0 if a ``</think>`` is followed, anywhere later, by a non-empty ``<answer>…</answer>``.

    Text may surround the blocks and tags may repeat (the last answer block after the first
    ``</think>`` counts; it must hold no other tag). Like the "soft" format reward of the
    widely copied GRPO demo (``<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>``), but
    without its ``re.match`` anchoring at the start.
    """
    think_end = completion.find(_THINK_CLOSE)
    if think_end < 0:
        return 0.0
    close = completion.rfind(_ANSWER_CLOSE)
    open_ = completion.rfind(_ANSWER_OPEN, think_end, close) if close > think_end else -1
    if open_ < 0:
        return 0.0
    answer = completion[open_ + len(_ANSWER_OPEN) : close]
    return 1.0 if answer.strip() and _TAG.search(answer) is None else 0.0


@register_reward("format")
def format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """DeepSeek-R1's format reward: ``<think>…</think><answer>…</answer>`` → 1.0, else 0.0."""
    return [format_score(c) for c in completions]


@register_reward("format_strict")
def format_strict_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """open-r1's strict layout ``<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>`` → 1.0."""
    return [format_strict_score(c, p) for p, c in zip(prompts, completions, strict=True)]


@register_reward("format_lenient")
def format_lenient_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """A ``</think>`` followed by a non-empty ``<answer>…</answer>``, anything around → 1.0."""
    return [format_lenient_score(c) for c in completions]


# --------------------------------------------------------------------------- countdown

_MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS = re.compile(r"[\d\s+\-*/()]+")
_SYMBOLS = {"×": "*", "÷": "/", "−": "-", "\\times": "*", "\\div": "/", "\\cdot": "*"}
_SYMBOLS |= {"\\left": "", "\\right": ""}
_BINARY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an arithmetic AST; records each integer literal in `used`."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError("division by zero")
        return _BINARY_OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, used)
    raise ValueError(f"{type(node).__name__} is not allowed in a countdown expression")


def evaluate_countdown(expression: str, numbers: Sequence[int]) -> Fraction | None:
    """Exact value of `expression`, or None if it is not a valid countdown expression.

    Valid: integers, ``+ - * /`` (and unary minus) and parentheses only, each integer one of
    `numbers`, used at most as many times as it is given. Parsed with `ast`, never evaluated by
    Python; arithmetic is exact (`fractions.Fraction`).
    """
    for symbol, replacement in _SYMBOLS.items():
        expression = expression.replace(symbol, replacement)
    if len(expression) > _MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        return None
    used: list[int] = []
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None
    if Counter(used) - Counter(int(n) for n in numbers):
        return None  # a number not given, or one given number used twice
    return value


def countdown_score(answer: str | None, numbers: Sequence[int], target: int) -> float:
    """1.0 if `answer` is a valid expression over `numbers` equal to `target`, else 0.0.

    A trailing ``= target`` (``(3+5)*3 = 24``) is accepted; any other ``=`` is not.
    """
    if answer is None:
        return 0.0
    if "=" in answer:
        expression, _, result = answer.partition("=")
        if "=" in result or parse_number(result) != Fraction(int(target)):
            return 0.0
        answer = expression
    value = evaluate_countdown(answer, numbers)
    return 1.0 if value is not None and value == int(target) else 0.0


@register_reward("countdown")
def countdown_reward(
    prompts: list[str],
    completions: list[str],
    numbers: list[list[int]] | None = None,
    target: list[int] | None = None,
    **_: Any,
) -> list[float]:
    """Countdown (TinyZero): the answer expression reaches ``target`` using ``numbers``."""
    if numbers is None or target is None:
        raise ValueError("the 'countdown' reward needs 'numbers' and 'target' columns")
    return [
        countdown_score(extract_answer(c), nums, goal)
        for c, nums, goal in zip(completions, numbers, target, strict=True)
    ]


@register_reward("tool_error")
def tool_error_reward(
    prompts: list[str],
    completions: list[str],
    failed_calls: list[int] | None = None,
    **_: Any,
) -> list[float]:
    """-1.0 for a completion with a failed tool call (an output beginning `error:`, as a tool
    reports bad input, a timeout or a crash, or a call that could not be read:
    `rlvr.rollout.tools`), else 0.0. ToRL's penalty for code that does not run (Li et al. 2025,
    *ToRL: Scaling Tool-Integrated RL*, arXiv:2503.23383, §2: −0.5 beside a ±1 answer reward)
    is this entry at weight 0.5 beside `verifier` at weight 2 (the `torl` preset).
    `failed_calls` (per completion) comes with rollouts that call tools (`rollout.tools`)."""
    if failed_calls is None:
        raise ValueError("the 'tool_error' reward needs rollouts with tools (rollout.tools)")
    return [-1.0 if failed else 0.0 for failed in failed_calls]
