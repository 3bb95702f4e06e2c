"""What the command line passes on: each command's arguments reach the library function it
calls (replaced here by a recorder, so nothing trains or samples), and its defaults, refusals
and printed results are the documented ones."""

import importlib
import json
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import RLConfig, describe_fields
from rlvr.training.stopping import RunStopped

runner = CliRunner()
RETRY = "Your answer is incorrect. Please try again."
SCORES = {"problems": 0, "pass@1": 0.25}


@pytest.fixture
def evaluated(monkeypatch):
    """Replace the model loader and `evaluate`: what `rlvr eval` would load and sample with."""
    calls: dict = {}

    def load(model_config):
        calls["model"] = model_config.name_or_path
        return "policy", "tokenizer"

    def evaluate(policy, tokenizer, problems, **kwargs):
        calls.update(problems=problems, **kwargs)
        if kwargs["records"] is not None:
            kwargs["records"].append({"problem": 0, "correct": True})
        return {**SCORES, "problems": len(problems)}

    monkeypatch.setattr("rlvr.models.loading.load_model_and_tokenizer", load)
    monkeypatch.setattr(importlib.import_module("rlvr.evaluation.evaluate"), "evaluate", evaluate)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return calls


def eval_record(args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / "eval.jsonl"
    out.unlink(missing_ok=True)
    result = runner.invoke(app, ["eval", *args, "--output", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(out.read_text())


def test_eval_defaults_reach_evaluate_and_the_record(evaluated, tmp_path):
    record = eval_record(["--model", "tiny"], tmp_path)
    assert (evaluated["k"], len(evaluated["problems"])) == (8, 500)
    assert evaluated["attempts"] == (1, RETRY)
    assert evaluated["engine"] is None and evaluated["tools"].names == ()
    keys = ("template", "temperature", "top_p", "max_new_tokens", "seed")
    sampled = {key: evaluated[key] for key in keys}
    assert sampled == {
        "template": "chat",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 64,
        "seed": 0,
    }
    # the record says how to reproduce it: no attempts, engine or tools keys at their defaults
    assert record == {"model": "tiny", "task": "arithmetic", **sampled, **SCORES, "problems": 500}


def test_eval_takes_the_lowest_value_of_each_option(evaluated, tmp_path):
    args = ["--model", "tiny", "--k", "1", "--samples", "1", "--temperature", "0"]
    record = eval_record(
        [*args, "--max-new-tokens", "1", "--attempts", "1", "--seed", "7"], tmp_path
    )
    assert (evaluated["k"], len(evaluated["problems"])) == (1, 1)
    assert evaluated["attempts"] == (1, RETRY)
    assert (record["temperature"], record["max_new_tokens"], record["seed"]) == (0.0, 1, 7)
    for flag in ("--k", "--samples", "--max-new-tokens", "--attempts"):
        result = runner.invoke(app, ["eval", "--model", "tiny", flag, "0"])
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output


def test_eval_data_overrides_and_task_reach_the_task(evaluated, tmp_path, monkeypatch):
    from rlvr.data import tasks

    loaded = []
    real = tasks.load_eval_task
    monkeypatch.setattr(tasks, "load_eval_task", lambda data: loaded.append(data) or real(data))
    args = ["--model", "tiny", "--samples", "3", "data.max_digits=1", "data.train_size=9"]
    record = eval_record(args, tmp_path)
    assert [(d.task, d.max_digits, d.test_size) for d in loaded] == [("arithmetic", 1, 3)]
    assert record["task"] == "arithmetic" and len(evaluated["problems"]) == 3


def test_eval_of_a_run_directory_evaluates_its_latest_checkpoint_on_its_task(evaluated, tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        (run / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step}" / "trainer_state.pt").write_text("")
    data = {"task": "arithmetic", "max_digits": 1, "train_size": 9, "test_size": 4}
    settings = {"data": {**data, "template": "r1"}, "rollout": {"max_new_tokens": 10}}
    (run / "config.yaml").write_text(yaml.safe_dump(settings))
    latest = run / "checkpoints" / "step-2"
    record = eval_record(["--model", str(run)], tmp_path)
    assert evaluated["model"] == record["model"] == str(latest)
    assert (record["template"], record["max_new_tokens"]) == ("r1", 10)  # the run's
    assert len(evaluated["problems"]) == 4  # its held-out problems
    result = runner.invoke(app, ["eval", "--model", str(run), "--max-new-tokens", "3"])
    assert result.exit_code == 0 and evaluated["max_new_tokens"] == 3  # the option wins
    assert f"{run} is a run directory: evaluating its latest, {latest}" in result.stderr


def test_eval_of_a_model_folder_is_not_taken_for_a_run_directory(evaluated, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = runner.invoke(app, ["eval", "--model", str(tmp_path), "--samples", "2"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "run directory" not in result.stderr and evaluated["model"] == str(tmp_path)


def test_eval_attempts_need_the_chat_template(evaluated, tmp_path):
    record = eval_record(["--model", "tiny", "--samples", "2", "--attempts", "2"], tmp_path)
    assert evaluated["attempts"] == (2, RETRY) and record["attempts"] == 2
    args = ["--model", "tiny", "--samples", "2", "--attempts", "3", "--retry-message", "No."]
    assert eval_record(args, tmp_path)["attempts"] == 3 and evaluated["attempts"] == (3, "No.")
    record = eval_record(["--model", "tiny", "--samples", "2", "--template", "r1"], tmp_path)
    assert record["template"] == "r1" and "attempts" not in record
    result = runner.invoke(app, ["eval", "--model", "tiny", "--attempts", "2", "--template", "r1"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --attempts 2 tells a wrong attempt so in a chat turn: use --template chat\n"
    )


def test_eval_engine_choice(evaluated, tmp_path, monkeypatch):
    engines = []

    def sampling_engine(settings, *args, engine_named):
        engines.append((settings.engine, engine_named))
        return "a vllm engine"

    monkeypatch.setattr("rlvr.evaluation.engines.sampling_engine", sampling_engine)
    record = eval_record(["--model", "tiny", "--samples", "2", "--engine", "vllm"], tmp_path)
    assert record["engine"] == "vllm" and evaluated["engine"] == "a vllm engine"
    assert engines == [("vllm", "--engine vllm")]
    assert "engine" not in eval_record(["--model", "tiny", "--samples", "2"], tmp_path)
    result = runner.invoke(app, ["eval", "--model", "tiny", "--engine", "sglang"])
    assert result.exit_code == 2 and result.stderr == "error: --engine sglang: choose hf or vllm\n"


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--task", "gsm", "did you mean gsm8k? choose arithmetic, countdown, gsm8k, math or file"),
        ("--template", "r2", "choose chat, r1, qwen_math or none"),
    ],
)
def test_eval_task_and_template_are_refused_naming_the_option(option, value, said):
    """Not `config key 'data.template'`, the key the option becomes, which the user never wrote."""
    result = runner.invoke(app, ["eval", "--model", "/nowhere", option, value])
    assert result.exit_code == 2 and result.stderr == f"error: {option} {value}: {said}\n"


def test_eval_tools_and_their_format(evaluated, tmp_path):
    base = ["--model", "tiny", "--samples", "2"]
    record = eval_record([*base, "--tools", " calculator, ,python"], tmp_path)
    assert evaluated["tools"].names == ("calculator", "python")
    assert (record["tools"], record["tool_format"]) == ("calculator,python", "tags")
    record = eval_record([*base, "--tools", "calculator", "--tool-format", "code"], tmp_path)
    assert (record["tools"], record["tool_format"]) == ("calculator", "code")
    record = eval_record([*base, "--tools", " none "], tmp_path)
    assert evaluated["tools"].names == () and "tools" not in record
    bad = runner.invoke(app, ["eval", *base, "--tools", "calculator", "--tool-format", "xml"])
    assert bad.exit_code == 2
    assert bad.stderr == "error: --tool-format: Input should be 'tags', 'code' or 'hermes'\n"
    bad = runner.invoke(app, ["eval", *base, "--tools", "calculator,calc"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --tools: unknown tool 'calc'")
    hermes = runner.invoke(app, ["eval", *base, "--tools", "python", "--tool-format", "hermes"])
    assert hermes.exit_code == 0, hermes.output
    hermes_r1 = ["--tools", "python", "--tool-format", "hermes", "--template", "r1"]
    bad = runner.invoke(app, ["eval", *base, *hermes_r1])
    assert bad.exit_code == 2 and "--template chat" in bad.stderr


def test_eval_logs_its_samples_only_when_asked(evaluated, tmp_path):
    logged = tmp_path / "samples.jsonl"
    logged.write_text("an earlier evaluation's line\n")
    args = ["eval", "--model", "tiny", "--samples", "2", "--log-samples", str(logged)]
    assert runner.invoke(app, args).exit_code == 0
    assert [json.loads(line) for line in logged.read_text().splitlines()] == [
        {"problem": 0, "correct": True}
    ]
    assert runner.invoke(app, args[:-2]).exit_code == 0 and evaluated["records"] is None


def test_eval_under_torchrun_is_refused_and_training_is_not(evaluated, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr("rlvr.training.rl.train", lambda cfg, resume: ran.append(cfg) or tmp_path)
    monkeypatch.setattr("rlvr.tracking.report.plot_runs", lambda *args, **kwargs: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = runner.invoke(app, ["eval", "--model", "tiny"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: rlvr eval runs in one process: under torchrun, only `rlvr train`, `sft` and "
        "`dpo` run data-parallel\n"
    )
    assert runner.invoke(app, ["train"]).exit_code == 0 and len(ran) == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert runner.invoke(app, ["eval", "--model", "tiny", "--samples", "1"]).exit_code == 0


@pytest.fixture
def trained(monkeypatch, tmp_path):
    """Replace `rlvr.training.rl.train` and `plot_runs`: what `rlvr train` would run and plot."""
    calls: dict = {"runs": [], "plots": []}

    def train(cfg, resume):
        calls["runs"].append((cfg, resume))
        if calls.get("stop"):
            raise calls["stop"]
        return Path(cfg.train.output_dir)

    monkeypatch.setattr("rlvr.training.rl.train", train)
    monkeypatch.setattr("rlvr.tracking.report.plot_runs", lambda *a: calls["plots"].append(a))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return calls


def test_train_without_arguments_runs_the_defaults(trained):
    result = runner.invoke(app, ["train"])
    assert result.exit_code == 0, (result.output, result.exception)
    [(cfg, resume)] = trained["runs"]
    assert cfg == RLConfig() and resume is False
    run_dir = Path(RLConfig().train.output_dir)
    assert trained["plots"] == [([run_dir], run_dir / "report.png")]
    assert result.stdout == f"run directory: {run_dir} (curves in report.png)\n"


def test_train_takes_a_config_file_then_overrides_in_order(trained, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"train": {"steps": 7, "seed": 3, "lr": 0.5}}))
    args = [str(config), "train.steps=2", "train.seed=4", f"train.output_dir={tmp_path}"]
    result = runner.invoke(app, ["train", *args, "--resume"])
    assert result.exit_code == 0, (result.output, result.exception)
    [(cfg, resume)] = trained["runs"]
    assert (cfg.train.steps, cfg.train.seed, cfg.train.lr, resume) == (2, 4, 0.5, True)
    assert Path(cfg.train.output_dir) == tmp_path
    result = runner.invoke(app, ["train", "train.steps=2", "train.seed=4", "--preset", "dr_grpo"])
    assert result.exit_code == 0, (result.output, result.exception)
    cfg, resume = trained["runs"][-1]
    assert (cfg.train.steps, cfg.train.seed, cfg.preset, resume) == (2, 4, "dr_grpo", False)


def test_train_reports_only_on_the_main_process(trained, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    result = runner.invoke(app, ["train", f"train.output_dir={tmp_path}"])
    assert result.exit_code == 0 and result.output == "" and trained["plots"] == []
    monkeypatch.setenv("RANK", "0")
    result = runner.invoke(app, ["train", f"train.output_dir={tmp_path}"])
    assert result.exit_code == 0 and result.stdout.startswith(f"run directory: {tmp_path} ")


def test_a_stopped_train_plots_and_exits_as_the_signal(trained, tmp_path):
    import signal

    trained["stop"] = RunStopped(signal.SIGTERM, 3, tmp_path / "checkpoints" / "step-3")
    result = runner.invoke(app, ["train", f"train.output_dir={tmp_path}"])
    assert result.exit_code == 128 + signal.SIGTERM
    assert trained["plots"] == [([tmp_path], tmp_path / "report.png")]
    assert " ".join(result.stderr.split()) == (
        f"stopped by SIGTERM after step 3; checkpoint {tmp_path}/checkpoints/step-3; rlvr train "
        "with the same arguments and --resume continues it"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["train", "--actor_rollout_ref.actor.ppo_epochs", "2"], "not options: train.epochs=2"),
        (["train", "--rollout.n", "8"], "not options: rollout.samples_per_prompt=8"),
        (["train", "--train.seed=3", "x=1"], "not options: train.seed=3 "),
        (["train", "--train.seed", "--preset", "grpo"], "not options: train.seed=... "),
        (["train", "x=1", "--train.seed", "a=b"], "not options: train.seed=... "),
        (["train", "x=1", "--train.seed", "3"], "not options: train.seed=3 "),  # the next one
        (["train", "--presett", "grpo"], "no option '--presett'; did you mean --preset?"),
        (["train", "--lr"], "not options: lr=... "),  # close to no option, nor TRL's or verl's
    ],
)
def test_an_option_that_is_not_one_is_refused_naming_the_key(trained, args, said):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and said in result.stderr, result.output
    assert result.stderr.startswith("error: ") and trained["runs"] == []


def test_sweep_passes_its_axes_on_and_prints_the_summary(monkeypatch, tmp_path):
    calls = []
    rows = [
        {"name": "seed=0", "steps": 2, "accuracy": 0.5, "reward/mean": 0.25,
         "eval/pass@1": None, "seconds": 12.4},
        {"name": "seed=1", "steps": 2, "accuracy": 1.0, "reward/mean": 0.125,
         "eval/pass@1": 0.75, "seconds": 3.6},
    ]  # fmt: skip

    def run_sweep(config_path, presets, overrides, output_dir):
        calls.append((config_path, presets, overrides, output_dir))
        return rows

    monkeypatch.setattr("rlvr.training.sweep.run_sweep", run_sweep)
    args = ["sweep", "train.seed=0,1", "train.steps=2", "--preset", "grpo,rloo"]
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert calls == [(None, "grpo,rloo", ["train.seed=0,1", "train.steps=2"], tmp_path)]
    lines = [line.replace("│", " ").split() for line in result.stdout.splitlines()]
    assert ["seed=0", "2", "0.500", "0.250", "-", "12"] in lines
    assert ["seed=1", "2", "1.000", "0.125", "0.750", "4"] in lines
    assert result.stdout.endswith(f"runs, summary.jsonl and report.png in {tmp_path}\n")
    config = tmp_path / "grid.yaml"
    assert runner.invoke(app, ["sweep", str(config), "train.seed=0,1"]).exit_code == 0
    assert calls[-1] == (str(config), None, ["train.seed=0,1"], Path("runs/sweep"))


def test_bench_defaults_and_its_table(monkeypatch):
    calls = []

    def run_bench(cfg, steps, warmup):
        calls.append((cfg.train.steps, steps, warmup))
        return {"time/step": 0.123456, "steps": steps, "per_step": [{"time/step": 9.0}]}

    monkeypatch.setattr("rlvr.training.bench.run_bench", run_bench)
    result = runner.invoke(app, ["bench", "train.steps=3"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert calls == [(3, 5, 1)]  # 5 timed steps after 1 warm-up step
    lines = [line.replace("│", " ").split() for line in result.stdout.splitlines()]
    assert ["time/step", "0.1235"] in lines and ["steps", "5"] in lines
    assert "per_step" not in result.stdout


def test_report_plots_where_and_what_it_is_told(monkeypatch, tmp_path):
    calls = []

    def plot_runs(run_dirs, out, metrics, smoothing):
        calls.append((run_dirs, out, metrics, smoothing))

    monkeypatch.setattr("rlvr.tracking.report.plot_runs", plot_runs)
    first, second = tmp_path / "a", tmp_path / "b"
    result = runner.invoke(app, ["report", str(first)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert calls == [([first], first / "report.png", None, 0.0)]
    assert result.stdout == f"wrote {first / 'report.png'}\n"
    args = ["report", str(first), str(second), "--metric", "loss", "--metric", "eval/pass@1"]
    assert runner.invoke(app, [*args, "--smoothing", "0.5"]).exit_code == 0
    assert calls[-1] == ([first, second], first / "report.png", ["loss", "eval/pass@1"], 0.5)


def test_help_config_is_one_paragraph_per_section_wrapped_to_the_terminal(monkeypatch):
    """A blank line between sections only; each meaning wrapped to the terminal's width, at
    most 100 columns."""
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["train", "--help-config"])
    assert result.exit_code == 0
    paragraphs = result.output.strip("\n").split("\n\n")
    fields = describe_fields(RLConfig)
    sections = list(dict.fromkeys(key.split(".")[0] for key, _, _ in fields))
    assert not result.output.startswith("\n") and len(paragraphs) == len(sections)
    for section, paragraph in zip(sections, paragraphs, strict=True):
        keys = [line.split(" = ")[0] for line in paragraph.splitlines() if line[0] != " "]
        assert keys == [key for key, _, _ in fields if key.split(".")[0] == section]
    wrapped = [
        textwrap.fill(" ".join(doc.split()), 100, initial_indent="    ", subsequent_indent="    ")
        for _, _, doc in fields
    ]
    assert [line for line in result.output.splitlines() if line.startswith("    ")] == [
        line for meaning in wrapped for line in meaning.splitlines()
    ]
