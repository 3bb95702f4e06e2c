"""The least time any framework can spend on one GRPO step on this machine.

A step must (1) decode every token: 2·N FLOPs per token in the matmuls plus one read of the
KV cache per token and layer, and (2) run forward and backward on every trained token: 6·N
FLOPs per token (N = parameters in matmuls) plus the attention's: 4·d FLOPs per (query, key)
pair a layer forward (q·k and p·v, d the model width), twice that backward (Dao et al. 2022,
"FlashAttention", §3.1 counts the same). Dividing by the matmul throughput and memory
bandwidth this machine reaches (measured here, 2 threads) gives a floor for the step; the
ratio of a framework's step time to it bounds how much faster any implementation can be.

With several `--length`s the rates are measured once and each length gets its floor, and the
floor's growth from the first length to the last is reported: the KV reads grow with the
square of the length, so the floor itself grows faster than the tokens do.

    python benchmarks/cpu_floor.py                        # systems mode: 16 prompts x 8, 64 tokens
    python benchmarks/cpu_floor.py --length 64 512 --prompts 4   # the scaling benchmark's ends
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "cpu_floor.json"


@dataclass(frozen=True)
class Shape:
    """One step's sizes: `prompts` × `group` completions of `length` tokens after prompts of
    `prompt_len`, on a Llama of `layers` layers, width `hidden`, MLP `mlp`, `vocab` tokens."""

    prompts: int = 16
    group: int = 8
    length: int = 64
    prompt_len: int = 18
    hidden: int = 192
    mlp: int = 576
    layers: int = 4
    vocab: int = 107

    @property
    def matmul_params(self) -> int:
        h, f = self.hidden, self.mlp
        return self.layers * (4 * h * h + 3 * h * f) + h * self.vocab


def step_work(s: Shape) -> dict[str, float]:
    """The FLOPs and bytes a step cannot avoid. Each prompt is trained and its K/V read once
    for its `group` samples (a shared prefix); a completion token at position i of its row
    attends to the prompt's keys and to its own i + 1 (itself included); a decode step reads
    K and V (fp32) of every earlier position of every row and layer."""
    rows = s.prompts * s.group
    tokens = rows * s.length + s.prompts * s.prompt_len
    own = sum(range(1, s.length + 1))  # (query, key) pairs within a completion
    pairs = rows * (s.length * s.prompt_len + own) + s.prompts * sum(range(1, s.prompt_len + 1))
    cached = rows * sum(range(s.length)) + s.prompts * s.prompt_len * s.length
    return {
        "train_flop": 6 * s.matmul_params * tokens,
        "train_attention_flop": 3 * 4 * s.hidden * s.layers * pairs,
        "decode_flop": 2 * s.matmul_params * tokens,
        "kv_read_bytes": cached * s.layers * 2 * s.hidden * 4,
    }


def floor_seconds(work: dict[str, float], rates: dict[str, float]) -> dict[str, float]:
    """Seconds of each part of `step_work` at the measured `rates` (`train_flops`,
    `decode_flops` in FLOP/s, `bandwidth` in bytes/s), nothing overlapped, and their sum
    `step_s`."""
    floor = {
        "train_s": (work["train_flop"] + work["train_attention_flop"]) / rates["train_flops"],
        "rollout_matmul_s": work["decode_flop"] / rates["decode_flops"],
        "rollout_kv_s": work["kv_read_bytes"] / rates["bandwidth"],
    }
    floor["step_s"] = sum(floor.values())
    return floor


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
    for field in fields(Shape):  # one option per field of `Shape`; --length takes several
        several = {"nargs": "+", "default": [field.default]} if field.name == "length" else {}
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=int, **{"default": field.default, **several}
        )
    args = parser.parse_args()
    torch.set_num_threads(2)

    settings = {k: v for k, v in vars(args).items() if k != "length"}
    shapes = [Shape(length=length, **settings) for length in args.length]
    longest = max(shapes, key=lambda s: s.length)
    rows = longest.prompts * longest.group
    rates = {
        "train_flops": matmul_flops_per_s(rows * longest.length, longest.hidden, longest.mlp),
        "decode_flops": matmul_flops_per_s(rows, longest.hidden, longest.mlp, repeats=200),
        "bandwidth": copy_bytes_per_s(),
    }
    per_length = []
    for shape in shapes:
        work = step_work(shape)
        per_length.append(
            {
                "length": shape.length,
                "work": {k.replace("_flop", "_gflop").replace("_bytes", "_gb"): v / 1e9
                         for k, v in work.items()},
                "floor": floor_seconds(work, rates),
            }
        )  # fmt: skip
    report = {
        "command": "python benchmarks/cpu_floor.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "settings": {**asdict(shapes[0]), "length": args.length},
        "matmul_params": shapes[0].matmul_params,
        "measured": {
            "train_matmul_gflops": rates["train_flops"] / 1e9,
            "decode_matmul_gflops": rates["decode_flops"] / 1e9,
            "copy_gb_per_s": rates["bandwidth"] / 1e9,
        },
        "lengths": per_length,
    }
    if len(shapes) > 1:
        first, last = per_length[0], per_length[-1]
        report["growth"] = {
            "tokens": last["length"] / first["length"],
            "floor_step": last["floor"]["step_s"] / first["floor"]["step_s"],
        }
    print(json.dumps(report, indent=1))
    path = RESULTS
    if len(shapes) > 1:
        path = RESULTS.with_name(f"cpu_floor-lengths-{'-'.join(map(str, args.length))}.json")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
