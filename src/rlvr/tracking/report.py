"""Report plots: the training curves of one run, or of several runs overlaid, as one PNG.

Reads each run directory's `metrics.jsonl` (x axis = `step`) and draws one subplot per metric
in a grid, one line per run, labelled with the run directory's name and coloured the same in
every subplot. Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend
switch, no display needed), so it is safe in training processes and on headless machines.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlvr.tracking.jsonl import read_jsonl

DEFAULT_METRICS: tuple[str, ...] = (
    "reward/mean",
    "accuracy",
    "response_length/mean",
    "entropy",
    "kl",
    "clip_frac",
)
"""The curves of `rlvr report`: reward, accuracy, length, entropy, KL and clip fraction."""

HELD_OUT_METRIC = "eval/pass@1"
"""The held-out pass@1 of `eval.jsonl`, a panel of its own wherever a run evaluated."""

WHEN_LOGGED: tuple[str, ...] = (HELD_OUT_METRIC, "distill/reverse_kl")
"""Panels drawn after `DEFAULT_METRICS` wherever one of the runs logs them: the held-out
pass@1, and the reverse KL to a distillation teacher (`algorithm.distill.teacher`)."""

SFT_METRICS: tuple[str, ...] = ("loss", "eval/loss", "grad_norm", "lr")
"""The curves of an `rlvr sft` output folder: the NLL per solution token, also on the
held-out solutions, the gradient norm and the learning rate."""

PREFERENCE_METRICS: tuple[str, ...] = (
    "loss",
    "eval/loss",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)
"""The curves of an `rlvr dpo` output folder (TRL's names): the loss, also on the held-out
pairs, how often and by how much the chosen response's implicit reward wins, and both
responses' log-probabilities (whether the chosen one's rises or only the rejected one's falls)."""

_COLUMNS = 3


def _numbered_records(path: Path) -> list[dict]:
    """The records of the JSONL file `path`, each checked to carry a numeric `step`."""
    records = read_jsonl(path)
    for index, record in enumerate(records, start=1):
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise ValueError(f"{path}: record {index} has no numeric 'step' (got {step!r})")
    return records


def load_run_metrics(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The records of `run_dir/metrics.jsonl`, and those of its `eval.jsonl` where `rlvr train`
    evaluated the held-out problems (their keys prefixed `eval/`), sorted by `step`.

    Raises:
        FileNotFoundError: if `run_dir` is not a directory or has no `metrics.jsonl`.
        ValueError: if a line is malformed or a record has no numeric `step`.
    """
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise FileNotFoundError(
            f"{run_dir}: a file, not a run directory; give the folder that holds it "
            f"({run_dir.parent})"
        )
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory does not exist")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no metrics.jsonl in this directory (is it a run directory?)"
        )
    records = _numbered_records(path)
    if (run_dir / "eval.jsonl").is_file():
        records += [
            {"step": r["step"], **{f"eval/{k}": v for k, v in r.items() if k != "step"}}
            for r in _numbered_records(run_dir / "eval.jsonl")
        ]
    return sorted(records, key=lambda r: r["step"])


def default_metrics(runs: Sequence[Sequence[dict]]) -> tuple[str, ...]:
    """`DEFAULT_METRICS`, then each of `WHEN_LOGGED` that one of the runs' records logs; where
    no run logs a reward but one logs a loss (`rlvr dpo` and `rlvr sft` output folders), those
    of `PREFERENCE_METRICS` or `SFT_METRICS` that a run logs."""
    logged = {key for records in runs for record in records for key in record}
    if "reward/mean" not in logged and "loss" in logged:
        offline = PREFERENCE_METRICS if "rewards/margins" in logged else SFT_METRICS
        return tuple(metric for metric in offline if metric in logged)
    return DEFAULT_METRICS + tuple(metric for metric in WHEN_LOGGED if metric in logged)


def metric_series(
    records: Sequence[dict], metric: str, source: str | os.PathLike[str] = "metrics.jsonl"
) -> tuple[list[float], list[float]] | None:
    """(steps, values) of `metric`, or None if no record logs it.

    A step whose value is null (a NaN or inf that the writer nulled) is kept as NaN, so the
    curve shows a gap there. A non-numeric value raises ValueError naming `source`.
    """
    steps: list[float] = []
    values: list[float] = []
    for record in records:
        if metric not in record:
            continue
        value = record[metric]
        if value is None:
            value = math.nan
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"{source}: metric {metric!r} at step {record['step']} is not a number ({value!r})"
            )
        steps.append(float(record["step"]))
        values.append(float(value))
    return (steps, values) if steps else None


def ema_smooth(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's bias correction.

    s_t = w * s_{t-1} + (1 - w) * x_t, reported as s_t / (1 - w^(m_t)), where m_t counts the
    finite values seen so far. NaNs are passed through (and do not update the average).
    `weight` = 0 returns the values unchanged.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    if weight == 0.0:
        return list(values)
    smoothed: list[float] = []
    average, seen = 0.0, 0
    for x in values:
        if not math.isfinite(x):
            smoothed.append(math.nan)
            continue
        average = weight * average + (1.0 - weight) * x
        seen += 1
        smoothed.append(average / (1.0 - weight**seen))
    return smoothed


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's directory name; `parent/name` where two runs share a name."""
    names = [d.resolve().name or str(d) for d in run_dirs]
    return [
        f"{d.resolve().parent.name}/{n}" if names.count(n) > 1 else n
        for d, n in zip(run_dirs, names, strict=True)
    ]


def run_directories(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The run directories `paths` name: each path that holds a `metrics.jsonl`, and for a
    directory that does not, the directories in it that do, by name (a sweep's
    `--output-dir`, the demo's folder). Anything else is kept, for `load_run_metrics` to
    name what is missing."""
    found = []
    for path in map(Path, paths):
        if path.is_dir() and not (path / "metrics.jsonl").is_file():
            inside = sorted(d for d in path.iterdir() if (d / "metrics.jsonl").is_file())
            if inside:
                found.extend(inside)
                continue
        found.append(path)
    return found


def plot_runs(
    run_dirs: Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    metrics: Sequence[str] | None = None,
    *,
    smoothing: float = 0.0,
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Plot `metrics` of one or more runs (overlaid) against `step` and save a PNG.

    Args:
        run_dirs: run directories, each holding a `metrics.jsonl`, or folders of them
            (`run_directories`).
        out_path: the PNG to write (parent directories are created).
        metrics: one subplot each, in a grid of up to three columns; any logged key works,
            e.g. `response_length/incorrect`. A metric that no run logs gets an empty subplot
            that says "not logged"; one whose every value is null (`accuracy` on rows without
            gold answers), "no values". None: `default_metrics` (`DEFAULT_METRICS`, then those
            of `WHEN_LOGGED` that a run logs; an SFT or DPO folder's own curves).
        smoothing: EMA weight in [0, 1) (TensorBoard-style); 0, the default, plots raw values.
            When smoothing, the raw curve is drawn faintly behind the smoothed one.
        title: figure title (default: none).
        dpi: resolution of the PNG.

    Returns:
        `out_path` as a Path.

    Raises:
        ValueError: no run directories or no metrics given, a malformed metrics file, or an
            `out_path` that does not end in ``.png``.
        FileNotFoundError: a run directory (named in the message) lacks `metrics.jsonl`.
    """
    if Path(out_path).suffix.lower() != ".png":  # never a PNG written over metrics.jsonl
        raise ValueError(
            f"plot_runs: the report is a PNG image; {str(out_path)!r} does not end in .png"
        )
    run_paths = run_directories(run_dirs)
    if not run_paths:
        raise ValueError("plot_runs: no run directories given")
    if isinstance(metrics, str):
        metrics = (metrics,)
    if metrics is not None and not metrics:
        raise ValueError("plot_runs: no metrics to plot")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"plot_runs: smoothing must be in [0, 1), got {smoothing}")
    runs = [load_run_metrics(d) for d in run_paths]
    if metrics is None:
        metrics = default_metrics(runs)
    labels = _labels(run_paths)

    columns = min(_COLUMNS, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    fig = Figure(figsize=(4.6 * columns, 3.2 * rows + 0.6), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    handles: dict[str, object] = {}

    for ax, metric in zip(axes, metrics, strict=False):
        ax.set_title(metric, fontsize=10)
        plotted = logged = False
        for run_dir, records, label, color in zip(run_paths, runs, labels, colors, strict=True):
            source = "eval.jsonl" if metric.startswith("eval/") else "metrics.jsonl"
            series = metric_series(records, metric, run_dir / source)
            logged = logged or series is not None
            if series is None or not any(map(math.isfinite, series[1])):
                continue
            steps, values = series
            marker = "o" if len(steps) == 1 or metric.startswith("eval/") else None
            if smoothing > 0.0:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1.0)
                values = ema_smooth(values, smoothing)
            (line,) = ax.plot(steps, values, color=color, linewidth=1.5, marker=marker, label=label)
            handles.setdefault(label, line)
            plotted = True
        if plotted:
            ax.grid(alpha=0.3)
        else:
            ax.text(
                0.5,
                0.5,
                "no values (null at every step)" if logged else "not logged",
                ha="center",
                va="center",
                color="0.5",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    for ax in axes[: len(metrics)]:
        if ax.has_data():
            ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)

    top = 1.0
    if title:
        fig.suptitle(title)
        top -= 0.5 / fig.get_figheight()
    if handles:
        ordered = [label for label in labels if label in handles]
        fig.legend(
            [handles[label] for label in ordered],
            ordered,
            loc="upper center",
            ncol=min(len(ordered), 4),
            fontsize=9,
            frameon=False,
            bbox_to_anchor=(0.5, top),
        )
        top -= (0.35 * math.ceil(len(ordered) / 4) + 0.1) / fig.get_figheight()
    fig.tight_layout(rect=(0.0, 0.0, 1.0, top))

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
