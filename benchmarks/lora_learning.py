"""Held-out pass@1 after 32 GRPO steps from the demo's cold-start SFT model, with full
fine-tuning and with LoRA adapters at several ranks and learning rates: the settings of
`tests/test_learning_presets.py` (32 prompts x 8 samples, pass@1 on 200 held-out problems at
k = 4), one run per arm, one after another.

    python benchmarks/lora_learning.py ["train.lr=1e-4" "model.lora.rank=8 train.lr=1e-3" ...]

Each argument is one arm, its overrides separated by spaces. The SFT model is built once
under runs/lora_learning/sft (600 steps, about 95 s on a 2-core VM).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from cold_start import cold_start

from rlvr.config import resolve_config
from rlvr.demo import DATA, RL
from rlvr.run_layout import latest_checkpoint
from rlvr.training.rl import train

ROOT = Path("runs/lora_learning")
ARMS = [
    "train.lr=1e-4",
    "model.lora.rank=8 train.lr=1e-3",
    "model.lora.rank=8 train.lr=1e-4",
    "model.lora.rank=32 train.lr=1e-3",
]
STEPS, PROMPTS = 32, 32


def main() -> None:
    sft_dir, pass_at_1 = cold_start(ROOT)
    print(f"cold start: pass@1 {pass_at_1(sft_dir):.3f}")
    for arm in sys.argv[1:] or ARMS:
        overrides = [
            *(f"data.{k}={v}" for k, v in DATA.items()),
            *RL,
            f"model.name_or_path={sft_dir}",
            f"train.output_dir={ROOT / arm.replace(' ', '_')}",
            f"train.steps={STEPS}",
            f"rollout.prompts_per_step={PROMPTS}",
            *arm.split(),
        ]
        shutil.rmtree(ROOT / arm.replace(" ", "_"), ignore_errors=True)  # no earlier checkpoints
        start = time.perf_counter()
        run_dir = train(resolve_config(preset="grpo", overrides=overrides), show_progress=False)
        seconds = time.perf_counter() - start
        after = pass_at_1(latest_checkpoint(run_dir))
        print(f"{arm}: pass@1 {after:.3f}, {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
