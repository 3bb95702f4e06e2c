"""Load problems from local files (JSONL, JSON, Parquet, CSV, TSV) and from the Hugging Face
hub.

Local files (`data.task=file`): one problem per row, extra columns kept in `Problem.columns`
for reward functions. Nothing is skipped silently: a malformed line or a row without a usable
question or answer raises `DatasetError` naming the file and the 1-based row (and JSONL line).

Hub datasets with a known field mapping (`data.task=gsm8k` or `math`):

- GSM8K (`openai/gsm8k`, config `main`): the answer is the text after ``####``, commas
  removed. The worked solution (for cold-start SFT) is the reasoning before ``####`` without
  the ``<<48/2=24>>`` calculator annotations, then a last line ``The answer is 72.``
- MATH (`DigitalLearningGmbH/MATH-lighteval`: the 7,500 / 5,000 train/test split of Hendrycks
  et al. 2021 with `problem`, `solution`, `level`, `type`; the split verl's recipes use): the
  answer is the content of the last ``\\boxed{...}`` of the solution. For MATH-500 use
  ``load_hub("HuggingFaceH4/MATH-500", "test", mapping=math_problem)``.

`data.path` replaces the hub with a local JSONL/JSON/Parquet/CSV file of the same shape, a
folder of such files (shards, read in name order) or a folder `Dataset.save_to_disk` wrote,
or a list of any of these read one after another; it is also the way to train where the hub
cannot be reached.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from rlvr.data.problem import Problem

GSM8K_HUB = "openai/gsm8k"
GSM8K_CONFIG = "main"
MATH_HUB = "DigitalLearningGmbH/MATH-lighteval"
SUPPORTED_EXTENSIONS = (".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".tsv")

_CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")

Row = dict[str, Any]
DataPath = str | Path | list[str] | list[Path]
"""One file or folder, or a list of them (their rows one after another)."""


class DatasetError(ValueError):
    """Data that cannot become problems; the message names the file (or dataset) and row."""


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not valid UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file ({e.strerror or e})") from None


def _parse_json(path: Path, text: str, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {line if line is not None else e.lineno}"
        raise DatasetError(f"{path}, {where}: malformed JSON ({e.msg}, column {e.colno})") from None


def _jsonl_values(path: Path, text: str) -> list[tuple[str, Any]]:
    values: list[tuple[str, Any]] = []
    # split on "\n" only: JSON strings may legally hold U+2028 that splitlines() would cut.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            value = _parse_json(path, line, line_no)
            values.append((f"row {len(values) + 1} (line {line_no})", value))
    return values


def _json_values(path: Path, text: str) -> list[tuple[str, Any]]:
    if text.lstrip().startswith("{"):  # one object (one row), else JSON Lines saved as .json
        try:
            return [("row 1", json.loads(text))]
        except json.JSONDecodeError:
            return _jsonl_values(path, text)
    value = _parse_json(path, text)
    if not isinstance(value, list):
        raise DatasetError(
            f"{path}: expected a JSON list of objects (or JSON Lines), got {type(value).__name__}"
        )
    return [(f"row {index}", item) for index, item in enumerate(value, start=1)]


def _delimited_values(path: Path, text: str, delimiter: str) -> list[tuple[str, Any]]:
    """The rows of a CSV (or TSV) file with a header row, each value a string and an empty
    field None, each row named by the line it starts on; a row with more or fewer fields than
    the header is refused. Unlike pandas, a column of numbers stays text: a prompt, answer or
    response "12" is text."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if not header or not any(name.strip() for name in header):
            raise DatasetError(f"{path}: no header row (the first line names the columns)")
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise DatasetError(f"{path}, line 1: the header names {repeated} more than once")
        other = next((c for c in ";,\t" if c != delimiter and c in header[0]), None)
        if len(header) == 1 and other is not None:
            raise DatasetError(
                f"{path}, line 1: the header {header[0]!r} is one column, split by {other!r}; "
                "rlvr reads a .csv split by ',' and a .tsv split by tabs: save it as one of them"
            )
        rows: list[tuple[str, Any]] = []
        start = reader.line_num + 1  # a quoted line break makes a row span several lines
        for fields in reader:
            where, start = f"row {len(rows) + 1} (line {start})", reader.line_num + 1
            if not fields:
                continue
            if len(fields) != len(header):
                raise DatasetError(
                    f"{path}, {where}: {len(fields)} fields, the header has {len(header)} "
                    f"({header}); quote a value that holds {delimiter!r} or a line break"
                )
            rows.append((where, {name: value or None for name, value in zip(header, fields)}))
    except csv.Error as e:
        raise DatasetError(f"{path}, line {reader.line_num}: malformed CSV ({e})") from None
    return rows


def _parquet_values(path: Path) -> list[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: cannot read Parquet file ({e})") from None
    return [(f"row {index}", row) for index, row in enumerate(table.to_pylist(), start=1)]


def _saved_dataset_rows(path: Path) -> list[tuple[str, Any]]:
    """The rows of a folder that `datasets.Dataset.save_to_disk` wrote."""
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot read the saved dataset ({e})") from None
    if not len(dataset):
        raise DatasetError(f"{path}: the saved dataset has no rows")
    return [(f"row {index}", row) for index, row in enumerate(dataset.to_list(), start=1)]


def _folder_rows(path: Path) -> list[tuple[str, Any]]:
    """The rows of a `save_to_disk` folder, or of the data files in a folder, by file name."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in path.iterdir() if (d / "state.json").is_file())
        raise DatasetError(
            f"{path}: a DatasetDict saved with save_to_disk (splits {splits}); give one split's "
            f"folder, e.g. {path / (splits[0] if splits else 'train')}"
        )
    if (path / "state.json").is_file():
        return _saved_dataset_rows(path)
    shards = sorted(f for f in path.iterdir() if f.suffix.lower() in SUPPORTED_EXTENSIONS)
    if not shards:
        raise DatasetError(
            f"{path}: a folder with no {'/'.join(SUPPORTED_EXTENSIONS)} files and not a "
            "save_to_disk dataset"
        )
    return [(f"{shard.name} {where}", row) for shard in shards for where, row in read_rows(shard)]


def read_rows(path: DataPath) -> list[tuple[str, Row]]:
    """Every row of a local JSONL/JSON/Parquet/CSV/TSV file as ``(location, row)``, in file
    order; or of a folder: one that `datasets.Dataset.save_to_disk` wrote, or of such files
    (shards, read in name order); or of a list of files and folders, one after another.

    `location` names the row in messages (``"row 3 (line 5)"``, in a folder
    ``"part-1.jsonl row 3 (line 5)"``, from a list ``"data/b.jsonl row 3 (line 5)"``). A
    missing, unreadable, empty or unsupported file, malformed JSON or CSV, or a row that is not
    an object raises `DatasetError`.
    """
    if isinstance(path, list):
        if not path:
            raise DatasetError("an empty list of dataset files")
        return [(f"{one} {where}", row) for one in path for where, row in read_rows(one)]
    path = Path(path)
    if path.is_dir():
        return _folder_rows(path)  # each shard read here, a saved dataset's rows all objects
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DatasetError(
            f"{path}: unsupported file type {suffix or '(no extension)'!r}; "
            f"supported: {', '.join(SUPPORTED_EXTENSIONS)}, or a folder of them or that "
            "datasets' save_to_disk wrote"
        )
    if not path.is_file():
        problem = "not a file" if path.exists() else "no such file (dataset file not found)"
        raise DatasetError(f"{path}: {problem}")
    if suffix == ".parquet":
        rows = _parquet_values(path)
    elif suffix == ".json":
        rows = _json_values(path, _read_text(path))
    elif suffix in (".csv", ".tsv"):
        rows = _delimited_values(path, _read_text(path), "," if suffix == ".csv" else "\t")
    else:
        rows = _jsonl_values(path, _read_text(path))
    if not rows:
        raise DatasetError(f"{path}: the file has no rows")
    for where, row in rows:
        if not isinstance(row, dict):
            raise DatasetError(f"{path}, {where}: expected an object, got {type(row).__name__}")
    return rows


def _as_text(value: Any) -> str | None:
    """A non-empty string for a string or a finite number (ints without ``.0``); else None."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, (numbers.Real, Decimal)):  # Decimal: Parquet decimal columns
        number = float(value)
        if not math.isfinite(number):
            return None
        return str(int(number)) if number.is_integer() else repr(number)
    return None


def _describe(value: Any) -> str:
    if value is None or isinstance(value, str):
        return "null" if value is None else "an empty string"
    return f"a {type(value).__name__} ({str(value)[:40]!r})"


def _as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


MESSAGE_KEYS = {"role", "content"}


def _nested_rows(row: Row) -> str | None:
    """The column of `row` that holds a list of several objects, none of them a message: the
    rows of a JSON file that nests them in one object (``{"version": 1, "data": [...]}``)."""
    for name, value in row.items():
        several = isinstance(value, list) and len(value) > 1
        if several and all(isinstance(v, dict) and not set(v) >= MESSAGE_KEYS for v in value):
            return name
    return None


def missing_column(row: Row, column: str, setting: str | None) -> DatasetError:
    """The error for a row without `column`: it lists the row's columns and, when a config
    key chose the name (`data.prompt_column`), says to point that key at one of them."""
    no_answer = "data.answer_column=null if they hold no gold answer"
    nested = _nested_rows(row)
    if nested is not None:
        hint = (
            f"; its {nested!r} is a list of {len(row[nested])} objects: rows nested in one "
            "JSON object are not read, write them as the file (a JSON list, or JSON Lines)"
        )
    elif setting == "data.prompt_column" and "messages" in row:
        hint = f"; these are TRL's conversational rows: data.prompt_column=messages ({no_answer})"
    elif setting == "data.prompt_column" and "text" in row:
        hint = (
            "; 'text' rows (TRL's language-modelling format) hold no prompt to answer: rlvr "
            "trains on prompts, with their worked solutions for SFT (TRL's prompt-completion "
            "or messages rows)"
        )
    elif setting == "data.answer_column" and {"prompt", "completion"} <= set(row):
        hint = "; these are TRL's prompt-completion rows: data.solution_column=completion "
        hint += f"({no_answer})"
    elif setting == "data.answer_column" and "solution" in row:
        hint = (
            "; TRL's math datasets keep the gold answer in 'solution' (what its "
            "accuracy_reward reads): data.answer_column=solution"
        )
    elif setting in ("data.answer_column", None) and "ground_truth" in _as_dict(
        row.get("reward_model")
    ):
        task = "" if setting else "data.task=file "  # a built-in task's own columns
        hint = f"; these are verl's rows: {task}data.answer_column=reward_model.ground_truth"
    elif setting:
        hint = f"; set {setting} to the one that holds it"
        if setting == "data.answer_column":
            hint += ", or to null if the rows have no gold answer (SFT data, a reward model)"
    else:
        hint = ""
    return DatasetError(f"missing column {column!r}; this row has columns {list(row)}{hint}")


def _field(row: Row, column: str) -> tuple[bool, Any]:
    """(found, value) of `column` in `row`. When no column has the name, a dotted one reaches
    into nested objects: `reward_model.ground_truth`, where verl's data files keep the answer."""
    if column in row:
        return True, row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _required_text(row: Row, column: str, setting: str | None = None) -> str:
    """The value of `column` (`_field`) as text, or a `DatasetError` that lists the row's
    columns."""
    found, value = _field(row, column)
    if not found:
        raise missing_column(row, column, setting)
    text = _as_text(value)
    if text is None:
        raise DatasetError(
            f"column {column!r} is {_describe(value)}, expected a non-empty string or "
            f"a number; this row has columns {list(row)}"
        )
    return text


ROLES = ("system", "user", "assistant")


def parse_messages(value: list, column: str) -> tuple[dict[str, str], ...]:
    """A conversational prompt (TRL's format): ``{"role", "content"}`` messages with string
    contents, the last one the user's (see `split_reply` for one that ends with the reply)."""
    messages = []
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and set(message) >= MESSAGE_KEYS):
            raise DatasetError(
                f"column {column!r}, message {i + 1}: expected an object with 'role' and "
                f"'content', got {str(message)[:60]!r}"
            )
        role, content = message["role"], message["content"]
        if role not in ROLES or not isinstance(content, str):
            raise DatasetError(
                f"column {column!r}, message {i + 1}: role must be one of {list(ROLES)} and "
                f"content a string, got role {role!r} and content {str(content)[:40]!r}"
            )
        messages.append({"role": role, "content": content})
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise DatasetError(f"column {column!r}: a conversation must end with a non-empty user turn")
    return tuple(messages)


def split_reply(value: list, column: str) -> tuple[list, str | None]:
    """A conversation that ends with the assistant's turn (TRL's conversational SFT format,
    ``{"messages": [..., {"role": "assistant", ...}]}``) as its prompt and that reply; any
    other as it is, with no reply."""
    last = value[-1] if value else None
    if isinstance(last, dict) and last.get("role") == "assistant" and len(value) > 1:
        reply = last.get("content")
        if not isinstance(reply, str) or not reply.strip():
            raise DatasetError(f"column {column!r}: the closing assistant turn is empty")
        return value[:-1], reply
    return value, None


def assistant_reply(value: list, column: str) -> str:
    """The text of TRL's conversational response: a list of one assistant message,
    ``[{"role": "assistant", "content": "..."}]`` (a completion, or DPO's chosen/rejected)."""
    if not (
        len(value) == 1
        and isinstance(value[0], dict)
        and value[0].get("role") == "assistant"
        and isinstance(value[0].get("content"), str)
    ):
        raise DatasetError(
            f"column {column!r}: a conversational response must be one assistant message, "
            f"got {str(value)[:60]!r}"
        )
    if not value[0]["content"].strip():
        raise DatasetError(f"column {column!r}: the assistant message is empty")
    return value[0]["content"]


def path_label(path: DataPath) -> str:
    """`path` for a message: the file or folder, or a list's entries joined by `` + ``."""
    return " + ".join(map(str, path)) if isinstance(path, list) else str(path)


def located(path: DataPath, where: str) -> str:
    """Where a row of `read_rows(path)` is, for a message: the file and the row (a location
    from a list of files names its file already)."""
    return where if isinstance(path, list) else f"{path}, {where}"


def _map_rows(
    path: DataPath, rows: list[tuple[str, Row]], mapping: Callable[[Row], Problem]
) -> list[Problem]:
    problems = []
    for where, row in rows:
        try:
            problems.append(mapping(row))
        except DatasetError as e:
            raise DatasetError(f"{located(path, where)}: {e}") from None
    return problems


def load_file(
    path: DataPath,
    *,
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    solution_column: str | None = None,
) -> list[Problem]:
    """Problems from a local ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` file
    (or a folder or list of them, as `read_rows` reads).

    Each row needs a non-empty string or number in `prompt_column` and `answer_column`
    (numbers become strings, ``42.0`` -> ``"42"``); with `answer_column` None the rows have
    no gold answer (``""``: SFT data, a reward that needs none). The prompt may instead be a
    conversation, a list of ``{"role", "content"}`` messages ending with the user's turn
    (TRL's conversational format), which `data.template=chat` renders; one that ends with
    the assistant's turn (TRL's conversational SFT rows) gives that turn as the solution.
    `solution_column`, when given, must be present in every row; its value may be null, or
    one assistant message (TRL's conversational prompt-completion rows). All other columns go
    to `Problem.columns`.
    """
    named = (prompt_column, answer_column, solution_column)
    used = {column for column in named if column is not None}

    def mapping(row: Row) -> Problem:
        messages, reply = None, None
        prompt = _field(row, prompt_column)[1]
        if isinstance(prompt, list):
            turns, reply = split_reply(prompt, prompt_column)
            messages = parse_messages(turns, prompt_column)
            question = messages[-1]["content"]
        else:
            question = _required_text(row, prompt_column, "data.prompt_column")
        answer = ""
        if answer_column is not None:
            answer = _required_text(row, answer_column, "data.answer_column").strip()
        solution = reply
        found, value = _field(row, solution_column) if solution_column else (False, None)
        if isinstance(value, list):  # TRL's conversational prompt-completion rows
            solution = assistant_reply(value, solution_column)
        elif solution_column is not None and (found, value) != (True, None):
            # raises when missing or empty
            solution = _required_text(row, solution_column, "data.solution_column")
        columns = {key: value for key, value in row.items() if key not in used}
        return Problem(question, answer, solution, columns, messages)

    return _map_rows(path, read_rows(path), mapping)


def gsm8k_problem(row: Row) -> Problem:
    """A GSM8K row (`question`, `answer` = reasoning then ``#### 72``) as a problem.

    The answer is the text after the last ``####``, commas removed (``1,000`` -> ``1000``).
    The solution is the reasoning with ``<<...>>`` calculator annotations removed, then the
    line ``The answer is 72.``
    """
    question = _required_text(row, "question")
    raw = _required_text(row, "answer")
    reasoning, marker, final = raw.rpartition("####")
    if not marker:
        raise DatasetError(f"GSM8K answer has no '####' final-answer marker: {raw[-80:]!r}")
    answer = final.replace(",", "").strip()
    if not answer:
        raise DatasetError(f"GSM8K answer is empty after '####': {raw[-80:]!r}")
    reasoning = _CALCULATOR_ANNOTATION.sub("", reasoning).strip()
    last_line = f"The answer is {answer}."
    solution = f"{reasoning}\n{last_line}" if reasoning else last_line
    columns = {key: value for key, value in row.items() if key not in ("question", "answer")}
    return Problem(question=question, answer=answer, solution=solution, columns=columns)


def math_problem(row: Row) -> Problem:
    """A MATH row (`problem`, `solution`, `level`, `type`) as a problem.

    The answer is the content of the last ``\\boxed{...}`` in the solution (nested braces
    kept: ``\\frac{1}{2}``); a row without one falls back to a non-empty `answer` field (as
    MATH-500 has). The solution is kept as it is; other fields (`level`, `type`, ...) go to
    `Problem.columns`.
    """
    from rlvr.rewards.extract import last_boxed_content  # written alongside; import lazily

    question = _required_text(row, "problem")
    solution = _required_text(row, "solution")
    answer = last_boxed_content(solution)
    if answer is None or not answer.strip():
        answer = _as_text(row.get("answer"))
    if answer is None:
        raise DatasetError(f"MATH solution has no \\boxed{{...}} answer: {solution[-80:]!r}")
    columns = {k: v for k, v in row.items() if k not in ("problem", "solution", "answer")}
    return Problem(question=question, answer=answer.strip(), solution=solution, columns=columns)


def load_hub(
    name: str,
    split: str,
    *,
    mapping: Callable[[Row], Problem],
    data_files: str | None = None,
    config: str | None = None,
) -> list[Problem]:
    """Load `split` of the hub dataset `name` (optional `config`) and map every row.

    `data_files` is passed to `datasets.load_dataset` (e.g. ``load_hub("json", "train",
    data_files="x.jsonl", mapping=...)``). A failed load or a bad row raises `DatasetError`
    naming the dataset, split and 0-based row index.
    """
    import datasets

    try:
        dataset = datasets.load_dataset(name, config, data_files=data_files, split=split)
    except Exception as e:
        offline = isinstance(e, (ConnectionError, TimeoutError))
        reason = "the Hugging Face hub is unreachable" if offline else "loading failed"
        raise DatasetError(
            f"cannot load dataset {name!r} split {split!r}: {reason} ({type(e).__name__}: {e}). "
            "Without hub access, download it elsewhere and pass the local JSONL/Parquet file "
            "as data.path"
        ) from e
    problems = []
    for index, row in enumerate(dataset):
        try:
            problems.append(mapping(row))
        except DatasetError as e:
            raise DatasetError(f"{name} (split {split!r}), row index {index}: {e}") from None
    if not problems:
        raise DatasetError(f"dataset {name!r} split {split!r} has no rows")
    return problems


def load_gsm8k(split: str = "train", path: DataPath | None = None) -> list[Problem]:
    """GSM8K problems: `openai/gsm8k` (config `main`) from the hub, or a local file at `path`.

    A local file has GSM8K's columns (`question`, `answer` with ``####``) and is the split.
    """
    if path is not None:
        return _map_rows(path, read_rows(path), gsm8k_problem)
    return load_hub(GSM8K_HUB, split, mapping=gsm8k_problem, config=GSM8K_CONFIG)


def load_math(split: str = "train", path: DataPath | None = None) -> list[Problem]:
    """MATH problems: `DigitalLearningGmbH/MATH-lighteval` from the hub, or a local file.

    A local file has MATH's columns (`problem`, `solution` with ``\\boxed{}``) and is the split.
    """
    if path is not None:
        return _map_rows(path, read_rows(path), math_problem)
    return load_hub(MATH_HUB, split, mapping=math_problem)
