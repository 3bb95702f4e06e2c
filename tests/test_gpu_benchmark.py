"""`benchmarks/gpu.py`'s profile summaries: the device's idle time between kernels and the
host's waits, checked on made-up inputs (the script itself needs a GPU)."""

import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import gpu


def test_idle_time_counts_the_gaps_between_overlapping_kernels():
    """Kernels (µs) 0-10, 5-20 (overlapping), 30-35, 35-40 (touching), 100-110: the span is
    110, busy 20 + 10 + 10 = 40, idle 70, in gaps of 60 (after the 35-40 kernel) and 10
    (after the one that ended last at 20, not the one that started last)."""
    kernels = [(30, 35, "c"), (0, 10, "a"), (5, 20, "b"), (100, 110, "e"), (35, 40, "d")]
    result = gpu.idle_time(kernels)
    assert result["span_ms"] == pytest.approx(0.110)
    assert result["busy_ms"] == pytest.approx(0.040)
    assert result["idle_ms"] == pytest.approx(0.070)
    assert result["gaps"] == [
        {"ms": pytest.approx(0.060), "after": "d", "before": "e"},
        {"ms": pytest.approx(0.010), "after": "b", "before": "c"},
    ]
    nested = gpu.idle_time([(0, 50, "long"), (10, 20, "inside"), (60, 70, "next")])
    assert nested["gaps"] == [{"ms": pytest.approx(0.010), "after": "long", "before": "next"}]
    assert gpu.idle_time([])["idle_ms"] == 0.0


def test_sync_sites_counts_the_debug_modes_warnings_by_line(monkeypatch):
    """Each "called a synchronizing" warning counted at the line that made it; other
    warnings left out; the debug mode set back afterwards."""
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def step() -> None:
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("something else", stacklevel=1)

    sites = gpu.sync_sites(step)
    line_a = step.__code__.co_firstlineno + 2
    assert sites == {f"test_gpu_benchmark.py:{line_a}": 3, f"test_gpu_benchmark.py:{line_a + 1}": 1}
    assert modes == ["warn", "default"]


def test_the_decode_matmuls_are_the_steps_weights_and_their_least_traffic():
    """`benchmarks/decode_matmuls.py`'s products of a decode step read each of the model's
    linear weights once (`gpu.matmul_params`, counted from the modules themselves): for the
    0.5B shape 493,961,216, its 494,032,768 parameters less its norms (49 × 896) and q/k/v
    biases (24 × 1,152). The o product at 64 rows moves its weights, its input and the
    stream read and written once: (896² + 64 · 896 · 3) · 2 bytes."""
    import decode_matmuls as dm

    for shape in dm.SHAPES:
        with torch.device("meta"):
            model = gpu.SHAPES[shape]()
        weights = sum(m.inputs * m.outputs * m.per_step for m in dm.step_matmuls(shape))
        assert weights == gpu.matmul_params(model)
    matmuls = dm.step_matmuls("0.5b")
    assert sum(m.inputs * m.outputs * m.per_step for m in matmuls) == 493_961_216
    o = next(m for m in matmuls if m.name == "o")
    assert dm.traffic(o, 64) == (896 * 896 + 64 * 896 * 3) * 2
    qkv = next(m for m in matmuls if m.name == "q/k/v")
    assert dm.traffic(qkv, 64) == (896 * 1152 + 64 * 896 + 64 * 1152) * 2
