"""A/B of the C kernels for a decode step (`rlvr.models.cpu_kernels`: RMSNorm, rotary
embedding, SiLU·up and attention, one pass each) against the same step in PyTorch operations
(`RLVR_CPU_KERNELS=0`), in one process, alternating, on the demo-shaped tiny model with 2
threads; one engine per variant runs every rollout, as in training.

Two rollouts of 16 prompts × 8 samples, up to 64 tokens (`fused_ab.decode_cases`): every
completion forced to 64 tokens, and rows leaving the batch at many steps. Reported: median
seconds per rollout, median minor page faults and the paired speed-up. (That both variants
sample the same tokens is tested in `tests/test_cpu_kernels.py`.)

    python benchmarks/cpu_kernels_ab.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fused_ab import decode_ab, demo_setup

from rlvr.models import cpu_kernels

RESULTS = Path(__file__).parent / "results" / "cpu_kernels_ab.json"
REPEATS = 12


def main() -> None:
    tok, model, prompts = demo_setup()
    if cpu_kernels.load() is None:
        raise SystemExit("the CPU kernels could not be built (see the warning above)")

    def switch(value: str):
        return lambda: os.environ.__setitem__(cpu_kernels.DISABLE_ENV, value)

    before = os.environ.get(cpu_kernels.DISABLE_ENV)
    try:
        variants = {"torch": switch("0"), "kernels": switch("1")}
        report = decode_ab(tok, model, prompts, variants, REPEATS)
    finally:
        if before is None:
            os.environ.pop(cpu_kernels.DISABLE_ENV, None)
        else:
            os.environ[cpu_kernels.DISABLE_ENV] = before
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
