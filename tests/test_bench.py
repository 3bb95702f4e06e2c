"""`rlvr bench`: medians of the timed steps after warm-up, and nothing left on disk."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import resolve_config
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.training import bench
from rlvr.training.bench import PHASES, bench_config, run_bench
from tiny_run import TINY_RUN

SMALL = [*TINY_RUN, "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2"]


def test_bench_config_times_only_the_steps(tmp_path):
    cfg = resolve_config(
        preset="grpo", overrides=[*SMALL, "eval.every_steps=5", "train.save_every=1"]
    )
    timed = bench_config(cfg, steps=3, warmup=2, output_dir=str(tmp_path))
    assert timed.train.steps == 5 and timed.train.output_dir == str(tmp_path)
    assert (timed.train.save_every, timed.train.log_samples, timed.eval.every_steps) == (0, 0, 0)
    assert timed.algorithm == cfg.algorithm and timed.rollout == cfg.rollout
    assert cfg.train.steps == 100 and cfg.eval.every_steps == 5  # the user's config is unchanged


def test_medians_of_the_timed_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = resolve_config(preset="grpo", overrides=SMALL)
    result = run_bench(cfg, steps=3, warmup=1)
    assert result["steps"] == 3 and len(result["per_step"]) == 3 and result["device"] == "cpu"
    assert all(result[key] > 0 for key in PHASES)
    for r in result["per_step"]:  # the phases add up to the step
        parts = r["time/rollout"] + r["time/reward"] + r["time/train"]
        assert parts == pytest.approx(r["time/step"], rel=1e-6)
    assert 0.05 < result["peak_rss_gib"] < 24
    assert list(tmp_path.iterdir()) == []  # the temporary run directory is gone
    assert not Path(cfg.train.output_dir).exists()
    with pytest.raises(ValueError, match="steps >= 1"):
        run_bench(cfg, steps=0)


def test_warm_up_steps_are_dropped_and_the_rest_give_medians(monkeypatch):
    """A stand-in run whose per-step numbers are known: warm-up 100 s, then 1, 3, 2 s."""
    seen = []

    def fake_train(cfg, show_progress):
        seen.append(cfg.train.steps)
        times = [100.0, 1.0, 3.0, 2.0]
        with JsonlWriter(Path(cfg.train.output_dir) / "metrics.jsonl") as log:
            for step, t in enumerate(times, start=1):
                parts = {"time/rollout": t / 2, "time/reward": 0.0, "time/train": t / 2}
                log.write(
                    {
                        "step": step,
                        **parts,
                        "time/step": t,
                        "tokens_per_s": 10 * t,
                        "response_length/mean": 5.0,
                    }
                )

    monkeypatch.setattr(bench, "train", fake_train)
    result = run_bench(resolve_config(preset="grpo", overrides=SMALL), steps=3, warmup=1)
    assert seen == [4]
    assert [r["time/step"] for r in result["per_step"]] == [1.0, 3.0, 2.0]
    assert (result["time/step"], result["time/rollout"], result["tokens_per_s"]) == (2.0, 1.0, 20.0)


def test_cli_bench_prints_and_appends(tmp_path, monkeypatch):
    seen = []

    def fake(cfg, steps, warmup):
        seen.append((cfg.preset, cfg.rollout.samples_per_prompt, steps, warmup))
        return {"steps": steps, "time/step": 0.5, "device": "cpu", "per_step": []}

    monkeypatch.setattr(bench, "run_bench", fake)
    out = tmp_path / "bench.jsonl"
    args = ["bench", "--preset", "dapo", *SMALL, "--steps", "2", "--warmup", "0"]
    result = CliRunner().invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == [("dapo", 2, 2, 0)]
    assert "time/step" in result.output and "0.5000" in result.output
    assert json.loads(out.read_text())["time/step"] == 0.5
    bad = CliRunner().invoke(app, ["bench", "algorithm.nope=1"])
    assert bad.exit_code == 2 and "algorithm.nope" in bad.output
