"""The unit of every task: one question with its gold answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One verifiable problem, before any prompt template is applied."""

    question: str
    """The raw question text."""
    answer: str
    """The gold final answer, as a string the verifiers compare against."""
    solution: str | None = None
    """A worked solution (reasoning then answer) for cold-start SFT, when the task has one."""
    columns: dict[str, Any] = field(default_factory=dict)
    """Extra fields handed to reward functions as keyword columns (TRL's ``**kwargs``)."""
    messages: tuple[dict[str, str], ...] | None = None
    """A conversational prompt (TRL's list of ``{"role", "content"}`` messages, ending with the
    user's turn), rendered by the tokenizer's chat template; `question` is then its last user
    message."""

    @property
    def prompt(self) -> str | list[dict[str, str]]:
        """What the prompt template renders: the messages when there are, else the question."""
        return list(self.messages) if self.messages else self.question
