"""`rlvr sweep`: one RL run per point of a grid of presets and config values, then one overlaid
report and a summary table (DESIGN's first user: GRPO vs Dr. GRPO vs DAPO, clip 0.2 vs 0.28,
seeds, side by side).

An override whose value has commas outside brackets and quotes is an axis
(``algorithm.clip.high=0.2,0.28``, Hydra's multirun syntax); ``train.log_to=[tensorboard,wandb]``
stays one value. ``--preset grpo,dr_grpo`` is an axis of presets. Every point's config is
resolved before the first run starts, so a typo fails at once. The runs go one after another
into ``OUTPUT_DIR/<name>``, the name made of the point's values. A run whose directory already
holds its final checkpoint under the same resolved config is not run again, and one stopped
part-way (Ctrl-C or SIGTERM save a checkpoint, `rlvr.training.stopping`) or given more
``train.steps`` is resumed from its latest checkpoint, so an interrupted sweep continues where
it stopped. A directory with checkpoints of another config stops the sweep before its first
run.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import (
    ConfigError,
    RLConfig,
    changed_settings,
    load_saved_config,
    resolve_config,
)
from rlvr.run_layout import CONFIG_FILE, checkpoint_step, latest_checkpoint
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.report import load_run_metrics, plot_runs
from rlvr.training.rl import check_choices, train

LAST_STEPS = 10
"""The summary averages accuracy and reward over the last this many steps of each run."""


def split_values(text: str) -> list[str]:
    """``a,b`` -> [a, b]: split at the commas that are outside brackets, braces and quotes."""
    values, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    return [*values, text[start:]]


@dataclass
class SweepPoint:
    """One run of the grid."""

    name: str
    """Its directory name under the sweep's output directory."""
    settings: dict[str, str]
    """The axis values of this point (``preset`` for the preset axis)."""
    config: RLConfig


def _dir_name(settings: dict[str, str]) -> str:
    parts = [v if k == "preset" else f"{k}={v}" for k, v in settings.items()]
    return re.sub(r"[^\w.=+-]", "_", "-".join(parts)) or "run"


def sweep_points(
    config_path: str | None, presets: str | None, overrides: list[str], output_dir: Path
) -> list[SweepPoint]:
    """Every point of the grid with its resolved config (all resolved before any run)."""
    axes: list[tuple[str, list[str]]] = [("preset", split_values(presets))] if presets else []
    fixed = []
    for text in overrides:
        key, sep, value = text.partition("=")
        key = key.strip().removeprefix("++").removeprefix("+")  # Hydra's add: a plain key here
        values = split_values(value) if sep else [value]
        if key == "train.output_dir":
            raise ConfigError("train.output_dir: a sweep sets it per run (use --output-dir)")
        if len(values) > 1:
            axes.append((key, values))
        else:
            fixed.append(text)
    points = []
    for combination in itertools.product(*(values for _, values in axes)):
        settings = {key: value for (key, _), value in zip(axes, combination)}
        preset = settings.get("preset")
        point_overrides = [*fixed, *(f"{k}={v}" for k, v in settings.items() if k != "preset")]
        name = _dir_name(settings)
        point_overrides.append(f"train.output_dir={output_dir / name}")
        try:
            cfg = resolve_config(config_path, preset, point_overrides)
            check_choices(cfg)
        except ConfigError as exc:
            raise ConfigError(f"sweep point {name}: {exc}") from None
        points.append(SweepPoint(name, settings, cfg))
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise ConfigError(f"sweep points share a directory name: {names}")
    return points


def saved_step(point: SweepPoint) -> int:
    """The step of the latest checkpoint in the point's run directory (0: none, a run to
    start). Its config may differ in `train.steps` alone, as for `rlvr train --resume`; a
    directory whose checkpoints another config wrote is a `ConfigError` naming what differs,
    since running the point would mix two runs in it."""
    run_dir = Path(point.config.train.output_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return 0
    saved = load_saved_config(run_dir / CONFIG_FILE)
    if saved is None:
        changed = ["its config.yaml is missing"]
    else:
        changed = changed_settings(saved, point.config, ignore=("train.steps",))
    if changed:
        shown = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
        raise ConfigError(
            f"sweep point {point.name}: {run_dir} holds checkpoints of another run ({shown}); "
            "choose another --output-dir, or delete that folder"
        )
    return checkpoint_step(checkpoint) or 0


def _mean_of_known(values: list[float | None]) -> float | None:
    """The mean of the values that are not None (a step's accuracy on unlabelled rows is
    None); None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summarize(point: SweepPoint) -> dict:
    """Name, axis values, final accuracy and reward (mean of the last steps), last held-out
    pass@1 when the run evaluated, and the training seconds."""
    records = load_run_metrics(point.config.train.output_dir)
    steps = [r for r in records if "accuracy" in r]
    last = steps[-LAST_STEPS:]
    held_out = [r["eval/pass@1"] for r in records if "eval/pass@1" in r]
    return {
        "name": point.name,
        **point.settings,
        "steps": len(steps),
        "accuracy": _mean_of_known([r["accuracy"] for r in last]),
        "reward/mean": sum(r["reward/mean"] for r in last) / len(last),
        "eval/pass@1": held_out[-1] if held_out else None,
        "seconds": sum(r["time/step"] for r in steps),
    }


def run_sweep(
    config_path: str | None,
    presets: str | None,
    overrides: list[str],
    output_dir: Path,
    show_progress: bool = True,
) -> list[dict]:
    """Run every point not already complete, then write `summary.jsonl` and `report.png` in
    `output_dir`; return the summary rows."""
    points = sweep_points(config_path, presets, overrides, output_dir)
    saved = [saved_step(point) for point in points]  # every directory checked before a run
    for index, (point, step) in enumerate(zip(points, saved, strict=True), start=1):
        if step >= point.config.train.steps:
            continue
        if show_progress:
            after = f" (resumed after step {step})" if step else ""
            print(f"sweep run {index}/{len(points)}: {point.name}{after}", flush=True)
        train(point.config, resume=step > 0, show_progress=show_progress)
    rows = [summarize(point) for point in points]
    (output_dir / "summary.jsonl").unlink(missing_ok=True)
    with JsonlWriter(output_dir / "summary.jsonl") as writer:
        for row in rows:
            writer.write(row)
    plot_runs([Path(p.config.train.output_dir) for p in points], output_dir / "report.png")
    return rows
