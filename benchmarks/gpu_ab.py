"""Side-by-side A/B on a GPU for the levers `benchmarks/gpu.py` reports on.

- **decode**: the same rollouts (`gpu.decode_case`: 128-token prompts, 512 forced new tokens)
  with CUDA-graph decode steps that sample inside the graph (`GraphDecoder.next_tokens`, the
  default) and that return logits, sampled eagerly after the replay (as before 11-26),
  alternating twice, at 128 and 512 rows (graphs against eager decoding: `gpu.py`);
- **chunks**: the 0.5b's training mini-batch at 16k-token micro-batches without logits, with
  chunks of 64M (the default until 11-26), 256M (the GPU default since) and 1G logits, and
  with the real rows' logits, alternating
  twice (a chunk's LM-head gradient is added into an fp32 [vocab, hidden] sum: 1.4 GB of
  memory traffic per chunk at the 0.5b's shape);
- **training**: one GRPO mini-batch (`gpu.train_case`) with the three ways of scoring the
  completion tokens of `lm_head_ab.py` (padded logits, as before; real-row logits; no logits,
  the default), alternating twice, at 16k- and 32k-token micro-batches, with the peak memory.
  (Until 11-25 this half compared the chunked log-prob function with autograd through
  `logsumexp`; those results are in `docs/benchmarks.md`.)

    python benchmarks/gpu_ab.py                  # both shapes, both parts, bf16, on CUDA
    python benchmarks/gpu_ab.py --parts train    # the training half only
    python benchmarks/gpu_ab.py --shapes 0.5b --parts chunks
    python benchmarks/gpu_ab.py --quick          # its CPU smoke run (toy shape, no decode)

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
from lm_head_ab import WAYS

from rlvr.rollout import hf
from rlvr.rollout.graphs import GraphDecoder
from rlvr.training import logprobs, update

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("gpu_bench", HERE / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


SAMPLING_WAYS = {
    "sampling in the graph": GraphDecoder.next_tokens,
    "sampling after the graph": hf.SampleAfterStep.next_tokens,
}
CHUNK_WAYS = {  # name: (way of `lm_head_ab.WAYS`, logits per chunk)
    "no logits, 64M-logit chunks": ("no logits", 1 << 26),
    "no logits, 256M-logit chunks": ("no logits", 1 << 28),
    "no logits, 1G-logit chunks": ("no logits", 1 << 30),
    "real-row logits": ("real-row logits", 1 << 26),
}


def train_run(model, device: torch.device, micro_batch_tokens: int) -> dict:
    """`gpu.train_case` on 16 prompts × 8 ragged completions of 512–1024 tokens (2 × 4 of at
    most 16 on the CPU), with the peak memory on CUDA; {"oom": True} when memory runs out."""
    cuda = device.type == "cuda"
    case = argparse.Namespace(
        train_prompts=16 if cuda else 2,
        samples=8 if cuda else 4,
        train_len=1024 if cuda else 16,
        prompt_len=128 if cuda else 8,
        micro_batch_tokens=micro_batch_tokens,
        repeats=2 if cuda else 1,
    )
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        r = gpu.train_case(model, case, device, {"datasheet": 989e12})
    except torch.OutOfMemoryError:
        return {"oom": True}
    if cuda:
        r["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["100m", "0.5b"], choices=["100m", "0.5b"])
    parser.add_argument("--quick", action="store_true", help="toy shape on the CPU, no decode part")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["decode", "train"],
        choices=["decode", "chunks", "train"],
    )
    args = parser.parse_args()
    cuda = not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    if args.quick:
        args.shapes, args.parts = ["toy"], [p for p in args.parts if p != "decode"]
    default_way = update.completion_token_stats
    default_chunks = logprobs.CHUNK_ELEMENTS, logprobs.GPU_CHUNK_ELEMENTS
    path = HERE / "results" / ("gpu_ab.json" if cuda else "gpu_ab-quick.json")
    report = {
        "command": " ".join(["python", "benchmarks/gpu_ab.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "results": {},
    }

    def record(key: str, result: dict, shown: str) -> None:
        """Add `result` to the runs of `key`, print its `shown` figure, rewrite the report."""
        report["results"].setdefault(key, []).append(result)
        print(key, result.get(shown, "oom"), flush=True)
        path.write_text(json.dumps(report, indent=1) + "\n")

    for shape in args.shapes:
        model = gpu.build(shape, device, torch.bfloat16 if cuda else torch.float32)
        for batch in (128, 512) if "decode" in args.parts else ():
            case = argparse.Namespace(
                batch=batch, samples=8, prompt_len=128, new_tokens=512, repeats=2
            )
            for name, way in [*SAMPLING_WAYS.items()] * 2:
                GraphDecoder.next_tokens = way
                r = gpu.decode_case(model, case, device, {})
                record(f"{shape} decode batch {batch} {name}", r, "decode_step_ms")
            GraphDecoder.next_tokens = SAMPLING_WAYS["sampling in the graph"]
        for name, (way, chunk) in [*CHUNK_WAYS.items()] * 2 if "chunks" in args.parts else ():
            update.completion_token_stats = WAYS[way]
            logprobs.CHUNK_ELEMENTS = logprobs.GPU_CHUNK_ELEMENTS = chunk
            record(
                f"{shape} chunks {name}", train_run(model, device, 16384 if cuda else 64), "step_s"
            )
        logprobs.CHUNK_ELEMENTS, logprobs.GPU_CHUNK_ELEMENTS = default_chunks
        for tokens in ((16384, 32768) if cuda else (64,)) if "train" in args.parts else ():
            for name, way in [*WAYS.items()] * 2:
                update.completion_token_stats = way
                record(
                    f"{shape} train mb {tokens} {name}", train_run(model, device, tokens), "step_s"
                )
        update.completion_token_stats = default_way
        del model
        if cuda:
            torch.cuda.empty_cache()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
