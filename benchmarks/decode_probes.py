"""Rollout variants measured against the current decode loop and not adopted, A/B in one process,
alternating, on the systems-mode rollout (16 prompts × 8 samples, 64 forced tokens, the
demo-shaped tiny model, 2 threads):

- `two_threads`: the batch split in two halves, each decoded by its own Python thread with one
  intra-op thread (the single-threaded elementwise kernels would then use both cores);
- `compiled_pieces`: the rotary embedding and RMSNorm under `torch.compile(dynamic=True)`, each
  one fused kernel instead of several (the whole forward compiled is `fused_ab.py --compile`).

And two stubs that say where the rollout's time is (wrong outputs, same shapes and sampling):
- `attention_stub`: a decode step's attention returns its query instead of reading the cache;
- `layers_stub`: the decoder layers are skipped (embedding, final norm, LM head and sampling
  remain).

These probes are of the decode step in PyTorch operations, so the script turns the C kernels
off (`RLVR_CPU_KERNELS=0`; `cpu_kernels_ab.py` measures those against it).

    python benchmarks/decode_probes.py
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from fused_ab import GROUP, demo_setup

from rlvr.models import cpu_kernels, fused
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFRolloutEngine

RESULTS = Path(__file__).parent / "results" / "decode_probes.json"
REPEATS = 10
PARAMS = SamplingParams(n=GROUP, max_new_tokens=64, min_new_tokens=64)


def engine_for(model, tok) -> HFRolloutEngine:
    return HFRolloutEngine(model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator())


def two_threads(engines: list[HFRolloutEngine], prompts) -> None:
    """Each half of the prompts on its own engine (an engine runs one rollout at a time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    halves = [
        threading.Thread(target=engines[i].generate, args=(prompts[i::2], PARAMS)) for i in range(2)
    ]
    for thread in halves:
        thread.start()
    for thread in halves:
        thread.join()
    torch.set_num_threads(threads)


def compiled_pieces():
    """A patch that runs the rotary embedding and RMSNorm compiled."""
    rotate, functional = fused.rotate, fused.F
    pieces = SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("__")})
    pieces.rms_norm = torch.compile(F.rms_norm, dynamic=True)
    compiled_rotate = torch.compile(rotate, dynamic=True)

    @contextmanager
    def patched():
        fused.rotate, fused.F = compiled_rotate, pieces
        try:
            yield
        finally:
            fused.rotate, fused.F = rotate, functional

    return patched


def attention_stub():
    """A patch whose decode-step attention returns its query (prefill attention is real)."""
    attention = fused.attention

    def stub(q, k, v, bias, scale):
        return attention(q, k, v, bias, scale) if q.shape[2] > 1 else q.clone()

    @contextmanager
    def patched():
        fused.attention = stub
        try:
            yield
        finally:
            fused.attention = attention

    return patched


def layers_stub():
    """A patch under which the lean forward has no decoder layers."""
    init = fused.FusedForward.__init__

    def without_layers(self, model):
        init(self, model)
        self.layers = []

    @contextmanager
    def patched():
        fused.FusedForward.__init__ = without_layers
        try:
            yield
        finally:
            fused.FusedForward.__init__ = init

    return patched


def timed(run: Callable[[], None]) -> tuple[float, int]:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> None:
    os.environ[cpu_kernels.DISABLE_ENV] = "0"
    tok, model, prompts = demo_setup()
    engine, halves = engine_for(model, tok), [engine_for(model, tok) for _ in range(2)]

    def base() -> None:
        engine.generate(prompts, PARAMS)

    probes = {
        "two_threads": None,
        "compiled_pieces": compiled_pieces,
        "attention_stub": attention_stub,
        "layers_stub": layers_stub,
    }
    report = {}
    for name, make_patch in probes.items():
        patch = make_patch() if make_patch else None
        runs: dict[str, list[tuple[float, int]]] = {"current": [], name: []}
        for i in range(REPEATS + 1):  # the first round warms up (and compiles)
            for variant in runs:
                if variant == "current":
                    result = timed(base)
                elif patch is None:
                    result = timed(lambda: two_threads(halves, prompts))
                else:
                    with patch():
                        result = timed(base)
                if i:
                    runs[variant].append(result)
        seconds = {v: [s for s, _ in r] for v, r in runs.items()}
        report[name] = {
            **{f"{v} s": statistics.median(s) for v, s in seconds.items()},
            **{f"{v} minor faults": statistics.median(f for _, f in r) for v, r in runs.items()},
            "speedup (paired median)": statistics.median(
                a / b for a, b in zip(seconds["current"], seconds[name])
            ),
        }
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in report[name].items()), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
