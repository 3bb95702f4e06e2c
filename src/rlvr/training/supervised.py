"""What the SFT and DPO loops share: cutting examples to a length, the example order,
checkpoints, `--resume`, and stopping on a signal.

Both loops draw `batch_size` examples a step from a shuffled order that is refilled with a
new permutation when it runs short. A checkpoint (`output_dir/checkpoints/step-N`, as
`rlvr train` writes them) holds the weights, AdamW, the schedule, that order and its random
state, and the global random states, so a resumed run continues the straight run's
trajectory: the same examples, the same updates.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.run_layout import checkpoint_path
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.loggers import MetricLoggers
from rlvr.training import sharding
from rlvr.training.checkpoint import (
    load_model_weights,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)
from rlvr.training.distributed import Ranks
from rlvr.training.optim import load_optimizer_state, optimizer_state
from rlvr.training.stopping import RunStopped, StopOnSignal


def keep_start(
    prompt: Sequence[int], responses: Sequence[list[int]], max_length: int | None
) -> list[list[int]] | None:
    """Each response cut so that the prompt and it hold at most `max_length` tokens, keeping
    its start (TRL's ``truncation_mode="keep_start"``); None when the prompt leaves no room
    for a response token. `max_length` None: the responses as they are."""
    if max_length is None:
        return list(responses)
    room = max_length - len(prompt)
    return [response[:room] for response in responses] if room > 0 else None


def cut_to_length(
    prompts: list[list[int]],
    responses: list[list[list[int]]],
    max_length: int | None,
    key: str,
) -> tuple[list[int], list[list[list[int]]]]:
    """`keep_start` on every example (a prompt and its responses): the indices of the examples
    kept and their responses. Examples whose prompt leaves no room are left out, and a warning
    names `key` and says how many were left out and how many responses were cut."""
    kept, cut_responses, dropped, cut = [], [], 0, 0
    for i, (prompt, theirs) in enumerate(zip(prompts, responses, strict=True)):
        short = keep_start(prompt, theirs, max_length)
        if short is None:
            dropped += 1
            continue
        cut += sum(len(a) < len(b) for a, b in zip(short, theirs, strict=True))
        kept.append(i)
        cut_responses.append(short)
    if dropped or cut:
        warnings.warn(
            f"{key}={max_length}: {cut} response(s) cut to fit; {dropped} of {len(prompts)} "
            f"example(s) left out, their prompt alone {max_length} tokens or more",
            stacklevel=2,
        )
    return kept, cut_responses


@dataclass
class ExampleOrder:
    """The order in which a loop draws its examples, seeded, and the step it has reached."""

    rng: random.Random
    order: list[int] = field(default_factory=list)
    step: int = 0

    def next_rows(self, batch_size: int, examples: int) -> list[int]:
        """The next `batch_size` example indices, refilling the order with a fresh
        permutation of range(examples) when fewer are left."""
        if len(self.order) < batch_size:
            fresh = list(range(examples))
            self.rng.shuffle(fresh)
            self.order.extend(fresh)
        rows, self.order = self.order[:batch_size], self.order[batch_size:]
        return rows


MAX_NONFINITE_STEPS = 3
"""Updates in a row skipped for a non-finite loss or gradient that stop `rlvr sft`/`dpo`."""


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


@dataclass
class LoopState:
    """A supervised loop's model, optimizer and schedule, with its example order."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    examples: ExampleOrder
    bad_steps: int = 0
    """Consecutive steps skipped for a non-finite loss or gradient, up to the last step
    (`update`), saved with the checkpoints so that a resumed run counts on."""

    def update(self, loss: float, grad_norm: float, where: str) -> bool:
        """Step the optimizer and the schedule when `loss` and `grad_norm` are finite; else
        skip the update with a warning naming `where` (a step), and count it. Whether it
        stepped."""
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        self.bad_steps = 0 if finite else self.bad_steps + 1
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        else:
            warnings.warn(f"{where}: non-finite loss or gradient, skipped", stacklevel=2)
        return finite

    def stop_if_failing(self, remedy: str) -> None:
        """Raise `NonFiniteError` once `MAX_NONFINITE_STEPS` updates in a row were skipped."""
        if self.bad_steps >= MAX_NONFINITE_STEPS:
            raise NonFiniteError(
                f"{self.bad_steps} consecutive steps had a non-finite loss or gradient; "
                f"stopping ({remedy})"
            )

    def score_held_out(
        self,
        step: int,
        score: Callable[[], dict[str, float]],
        ev: JsonlWriter,
        loggers: MetricLoggers,
    ) -> None:
        """Score the held-out set at `step`: `score()` in eval mode with the whole weights
        (gathered under FSDP), written to eval.jsonl (`ev`) as `{step, **scores}` and to the
        loggers as `eval/<name>`; then back to training mode. Every rank calls this."""
        self.model.eval()
        with sharding.full_weights(self.model):
            scores = score()
        ev.write({"step": step, **scores})
        loggers.log({f"eval/{key}": value for key, value in scores.items()}, step)
        self.model.train()

    def resume(self, checkpoint: Path) -> int:
        """Load `checkpoint` into every part (on every rank); return its step."""
        load_model_weights(self.model, checkpoint)
        state = load_trainer_state(checkpoint)
        load_optimizer_state(self.optimizer, state["optimizer"], self.model)
        self.scheduler.load_state_dict(state["scheduler"])
        self.examples.rng.setstate(state["order_rng"])
        self.examples.order, self.examples.step = state["order"], state["step"]
        self.bad_steps = state.get("bad_steps", 0)  # absent from checkpoints before 11-29
        restore_rng_state(state["rng"])
        return self.examples.step

    def after_step(
        self,
        step: int,
        steps: int,
        out_dir: Path,
        save_every: int,
        keep: int,
        stop: StopOnSignal,
        ranks: Ranks,
    ) -> None:
        """Checkpoint step `step` every `save_every` steps before the last (the last saves
        the model itself), or when a signal arrived; then raise `RunStopped` for the signal.
        Every rank calls this."""
        received = stop.agreed(ranks) if step < steps else None
        due = bool(save_every) and step % save_every == 0 and step < steps
        if not due and received is None:
            return
        state = {
            "optimizer": optimizer_state(self.optimizer, self.model),
            "scheduler": self.scheduler.state_dict(),
            "order_rng": self.examples.rng.getstate(),
            "order": self.examples.order,
            "bad_steps": self.bad_steps,
        }
        weights = sharding.whole_state(self.model)
        if ranks.main:
            save_checkpoint(out_dir, step, self.model, self.tokenizer, state, weights, keep)
        if received is not None:
            raise RunStopped(received, step, checkpoint_path(out_dir, step))
