"""Language-consistency reward (DeepSeek-R1): the share of chain-of-thought words in the target
language.

`language_consistency_score(text, target)` takes the chain of thought (the text inside
``<think>…</think>``; the text before ``</think>`` when the opening tag is missing; else the
whole completion), drops math and code (``$…$``, ``$$…$$``, ``\\(…\\)``, ``\\[…\\]``, backtick
spans and fences), splits the rest into words and returns the fraction of words written in the
target language's script. Words: a run of letters of one alphabetic script (Latin, Cyrillic,
Hangul, any other), or a single Han or kana character (Chinese and Japanese do not separate
words, so each character counts as one). Digits and punctuation are not words.

Departures from the paper: R1 does not say how it decides a word's language. This decides by
script, so ``en`` cannot tell English from French, and ``ja`` counts Han characters as Japanese.
A chain of thought with no words scores 0.0.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from rlvr.rewards.registry import register_reward

_SCRIPTS = {
    "latin": "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff",
    "cyrillic": "\u0400-\u04ff\u0500-\u052f",
    "hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "kana": "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff",
    "han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df",
}
_PER_CHARACTER = ("kana", "han")
_KNOWN = "".join(_SCRIPTS.values())
_WORD = re.compile(
    "|".join(
        [
            f"(?P<{name}>[{chars}]{'' if name in _PER_CHARACTER else '+'})"
            for name, chars in _SCRIPTS.items()
        ]
        + [rf"(?P<other>[^\W\d_{_KNOWN}]+)"]
    )
)
_MATH_OR_CODE = re.compile(
    r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL
)

TARGET_SCRIPTS = {
    "en": frozenset({"latin"}),
    "zh": frozenset({"han"}),
    "ja": frozenset({"han", "kana"}),
    "ko": frozenset({"hangul"}),
    "ru": frozenset({"cyrillic"}),
}
"""The scripts whose words count as each target language's."""


def chain_of_thought(text: str) -> str:
    """The text inside ``<think>…</think>``, the text before ``</think>``, or all of `text`."""
    end = text.find("</think>")
    if end < 0:
        return text
    start = text.rfind("<think>", 0, end)
    return text[start + len("<think>") if start >= 0 else 0 : end]


def word_scripts(text: str) -> list[str]:
    """The script of each word of `text`, math and code removed (see the module docstring)."""
    prose = _MATH_OR_CODE.sub(" ", unicodedata.normalize("NFC", text))
    return [match.lastgroup or "other" for match in _WORD.finditer(prose)]


def language_consistency_score(text: str, target: str = "en") -> float:
    """Fraction of the chain-of-thought words of `text` written in `target`'s script."""
    if target not in TARGET_SCRIPTS:
        known = ", ".join(sorted(TARGET_SCRIPTS))
        raise ValueError(f"unknown target language {target!r}; known: {known}")
    scripts = word_scripts(chain_of_thought(text))
    if not scripts:
        return 0.0
    return sum(script in TARGET_SCRIPTS[target] for script in scripts) / len(scripts)


@register_reward("language")
def language_reward(
    prompts: list[str], completions: list[str], language: list[str] | None = None, **_: Any
) -> list[float]:
    """R1's language-consistency reward; the optional ``language`` column defaults to ``en``."""
    targets = language if language is not None else ["en"] * len(completions)
    return [
        language_consistency_score(completion, target or "en")
        for completion, target in zip(completions, targets, strict=True)
    ]
