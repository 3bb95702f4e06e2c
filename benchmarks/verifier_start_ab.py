"""A/B of the verifier's first call (its worker pool starting) at a git revision against the
working tree, in fresh processes alternating.

Each run is a fresh process whose main script imports torch at module level, as a training
script does, and times one `answers_match` that needs math-verify (``1+2`` against ``3``):
the fork server and its workers starting, then the call. Runs alternate revision / working
tree; reported: each side's seconds per run and medians, and the median of the paired
speed-ups, also written to `results/verifier_start_ab.json`.

    python benchmarks/verifier_start_ab.py --against 687922d
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch  # noqa: F401  (what makes re-running this script in a verifier process costly)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from revision_ab import alternate, publish  # noqa: E402


def worker() -> None:
    """Time the first verifier call in this process and print {"seconds", "rlvr"} as JSON."""
    import rlvr
    from rlvr.rewards.verify import answers_match

    start = time.perf_counter()
    if not answers_match("1+2", "3"):
        raise SystemExit("math-verify did not match 1+2 with 3")
    print(json.dumps({"seconds": time.perf_counter() - start, "rlvr": rlvr.__file__}))


def timed_run(src: Path) -> float:
    """Seconds of the first verifier call in a fresh process importing rlvr from `src`."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "2"}
    command = [sys.executable, __file__, "--worker"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not result["rlvr"].startswith(str(src)):
        raise SystemExit(f"the worker imported {result['rlvr']}, not rlvr from {src}")
    return result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", metavar="REV", help="the baseline revision")
    parser.add_argument("--rounds", type=int, default=6, help="alternating runs per side")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    report = {
        "command": " ".join(["python benchmarks/verifier_start_ab.py", *sys.argv[1:]]),
        **alternate(args.against, timed_run, args.rounds),
    }
    publish("first verifier call", report, "verifier_start_ab.json")


if __name__ == "__main__":
    main()
