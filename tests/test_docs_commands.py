"""Every `rlvr train/sweep/bench/sft/dpo/curate` command written in the README and docs/
resolves to a config (its keys exist, its values are in range, its preset is there), except
those that show a TRL or verl name being answered, which must get rlvr's key for it; and every
option written after any `rlvr` command is one that command has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from rlvr import foreign_keys
from rlvr.cli import app
from rlvr.config import PREFERENCE_PRESETS, RL_PRESETS, ConfigError, RLConfig, resolve_config
from rlvr.config_offline import CurateConfig, DPOConfig, SFTConfig
from rlvr.training.sweep import sweep_points

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"train": RLConfig, "bench": RLConfig, "sft": SFTConfig, "dpo": DPOConfig}
MODELS["curate"] = CurateConfig
NAMES = "train|sweep|bench|sft|dpo|curate|eval|demo|report|presets"
INLINE = re.compile(rf"`rlvr ({NAMES})\b([^`]*)`")
"""A command in a line of prose: `rlvr train ...` in backquotes."""
IN_BLOCK = re.compile(rf"^\s*(?:\$ )?(?:\S*torchrun\b.*?)?\brlvr ({NAMES})\b(.*)$")
"""A command line of a fenced code block, alone, after a `$ ` prompt or a torchrun launcher."""


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with each backslash continuation joined to its line."""
    joined: list[tuple[int, str]] = []
    carried = None
    for number, line in enumerate(text.splitlines(), 1):
        if carried is not None:
            number, line = carried[0], carried[1] + " " + line.strip()
        carried = (number, line[:-1]) if line.endswith("\\") else None
        if carried is None:
            joined.append((number, line))
    return joined


def written_commands() -> list[tuple[str, str, list[str]]]:
    """(where, command, arguments) of each command in the docs, shell comments dropped; one
    whose arguments name a YAML file is left out (the file is the reader's own)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for number, line in logical_lines(path.read_text()):
            fenced ^= line.lstrip().startswith("```")
            matches = [IN_BLOCK.match(line)] if fenced else list(INLINE.finditer(line))
            for match in filter(None, matches):
                arguments = shlex.split(match.group(2), comments=True)
                if not any(a.endswith((".yaml", ".yml")) for a in arguments):
                    found.append((f"{path.name}:{number}", match.group(1), arguments))
    return found


def resolve(command: str, arguments: list[str]) -> None:
    """What the CLI does with `arguments` before any work: `--preset NAME` and the overrides
    (a sweep's comma-separated axes expanded into its points); other options are left out."""
    preset, overrides, rest = None, [], iter(arguments)
    for argument in rest:
        if argument == "--preset":
            preset = next(rest)
        elif argument == "--output-dir" or argument.startswith("--output"):
            next(rest, None)
        elif "=" in argument and not argument.startswith("--"):
            overrides.append(argument)
    if command == "sweep":
        sweep_points(None, preset, overrides, Path("runs/sweep"))
        return
    package = PREFERENCE_PRESETS if command == "dpo" else RL_PRESETS
    resolve_config(None, preset, overrides, model=MODELS[command], preset_package=package)


COMMANDS = written_commands()


CONFIGURED = [c for c in COMMANDS if c[1] in {*MODELS, "sweep"}]


def test_the_docs_write_commands_of_every_kind():
    assert len(CONFIGURED) > 50
    assert {command for _, command, _ in COMMANDS} == {
        *MODELS,
        "sweep",
        "eval",
        "demo",
        "report",
        "presets",
    }


@pytest.mark.parametrize(("where", "command", "arguments"), COMMANDS, ids=[w for w, *_ in COMMANDS])
def test_each_option_in_the_docs_is_one_of_its_command_s(where, command, arguments):
    options = {
        name
        for parameter in typer.main.get_command(app).commands[command].params
        for name in (*parameter.opts, *parameter.secondary_opts)
    }
    for argument in arguments:
        if argument.startswith("--"):
            assert argument.split("=")[0] in options, argument


@pytest.mark.parametrize(
    ("where", "command", "arguments"), CONFIGURED, ids=[w for w, *_ in CONFIGURED]
)
def test_a_command_in_the_docs_resolves(where, command, arguments):
    foreign = [
        a.split("=")[0]
        for a in arguments
        if a.split("=")[0] in {**foreign_keys.TRL, **foreign_keys.VERL}
    ]
    if not foreign:
        resolve(command, arguments)
        return
    with pytest.raises(ConfigError, match=f"unknown config key {foreign[0]!r}: TRL's name for"):
        resolve(command, arguments)
