"""The `rlvr` command line: it parses arguments and calls the library, nothing more."""

from __future__ import annotations

import difflib
import os
import shutil
import textwrap
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, get_args

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlvr.config import (
    PREFERENCE_PRESETS,
    RL_PRESETS,
    ConfigError,
    DataConfig,
    RLConfig,
    describe_fields,
    preset_info,
    preset_names,
    resolve_config,
)
from rlvr.config_offline import CurateConfig, DPOConfig, SFTConfig
from rlvr.foreign_keys import rlvr_key
from rlvr.run_layout import CONFIG_FILE, RUN_LOGS, evaluated_folder
from rlvr.tracking.jsonl import JsonlWriter

if TYPE_CHECKING:
    from rlvr.config import DataConfig
    from rlvr.rollout.tools import ToolUse
    from rlvr.training.stopping import RunStopped

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Train language models to reason with verifiable rewards.",
)
console = Console(markup=False, soft_wrap=True)
"""Results. Markup is off: paths, keys and messages such as `[lo, hi]` print as written."""
diagnostics = Console(markup=False, soft_wrap=True, stderr=True)
"""Errors and stop notices, on stderr, so that `rlvr eval ... > out.txt` still shows them."""
_PACKAGE = Path(__file__).resolve().parent
_python_show_warning = warnings.showwarning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """rlvr's own warnings as one ``warning: ...`` line on stderr (the line of rlvr's code that
    raised one tells a user nothing); any other as Python shows it."""
    if issubclass(category, UserWarning) and Path(filename).resolve().is_relative_to(_PACKAGE):
        diagnostics.print(Text.assemble(("warning: ", "bold yellow"), str(message)))
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def main() -> None:
    """The `rlvr` command: the console script and ``python -m rlvr``."""
    warnings.showwarning = _show_warning
    app(prog_name="rlvr")


def _option_names(command: str) -> list[str]:
    """The --options of `command`: what a mistyped one is compared with."""
    group = typer.main.get_command(app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    return [o for p in params for o in p.opts if o.startswith("--")]


SETTINGS_COMMAND = {"allow_extra_args": True, "ignore_unknown_options": True}
"""The context of a command whose arguments are key=value settings: an unknown `--option`
reaches `_split_args` instead of click's 'No such option'."""


def _split_args(args: list[str], model: type, command: str) -> tuple[str | None, list[str]]:
    """First argument is a YAML config file unless it is a key=value override or Hydra's
    ~key (refused by `parse_override`); an argument in option form is refused
    (`_refuse_option`)."""
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            _refuse_option(arg, args[i + 1] if i + 1 < len(args) else "--", model, command)
    hydra_removal = bool(args) and args[0].startswith("~") and "/" not in args[0]
    if args and "=" not in args[0] and not hydra_removal:
        return args[0], args[1:]
    return None, args


def _refuse_option(arg: str, following: str, model: type, command: str) -> None:
    """Fail on `arg`: a mistyped --option of `command` (did you mean --resume?), or a setting
    in option form (`--train.lr 1e-6`, TRL's `--num_generations=8`), shown as key=value in
    `model`'s key where the name is TRL's or verl's."""
    key, given, value = arg[2:].partition("=")
    close = difflib.get_close_matches(f"--{key}", _option_names(command), n=1, cutoff=0.75)
    if close:
        _fail(f"no option {arg!r}; did you mean {close[0]}?")
    if not given and not following.startswith("--") and "=" not in following:
        value = following
    foreign = rlvr_key(key, [k for k, _, _ in describe_fields(model)])
    _fail(
        f"{arg!r}: settings are key=value arguments here, not options: "
        f"{foreign.ours if foreign else key}={value or '...'} (--help-config lists every key)"
    )


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors caused by bad input: shown as one clear line, not a traceback."""
    from rlvr.data.loaders import DatasetError
    from rlvr.models.loading import ModelLoadError
    from rlvr.training.checkpoint import CheckpointError

    return ConfigError, DatasetError, ModelLoadError, CheckpointError, FileNotFoundError


def _appendable(output: Path | None, option: str = "--output") -> None:
    """Make sure the file of `option` can take the result before the work that makes it
    begins (its content, if any, is left as it is): a ``.jsonl`` file that is not one of a
    run directory's own logs."""
    if output is None:
        return
    if output.suffix != ".jsonl":
        _fail(f"{option} {str(output)!r}: the result is JSON lines; give a path ending in .jsonl")
    if output.name in RUN_LOGS and (output.parent / CONFIG_FILE).is_file():
        _fail(
            f"{option} {str(output)!r} is a log of the run in {str(output.parent)!r}; "
            "give a file of its own"
        )
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.open("a").close()
    except OSError as error:
        _fail(f"{option} {str(output)!r}: {error}")


def _one_of(option: str, value: str | None, field: str) -> None:
    """Refuse an option value that `DataConfig.<field>` does not take, naming the option (not
    the data key it becomes) and the values it takes."""
    choices = get_args(DataConfig.model_fields[field].annotation)
    if value is not None and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        _fail(f"{option} {value}: {hint}choose {', '.join(choices[:-1])} or {choices[-1]}")


def _fail(message: str) -> NoReturn:
    diagnostics.print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code=2)


PARALLEL = ("train", "sft", "dpo")
"""The commands that run data-parallel under torchrun (`rlvr.training.distributed`)."""


@app.callback()
def _one_process_unless_training(ctx: typer.Context) -> None:
    if os.environ.get("WORLD_SIZE", "1") != "1" and ctx.invoked_subcommand not in PARALLEL:
        _fail(
            f"rlvr {ctx.invoked_subcommand} runs in one process: under torchrun, only "
            "`rlvr train`, `sft` and `dpo` run data-parallel"
        )


def _main_process() -> bool:
    """Whether this is torchrun's rank 0 (or no torchrun): the process that reports."""
    return os.environ.get("RANK", "0") == "0"


ConfigArgs = Annotated[
    list[str] | None, typer.Argument(help="[CONFIG.yaml] then key=value overrides")
]
HelpConfig = Annotated[bool, typer.Option("--help-config", help="List every config key")]


def _config(
    command: str,
    args: list[str] | None,
    model: type,
    preset: str | None = None,
    package: str = RL_PRESETS,
) -> Any:
    """The validated config of `command`'s arguments; a bad one exits with a clear error."""
    config_path, overrides = _split_args(args or [], model, command)
    try:
        return resolve_config(config_path, preset, overrides, model=model, preset_package=package)
    except ConfigError as exc:
        _fail(str(exc))


def _print_fields(model: type) -> None:
    """Each key in full (a table would cut long ones), its default, then its meaning indented,
    so that `--help-config | grep -A3 lora` finds what it asks for."""
    width = min(shutil.get_terminal_size().columns, 100)
    section = None
    for key, default, doc in describe_fields(model):
        if section is not None and key.split(".")[0] != section:
            typer.echo()
        section = key.split(".")[0]
        typer.echo(f"{key} = {default}")
        meaning = " ".join(doc.split())
        typer.echo(textwrap.fill(meaning, width, initial_indent="    ", subsequent_indent="    "))


@app.command(context_settings=SETTINGS_COMMAND)
def train(
    args: ConfigArgs = None,
    preset: Annotated[
        str | None, typer.Option(help="Start from a preset (see `rlvr presets`)")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the latest checkpoint of train.output_dir")
    ] = False,
    help_config: HelpConfig = False,
) -> None:
    """Online RL from an optional YAML config, a preset and key=value overrides."""
    if help_config:
        _print_fields(RLConfig)
        return
    cfg = _config("train", args, RLConfig, preset)
    from rlvr.tracking.report import plot_runs
    from rlvr.training.rl import train as run_train
    from rlvr.training.stopping import RunStopped

    stopped = None
    try:
        run_dir = run_train(cfg, resume=resume)
    except RunStopped as exc:
        run_dir, stopped = Path(cfg.train.output_dir), exc
    except _user_errors() as exc:
        _fail(str(exc))
    if _main_process():
        plot_runs([run_dir], run_dir / "report.png")
        console.print(f"run directory: {run_dir} (curves in report.png)")
    if stopped is not None:
        _stop(stopped, "rlvr train with the same arguments and --resume continues it")


def _stop(stopped: RunStopped, how_to_continue: str) -> None:
    """Report a run that stopped on a signal (`rlvr.training.stopping`) and exit as the shell
    expects of a process that signal ended."""
    if _main_process():
        diagnostics.print(Text.assemble((str(stopped), "bold yellow"), f"; {how_to_continue}"))
    raise typer.Exit(code=stopped.exit_code)


@app.command(context_settings=SETTINGS_COMMAND)
def sweep(
    args: ConfigArgs = None,
    preset: Annotated[
        str | None, typer.Option(help="Preset, or several comma-separated (an axis)")
    ] = None,
    output_dir: Annotated[
        Path, typer.Option(help="One run directory per point, summary and report here")
    ] = Path("runs/sweep"),
) -> None:
    """One RL run per point of a grid (key=v1,v2 and --preset a,b are axes), then an overlaid
    report.png and a summary table; finished runs are not run again."""
    config_path, overrides = _split_args(args or [], RLConfig, "sweep")
    from rlvr.training.stopping import RunStopped
    from rlvr.training.sweep import run_sweep

    try:
        rows = run_sweep(config_path, preset, overrides, output_dir)
    except RunStopped as exc:
        _stop(exc, "the same rlvr sweep command continues the sweep from it")
    except _user_errors() as exc:
        _fail(str(exc))
    table = Table("run", "steps", "accuracy", "reward/mean", "eval/pass@1", "seconds")
    for row in rows:
        held_out, accuracy = row["eval/pass@1"], row["accuracy"]
        table.add_row(
            row["name"],
            str(row["steps"]),
            "-" if accuracy is None else f"{accuracy:.3f}",
            f"{row['reward/mean']:.3f}",
            "-" if held_out is None else f"{held_out:.3f}",
            f"{row['seconds']:.0f}",
        )
    console.print(table)
    console.print(f"runs, summary.jsonl and report.png in {output_dir}")


@app.command(context_settings=SETTINGS_COMMAND)
def bench(
    args: ConfigArgs = None,
    preset: Annotated[str | None, typer.Option(help="Start from a preset")] = None,
    steps: Annotated[int, typer.Option(help="Timed steps")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps first")] = 1,
    output: Annotated[
        Path | None, typer.Option(help="Append the result to this JSONL file")
    ] = None,
) -> None:
    """Median seconds per RL step (rollout / reward / train) and tokens per second of a config
    on this machine, after warm-up steps; nothing is kept on disk."""
    cfg = _config("bench", args, RLConfig, preset)
    _appendable(output)
    from rlvr.training.bench import run_bench

    try:
        result = run_bench(cfg, steps=steps, warmup=warmup)
    except (ValueError, *_user_errors()) as exc:
        _fail(str(exc))
    table = Table("metric", "value (time/* and tokens_per_s: median of the timed steps)")
    for key, value in result.items():
        if key != "per_step":
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    if output is not None:
        with JsonlWriter(output) as log:
            log.write(result)


@app.command(context_settings=SETTINGS_COMMAND)
def sft(
    args: ConfigArgs = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the latest checkpoint of sft.output_dir")
    ] = False,
    help_config: HelpConfig = False,
) -> None:
    """Cold-start supervised fine-tuning on a task's worked solutions."""
    if help_config:
        _print_fields(SFTConfig)
        return
    cfg = _config("sft", args, SFTConfig)
    from rlvr.tracking.report import plot_runs
    from rlvr.training.sft import run_sft
    from rlvr.training.stopping import RunStopped

    try:
        out_dir = run_sft(cfg, resume=resume)
    except RunStopped as exc:
        _stop(exc, "rlvr sft with the same arguments and --resume continues it")
    except _user_errors() as exc:
        _fail(str(exc))
    if _main_process():
        plot_runs([out_dir], out_dir / "report.png")
        console.print(f"model saved to {out_dir} (curves in report.png)")


@app.command(context_settings=SETTINGS_COMMAND)
def dpo(
    args: ConfigArgs = None,
    preset: Annotated[
        str | None, typer.Option(help="Start from a preference preset (see `rlvr presets`)")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the latest checkpoint of dpo.output_dir")
    ] = False,
    help_config: HelpConfig = False,
) -> None:
    """Offline preference optimisation (DPO, LN-DPO, IPO, SimPO) on pairs from a file or on
    the model's own verified samples of a task."""
    if help_config:
        _print_fields(DPOConfig)
        return
    cfg = _config("dpo", args, DPOConfig, preset, PREFERENCE_PRESETS)
    from rlvr.tracking.report import plot_runs
    from rlvr.training.preference import run_dpo
    from rlvr.training.stopping import RunStopped

    try:
        out_dir = run_dpo(cfg, resume=resume)
    except RunStopped as exc:
        _stop(exc, "rlvr dpo with the same arguments and --resume continues it")
    except _user_errors() as exc:
        _fail(str(exc))
    if _main_process():
        plot_runs([out_dir], out_dir / "report.png")
        console.print(f"model and logs saved to {out_dir} (curves in report.png)")


@app.command(context_settings=SETTINGS_COMMAND)
def curate(
    args: ConfigArgs = None,
    help_config: HelpConfig = False,
) -> None:
    """Drop duplicate problems and keep those whose pass rate under the model lies in
    [curate.min_pass_rate, curate.max_pass_rate]; write them as a JSONL data file."""
    if help_config:
        _print_fields(CurateConfig)
        return
    cfg = _config("curate", args, CurateConfig)
    from rlvr.data.curation import run_curate

    try:
        summary = run_curate(cfg)
    except (ValueError, *_user_errors()) as exc:
        _fail(str(exc))
    table = Table("problems", "duplicates", "too hard", "too easy", "kept")
    table.add_row(
        *(str(n) for n in (summary.problems, summary.duplicates, summary.too_hard)),
        str(summary.too_easy),
        str(summary.kept),
    )
    console.print(table)
    console.print(
        f"wrote {summary.output}; train on it with data.task=file data.path={summary.output}",
        soft_wrap=True,
    )


@app.command("eval", context_settings={"allow_extra_args": True})
def eval_cmd(
    model: Annotated[
        str | None,
        typer.Option(
            help="Model directory, run directory (its latest checkpoint), or `tiny` (required)"
        ),
    ] = None,
    data_overrides: Annotated[
        list[str] | None,
        typer.Argument(help="data.KEY=VALUE settings of the task (e.g. data.max_digits=1)"),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            help="arithmetic, countdown, gsm8k, math or file (default: the task of the run "
            "that saved --model, with its settings; else arithmetic)"
        ),
    ] = None,
    k: Annotated[int, typer.Option(help="Samples per problem (pass@k, maj@k)", min=1)] = 8,
    samples: Annotated[int, typer.Option(help="Held-out problems to evaluate", min=1)] = 500,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature (0: greedy)", min=0.0)
    ] = 1.0,
    top_p: Annotated[
        float, typer.Option(help="Nucleus sampling: keep the most likely tokens up to this mass")
    ] = 1.0,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            help="Generation budget (default: the RL run's evaluation budget, else 64)", min=1
        ),
    ] = None,
    template: Annotated[
        str | None, typer.Option(help="chat, r1, qwen_math or none (default: the run's, else chat)")
    ] = None,
    data_path: Annotated[
        str | None,
        typer.Option(
            help="Local file of problems to evaluate, all its rows up to --samples (task file, "
            "gsm8k or math); without it, the task's held-out split"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed")] = 0,
    tools: Annotated[
        str | None,
        typer.Option(
            help="Tools the model may call, comma-separated: calculator, python (default: the "
            "RL run's rollout.tools; 'none' for none)"
        ),
    ] = None,
    tool_format: Annotated[
        str | None,
        typer.Option(help="How calls are written: tags, code or hermes (default: the run's)"),
    ] = None,
    attempts: Annotated[
        int,
        typer.Option(
            help="Attempts per sample: a wrong one is told so in a user turn of the chat "
            "template and tries again (multi-attempt; needs --template chat)",
            min=1,
        ),
    ] = 1,
    retry_message: Annotated[
        str, typer.Option(help="The user turn after a wrong attempt")
    ] = "Your answer is incorrect. Please try again.",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto",
    engine: Annotated[
        str,
        typer.Option(help="Rollout engine: hf (rlvr's own) or vllm (needs vLLM installed)"),
    ] = "hf",
    output: Annotated[
        Path | None, typer.Option(help="Append the result to this JSONL file")
    ] = None,
    log_samples: Annotated[
        Path | None,
        typer.Option(
            help="Write every sample to this JSONL file: question, gold answer, completion, "
            "extracted answer, correct, length"
        ),
    ] = None,
    self_certainty: Annotated[
        bool,
        typer.Option(
            help="Also sc@k: how often the most self-certain of a problem's k samples is right "
            "(best-of-k without the verifier; one more forward pass)"
        ),
    ] = False,
) -> None:
    """pass@1, pass@k, maj@k (sc@k with --self-certainty), mean response length and truncation
    on held-out problems."""
    from rlvr.config import ModelConfig
    from rlvr.data.tasks import eval_settings, load_eval_task
    from rlvr.evaluation.evaluate import evaluate
    from rlvr.models.loading import load_model_and_tokenizer

    if model is None:
        paths = [o for o in data_overrides or [] if "=" not in o]
        hint = f": rlvr eval --model {paths[0]}" if paths else ""
        _fail(f"give the model to evaluate with --model (a model or run directory, or tiny){hint}")
    _appendable(output)
    _appendable(log_samples, "--log-samples")
    _one_of("--task", task, "task")
    _one_of("--template", template, "template")
    if not 0.0 < top_p <= 1.0:
        _fail(f"--top-p {top_p}: give a probability in (0, 1] (1: no nucleus cut)")
    checkpoint = evaluated_folder(Path(model))
    if model != "tiny" and checkpoint != Path(model):
        diagnostics.print(f"{model} is a run directory: evaluating its latest, {checkpoint}")
        model = str(checkpoint)
    try:
        data, run = eval_settings(
            model,
            task=task,
            template=template,
            data_path=data_path,
            samples=samples,
            overrides=data_overrides or [],
        )
    except ConfigError as exc:
        _fail(str(exc))
    if run is not None:  # before the data loads, so that an error there has its source
        diagnostics.print(
            f"data.task={data.task} with the data settings of {run.config} (--task or "
            "data.KEY=VALUE choose others)"
        )
    try:
        problems = load_eval_task(data)  # before the model: a bad file fails in a second
        policy, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=model, device=device))
    except (ValueError, *_user_errors()) as exc:
        _fail(str(exc))
    held_out = problems.test[:samples]
    sampling = {
        "template": data.template,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens or (run and run.max_new_tokens) or 64,
        "seed": seed,
    }
    if data.chat_template_kwargs:
        sampling["chat_kwargs"] = data.chat_template_kwargs
    records: list[dict] | None = [] if log_samples is not None else None
    tool_use = _tool_use(tools, tool_format, run.tools if run else {}, data)
    if attempts > 1 and data.template != "chat":
        _fail(f"--attempts {attempts} tells a wrong attempt so in a chat turn: use --template chat")
    sampler = _eval_engine(engine, policy, tokenizer, tool_use, sampling, held_out)

    try:
        result = evaluate(
            policy,
            tokenizer,
            held_out,
            reward=problems.reward,
            k=k,
            records=records,
            tools=tool_use,
            attempts=(attempts, retry_message),
            engine=sampler,
            self_certainty=self_certainty,
            **sampling,
        )
    except ConfigError as exc:  # a tool format the tokenizer's chat template cannot write
        _fail(str(exc))
    if attempts > 1:
        sampling["attempts"] = attempts
    if engine != "hf":
        sampling["engine"] = engine
    if tool_use.names:
        sampling["tools"] = ",".join(tool_use.names)
        sampling["tool_format"] = tool_use.format
    result = {"model": model, "task": data.task, **sampling, **result}  # what to reproduce it
    table = Table("metric", "value")
    for key, value in result.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    if output is not None:
        with JsonlWriter(output) as log:
            log.write(result)
    if records is not None and log_samples is not None:
        log_samples.write_text("")  # this evaluation's samples only
        with JsonlWriter(log_samples) as log:
            for record in records:
                log.write(record)


def _eval_engine(name: str, policy, tokenizer, tool_use: ToolUse, sampling: dict, problems: list):
    """`rlvr eval --engine`: None for `hf` (evaluate builds its own), else a vLLM engine on the
    policy for `problems` (`sampling_engine`)."""
    from rlvr.config import EngineSettings
    from rlvr.evaluation.engines import sampling_engine

    if name not in ("hf", "vllm"):
        _fail(f"--engine {name}: choose hf or vllm")
    try:
        return sampling_engine(
            EngineSettings(engine=name),
            policy,
            tokenizer,
            problems,
            sampling["template"],
            sampling["max_new_tokens"],
            sampling.get("chat_kwargs"),
            tool_use,
            engine_named=f"--engine {name}",
        )
    except ConfigError as exc:
        _fail(str(exc))


def _tool_use(option: str | None, form: str | None, trained: dict, data: DataConfig) -> ToolUse:
    """`rlvr eval`'s tools: --tools (names, or `none`), else those the RL run trained with;
    --tool-format, else the run's (`hermes` only with the chat template)."""
    from pydantic import ValidationError

    from rlvr.config import ToolSettings, refuse_hermes_without_chat
    from rlvr.rollout.tools import ToolUse

    settings = dict(trained)
    if option is not None:
        names = [] if option.strip() == "none" else [n.strip() for n in option.split(",")]
        settings["tools"] = [name for name in names if name]
    if form is not None:
        settings["tool_format"] = form
    try:
        tool_settings = ToolSettings.model_validate(settings)
    except ValidationError as exc:
        error = exc.errors()[0]
        option_name = "--tool-format" if error["loc"][:1] == ("tool_format",) else "--tools"
        _fail(f"{option_name}: {error.get('ctx', {}).get('error') or error['msg']}")
    try:
        refuse_hermes_without_chat(tool_settings, data, "--tool-format", "--template chat")
    except ValueError as exc:
        _fail(str(exc))
    return ToolUse.of(tool_settings)


@app.command()
def demo(
    output_dir: Annotated[Path, typer.Option(help="Where everything lands")] = Path("runs/demo"),
) -> None:
    """The embedded default: tiny model, cold-start SFT, eval, GRPO, eval again, report."""
    from rlvr.demo import run_demo
    from rlvr.training.stopping import RunStopped

    try:
        run_demo(output_dir)
    except RunStopped as exc:
        _stop(exc, "rlvr demo starts over when run again")
    except _user_errors() as exc:
        _fail(str(exc))


@app.command()
def presets() -> None:
    """Every preset, one line each, with its command and paper."""
    table = Table("preset", "command", "what it does", "paper")
    for command, package in (("train", RL_PRESETS), ("dpo", PREFERENCE_PRESETS)):
        for name in preset_names(package):
            description, paper = preset_info(name, package)
            table.add_row(name, command, description, paper)
    console.print(table)


@app.command()
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="Run directories, or folders of them (a sweep's --output-dir)"),
    ],
    output: Annotated[
        Path | None, typer.Option(help="PNG path (default: RUN_DIR/report.png)")
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="A metrics.jsonl key, or eval/KEY of eval.jsonl, to plot (repeatable; "
            "default: the usual panels, and eval/pass@1 where the run evaluated)"
        ),
    ] = None,
    smoothing: Annotated[float, typer.Option(help="EMA smoothing weight in [0, 1)")] = 0.0,
) -> None:
    """Plot reward, accuracy, length, entropy, KL and clip fraction of runs, overlaid."""
    from rlvr.tracking.report import plot_runs

    out = output or run_dirs[0] / "report.png"
    try:
        plot_runs(run_dirs, out, metric or None, smoothing=smoothing)
    except (OSError, ValueError) as exc:  # a missing run, or an --output it cannot write
        _fail(str(exc))
    console.print(f"wrote {out}")
