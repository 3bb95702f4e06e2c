"""A/B of the decode cache's row selection, in one process, alternating: `kv_cache.select_rows`
(copy only the filled positions; compact dropped rows in place) against indexing the whole
buffer (`buffer[rows]`, the implementation before it), on the demo-shaped tiny model with 2
threads.

Two rollouts of 16 prompts × 8 samples, up to 64 tokens: one with every completion forced to
64 tokens (the cache is only repeated after the prefill) and one where two frequent tokens end
a completion, so rows leave the batch at many different steps. Since lever 52 a CPU rollout
no longer repeats a prompt's cache for its samples (`kv_cache.SharedPromptKV`), so the selection
moves only the rows' own positions, and the forced case, whose rows never leave, selects
nothing (1.00×).

    python benchmarks/kv_select_ab.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from fused_ab import decode_cases, demo_setup

from rlvr.models import kv_cache
from rlvr.rollout.hf import HFRolloutEngine

RESULTS = Path(__file__).parent / "results" / "kv_select_ab.json"
REPEATS = 10


def whole_buffer_select(self: kv_cache.BufferKV, indices: torch.Tensor) -> None:
    """The previous `BufferKV.batch_select_indices`: every row copied at full capacity."""
    self.keys = [k[indices] for k in self.keys]
    self.values = [v[indices] for v in self.values]


def main() -> None:
    tok, model, prompts = demo_setup()
    cases = decode_cases(tok)
    variants = {
        "select_rows": kv_cache.BufferKV.batch_select_indices,
        "whole buffer": whole_buffer_select,
    }
    report = {}
    for name, (eos, params) in cases.items():
        times: dict[str, list[float]] = {v: [] for v in variants}
        tokens = 0
        for _ in range(REPEATS):
            for variant, method in variants.items():
                kv_cache.BufferKV.batch_select_indices = method
                engine = HFRolloutEngine(
                    model, eos, tok.pad_token_id, generator=torch.Generator().manual_seed(0)
                )
                start = time.perf_counter()
                out = engine.generate(prompts, params)
                times[variant].append(time.perf_counter() - start)
                tokens = sum(len(c) for c in out.completion_ids)
        medians: dict[str, float] = {k: statistics.median(v) for k, v in times.items()}
        medians["speedup"] = medians["whole buffer"] / medians["select_rows"]
        medians["completion_tokens"] = tokens
        report[name] = medians
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()), flush=True)
    kv_cache.BufferKV.batch_select_indices = variants["select_rows"]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
