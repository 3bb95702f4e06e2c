"""`train.log_to`: TensorBoard and W&B get the numbers of metrics.jsonl and eval.jsonl.

Both packages are optional extras, so stand-ins with their call signatures take their place
in `sys.modules` (`torch.utils.tensorboard.SummaryWriter`, `wandb.init` and its run).
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from rlvr.config import ConfigError, resolve_config
from rlvr.config_offline import DPOConfig, SFTConfig
from rlvr.tracking.jsonl import read_jsonl
from rlvr.tracking.loggers import MetricLoggers, _scalars, run_loggers
from rlvr.training.preference import run_dpo
from rlvr.training.rl import NonFiniteError, train
from rlvr.training.sft import run_sft
from tiny_run import TINY_RUN


def config(run_dir: Path, *extra: str):
    overrides = [*TINY_RUN, "train.steps=3", f"train.output_dir={run_dir}", *extra]
    return resolve_config(preset="grpo", overrides=overrides)


class StandInRun:
    def __init__(self, **settings) -> None:
        self.settings, self.logged, self.finished = settings, [], False

    def log(self, data: dict, step: int) -> None:
        self.logged.append((step, data))

    def finish(self) -> None:
        self.finished = True


class StandInWriter:
    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars, self.closed = log_dir, [], False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((step, tag, value))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def wandb_runs(monkeypatch) -> list[StandInRun]:
    runs: list[StandInRun] = []
    module = types.ModuleType("wandb")
    module.init = lambda **settings: runs.append(StandInRun(**settings)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


@pytest.fixture
def writers(monkeypatch) -> list[StandInWriter]:
    made: list[StandInWriter] = []
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = lambda log_dir: made.append(StandInWriter(log_dir)) or made[-1]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    return made


def numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a JSONL record, the step aside, as the loggers get them."""
    return {
        prefix + key: float(value)
        for key, value in record.items()
        if key != "step"
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        if math.isfinite(value)
    }


def logged_numbers(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """What the loggers should get, in order: the evaluation before step 1, then each step's
    metrics followed by that step's evaluation; the finite numbers only, the step aside."""
    evaluations = {r["step"]: r for r in read_jsonl(run_dir / "eval.jsonl")}

    expected = [(0, numbers(evaluations[0], "eval/"))]
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        expected.append((record["step"], numbers(record, "")))
        if record["step"] in evaluations:
            expected.append((record["step"], numbers(evaluations[record["step"]], "eval/")))
    return expected


def test_both_loggers_get_every_step_and_evaluation(tmp_path, wandb_runs, writers):
    run_dir = tmp_path / "logged"
    cfg = config(
        run_dir,
        "train.log_to=[tensorboard, wandb]",
        "train.wandb_project=rlvr-tests",
        "eval.every_steps=2",
        "eval.samples=4",
        "eval.k=2",
    )
    train(cfg, show_progress=False)
    expected = logged_numbers(run_dir)
    assert [step for step, _ in expected] == [0, 1, 2, 2, 3, 3]
    assert "reward/mean" in expected[1][1] and "eval/pass@1" in expected[0][1]

    (run,) = wandb_runs
    assert run.settings == {
        "project": "rlvr-tests",
        "name": "logged",
        "dir": str(run_dir),
        "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
    }
    assert run.logged == expected
    assert run.finished

    (writer,) = writers
    assert writer.log_dir == str(run_dir / "tensorboard")
    assert writer.scalars == [(s, tag, v) for s, numbers in expected for tag, v in numbers.items()]
    assert writer.closed


def test_a_missing_package_is_an_error_naming_the_key_and_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"train\.log_to: 'wandb' needs .*\.\[wandb\]"):
        train(config(tmp_path / "w", "train.log_to=[wandb]"), show_progress=False)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match=r"'tensorboard' needs .*\.\[tensorboard\]"):
        train(config(tmp_path / "t", "train.log_to=[tensorboard]"), show_progress=False)
    with pytest.raises(ConfigError, match=r"'train\.log_to\.0': Input should be 'tensorboard' or"):
        config(tmp_path / "m", "train.log_to=[mlflow]")


def test_loggers_are_closed_when_opening_another_fails(tmp_path, monkeypatch, wandb_runs):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    cfg = config(tmp_path / "half", "train.log_to=[wandb, tensorboard]")
    with pytest.raises(ConfigError, match="tensorboard"):
        train(cfg, show_progress=False)
    assert [run.finished for run in wandb_runs] == [True]


def test_loggers_are_closed_when_training_stops(tmp_path, wandb_runs):
    def poison(batch):
        batch.rewards = torch.full_like(batch.rewards, float("nan"))
        return batch

    cfg = config(tmp_path / "nan", "train.log_to=[wandb]", "train.max_nonfinite_steps=2")
    with pytest.warns(UserWarning, match="non-finite"), pytest.raises(NonFiniteError):
        train(cfg, filters=(poison,), show_progress=False)
    (run,) = wandb_runs
    assert run.finished and [step for step, _ in run.logged] == [1]


TINY_MODEL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
]


def test_sft_and_dpo_send_their_metrics_to_the_loggers_too(tmp_path, wandb_runs, writers):
    """sft.log_to / dpo.log_to: every metrics.jsonl line (and the held-out evaluations, as
    eval/...) reaches both loggers, which are closed at the end."""
    sft_dir = tmp_path / "sft"
    sft = resolve_config(
        overrides=[*TINY_MODEL, "data.max_digits=1", "data.train_size=40", "data.test_size=4",
                   "sft.steps=3", "sft.batch_size=4",
                   f"sft.output_dir={sft_dir}", "sft.log_to=[tensorboard, wandb]",
                   "sft.wandb_project=rlvr-sft"],
        model=SFTConfig,
    )  # fmt: skip
    run_sft(sft, show_progress=False)
    held_out = {r["step"]: r for r in read_jsonl(sft_dir / "eval.jsonl")}
    lines = [(r["step"], numbers(r)) for r in read_jsonl(sft_dir / "metrics.jsonl")]
    assert [step for step, _ in lines] == [1, 2, 3] and "loss" in lines[0][1]
    lines = [(0, numbers(held_out[0], "eval/")), *lines, (3, numbers(held_out[3], "eval/"))]
    assert set(lines[0][1]) == {"eval/loss", "eval/tokens"}
    (run,) = wandb_runs
    assert run.settings["project"] == "rlvr-sft" and run.logged == lines and run.finished
    (writer,) = writers
    assert writer.log_dir == str(sft_dir / "tensorboard") and writer.closed
    assert writer.scalars == [(s, tag, v) for s, values in lines for tag, v in values.items()]

    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(40)]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dpo_dir = tmp_path / "dpo"
    dpo = resolve_config(
        overrides=[*TINY_MODEL, "data.task=file", f"data.path={pairs}", "data.template=none",
                   "dpo.eval_pairs=8", "dpo.batch_size=8", "dpo.steps=2",
                   f"dpo.output_dir={dpo_dir}", "dpo.log_to=[wandb]"],
        model=DPOConfig,
    )  # fmt: skip
    run_dpo(dpo, show_progress=False)
    evaluations = {r["step"]: r for r in read_jsonl(dpo_dir / "eval.jsonl")}
    expected = [(0, numbers(evaluations[0], "eval/"))]
    for record in read_jsonl(dpo_dir / "metrics.jsonl"):
        expected.append((record["step"], numbers(record)))
    expected.append((2, numbers(evaluations[2], "eval/")))
    assert wandb_runs[1].logged == expected and wandb_runs[1].finished


def test_sft_and_dpo_name_their_own_key_for_a_missing_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    sft = resolve_config(
        overrides=[
            *TINY_MODEL,
            "data.max_digits=1",
            "data.train_size=40",
            "data.test_size=4",
            "sft.steps=1",
            f"sft.output_dir={tmp_path}",
            "sft.log_to=[wandb]",
        ],
        model=SFTConfig,
    )
    with pytest.raises(ConfigError, match=r"^sft\.log_to: 'wandb' needs the wandb package"):
        run_sft(sft, show_progress=False)


def test_only_finite_numbers_but_the_step_reach_the_loggers():
    # booleans, texts, nulls, NaN and inf are not curves; ints become floats
    metrics = {"step": 3, "loss": 1, "kl": 0.5, "stopped": True, "note": "x", "lr": None,
               "nan": math.nan, "inf": -math.inf}  # fmt: skip
    assert _scalars(metrics) == {"loss": 1.0, "kl": 0.5}


def test_off_the_main_rank_no_logger_is_opened(tmp_path, wandb_runs, writers):
    cfg = config(tmp_path / "r", "train.log_to=[tensorboard, wandb]")
    assert run_loggers(cfg, "train", tmp_path, main=False).loggers == []
    assert wandb_runs == [] and writers == []


def test_a_logger_that_fails_to_open_closes_those_opened_and_closing_twice_is_harmless(
    tmp_path, monkeypatch, writers
):
    # any error (not only a missing package) closes what was opened, then propagates
    def broken_init(**settings):
        raise RuntimeError("no network")

    module = types.ModuleType("wandb")
    module.init = broken_init
    monkeypatch.setitem(sys.modules, "wandb", module)
    with pytest.raises(RuntimeError, match="no network"):
        MetricLoggers(["tensorboard", "wandb"], tmp_path, {}, "p", "train.log_to")
    assert [writer.closed for writer in writers] == [True]

    with MetricLoggers(["tensorboard"], tmp_path, {}, "p", "train.log_to") as loggers:
        loggers.log({"step": 1, "loss": 2.0}, step=1)
    loggers.close()  # after the `with`: nothing left to close or to log to
    loggers.log({"loss": 3.0}, step=2)
    assert writers[1].scalars == [(1, "loss", 2.0)]
