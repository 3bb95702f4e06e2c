"""Side-by-side GPU timings of the ways to compute a decode step's attention
(`graph_step.decode_attention`): one query per row over the first `span` columns of a
[rows, kv_heads, capacity, head_dim] cache buffer, under an additive mask.

Ways: PyTorch's scaled-dot-product attention with the query heads of each K/V head folded into
its query axis, with the backend PyTorch picks and with each backend forced; the same with
`enable_gqa` (query heads as heads); two batched matmuls with a softmax (`fused.attention`,
as before lever 25); and our split-KV kernel (`triton_ops.decode_attention`, lever 46) with
the splits it picks and with 1, 4 and 8. Each way is timed as the replay of a CUDA graph of
20 calls; a way a backend refuses is recorded with its error.

    python benchmarks/decode_attention_ab.py     # the 0.5b (GQA 14/2) and 100m (12/12) shapes

Results go to `benchmarks/results/decode_attention_ab.json` with the device and versions.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlvr.models import fused
from rlvr.rollout import triton_ops
from rlvr.rollout.graphs import capture

RESULTS = Path(__file__).parent / "results" / "decode_attention_ab.json"
SHAPES = {"0.5b": (14, 2), "100m": (12, 12)}  # query heads, K/V heads; head_dim 64
BACKENDS = {
    "picked": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def folded(q, k, v, bias, scale, backend):
    b, heads, d = q.shape
    q = q.view(b, k.shape[1], heads // k.shape[1], d)
    with sdpa_kernel(backend) if backend else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def gqa(q, k, v, bias, scale, backend):
    with sdpa_kernel(backend) if backend else nullcontext():
        return F.scaled_dot_product_attention(
            q[:, :, None], k, v, attn_mask=bias, scale=scale, enable_gqa=True
        )


def matmuls(q, k, v, bias, scale, backend):
    return fused.attention(q[:, :, None], k, v, bias, scale)


def ours(q, k, v, bias, scale, splits):
    return triton_ops.decode_attention(q, k, v, bias, scale, splits)


OPTIONS = {  # way: {option name: the backend or the splits it passes}
    "folded": BACKENDS,
    "gqa": BACKENDS,
    "matmuls": {"-": None},
    "ours": {"picked": None, "1 split": 1, "4 splits": 4, "8 splits": 8},
}


def graph_ms(fn, calls: int = 20, repeats: int = 5) -> float:
    """Median ms per call of `fn` replayed from a CUDA graph of `calls` calls."""
    replay = capture(lambda: [fn() for _ in range(calls)])
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    report = {
        "command": " ".join(["python", "benchmarks/decode_attention_ab.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "results": [],
    }
    capacity, span, d = 640, 384, 64
    for shape, (heads, kv) in SHAPES.items():
        for rows in (64, 512):
            cache = torch.randn(2, rows, kv, capacity, d, device="cuda", dtype=torch.bfloat16)
            k, v = cache[0, :, :, :span], cache[1, :, :, :span]
            q = torch.randn(rows, heads, d, device="cuda", dtype=torch.bfloat16)
            mask = torch.ones(rows, span, dtype=torch.bool, device="cuda")
            mask[:, :16] = False  # left padding
            mask[:, span - 20 :] = False  # columns not written yet
            bias = fused.additive_bias(mask[:, None, :], torch.bfloat16)
            want = matmuls(q, k, v, bias, 0.125, None).float().reshape(rows, -1)
            kv_bytes = 2 * k.numel() * k.element_size()
            ways = (("folded", folded), ("gqa", gqa), ("matmuls", matmuls), ("ours", ours))
            for way, fn in ways:
                for name, backend in OPTIONS[way].items():
                    entry = {"shape": shape, "rows": rows, "span": span, "way": way}
                    entry["backend"] = name
                    try:
                        got = fn(q, k, v, bias, 0.125, backend).float().reshape(rows, -1)
                        entry["max_abs_diff"] = float((got - want).abs().max())
                        args = (q, k, v, bias, 0.125, backend)
                        ms = graph_ms(partial(fn, *args))
                        entry["ms"], entry["kv_gb_s"] = ms, kv_bytes / ms / 1e6
                    except RuntimeError as error:
                        entry["error"] = str(error).splitlines()[0][:200]
                    report["results"].append(entry)
                    print(entry, flush=True)
                    RESULTS.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
