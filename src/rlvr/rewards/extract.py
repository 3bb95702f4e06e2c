"""Final-answer extraction from a model completion.

`extract_answer` looks, in this order, for:

1. the last closed ``<answer>...</answer>``: its box if it has one, else its "the answer is X"
   if it has one, else its whole content;
2. the last non-empty ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces match; ``\\boxed 5``
   works). The boxes just before it that are separated from it only by ``,`` / ``;`` / "and" /
   "or" / ``\\quad`` / ``x =`` are parts of the same answer and are joined with ``", "``
   (``x = \\boxed{1} or x = \\boxed{2}`` gives ``1, 2``); an empty ``\\boxed{}`` (an echo of
   the instruction "put your answer in \\boxed{}") is skipped;
3. the last "the answer is X" / "answer: X" / "answers are X" / "#### X". X runs to the end of
   its sentence and stops before a correction (", not 5"), a reason (" because") or a comma
   before a word (", as computed"); a negated phrase ("the answer is not 5") is no answer, and
   then only the text after its clause is searched for a number;
4. the last number: a sign (``-`` or ``−``) where it cannot be a binary minus, thousands
   commas (removed), decimals, scientific ``3e8``, a ratio ``3/4`` or ``\\frac{3}{4}``, and a
   trailing ``%``.

The result is stripped of surrounding whitespace, ``$``, ``\\( \\)``, ``\\[ \\]`` and ``**``
wrappers and a trailing ``.``, ``,`` or ``;``. Nothing found gives ``None``; so does an empty
``<answer></answer>``: an explicit empty answer is not replaced by a number from the reasoning.

Boxes beat phrases because a phrase is the noisier signal ("\\boxed{4}. So the answer is
correct."), as in the MATH and DeepSeek-R1 evaluation scripts. Every step is linear in the
length of the text (no regular expression here can backtrack quadratically), so hostile
completions cost milliseconds.
"""

from __future__ import annotations

import re

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_BOXED = re.compile(r"\\(?:boxed|fbox)(?:\s*\{|\s+(?=[^\s{$]))")
_BARE_TOKEN = re.compile(r"[^\s$]+")
# What may separate the boxes of one answer: "\boxed{1}, \boxed{2}", "x = \boxed{1} or x = ...".
# No two alternatives match at the same place, so the loop cannot backtrack.
_BOX_JOINER = re.compile(
    r"(?:\s|\$|,|;|\band\b|\bor\b|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\})*"
    r"(?:[A-Za-z](?:_\{?\d+\}?)?\s*=[\s$]*)?"
)
_JOINER_MARK = re.compile(r"[,;=]|\band\b|\bor\b|\\q?quad")
_MAX_JOINER_CHARS = 100
_ANSWER_PHRASE = re.compile(
    r"(?:\banswers?\s+(?:is|are|would\s+be|should\s+be|will\s+be)\b|\banswers?\s*[:=]|####)"
    r"\**:?\**[ \t]*",
    re.IGNORECASE,
)
# Where X of "the answer is X" stops: the end of its sentence, a correction ("3, not 5"), a
# reason ("because") or a comma before a word ("5, as computed"; but "1, and 2" goes on).
# A whitespace alternative starts only at the first character of a run of whitespace, so no
# run is scanned twice.
_PHRASE_STOP = re.compile(
    r"\.(?:\s|$)|;|(?:,|(?<!\s)\s)\s*(?:and\s+|but\s+)?not\b"
    r"|(?<!\s)\s+(?:because|since|which|instead|rather\s+than)\b"
    r"|,\s*(?!(?:and|or)\b)[A-Za-z]{2}",
    re.IGNORECASE,
)
_NEGATED = re.compile(r"not\b", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[.;,](?:\s|$)")
# A minus sign counts only where it cannot be a binary minus ("10-3" holds 10 and 3); a number
# never starts inside another one; "3e8", "3/4" and "\frac{3}{4}" are one number.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-−])?(?<![\d.])"
    r"(?:\\[dt]?frac\{\d+\}\{\d+\}"
    r"|(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:[eE][+-]?\d+(?![\w.])|/\d+(?![\d.]))?(?:\\?%)?)"
)
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
_MAX_CLEAN_ROUNDS = 8  # more nested wrappers than this are garbage, not an answer


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


def _unwrap_boxes(text: str, span: tuple[int, int], pairs: dict[int, int]) -> tuple[int, int]:
    """The span of the innermost content of a box of a box (``\\boxed{\\boxed{3}}`` → 3)."""
    while True:
        start, end = span
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        inner = _BOXED.match(text, start, end)
        if inner is None or pairs.get(inner.end() - 1) != end - 1:
            return span  # not a box, or two boxes: "\boxed{3} + \boxed{4}"
        span = (inner.end(), end - 1)


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every closed top-level box as ``(start, end, content)``, in order of appearance.

    `start`/`end` delimit the whole box (``\\boxed{`` to ``}``); boxes nested in a box belong
    to it; an unclosed box is skipped.
    """
    found: list[tuple[int, int, str]] = []
    pairs: dict[int, int] | None = None
    pos = 0
    while (match := _BOXED.search(text, pos)) is not None:
        if not match.group(0).endswith("{"):  # "\boxed 5": the token up to whitespace or "$"
            token = _BARE_TOKEN.match(text, match.end())
            assert token is not None  # the lookahead guarantees one character
            found.append((match.start(), token.end(), token.group(0)))
            pos = token.end()
            continue
        pairs = _brace_pairs(text) if pairs is None else pairs
        close = pairs.get(match.end() - 1)
        if close is None:
            pos = match.end()
            continue
        start, end = _unwrap_boxes(text, (match.end(), close), pairs)
        found.append((match.start(), close + 1, text[start:end]))
        pos = close + 1
    return found


def last_boxed_content(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{...}`` or ``\\fbox{...}`` in `text`.

    Braces nest (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); an unclosed box is ignored;
    a box of a box is unwrapped. The brace-less form ``\\boxed 5`` gives ``5``. Returns None
    when there is no box.
    """
    boxes = _boxes(text)
    return boxes[-1][2] if boxes else None


def _joins(gap: str) -> bool:
    """Whether `gap`, the text between two boxes, makes them parts of one answer."""
    return (
        len(gap) <= _MAX_JOINER_CHARS
        and _BOX_JOINER.fullmatch(gap) is not None
        and _JOINER_MARK.search(gap) is not None
    )


def _final_boxed_answer(text: str) -> str | None:
    """The last non-empty box, joined with the boxes just before it that are parts of the same
    answer (only joiners such as ``,`` / "and" / ``x =`` between them); None without one."""
    boxes = [box for box in _boxes(text) if _clean(box[2])]
    if not boxes:
        return None
    parts = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _joins(text[box[1] : parts[-1][0]]):
            break
        parts.append(box)
    return ", ".join(_clean(content) for _, _, content in reversed(parts))


def _clean(answer: str) -> str:
    """Strip whitespace, ``$`` / ``\\(`` / ``**`` wrappers and a trailing ``.`` ``,`` ``;``
    (not the ``.`` of ``\\right.``)."""
    for _round in range(_MAX_CLEAN_ROUNDS):
        previous = answer
        answer = answer.strip()
        if answer.endswith((".", ",", ";")) and not answer.endswith("\\right."):
            answer = answer[:-1]  # but "\right." is LaTeX's invisible delimiter, not a stop
        for left, right in _WRAPPERS:
            long_enough = len(answer) >= len(left) + len(right)
            if long_enough and answer.startswith(left) and answer.endswith(right):
                answer = answer[len(left) : -len(right)]
        answer = answer.strip("$").strip()
        if answer == previous:
            break
    return answer


def _answer_phrase(text: str) -> tuple[str | None, int]:
    """X of the last "the answer is X" and where the search for a number may start.

    Returns ``(X, 0)``; for a last phrase that is negated ("the answer is not 5, ...") returns
    ``(None, end of its clause)``: the number after the correction, if any, is the answer.
    Returns ``(None, 0)`` when there is no phrase. Works on positions, never on copies of the
    rest of the line, so a line of many phrases costs linear time.
    """
    for match in reversed(list(_ANSWER_PHRASE.finditer(text))):
        start = match.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        if _NEGATED.match(text, start, line_end):
            clause_end = _CLAUSE_END.search(text, start, line_end)
            return None, clause_end.end() if clause_end else line_end
        stop = _PHRASE_STOP.search(text, start, line_end)
        candidate = _clean(text[start : stop.start() if stop else line_end])
        if candidate:
            return candidate, 0
    return None, 0


def last_number(text: str) -> str | None:
    """The last number in `text` (``-3``, ``2.5``, ``1,234`` → ``1234``, ``3e8``, ``3/4``,
    ``-\\frac{3}{2}``, ``50%``), or None. A Unicode minus ``−`` becomes ``-``."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "").replace("−", "-") if matches else None


def _answer_tag_content(text: str) -> str | None:
    """Content of the last closed ``<answer>...</answer>`` (the last opening tag before the
    last closing one), or None. Found with `str.rfind`, so it is linear in the text."""
    close = text.rfind(_ANSWER_CLOSE)
    if close < 0:
        return None
    open_ = text.rfind(_ANSWER_OPEN, 0, close)
    return None if open_ < 0 else text[open_ + len(_ANSWER_OPEN) : close]


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, by the priority in the module docstring, or None."""
    content = _answer_tag_content(text)
    if content is not None:
        boxed = _final_boxed_answer(content)
        if boxed is not None:
            return boxed
        phrase, _ = _answer_phrase(content)
        return phrase if phrase is not None else (_clean(content) or None)
    boxed = _final_boxed_answer(text)
    if boxed is not None:
        return boxed
    phrase, offset = _answer_phrase(text)
    if phrase is not None:
        return phrase
    return last_number(text[offset:])
