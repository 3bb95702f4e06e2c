"""A/B of the CPU decode cache holding each prompt's keys and values once for its samples
(`kv_cache.SharedPromptKV`, lever 52: the C decode attention reads them in place) against a copy
per sample (`kv_cache.BufferKV` repeated after the prefill, the implementation before it), in one
process, alternating, on the demo-shaped tiny model with 2 threads; one engine per variant runs
every rollout, as in training.

Two rollouts of 16 prompts × 8 samples, up to 64 tokens (`fused_ab.decode_cases`): every
completion forced to 64 tokens, and two frequent tokens ending a completion, so rows leave the
batch at many steps. `--prompt-len` sets the prompts' length (the demo's chat prompts are
about 19 tokens; reasoning prompts run to hundreds). Reported: median seconds and minor page
faults per rollout, and the paired speed-up; both variants sample the same tokens (checked).

    python benchmarks/shared_prompt_ab.py
    python benchmarks/shared_prompt_ab.py --prompt-len 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from fused_ab import PROMPT_LEN, decode_ab, decode_cases, demo_setup

from rlvr.rollout.hf import FusedDecoder, HFRolloutEngine

RESULTS = Path(__file__).parent / "results" / "shared_prompt_ab.json"
REPEATS = 12


def same_samples(tok, model, prompts) -> bool:
    """Whether both variants sample the same completions and log-probs on every case."""
    outs = []
    for share in (False, True):
        FusedDecoder.share_prompts = share
        for eos, params in decode_cases(tok).values():
            engine = HFRolloutEngine(model, eos, tok.pad_token_id, generator=torch.Generator())
            engine.generator.manual_seed(0)
            out = engine.generate(prompts, params)
            outs.append((out.completion_ids, out.logprobs))
    half = len(outs) // 2
    return outs[:half] == outs[half:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    args = parser.parse_args()
    tok, model, prompts = demo_setup(args.prompt_len)

    def switch(share: bool):
        return lambda: setattr(FusedDecoder, "share_prompts", share)

    try:
        same = same_samples(tok, model, prompts)
        print(f"same samples: {same}", flush=True)
        variants = {"copy per sample": switch(False), "shared prompt": switch(True)}
        report = decode_ab(tok, model, prompts, variants, REPEATS)
    finally:
        FusedDecoder.share_prompts = True
    report["same_samples"] = same
    report["prompt_len"] = len(prompts[0])
    suffix = f"-prompt{args.prompt_len}" if args.prompt_len != PROMPT_LEN else ""
    path = RESULTS.with_name(f"{RESULTS.stem}{suffix}.json")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
