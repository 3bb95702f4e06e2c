"""`rlvr curate`: duplicates dropped, pass rates measured by the verifier, the band applied, and
a data file that `data.task=file` reads back."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError, DataConfig, resolve_config
from rlvr.config_offline import CurateConfig
from rlvr.data import curation
from rlvr.data.curation import drop_duplicates, normalized_question, run_curate
from rlvr.data.problem import Problem
from rlvr.data.tasks import Task, load_task

SMALL_MODEL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
]


def first_digit_even(prompts, completions, **columns):
    """1 when the question's first number starts with an even digit: each problem's pass rate
    is exactly 0 or 1, whatever the model writes."""
    return [float(int(re.search(r"What is (\d)", p).group(1)) % 2 == 0) for p in prompts]


def even_length(prompts, completions, **columns):
    """1 for a completion of even length: pass rates spread between 0 and 1."""
    return [float(len(c) % 2 == 0) for c in completions]


def test_duplicates_by_hand():
    assert normalized_question("  What is\n2+3? ") == "what is 2+3?"
    problems = [Problem(q, "5") for q in ("What is 2+3?", "what  is 2+3?", "What is 3+2?")]
    assert [p.question for p in drop_duplicates(problems)] == ["What is 2+3?", "What is 3+2?"]


def curated(tmp_path, monkeypatch, reward, *overrides):
    problems = [
        Problem(f"What is {a}+{b}?", str(a + b), solution=f"<answer>{a + b}</answer>")
        for a, b in ((2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2), (8, 3), (9, 3))
    ]
    problems += [Problem("what is 2+1?", "3"), Problem("What  is 3+1?", "4")]  # duplicates
    task = Task("toy", problems, [], f"test_curation:{reward}")
    monkeypatch.setattr(curation, "load_task", lambda data: task)
    out = tmp_path / "curated.jsonl"
    cfg = resolve_config(
        None,
        None,
        [*SMALL_MODEL, f"curate.output={out}", "curate.max_new_tokens=5", *overrides],
        model=CurateConfig,
    )
    return run_curate(cfg), out


def test_the_band_keeps_what_the_verifier_says(tmp_path, monkeypatch):
    summary, out = curated(
        tmp_path,
        monkeypatch,
        "first_digit_even",
        "curate.min_pass_rate=1",
        "curate.max_pass_rate=1",
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [
        "What is 2+1?",
        "What is 4+1?",
        "What is 6+2?",
        "What is 8+3?",
    ]
    assert rows[0] == {
        "prompt": "What is 2+1?",
        "answer": "3",
        "solution": "<answer>3</answer>",
        "pass_rate": 1.0,
    }
    assert (summary.problems, summary.duplicates, summary.too_hard, summary.too_easy) == (
        10,
        2,
        4,
        0,
    )
    assert summary.kept == 4
    # the file is a data file of task `file`, its measured pass rate an extra column
    task = load_task(DataConfig(task="file", path=str(out), test_size=1))
    assert [p.question for p in task.train] == [r["prompt"] for r in rows[:-1]]
    assert task.train[0].columns == {"solution": "<answer>3</answer>", "pass_rate": 1.0}


def test_pass_rates_are_the_share_of_correct_samples(tmp_path, monkeypatch):
    summary, out = curated(
        tmp_path, monkeypatch, "even_length", "curate.samples_per_prompt=4", "curate.dedup=false"
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.problems == 10 and summary.duplicates == 0
    assert summary.kept + summary.too_hard + summary.too_easy == 10
    assert summary.kept == len(rows) >= 3
    assert all(r["pass_rate"] in (0.25, 0.5, 0.75) for r in rows)


def test_nothing_in_the_band_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    with pytest.raises(
        ConfigError, match=re.escape("no problem had a pass rate in [0.1, 0.9]")
    ) as e:
        curated(tmp_path, monkeypatch, "first_digit_even")
    assert "4 below, 4 above, 2 duplicates" in str(e.value)
    assert not (tmp_path / "curated.jsonl").exists()


def test_an_output_that_cannot_be_written_is_refused_before_sampling(tmp_path, monkeypatch):
    monkeypatch.setattr(curation, "load_task", lambda data: pytest.fail("the task loaded"))
    (tmp_path / "a_file").write_text("kept\n")
    under_a_file = tmp_path / "a_file" / "out.jsonl"
    cfg = resolve_config(None, None, [f"curate.output={under_a_file}"], model=CurateConfig)
    with pytest.raises(ConfigError, match=re.escape(f"'{under_a_file}': cannot make its folder")):
        run_curate(cfg)
    assert (tmp_path / "a_file").read_text() == "kept\n"
    (tmp_path / "a_dir").mkdir()
    cfg = resolve_config(None, None, [f"curate.output={tmp_path / 'a_dir'}"], model=CurateConfig)
    with pytest.raises(ConfigError, match="is a directory; name a JSONL file"):
        run_curate(cfg)


def test_rows_without_gold_answers_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Their pass rates would all read 0 (60 "below" after sampling every one)."""
    monkeypatch.setattr(curation, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("load"))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"prompt": f"{a}+1?"}) + "\n" for a in range(6)))
    data = [f"data.path={questions}", "data.answer_column=null", "data.test_size=0"]
    overrides = ["data.task=file", *data, f"curate.output={tmp_path / 'out.jsonl'}"]
    cfg = resolve_config(None, None, overrides, model=CurateConfig)
    with pytest.raises(ConfigError, match=r"questions\.jsonl: no row has a gold answer .*, and "
                       "pass rates are measured against one"):  # fmt: skip
        run_curate(cfg)
    assert not (tmp_path / "out.jsonl").exists()


def test_band_upside_down_names_both_keys():
    with pytest.raises(
        ConfigError,
        match=re.escape("curate.min_pass_rate (0.8) is above curate.max_pass_rate (0.2)"),
    ):
        resolve_config(
            None, None, ["curate.min_pass_rate=0.8", "curate.max_pass_rate=0.2"], model=CurateConfig
        )


def test_cli_curate_on_a_built_in_task(tmp_path):
    out = tmp_path / "c.jsonl"
    args = ["curate", *SMALL_MODEL, "data.train_size=30", "data.test_size=2", "data.max_digits=1"]
    args += ["curate.max_new_tokens=4", "curate.min_pass_rate=0", "curate.max_pass_rate=0"]
    result = CliRunner().invoke(app, [*args, f"curate.output={out}"])
    assert result.exit_code == 0, result.output
    assert "kept" in result.output
    assert f"wrote {out}; train on it with data.task=file data.path={out}\n" in result.output
    assert len(out.read_text().splitlines()) >= 25  # an untrained model solves (almost) none
    bad = CliRunner().invoke(app, ["curate", "data.task=file"])
    assert bad.exit_code == 2 and "data.path" in bad.output


def test_curation_samples_with_the_tools_rl_will_call(tmp_path, monkeypatch):
    """curate.tools (the same settings as rollout.tools) reach the sampling that measures the
    pass rates."""
    from rlvr.rollout.tools import ToolUse

    seen = []
    original = curation.sample_and_verify

    def recording(*args, **kwargs):
        seen.append(kwargs["tools"])
        return original(*args, **kwargs)

    monkeypatch.setattr(curation, "sample_and_verify", recording)
    curated(
        tmp_path, monkeypatch, "even_length", "curate.tools=[calculator]", "curate.min_pass_rate=0"
    )
    assert seen == [ToolUse(("calculator",), 4, 5.0)]


def test_max_problems_takes_exactly_that_many(tmp_path, monkeypatch):
    problems = [Problem(f"What is {a}+1?", str(a + 1)) for a in range(2, 9)]
    monkeypatch.setattr(curation, "load_task", lambda data: Task("toy", problems, [], "math"))
    overrides = [
        "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1",
        "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64",
        f"curate.output={tmp_path / 'o.jsonl'}",
        "curate.max_new_tokens=2",
        "curate.max_problems=3",
        "curate.min_pass_rate=0",
    ]
    cfg = resolve_config(None, None, overrides, model=CurateConfig)
    assert run_curate(cfg).problems == 3


def test_chat_problems_are_duplicates_only_when_all_messages_match():
    def chat(system):
        messages = (
            {"role": "system", "content": system},
            {"role": "user", "content": "What is 2+3?"},
        )
        return Problem("What is 2+3?", "5", messages=messages)

    assert len(drop_duplicates([chat("Be brief."), chat("Think step by step.")])) == 2
    assert len(drop_duplicates([chat("Be brief."), chat("be  BRIEF.")])) == 1
