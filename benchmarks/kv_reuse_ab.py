"""A/B of the decode cache's memory kept between rollouts (`fused.BufferPool`, what the rollout
engine does on a CPU) against a fresh cache per rollout (the implementation before it), in one
process, alternating, on the demo-shaped tiny model with 2 threads; one engine per variant runs
every rollout, as in training.

Two rollouts of 16 prompts × 8 samples, up to 64 tokens: every completion forced to 64 tokens,
and two frequent tokens ending a completion, so rows leave the batch at many steps. Reported:
median seconds per rollout, median minor page faults per rollout, and the paired speed-up.

    python benchmarks/kv_reuse_ab.py
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path

import torch
from fused_ab import decode_cases, demo_setup

from rlvr.models import fused
from rlvr.rollout.hf import HFRolloutEngine

RESULTS = Path(__file__).parent / "results" / "kv_reuse_ab.json"
REPEATS = 12


def fresh_empty(
    self: fused.BufferPool, key: tuple, like: torch.Tensor, shape: tuple
) -> torch.Tensor:
    """A pool that keeps nothing: every buffer newly allocated."""
    return like.new_empty(shape)


def main() -> None:
    tok, model, prompts = demo_setup()
    cases = decode_cases(tok)
    variants = {"pool": fused.BufferPool.empty, "fresh": fresh_empty}
    report = {}
    for name, (eos, params) in cases.items():
        engines = {
            v: HFRolloutEngine(model, eos, tok.pad_token_id, generator=torch.Generator())
            for v in variants
        }
        times: dict[str, list[float]] = {v: [] for v in variants}
        faults: dict[str, list[int]] = {v: [] for v in variants}
        for i in range(REPEATS + 1):  # the first round warms up
            for variant, method in variants.items():
                fused.BufferPool.empty = method
                engine = engines[variant]
                engine.generator.manual_seed(i)
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                engine.generate(prompts, params)
                if i:
                    times[variant].append(time.perf_counter() - start)
                    faults[variant].append(
                        resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
                    )
        fused.BufferPool.empty = variants["pool"]
        report[name] = {
            **{f"{v} s": statistics.median(t) for v, t in times.items()},
            **{f"{v} minor faults": statistics.median(f) for v, f in faults.items()},
            "speedup (paired median)": statistics.median(
                f / p for f, p in zip(times["fresh"], times["pool"])
            ),
        }
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in report[name].items()), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
