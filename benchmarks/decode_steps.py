"""Where the scaling benchmark's longest rollout spends each decode step: the step's time and
its C decode attention's (`cpu_kernels.decode_attention`, timed around each call), by
position, and the rate at which the attention reads the K/V cache there.

The rollout is `revision_ab.py --case rollout-long`'s (`rollout_case(long=True)`): 4 prompts
× 8 samples, 512 forced tokens, the demo-shaped tiny model, 2 threads. The step time without
the attention stays flat along the rollout when everything but the attention is linear in
the length; the attention's time grows with the position, at the memory bandwidth once the
cache no longer fits the caches (`cpu_floor.py` measures the bandwidth). The bytes a call
reads are taken from its arguments: each row's own positions, and each prompt's once.

    python benchmarks/decode_steps.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from revision_ab import rollout_case

from rlvr.models import cpu_kernels
from rlvr.rollout import hf

RESULTS = Path(__file__).parent / "results" / "decode_steps.json"
GROUP, WINDOW = 8, 32  # samples per prompt in `rollout_case`; steps per reported window


class TimedKernels:
    """The loaded kernels, with each `decode_attention` call's seconds and K/V bytes (fp32)
    kept in `calls`."""

    def __init__(self, library) -> None:
        self.library, self.calls = library, []

    def __getattr__(self, name: str):
        function = getattr(self.library, name)
        if name != "decode_attention":
            return function

        def timed(*args):
            batch, kv_heads, plen, length, dim = args[9], args[11], args[12], args[13], args[14]
            positions = batch * length + batch // GROUP * plen
            start = time.perf_counter()
            function(*args)
            self.calls.append((time.perf_counter() - start, positions * kv_heads * dim * 8))

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rollouts timed (after one warm-up)")
    args = parser.parse_args()
    kernels = TimedKernels(cpu_kernels.load())
    if kernels.library is None:
        raise SystemExit("the C kernels did not load; this measures their decode attention")
    cpu_kernels.load = lambda: kernels
    steps: list[float] = []
    decode_step = hf.FusedDecoder.next_tokens

    def timed_step(self, *a, **k):
        start = time.perf_counter()
        out = decode_step(self, *a, **k)
        steps.append(time.perf_counter() - start)
        return out

    hf.FusedDecoder.next_tokens = timed_step
    rollout = rollout_case(long=True)
    rounds = []
    for r in range(args.rounds + 1):
        steps.clear(), kernels.calls.clear()
        start = time.perf_counter()
        rollout()
        total = time.perf_counter() - start
        layers = len(kernels.calls) // len(steps)
        attention_s = sum(seconds for seconds, _ in kernels.calls)
        windows = []
        for first in sorted({*range(0, len(steps) - WINDOW + 1, 128), len(steps) - WINDOW}):
            calls = kernels.calls[first * layers : (first + WINDOW) * layers]
            step = statistics.mean(steps[first : first + WINDOW])
            attention = sum(seconds for seconds, _ in calls) / WINDOW
            windows.append(
                {
                    "steps": [first, first + WINDOW],
                    "step_ms": step * 1e3,
                    "attention_ms": attention * 1e3,
                    "rest_ms": (step - attention) * 1e3,
                    "attention_gb_per_s": sum(b for _, b in calls) / WINDOW / attention / 1e9,
                }
            )
        if r:  # the first rollout warms up
            rounds.append({"rollout_s": total, "attention_s": attention_s, "windows": windows})
        print(
            f"rollout {total:.2f} s, attention {attention_s:.2f} s; step − attention: "
            + ", ".join(
                f"{w['steps'][0]}–{w['steps'][1]} {w['step_ms']:.2f} − {w['attention_ms']:.2f} "
                f"= {w['rest_ms']:.2f} ms ({w['attention_gb_per_s']:.1f} GB/s)"
                for w in windows
            )
        )
    RESULTS.parent.mkdir(exist_ok=True)
    report = {"command": "python benchmarks/decode_steps.py --rounds " + str(args.rounds)}
    RESULTS.write_text(json.dumps({**report, "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
