"""The least time any framework can spend on one systems-mode GRPO step on this machine.

A step must (1) decode every token: 2·N FLOPs per token in the matmuls plus one read of the
KV cache per token and layer, and (2) run forward and backward on every trained token: 6·N
FLOPs per token (N = parameters in matmuls). Dividing by the matmul throughput and memory
bandwidth this machine reaches (measured here, 2 threads) gives a floor for the step; the
ratio of a framework's step time to it bounds how much faster any implementation can be.

    python benchmarks/cpu_floor.py                # systems mode: 16 prompts x 8, 64 tokens
    python benchmarks/cpu_floor.py --length 512 --prompts 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "cpu_floor.json"


def best_seconds(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_flops_per_s(rows: int, d_in: int, d_out: int, repeats: int = 20) -> float:
    """Throughput of x[rows, d_in] @ w[d_in, d_out] (fp32)."""
    x, w = torch.randn(rows, d_in), torch.randn(d_in, d_out)
    return 2 * rows * d_in * d_out / best_seconds(lambda: x @ w, repeats)


def copy_bytes_per_s(megabytes: int = 64, repeats: int = 10) -> float:
    """Memory bandwidth of a large copy (bytes read + written per second)."""
    src = torch.randn(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_seconds(lambda: dst.copy_(src), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--length", type=int, default=64, help="forced completion length")
    parser.add_argument("--prompt-len", type=int, default=18, help="mean prompt tokens")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--mlp", type=int, default=576)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=107)
    args = parser.parse_args()
    torch.set_num_threads(2)

    h, f = args.hidden, args.mlp
    matmul_params = args.layers * (4 * h * h + 3 * h * f) + h * args.vocab
    rows = args.prompts * args.group
    completion_tokens = rows * args.length
    prompt_tokens = args.prompts * args.prompt_len  # each prompt once (shared prefix)
    train_rate = matmul_flops_per_s(completion_tokens, h, f)
    decode_rate = matmul_flops_per_s(rows, h, f, repeats=200)
    bandwidth = copy_bytes_per_s()

    train_flops = 6 * matmul_params * (completion_tokens + prompt_tokens)
    decode_flops = 2 * matmul_params * (completion_tokens + prompt_tokens)
    # every decode step reads K and V of every earlier position of every row and layer
    positions_read = rows * sum(args.prompt_len + t for t in range(args.length))
    kv_bytes = positions_read * args.layers * 2 * h * 4
    floor = {
        "train_s": train_flops / train_rate,
        "rollout_matmul_s": decode_flops / decode_rate,
        "rollout_kv_s": kv_bytes / bandwidth,
    }
    floor["step_s"] = sum(floor.values())
    report = {
        "command": "python benchmarks/cpu_floor.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "settings": vars(args),
        "matmul_params": matmul_params,
        "measured": {
            "train_matmul_gflops": train_rate / 1e9,
            "decode_matmul_gflops": decode_rate / 1e9,
            "copy_gb_per_s": bandwidth / 1e9,
        },
        "work": {
            "train_gflop": train_flops / 1e9,
            "decode_gflop": decode_flops / 1e9,
            "kv_read_gb": kv_bytes / 1e9,
        },
        "floor": floor,
    }
    print(json.dumps(report, indent=1))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
