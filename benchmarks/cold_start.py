"""The demo's cold-start SFT model, a held-out pass@1 scorer and an RL run from the model with
the learning tests' settings, shared by the benchmarks that train from it (`lora_learning.py`,
`data_parallel.py`, `distillation.py`, `gfpo.py`, `preset_learning.py`, `certainty.py`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlvr.config import resolve_config
from rlvr.data.tasks import load_task
from rlvr.demo import DATA, RL, RL_STEPS, demo_configs, evaluate_model_dir
from rlvr.training.rl import train
from rlvr.training.sft import run_sft

PROBLEMS, K = 200, 4
"""Held-out problems and samples per problem: `tests/test_learning_presets.py`'s evaluation."""
PROMPTS = 32
"""Prompts a step: the learning tests'."""


def cold_start_evaluation(root: Path, sft_steps: int = 600) -> tuple[Path, Callable[[Path], dict]]:
    """(the SFT model under `root/sft`, built once with the demo's 600 steps, about 95 s on a
    2-core VM, or `sft_steps`; the held-out evaluation of a model folder: pass@1, lengths, ...)."""
    sft_cfg, rl_cfg = demo_configs(root, sft_steps=sft_steps, rl_steps=RL_STEPS)
    sft_dir = root / "sft"
    if not (sft_dir / "config.json").is_file():
        run_sft(sft_cfg)
    task = load_task(rl_cfg.data)
    held_out = task.test[:PROBLEMS]
    small = rl_cfg.model_copy(update={"eval": rl_cfg.eval.model_copy(update={"k": K})})

    def evaluation(model_dir: Path) -> dict:
        return evaluate_model_dir(model_dir, small, held_out, task.reward)

    return sft_dir, evaluation


def cold_start_scores(root: Path, keys: tuple[str, ...]) -> tuple[Path, Callable[[Path], dict]]:
    """(the SFT model of `cold_start_evaluation`; a model folder's held-out `keys`, each
    rounded to 4 places)."""
    sft_dir, evaluation = cold_start_evaluation(root)

    def scores(model_dir: Path) -> dict:
        result = evaluation(model_dir)
        return {key: round(result[key], 4) for key in keys}

    return sft_dir, scores


def cold_start(root: Path) -> tuple[Path, Callable[[Path], float]]:
    """(the SFT model of `cold_start_evaluation`; pass@1 of a model folder on the held-out
    problems)."""
    sft_dir, evaluation = cold_start_evaluation(root)
    return sft_dir, lambda model_dir: evaluation(model_dir)["pass@1"]


def train_from(
    sft_dir: Path, preset: str, output_dir: Path, steps: int, seed: int, *more: str
) -> Path:
    """The run directory of `steps` steps of `preset` from the model in `sft_dir` with the
    demo's data and RL settings at `PROMPTS` prompts a step, then the overrides `more`."""
    overrides = [
        *(f"data.{k}={v}" for k, v in DATA.items()),
        *RL,
        f"model.name_or_path={sft_dir}",
        f"rollout.prompts_per_step={PROMPTS}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"train.output_dir={output_dir}",
        *more,
    ]
    return train(resolve_config(preset=preset, overrides=overrides), show_progress=False)
