"""A/B of activation checkpointing (`train.gradient_checkpointing`) in rlvr's policy update, rlvr
alone, runs alternating in fresh processes (vs_trl.py's worker, 2 threads).

Training runs: dense reward (every sample is trained), equal lengths forced, on the
systems-mode batch (16 prompts × 8 samples, 64 tokens) and the scaling mode's longest point
(4 prompts × 8 samples, 512 tokens). Three settings: a 16k-token micro-batch with and without
checkpointing, and the default 4k-token micro-batch. Reported per run: the medians of steps
2..N of the train and step seconds, and the peak RSS.

One micro-batch alone (`isolated`): one forward + backward of 4 prompts × 8 completions of 512
tokens through the demo-shaped model with 4 and with 12 layers, each in a fresh process, with
and without checkpointing, and again with glibc's mmap threshold fixed at 64 KiB
(`MALLOC_MMAP_THRESHOLD_`, so freed large blocks go back to the kernel and the peak RSS
follows the live tensors). Reported: the bytes autograd keeps for backward (saved tensors and
the checkpointed regions' inputs), the peak RSS above the process's RSS before the pass, and
the seconds per pass.

    python benchmarks/checkpointing_ab.py
    python benchmarks/checkpointing_ab.py --quick   # a smoke version (< 1 minute)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from micro_batch_ab import CASES, QUICK, settings_ab
from vs_trl import RESULTS_DIR, quiet

from rlvr.models import fused
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.batching import collate_shared_prefix, forward_logits_shared_prefix
from rlvr.training.logprobs import token_logprobs

SETTINGS = {
    "16384": ["train.micro_batch_tokens=16384"],
    "16384, checkpointing": ["train.micro_batch_tokens=16384", "train.gradient_checkpointing=true"],
    "4096": ["train.micro_batch_tokens=4096"],
}


def kept_for_backward_mib(model: torch.nn.Module, sb) -> float:
    """MiB of the storages autograd keeps from one forward: the tensors saved for backward and
    the inputs of the checkpointed regions."""
    storages: dict[int, int] = {}

    def note(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    recomputed = fused._recomputed

    def noting(function, *args):
        for arg in args:
            if isinstance(arg, torch.Tensor):
                note(arg)
        return recomputed(function, *args)

    fused._recomputed = noting
    try:
        with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
            forward_logits_shared_prefix(model, sb)
    finally:
        fused._recomputed = recomputed
    return sum(storages.values()) / 2**20


def isolated_worker(layers: int, checkpointing: bool, length: int) -> None:
    """One forward + backward of a 4 × 8 × `length` micro-batch; prints a JSON line."""
    torch.set_num_threads(2)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=192, intermediate_size=576, num_layers=layers)
    if checkpointing:
        fused.enable_activation_checkpointing(model)
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for _ in range(4):
        prompt = torch.randint(10, 90, (18,), generator=g).tolist()
        for _ in range(8):
            prompts.append(prompt)
            completions.append(torch.randint(10, 90, (length,), generator=g).tolist())
    sb = collate_shared_prefix(prompts, completions, list(range(32)), tok.pad_token_id)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    logprobs = token_logprobs(forward_logits_shared_prefix(model, sb), sb.completion_ids)
    (logprobs * sb.response_mask).sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the next pass
    kept = kept_for_backward_mib(model, sb)
    print(json.dumps({"kept_mib": kept, "peak_above_start_mib": peak - before, "s": seconds}))


def isolated(length: int, layer_counts: tuple[int, ...]) -> dict:
    """`isolated_worker` in fresh processes, for each layer count, glibc setting and mode."""
    results: dict = {}
    for layers in layer_counts:
        for allocator, env in (
            ("glibc default", {}),
            ("mmap threshold 64 KiB", {"MALLOC_MMAP_THRESHOLD_": "65536"}),
        ):
            for checkpointing in (False, True):
                command = [sys.executable, __file__, "--isolated-worker", str(layers)]
                command += [str(int(checkpointing)), str(length)]
                out = subprocess.run(
                    command, env={**os.environ, **env}, capture_output=True, text=True, check=True
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                mode = "on" if checkpointing else "off"
                key = f"{layers} layers, {allocator}, checkpointing {mode}"
                results[key] = row
                print(
                    f"isolated {length} tokens, {key}: kept {row['kept_mib']:.0f} MiB, peak RSS "
                    f"+{row['peak_above_start_mib']:.0f} MiB, {row['s']:.2f} s",
                    flush=True,
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke version")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per setting")
    parser.add_argument("--isolated-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.isolated_worker:
        layers, checkpointing, length = args.isolated_worker
        isolated_worker(layers, bool(checkpointing), length)
        return
    quiet()
    report: dict[str, dict] = {
        "isolated": isolated(64, (2,)) if args.quick else isolated(512, (4, 12))
    }
    cases = QUICK if args.quick else CASES
    report.update(settings_ab(cases, SETTINGS, args.repeats, "ck"))
    name = "checkpointing_ab-quick.json" if args.quick else "checkpointing_ab.json"
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / name).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
