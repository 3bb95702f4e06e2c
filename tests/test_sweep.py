"""`rlvr sweep`: axes from comma lists, every point resolved first, runs, summary, report,
and finished runs skipped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError
from rlvr.training import sweep
from rlvr.training.sweep import run_sweep, split_values, sweep_points
from tiny_run import TINY_RUN

SMALL = [*TINY_RUN, "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "train.steps=2"]


def test_split_values_by_hand():
    assert split_values("0.2,0.28") == ["0.2", "0.28"]
    assert split_values("[tensorboard,wandb]") == ["[tensorboard,wandb]"]
    assert split_values("[a,b],[c]") == ["[a,b]", "[c]"]
    assert split_values("'x,y',z") == ["'x,y'", "z"]
    assert split_values("{a: 1, b: 2}") == ["{a: 1, b: 2}"]
    assert split_values("7") == ["7"]


def test_the_grid_is_the_product_of_its_axes(tmp_path):
    points = sweep_points(
        None, "grpo,dr_grpo", [*SMALL, "algorithm.clip.high=0.2,0.28", "train.log_to=[]"], tmp_path
    )
    assert [p.name for p in points] == [
        "grpo-algorithm.clip.high=0.2",
        "grpo-algorithm.clip.high=0.28",
        "dr_grpo-algorithm.clip.high=0.2",
        "dr_grpo-algorithm.clip.high=0.28",
    ]
    for point in points:
        assert point.config.preset == point.settings["preset"]
        assert point.config.algorithm.clip.high == float(point.settings["algorithm.clip.high"])
        assert point.config.train.steps == 2 and point.config.train.log_to == []
        assert point.config.train.output_dir == str(tmp_path / point.name)
    assert points[0].config.algorithm.aggregation == "seq_mean_token_mean"  # grpo's
    assert points[2].config.algorithm.aggregation == "seq_mean_token_sum"  # dr_grpo's
    # Hydra's +key (verl's scripts) is the key itself, in the folder name too
    hydra = sweep_points(None, "grpo", [*SMALL, "+algorithm.clip.high=0.2,0.28"], tmp_path)
    assert [p.name for p in hydra] == [p.name for p in points[:2]]
    assert [p.config.algorithm.clip.high for p in hydra] == [0.2, 0.28]


def test_bad_points_fail_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "train", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ConfigError, match=re.escape("sweep point grpo-algorithm.clip.hihg=0.2")):
        run_sweep(None, "grpo", [*SMALL, "algorithm.clip.hihg=0.2,0.3"], tmp_path)
    with pytest.raises(ConfigError, match="unknown preset 'grpoo'"):
        run_sweep(None, "grpo,grpoo", SMALL, tmp_path)
    with pytest.raises(ConfigError, match=re.escape("train.output_dir: a sweep sets it per run")):
        run_sweep(None, "grpo", [*SMALL, "train.output_dir=x"], tmp_path)
    point = "sweep point grpo-algorithm.loss=ppo: algorithm.loss: unknown policy loss 'ppo'"
    with pytest.raises(ConfigError, match=re.escape(point)):
        run_sweep(None, "grpo", [*SMALL, "algorithm.loss=ppo_clip,ppo"], tmp_path)


def test_sweep_runs_summarizes_reports_and_skips_finished_runs(tmp_path, monkeypatch):
    overrides = [*SMALL, "train.seed=0,1", "eval.every_steps=2", "eval.samples=2", "eval.k=2"]
    rows = run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    assert [r["name"] for r in rows] == ["dr_grpo-train.seed=0", "dr_grpo-train.seed=1"]
    for row in rows:
        run_dir = tmp_path / row["name"]
        metrics = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        assert row["steps"] == 2 and row["train.seed"] == row["name"][-1]
        assert row["accuracy"] == pytest.approx(sum(m["accuracy"] for m in metrics) / 2)
        assert row["reward/mean"] == pytest.approx(sum(m["reward/mean"] for m in metrics) / 2)
        evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
        assert row["eval/pass@1"] == evals[-1]["pass@1"]
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["seed"] == int(
            row["train.seed"]
        )
    written = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert written == json.loads(json.dumps(rows))
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    # a second sweep runs only the points without their final checkpoint under the same config
    ran = []
    monkeypatch.setattr(sweep, "train", lambda cfg, **k: ran.append(cfg.train.seed))
    run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    assert ran == []
    shutil.rmtree(tmp_path / "dr_grpo-train.seed=1" / "checkpoints" / "step-2")
    run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    assert ran == [1]  # no checkpoint left: run from the start
    # checkpoints written under other settings: refused before any run, naming what differs
    saved = tmp_path / "dr_grpo-train.seed=0" / "config.yaml"
    saved.write_text(saved.read_text().replace("lr: 0.001", "lr: 0.002"))
    other = (
        re.escape("dr_grpo-train.seed=0: ")
        + ".* holds checkpoints of another run "
        + (re.escape("(train.lr: 0.002 -> 0.001)"))
    )
    with pytest.raises(ConfigError, match=other):
        run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    saved.write_text("train: [lr: 0.001\n")  # damaged: named, not a YAML traceback
    with pytest.raises(
        ConfigError, match=r"seed=0/config\.yaml, line 2, column 1: invalid YAML \(while"
    ):
        run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    saved.unlink()
    with pytest.raises(ConfigError, match=re.escape("(its config.yaml is missing)")):
        run_sweep(None, "dr_grpo", overrides, tmp_path, show_progress=False)
    assert ran == [1]


def test_cli_sweep(tmp_path):
    result = CliRunner().invoke(
        app,
        ["sweep", "--preset", "grpo,rloo", *SMALL, "--output-dir", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    assert "grpo" in result.output and "rloo" in result.output
    assert (tmp_path / "grpo" / "metrics.jsonl").is_file() and (tmp_path / "rloo").is_dir()
    bad = CliRunner().invoke(app, ["sweep", "--preset", "grpo", "algorithm.nope=1,2"])
    assert bad.exit_code == 2 and "algorithm.nope" in bad.output


def test_a_sweep_of_faked_runs_averages_the_last_ten_steps_and_announces_each_run(
    tmp_path, monkeypatch, capsys
):
    """Runs faked by hand (no model): twelve steps of accuracy step/16, reward step and
    time/step 0.5, held-out pass@1 0.25, 0.5, 0.75 at steps 0, 6, 12. The summary averages
    steps 3 to 12: accuracy 7.5/16 = 0.46875, reward 7.5; the last pass@1, 0.75; 6 seconds
    in all. The first point holds a checkpoint of step 5 under its own config, so it is
    resumed and announced so; both are numbered from 1."""
    overrides = [*SMALL, "train.steps=12", "train.seed=0,1"]
    first, _ = sweep_points(None, "grpo", overrides, tmp_path)
    first_dir = tmp_path / first.name
    (first_dir / "checkpoints" / "step-5").mkdir(parents=True)
    (first_dir / "checkpoints" / "step-5" / "trainer_state.pt").touch()
    (first_dir / "config.yaml").write_text(yaml.safe_dump(first.config.model_dump(mode="json")))
    resumed = []

    def fake_train(cfg, resume, **kwargs):
        resumed.append(resume)
        run_dir = Path(cfg.train.output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = range(1, 13)
        records = [
            {"step": s, "accuracy": s / 16, "reward/mean": s, "time/step": 0.5} for s in steps
        ]
        evals = [{"step": s, "pass@1": (s / 6 + 1) / 4} for s in (0, 6, 12)]
        for name, rows in (("metrics.jsonl", records), ("eval.jsonl", evals)):
            (run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr(sweep, "train", fake_train)
    rows = run_sweep(None, "grpo", overrides, tmp_path, show_progress=True)
    assert resumed == [True, False]
    assert capsys.readouterr().out.splitlines() == [
        "sweep run 1/2: grpo-train.seed=0 (resumed after step 5)",
        "sweep run 2/2: grpo-train.seed=1",
    ]
    for row in rows:
        assert (row["steps"], row["accuracy"], row["reward/mean"]) == (12, 0.46875, 7.5)
        assert (row["eval/pass@1"], row["seconds"]) == (0.75, 6.0)


def test_a_runs_accuracy_on_unlabelled_rows_is_none_not_a_crash(tmp_path):
    """A step's accuracy is null where no row had a gold answer (a label-free run): the
    summary averages the steps that have one, and is None (shown "-") when none has."""
    from rlvr.training.sweep import summarize

    (point,) = sweep_points(None, "grpo", [*SMALL, "train.steps=3"], tmp_path)
    run_dir = Path(point.config.train.output_dir)
    run_dir.mkdir(parents=True)
    for accuracies, expected in (([None, 0.25, 0.75], 0.5), ([None, None, None], None)):
        records = [
            {"step": s, "accuracy": a, "reward/mean": 1.0, "time/step": 1.0}
            for s, a in enumerate(accuracies, start=1)
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        assert summarize(point)["accuracy"] == expected


def test_a_refused_run_directory_names_at_most_three_differences(tmp_path):
    """Three settings differ: all three named; four: the first three and '; ...'."""
    (point,) = sweep_points(None, "grpo", SMALL, tmp_path)
    run_dir = tmp_path / point.name
    (run_dir / "checkpoints" / "step-1").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-1" / "trainer_state.pt").touch()
    saved = point.config.model_dump(mode="json")
    three = "train.lr: 0.5 -> 0.001; train.weight_decay: 0.5 -> 0.0; train.warmup_steps: 7 -> 0"
    for changes, shown in (
        ({"lr": 0.5, "weight_decay": 0.5, "warmup_steps": 7}, f"({three})"),
        ({"lr": 0.5, "weight_decay": 0.5, "warmup_steps": 7, "seed": 9}, f"({three}; ...)"),
    ):
        (run_dir / "config.yaml").write_text(
            yaml.safe_dump({**saved, "train": {**saved["train"], **changes}})
        )
        with pytest.raises(ConfigError, match=re.escape(shown)):
            sweep.saved_step(point)
