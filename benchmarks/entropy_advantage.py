"""The entropy-based advantage (Cheng et al. 2025) against plain GRPO on the tiny default task.

From the demo's cold start (its SFT model, 600 steps), each `--alphas` value trains `--steps`
steps of `--preset` with `algorithm.entropy.advantage_alpha` set to it (0 = the preset as it
is; the paper's κ = 2):

    python benchmarks/entropy_advantage.py [--steps 16] [--seeds 0 1 2] [--alphas 0 0.4]

prints, for each run, held-out pass@1 and pass@4 (k = 4, 200 problems), the training entropy
and the term's share of the advantages (`entropy_advantage_ratio`) over the last 4 steps, and
writes `summary.json` under --out (`docs/algorithms.md`, "Entropy").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cold_start import cold_start_evaluation

from rlvr.config import resolve_config
from rlvr.demo import DATA, RL
from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train

PROMPTS = 32


def last4(metrics: list[dict], key: str) -> float:
    values = [m.get(key, 0.0) for m in metrics[-4:]]
    return round(sum(values) / len(values), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.4])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_entropy_advantage"))
    args = parser.parse_args()

    sft_dir, evaluation = cold_start_evaluation(args.out)

    def scores(model_dir: Path) -> dict:
        result = evaluation(model_dir)
        return {key: round(result[key], 4) for key in ("pass@1", "pass@4")}

    summary: dict = {"cold_start": scores(sft_dir)}
    print(f"cold start {summary['cold_start']}", flush=True)
    for seed in args.seeds:
        for alpha in args.alphas:
            start = time.perf_counter()
            name = f"{args.preset} alpha {alpha} seed {seed}"
            overrides = [
                *(f"data.{k}={v}" for k, v in DATA.items()),
                *RL,
                f"model.name_or_path={sft_dir}",
                f"rollout.prompts_per_step={PROMPTS}",
                f"train.steps={args.steps}",
                f"train.seed={seed}",
                f"train.output_dir={args.out / name.replace(' ', '-')}",
                f"algorithm.entropy.advantage_alpha={alpha}",
            ]
            cfg = resolve_config(preset=args.preset, overrides=overrides)
            run_dir = train(cfg, show_progress=False)
            metrics = read_jsonl(run_dir / "metrics.jsonl")
            result = scores(latest_checkpoint(run_dir))
            result["entropy_last4"] = last4(metrics, "entropy")
            result["ratio_last4"] = last4(metrics, "entropy_advantage_ratio")
            result["seconds"] = round(time.perf_counter() - start)
            summary[name] = result
            print(f"{name}: {result}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
