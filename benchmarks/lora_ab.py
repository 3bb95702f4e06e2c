"""RL step time with LoRA adapters on the fused forward vs on the `transformers` forward, with
full fine-tuning on each for reference; in one process, the arms alternating round by round.

The demo's RL step (32 prompts x 8 samples, 48 new tokens, GRPO) from its cold-start SFT model
(`make demo` writes it to runs/demo/sft), fp32, 2 threads; medians of `rlvr bench`'s timed
steps over all rounds.

    python benchmarks/lora_ab.py [--model runs/demo/sft] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlvr.config import resolve_config
from rlvr.demo import DATA, RL
from rlvr.training.bench import PHASES, run_bench

RESULTS = Path(__file__).parent / "results" / "lora_ab.json"
ARMS = {
    "full, fused": [],
    "full, transformers": ["model.fused_forward=false"],
    "lora r8, fused": ["model.lora.rank=8"],
    "lora r8, transformers": ["model.lora.rank=8", "model.fused_forward=false"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/demo/sft")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model there (run `make demo` first, or pass --model)")
    common = [
        *(f"data.{k}={v}" for k, v in DATA.items()),
        *RL,
        f"model.name_or_path={args.model}",
        "train.threads=2",
    ]
    steps: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for round_ in range(args.rounds):
        for arm, extra in ARMS.items():
            cfg = resolve_config(preset="grpo", overrides=[*common, *extra])
            result = run_bench(cfg, steps=5, warmup=1)
            steps[arm] += result["per_step"]
            print(f"round {round_ + 1} {arm}: {result['time/step']:.3f} s/step", flush=True)
    summary = {
        arm: {key: statistics.median(s[key] for s in rows) for key in PHASES}
        for arm, rows in steps.items()
    }
    base = summary["lora r8, transformers"]["time/step"]
    print(f"\n{'arm':24} {'rollout':>8} {'train':>8} {'step':>8} {'vs lora/tf':>10}")
    for arm, row in summary.items():
        print(
            f"{arm:24} {row['time/rollout']:8.3f} {row['time/train']:8.3f} "
            f"{row['time/step']:8.3f} {base / row['time/step']:9.2f}x"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"model": args.model, "medians": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
