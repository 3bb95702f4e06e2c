"""Held-out accuracy of a preset's variants trained from the demo's cold start.

From the demo's cold start (its SFT model, 600 steps, built once under --out), each variant
(a name and overrides on top of the learning tests' settings: 32 prompts × 8 samples at
T = 1, lr 1e-4) trains `--steps` steps of `--preset` for each seed:

    python benchmarks/preset_learning.py --preset grpo --variant grpo \\
        --variant alpha-0.4 algorithm.entropy.advantage_alpha=0.4 --seeds 0 1 2
    python benchmarks/preset_learning.py --preset prorl \\
        --variant prorl rollout.samples_per_prompt=16 rollout.temperature=1.2 --seeds 0 1

prints, for each run, held-out pass@1 and pass@4 (k = 4, 200 problems), the training entropy
and, when logged, the entropy-based advantage's share (`entropy_advantage_ratio`) over the
last 4 steps, and writes `summary.json` under --out (`docs/algorithms.md`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cold_start import cold_start_scores, train_from

from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl


def last4(metrics: list[dict], key: str) -> float | None:
    values = [m[key] for m in metrics[-4:] if key in m]
    return round(sum(values) / len(values), 4) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="grpo")
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        metavar=("NAME", "KEY=VALUE"),
        help="a variant's name, then its overrides (repeat for each variant)",
    )
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_preset_learning"))
    args = parser.parse_args()
    variants = {name: overrides for name, *overrides in args.variant or [[args.preset]]}

    sft_dir, scores = cold_start_scores(args.out, ("pass@1", "pass@4"))
    summary: dict = {"cold_start": scores(sft_dir)}
    print(f"cold start {summary['cold_start']}", flush=True)
    for seed in args.seeds:
        for name, extra in variants.items():
            start = time.perf_counter()
            output_dir = args.out / f"{name}-{seed}"
            run_dir = train_from(sft_dir, args.preset, output_dir, args.steps, seed, *extra)
            metrics = read_jsonl(run_dir / "metrics.jsonl")
            result = scores(latest_checkpoint(run_dir))
            result["entropy_last4"] = last4(metrics, "entropy")
            result["entropy_advantage_ratio_last4"] = last4(metrics, "entropy_advantage_ratio")
            result["seconds"] = round(time.perf_counter() - start)
            summary[f"{name} seed {seed}"] = result
            print(f"{name} seed {seed}: {result}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
