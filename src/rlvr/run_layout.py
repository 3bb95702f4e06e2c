"""Where a run directory keeps what (DESIGN.md's run directory): paths only, no torch.

`RUN_DIR/config.yaml` is the resolved config, `RUN_DIR/checkpoints/step-N/` a checkpoint: a
Hugging Face model folder plus `trainer_state.pt`, which is written last, so a folder without
it is incomplete. `rlvr sft` and `rlvr dpo` write their config.yaml beside their final
model, and their checkpoints (`sft.save_every`, `dpo.save_every`) in the same layout.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.yaml"
CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
ADAPTER_DIR = "adapter"
"""A LoRA model folder's adapter alone, in peft's format (`models.lora.save_adapter`)."""
RUN_LOGS = ("metrics.jsonl", "samples.jsonl", "eval.jsonl")
"""The JSON-lines logs of a run directory, each a line per step."""


def checkpoint_path(run_dir: Path, step: int) -> Path:
    """The folder of step `step`'s checkpoint: `run_dir/checkpoints/step-{step}`."""
    return run_dir / CHECKPOINTS / f"step-{step}"


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step of a `step-N` checkpoint folder; None for any other name (`step-best`)."""
    number = checkpoint.name.removeprefix("step-")
    return int(number) if number != checkpoint.name and number.isdecimal() else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint (`step-N` with its trainer state) with the highest step, or
    None; other folders (a copy named `step-best`, say) are not checkpoints."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return None
    steps = {checkpoint_step(p): p for p in folder.iterdir() if (p / STATE_FILE).is_file()}
    steps.pop(None, None)
    return steps[max(steps)] if steps else None


def saved_config(model_dir: Path) -> Path | None:
    """The config.yaml of the rlvr run that saved the model in `model_dir`: beside it (`rlvr
    sft`, `rlvr dpo`) or, for `RUN_DIR/checkpoints/step-N`, the run's; for the `adapter/`
    folder of either, that of the model folder holding it; None if there is none."""
    if model_dir.name == ADAPTER_DIR and not (model_dir / CONFIG_FILE).is_file():
        return saved_config(model_dir.parent)
    candidates = [model_dir / CONFIG_FILE]
    if model_dir.parent.name == CHECKPOINTS:
        candidates.append(model_dir.parent.parent / CONFIG_FILE)
    return next((c for c in candidates if c.is_file()), None)


def evaluated_folder(path: Path) -> Path:
    """The model folder `rlvr eval --model path` evaluates: `path` itself, or for a run
    directory (no config.json, complete checkpoints) its latest checkpoint."""
    if (path / "config.json").is_file():
        return path
    return latest_checkpoint(path) or path
