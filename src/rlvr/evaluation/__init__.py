"""Evaluation: unbiased pass@k, maj@k, and evaluating a model on a task.

`evaluate` (which needs torch and transformers) is imported on first access, so the pure
metric functions stay cheap to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.evaluation.metrics import majority_at_k, mean_majority_at_k, mean_pass_at_k, pass_at_k

if TYPE_CHECKING:
    from rlvr.evaluation.evaluate import evaluate

__all__ = ["evaluate", "majority_at_k", "mean_majority_at_k", "mean_pass_at_k", "pass_at_k"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from rlvr.evaluation.evaluate import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
