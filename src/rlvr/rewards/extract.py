"""Final-answer extraction from a model completion.

`extract_answer` looks, in this order, for:

1. the content of the last ``<answer>...</answer>`` (its ``\\boxed{}`` content if it has one);
2. the last ``\\boxed{...}`` / ``\\fbox{...}``, matching nested braces;
3. the last "the answer is X" / "answer: X" / "#### X" (X runs to the end of its sentence);
4. the last number (``-3``, ``2.5``, ``1,234``; thousands commas are removed).

The result is stripped of surrounding whitespace, ``$`` and ``\\( \\)`` delimiters and a trailing
period. Nothing found gives ``None``; so does an empty ``<answer></answer>``: an explicit empty
answer is not silently replaced by a number taken from the reasoning.
"""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)(?:\s*\{|\s+(?=[^\s{$]))")
_BARE_TOKEN = re.compile(r"[^\s$]+")
_ANSWER_PHRASE = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|answer\s*:|####)\**:?\**[ \t]*(?P<rest>[^\n]*)",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# A minus sign counts only where it cannot be a binary minus ("10-3" holds 10 and 3); a number
# never starts inside another one.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?(?<![\d.])"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each ``{`` → index of its closing ``}``, in one pass (unclosed ones are absent).

    Escaped braces ``\\{`` and ``\\}`` do not nest.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and text[i + 1 : i + 2] in ("{", "}"):
            i += 2
            continue
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def last_boxed_content(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{...}`` or ``\\fbox{...}`` in `text`.

    Braces nest (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); an unclosed box is ignored.
    The brace-less form ``\\boxed 5`` gives ``5``. Returns None when there is no box.
    """
    found: str | None = None
    span: tuple[int, int] | None = None  # where `found` lies in `text`, for a braced box
    pairs: dict[int, int] | None = None
    pos = 0
    while (match := _BOXED.search(text, pos)) is not None:
        if not match.group(0).endswith("{"):  # "\boxed 5": the token up to whitespace or "$"
            token = _BARE_TOKEN.match(text, match.end())
            assert token is not None  # the lookahead guarantees one character
            found, span, pos = token.group(0), None, token.end()
            continue
        pairs = _brace_pairs(text) if pairs is None else pairs
        close = pairs.get(match.end() - 1)
        if close is None:
            pos = match.end()
            continue
        span = (match.end(), close)
        found, pos = text[match.end() : close], close + 1  # nested boxes belong to this one
    while span is not None and pairs is not None:  # "\boxed{\boxed{3}}" is a box of a box
        start, end = span
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        inner = _BOXED.match(text, start, end)
        if inner is None or pairs.get(inner.end() - 1) != end - 1:
            break  # not a box, or two boxes: "\boxed{3} + \boxed{4}"
        span = (inner.end(), end - 1)
        found = text[span[0] : span[1]]
    return found


def _clean(answer: str) -> str:
    """Strip whitespace, ``$`` / ``\\(`` delimiters and a trailing period, until stable."""
    previous = None
    while previous != answer:
        previous = answer
        answer = answer.strip()
        if answer.endswith("."):
            answer = answer[:-1]
        for left, right in _WRAPPERS:
            long_enough = len(answer) >= len(left) + len(right)
            if long_enough and answer.startswith(left) and answer.endswith(right):
                answer = answer[len(left) : -len(right)]
        answer = answer.strip("$").strip()
    return answer


def _answer_phrase(text: str) -> str | None:
    """X of the last "the answer is X" / "answer: X" / "#### X", cut at the end of its sentence."""
    for match in reversed(list(_ANSWER_PHRASE.finditer(text))):
        rest = match.group("rest")
        end = _SENTENCE_END.search(rest)
        candidate = _clean(rest[: end.start()] if end else rest)
        if candidate:
            return candidate
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` (``-3``, ``2.5``, ``1,234`` → ``1234``), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, by the priority in the module docstring, or None."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        content = tags[-1]
        boxed = last_boxed_content(content)
        answer = _clean(boxed if boxed is not None else content)
        return answer or None
    boxed = last_boxed_content(text)
    if boxed is not None:
        return _clean(boxed) or None
    phrase = _answer_phrase(text)
    if phrase is not None:
        return phrase
    return last_number(text)
