"""Tasks: where problems come from and which verifier scores them.

A task is a train split, a held-out split and the name of its correctness reward. Built-in
synthetic tasks are generated offline; `gsm8k` and `math` come from the hub (or data.path);
`file` reads a local JSONL/Parquet/JSON file.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import ConfigError, DataConfig, data_config, load_saved_config
from rlvr.data.problem import Problem
from rlvr.data.synthetic import synthetic_splits
from rlvr.run_layout import saved_config


@dataclass
class Task:
    """The problems of one task and the reward that checks them."""

    name: str
    train: list[Problem]
    test: list[Problem]
    reward: str
    """Name of the registered correctness reward (`math`, `countdown`)."""


def _hold_out(problems: list[Problem], test_size: int, source: str) -> tuple[list, list]:
    if len(problems) <= test_size:
        raise ConfigError(
            f"{source} has {len(problems)} rows, not more than data.test_size={test_size}; "
            "lower data.test_size (0 holds none out) or give data.test_path"
        )
    split = len(problems) - test_size
    return problems[:split], problems[split:]


def _warn_if_seen(
    train: list[Problem], test: list[Problem], source: str, test_file: bool
) -> list[Problem]:
    """`test`, with a warning when some of its prompts are also training prompts (a file with
    duplicate rows, or a test file, `test_file`, that overlaps the training data)."""
    seen = {repr(p.prompt) for p in train}
    repeated = sum(repr(p.prompt) in seen for p in test)
    if repeated:
        remedy = (
            "drop them from one of the files"
            if test_file
            else "drop the duplicates (rlvr curate does) or give data.test_path"
        )
        warnings.warn(
            f"{source}: {repeated} of the {len(test)} held-out problems have the prompt of a "
            f"training problem, so held-out accuracy partly measures recall; {remedy}",
            stacklevel=3,
        )
    return test


def load_task(cfg: DataConfig) -> Task:
    """Build the task named by `cfg.task` (the config allows only the five below)."""
    if cfg.task == "arithmetic":
        train, test = synthetic_splits(
            "arithmetic",
            train_size=cfg.train_size,
            test_size=cfg.test_size,
            seed=cfg.seed,
            max_digits=cfg.max_digits,
            min_terms=cfg.min_terms,
            max_terms=cfg.max_terms,
            operators=cfg.operators,
            shortcut_frac=cfg.shortcut_frac,
        )
        return Task("arithmetic", train, test, "math")
    if cfg.task == "countdown":
        train, test = synthetic_splits(
            "countdown", train_size=cfg.train_size, test_size=cfg.test_size, seed=cfg.seed
        )
        return Task("countdown", train, test, "countdown")
    from rlvr.data import loaders  # imports `datasets`: only when a task reads data

    if cfg.task in ("gsm8k", "math"):
        load = loaders.load_gsm8k if cfg.task == "gsm8k" else loaders.load_math
        train = load(split="train", path=cfg.path)
        test = load(split="test", path=cfg.test_path) if cfg.test_path or not cfg.path else None
        source = loaders.path_label(cfg.test_path or cfg.path or cfg.task)
        if test is None:
            train, test = _hold_out(train, cfg.test_size, source)
        test = _warn_if_seen(train, test[: cfg.test_size], source, bool(cfg.test_path))
        return Task(cfg.task, train, test, "math")
    if not cfg.path:
        raise ConfigError("data.task=file needs data.path (a local JSONL, Parquet or JSON file)")
    problems = loaders.load_file(cfg.path, **_columns(cfg))
    if cfg.test_path:
        test = loaders.load_file(cfg.test_path, **_columns(cfg))
        train, source = problems, loaders.path_label(cfg.test_path)
    else:
        source = loaders.path_label(cfg.path)
        train, test = _hold_out(problems, cfg.test_size, source)
    return Task("file", train, _warn_if_seen(train, test, source, bool(cfg.test_path)), "math")


def held_out_note(cfg: DataConfig, task: Task) -> str | None:
    """A line for the user when the held-out problems are the last rows of data.path (no
    data.test_path): those rows are not trained on, unlike TRL's and verl's training files."""
    reads_path = task.name in ("file", "gsm8k", "math")
    if not reads_path or cfg.path is None or cfg.test_path is not None or not task.test:
        return None
    return holding_out(len(task.train), len(task.test), "rows", f"data.test_size={cfg.test_size}")


def holding_out(trained: int, held: int, unit: str, setting: str) -> str:
    """`rlvr train`, `sft` and `dpo`'s line on the last `held` rows (or pairs) of data.path,
    kept out of training by `setting`."""
    return (
        f"data.path: training on {trained} {unit}; the last {held} are held out for "
        f"evaluation ({setting}; 0 trains on every {unit.removesuffix('s')})"
    )


def _columns(cfg: DataConfig) -> dict[str, str | None]:
    return {
        "prompt_column": cfg.prompt_column,
        "answer_column": cfg.answer_column,
        "solution_column": cfg.solution_column,
    }


def load_eval_task(cfg: DataConfig) -> Task:
    """The problems `rlvr eval` scores (in `Task.test`; `Task.train` is empty): every row of
    `data.test_path` when it is given, read as the task's rows, else `load_task`'s held-out
    split, the one a training run on the same `data` settings evaluates."""
    if cfg.test_path is None:
        task = load_task(cfg)
        if not task.test:
            raise ConfigError(
                f"data.task={cfg.task} with data.test_size=0 holds out no problems to "
                "evaluate; give --data-path FILE or data.test_size=N"
            )
    else:
        from rlvr.data import loaders

        if cfg.task == "file":
            test = loaders.load_file(cfg.test_path, **_columns(cfg))
        else:
            load = loaders.load_gsm8k if cfg.task == "gsm8k" else loaders.load_math
            test = load(split="test", path=cfg.test_path)
        task = Task(cfg.task, [], test, "math")
    what = "pass@k and maj@k are measured against one"
    require_gold_answers(task, task.test, cfg.test_path or cfg.path, what)
    return task


def require_gold_answers(
    task: Task,
    problems: list[Problem],
    source: object,
    what: str,
    way_out: str = "set data.answer_column to the column that holds it",
) -> None:
    """Refuse what needs the `math` verifier's judgement on `problems` of which none has a
    gold answer (`data.answer_column=null`): it would read 0, not "unknown". The error names
    `source`, says `what` needed the answers and offers `way_out`."""
    if task.reward == "math" and problems and not any(p.answer for p in problems):
        raise ConfigError(
            f"{source}: no row has a gold answer (data.answer_column=null), and {what}: {way_out}"
        )


@dataclass
class TrainedOn:
    """The task of the run that saved a model: what `rlvr eval` evaluates it on by default."""

    config: Path
    """The run's config.yaml."""
    data: dict
    """Its `data` settings (task, file, template, synthetic settings, held-out size)."""
    max_new_tokens: int | None
    """An RL run's evaluation budget (`eval.max_new_tokens`, else `rollout.max_new_tokens`)."""
    tools: dict = field(default_factory=dict)
    """An RL run's tool settings (`rollout.tools`, `max_tool_calls`, `tool_timeout`,
    `tool_format`, those it set), or an SFT run's (`sft.tools`, ...): its model is evaluated
    calling the same tools."""


def trained_on(model: str | Path) -> TrainedOn | None:
    """The task settings of the rlvr run that saved `model`, from the config.yaml that `rlvr
    sft` and `rlvr dpo` write beside the weights and `rlvr train` two folders up
    (RUN_DIR/checkpoints/step-N). None for a model no rlvr run saved, and for a DPO run on a
    pair file (pairs are not problems with answers)."""
    found = saved_config(Path(model))
    saved = None if found is None else load_saved_config(found)
    if found is None or saved is None:
        return None
    if not isinstance(saved.get("data"), dict):
        raise ConfigError(f"{found}: no `data` section, so not the config of an rlvr run")
    data = dict(saved["data"])
    if "dpo" in saved:
        if data.get("task") == "file":
            return None
        for column in ("chosen_column", "rejected_column", "completion_column", "label_column"):
            data.pop(column, None)
    budget, tools = None, {}
    if isinstance(saved.get("rollout"), dict):
        rollout = saved["rollout"]
        budget = (saved.get("eval") or {}).get("max_new_tokens") or rollout.get("max_new_tokens")
    for section in ("rollout", "sft"):  # an RL run's tools, or those its solutions called
        settings = saved.get(section)
        if isinstance(settings, dict) and settings.get("tools"):
            keys = ("tools", "max_tool_calls", "tool_timeout", "tool_format")
            tools = {key: settings[key] for key in keys if key in settings}
    return TrainedOn(found, data, budget, tools)


def eval_settings(
    model: str,
    *,
    task: str | None,
    template: str | None,
    data_path: str | None,
    samples: int,
    overrides: list[str],
) -> tuple[DataConfig, TrainedOn | None]:
    """`rlvr eval`'s task: the settings of the run that saved `model` (`trained_on`) unless
    `task` names another, else the defaults with `samples` held-out problems; then the given
    template, file of problems to evaluate (`data.test_path`) and data.KEY=VALUE overrides."""
    run = trained_on(model)
    if run is not None and task not in (None, run.data.get("task")):
        run = None
    if run is not None:
        try:
            data_config(run.data)
        except ConfigError as exc:
            raise ConfigError(f"{run.config}: its data settings do not fit ({exc})") from None
    base = dict(run.data) if run else {"task": task or "arithmetic", "test_size": samples}
    if template is not None:
        base["template"] = template
    if data_path is not None:
        base["test_path"] = data_path
    return data_config(base, overrides), run
