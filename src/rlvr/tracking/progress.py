"""A rich progress bar that shows the live reward and accuracy of an RL run."""

from __future__ import annotations

import math
from types import TracebackType

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class StepProgress:
    """`with StepProgress(total, start) as p: p.update(step, metrics)`; silent when disabled."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]RL"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._task = self._progress.add_task("rl", total=total, completed=start, status="")

    def __enter__(self) -> StepProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.enabled:
            self._progress.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Advance to `step` and show its reward, accuracy and response length."""
        accuracy = metrics["accuracy"]
        shown = "-" if math.isnan(accuracy) else f"{accuracy:.3f}"  # NaN: no gold answers
        status = (
            f"reward {metrics['reward/mean']:.3f}  acc {shown}  "
            f"len {metrics['response_length/mean']:.1f}"
        )
        self._progress.update(self._task, completed=step, status=status)
