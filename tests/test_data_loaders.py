"""Local dataset files and the GSM8K / MATH mappings, all offline (the hub is never contacted)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.config import ConfigError, DataConfig, RLConfig, data_config, save_config
from rlvr.config_offline import DPOConfig, SFTConfig
from rlvr.data import loaders
from rlvr.data.loaders import (
    DatasetError,
    gsm8k_problem,
    load_file,
    load_gsm8k,
    load_hub,
    load_math,
    math_problem,
)
from rlvr.data.problem import Problem
from rlvr.data.tasks import eval_settings, held_out_note, load_eval_task, load_task, trained_on

ROWS = [
    {"q": "What is 2+3?", "gold": "5", "source": "toy", "difficulty": 1},
    {"q": "What is 7*6?", "gold": "42", "source": "toy", "difficulty": 2},
]

# Two rows in the shape of openai/gsm8k (the first is its real first training row).
GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 250 pens a day. How many pens does it sell in 4 days?",
        "answer": "It sells 250*4 = <<250*4=1000>>1000 pens.\n#### 1,000",
    },
]

MATH_ROW = {
    "problem": "What is $\\frac{2}{4}$ in lowest terms?",
    "level": "Level 1",
    "type": "Prealgebra",
    "solution": "Divide by $2$: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$.",
}


def write_jsonl(path: Path, rows: list[dict], blank_lines: bool = False) -> Path:
    lines = [json.dumps(row) for row in rows]
    sep = "\n\n  \n" if blank_lines else "\n"
    path.write_text(sep.join(lines) + "\n", encoding="utf-8")
    return path


def check_toy_problems(problems: list) -> None:
    assert [p.question for p in problems] == ["What is 2+3?", "What is 7*6?"]
    assert [p.answer for p in problems] == ["5", "42"]
    assert problems[1].columns == {"source": "toy", "difficulty": 2}
    assert all(p.solution is None for p in problems)


def test_jsonl_round_trip_with_custom_columns_and_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS, blank_lines=True)
    check_toy_problems(load_file(path, prompt_column="q", answer_column="gold"))


def test_parquet_round_trip(tmp_path):
    path = tmp_path / "toy.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    check_toy_problems(load_file(str(path), prompt_column="q", answer_column="gold"))


def test_json_list_and_json_lines_saved_as_json(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    check_toy_problems(load_file(path, prompt_column="q", answer_column="gold"))
    write_jsonl(path, ROWS)  # JSON Lines under a .json name, as `datasets` also accepts
    check_toy_problems(load_file(path, prompt_column="q", answer_column="gold"))


def test_trl_s_conversational_prompt_completion_rows_give_the_reply_as_solution(tmp_path):
    asked = [{"role": "user", "content": "1+1?"}]
    rows = [{"prompt": asked, "completion": [{"role": "assistant", "content": "It is 2."}]}]
    path = write_jsonl(tmp_path / "pc.jsonl", rows)
    [problem] = load_file(path, answer_column=None, solution_column="completion")
    assert (problem.question, problem.messages, problem.solution) == (
        "1+1?",
        tuple(asked),
        "It is 2.",
    )
    for reply, error in [
        ([{"role": "user", "content": "2"}], "a conversational response must be one assistant"),
        ([{"role": "assistant", "content": " "}], "the assistant message is empty"),
    ]:
        write_jsonl(path, [{"prompt": asked, "completion": reply}])
        with pytest.raises(DatasetError, match=f"pc.jsonl, row 1 .*'completion': {error}"):
            load_file(path, answer_column=None, solution_column="completion")


def test_a_json_file_of_one_object_is_one_row_whatever_its_layout(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(ROWS[0], indent=2), encoding="utf-8")  # not JSON Lines
    problems = load_file(path, prompt_column="q", answer_column="gold")
    assert [(p.prompt, p.answer) for p in problems] == [(ROWS[0]["q"], str(ROWS[0]["gold"]))]


@pytest.mark.parametrize("indent", [None, 2])
def test_rows_nested_in_one_json_object_are_named_with_the_remedy(tmp_path, indent):
    path = tmp_path / "squad.json"
    nested = {"version": 1, "data": [{"question": "1+1", "answer": "2"}] * 3}
    path.write_text(json.dumps(nested, indent=indent), encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_file(path)
    assert str(info.value) == (
        f"{path}, row 1: missing column 'prompt'; this row has columns ['version', 'data']; "
        "its 'data' is a list of 3 objects: rows nested in one JSON object are not read, "
        "write them as the file (a JSON list, or JSON Lines)"
    )


def test_a_conversation_is_not_taken_for_nested_rows(tmp_path):
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    with pytest.raises(DatasetError, match="TRL's conversational rows"):
        load_file(path)


def test_solution_column_is_taken_out_of_columns(tmp_path):
    rows = [
        {"prompt": "1+1?", "answer": "2", "worked": "1+1=2", "id": 0},
        {"prompt": "2+2?", "answer": "4", "worked": None, "id": 1},
    ]
    problems = load_file(write_jsonl(tmp_path / "s.jsonl", rows), solution_column="worked")
    assert [p.solution for p in problems] == ["1+1=2", None]
    assert problems[0].columns == {"id": 0}
    with pytest.raises(DatasetError, match=r"row 1 \(line 1\): missing column 'steps'"):
        load_file(tmp_path / "s.jsonl", solution_column="steps")


def test_numeric_answers_become_strings(tmp_path):
    rows = [
        {"prompt": "a", "answer": 42},
        {"prompt": "b", "answer": 42.0},
        {"prompt": "c", "answer": 2.5},
        {"prompt": "d", "answer": -7},
    ]
    problems = load_file(write_jsonl(tmp_path / "n.jsonl", rows))
    assert [p.answer for p in problems] == ["42", "42", "2.5", "-7"]
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "answer": pa.array([42.0], pa.float64())}), path)
    assert load_file(path)[0].answer == "42"


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with pytest.raises(DatasetError, match="malformed JSON") as info:
        load_file(path)
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_missing_answer_column_names_file_row_and_column(tmp_path):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "notes": "x", "level": 3}]
    path = write_jsonl(tmp_path / "missing.jsonl", rows)
    with pytest.raises(DatasetError) as info:
        load_file(path)
    message = str(info.value)
    assert str(path) in message and "row 2 (line 2)" in message
    assert "missing column 'answer'" in message
    assert "['prompt', 'notes', 'level']" in message  # the columns the row does have
    assert message.endswith(
        "set data.answer_column to the one that holds it, or to null if the rows have no gold "
        "answer (SFT data, a reward model)"
    )


@pytest.mark.parametrize(
    ("row", "hint"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": "1+1"},
                    {"role": "assistant", "content": "2"},
                ]
            },
            "these are TRL's conversational rows: data.prompt_column=messages (data.answer_column"
            "=null if they hold no gold answer)",
        ),
        (
            {"prompt": "1+1", "completion": "2"},
            "these are TRL's prompt-completion rows: data.solution_column=completion "
            "(data.answer_column=null if they hold no gold answer)",
        ),
        (
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": "1+1"}],
                "reward_model": {"style": "rule", "ground_truth": "2"},
            },
            "these are verl's rows: data.answer_column=reward_model.ground_truth",
        ),
        (
            {"prompt": [{"role": "user", "content": "1+1"}], "solution": "2"},
            "TRL's math datasets keep the gold answer in 'solution' (what its accuracy_reward "
            "reads): data.answer_column=solution",
        ),
        (
            {"text": "1+1=2"},
            "'text' rows (TRL's language-modelling format) hold no prompt to answer: rlvr "
            "trains on prompts, with their worked solutions for SFT (TRL's prompt-completion "
            "or messages rows)",
        ),
        (
            {"prompt": "1+1", "reward_model": 3},
            "set data.answer_column to the one that holds it, or to null if the rows have no "
            "gold answer (SFT data, a reward model)",
        ),
    ],
)
def test_trl_and_verl_rows_are_answered_with_the_settings_that_read_them(tmp_path, row, hint):
    with pytest.raises(DatasetError) as info:
        load_file(write_jsonl(tmp_path / "sft.jsonl", [row]))
    assert str(info.value).endswith(f"this row has columns {list(row)}; {hint}")


def test_verl_rows_given_as_a_built_in_task_are_answered_with_data_task_file():
    row = {"prompt": [{"role": "user", "content": "1+1"}], "reward_model": {"ground_truth": "2"}}
    with pytest.raises(DatasetError) as info:
        gsm8k_problem(row)  # verl's preprocessed GSM8K under data.task=gsm8k
    assert str(info.value).endswith(
        "these are verl's rows: data.task=file data.answer_column=reward_model.ground_truth"
    )


def test_missing_column_in_parquet_names_row(tmp_path):
    path = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    with pytest.raises(DatasetError, match=r"q\.parquet, row 1: missing column 'prompt'"):
        load_file(path)


@pytest.mark.parametrize(
    ("value", "described"),
    [(None, "null"), ("   ", "an empty string"), ({"text": "x"}, "a dict"), (True, "a bool")],
)
def test_unusable_prompt_values_are_errors(tmp_path, value, described):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": value, "answer": "1"}])
    with pytest.raises(DatasetError) as info:
        load_file(path)
    message = str(info.value)
    assert str(path) in message and "row 1" in message
    assert f"column 'prompt' is {described}" in message


def test_row_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text('[{"prompt": "a", "answer": "1"}, "oops"]')
    with pytest.raises(DatasetError, match=r"list\.json, row 2: expected an object, got str"):
        load_file(path)


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl", "empty.json", "empty.parquet"])
def test_empty_files_are_errors(tmp_path, name):
    path = tmp_path / name
    if name == "blank.jsonl":
        path.write_text("\n  \n\n")
    elif name == "empty.json":
        path.write_text("[]")
    elif name == "empty.parquet":
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    else:
        path.write_text("")
    with pytest.raises(DatasetError, match="has no rows") as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_unsupported_extension_lists_supported_ones(tmp_path):
    path = tmp_path / "data.xlsx"
    path.write_text("prompt,answer\na,1\n")
    with pytest.raises(DatasetError, match=r"unsupported file type '\.xlsx'.*\.jsonl.*\.csv"):
        load_file(path)


def test_csv_and_tsv_rows_are_read_as_text(tmp_path):
    """Every value is a string, numbers too (a prompt or response "12" is text); a quoted
    value keeps its comma and line break, and an empty field is None."""
    csv_path = tmp_path / "toy.csv"
    csv_path.write_text(
        'q,gold,source,difficulty\nWhat is 2+3?,5,toy,1\n\n"What is 7*6?",42,"toy",2\n',
        encoding="utf-8",
    )
    problems = load_file(csv_path, prompt_column="q", answer_column="gold")
    assert [(p.question, p.answer) for p in problems] == [
        ("What is 2+3?", "5"),
        ("What is 7*6?", "42"),
    ]
    assert problems[1].columns == {"source": "toy", "difficulty": "2"}
    tsv_path = tmp_path / "toy.tsv"
    tsv_path.write_text('prompt\tanswer\tnote\n"Add 1,000 and\n2"\t1002\t\n12\t12\tx\n')
    rows = loaders.read_rows(tsv_path)
    assert rows == [
        ("row 1 (line 2)", {"prompt": "Add 1,000 and\n2", "answer": "1002", "note": None}),
        ("row 2 (line 4)", {"prompt": "12", "answer": "12", "note": "x"}),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt,answer\nWhat is 1+1?,2,extra\n", r"row 1 \(line 2\): 3 fields, the header has 2"),
        ("prompt,answer\nWhat is 1+1?\n", r"row 1 \(line 2\): 1 fields, the header has 2"),
        ("\n\n", "no header row"),
        (",\n1,2\n", "no header row"),
        ("prompt,prompt\na,b\n", r"line 1: the header names \['prompt'\] more than once"),
        ("prompt,answer\n", "the file has no rows"),
        ("prompt,answer\nWhat is 1+1?,\n", r"row 1 \(line 2\).*'answer'"),
        ('prompt,answer\n"What is 1+1?"x",2\n', r"line 2: malformed CSV \(',' expected"),
        ('prompt,answer\n"What is 1+1?,2\n', "malformed CSV"),
        (
            "prompt;answer\nWhat is 1+1?;2\n",
            r"line 1: the header 'prompt;answer' is one column, split by ';'",
        ),
        (
            "prompt\tanswer\nWhat is 1+1?\t2\n",
            r"is one column, split by '\\t'.*save it as one of them",
        ),
    ],
)
def test_a_bad_csv_names_the_file_and_the_row(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DatasetError, match=message) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(DatasetError, match="no such file") as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_gsm8k_mapping_on_real_rows():
    natalia = gsm8k_problem(GSM8K_ROWS[0])
    assert natalia.question.startswith("Natalia sold clips to 48 of her friends")
    assert natalia.answer == "72"
    assert natalia.solution == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
        "The answer is 72."
    )
    assert "<<" not in natalia.solution and natalia.columns == {}
    pens = gsm8k_problem(GSM8K_ROWS[1])
    assert pens.answer == "1000"
    assert pens.solution == "It sells 250*4 = 1000 pens.\nThe answer is 1000."


def test_gsm8k_mapping_without_marker_is_an_error():
    with pytest.raises(DatasetError, match="no '####'"):
        gsm8k_problem({"question": "q", "answer": "just 5"})
    with pytest.raises(DatasetError, match="missing column 'question'") as info:
        gsm8k_problem({"answer": "#### 5"})
    assert "set data." not in str(info.value)  # GSM8K's columns are fixed, no key chooses them


def test_math_mapping_keeps_nested_braces_and_metadata():
    problem = math_problem(MATH_ROW)
    assert problem.question == MATH_ROW["problem"]
    assert problem.answer == "\\frac{1}{2}"
    assert problem.solution == MATH_ROW["solution"]
    assert problem.columns == {"level": "Level 1", "type": "Prealgebra"}
    row = {**MATH_ROW, "solution": "First $\\boxed{3}$, then $\\boxed{\\sqrt{x^{2}}}$."}
    assert math_problem(row).answer == "\\sqrt{x^{2}}"  # the last box wins


def test_math_mapping_without_box_is_an_error():
    with pytest.raises(DatasetError, match="no \\\\boxed"):
        math_problem({**MATH_ROW, "solution": "The answer is one half."})


def test_load_gsm8k_and_math_from_local_files(tmp_path):
    problems = load_gsm8k(split="train", path=str(write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS)))
    assert [p.answer for p in problems] == ["72", "1000"]
    math_path = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist([MATH_ROW]), math_path)
    assert load_math(split="test", path=str(math_path))[0].answer == "\\frac{1}{2}"


def test_bad_gsm8k_row_in_local_file_names_file_and_row(tmp_path):
    rows = [GSM8K_ROWS[0], {"question": "q", "answer": "no marker"}]
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 2 \(line 2\): GSM8K answer has no"):
        load_gsm8k(path=str(path))


def test_load_task_gsm8k_from_a_local_path(tmp_path):
    rows = [{**row, "question": f"{row['question']} ({i})"} for i in range(3) for row in GSM8K_ROWS]
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    task = load_task(DataConfig(task="gsm8k", path=str(path), test_size=2))
    assert (len(task.train), len(task.test), task.reward) == (4, 2, "math")


def test_held_out_problems_that_are_also_training_problems_are_warned_of(tmp_path):
    """Duplicate rows split across the hold-out, or a test file overlapping the training
    file: held out in name only. Distinct problems pass without a word."""
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in (0, 1, 2, 0, 1)]
    path = write_jsonl(tmp_path / "dup.jsonl", rows)
    with pytest.warns(UserWarning) as caught:
        load_task(DataConfig(task="file", path=str(path), test_size=3))
    assert caught[0].filename == __file__  # the line that called load_task
    assert str(caught[0].message) == (
        f"{path}: 2 of the 3 held-out problems have the prompt of a training problem, so "
        "held-out accuracy partly measures recall; drop the duplicates (rlvr curate does) or "
        "give data.test_path"
    )
    test = write_jsonl(
        tmp_path / "test.jsonl", [*rows[:1], {"prompt": "What is 9+1?", "answer": "10"}]
    )
    with pytest.warns(
        UserWarning, match=r"test\.jsonl: 1 of the 2 held-out .*; drop them from one of the files$"
    ):
        load_task(DataConfig(task="file", path=str(path), test_path=str(test)))
    distinct = write_jsonl(tmp_path / "distinct.jsonl", rows[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_task(DataConfig(task="file", path=str(distinct), test_size=1))


@pytest.mark.parametrize(("test_size", "split"), [(0, (6, 0)), (1, (5, 1)), (5, (1, 5))])
def test_a_file_task_holds_back_its_last_test_size_rows(tmp_path, test_size, split):
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(6)]
    path = write_jsonl(tmp_path / "six.jsonl", rows)
    task = load_task(DataConfig(task="file", path=str(path), test_size=test_size))
    assert (len(task.train), len(task.test)) == split
    assert [p.answer for p in task.train + task.test] == [str(i + 1) for i in range(6)]


def test_rows_held_out_of_the_training_file_are_announced(tmp_path):
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(6)]
    path = str(write_jsonl(tmp_path / "six.jsonl", rows))

    def note(**settings):
        cfg = DataConfig(task="file", path=path, **settings)
        return held_out_note(cfg, load_task(cfg))

    assert note(test_size=2) == (
        "data.path: training on 4 rows; the last 2 are held out for evaluation "
        "(data.test_size=2; 0 trains on every row)"
    )
    assert note(test_size=0) is None  # every row trained on
    other = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "What is 9+9?", "answer": "18"}])
    assert note(test_size=2, test_path=str(other)) is None  # held out from another file
    synthetic = DataConfig(train_size=10, test_size=5)
    assert held_out_note(synthetic, load_task(synthetic)) is None


def test_unreachable_hub_tells_the_user_to_pass_a_local_file(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DatasetError) as info:
        load_gsm8k(split="train")
    message = str(info.value)
    assert "'openai/gsm8k'" in message and "unreachable" in message and "data.path" in message
    assert isinstance(info.value.__cause__, ConnectionError)


def test_load_hub_passes_arguments_and_names_a_bad_row(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, *, data_files=None, split=None):
        calls.append((name, config, data_files, split))
        return [GSM8K_ROWS[0], {"question": "q", "answer": "no marker"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(DatasetError, match=r"openai/gsm8k \(split 'test'\), row index 1: GSM8K"):
        load_gsm8k(split="test")
    assert calls == [(loaders.GSM8K_HUB, "main", None, "test")]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [MATH_ROW])
    assert load_math(split="train")[0].columns == {"level": "Level 1", "type": "Prealgebra"}


def test_load_hub_with_local_data_files_through_datasets(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    path = write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS)  # the packaged `json` builder: offline
    problems = load_hub("json", "train", mapping=gsm8k_problem, data_files=str(path))
    assert [p.answer for p in problems] == ["72", "1000"]


def test_trained_on_reads_the_task_of_the_run_that_saved_a_model(tmp_path):
    rl = tmp_path / "rl"
    (rl / "checkpoints" / "step-3").mkdir(parents=True)
    save_config(
        RLConfig.model_validate(
            {"data": {"max_digits": 1, "test_size": 40}, "eval": {"max_new_tokens": 12}}
        ),
        rl / "config.yaml",
    )
    run = trained_on(rl / "checkpoints" / "step-3")  # two folders up
    assert run.config == rl / "config.yaml" and run.max_new_tokens == 12
    assert run.data["max_digits"] == 1 and run.data["test_size"] == 40
    adapter = rl / "checkpoints" / "step-3" / "adapter"  # a LoRA checkpoint's adapter alone
    assert trained_on(adapter).config == rl / "config.yaml"
    save_config(RLConfig(), rl / "config.yaml")
    assert trained_on(rl / "checkpoints" / "step-3").max_new_tokens == 64  # rollout's budget

    sft, dpo = tmp_path / "sft", tmp_path / "dpo"
    sft.mkdir(), dpo.mkdir()
    save_config(SFTConfig.model_validate({"data": {"task": "countdown"}}), sft / "config.yaml")
    assert trained_on(sft).data["task"] == "countdown" and trained_on(sft).max_new_tokens is None
    save_config(DPOConfig.model_validate({"data": {"task": "countdown"}}), dpo / "config.yaml")
    assert "chosen_column" not in trained_on(dpo).data  # DataConfig has no such key
    assert trained_on(dpo / "adapter").config == dpo / "config.yaml"
    save_config(DPOConfig.model_validate({"data": {"task": "file"}}), dpo / "config.yaml")
    assert trained_on(dpo) is None  # a pair file holds no problems to evaluate
    assert trained_on(tmp_path / "elsewhere") is None and trained_on("tiny") is None

    (sft / "config.yaml").write_text("data: [unclosed\n")
    with pytest.raises(
        ConfigError, match=r"sft/config\.yaml, line 2, column 1: invalid YAML \(while"
    ):
        trained_on(sft)
    (sft / "config.yaml").write_text("model: {}\n")
    with pytest.raises(ConfigError, match=r"sft/config\.yaml: no `data` section"):
        trained_on(sft)


def test_eval_settings_take_the_runs_task_unless_told_otherwise(tmp_path):
    save_config(
        RLConfig.model_validate({"data": {"max_digits": 1, "template": "r1"}}),
        tmp_path / "config.yaml",
    )
    same = {"template": None, "data_path": None, "samples": 7, "overrides": []}
    data, run = eval_settings(str(tmp_path), task=None, **same)
    assert run is not None and (data.max_digits, data.template, data.test_size) == (1, "r1", 500)
    data, run = eval_settings(str(tmp_path), task="countdown", **same)
    assert run is None and (data.task, data.max_digits, data.test_size) == ("countdown", 3, 7)
    data, _ = eval_settings(
        str(tmp_path), task="arithmetic", template="none", data_path=None, samples=7,
        overrides=["data.max_digits=2"],
    )  # fmt: skip
    assert (data.max_digits, data.template) == (2, "none")
    saved = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(saved.replace("  seed: 1234", "  seeed: 1234"))
    with pytest.raises(ConfigError, match=r"config\.yaml: its data settings do not fit .*seeed"):
        eval_settings(str(tmp_path), task=None, **same)  # an older rlvr's keys, say


def test_a_folder_of_shards_reads_every_file_in_name_order(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[1:]), shards / "part-1.parquet")
    write_jsonl(shards / "part-0.jsonl", ROWS[:1])
    (shards / "README.md").write_text("not data\n")  # other files are not read
    problems = load_file(shards, prompt_column="q", answer_column="gold")
    assert [(p.question, p.answer) for p in problems] == [
        ("What is 2+3?", "5"),
        ("What is 7*6?", "42"),
    ]
    write_jsonl(shards / "part-2.jsonl", [{"q": "What is 1+1?"}])
    with pytest.raises(
        DatasetError, match=r"shards, part-2\.jsonl row 1 \(line 1\): missing column 'gold'"
    ):
        load_file(shards, prompt_column="q", answer_column="gold")
    (shards / "part-2.jsonl").write_text("")
    with pytest.raises(DatasetError, match=r"part-2\.jsonl: the file has no rows"):
        load_file(shards, prompt_column="q", answer_column="gold")


def test_a_save_to_disk_folder_is_read_as_its_rows(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    problems = load_file(tmp_path / "saved", prompt_column="q", answer_column="gold")
    assert [(p.answer, p.columns["source"]) for p in problems] == [("5", "toy"), ("42", "toy")]
    both = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    both["test"] = datasets.Dataset.from_list(ROWS[:1])
    both.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DatasetError, match=r"DatasetDict .*splits \['test', 'train'\].*dict/test"):
        load_file(tmp_path / "dict")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DatasetError, match=r"nothing: a folder with no \.jsonl/"):
        load_file(tmp_path / "nothing")


def test_a_verl_data_file_loads_with_a_dotted_answer_column(tmp_path):
    """verl's preprocessed parquet: the prompt as chat messages, the answer nested in
    `reward_model.ground_truth` (a struct column)."""
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "What is 2+3? Put the answer after ####."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "5"},
            "extra_info": {"index": 0, "split": "train"},
        },
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "What is 7*6?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "42"},
            "extra_info": {"index": 1, "split": "train"},
        },
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    problems = load_file(path, answer_column="reward_model.ground_truth")
    assert [p.answer for p in problems] == ["5", "42"]
    assert problems[1].messages == ({"role": "user", "content": "What is 7*6?"},)
    assert problems[0].columns["ability"] == "math"  # the other columns reach the rewards
    with pytest.raises(DatasetError, match=r"row 1: missing column 'reward_model\.truth'"):
        load_file(path, answer_column="reward_model.truth")
    nested = [{"q": {"messages": row["prompt"]}, "a": {"gold": "5", "steps": None}} for row in rows]
    path = write_jsonl(tmp_path / "nested.jsonl", nested)
    by_path = load_file(path, prompt_column="q.messages", answer_column="a.gold",
                        solution_column="a.steps")  # fmt: skip
    assert by_path[0].messages == tuple(rows[0]["prompt"]) and by_path[0].solution is None


def test_a_list_of_files_reads_them_one_after_another(tmp_path):
    """verl's data.train_files=[a.parquet,b.jsonl]: data.path takes a list (here as a
    command-line override) and reads its entries in the order given."""
    pq.write_table(pa.Table.from_pylist(ROWS[1:]), tmp_path / "b.parquet")
    write_jsonl(tmp_path / "a.jsonl", ROWS[:1])
    listed = f"data.path=[{tmp_path / 'b.parquet'},{tmp_path / 'a.jsonl'}]"
    base = {"task": "file", "prompt_column": "q", "answer_column": "gold", "test_size": 1}
    task = load_task(data_config(base, [listed]))
    assert ([p.answer for p in task.train], [p.answer for p in task.test]) == (["42"], ["5"])
    write_jsonl(tmp_path / "c.jsonl", [*ROWS, {"q": "What is 1+1?"}])
    with pytest.raises(
        DatasetError, match=r"^\S+/c\.jsonl row 3 \(line 3\): missing column 'gold'"
    ):
        load_file(
            [tmp_path / "a.jsonl", tmp_path / "c.jsonl"], prompt_column="q", answer_column="gold"
        )
    with pytest.raises(ConfigError, match=r"has 2 rows, not more than data.test_size=2") as caught:
        load_task(data_config({**base, "test_size": 2}, [listed]))
    assert "b.parquet + " in str(caught.value)
    with pytest.raises(ConfigError, match=r"data.path.*an empty list names no file"):
        data_config(base, ["data.path=[]"])
    with pytest.raises(DatasetError, match="an empty list of dataset files"):
        load_file([])


def test_a_bad_row_of_a_save_to_disk_folder_is_named_from_one(tmp_path):
    import datasets

    rows = [{"q": "What is 2+3?", "gold": "5"}, {"q": "What is 6*7?", "gold": None}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DatasetError, match=r"saved, row 2: "):
        load_file(tmp_path / "saved", prompt_column="q", answer_column="gold")


def test_blank_lines_count_for_the_line_but_not_the_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "What is 2+3?", "gold": "5"}\n\n{"q": "What is 1+1?"}\n')
    with pytest.raises(DatasetError, match=r"row 2 \(line 3\): missing column 'gold'"):
        load_file(path, prompt_column="q", answer_column="gold")


def test_a_hub_test_split_is_cut_to_test_size(monkeypatch):
    split_problems = {
        split: [Problem(f"{split} q{i}", "1") for i in range(10)] for split in ("train", "test")
    }
    monkeypatch.setattr(loaders, "load_gsm8k", lambda split, path: split_problems[split])
    task = load_task(DataConfig(task="gsm8k", test_size=3))
    assert [p.question for p in task.test] == ["test q0", "test q1", "test q2"]
    assert len(task.train) == 10


def test_a_hub_task_holds_out_from_its_own_file_unless_given_a_test_file(monkeypatch):
    """data.path alone: the last test_size rows of the file; with data.test_path, that file's
    test split; a file too short to hold out is named in the error."""

    def load(split: str, path: str | None) -> list[Problem]:
        return [Problem(f"{split} of {path}: q{i}", "1") for i in range(4)]

    monkeypatch.setattr(loaders, "load_gsm8k", load)
    own = load_task(DataConfig(task="gsm8k", path="a.jsonl", test_size=1))
    assert [p.question for p in own.test] == ["train of a.jsonl: q3"]
    assert len(own.train) == 3
    given = load_task(DataConfig(task="gsm8k", path="a.jsonl", test_path="b.jsonl", test_size=1))
    assert [p.question for p in given.test] == ["test of b.jsonl: q0"]
    assert len(given.train) == 4
    with pytest.raises(ConfigError, match=r"^a\.jsonl has 4 rows, not more than data\.test_size=4"):
        load_task(DataConfig(task="gsm8k", path="a.jsonl", test_size=4))


def test_eval_reads_every_row_of_a_test_file_with_the_task_s_reader(tmp_path):
    """`load_eval_task` with data.test_path: all its rows, read as a `file`, GSM8K or MATH
    row, and no training problems."""
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)]
    plain = write_jsonl(tmp_path / "f.jsonl", rows)
    task = load_eval_task(DataConfig(task="file", test_path=str(plain)))
    assert ([p.answer for p in task.test], task.train, task.reward) == (["1", "2", "3"], [], "math")
    gsm8k = write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS)
    task = load_eval_task(DataConfig(task="gsm8k", test_path=str(gsm8k)))
    assert [p.answer for p in task.test] == ["72", "1000"]
    math_path = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist([MATH_ROW]), math_path)
    (problem,) = load_eval_task(DataConfig(task="math", test_path=str(math_path))).test
    assert problem.answer == "\\frac{1}{2}"


def test_errors_quote_a_bounded_excerpt_of_a_long_bad_value(tmp_path):
    """A bad value is quoted, cut to a fixed length so a long one fits on a line: the last 80
    characters of a GSM8K answer or MATH solution, the first 60 of a message that is not an
    object, the first 40 of a bad content or an unusable prompt value."""
    long = "".join(str(i % 10) for i in range(100))
    for row, excerpt, problem in (
        (
            {"question": "q", "answer": long},
            "GSM8K answer has no '####' final-answer marker",
            gsm8k_problem,
        ),
        (
            {"question": "q", "answer": long + "####  "},
            "GSM8K answer is empty after '####'",
            gsm8k_problem,
        ),
        (
            {"problem": "q", "solution": long},
            "MATH solution has no \\boxed{...} answer",
            math_problem,
        ),
    ):
        with pytest.raises(DatasetError) as caught:
            problem(row)
        assert str(caught.value) == f"{excerpt}: {(row.get('answer') or row['solution'])[-80:]!r}"
    not_object = [long, {"role": "user", "content": "hi"}]
    with pytest.raises(DatasetError) as caught:
        loaders.parse_messages(not_object, "prompt")
    assert str(caught.value).endswith(f"got {long[:60]!r}")
    bad_content = [{"role": "user", "content": [long]}]
    with pytest.raises(DatasetError) as caught:
        loaders.parse_messages(bad_content, "prompt")
    assert str(caught.value).endswith(f"and content {str([long])[:40]!r}")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": {"text": long}, "answer": "1"}])
    with pytest.raises(DatasetError) as caught:
        load_file(path)
    assert f"column 'prompt' is a dict ({str({'text': long})[:40]!r})" in str(caught.value)


def test_a_file_that_cannot_be_read_names_the_reason(tmp_path):
    not_a_file = tmp_path / "shard.jsonl"
    not_a_file.mkdir()
    with pytest.raises(DatasetError) as caught:
        loaders._read_text(not_a_file)
    assert str(caught.value) == f"{not_a_file}: cannot read file (Is a directory)"
