"""Prompt templates: how a raw question becomes the text the policy continues.

- `chat`: the tokenizer's own chat template, one user turn, generation prompt added.
- `r1`: DeepSeek-R1-Zero's plain-text conversation with think/answer tags (Guo et al. 2025).
- `qwen_math`: Qwen2.5-Math's system prompt asking for a boxed answer (used by Dr. GRPO).
- `none`: the question as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlvr.config import ConfigError
from rlvr.data.problem import Problem

R1_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think> <answer> answer here </answer>.\nUser: {question}\nAssistant: <think>"
)
QWEN_MATH_PROMPT = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within "
    "\\boxed{{}}.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
)


Prompt = str | list[dict[str, str]]
"""A question, or a conversation (TRL's conversational format), which only `chat` renders."""


def _chat(prompt: Prompt, tokenizer: PreTrainedTokenizerBase, **chat_kwargs: Any) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "data.template=chat needs a tokenizer with a chat template; this one has none "
            "(use data.template=r1, qwen_math or none)"
        )
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **chat_kwargs
    )


TEMPLATES: dict[str, Callable[..., str]] = {
    "chat": _chat,
    "r1": lambda question, _tok: R1_PROMPT.format(question=question),
    "qwen_math": lambda question, _tok: QWEN_MATH_PROMPT.format(question=question),
    "none": lambda question, _tok: question,
}
"""name -> ``render(prompt, tokenizer)``; `chat` also takes the chat template's arguments."""


def apply_template(
    name: str,
    question: Prompt,
    tokenizer: PreTrainedTokenizerBase,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render `question` (a conversation only with `chat`) with the named template;
    `chat_kwargs` go to the tokenizer's chat template (`data.chat_template_kwargs`)."""
    if name not in TEMPLATES:
        raise ConfigError(f"unknown data.template {name!r}; choose from {sorted(TEMPLATES)}")
    if isinstance(question, list) and name != "chat":
        raise ConfigError(
            f"data.template={name}: conversational prompts (lists of messages) need "
            "data.template=chat"
        )
    if chat_kwargs and name != "chat":
        raise ConfigError(f"data.chat_template_kwargs are for data.template=chat, not {name}")
    return TEMPLATES[name](question, tokenizer, **(chat_kwargs or {}))


def encode_prompts(
    name: str,
    questions: list[Prompt],
    tokenizer: PreTrainedTokenizerBase,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[str], list[list[int]]]:
    """Templated prompt texts and their token ids (no extra special tokens: the template has
    them), the one way SFT, RL and evaluation turn questions into model input."""
    texts = [apply_template(name, q, tokenizer, chat_kwargs) for q in questions]
    return texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def longest_prompt(
    name: str,
    problems: list[Problem],
    tokenizer: PreTrainedTokenizerBase,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> int:
    """The most tokens of any of `problems`' prompts rendered with template `name` (0 for
    no problems)."""
    _, ids = encode_prompts(name, [p.prompt for p in problems], tokenizer, chat_kwargs)
    return max(map(len, ids), default=0)


def short_prompts(
    name: str,
    problems: list[Problem],
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> list[Problem]:
    """The problems whose prompt, rendered with template `name`, is at most `max_tokens`
    tokens, in their order (verl's `filter_overlong_prompts`; TRL's `max_prompt_length` cuts
    them instead, which can cut the question a verifiable answer depends on)."""
    _, ids = encode_prompts(name, [p.prompt for p in problems], tokenizer, chat_kwargs)
    return [p for p, row in zip(problems, ids, strict=True) if len(row) <= max_tokens]
