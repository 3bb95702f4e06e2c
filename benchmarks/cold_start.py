"""The demo's cold-start SFT model and a held-out pass@1 scorer, shared by the benchmarks that
train from it (`lora_learning.py`, `data_parallel.py`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlvr.data.tasks import load_task
from rlvr.demo import RL_STEPS, demo_configs, evaluate_model_dir
from rlvr.training.sft import run_sft

PROBLEMS, K = 200, 4
"""Held-out problems and samples per problem: `tests/test_learning_presets.py`'s evaluation."""


def cold_start(root: Path) -> tuple[Path, Callable[[Path], float]]:
    """(the SFT model under `root/sft`, built once with the demo's 600 steps, about 95 s on a
    2-core VM; pass@1 of a model folder on the held-out problems)."""
    sft_cfg, rl_cfg = demo_configs(root, sft_steps=600, rl_steps=RL_STEPS)
    sft_dir = root / "sft"
    if not (sft_dir / "config.json").is_file():
        run_sft(sft_cfg)
    task = load_task(rl_cfg.data)
    held_out = task.test[:PROBLEMS]
    small = rl_cfg.model_copy(update={"eval": rl_cfg.eval.model_copy(update={"k": K})})

    def pass_at_1(model_dir: Path) -> float:
        return evaluate_model_dir(model_dir, small, held_out, task.reward)["pass@1"]

    return sft_dir, pass_at_1
