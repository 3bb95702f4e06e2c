"""GFPO against GRPO on the tiny default task: accuracy and response length.

From the demo's cold start (its SFT model, 600 steps, whose worked solutions
are half shortcuts), each variant trains `--steps` steps with the `gfpo` preset's loss
(GRPO's clipped loss, token-level, no KL), differing only in how many samples a prompt it
draws and keeps:

- `grpo-8`: 8 samples, all trained on (the baseline GFPO is measured against);
- `grpo-16`: 16 samples, all trained on (the extra sampling without the filter);
- `gfpo-length`: 16 samples, the 8 shortest trained on (the preset);
- `gfpo-efficiency`: 16 samples, the 8 of most reward per token trained on.

    python benchmarks/gfpo.py [--steps 24] [--seeds 0] [--out DIR]

prints, for each run, held-out pass@1 (k = 4, 200 problems) and the mean held-out response
length, with the training samples' mean length over the last 4 steps, and writes
`summary.json` under --out (`docs/algorithms.md`, "Filters and shaping").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cold_start import cold_start_scores, train_from

from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl

VARIANTS = {
    "grpo-8": ["rollout.samples_per_prompt=8", "algorithm.group_filter.keep=0"],
    "grpo-16": ["rollout.samples_per_prompt=16", "algorithm.group_filter.keep=0"],
    "gfpo-length": ["rollout.samples_per_prompt=16"],
    "gfpo-efficiency": [
        "rollout.samples_per_prompt=16",
        "algorithm.group_filter.by=token_efficiency",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("runs/bench_gfpo"))
    args = parser.parse_args()

    sft_dir, scores = cold_start_scores(args.out, ("pass@1", "response_length/mean"))
    summary: dict = {"cold_start": scores(sft_dir)}
    print(f"cold start {summary['cold_start']}", flush=True)
    for seed in args.seeds:
        for name in args.variants:
            start = time.perf_counter()
            output_dir = args.out / f"{name}-{seed}"
            run_dir = train_from(sft_dir, "gfpo", output_dir, args.steps, seed, *VARIANTS[name])
            last = read_jsonl(run_dir / "metrics.jsonl")[-4:]
            result = scores(latest_checkpoint(run_dir))
            result["train_length_last4"] = round(
                sum(m["response_length/mean"] for m in last) / len(last), 2
            )
            result["seconds"] = round(time.perf_counter() - start)
            summary[f"{name} seed {seed}"] = result
            print(f"{name} seed {seed}: {result}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
