"""Reward registry: names → reward functions with TRL's signature.

A reward function is ``f(prompts: list[str], completions: list[str], **columns) -> list[float]``
where each column (``answer=[...]``, ``numbers=[...]``) is a list aligned with `completions`;
this is the signature of TRL's ``reward_funcs``, so users can bring theirs unchanged. The
composer also passes TRL's ``trainer_state``, ``log_metric`` and ``log_extra`` keywords
(`rlvr.rewards.compose`).

`get_reward` resolves a registered name, a ``"package.module:function"`` import path or a
``"path/to/file.py:function"`` file path (verl's `custom_reward_function`).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from rlvr.algorithms.registry import same_definition

RewardFn = Callable[..., list[Any]]
"""``f(prompts, completions, **columns) -> list[float]`` (TRL's reward-function signature)."""

_REGISTRY: dict[str, RewardFn] = {}

TASK_VERIFIER = "verifier"
"""The name that stands, in ``reward.functions``, for the task's own correctness reward
(``math`` for arithmetic, gsm8k and math, ``countdown`` for countdown), so that a preset can
weigh it whatever the task; no reward may be registered under it."""


class UnknownRewardError(KeyError):
    """A reward name that is neither registered nor an importable ``module:function`` path."""

    def __str__(self) -> str:  # KeyError would show the message with quotes around it
        return str(self.args[0]) if self.args else ""


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under `name`; a name taken by another function
    is a ValueError, and the same definition run again (`same_definition`) replaces it."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and not same_definition(_REGISTRY[name], fn):
            raise ValueError(f"a reward named {name!r} is already registered ({_REGISTRY[name]!r})")
        if ":" in name:
            raise ValueError(f"reward name {name!r} may not contain ':' (used for import paths)")
        if name == TASK_VERIFIER:
            raise ValueError(f"the reward name {name!r} stands for the task's own verifier")
        _REGISTRY[name] = fn
        return fn

    return decorator


def list_rewards() -> list[str]:
    """The registered reward names, sorted."""
    return sorted(_REGISTRY)


def _load_file(path: str, reward: str) -> ModuleType:
    """The Python file at `path` as a module (verl's `custom_reward_function.path`), loaded
    once under a name of its own."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise UnknownRewardError(f"reward {reward!r}: no Python file {path!r}")
    name = f"rlvr_reward_file_{hashlib.sha1(str(file).encode()).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as exc:
        del sys.modules[name]
        message = f"reward {reward!r}: loading {path!r} failed: {type(exc).__name__}: {exc}"
        raise UnknownRewardError(message) from exc
    return module


def _import_reward(path: str) -> RewardFn:
    """The function named by ``"package.module:function"`` or ``"path/to/file.py:function"``."""
    module_name, _, attribute = path.rpartition(":")
    if not module_name or not attribute:
        raise UnknownRewardError(
            f"reward import path {path!r} must look like 'package.module:fn' or 'file.py:fn'"
        )
    if module_name.endswith(".py"):
        module = _load_file(module_name, path)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            message = f"cannot import module {module_name!r} of reward {path!r}: {exc}"
            raise UnknownRewardError(message) from exc
    fn: Any = module
    for part in attribute.split("."):
        if not hasattr(fn, part):
            raise UnknownRewardError(f"module {module_name!r} has no attribute {attribute!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise UnknownRewardError(f"reward {path!r} is not callable")
    return fn


def get_reward(name: str) -> RewardFn:
    """The reward function registered as `name`, or imported from ``"package.module:function"``.

    Raises `UnknownRewardError` (a KeyError) naming the closest registered name otherwise.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        return _import_reward(name)
    valid = list_rewards()
    closest = difflib.get_close_matches(name, valid, n=1, cutoff=0.0)
    hint = f"; did you mean {closest[0]!r}?" if closest else "."
    raise UnknownRewardError(
        f"unknown reward {name!r}{hint} Registered rewards: {', '.join(valid)}; "
        "a custom reward is given as 'package.module:function' or 'path/to/file.py:function'."
    )
