"""SIGINT and SIGTERM end an RL run after its step with a checkpoint that --resume continues on
the same trajectory; a second Ctrl-C stops at once; a sweep resumes the stopped run."""

from __future__ import annotations

import math
import os
import signal

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import resolve_config
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import stopping, sweep
from rlvr.training.rl import train
from rlvr.training.stopping import REPEAT_S, RunStopped, StopOnSignal
from rlvr.training.sweep import run_sweep, saved_step, sweep_points
from test_distributed import torchrun
from tiny_run import TINY_RUN

TIMING = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own Ctrl-C handler, whatever the tests were started with (a shell starts a
    background job with SIGINT ignored); the one they had afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_signal_the_process_ignores_stays_ignored():
    """`nohup rlvr train &` runs with SIGINT (and `nohup` with SIGHUP) ignored: the run keeps
    ignoring SIGINT, as Python itself does, and still stops on SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with StopOnSignal(announce=False) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received is signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def signal_at_step(step: int, sig: signal.Signals):
    """A batch filter that sends `sig` to this process while step `step` is being trained."""
    calls = []

    def keep(batch):
        calls.append(None)
        if len(calls) == step:
            os.kill(os.getpid(), sig)
        return batch

    return keep


def config(run_dir, *extra):
    overrides = [*TINY_RUN, "train.mini_batches=2", f"train.output_dir={run_dir}", *extra]
    return resolve_config(preset="grpo", overrides=overrides)


def test_the_first_signal_sets_a_flag_and_leaving_restores_the_handlers():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with StopOnSignal(announce=False) as stop:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received is signal.SIGTERM  # and this process still runs
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        assert stop.received is signal.SIGTERM
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_second_ctrl_c_stops_at_once_but_a_repeated_delivery_does_not(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    with StopOnSignal(announce=False) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received is signal.SIGINT
        clock[0] += REPEAT_S - 0.01  # `timeout -s INT` sends one press to the process and its group
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        clock[0] += 0.01
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the second SIGINT did not interrupt")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_exit_code_is_the_shells_for_the_signal(tmp_path):
    assert RunStopped(signal.SIGINT, 3, tmp_path).exit_code == 130
    assert RunStopped(signal.SIGTERM, 3, tmp_path).exit_code == 143


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_and_resume_follows_the_same_trajectory(tmp_path, sig):
    straight = train(config(tmp_path / "a", "train.steps=4"), show_progress=False)
    stopped_dir = tmp_path / "b"
    with pytest.raises(RunStopped) as stopped:
        train(
            config(stopped_dir, "train.steps=4"),
            filters=(signal_at_step(2, sig),),
            show_progress=False,
        )
    assert stopped.value.received is sig and stopped.value.step == 2
    assert stopped.value.checkpoint == stopped_dir / "checkpoints" / "step-2"
    assert sorted(p.name for p in (stopped_dir / "checkpoints").iterdir()) == ["step-2"]
    assert [m["step"] for m in read_jsonl(stopped_dir / "metrics.jsonl")] == [1, 2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    train(config(stopped_dir, "train.steps=4"), resume=True, show_progress=False)
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(stopped_dir / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    assert a[-1]["loss"] != a[-2]["loss"]  # the run trained, so equal records mean something
    for left, right in zip(a, b):
        for key in left.keys() - TIMING:
            same = left[key] == right[key] or (math.isnan(left[key]) and math.isnan(right[key]))
            assert same, (left["step"], key, left[key], right[key])


def test_a_signal_in_the_last_step_ends_the_run_as_usual(tmp_path):
    cfg = config(tmp_path, "train.steps=2")
    run_dir = train(cfg, filters=(signal_at_step(2, signal.SIGTERM),), show_progress=False)
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]


def sends_once(sig: signal.Signals, rank: str | None = None):
    """A reward function (all 0) that sends `sig` to its process at its first call: on torchrun
    rank `rank` alone when given."""
    sent = []

    def reward(prompts: list, completions: list, **_: object) -> list[float]:
        if not sent and rank in (None, os.environ.get("RANK")):
            sent.append(None)
            os.kill(os.getpid(), sig)
        return [0.0] * len(completions)

    return reward


interrupting_reward = sends_once(signal.SIGINT)
rank_one_is_terminated = sends_once(signal.SIGTERM, rank="1")


def test_rlvr_train_reports_the_stop_and_exits_with_130(tmp_path):
    run_dir = tmp_path / "run"
    reward = f"reward.functions=[{{name: '{__name__}:interrupting_reward'}}]"
    result = CliRunner().invoke(
        app, ["train", *TINY_RUN, "train.steps=3", f"train.output_dir={run_dir}", reward]
    )
    assert result.exit_code == 130, result.output
    text = " ".join(result.output.split())
    assert "stopped by SIGINT after step 1; checkpoint" in text
    assert "--resume continues it" in text
    assert (run_dir / "checkpoints" / "step-1" / "model.safetensors").is_file()
    assert (run_dir / "report.png").is_file()


def test_a_sweep_resumes_a_stopped_run_from_its_checkpoint(tmp_path, monkeypatch):
    overrides = [*TINY_RUN, "train.steps=3", "train.seed=0,1"]
    first, second = sweep_points(None, "grpo", overrides, tmp_path)
    with pytest.raises(RunStopped):
        train(first.config, filters=(signal_at_step(1, signal.SIGTERM),), show_progress=False)
    assert saved_step(first) == 1 and saved_step(second) == 0
    step_1 = read_jsonl(tmp_path / first.name / "metrics.jsonl")
    calls = []

    def train_and_note(cfg, **kwargs):
        calls.append(kwargs["resume"])
        return train(cfg, **kwargs)

    monkeypatch.setattr(sweep, "train", train_and_note)
    run_sweep(None, "grpo", overrides, tmp_path, show_progress=False)
    assert calls == [True, False]  # the stopped run resumed, the other one started
    resumed = read_jsonl(tmp_path / first.name / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3] and resumed[0] == step_1[0]
    assert saved_step(first) == saved_step(second) == 3


def test_a_sweep_resumes_a_run_given_more_steps(tmp_path):
    (short,) = sweep_points(None, "grpo", [*TINY_RUN, "train.steps=1"], tmp_path)
    (longer,) = sweep_points(None, "grpo", [*TINY_RUN, "train.steps=2"], tmp_path)
    train(short.config, show_progress=False)
    assert saved_step(longer) == 1  # train.steps alone may differ, as for rlvr train --resume


def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    run_dir = tmp_path / "run"
    reward = f"reward.functions=[{{name: '{__name__}:rank_one_is_terminated'}}]"
    command = ["-m", "rlvr", "train", *TINY_RUN, "train.steps=4", f"train.output_dir={run_dir}"]
    done = torchrun(2, *command, reward)
    assert done.returncode != 0
    assert done.stderr.count("stopped by SIGTERM after step 1") == 1, done.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1"]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1]
