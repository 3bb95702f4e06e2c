"""Reading and writing the configuration tree: YAML presets and files, dotted command-line
overrides, errors that name the source and the key, the saved `config.yaml`, and the rows of
`--help-config`, and `Section`, the base of every section. The tree's sections themselves are in
`rlvr.config` (the `algorithm` section in `rlvr.config_algorithm`), which re-exports these.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rlvr.foreign_keys import foreign_key_hint


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, field docstrings are kept."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )


class ConfigError(ValueError):
    """A config file, preset or override that does not fit the config tree."""


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_valid_keys(annotation, prefix + name + "."))
    return keys


def _close_keys(key: str, valid: list[str]) -> list[str]:
    """The keys a mistyped `key` may have meant: those it names the last part of (`lr`:
    `train.lr`, `algorithm.critic.lr`), else its nearest spelling that is not the section it
    was written in (`rollout.n` does not mean `rollout`)."""
    last = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in valid if k.endswith("." + last) and k != key]
    if same_leaf and len(same_leaf) <= 3:
        return same_leaf
    others = [k for k in valid if not key.startswith(k + ".")]
    return difflib.get_close_matches(key, others, n=1, cutoff=0.5)


def _explain(error: ValidationError, root: type[BaseModel], source: str) -> ConfigError:
    valid = _valid_keys(root)
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            close = [repr(k) for k in _close_keys(key, valid)]
            alternatives = " or ".join([", ".join(close[:-1]), *close[-1:]] if close[1:] else close)
            hint = f"; did you mean {alternatives}?" if close else ""
            foreign = foreign_key_hint(key, item["input"], valid)
            lines.append(f"unknown config key {key!r}" + (f": {foreign}" if foreign else hint))
        elif item["type"] == "value_error" and not key:  # a check across sections
            lines.append(str(item["ctx"]["error"]))
        elif item["type"] == "value_error":
            lines.append(f"config key {key!r}: {item['ctx']['error']}")
        else:
            lines.append(f"config key {key!r}: {item['msg']}")
    return ConfigError(f"{source}: " + "; ".join(lines))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``algorithm.clip.high=0.28`` -> (["algorithm", "clip", "high"], 0.28) with YAML typing.

    Hydra's ``+key=value`` and ``++key=value`` (add, add or replace), which verl's scripts use,
    set the key as ``key=value`` does: every rlvr key exists with its default. Hydra's
    ``~key`` (remove) is refused: leaving a key out keeps its default."""
    if text.startswith("~"):
        raise ConfigError(
            f"override {text!r}: Hydra's ~key removes a key; rlvr's keys all have defaults, "
            f"so leave {text[1:].split('=', 1)[0]!r} out to keep its default"
        )
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.removeprefix("++").removeprefix("+")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({first}); a string that YAML "
            f"cannot read as it is goes in quotes: {key}='\"{raw}\"'"
        ) from None
    return key.strip().split("."), value


def _set_nested(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def deep_merge(base: dict, update: dict) -> dict:
    """Recursive dict merge; values of `update` win."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


RL_PRESETS = "rlvr.presets"
"""Package of the online-RL presets (`rlvr train --preset`)."""
PREFERENCE_PRESETS = "rlvr.presets.preference"
"""Package of the offline preference presets (`rlvr dpo --preset`)."""


def preset_names(package: str = RL_PRESETS) -> list[str]:
    """Names of the YAML presets shipped in `package` (the RL presets by default)."""
    folder = resources.files(package)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str, package: str = RL_PRESETS) -> dict:
    """The raw dict of a shipped preset (its `paper` and `description` keys removed)."""
    names = preset_names(package)
    if name not in names:
        elsewhere = {RL_PRESETS: PREFERENCE_PRESETS, PREFERENCE_PRESETS: RL_PRESETS}.get(package)
        if elsewhere and name in preset_names(elsewhere):
            command = "dpo" if elsewhere == PREFERENCE_PRESETS else "train"
            raise ConfigError(
                f"preset {name!r} is not one of this command's; it is `rlvr {command}`'s: "
                f"rlvr {command} --preset {name}"
            )
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint} (available: {', '.join(names)})")
    text = resources.files(package).joinpath(f"{name}.yaml").read_text()
    tree = yaml.safe_load(text) or {}
    tree.pop("paper", None)
    tree.pop("description", None)
    tree["preset"] = name
    return tree


def preset_info(name: str, package: str = RL_PRESETS) -> tuple[str, str]:
    """(description, paper) of a shipped preset, for `rlvr presets`."""
    text = resources.files(package).joinpath(f"{name}.yaml").read_text()
    tree = yaml.safe_load(text) or {}
    return str(tree.get("description", "")), str(tree.get("paper", ""))


def _read_yaml(path: Path) -> Any:
    """The YAML document of the file at `path`, or a one-line `ConfigError` naming the file
    and the line and column where the YAML breaks."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = [getattr(exc, "context", None), getattr(exc, "problem", None)]
        said = ": ".join(part for part in what if part) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML ({said})") from None


def build_config(
    model: type[BaseModel],
    config_path: str | Path | None = None,
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: dict | None = None,
    preset_package: str = RL_PRESETS,
) -> Any:
    """A `model` from, merged in order: `base`, the preset (of `preset_package`), the YAML file,
    then the dotted overrides; validated, or a `ConfigError` naming the source and the key.
    An override ``preset=NAME`` chooses the preset as `preset` does (set last, it would only
    rename the run)."""
    parsed = [parse_override(text) for text in overrides]
    for key, value in parsed:
        if key == ["preset"] and value is not None and "preset" in model.model_fields:
            if preset and str(value) != preset:
                raise ConfigError(f"--preset {preset} and preset={value}: give one preset")
            preset = str(value)
    tree: dict = dict(base or {})
    if preset:
        tree = deep_merge(tree, load_preset(preset, preset_package))
    source = "config"
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            hint = "" if path.suffix in (".yaml", ".yml") else "; a setting is written key=value"
            raise ConfigError(f"config file {str(path)!r} does not exist{hint}")
        loaded = _read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
        own = loaded.get("preset")
        if isinstance(own, str) and own != preset:
            try:
                own_preset = load_preset(own, preset_package)
            except ConfigError as exc:
                raise ConfigError(f"{path}: preset: {exc}") from None
            if preset:  # the file's changes to its own preset, made to the one asked for
                own_tree = model.model_validate(deep_merge(dict(base or {}), own_preset))
                loaded = changes_to(loaded, own_tree.model_dump(mode="json"))
            else:
                tree = deep_merge(tree, own_preset)
        tree = deep_merge(tree, loaded)
        source = str(path)
    for key, value in parsed:
        _set_nested(tree, key, value)
        source = f"{source} + overrides" if "overrides" not in source else source
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise _explain(exc, model, source) from None


def make_output_dir(path: Path, key: str) -> None:
    """``mkdir -p`` the directory `key` names, or a `ConfigError` naming the key and the reason
    (a file in the way, a parent that is a file, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{key}={str(path)!r}: cannot make the directory: {error}") from None


def save_config(config: BaseModel, path: Path) -> None:
    """Write the fully resolved config as YAML."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def load_saved_config(path: Path) -> dict | None:
    """The settings a `save_config` file holds, None where there is no file; YAML that cannot
    be read, or whose top level is not a mapping, is a `ConfigError` naming the file."""
    if not path.is_file():
        return None
    saved = _read_yaml(path)
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: not a saved config (its top level is not a mapping)")
    return saved


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        leaves.update(_leaves(value, f"{prefix}{key}" if not prefix else f"{prefix}.{key}"))
    return leaves


def changes_to(tree: dict, reference: dict) -> dict:
    """The settings of `tree` whose values differ from (or are absent in) `reference`.

    A config file that names its preset (a run's config.yaml names the one it was resolved
    from) is read, under another ``--preset``, as the changes it makes to its own preset: the
    run's task, model and budget apply on top of the preset asked for, whose algorithm
    settings the file's full copy of its own preset would otherwise all overwrite."""
    kept: dict = {}
    reference_leaves = _leaves(reference)
    for key, value in _leaves(tree).items():
        if key not in reference_leaves or reference_leaves[key] != value:
            _set_nested(kept, key.split("."), value)
    return kept


def changed_settings(saved: dict, config: BaseModel, ignore: tuple[str, ...] = ()) -> list[str]:
    """``key: old -> new`` for each setting of `config` that differs from the `saved` tree (a
    run's config.yaml), leaving out the keys in `ignore`."""
    before, after = _leaves(saved), _leaves(config.model_dump(mode="json"))
    return [
        f"{key}: {before.get(key)!r} -> {value!r}"
        for key, value in after.items()
        if key not in ignore and before.get(key) != value
    ]


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def describe_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default with its allowed range, docstring) for every leaf field, for
    `--help-config`: ``1.0 (> 0)``."""
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(describe_fields(annotation, prefix + name + "."))
        else:
            default = field.default if field.default_factory is None else field.default_factory()
            bounds = [
                f"{sign} {getattr(limit, attribute)}"
                for limit in field.metadata
                for attribute, sign in _BOUNDS.items()
                if hasattr(limit, attribute)
            ]
            shown = repr(default) + (f" ({', '.join(bounds)})" if bounds else "")
            rows.append((prefix + name, shown, field.description or ""))
    return rows
