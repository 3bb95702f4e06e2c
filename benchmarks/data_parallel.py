"""One process against torchrun's data-parallel ranks, on the demo's GRPO step: step time and
held-out pass@1 after the same number of steps.

    python benchmarks/data_parallel.py [--steps 32] [--rounds 2] [--ranks 2]

Each round runs `rlvr train` twice, one arm after the other, from the demo's cold-start SFT
model (built once under runs/data_parallel/sft, about 95 s on a 2-core VM) with the same preset,
prompts per step, seed and steps:
- `one`: one process, `train.threads=RANKS`;
- `ranks`: `torchrun --standalone --nproc_per_node=RANKS -m rlvr train`, one thread a rank.
Reported per arm: the median over all steps of `time/step`, `time/rollout` and `time/train`
(from metrics.jsonl, so process start-up is left out), and each run's held-out pass@1 (200
problems, k = 4), against the cold start's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from cold_start import cold_start

from rlvr.demo import DATA, RL
from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl

ROOT = Path("runs/data_parallel")
PROMPTS = 32
TIMES = ("time/step", "time/rollout", "time/train")


def run(arm: str, ranks: int, steps: int, out: Path) -> Path:
    """One `rlvr train` of `arm` into `out`."""
    overrides = [
        "--preset",
        "grpo",
        *(f"data.{k}={v}" for k, v in DATA.items()),
        *RL,
        f"model.name_or_path={ROOT / 'sft'}",
        f"train.output_dir={out}",
        f"train.steps={steps}",
        f"rollout.prompts_per_step={PROMPTS}",
        "eval.every_steps=0",
    ]
    if arm == "one":
        command = [sys.executable, "-m", "rlvr", "train", *overrides, f"train.threads={ranks}"]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command = [*launcher, f"--nproc_per_node={ranks}", "-m", "rlvr", "train", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    shutil.rmtree(out, ignore_errors=True)  # no checkpoint of an earlier, longer run
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    sft_dir, pass_at_1 = cold_start(ROOT)
    print(f"cold start: pass@1 {pass_at_1(sft_dir):.3f}")
    times: dict[str, dict[str, list[float]]] = {"one": {}, "ranks": {}}
    scores: dict[str, list[float]] = {"one": [], "ranks": []}
    for round_ in range(args.rounds):
        for arm in ("one", "ranks"):
            out = run(arm, args.ranks, args.steps, ROOT / f"{arm}-{round_}")
            for record in read_jsonl(out / "metrics.jsonl"):
                for key in TIMES:
                    times[arm].setdefault(key, []).append(record[key])
            scores[arm].append(pass_at_1(latest_checkpoint(out)))
            print(f"round {round_} {arm}: pass@1 {scores[arm][-1]:.3f}", flush=True)
    print(f"\n| arm | {' | '.join(TIMES)} | pass@1 after {args.steps} steps |")
    print("|---|" + "---|" * (len(TIMES) + 1))
    for arm, label in (("one", "1 process"), ("ranks", f"{args.ranks} ranks")):
        medians = " | ".join(f"{statistics.median(times[arm][key]):.3f}" for key in TIMES)
        print(f"| {label} | {medians} | {', '.join(f'{s:.3f}' for s in scores[arm])} |")
    one, many = (statistics.median(times[arm]["time/step"]) for arm in ("one", "ranks"))
    print(f"\n{args.ranks} ranks: {one / many:.2f}x the steps per second of one process")


if __name__ == "__main__":
    main()
