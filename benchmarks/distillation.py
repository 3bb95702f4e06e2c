"""On-policy distillation on the tiny default task: a student closing on a GRPO-trained teacher.

From the demo's cold start (its SFT model, 600 steps), the teacher is the
cold start after `--teacher-steps` GRPO steps; each `--discounts` value then trains the cold
start with the `opd` preset (the teacher's per-token term alone) for `--steps` steps; a
GRPO run of the same length from the cold start is the reference, and GRPO with the teacher's
term added (`algorithm.distill.outcome_weight` 1, the default) the mix of the two.

    python benchmarks/distillation.py [--teacher-steps 24] [--steps 24] [--discounts 0 1]
        [--seeds 0] [--out DIR]

prints pass@1 (k = 4, 200 held-out problems) of the cold start, the teacher and each run,
with each distillation run's reverse KL at its first and last steps, and writes
`summary.json` under --out (`docs/algorithms.md`, "On-policy distillation").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cold_start import cold_start, train_from

from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher-steps", type=int, default=24)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--discounts", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_distillation"))
    args = parser.parse_args()

    sft_dir, cold_pass_at_1 = cold_start(args.out)

    def pass_at_1(model_dir: Path) -> float:
        return round(cold_pass_at_1(model_dir), 4)

    def run(name: str, preset: str, steps: int, seed: int, *more: str) -> Path:
        return train_from(sft_dir, preset, args.out / name, steps, seed, *more)

    summary: dict = {"cold_start": pass_at_1(sft_dir)}
    teacher = latest_checkpoint(run("teacher", "grpo", args.teacher_steps, 0))
    summary["teacher"] = pass_at_1(teacher)
    print(f"cold start {summary['cold_start']}  teacher {summary['teacher']}", flush=True)
    for seed in args.seeds:
        start = time.perf_counter()
        same = seed == 0 and args.steps == args.teacher_steps  # the teacher's own run
        grpo = args.out / "teacher" if same else run(f"grpo-{seed}", "grpo", args.steps, seed)
        summary[f"grpo seed {seed}"] = pass_at_1(latest_checkpoint(grpo))
        print(f"grpo seed {seed}: {summary[f'grpo seed {seed}']}", flush=True)
        for gamma in args.discounts:
            name = f"opd-g{gamma:g}-{seed}"
            opd = run(
                name,
                "opd",
                args.steps,
                seed,
                f"algorithm.distill.teacher={teacher}",
                f"algorithm.distill.discount={gamma}",
            )
            kl = [m["distill/reverse_kl"] for m in read_jsonl(opd / "metrics.jsonl")]
            summary[name] = {
                "pass@1": pass_at_1(latest_checkpoint(opd)),
                "reverse_kl_first": round(kl[0], 4),
                "reverse_kl_last4": round(sum(kl[-4:]) / len(kl[-4:]), 4),
            }
            print(f"{name}: {summary[name]}", flush=True)
        mixed = run(
            f"grpo+teacher-{seed}", "grpo", args.steps, seed, f"algorithm.distill.teacher={teacher}"
        )
        summary[f"grpo+teacher seed {seed}"] = pass_at_1(latest_checkpoint(mixed))
        print(f"grpo+teacher seed {seed}: {summary[f'grpo+teacher seed {seed}']}", flush=True)
        print(f"seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
