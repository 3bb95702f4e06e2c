"""A/B of the decode cache's memory kept between rollouts (`kv_cache.BufferPool`, what the rollout
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
from pathlib import Path

import torch
from fused_ab import decode_ab, demo_setup

from rlvr.models import kv_cache

RESULTS = Path(__file__).parent / "results" / "kv_reuse_ab.json"
REPEATS = 12


def fresh_empty(
    self: kv_cache.BufferPool, key: tuple, like: torch.Tensor, shape: tuple
) -> torch.Tensor:
    """A pool that keeps nothing: every buffer newly allocated."""
    return like.new_empty(shape)


def main() -> None:
    tok, model, prompts = demo_setup()
    pool_empty = kv_cache.BufferPool.empty

    def switch(method):
        return lambda: setattr(kv_cache.BufferPool, "empty", method)

    variants = {"fresh": switch(fresh_empty), "pool": switch(pool_empty)}
    try:
        report = decode_ab(tok, model, prompts, variants, REPEATS)
    finally:
        kv_cache.BufferPool.empty = pool_empty
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
