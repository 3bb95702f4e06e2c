"""A/B of rlvr's lean forward (`rlvr.models.fused`) against the `transformers` forward, in one
process, alternating: a systems-mode rollout and a training forward + backward at equal and at
ragged completion lengths, on the demo-shaped tiny model (2 threads).

    python benchmarks/fused_ab.py
    python benchmarks/fused_ab.py --compile   # also: the rollout with torch.compile'd layers
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.models import fused
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.training.batching import (
    collate_shared_prefix,
    forward_logits_shared_prefix,
)
from rlvr.training.logprobs import token_logprobs

RESULTS = Path(__file__).parent / "results" / "fused_ab.json"
PROMPTS, GROUP, PROMPT_LEN, REPEATS = 16, 8, 18, 5


def rollout_case(model, tok, prompts):
    params = SamplingParams(n=GROUP, max_new_tokens=64, min_new_tokens=64)

    def run() -> None:
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(0)
        )
        engine.generate(prompts, params)

    return run


def train_case(model, tok, prompts, lengths: tuple[int, int]):
    g = torch.Generator().manual_seed(1)
    rows = [p for p in prompts for _ in range(GROUP)]
    completions = [
        torch.randint(
            10, 100, (int(torch.randint(*lengths, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in rows
    ]

    def run() -> None:
        model.zero_grad()
        mb = collate_shared_prefix(rows, completions, list(range(len(rows))), tok.pad_token_id)
        logprobs = token_logprobs(forward_logits_shared_prefix(model, mb), mb.completion_ids)
        (logprobs * mb.response_mask).sum().backward()

    return run


def compiled_rollout(run) -> dict[str, float]:
    """Seconds of the first (compiling) and the median of three later rollouts, with the lean
    forward's `hidden` under `torch.compile(dynamic=True)` (batch and cache length vary)."""
    fused.FusedForward.hidden = torch.compile(fused.FusedForward.hidden, dynamic=True)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"first_call": times[0], "compiled": statistics.median(times[1:])}


def demo_setup(prompt_len: int = PROMPT_LEN) -> tuple:
    """2 threads; the demo-shaped tiny model, its tokenizer, and `PROMPTS` random prompts of
    `prompt_len` tokens (shared with the other decode A/B scripts)."""
    torch.set_num_threads(2)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=192, intermediate_size=576, num_layers=4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 100, (prompt_len,), generator=g).tolist() for _ in range(PROMPTS)]
    return tok, model, prompts


def decode_cases(tok) -> dict[str, tuple[list[int], SamplingParams]]:
    """The decode A/B scripts' two rollouts, as (EOS ids, sampling): every completion forced to
    64 tokens, and two frequent tokens ending completions, so rows finish at many steps."""
    return {
        "64 forced tokens": (
            [tok.eos_token_id],
            SamplingParams(n=GROUP, max_new_tokens=64, min_new_tokens=64),
        ),
        "rows finish at many steps": ([20, 21], SamplingParams(n=GROUP, max_new_tokens=64)),
    }


def decode_ab(
    tok, model, prompts, variants: dict[str, Callable[[], None]], repeats: int
) -> dict[str, dict[str, float]]:
    """A/B of rollout variants on `decode_cases`, in this process, alternating, one engine per
    variant running every rollout (as in training). `variants` maps a name to a function that
    switches the variant on; the first name is the baseline of the paired speed-ups. Returns,
    per case: median seconds and minor page faults per rollout, and the paired median speed-up
    of each other variant. The first round warms up and is not counted."""
    report = {}
    baseline = next(iter(variants))
    for name, (eos, params) in decode_cases(tok).items():
        engines = {
            v: HFRolloutEngine(model, eos, tok.pad_token_id, generator=torch.Generator())
            for v in variants
        }
        times: dict[str, list[float]] = {v: [] for v in variants}
        faults: dict[str, list[int]] = {v: [] for v in variants}
        for i in range(repeats + 1):
            for variant, switch_on in variants.items():
                switch_on()
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
        report[name] = {
            **{f"{v} s": statistics.median(t) for v, t in times.items()},
            **{f"{v} minor faults": statistics.median(f) for v, f in faults.items()},
            **{
                f"{v} speedup (paired median)": statistics.median(
                    b / t for b, t in zip(times[baseline], times[v])
                )
                for v in variants
                if v != baseline
            },
        }
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in report[name].items()), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args()
    tok, model, prompts = demo_setup()
    cases = {
        "rollout 16x8, 64 forced tokens": rollout_case(model, tok, prompts),
        "train 16x8, 64 tokens each": train_case(model, tok, prompts, (64, 65)),
        "train 16x8, 5..48 tokens": train_case(model, tok, prompts, (5, 49)),
    }
    report = {}
    for name, run in cases.items():
        times: dict[str, list[float]] = {"transformers": [], "fused": []}
        for _ in range(REPEATS):
            for variant in times:
                setattr(model, fused.ENABLE_ATTR, variant == "fused")
                start = time.perf_counter()
                run()
                times[variant].append(time.perf_counter() - start)
        medians = {k: statistics.median(v) for k, v in times.items()}
        medians["speedup"] = medians["transformers"] / medians["fused"]
        report[name] = medians
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()), flush=True)
    if args.compile:
        setattr(model, fused.ENABLE_ATTR, True)
        name = next(iter(cases))
        report[name].update(compiled_rollout(cases[name]))
        print(f"{name}, torch.compile: {report[name]}", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
