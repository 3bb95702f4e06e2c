"""Where the scaling benchmark's longest rollout spends each decode step: the step's time and
its C decode attention's (`cpu_kernels.decode_attention`, timed around each call), by
position, and the rate at which the attention reads the K/V cache there.

The rollout is `revision_ab.py --case rollout-long`'s: 4 prompts × 8 samples, 512 forced
tokens, the demo-shaped tiny model, 2 threads. The step time without the attention stays
flat along the rollout when everything but the attention is linear in the length; the
attention's time grows with the position, at the memory bandwidth once the cache no longer
fits the caches (`cpu_floor.py` measures the bandwidth).

    python benchmarks/decode_steps.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from fused_ab import demo_setup

from rlvr.models import cpu_kernels
from rlvr.rollout import hf
from rlvr.rollout.base import SamplingParams

RESULTS = Path(__file__).parent / "results" / "decode_steps.json"
PROMPTS, GROUP, LENGTH, WINDOW = 4, 8, 512, 32


class TimedKernels:
    """The loaded kernels, with each `decode_attention` call's seconds kept in `seconds`."""

    def __init__(self, library) -> None:
        self.library, self.seconds = library, []

    def __getattr__(self, name: str):
        function = getattr(self.library, name)
        if name != "decode_attention":
            return function

        def timed(*args):
            start = time.perf_counter()
            function(*args)
            self.seconds.append(time.perf_counter() - start)

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rollouts timed (after one warm-up)")
    args = parser.parse_args()
    tok, model, prompts = demo_setup()
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
    engine = hf.HFRolloutEngine(
        model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator()
    )
    params = SamplingParams(n=GROUP, max_new_tokens=LENGTH, min_new_tokens=LENGTH)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_width = config.num_key_value_heads * head_dim
    rounds = []
    for r in range(args.rounds + 1):
        steps.clear(), kernels.seconds.clear()
        start = time.perf_counter()
        engine.generate(prompts[:PROMPTS], params)
        total = time.perf_counter() - start
        layers = len(kernels.seconds) // len(steps)
        windows = []
        for first in sorted({*range(0, len(steps) - WINDOW + 1, 128), len(steps) - WINDOW}):
            step = statistics.mean(steps[first : first + WINDOW])
            attention = sum(kernels.seconds[first * layers : (first + WINDOW) * layers]) / WINDOW
            # a step at position p reads p + 1 own positions per row, the prompt's once
            positions = sum(
                PROMPTS * GROUP * (p + 1) + PROMPTS * len(prompts[0])
                for p in range(first, first + WINDOW)
            ) / WINDOW  # fmt: skip
            kv_bytes = positions * layers * 2 * kv_width * 4
            windows.append(
                {
                    "steps": [first, first + WINDOW],
                    "step_ms": step * 1e3,
                    "attention_ms": attention * 1e3,
                    "rest_ms": (step - attention) * 1e3,
                    "attention_gb_per_s": kv_bytes / attention / 1e9,
                }
            )
        if r:  # the first rollout warms up
            rounds.append(
                {"rollout_s": total, "attention_s": sum(kernels.seconds), "windows": windows}
            )
        print(
            f"rollout {total:.2f} s, attention {sum(kernels.seconds):.2f} s; step − attention: "
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
