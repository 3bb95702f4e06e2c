"""One AdamW step three ways: PyTorch's default, which `build_optimizer` uses (the per-tensor
loop for CPU parameters, `foreach` for CUDA ones), the `foreach` implementation and the fused
kernel; in one process, alternating, on the demo-shaped tiny model (1.9M parameters) and the
~110M shape of `gpu.py`, fp32, 2 threads.

    python benchmarks/optimizer_ab.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from gpu import SHAPES

from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer

RESULTS = Path(__file__).parent / "results" / "optimizer_ab.json"
ROUNDS = 5


def step_seconds(optimizer: torch.optim.Optimizer, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    torch.set_num_threads(2)
    models = {
        "tiny (demo shape)": (
            build_tiny_model(
                build_tiny_tokenizer(), hidden_size=192, intermediate_size=576, num_layers=4
            ),
            50,
        ),
        "100m": (SHAPES["100m"](), 3),
    }
    report = {}
    for name, (model, steps) in models.items():
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        variants = {
            "default": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "foreach": torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True),
            "fused": torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for opt in variants.values():
            opt.step()  # allocate the moments
        for _ in range(ROUNDS):
            for variant, opt in variants.items():
                times[variant].append(step_seconds(opt, steps))
        ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        entry = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "default_ms": ms["default"],
            "foreach_ms": ms["foreach"],
            "fused_ms": ms["fused"],
            "fused_speedup": ms["default"] / ms["fused"],
        }
        report[name] = entry
        print(name, json.dumps(entry), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
