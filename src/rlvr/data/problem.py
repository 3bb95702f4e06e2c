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
