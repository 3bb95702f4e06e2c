"""The command line: it parses, calls the library, and turns bad input into clear errors."""

import json
import re
import sys

import pytest
import yaml
from trl.rewards import get_soft_overlong_punishment
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import (
    ConfigError,
    DataConfig,
    RLConfig,
    describe_fields,
    preset_names,
    resolve_config,
)
from rlvr.data.loaders import load_file
from rlvr.data.tasks import load_task
from rlvr.evaluation.evaluate import evaluate, sample_and_verify
from rlvr.models.loading import load_pretrained, save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training import preference as preference_module, rl as rl_module, sft as sft_module
from rlvr.training.rl import train
from tiny_run import TINY_RUN

runner = CliRunner()
SMALL = [*TINY_RUN, "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "train.steps=2"]


def test_presets_lists_every_preset_with_its_paper():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in preset_names():
        assert name in result.output
    assert "DeepSeekMath" in result.output and "R1-Zero" in result.output


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["sweep"], ["dpo"]])
def test_dash_h_is_help(command):
    """`-h` was read as a config file named '-h' by the settings commands."""
    result = runner.invoke(app, [*command, "-h"], prog_name="rlvr")
    assert result.exit_code == 0, result.output
    assert f"Usage: rlvr {' '.join(command)}".rstrip() in " ".join(result.output.split())


def test_train_with_a_mistyped_key_names_it_and_the_closest_key():
    result = runner.invoke(app, ["train", "--preset", "grpo", "algorithm.clip.hihg=0.3"])
    assert result.exit_code == 2
    assert "algorithm.clip.hihg" in result.output and "algorithm.clip.high" in result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["train", "--train.lr", "1e-6", "--preset", "grpo"],
            "'--train.lr': settings are key=value arguments here, not options: train.lr=1e-6",
        ),
        (["train", "--num_generations=8"], "not options: rollout.samples_per_prompt=8"),  # TRL's
        (["dpo", "--beta", "0.5"], "not options: dpo.beta=0.5"),
        (["sweep", "--train.seed", "0,1"], "not options: train.seed=0,1"),
        (["sft", "--gradient_checkpointing", "--sft.steps=3"], "gradient_checkpointing=..."),
        (["train", "--output_dir", "x"], "not options: train.output_dir=x"),  # TRL's, again
        (["train", "--resum"], "no option '--resum'; did you mean --resume?"),  # a real option
        (["sweep", "--output_dir", "x"], "did you mean --output-dir?"),  # the command's own
        (["train", "--preset", "grpoo"], "did you mean 'grpo'"),  # no settings at all
        (["sft", "--sft.steps"], "not options: sft.steps=..."),  # the last argument
    ],
)  # fmt: skip
def test_a_setting_given_as_an_option_is_shown_as_key_value(args, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert said in result.stderr and "No such option" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_first_argument_that_is_neither_a_file_nor_a_setting_says_which_it_can_be(tmp_path):
    for arg, said in (
        ("train.steps", "config file 'train.steps' does not exist; a setting is written key=value"),
        ("missing.yaml", "config file 'missing.yaml' does not exist"),
        (
            "~train.steps",
            "override '~train.steps': Hydra's ~key removes a key; rlvr's keys all "
            "have defaults, so leave 'train.steps' out to keep its default",
        ),
    ):
        result = runner.invoke(app, ["train", arg, f"train.output_dir={tmp_path}"])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == f"error: {said}"
    assert not any(tmp_path.iterdir())


def test_train_on_a_device_that_is_not_there_names_the_key(tmp_path):
    result = runner.invoke(
        app, ["train", *TINY_RUN, f"train.output_dir={tmp_path}", "model.device=cuda:7"]
    )
    assert result.exit_code == 2
    assert "model.device 'cuda:7'" in result.output


def test_an_error_with_brackets_is_printed_as_it_is(tmp_path, monkeypatch):
    """Rich would read `[wandb]` in the message as markup and drop it."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    result = runner.invoke(
        app, ["train", *TINY_RUN, f"train.output_dir={tmp_path}", "train.log_to=[wandb]"]
    )
    assert result.exit_code == 2
    assert '".[wandb]"' in result.stderr  # not '"."'
    assert "error:" not in result.stdout  # `rlvr ... > out.txt` still shows the error


def test_a_long_path_is_printed_on_one_line(tmp_path):
    """Rich wraps at 80 columns when output is not a terminal; a path cut in two cannot be
    copied or grepped from a log."""
    model = tmp_path / ("a-long-folder-name-" * 4) / "[exp1]" / "step-1"
    result = runner.invoke(app, ["eval", "--model", str(model)])
    assert result.exit_code == 2
    assert f"model.name_or_path {str(model)!r}: no Hugging Face model there" in result.stderr


def test_help_config_shows_every_key_in_full_and_brackets_as_written():
    result = runner.invoke(app, ["train", "--help-config"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    for key, default, _ in describe_fields(RLConfig):
        assert f"{key} = {default}" in lines  # a table cut the longest keys short
    text = " ".join(result.output.split())
    assert "ratio is outside [min_ratio, max_ratio];" in text  # Rich markup dropped these
    assert "e.g. train.log_to=[wandb]:" in text
    curate = runner.invoke(app, ["curate", "--help"])
    assert "lies in [curate.min_pass_rate, curate.max_pass_rate];" in " ".join(
        curate.output.replace("│", " ").split()
    )


def test_eval_on_a_device_that_is_not_there_names_it():
    result = runner.invoke(app, ["eval", "--model", "tiny", "--device", "tpu"])
    assert result.exit_code == 2
    assert "model.device 'tpu'" in result.output


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--k", "0"), ("--samples", "0"), ("--max-new-tokens", "0"), ("--temperature", "-1")],
)
def test_eval_refuses_an_out_of_range_option_before_loading_anything(flag, value):
    result = runner.invoke(app, ["eval", "--model", "/nowhere", flag, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}'" in result.output
    assert "/nowhere" not in result.output


def test_train_with_an_out_of_range_value_names_the_key(tmp_path):
    result = runner.invoke(
        app, ["train", *TINY_RUN, f"train.output_dir={tmp_path}", "rollout.temperature=0"]
    )
    assert result.exit_code == 2
    assert "'rollout.temperature': Input should be greater than 0" in " ".join(
        result.output.split()
    )
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.loss=ppo", "algorithm.loss: unknown policy loss 'ppo'; did you mean"),
        ("algorithm.advantage=grpoo", "algorithm.advantage: unknown advantage estimator 'grpoo'"),
        ("reward.functions=[{name: nope}]", "reward.functions[0].name: unknown reward 'nope'"),
        ("reward.functions=[{name: os.path:nothere}]", "module 'os.path' has no attribute"),
    ],
)
def test_train_with_an_unknown_name_names_its_key_and_writes_nothing(tmp_path, override, message):
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", *TINY_RUN, f"train.output_dir={run_dir}", override])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output and not run_dir.exists()


def test_train_then_report_then_eval(tmp_path):
    run_dir = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "--preset", "dr_grpo", *SMALL, f"train.output_dir={run_dir}"]
    )
    assert result.exit_code == 0, result.output
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"  # `train` plots its curves
    (run_dir / "report.png").unlink()
    again = runner.invoke(app, ["train", *SMALL, f"train.output_dir={run_dir}"])
    assert again.exit_code == 2 and "holds an earlier run" in " ".join(again.output.split())
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2

    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"
    custom = tmp_path / "lengths.png"
    result = runner.invoke(
        app,
        [
            "report",
            str(run_dir),
            "--metric",
            "response_length/incorrect",
            "--metric",
            "loss",
            "--smoothing",
            "0.5",
            "--output",
            str(custom),
        ],
    )
    assert result.exit_code == 0, result.output
    assert custom.read_bytes()[:4] == b"\x89PNG"

    out = tmp_path / "eval.jsonl"
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(run_dir / "checkpoints" / "step-2"),
            "--task",
            "arithmetic",
            "--k",
            "2",
            "--samples",
            "3",
            "--max-new-tokens",
            "8",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["problems"] == 3 and record["k"] == 2
    assert 0.0 <= record["pass@1"] <= record["pass@2"] <= 1.0

    # without --task, a checkpoint is evaluated on its run's task: its settings (one-digit
    # sums), its held-out problems, its template and its evaluation budget
    checkpoint = run_dir / "checkpoints" / "step-2"
    out.unlink()
    args = ["eval", "--model", str(checkpoint), "--k", "2", "--samples", "3"]
    result = runner.invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"data.task=arithmetic with the data settings of {run_dir}" in result.stderr
    run = RLConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert run.data.max_digits == 1 and run.rollout.max_new_tokens == 10  # not the defaults
    model, tokenizer = load_pretrained(str(checkpoint))
    want = evaluate(
        model, tokenizer, load_task(run.data).test[:3], reward="math",
        template=run.data.template, k=2, max_new_tokens=run.rollout.max_new_tokens,
    )  # fmt: skip
    got = json.loads(out.read_text())
    for key in ("pass@1", "pass@2", "maj@2", "response_length/mean", "truncated_frac"):
        assert got[key] == want[key], key
    assert (got["template"], got["max_new_tokens"], got["temperature"], got["seed"]) == (
        "chat",
        10,
        1.0,
        0,
    )  # the record says how it was sampled

    # the run directory itself stands for its latest checkpoint
    args = ["eval", "--model", str(run_dir), "--k", "2", "--samples", "3"]
    result = runner.invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"is a run directory: evaluating its latest, {checkpoint}" in result.stderr
    assert f"data settings of {run_dir}" in result.stderr
    from_run_dir = json.loads(out.read_text().splitlines()[-1])
    assert from_run_dir["model"] == str(checkpoint)
    assert {k: v for k, v in from_run_dir.items() if k not in ("model", "seconds")} == {
        k: v for k, v in got.items() if k not in ("model", "seconds")
    }


def length_in_tokens(completion_ids: list[list[int]], **_: object) -> list[float]:
    """A TRL-style reward that reads `completion_ids`, as TRL passes them."""
    return [float(len(ids)) for ids in completion_ids]


overlong = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)  # TRL's


def test_trl_s_own_rewards_train_as_in_trl(tmp_path):
    think = "trl.rewards:think_format_reward"
    errors = {}
    for flag in ("true", "false"):
        run_dir = tmp_path / flag
        functions = [
            f"{{name: '{think}', conversational: {flag}}}",
            "{name: math}",
            f"{{name: '{__name__}:length_in_tokens', weight: 0.0}}",
            f"{{name: '{__name__}:overlong'}}",
        ]
        reward = f"reward.functions=[{', '.join(functions)}]"
        result = runner.invoke(app, ["train", *SMALL, f"train.output_dir={run_dir}", reward])
        assert result.exit_code == 0, result.output
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert all(f"reward/{think}" in m for m in steps)
        for m in steps:  # completion_ids are the sampled tokens: their mean length is logged too
            assert m[f"reward/{__name__}:length_in_tokens"] == m["response_length/mean"]
        errors[flag] = sum(m["reward/errors"] for m in steps)
    assert errors == {"true": 0, "false": 8}  # as texts: each call fails; 4 chunks, 2 steps
    model_reward = "reward.functions=[{name: brpo, conversational: true}]"
    bad = runner.invoke(app, ["train", *SMALL, f"train.output_dir={tmp_path / 'b'}", model_reward])
    assert bad.exit_code == 2 and "conversational is for TRL-signature rewards" in bad.stderr


def scheduled_and_logging(completions, completion_ids, trainer_state, log_extra, log_metric, **_):
    """A TRL reward using TRL's other keywords: a schedule on the step, a metric, a column."""
    log_metric("tokens", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    log_extra("echo", completions)
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)


def test_trl_s_trainer_state_and_logging_keywords_reach_the_run(tmp_path):
    """Over several sampling rounds (dynamic sampling), what each reward call logs lands on
    its step and its samples."""
    name = f"{__name__}:scheduled_and_logging"
    settings = [
        f"reward.functions=[{{name: math}}, {{name: '{name}', weight: 0.0}}]",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_sampling_rounds=3",
        "train.steps=3",
        "train.log_samples=100",
    ]
    result = runner.invoke(app, ["train", *SMALL, f"train.output_dir={tmp_path}", *settings])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m[f"reward/{name}"] for m in steps] == pytest.approx([0, 1 / 3, 2 / 3])  # done / all
    assert max(m["sampling_rounds"] for m in steps) > 1
    for m in steps:  # one sample per call (4 chunks): the mean of the calls' means
        assert m[f"reward/{name}/tokens"] == pytest.approx(m["response_length/mean"])
        assert m["reward/errors"] == 0
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == sum(4 * m["sampling_rounds"] for m in steps)
    assert all(line["echo"] == line["completion"] for line in samples)


def test_a_verl_reward_file_trains_as_in_verl(tmp_path):
    """verl's custom_reward_function (a file, compute_score by keyword, a dict with a score):
    each logged sample's reward is the function of its completion and gold answer."""
    reward_file = tmp_path / "verl_reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    hit = float(str(ground_truth) in solution_str)\n"
        "    return {'score': hit, 'chars': len(solution_str), 'source': data_source}\n"
    )
    name = f"{reward_file}:compute_score"
    run_dir = tmp_path / "run"
    settings = [f"train.output_dir={run_dir}", "train.log_samples=4", "train.steps=4"]
    result = runner.invoke(
        app, ["train", *SMALL, *settings, f"reward.functions=[{{name: '{name}'}}]"]
    )
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["reward/errors"] == 0 and f"reward/{name}/chars" in m for m in steps)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    hits = [float(line["answer"] in line["completion"]) for line in samples]
    assert [line["reward"] for line in samples] == hits and 0 < sum(hits) < len(hits)
    assert all(line["chars"] == len(line["completion"]) for line in samples)
    assert {line["source"] for line in samples} == {None}  # the task has no data_source column


def test_sft_and_dpo_plot_their_curves_as_train_does(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1", "chosen": "2", "rejected": "3"}\n' * 3)
    model = SMALL[:4]
    for args in (
        ["sft", *model, "sft.steps=2", f"sft.output_dir={tmp_path / 'sft'}"],
        ["dpo", *model, "data.task=file", f"data.path={pairs}", "dpo.eval_pairs=1",
         "dpo.steps=2", f"dpo.output_dir={tmp_path / 'dpo'}"],
    ):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output, result.exception)
        assert "(curves in report.png)" in result.output
        assert (tmp_path / args[0] / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_report_on_a_directory_without_metrics_is_an_error(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "metrics.jsonl" in result.output


def test_eval_with_a_missing_model_is_an_error(tmp_path):
    result = runner.invoke(app, ["eval", "--model", str(tmp_path / "nope"), "--samples", "2"])
    assert result.exit_code == 2
    assert "does not exist" in " ".join(result.output.split())  # wrapped after a long path


def test_eval_without_model_names_the_option_and_the_command_meant():
    """`rlvr eval runs/demo/rl` (as `rlvr report` takes its run): the folder is not read as a
    data override, and the error gives the command with --model."""
    result = runner.invoke(app, ["eval", "runs/demo/rl", "data.max_digits=1"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "give the model to evaluate with --model" in text
    assert text.endswith("rlvr eval --model runs/demo/rl")
    bare = runner.invoke(app, ["eval"])
    assert bare.exit_code == 2 and "rlvr eval --model" not in bare.output
    assert "give the model to evaluate with --model" in " ".join(bare.output.split())


def test_eval_takes_the_task_settings_as_data_overrides(tmp_path):
    """`rlvr eval` on the demo-style one-digit task gives what `evaluate` gives on it."""
    tok = build_tiny_tokenizer()
    save_pretrained(build_tiny_model(tok, hidden_size=32, num_layers=1, seed=3), tok, tmp_path)
    out = tmp_path / "scores.jsonl"
    args = ["eval", "--model", str(tmp_path), "--k", "2", "--samples", "4"]
    task_settings = {"max_digits": 1, "min_terms": 3, "train_size": 100, "template": "r1"}
    args += ["--max-new-tokens", "6", *(f"data.{k}={v}" for k, v in task_settings.items())]
    logged = tmp_path / "samples.jsonl"
    result = runner.invoke(app, [*args, "--output", str(out), "--log-samples", str(logged)])
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    task = load_task(DataConfig(**task_settings, test_size=4))
    assert all(re.fullmatch(r"What is \d[+-]\d[+-]\d\?", p.question) for p in task.test)
    model, tokenizer = load_pretrained(str(tmp_path))
    want = evaluate(
        model, tokenizer, task.test, reward="math", template="r1", k=2, max_new_tokens=6
    )
    for key in ("pass@1", "pass@2", "maj@2", "response_length/mean", "truncated_frac"):
        assert got[key] == want[key], key
    # --log-samples: the samples that were scored, in order, each with its own verdict
    records = [json.loads(line) for line in logged.read_text().splitlines()]
    s = sample_and_verify(model, tokenizer, task.test, "math", "r1", 2, 1.0, 1.0, 6, 0)
    assert [r["completion"] for r in records] == s.completions
    assert [r["correct"] for r in records] == [c for per in s.correct for c in per]
    assert [(r["problem"], r["answer"]) for r in records] == [
        (i, p.answer) for i, p in enumerate(task.test) for _ in range(2)
    ]
    assert sum(r["correct"] for r in records) / len(records) == got["pass@1"]
    assert sum(r["length"] for r in records) / len(records) == got["response_length/mean"]
    bad = runner.invoke(app, ["eval", "--model", "tiny", "data.max_digit=1"])
    assert bad.exit_code == 2 and "data.max_digit" in bad.output and "data.max_digits" in bad.output
    bad = runner.invoke(app, ["eval", "--model", "tiny", "train.lr=1"])
    assert bad.exit_code == 2 and "takes only data.KEY=VALUE" in bad.output


def no_model_before_the_data(*args, **kwargs):
    raise AssertionError("the model loaded before the data was checked")


def test_eval_of_rows_without_gold_answers_is_refused_not_scored_zero(tmp_path):
    """`data.answer_column=null` rows (a label-free run's data) cannot be scored: pass@1 read
    0.0. Refused before the model loads (the model folder here does not exist), naming the
    file; so is a training run that would evaluate them every N steps."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"prompt": f"{a}+1?"}) + "\n" for a in range(12)))
    result = runner.invoke(
        app,
        ["eval", "--model", str(tmp_path / "never_loaded"), "--task", "file",
         "--data-path", str(questions), "data.answer_column=null"],
    )  # fmt: skip
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "questions.jsonl: no row has a gold answer (data.answer_column=null)" in text
    overrides = [
        "data.task=file",
        f"data.path={questions}",
        "data.answer_column=null",
        "data.test_size=4",
        "eval.every_steps=2",
        f"train.output_dir={tmp_path / 'run'}",
    ]
    with pytest.raises(ConfigError, match=r"eval\.every_steps=2 are .*, or eval\.every_steps=0"):
        train(resolve_config(preset="intuitor", overrides=overrides), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_eval_scores_every_row_of_a_data_file(tmp_path, monkeypatch):
    """`--data-path` is the file to evaluate, not a training file to hold rows back from:
    three rows under the default --samples=500 are three problems, as `evaluate` scores them."""
    tok = build_tiny_tokenizer()
    save_pretrained(build_tiny_model(tok, hidden_size=32, num_layers=1, seed=3), tok, tmp_path)
    rows = [("What is 2+2?", "4"), ("What is 3+5?", "8"), ("What is 9-7?", "2")]
    plain = tmp_path / "test.jsonl"
    plain.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    gsm8k = tmp_path / "gsm8k_test.jsonl"
    gsm8k.write_text(
        "".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n" for q, a in rows)
    )
    model, tokenizer = load_pretrained(str(tmp_path))
    want = evaluate(
        model, tokenizer, load_file(plain, prompt_column="question"), reward="math", k=2,
        max_new_tokens=6,
    )  # fmt: skip
    common = ["eval", "--model", str(tmp_path), "--k", "2", "--max-new-tokens", "6"]
    for args in (
        ["--task", "file", "--data-path", str(plain), "data.prompt_column=question"],
        ["--task", "gsm8k", "--data-path", str(gsm8k)],
    ):
        out = tmp_path / "scores.jsonl"
        out.unlink(missing_ok=True)
        result = runner.invoke(app, [*common, *args, "--output", str(out)])
        assert result.exit_code == 0, result.output
        got = json.loads(out.read_text())
        assert got["problems"] == 3, args
        for key in ("pass@1", "pass@2", "maj@2", "response_length/mean", "truncated_frac"):
            assert got[key] == want[key], (args, key)

    monkeypatch.setattr("rlvr.models.loading.load_model_and_tokenizer", no_model_before_the_data)
    generated = runner.invoke(app, ["eval", "--model", "tiny", "--data-path", str(plain)])
    assert generated.exit_code == 2
    assert "data.task=arithmetic is generated, it reads no file" in generated.stderr
    broken = runner.invoke(app, [*common, "--task", "file", "--data-path", str(plain)])
    assert broken.exit_code == 2 and "set data.prompt_column" in broken.stderr
    # a file task that holds nothing out, as a run with data.test_size=0 trains on all rows
    none_held = [*common, "--task", "file", f"data.path={plain}", "data.prompt_column=question"]
    empty = runner.invoke(app, [*none_held, "data.test_size=0"])
    assert empty.exit_code == 2, (empty.output, empty.exception)
    assert (
        "data.task=file with data.test_size=0 holds out no problems to evaluate; give "
        "--data-path FILE or data.test_size=N" in " ".join(empty.stderr.split())
    )


def test_data_that_cannot_be_loaded_is_a_one_line_error_and_loses_nothing(tmp_path, monkeypatch):
    """Data settings that only loading the task can refuse: a clear error naming the keys,
    exit code 2, no traceback, and an earlier run's files in the output folder untouched."""
    two_rows = tmp_path / "two.jsonl"
    two_rows.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": "4"}\n')
    out = tmp_path / "run"
    out.mkdir()
    earlier = {name: f"{name} of an earlier run\n" for name in ("metrics.jsonl", "config.yaml")}
    for name, text in earlier.items():
        (out / name).write_text(text)
    model = SMALL[:4]
    cases = [
        (
            ["train", *SMALL, "data.train_size=5000"],
            "has fewer than 5010 distinct problems; lower data.train_size/data.test_size",
        ),
        (["train", *SMALL, "data.task=file"], "data.task=file needs data.path"),
        (
            ["train", *SMALL, "data.task=file", f"data.path={two_rows}", "data.test_size=2"],
            "two.jsonl has 2 rows, not more than data.test_size=2; lower data.test_size (0 "
            "holds none out) or give data.test_path",
        ),
        (
            ["sft", *model, "data.task=file", f"data.path={two_rows}", "data.test_size=1"],
            "task 'file' has no worked solutions to fine-tune on (name their column with "
            "data.solution_column)",
        ),
        (
            ["dpo", *model, "data.task=file", f"data.path={tmp_path / 'no.jsonl'}"],
            "no.jsonl: no such file",
        ),
    ]
    for args, message in cases:
        with monkeypatch.context() as patch:
            module = {"train": rl_module, "sft": sft_module, "dpo": preference_module}[args[0]]
            patch.setattr(module, "load_model_and_tokenizer", no_model_before_the_data)
            result = runner.invoke(app, [*args, f"{args[0]}.output_dir={out}"])
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert message in " ".join(result.output.split()), args
        assert {p.name: p.read_text() for p in out.iterdir()} == earlier, args


def test_an_output_directory_that_cannot_be_made_names_its_key(tmp_path):
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("not a directory\n")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1", "chosen": "2", "rejected": "3"}\n' * 2)
    model = SMALL[:4]
    cases = [
        ["train", *SMALL, f"train.output_dir={in_the_way}"],
        ["sft", *model, "sft.steps=1", f"sft.output_dir={in_the_way / 'sub'}"],
        ["dpo", *model, "data.task=file", f"data.path={pairs}", "dpo.eval_pairs=0",
         f"dpo.output_dir={in_the_way}"],
        ["demo", "--output-dir", str(in_the_way)],
    ]  # fmt: skip
    for args in cases:
        result = runner.invoke(app, args)
        key = "--output-dir" if args[0] == "demo" else f"{args[0]}.output_dir"
        assert result.exit_code == 2, (args, result.output, result.exception)
        unwrapped = "".join(result.output.split())  # the path has no spaces
        assert unwrapped.startswith(f"error:{key}='{in_the_way}"), args
        assert "':cannotmakethedirectory:" in unwrapped, args
        assert in_the_way.read_text() == "not a directory\n"


def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("kept\n")
    target = in_the_way / "results.jsonl"
    for args in (
        ["eval", "--model", "/nowhere", "--output", str(target)],
        ["eval", "--model", "/nowhere", "--log-samples", str(target)],
        ["bench", *SMALL, "model.name_or_path=/nowhere", "--output", str(target)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        said = "".join(result.output.split())
        assert said.startswith(f"error:{args[-2]}'{target}':"), args
        assert in_the_way.read_text() == "kept\n"


def test_an_output_file_that_is_not_a_new_jsonl_is_refused_and_left_as_it_was(tmp_path):
    """--output appends and --log-samples overwrites: a path that is not .jsonl (a run's
    config.yaml), or a run directory's own log, is refused before the work begins."""
    run = tmp_path / "run"
    run.mkdir()
    files = {name: f"{name} of the run\n" for name in ("config.yaml", "metrics.jsonl")}
    for name, text in files.items():
        (run / name).write_text(text)
    for option, name, reason in (
        ("--output", "config.yaml", "the result is JSON lines; give a path ending in .jsonl"),
        (
            "--log-samples",
            "metrics.jsonl",
            f"is a log of the run in '{run}'; give a file of its own",
        ),
        ("--output", "metrics.jsonl", f"is a log of the run in '{run}'; give a file of its own"),
    ):
        result = runner.invoke(app, ["eval", "--model", "/nowhere", option, str(run / name)])
        assert result.exit_code == 2, (option, result.output, result.exception)
        said = " ".join(result.output.split())
        assert said.startswith(f"error: {option} '{run / name}'"), said
        assert reason in said, said
    assert {p.name: p.read_text() for p in run.iterdir()} == files


def test_report_to_a_path_that_cannot_be_written_is_an_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": s / 4}) + "\n" for s in (1, 2))
    )
    (tmp_path / "a_file").write_text("kept\n")
    result = runner.invoke(app, ["report", str(run), "--output", str(tmp_path / "a_file/r.png")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "File exists" in result.output or "Not a directory" in result.output
    assert (tmp_path / "a_file").read_text() == "kept\n"
    metrics = (run / "metrics.jsonl").read_text()
    result = runner.invoke(app, ["report", str(run), "--output", str(run / "metrics.jsonl")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"the report is a PNG image; '{run / 'metrics.jsonl'}' does not end in .png" in (
        "".join(result.output.split("\n"))
    )
    assert (run / "metrics.jsonl").read_text() == metrics  # not a PNG over the run's log
    assert runner.invoke(app, ["report", str(run)]).exit_code == 0  # the run itself plots


def test_rlvr_warnings_print_as_one_line_and_others_as_python_prints_them(capsys, monkeypatch):
    import warnings

    from rlvr import cli
    from rlvr.data import tasks

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after
    monkeypatch.setattr(cli, "app", lambda prog_name: None)
    cli.main()
    assert warnings.showwarning is cli._show_warning
    cli._show_warning(UserWarning("3 held-out rows repeat"), UserWarning, tasks.__file__, 40)
    assert capsys.readouterr().err == "warning: 3 held-out rows repeat\n"
    shown = []
    monkeypatch.setattr(cli, "_python_show_warning", lambda *args: shown.append(args[1:4]))
    cli._show_warning(UserWarning("from a reward"), UserWarning, "/home/me/reward.py", 7)
    cli._show_warning(DeprecationWarning("old"), DeprecationWarning, tasks.__file__, 40)
    assert shown == [
        (UserWarning, "/home/me/reward.py", 7),
        (DeprecationWarning, tasks.__file__, 40),
    ]
    assert capsys.readouterr().err == ""


def test_a_run_announces_its_preset_model_task_budget_and_folder():
    from rlvr.config import resolve_config
    from rlvr.training.rl import run_line

    cfg = resolve_config(preset="dapo", overrides=["train.steps=30", "train.output_dir=runs/d"])
    assert run_line(cfg, resumed=False) == (
        "training dapo: tiny on arithmetic, 30 steps of 32 prompts × 8 samples, into runs/d"
    )
    cfg = resolve_config(overrides=["data.task=file", "data.path=q.parquet"])
    assert run_line(cfg, resumed=True).startswith("resuming with no preset: tiny on q.parquet,")


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_eval_refuses_a_top_p_that_is_not_a_probability(value):
    result = runner.invoke(app, ["eval", "--model", "/nowhere", "--top-p", value])
    assert result.exit_code == 2
    assert f"--top-p {float(value)}: give a probability in (0, 1]" in result.output
    assert "/nowhere" not in result.output


def test_eval_samples_with_the_top_p_given_and_records_it(monkeypatch, tmp_path):
    import rlvr.evaluation.evaluate as evaluation

    seen = {}

    def fake_evaluate(model, tokenizer, problems, **settings):
        seen.update(settings)
        return {"pass@1": 0.5}

    monkeypatch.setattr(evaluation, "evaluate", fake_evaluate)
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", "tiny", "--samples", "2", "--k", "2", "--top-p", "0.95"]
    result = runner.invoke(app, [*args, "--temperature", "0.6", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert (seen["top_p"], seen["temperature"]) == (0.95, 0.6)
    assert json.loads(out.read_text())["top_p"] == 0.95


def test_in_training_evaluation_samples_with_eval_top_p(monkeypatch):
    import rlvr.evaluation.evaluate as evaluation
    from rlvr.config import resolve_config

    seen = {}
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **settings: seen.update(settings))
    cfg = resolve_config(overrides=["eval.top_p=0.95", "eval.temperature=0.6"])
    evaluation.evaluate_as_configured(None, None, [], "math", cfg)
    assert (seen["top_p"], seen["temperature"]) == (0.95, 0.6)


def test_eval_reports_sc_at_k_when_asked_and_a_run_evaluates_it_from_its_config(
    monkeypatch, tmp_path
):
    """`rlvr eval --self-certainty` adds sc@k beside maj@k (and only then); `eval.self_certainty`
    reaches the in-training evaluation."""
    import rlvr.evaluation.evaluate as evaluation
    from rlvr.config import resolve_config

    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", "tiny", "--samples", "3", "--k", "2", "--max-new-tokens", "4"]
    for flag in ([], ["--self-certainty"]):
        result = runner.invoke(app, [*args, *flag, "--output", str(out)])
        assert result.exit_code == 0, result.output
    plain, certain = [json.loads(line) for line in out.read_text().splitlines()]
    assert "sc@2" not in plain and 0.0 <= certain["sc@2"] <= certain["pass@2"]
    assert {k: v for k, v in certain.items() if k not in ("sc@2", "seconds")} == {
        k: v for k, v in plain.items() if k != "seconds"
    }
    seen = {}
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **settings: seen.update(settings))
    cfg = resolve_config(overrides=["eval.self_certainty=true"])
    evaluation.evaluate_as_configured(None, None, [], "math", cfg)
    assert seen["self_certainty"] is True
