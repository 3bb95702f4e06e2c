"""A/B of the two rollout engines, `hf` (rlvr's in-process engine) and `vllm` (vLLM colocated,
`rollout.engine=vllm`), on the same policy, prompts and sampling, in one process, alternating.

The demo's tiny model (4 layers, width 256), 2 threads; 16 prompts of 48 tokens × 8 samples;
every completion forced to 64 tokens (`min_new_tokens`), so both engines decode the same
number of tokens, and again with completions free to end at EOS. Reported: median seconds per
rollout of each engine over `--repeats` rounds (the first round warms up and is not counted),
the paired median speed-up of vLLM over hf, and the largest gap between each engine's log-probs
and the trainer's (a transformers forward at the same temperature) on the last round. Needs
vLLM (`make install-vllm`):

    .venv-vllm/bin/python benchmarks/vllm_ab.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import Rollout, SamplingParams
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.vllm import VLLMRolloutEngine

RESULTS = Path(__file__).parent / "results" / "vllm_ab.json"
PROMPTS, PROMPT_LEN, GROUP, BUDGET = 16, 48, 8, 64


def logprob_gap(model, prompts: list[list[int]], out: Rollout, temperature: float) -> float:
    """Largest |engine log-prob − transformers log-prob| over every sampled token."""
    gap = 0.0
    with torch.no_grad():
        for p, ids, lp in zip(out.prompt_index, out.completion_ids, out.logprobs, strict=True):
            prompt = prompts[p]
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            ref = torch.log_softmax(logits.float() / temperature, -1)
            ref = ref.gather(1, torch.tensor(ids)[:, None])[:, 0]
            gap = max(gap, float((torch.tensor(lp) - ref).abs().max()))
    return gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 100, (PROMPT_LEN,), generator=g).tolist() for _ in range(PROMPTS)]
    eos = [tok.eos_token_id]
    engines = {
        "hf": HFRolloutEngine(model, eos, tok.pad_token_id, generator=torch.Generator()),
        "vllm": VLLMRolloutEngine(model, eos, torch.Generator().manual_seed(0)),
    }
    cases = {
        "64 forced tokens": SamplingParams(n=GROUP, max_new_tokens=BUDGET, min_new_tokens=BUDGET),
        "free to end": SamplingParams(n=GROUP, max_new_tokens=BUDGET),
    }
    report = {}
    for case, params in cases.items():
        times: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, list[int]] = {name: [] for name in engines}
        last: dict[str, Rollout] = {}
        for i in range(args.repeats + 1):
            for name, engine in engines.items():
                start = time.perf_counter()
                out = engine.generate(prompts, params)
                if i:
                    times[name].append(time.perf_counter() - start)
                    tokens[name].append(sum(len(c) for c in out.completion_ids))
                last[name] = out
        pairs = [h / v for h, v in zip(times["hf"], times["vllm"], strict=True)]
        report[case] = {
            **{f"{n} s": round(statistics.median(t), 4) for n, t in times.items()},
            **{f"{n} tokens": round(statistics.median(t)) for n, t in tokens.items()},
            "vllm speed-up": round(statistics.median(pairs), 3),
            **{f"{n} logprob gap": logprob_gap(model, prompts, last[n], 1.0) for n in engines},
        }
        print(case, report[case], flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
