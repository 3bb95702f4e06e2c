"""A/B of a decode step's products by the packed-panel kernel (`cpu_kernels.PanelStore`)
against PyTorch's BLAS, whatever `cpu_kernels.panels_pay` chooses on this CPU, in one process,
alternating, on the demo-shaped tiny model with 2 threads: the two rollouts of
`fused_ab.decode_cases` (16 prompts × 8 samples, up to 64 tokens), one engine per variant.
The rest of the step runs the C kernels in both. Reported: median seconds per rollout and the
paired speed-up of the panels, also written to `results/panels_ab.json`.

    python benchmarks/panels_ab.py
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from fused_ab import decode_ab, demo_setup

from rlvr.models import cpu_kernels

RESULTS = Path(__file__).parent / "results" / "panels_ab.json"
REPEATS = 7


def main() -> None:
    chosen = cpu_kernels.panels_pay
    tok, model, prompts = demo_setup()
    if cpu_kernels.load() is None:
        raise SystemExit("the CPU kernels could not be built (see the warning above)")

    def use(panels: bool):
        def switch_on() -> None:
            cpu_kernels.panels_pay = lambda: panels

        return switch_on

    try:
        report = decode_ab(tok, model, prompts, {"blas": use(False), "panels": use(True)}, REPEATS)
    finally:
        cpu_kernels.panels_pay = chosen
    report["cpu"] = {
        "machine": platform.machine(),
        "splits_512_bit_vectors": cpu_kernels.splits_512_bit_vectors(),
        "panels_pay": chosen(),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
