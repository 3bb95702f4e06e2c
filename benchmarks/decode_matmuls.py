"""GPU timings of the captured decode step's matmuls alone, at the rows of a step: the rate at
which each reads its weights, against the copy bandwidth measured in the same run.

The 0.5B step at 64 rows took 1.118 ms for 186 kernels on an H200 (11-26, sixth session),
6 µs a kernel, where scaling with the kernel count had predicted 0.80 ms. Its matmuls read
0.99 GB of weights a step (0.26 ms at the measured copy bandwidth); if cuBLAS reads them at
a fraction of that rate for 64-row products, the step is bound by the matmuls' bandwidth,
not by its kernel count. Per layer the step runs (`graph_step.decode_hidden`): the packed
q/k/v product, the o product added into the residual stream (`residual_linear`), the packed
gate/up product and the down product added into the stream; then the LM head once. Each is
timed as the replay of a CUDA graph of 20 calls (`decode_attention_ab.graph_ms`), bf16;
the copy bandwidth is `gpu.measured_copy_bandwidth`'s.

    python benchmarks/decode_matmuls.py     # the 0.5b and 100m shapes, 64 and 512 rows

Results go to `benchmarks/results/decode_matmuls.json` with the device and versions.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import gpu
from decode_attention_ab import graph_ms

RESULTS = Path(__file__).parent / "results" / "decode_matmuls.json"
SHAPES = ("0.5b", "100m")
"""Of `gpu.SHAPES`."""


class Matmul(NamedTuple):
    name: str
    inputs: int  # columns of the rows' input (k)
    outputs: int  # columns of the result (n)
    residual: bool  # added into the residual stream in place (`residual_linear`)
    per_step: int  # calls a step makes


def step_matmuls(shape: str) -> list[Matmul]:
    """The products a decode step of `gpu.SHAPES[shape]` makes, with the packed q/k/v and
    gate/up weights (the model built on the meta device: its config, no memory)."""
    with torch.device("meta"):
        c = gpu.SHAPES[shape]().config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    width, layers = c.num_attention_heads * d, c.num_hidden_layers
    return [
        Matmul("q/k/v", c.hidden_size, width + 2 * c.num_key_value_heads * d, False, layers),
        Matmul("o", width, c.hidden_size, True, layers),
        Matmul("gate/up", c.hidden_size, 2 * c.intermediate_size, False, layers),
        Matmul("down", c.intermediate_size, c.hidden_size, True, layers),
        Matmul("LM head", c.hidden_size, c.vocab_size, False, 1),
    ]


def traffic(m: Matmul, rows: int, element: int = 2) -> int:
    """Bytes one call must move at the least: the weights once, the input, and the result
    written (and, added into the stream, read first)."""
    result = rows * m.outputs * (2 if m.residual else 1)
    return (m.inputs * m.outputs + rows * m.inputs + result) * element


def main() -> None:
    torch.manual_seed(0)
    copy = gpu.measured_copy_bandwidth(torch.device("cuda"), torch.bfloat16) / 1e9
    report = {
        "command": " ".join(["python", "benchmarks/decode_matmuls.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_gb_s": copy,
        "results": [],
    }
    for shape in SHAPES:
        for rows in (64, 512):
            step_ms = 0.0
            for m in step_matmuls(shape):
                x = torch.randn(rows, m.inputs, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(m.outputs, m.inputs, device="cuda", dtype=torch.bfloat16) / 30
                h = torch.zeros(rows, m.outputs, device="cuda", dtype=torch.bfloat16)
                call = partial(h.addmm_, x, w.t()) if m.residual else partial(F.linear, x, w)
                ms = graph_ms(call)
                step_ms += ms * m.per_step
                entry = {
                    "shape": shape,
                    "rows": rows,
                    "matmul": m.name,
                    "ms": ms,
                    "gb_s": traffic(m, rows) / ms / 1e6,
                    "share_of_copy": traffic(m, rows) / ms / 1e6 / copy,
                    "tflops": 2 * rows * m.inputs * m.outputs / ms / 1e9,
                }
                report["results"].append(entry)
                print(entry, flush=True)
            report["results"].append({"shape": shape, "rows": rows, "step_matmuls_ms": step_ms})
            print(shape, rows, "matmuls per step", round(step_ms, 3), "ms", flush=True)
            RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
