"""AdamW and the warm-up + cosine learning-rate schedule shared by SFT and RL."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters: PyTorch's fused kernel when they are all on a GPU
    (one kernel for every parameter instead of its `foreach` chain of a dozen passes), its
    default elsewhere. On a CPU the fused kernel is 5× faster too, but rounds differently
    from the default, and the demo's cold-start SFT amplifies that (`docs/benchmarks.md`,
    "Fused AdamW"), so the CPU keeps the default."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None
    )


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Linear warm-up to 1, then constant or cosine decay to `min_lr_ratio` at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying `lr_multiplier`; step it once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            schedule=schedule,
            min_lr_ratio=min_lr_ratio,
        ),
    )
