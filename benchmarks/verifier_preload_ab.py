"""A/B of the verifier fork server's preload (`rlvr/rewards/_verifier_preload.py`): workers
forked from the current fork server (math-verify ready; since lever 16 no verifier process
runs the parent's main script, lever 9 ran it once in the fork server), against workers that
each re-run the main script before their first task (the fork server preloading only
math-verify, as before lever 9).

rlvr alone, the dense systems-mode batch (16 prompts × 8 samples, 64 forced tokens, 8 steps;
the verifier still runs for the `accuracy` metric), runs alternating in fresh processes whose
main script imports torch, as `vs_trl.py`'s workers do. Reported per run: step 1, step 2, the
sum of the 8 steps and the median of steps 2-8.

    python benchmarks/verifier_preload_ab.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from vs_trl import RESULTS_DIR, THREADS, ModeSettings, make_spec, prepare_model, quiet, worker

VARIANTS = ("workers re-run the script", "the current preload")
SETTINGS = ModeSettings(
    steps=8, prompts_per_step=16, samples_per_prompt=8, max_new_tokens=64, lr=1e-4, reward="dense"
)


def math_verify_only() -> multiprocessing.context.BaseContext:
    """The verifier's fork-server context before the preload module: math-verify only."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["math_verify"])
    return ctx


def run_variant(variant: str, spec_path: Path) -> None:
    """The worker process: one rlvr run, with the old fork-server context if asked."""
    if variant == VARIANTS[0]:
        from rlvr.rewards import verify

        verify._context = math_verify_only
    worker(spec_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per variant")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_variant(args.worker[0], Path(args.worker[1]))
        return
    quiet()
    report: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory(prefix="verifier_preload_ab-") as tmp:
        workdir = Path(tmp)
        model_dir = prepare_model(workdir, 0)
        for rep in range(args.repeats):
            for i, variant in enumerate(VARIANTS):
                spec = make_spec("rlvr", f"v{i}-{rep}", workdir, model_dir, SETTINGS)
                spec_path = workdir / f"spec-v{i}-{rep}.json"
                spec_path.write_text(json.dumps(asdict(spec)))
                cmd = [sys.executable, __file__, "--worker", variant, str(spec_path)]
                subprocess.run(cmd, check=True, env=env)
                result = json.loads(Path(spec.result_path).read_text())
                steps = [s["step_s"] for s in result["steps"]]
                row = {
                    "step_1_s": steps[0],
                    "step_2_s": steps[1],
                    "total_s": sum(steps),
                    "median_2_8_s": statistics.median(steps[1:]),
                    "steps_s": steps,
                }
                report[variant].append(row)
                cells = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "steps_s")
                print(f"{variant}: {cells}", flush=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "verifier_preload_ab.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
