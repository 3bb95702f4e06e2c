"""JSONL logging round trips and report plots from small fake run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import rlvr.tracking
from rlvr.tracking import JsonlFormatError, JsonlWriter, plot_runs, read_jsonl
from rlvr.tracking.progress import StepProgress
from rlvr.tracking.report import (
    DEFAULT_METRICS,
    HELD_OUT_METRIC,
    PREFERENCE_METRICS,
    SFT_METRICS,
    _labels,
    default_metrics,
    ema_smooth,
    load_run_metrics,
    metric_series,
    run_directories,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"  # parent is created
    records = [
        {"step": 1, "reward/mean": 0.5, "text": "héllo\nworld", "nested": {"a": [1, 2.5]}},
        {"step": 2, "reward/mean": 0.75, "flag": True, "none": None},
    ]
    with JsonlWriter(path) as log:
        for record in records:
            log.write(record)
    assert log.closed
    assert read_jsonl(path) == records
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2


def test_jsonl_appends_and_flushes_each_write(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as log:
        log.write({"step": 1})
        assert read_jsonl(path) == [{"step": 1}]  # visible before close
    with JsonlWriter(path) as log:
        log.write({"step": 2})
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]


def test_jsonl_converts_tensors_numpy_and_non_finite(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as log:
        log.write(
            {
                "nan": float("nan"),
                "inf": float("inf"),
                "ninf": -math.inf,
                "t": torch.tensor(0.25),
                "t_grad": torch.tensor(2.0, requires_grad=True) * 1.5,
                "t_int": torch.tensor(3),
                "t_nan": torch.tensor(float("nan")),
                "np_f": np.float32(0.5),
                "np_i": np.int64(7),
                "np_b": np.bool_(True),
                "np_arr": np.array([1.0, np.nan]),
                "list": [float("inf"), 1],
                "path": tmp_path / "x",
            }
        )
    line = path.read_text().strip()
    assert "NaN" not in line and "Infinity" not in line
    record = json.loads(line)  # strict JSON
    assert record == {
        "nan": None,
        "inf": None,
        "ninf": None,
        "t": 0.25,
        "t_grad": 3.0,
        "t_int": 3,
        "t_nan": None,
        "np_f": 0.5,
        "np_i": 7,
        "np_b": True,
        "np_arr": [1.0, None],
        "list": [None, 1],
        "path": str(tmp_path / "x"),
    }
    assert isinstance(record["t_int"], int) and isinstance(record["np_i"], int)


def test_jsonl_writer_rejects_bad_records(tmp_path):
    log = JsonlWriter(tmp_path / "m.jsonl")
    with pytest.raises(TypeError, match="mapping"):
        log.write([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'bad'"):
        log.write({"bad": object()})
    log.close()
    with pytest.raises(ValueError, match=r"m\.jsonl: write to a closed JsonlWriter"):
        log.write({"step": 1})
    assert (tmp_path / "m.jsonl").read_text() == ""  # nothing half-written


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, oops}\n')
    with pytest.raises(JsonlFormatError, match=r"metrics\.jsonl, line 4: malformed JSON") as err:
        read_jsonl(path)
    assert err.value.line == 4 and err.value.path == path
    assert isinstance(err.value, ValueError)

    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2: expected a JSON object"):
        read_jsonl(path)
    path.write_bytes('{"note": "é"}\n'.encode() + b"\x89PNG\r\n")  # a PNG written over it
    with pytest.raises(JsonlFormatError) as err:
        read_jsonl(path)
    assert str(err.value) == f"{path}, line 2: not UTF-8 text, so not JSON lines"
    path.write_bytes('{"note": "é"}\n'.encode())
    assert read_jsonl(path) == [{"note": "é"}]
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")


def _fake_run(directory: Path, steps: int, scale: float, skip: tuple[str, ...] = ()) -> Path:
    directory.mkdir(parents=True)
    with JsonlWriter(directory / "metrics.jsonl") as log:
        for step in range(1, steps + 1):
            record = {
                "step": step,
                "reward/mean": scale * step / steps,
                "accuracy": step / steps,
                "response_length/mean": 20.0 + step,
                "response_length/incorrect": 25.0 - step,
                "entropy": 1.0 / step,
                "kl": 0.01 * step if step != 3 else float("nan"),
            }
            log.write({k: v for k, v in record.items() if k not in skip})
    return directory


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000


def test_plot_one_run(tmp_path):
    run = _fake_run(tmp_path / "grpo", steps=10, scale=1.0)
    out = plot_runs([run], tmp_path / "report.png")  # clip_frac is "not logged"
    assert out == tmp_path / "report.png"
    _assert_png(out)


def test_plot_two_runs_overlaid_with_extra_metric_and_smoothing(tmp_path):
    a = _fake_run(tmp_path / "grpo", steps=10, scale=1.0)
    b = _fake_run(tmp_path / "dr_grpo", steps=6, scale=0.5, skip=("entropy",))
    out = plot_runs(
        [a, b],
        tmp_path / "plots" / "both.png",
        metrics=(*DEFAULT_METRICS, "response_length/incorrect"),
        smoothing=0.6,
        title="cmp",
    )
    _assert_png(out)
    # One run and a single-step run also work.
    single = _fake_run(tmp_path / "x" / "grpo", steps=1, scale=1.0)
    _assert_png(plot_runs([a, single], tmp_path / "same_name.png", metrics=("accuracy",)))


def test_a_folder_of_runs_stands_for_its_runs(tmp_path):
    sweep = tmp_path / "sweep"
    b = _fake_run(sweep / "dr_grpo", steps=3, scale=0.5)
    a = _fake_run(sweep / "grpo", steps=4, scale=1.0)
    (sweep / "notes").mkdir()  # no metrics.jsonl: not a run
    (sweep / "summary.jsonl").write_text("{}\n")
    lone = _fake_run(tmp_path / "lone", steps=2, scale=1.0)
    assert run_directories([lone, sweep]) == [lone, b, a]
    assert run_directories([sweep / "notes"]) == [sweep / "notes"]  # kept, to be reported
    _assert_png(plot_runs([sweep], sweep / "report.png"))


def test_plot_runs_errors(tmp_path):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"not_a_run.*metrics\.jsonl"):
        plot_runs([empty], tmp_path / "r.png")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "r.png")
    with pytest.raises(ValueError, match="no run directories"):
        plot_runs([], tmp_path / "r.png")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 1, "accuracy": 0.5}\n{"step": 2,\n')
    with pytest.raises(ValueError, match="line 2"):
        plot_runs([bad], tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


def test_a_run_s_held_out_evaluations_join_its_curves(tmp_path):
    run = _fake_run(tmp_path / "evaluated", steps=4, scale=1.0)
    with JsonlWriter(run / "eval.jsonl") as log:
        log.write({"step": 0, "pass@1": 0.125, "pass@2": 0.25, "k": 2})
        log.write({"step": 4, "pass@1": 0.5, "pass@2": 0.75, "k": 2})
    records = load_run_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 4]
    assert metric_series(records, HELD_OUT_METRIC) == ([0.0, 4.0], [0.125, 0.5])
    assert metric_series(records, "eval/pass@2") == ([0.0, 4.0], [0.25, 0.75])
    assert metric_series(records, "accuracy") == ([1.0, 2.0, 3.0, 4.0], [0.25, 0.5, 0.75, 1.0])
    plain = load_run_metrics(_fake_run(tmp_path / "plain", steps=4, scale=1.0))
    assert default_metrics([plain]) == DEFAULT_METRICS
    assert default_metrics([plain, records]) == (*DEFAULT_METRICS, HELD_OUT_METRIC)
    distilled = [{**record, "distill/reverse_kl": 0.1} for record in plain]
    both = (*DEFAULT_METRICS, HELD_OUT_METRIC, "distill/reverse_kl")
    assert default_metrics([distilled, records]) == both
    _assert_png(plot_runs([run], tmp_path / "with_eval.png"))


def test_sft_and_dpo_folders_are_plotted_with_their_own_curves(tmp_path):
    sft = [{"step": 1, "loss": 2.0, "grad_norm": 1.0, "lr": 1e-4}]
    assert default_metrics([sft]) == ("loss", "grad_norm", "lr")  # no held-out solutions
    assert default_metrics([[*sft, {"step": 0, "eval/loss": 2.5}]]) == SFT_METRICS
    dpo = [{**sft[0], "rewards/margins": 0.1, "rewards/accuracies": 0.5, "logps/chosen": -9.0,
            "logps/rejected": -9.5, "eval/loss": 0.69}]  # fmt: skip
    assert default_metrics([dpo]) == PREFERENCE_METRICS
    assert default_metrics([dpo, [{"step": 1, "reward/mean": 0.5}]])[:1] == DEFAULT_METRICS[:1]
    folder = tmp_path / "sft"
    folder.mkdir()
    with JsonlWriter(folder / "metrics.jsonl") as log:
        for step in (1, 2):
            log.write({"step": step, "loss": 3.0 - step, "grad_norm": 1.0, "lr": 1e-4})
    with JsonlWriter(folder / "eval.jsonl") as log:
        log.write({"step": 0, "loss": 3.1, "tokens": 40})
    assert default_metrics([load_run_metrics(folder)]) == SFT_METRICS
    _assert_png(plot_runs([folder], tmp_path / "sft.png"))


def test_an_eval_record_without_a_step_is_an_error_naming_eval_jsonl(tmp_path):
    run = _fake_run(tmp_path / "demo_like", steps=2, scale=1.0)
    with JsonlWriter(run / "eval.jsonl") as log:
        log.write({"stage": "before_rl", "pass@1": 0.2})
    with pytest.raises(ValueError, match=r"eval\.jsonl: record 1 has no numeric 'step'"):
        plot_runs([run], tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


def test_ema_smooth():
    assert ema_smooth([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]
    # w = 0.5: s1 = 0.5*1 = 0.5 -> /(1-0.5) = 1; s2 = 0.25 + 0.5*3 = 1.75 -> /(1-0.25) = 7/3
    smoothed = ema_smooth([1.0, 3.0, math.nan], 0.5)
    assert smoothed[:2] == pytest.approx([1.0, 7 / 3])
    assert math.isnan(smoothed[2])
    with pytest.raises(ValueError):
        ema_smooth([1.0], 1.0)


def test_report_default_panels_and_null_values_kept_as_gaps():
    panels = ("reward/mean", "accuracy", "response_length/mean", "entropy", "kl", "clip_frac")
    assert panels == DEFAULT_METRICS == rlvr.tracking.DEFAULT_METRICS  # also lazily exported
    # a nulled value (NaN is written as null) stays on the x axis as a NaN: a gap in the curve
    steps, values = metric_series([{"step": 1, "kl": 0.5}, {"step": 2, "kl": None}], "kl")
    assert steps == [1.0, 2.0] and values[0] == 0.5 and math.isnan(values[1])


def test_a_non_numeric_eval_value_is_an_error_naming_eval_jsonl(tmp_path):
    run = tmp_path / "run"
    with JsonlWriter(run / "metrics.jsonl") as log:
        log.write({"step": 1, "accuracy": 0.5})
    with JsonlWriter(run / "eval.jsonl") as log:
        log.write({"step": 1, "pass@1": "high"})
    with pytest.raises(ValueError, match=r"eval\.jsonl: metric 'eval/pass@1' at step 1"):
        plot_runs([run], tmp_path / "r.png")


def test_jsonl_writes_readable_utf8_tuples_as_lists_and_names_nested_bad_keys(tmp_path):
    # the file is UTF-8 text (not \u escapes), a tuple is a JSON list, and a value that
    # cannot be logged is named by its full key path
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path) as log:
        log.write({"text": "héllo", "pair": (1, 2.5)})
        with pytest.raises(TypeError, match=r"key 'outer\.inner\[1\]'"):
            log.write({"outer": {"inner": [1, object()]}})
    assert path.read_text(encoding="utf-8") == '{"text": "héllo", "pair": [1, 2.5]}\n'


def test_read_jsonl_of_a_directory_is_file_not_found(tmp_path):
    # a folder is not a JSONL file: the documented FileNotFoundError, not IsADirectoryError
    with pytest.raises(FileNotFoundError, match="no such JSONL file"):
        read_jsonl(tmp_path)


def test_steps_and_values_must_be_numbers_not_booleans(tmp_path):
    # True is an int in Python, but neither a step nor a metric value
    run = tmp_path / "run"
    with JsonlWriter(run / "metrics.jsonl") as log:
        log.write({"step": True, "accuracy": 0.5})
    with pytest.raises(ValueError, match=r"record 1 has no numeric 'step' \(got True\)"):
        load_run_metrics(run)
    with pytest.raises(ValueError, match=r"metric 'done' at step 2 is not a number \(True\)"):
        metric_series([{"step": 2, "done": True}], "done")


def test_eval_records_join_without_their_step_as_a_metric_and_missing_metrics_are_none(
    tmp_path,
):
    run = _fake_run(tmp_path / "run", steps=1, scale=1.0)
    with JsonlWriter(run / "eval.jsonl") as log:
        log.write({"step": 1, "pass@1": 0.5})
    records = load_run_metrics(run)
    assert records[1] == {"step": 1, "eval/pass@1": 0.5}  # no "eval/step"
    assert metric_series(records, "clip_frac") is None  # what plot_runs shows as "not logged"
    with pytest.raises(FileNotFoundError, match="run directory does not exist"):
        load_run_metrics(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"a file, not a run directory; give .* \(.*run\)"):
        load_run_metrics(run / "metrics.jsonl")


def test_ema_smooth_skips_a_nan_in_the_middle():
    # w = 0.5 over [1, nan, 3]: the NaN stays a NaN and leaves the average as it was, so the
    # third value is test_ema_smooth's second: (0.25 + 0.5*3) / (1 - 0.25) = 7/3
    smoothed = ema_smooth([1.0, math.nan, 3.0], 0.5)
    assert len(smoothed) == 3 and math.isnan(smoothed[1])
    assert [smoothed[0], smoothed[2]] == pytest.approx([1.0, 7 / 3])


def test_labels_are_names_and_parent_slash_name_where_two_runs_share_one(tmp_path):
    a, b, c = tmp_path / "x" / "grpo", tmp_path / "y" / "grpo", tmp_path / "y" / "dpo"
    assert _labels([a, b, c]) == ["x/grpo", "y/grpo", "dpo"]
    assert _labels([a, c]) == ["grpo", "dpo"]


def test_a_folder_s_runs_are_listed_by_name_whatever_their_creation_order(tmp_path):
    names = ["zeta", "alpha", "mid", "beta", "omega", "delta"]
    for name in names:
        _fake_run(tmp_path / "sweep" / name, steps=1, scale=1.0)
    assert run_directories([tmp_path / "sweep"]) == [tmp_path / "sweep" / n for n in sorted(names)]


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_panels_form_a_grid_of_up_to_three_columns(tmp_path):
    # one panel per metric, three to a row: 2 metrics are twice one metric's width, 4 and 7
    # three times (a second and a third row); a single metric name is one panel, not one per
    # letter
    run = _fake_run(tmp_path / "run", steps=3, scale=1.0)
    metrics = ["accuracy", "kl", "entropy", "reward/mean", "clip_frac", "loss", "x"]
    sizes = {
        n: _png_size(plot_runs([run], tmp_path / f"{n}.png", metrics=metrics[:n]))
        for n in (1, 2, 4, 7)
    }
    width = sizes[1][0]
    assert [sizes[n][0] for n in (2, 4, 7)] == [2 * width, 3 * width, 3 * width]
    assert sizes[1][1] < sizes[4][1] < sizes[7][1]
    assert _png_size(plot_runs([run], tmp_path / "one.png", metrics="accuracy")) == sizes[1]


def test_plot_runs_refuses_no_metrics_and_a_smoothing_outside_0_1(tmp_path):
    run = _fake_run(tmp_path / "run", steps=3, scale=1.0)
    with pytest.raises(ValueError, match="no metrics to plot"):
        plot_runs([run], tmp_path / "r.png", metrics=[])
    for smoothing in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"plot_runs: smoothing must be in \[0, 1\)"):
            plot_runs([run], tmp_path / "r.png", smoothing=smoothing)
    assert not (tmp_path / "r.png").exists()


def test_the_progress_bar_shows_the_step_and_its_numbers_and_nothing_when_disabled(capsys):
    metrics = {"reward/mean": 0.5, "accuracy": 0.25, "response_length/mean": 12.0}
    with StepProgress(5, start=1) as progress:
        progress.update(3, metrics)
    shown = " ".join(capsys.readouterr().out.split())
    assert "3/5 reward 0.500 acc 0.250 len 12.0" in shown
    with StepProgress(5) as progress:  # no row had a gold answer: no accuracy, not "nan"
        progress.update(4, {**metrics, "accuracy": float("nan")})
    assert "4/5 reward 0.500 acc - len 12.0" in " ".join(capsys.readouterr().out.split())
    with StepProgress(5, enabled=False) as progress:
        progress.update(3, metrics)
    assert capsys.readouterr().out == ""
