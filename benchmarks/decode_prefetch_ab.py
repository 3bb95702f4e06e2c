"""Whether the decode step's products could stream the next attention's K/V cache into the
CPU's caches while they multiply (software prefetches), so that the attention, which reads
the cache at the memory bandwidth once it outgrows the L3 cache (`decode_steps.py`), would
read it from there instead. Measured and dropped (docs/benchmarks.md, fourteenth session).

A stand-alone decode step at the scaling benchmark's L = 512 end: 4 layers of the demo's
shape (hidden 192, MLP 576, 4 heads × 48), 32 rows, `--cached` positions each; per layer the
q/k/v, o, gate/up and down products (`panel_linear`) and the attention (`decode_attention`).
The variant is `panel_linear` with one `__builtin_prefetch` per 64-byte line of the next
attention's cache, spread over its panels and row blocks, the cache's lines shared among the
four products before that attention by their FLOPs (`--fraction` of the cache, the `--hint`
locality). It is built from a copy of `cpu_kernels.c` with the variant appended (the library
itself has no such function), and the step with the prefetches alternates with the step
without in one process, 2 threads.

    python benchmarks/decode_prefetch_ab.py [--cached 512] [--fraction 0.25] [--hint 3]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cpu_attention_ab import DIM, HEADS, LAYERS, DecodeCaches

from rlvr.models import cpu_kernels

ROWS, HIDDEN, MLP = 32, 192, 576
LINE_FLOATS = 16  # a 64-byte cache line

PREFETCHING_PRODUCT = r"""
/* panel_linear, prefetching lines [from, to) of `regions` (each region_lines 64-byte lines,
   line q at regions[q / region_lines] + (q % region_lines) * 64 bytes) spread over its panels
   and their row blocks, with locality `hint`. */
void panel_linear_prefetch(const float *x, const float *panels, long m, long k,
                           float *y, long n, int threads, const float *const *regions,
                           long region_lines, long from, long to, int hint) {
    long total = (n + PANEL - 1) / PANEL, blocks = (m + ROWS - 1) / ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long p = 0; p < total; p++) {
        long j0 = p * PANEL, cols = n - j0 < PANEL ? n - j0 : PANEL;
        const float *panel = panels + p * PANEL * k;
        long a = from + (to - from) * p / total, b = from + (to - from) * (p + 1) / total;
        for (long i = 0, block = 0; i < m; i += ROWS, block++) {
            long s = a + (b - a) * block / blocks, e = a + (b - a) * (block + 1) / blocks;
            for (long q = s; q < e; q++) {
                const char *line = (const char *)regions[q / region_lines];
                line += (q % region_lines) * 64;
                if (hint == 3) __builtin_prefetch(line, 0, 3);
                else if (hint == 2) __builtin_prefetch(line, 0, 2);
                else if (hint == 1) __builtin_prefetch(line, 0, 1);
                else __builtin_prefetch(line, 0, 0);
            }
            if (i + ROWS <= m) full_block(x + i * k, panel, 0, y + i * n + j0, n, k, cols);
            else part_block(x + i * k, panel, 0, y + i * n + j0, n, k, m - i, cols);
        }
    }
}
"""


def build_variant(scratch: Path) -> ctypes.CDLL:
    """The kernels with `panel_linear_prefetch` appended, built with the library's flags."""
    source = scratch / "cpu_kernels_prefetch.c"
    source.write_text(cpu_kernels.SOURCE.read_text() + PREFETCHING_PRODUCT)
    library = cpu_kernels.open_library(cpu_kernels.build("cc", scratch, source))
    p, n = ctypes.c_void_p, ctypes.c_long
    library.panel_linear_prefetch.argtypes = [p, p, n, n, p, n, ctypes.c_int, p, n, n, n,
                                              ctypes.c_int]  # fmt: skip
    return library


class DecodeStep:
    """The layers' packed weights, their K/V caches (`cpu_attention_ab.DecodeCaches`) and one
    step over them."""

    def __init__(self, library: ctypes.CDLL, cached: int, fraction: float, hint: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.library, self.hint = library, hint
        self.caches = DecodeCaches(ROWS, cached)
        shapes = {"o": (HIDDEN, HIDDEN), "gate_up": (2 * MLP, HIDDEN), "down": (HIDDEN, MLP),
                  "qkv": (3 * HIDDEN, HIDDEN)}  # fmt: skip
        self.weights = [{name: self.packed(*shape, g) for name, shape in shapes.items()}
                        for _ in range(LAYERS)]  # fmt: skip
        # The products between one attention and the next, in order, as (layer offset, name):
        # the previous layer's o, gate/up and down, then the layer's own q/k/v.
        self.products = [(-1, "o"), (-1, "gate_up"), (-1, "down"), (0, "qkv")]
        flops = [shapes[name][0] * shapes[name][1] for _, name in self.products]
        self.region_lines = cached * DIM // LINE_FLOATS
        lines = int(fraction * 2 * ROWS * HEADS * self.region_lines)
        bounds = [lines * sum(flops[:i]) // sum(flops) for i in range(len(flops) + 1)]
        self.shares = list(itertools.pairwise(bounds))
        self.regions = []
        for layer in range(LAYERS):
            cache = (self.caches.k[layer], self.caches.v[layer])
            starts = [t[b, h].data_ptr() for t in cache
                      for b in range(ROWS) for h in range(HEADS)]  # fmt: skip
            self.regions.append((ctypes.c_void_p * len(starts))(*starts))
        self.inputs = {"o": torch.randn(ROWS, HIDDEN, generator=g),
                       "gate_up": torch.randn(ROWS, HIDDEN, generator=g),
                       "down": torch.randn(ROWS, MLP, generator=g),
                       "qkv": torch.randn(ROWS, HIDDEN, generator=g)}  # fmt: skip
        self.outputs = {name: torch.empty(ROWS, shapes[name][0]) for name in shapes}

    def packed(self, n: int, k: int, g: torch.Generator) -> torch.Tensor:
        """A random weight [n, k] packed into panels (`pack_panels`)."""
        weight = torch.randn(n, k, generator=g) * 0.05
        panels = torch.empty((n + 15) // 16 * 16 * k)
        self.library.pack_panels(weight.data_ptr(), panels.data_ptr(), n, k)
        return panels

    def product(self, layer: int, name: str, share: tuple[int, int] | None) -> None:
        """One product, prefetching the `share` of `layer`'s cache lines (None: the library's
        own `panel_linear`)."""
        panels, x, y = self.weights[layer][name], self.inputs[name], self.outputs[name]
        n, k = y.shape[1], x.shape[1]
        if share is None:
            self.library.panel_linear(
                x.data_ptr(), panels.data_ptr(), ROWS, k, 1, (ctypes.c_void_p * 1)(y.data_ptr()),
                (ctypes.c_long * 1)(n), (ctypes.c_void_p * 1)(None), 2,
            )  # fmt: skip
        else:
            self.library.panel_linear_prefetch(
                x.data_ptr(), panels.data_ptr(), ROWS, k, y.data_ptr(), n, 2,
                self.regions[layer], self.region_lines, *share, self.hint,
            )  # fmt: skip

    def run(self, prefetch: bool) -> tuple[float, float]:
        """One step; returns its seconds and its attention's."""
        start, attention = time.perf_counter(), 0.0
        for layer in range(LAYERS):
            for (offset, name), share in zip(self.products, self.shares, strict=True):
                self.product(layer + offset, name, share if prefetch else None)
            before = time.perf_counter()
            self.caches.attend(self.library, layer)
            attention += time.perf_counter() - before
        return time.perf_counter() - start, attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cached", type=int, default=512, help="cached positions per row")
    parser.add_argument("--fraction", type=float, default=0.25, help="of the cache prefetched")
    parser.add_argument("--hint", type=int, choices=range(4), default=3, help="locality 0-3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per round and side")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        step = DecodeStep(build_variant(Path(scratch)), args.cached, args.fraction, args.hint)
        times = {False: [], True: []}
        for round_ in range(args.rounds + 2):
            for prefetch in (False, True):
                runs = [step.run(prefetch) for _ in range(args.steps)]
                if round_ >= 2:  # two warm-up rounds
                    times[prefetch].append(tuple(map(statistics.mean, zip(*runs))))
    (base, base_attention), (new, new_attention) = (
        [statistics.median(column) * 1e3 for column in zip(*times[side])] for side in (False, True)
    )
    print(
        f"{args.cached} positions, {args.fraction:g} of the cache prefetched (hint {args.hint}): "
        f"step {base:.2f} -> {new:.2f} ms ({base / new:.3f}x), "
        f"its attention {base_attention:.2f} -> {new_attention:.2f} ms"
    )


if __name__ == "__main__":
    main()
