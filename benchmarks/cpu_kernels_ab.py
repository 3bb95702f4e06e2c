"""A/B of the C kernels for a decode step (`rlvr.models.cpu_kernels`: RMSNorm, rotary
embedding, SiLU·up and attention, one pass each) against the same step in PyTorch operations
(`RLVR_CPU_KERNELS=0`), in one process, alternating, on the demo-shaped tiny model with 2
threads; one engine per variant runs every rollout, as in training.

With `--against REV`, the kernels of the git revision REV (its `cpu_kernels.c`, built with
the same flags) are a third variant and the baseline of the speed-ups, so that a change to the
kernels is measured against the kernels it replaces, in the same process.

Two rollouts of 16 prompts × 8 samples, up to 64 tokens (`fused_ab.decode_cases`): every
completion forced to 64 tokens, and rows leaving the batch at many steps. Reported: median
seconds per rollout, median minor page faults and the paired speed-up. (That both variants
sample the same tokens is tested in `tests/test_cpu_kernels.py`.)

    python benchmarks/cpu_kernels_ab.py [--against HEAD~1]

REV must be from lever 52 on: `decode_attention`'s arguments changed there.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from fused_ab import decode_ab, demo_setup

from rlvr.models import cpu_kernels

RESULTS = Path(__file__).parent / "results" / "cpu_kernels_ab.json"
REPEATS = 12
REPO = Path(__file__).resolve().parent.parent


def library_at(revision: str, scratch: Path) -> ctypes.CDLL:
    """The kernels of `revision`'s `cpu_kernels.c`, built like the current ones."""
    relative = cpu_kernels.SOURCE.relative_to(REPO)
    source = subprocess.run(
        ["git", "show", f"{revision}:{relative.as_posix()}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    if "prompt_of" not in source:
        raise SystemExit(
            f"{revision}'s decode_attention takes the arguments it had before lever 52 (the "
            "prompts' keys read in place); compare against a revision from lever 52 on"
        )
    path = scratch / "cpu_kernels.c"
    path.write_text(source)
    return cpu_kernels.open_library(cpu_kernels.build(os.environ.get("CC", "cc"), scratch, path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="also time the kernels of REV")
    args = parser.parse_args()
    tok, model, prompts = demo_setup()
    current = cpu_kernels.load()
    if current is None:
        raise SystemExit("the CPU kernels could not be built (see the warning above)")
    chosen = {"library": current}
    init = cpu_kernels.DecodeOps.__init__

    def init_with_chosen(self, visible, panels=None) -> None:
        init(self, visible, panels)
        self.lib = chosen["library"]

    def use(disable: str, library: ctypes.CDLL) -> Callable[[], None]:
        def switch_on() -> None:
            os.environ[cpu_kernels.DISABLE_ENV] = disable
            chosen["library"] = library

        return switch_on

    before = os.environ.get(cpu_kernels.DISABLE_ENV)
    cpu_kernels.DecodeOps.__init__ = init_with_chosen
    try:
        with tempfile.TemporaryDirectory() as scratch:
            variants = {"torch": use("0", current), "kernels": use("1", current)}
            if args.against:  # the baseline of the paired speed-ups
                older = use("1", library_at(args.against, Path(scratch)))
                variants = {f"kernels at {args.against}": older, **variants}
            report = decode_ab(tok, model, prompts, variants, REPEATS)
    finally:
        cpu_kernels.DecodeOps.__init__ = init
        if before is None:
            os.environ.pop(cpu_kernels.DISABLE_ENV, None)
        else:
            os.environ[cpu_kernels.DISABLE_ENV] = before
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
