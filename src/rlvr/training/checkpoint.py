"""Checkpoints: HF model + tokenizer + trainer state, written atomically.

A checkpoint is written to `checkpoints/.step-N.tmp` and renamed to `checkpoints/step-N` only
when complete, so resume never sees a half-written folder (a stale `.tmp` is ignored).
"""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM

from rlvr.config import ConfigError
from rlvr.models import lora
from rlvr.models.loading import loading_bar, save_pretrained
from rlvr.run_layout import (
    CHECKPOINTS,
    STATE_FILE,
    checkpoint_path,
    checkpoint_step,
    latest_checkpoint,
)
from rlvr.tracking.jsonl import JsonlWriter, read_jsonl
from rlvr.training import sharding


def rng_state() -> dict[str, Any]:
    """Every global random state a run touches."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    state: dict[str, Any],
    weights: dict[str, torch.Tensor] | None = None,
    keep: int = 0,
) -> Path:
    """Write `checkpoint_path(run_dir, step)` atomically; return it. `weights`: the whole
    weights of a sharded model (`sharding.whole_state`); `keep` > 0: then delete all but the
    newest `keep` checkpoints (`prune_checkpoints`)."""
    final = checkpoint_path(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pretrained(model, tokenizer, tmp, weights)
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep:
        prune_checkpoints(run_dir, keep)
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete the complete `step-N` checkpoints of `run_dir` but the `keep` with the highest
    steps (TRL's save_total_limit, verl's max_actor_ckpt_to_keep); return what was deleted.
    Incomplete folders and other names (`step-best`) are left alone."""
    folder = run_dir / CHECKPOINTS
    steps = sorted(
        (checkpoint_step(p), p)
        for p in folder.iterdir()
        if checkpoint_step(p) is not None and (p / STATE_FILE).is_file()
    )
    old = [path for _, path in steps[: max(len(steps) - keep, 0)]]
    for path in old:
        shutil.rmtree(path)
    return old


class CheckpointError(ValueError):
    """A checkpoint whose files cannot be read, or whose weights do not fit the run's model."""


DAMAGED = "damaged; delete that folder and --resume continues from the checkpoint before it"


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state saved next to the model weights."""
    path = checkpoint / STATE_FILE
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise CheckpointError(f"{path} cannot be read ({error}): {DAMAGED}") from None


def load_model_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint's weights into `model`: its adapter for a LoRA model (whose base
    weights are those it was loaded with), else the saved model's weights."""
    try:
        if lora.has_lora(model):
            lora.load_adapter(model, checkpoint)
            return
        with loading_bar(checkpoint):
            weights = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=model.dtype)
    except (OSError, SafetensorError) as error:
        raise CheckpointError(
            f"{checkpoint}: the weights cannot be read ({error}): {DAMAGED}"
        ) from None
    except ValueError as error:  # an adapter of another rank or target modules
        raise CheckpointError(str(error)) from None
    try:
        sharding.load_whole_state(model, weights.state_dict())
    except RuntimeError as error:  # another shape: the model settings changed since
        first = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), "")
        raise CheckpointError(
            f"{checkpoint}: the weights do not fit this run's model ({first}); resume with "
            "the model settings the run was saved with"
        ) from None


def checkpoint_to_resume(run_dir: Path, resume: bool, key: str) -> Path | None:
    """The checkpoint `--resume` continues (None for a fresh run). Refuses to mix two runs in
    one directory (`key` names its setting): a fresh run where an earlier one saved
    checkpoints (its logs would be replaced and a later `--resume` would continue the
    earlier weights), or `--resume` where no checkpoint was saved."""
    checkpoint = latest_checkpoint(run_dir)
    if resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir}/checkpoints")
    if not resume and checkpoint is not None:
        raise ConfigError(
            f"{key}={str(run_dir)!r} holds an earlier run (checkpoint {checkpoint.name}); "
            f"continue it with --resume, or choose another {key}, or delete that folder"
        )
    return checkpoint


def keep_until_step(path: Path, step: int) -> None:
    """Drop the records of `path` logged after `step` (all of them for a fresh run)."""
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if step and r.get("step", 0) <= step]
    path.unlink()
    with JsonlWriter(path) as writer:
        for record in kept:
            writer.write(record)
