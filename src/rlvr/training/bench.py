"""`rlvr bench`: how fast the RL steps of a config run on this machine.

It runs `warmup + steps` steps of `rlvr train` with the config in a temporary directory (no
held-out evaluation, logged samples or loggers; the final checkpoint is written after the
timed steps, and the directory is deleted), drops the warm-up steps (the first one compiles
kernels and fills allocator caches), and reports the median seconds of each phase, the median
sampled tokens per second, and the process's peak memory. The numbers are those `time/*` and
`tokens_per_s` would show in a real run's metrics.jsonl.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
from pathlib import Path

import torch

from rlvr.config import RLConfig
from rlvr.models.loading import resolve_device
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train

PHASES = ("time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s")
"""Per-step metrics whose median the benchmark reports."""


def bench_config(cfg: RLConfig, steps: int, warmup: int, output_dir: str) -> RLConfig:
    """`cfg` for `warmup + steps` steps into `output_dir`, with nothing timed beside the steps."""
    train_cfg = cfg.train.model_copy(
        update={
            "steps": warmup + steps,
            "output_dir": output_dir,
            "save_every": 0,
            "log_samples": 0,
            "log_to": [],
        }
    )
    return cfg.model_copy(
        update={"train": train_cfg, "eval": cfg.eval.model_copy(update={"every_steps": 0})}
    )


def run_bench(cfg: RLConfig, steps: int = 5, warmup: int = 1) -> dict:
    """Medians of `PHASES` over `steps` timed steps after `warmup` ones, the device, torch's
    CPU threads, peak memory, and the timed steps' own values (`per_step`)."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"bench needs steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    device = resolve_device(cfg.model.device)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-") as tmp:
        train(bench_config(cfg, steps, warmup, tmp), show_progress=False)
        records = read_jsonl(Path(tmp) / "metrics.jsonl")[warmup:]
    per_step = [{key: r[key] for key in (*PHASES, "response_length/mean")} for r in records]
    result: dict = {
        "steps": len(per_step),
        "warmup": warmup,
        **{key: statistics.median(r[key] for r in per_step) for key in PHASES},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    if device.type == "cuda":
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    result["per_step"] = per_step
    return result
