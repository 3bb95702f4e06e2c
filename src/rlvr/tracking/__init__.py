"""Tracking: JSONL metrics (always on), report plots, optional TensorBoard / W&B (`loggers`).

`plot_runs` and `DEFAULT_METRICS` (which need matplotlib) are imported on first access, so the
training loop's JSONL logging stays cheap to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.tracking.jsonl import JsonlFormatError, JsonlWriter, read_jsonl, to_jsonable

if TYPE_CHECKING:
    from rlvr.tracking.report import DEFAULT_METRICS, plot_runs

__all__ = [
    "DEFAULT_METRICS",
    "JsonlFormatError",
    "JsonlWriter",
    "plot_runs",
    "read_jsonl",
    "to_jsonable",
]


def __getattr__(name: str) -> Any:
    if name in ("plot_runs", "DEFAULT_METRICS"):
        from rlvr.tracking.report import DEFAULT_METRICS, plot_runs

        return {"plot_runs": plot_runs, "DEFAULT_METRICS": DEFAULT_METRICS}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
