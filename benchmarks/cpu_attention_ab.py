"""A/B of the C attention kernels alone (`cpu_kernels.c`), in one process, alternating: the
training attention forward and backward (`cpu_kernels.attention`) and the decode attention
over four layers' caches (`decode_attention`), each built from the working tree, from a git
revision (`--against REV`) and from extra source files (`--source FILE`, a variant not
committed), with the same flags. 2 threads, random inputs, 4 heads of 48 (the demo's shape):

- training, `long`: 4 prompts × 8 samples, 18 prompt and 512 own positions (the scaling
  benchmark's L = 512 batch); `systems`: 16 prompts × 8, 18 and 64 (systems mode's);
- decode, 32 rows at 64 and at 512 cached positions (12.6 and 100.7 MB of K/V: in the L3
  cache of the AMD EPYC VM, and four times its size), reported also as the rate at which the
  cache is read.

Reported: each variant's median over `--rounds` rounds (two more warm up), the paired median
speed-up against the first variant (REV, else the first source), and each variant's largest
difference from the first one's outputs and gradients.

    python benchmarks/cpu_attention_ab.py --against HEAD~1 [--source variant.c] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from cpu_kernels_ab import library_at

from rlvr.models import cpu_kernels

RESULTS_DIR = Path(__file__).parent / "results"
HEADS, DIM, LAYERS, PROMPT = 4, 48, 4, 18


def training_case(prompts: int, own: int) -> Callable[[], list[torch.Tensor]]:
    """A function running the attention forward and backward of `prompts` × 8 rows; returns
    the output and the gradients of q, k, v."""
    g = torch.Generator().manual_seed(0)
    rows = prompts * 8
    q, k, v = (torch.randn(rows * own, HEADS, DIM, generator=g) for _ in range(3))
    pk, pv = (torch.randn(prompts, HEADS, PROMPT, DIM, generator=g) for _ in range(2))
    layout = cpu_kernels.AttentionLayout(
        torch.arange(rows * own).view(rows, own),
        torch.ones(rows, own),
        torch.ones(prompts, PROMPT),
        torch.arange(0, rows + 1, 8),
    )
    grad = torch.randn(rows * own, HEADS, DIM, generator=g)

    def run() -> list[torch.Tensor]:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = cpu_kernels.attention(*leaves, pk, pv, layout, DIM**-0.5)
        out.backward(grad)
        return [out.detach(), *(x.grad for x in leaves)]

    return run


class DecodeCaches:
    """A random query per row and `LAYERS` layers' K/V caches of `rows` rows × `cached`
    positions (no prompts), and `decode_attention` over one layer's, called on the library
    directly, not through `DecodeOps.attention`, whose checks and allocations (tens of µs a
    call here) would dilute the kernels' difference at 64 positions."""

    def __init__(self, rows: int, cached: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows, self.cached = rows, cached
        self.k, self.v = ([torch.randn(rows, HEADS, cached, DIM, generator=g)
                           for _ in range(LAYERS)] for _ in range(2))  # fmt: skip
        self.q, self.out = torch.randn(rows, HEADS, DIM, generator=g), torch.empty(rows, HEADS, DIM)
        self.visible = torch.ones(rows, cached, dtype=torch.uint8)
        self.workspace = torch.empty(2 * cached)
        self.no_prompts = torch.zeros(1, dtype=torch.long)
        self.kv_bytes = LAYERS * rows * HEADS * cached * DIM * 4 * 2
        """What the attention of all layers reads."""

    def attend(self, library, layer: int) -> None:
        """`library`'s `decode_attention` over `layer`'s cache, into `out`, on 2 threads."""
        k, v = self.k[layer], self.v[layer]
        library.decode_attention(
            self.q.data_ptr(), 0, 0, self.no_prompts.data_ptr(), k.data_ptr(), v.data_ptr(),
            self.visible.data_ptr(), self.out.data_ptr(), self.workspace.data_ptr(), self.rows,
            HEADS, HEADS, 0, self.cached, DIM, 0, 0, k.stride(0), k.stride(1), DIM**-0.5, 2,
        )  # fmt: skip


def decode_case(rows: int, cached: int) -> tuple[Callable[[], list[torch.Tensor]], float]:
    """A function running `decode_attention` once per layer over `DecodeCaches(rows,
    cached)`, and the bytes of K/V it reads."""
    caches = DecodeCaches(rows, cached)

    def run() -> list[torch.Tensor]:
        for layer in range(LAYERS):
            caches.attend(cpu_kernels.load(), layer)
        return [caches.out.clone()]

    return run, caches.kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="the kernels of REV: the baseline")
    parser.add_argument("--source", type=Path, nargs="*", default=[], help="variant sources")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if not args.against and not args.source:
        parser.error("give --against REV or --source FILE: something to compare with")
    torch.set_num_threads(2)
    current = cpu_kernels.load()
    if current is None:
        raise SystemExit("the CPU kernels could not be built (see the warning above)")
    with tempfile.TemporaryDirectory() as scratch:
        variants = {}
        if args.against:
            variants[args.against] = library_at(args.against, Path(scratch))
        for i, source in enumerate(args.source):
            built = cpu_kernels.build("cc", Path(scratch) / f"source-{i}", source)
            variants[str(source)] = cpu_kernels.open_library(built)
        variants["working tree"] = current
        cases = {
            "training long": (training_case(4, 512), None),
            "training systems": (training_case(16, 64), None),
            "decode 32 rows x 64": decode_case(32, 64),
            "decode 32 rows x 512": decode_case(32, 512),
        }
        load = cpu_kernels.load
        report = {}
        try:
            for name, (run, kv_bytes) in cases.items():
                seconds = {v: [] for v in variants}
                first, diff = None, {}
                for r in range(args.rounds + 2):
                    for variant, library in variants.items():
                        cpu_kernels.load = lambda library=library: library
                        start = time.perf_counter()
                        outputs = run()
                        elapsed = time.perf_counter() - start
                        if r >= 2:
                            seconds[variant].append(elapsed)
                        first = first or outputs
                        diff[variant] = max(
                            diff.get(variant, 0.0),
                            *(
                                float((a - b).abs().max())
                                for a, b in zip(first, outputs, strict=True)
                            ),
                        )
                base = seconds[next(iter(variants))]
                rows = {}
                for variant, times in seconds.items():
                    rows[variant] = {
                        "median_ms": statistics.median(times) * 1e3,
                        "paired_speedup": statistics.median(
                            b / t for b, t in zip(base, times, strict=True)
                        ),
                        "max_abs_diff": diff[variant],
                    }
                    if kv_bytes:
                        rows[variant]["gb_per_s"] = kv_bytes / statistics.median(times) / 1e9
                    print(name, variant, json.dumps(rows[variant]))
                report[name] = rows
        finally:
            cpu_kernels.load = load
    against = ""
    if args.against:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", args.against],
            cwd=Path(__file__).parent, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        against = f"-vs-{commit}"
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"cpu_attention_ab{against}.json"
    command = "python benchmarks/cpu_attention_ab.py " + " ".join(
        [*(["--against", args.against] if args.against else []),
         *(["--source", *map(str, args.source)] if args.source else []),
         "--rounds", str(args.rounds)]
    )  # fmt: skip
    path.write_text(json.dumps({"command": command, "cases": report}, indent=1) + "\n")


if __name__ == "__main__":
    main()
