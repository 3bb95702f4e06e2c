"""Stop an RL run on SIGINT (Ctrl-C) or SIGTERM without losing its steps.

Slurm, Kubernetes and torchrun all announce the end of a job with one of these two signals and
kill it for good some seconds later (torchrun: 30 s after it forwards the signal to each rank).
Inside `StopOnSignal` the first signal only sets a flag: the step in progress finishes, the
loop saves a checkpoint and raises `RunStopped`, and ``rlvr train --resume`` continues from
that step as if the run had not stopped. A second Ctrl-C stops at once (`KeyboardInterrupt`),
losing the steps since the last checkpoint, as before. A SIGINT within `REPEAT_S` seconds of the
first counts as the same one: GNU ``timeout -s INT`` delivers one signal twice, to the process
and to its process group.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType

from rlvr.training.distributed import Ranks

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_S = 2.0
"""A SIGINT this soon after the first is the same press delivered twice, not a second one."""


class RunStopped(Exception):
    """The run stopped on a signal after writing the checkpoint of its last step."""

    def __init__(self, received: signal.Signals, step: int, checkpoint: Path) -> None:
        self.received, self.step, self.checkpoint = received, step, checkpoint
        self.exit_code = 128 + int(received)  # what the shell reports for a process it killed
        super().__init__(f"stopped by {received.name} after step {step}; checkpoint {checkpoint}")


class StopOnSignal:
    """While entered (from the main thread; elsewhere Python allows no handler), SIGINT and
    SIGTERM set `received` instead of stopping the process; leaving restores the handlers."""

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        self.received: signal.Signals | None = None
        self._since = 0.0
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup, `&`: stays ignored
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            if signum == signal.SIGINT and time.monotonic() - self._since >= REPEAT_S:
                raise KeyboardInterrupt
            return
        self.received, self._since = signal.Signals(signum), time.monotonic()
        if self.announce:
            print(
                f"\n{self.received.name}: stopping after this step with a checkpoint "
                "(Ctrl-C again stops at once, without one)",
                file=sys.stderr,
                flush=True,
            )

    def agreed(self, ranks: Ranks) -> signal.Signals | None:
        """The signal any rank has received, on every rank, so that the ranks stop at the
        same step (one small collective per call when data-parallel)."""
        if ranks.world == 1:
            return self.received
        return next((s for s in ranks.gather(self.received) if s is not None), None)
