"""Language consistency (DeepSeek-R1): the share of chain-of-thought words in the target
language, checked against fractions counted by hand."""

from __future__ import annotations

import pytest

from rlvr.rewards import compose_rewards, get_reward, language_consistency_score, language_reward
from rlvr.rewards.language import chain_of_thought, word_scripts


def test_chain_of_thought_is_the_think_block() -> None:
    assert chain_of_thought("<think>plan</think><answer>5</answer>") == "plan"
    assert chain_of_thought("plan without opening tag</think>answer") == "plan without opening tag"
    assert chain_of_thought("no tags at all") == "no tags at all"
    # A completion that closes the block at once (the template opened it) has no reasoning:
    # the answer after it is not the chain of thought.
    assert chain_of_thought("</think>the answer is five") == ""
    assert language_consistency_score("</think>the answer is five", "en") == 0.0


def test_word_scripts() -> None:
    # Han and kana count one word per character; digits, punctuation and math are not words
    text = "Hello 世界, привет! 안녕하세요 です café 42 $x^2$ `code` مرحبا"
    assert word_scripts(text) == [
        "latin", "han", "han", "cyrillic", "hangul", "kana", "kana", "latin", "other",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "target", "expected"),
    [
        # The, answer, is: 3 Latin words of 3 (42 is no word)
        ("<think>The answer is 42.</think><answer>42</answer>", "en", 1.0),
        # 我 们 这 个 (4 Han) and compute, sum (2 Latin): 4/6 for zh, 2/6 for en
        ("<think>我们 compute 这个 sum</think>", "zh", 4 / 6),
        ("<think>我们 compute 这个 sum</think>", "en", 2 / 6),
        # the math span goes: Let, x (Latin) and 所 以 (Han): 2/4
        ("<think>Let $x^2 = 4$, 所以 x = 2</think>", "en", 2 / 4),
        ("<think>Let $x^2 = 4$, 所以 x = 2</think>", "zh", 2 / 4),
        # こ れ は で す (5 kana) and test: 5/6
        ("これは test です", "ja", 5 / 6),
        # 漢 字 (Han counts for Japanese) and か な: 4/4
        ("漢字かな", "ja", 1.0),
        # 이것은, 테스트 (2 Hangul words) and test: 2/3
        ("이것은 테스트 test", "ko", 2 / 3),
        # Привет, мир and world: 2/3
        ("Привет world мир", "ru", 2 / 3),
        # the fenced code goes: 计 算 only
        ("<think>```python\nprint('x')\n```\n计算</think>", "zh", 1.0),
        # a decomposed é is one Latin word with its letter
        ("cafe\u0301 nai\u0308ve", "en", 1.0),
        # no words at all
        ("<think>1 + 2 = 3</think>", "en", 0.0),
        ("", "zh", 0.0),
    ],
)
def test_hand_checked_fractions(text: str, target: str, expected: float) -> None:
    assert language_consistency_score(text, target) == pytest.approx(expected)


def test_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown target language 'xx'"):
        language_consistency_score("text", "xx")


def test_language_reward_reads_the_optional_column() -> None:
    assert get_reward("language") is language_reward
    completions = ["<think>all English words</think>", "<think>全部 English</think>"]
    assert language_reward(["p", "q"], completions) == [1.0, pytest.approx(1 / 3)]
    by_row = language_reward(["p", "q"], completions, language=["zh", None])
    assert by_row == [0.0, pytest.approx(1 / 3)]  # None falls back to English
    output = compose_rewards([("language", 0.5)])(["p", "q"], completions, {"language": ["zh"] * 2})
    assert output.total == [0.0, pytest.approx(0.5 * 2 / 3)]


def test_text_is_nfc_normalised_before_counting() -> None:
    decomposed = "\u304b\u3099 cat"  # "が" written as か + a combining dakuten
    assert language_consistency_score(decomposed, "en") == 0.5  # が is one word, not two


def test_the_chain_of_thought_starts_at_the_last_think_before_its_end() -> None:
    assert chain_of_thought("<think>a<think>b</think>c") == "b"
