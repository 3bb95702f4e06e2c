"""Side-by-side A/B on a GPU for the levers `benchmarks/gpu.py` reports on.

- **decode**: the same rollouts (`gpu.decode_case`: 128-token prompts, 512 forced new tokens)
  with CUDA-graph decode steps and without (eager), at 64 and 128 rows;
- **training**: one GRPO mini-batch (`gpu.train_case`) with the chunked log-prob function
  (`token_logprobs_and_entropy`: one fused log-softmax pass per chunk, only the logits kept
  for backward, the entropy metric from the same pass) against the way it was computed
  before (autograd through `logsumexp`, which keeps an fp32 copy of every chunk, and a
  separate entropy pass), alternating old/new twice, at 16k- and 32k-token micro-batches.

    python benchmarks/gpu_ab.py              # both shapes, bf16, on CUDA

Results go to `benchmarks/results/gpu_ab.json` with the device, versions and command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import transformers

from rlvr.training import batching, update

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("gpu_bench", HERE / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


def logsumexp_pair(logits, tokens, temperature=1.0, chunk_size=4096, with_entropy=True):
    """The log-prob and entropy passes as computed before `_ChunkedLogprobs`."""
    flat, tok = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)
    parts = []
    for i in range(0, tok.shape[0], chunk_size):
        scaled = flat[i : i + chunk_size].float() / temperature
        picked = scaled.gather(-1, tok[i : i + chunk_size, None]).squeeze(-1)
        parts.append(picked - scaled.logsumexp(-1))
    logprobs = torch.cat(parts).reshape(tokens.shape)
    with torch.no_grad():
        entropy = (
            batching.token_entropy(logits.detach(), temperature)
            if with_entropy
            else logprobs.new_empty(0)
        )
    return logprobs, entropy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["100m", "0.5b"], choices=["100m", "0.5b"])
    args = parser.parse_args()
    device = torch.device("cuda")
    fused_pair = update.token_logprobs_and_entropy
    report = {
        "command": " ".join(["python", "benchmarks/gpu_ab.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "results": {},
    }
    results = report["results"]
    for shape in args.shapes:
        torch.manual_seed(0)
        model = gpu.SHAPES[shape]().to(device=device, dtype=torch.bfloat16)
        for batch in (64, 128):
            case = argparse.Namespace(
                batch=batch, samples=8, prompt_len=128, new_tokens=512, repeats=2
            )
            for graphs in (True, False):
                r = gpu.decode_case(model, case, device, {"datasheet": 3.35e12}, graphs)
                results[f"{shape} decode batch {batch} graphs {graphs}"] = r
                print(shape, batch, "graphs" if graphs else "eager", r["decode_step_ms"])
        for tokens in (16384, 32768):
            case = argparse.Namespace(
                train_prompts=16,
                samples=8,
                train_len=1024,
                prompt_len=128,
                micro_batch_tokens=tokens,
                repeats=2,
            )
            for name, pair in [("old", logsumexp_pair), ("new", fused_pair)] * 2:
                update.token_logprobs_and_entropy = pair
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                try:
                    r = gpu.train_case(model, case, device, {"datasheet": 989e12})
                    r["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
                except torch.OutOfMemoryError:
                    r = {"oom": True}
                results.setdefault(f"{shape} train mb {tokens} {name}", []).append(r)
                print(shape, "train", tokens, name, r.get("step_s", "oom"), flush=True)
        update.token_logprobs_and_entropy = fused_pair
        del model
        torch.cuda.empty_cache()
    path = HERE / "results" / "gpu_ab.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
