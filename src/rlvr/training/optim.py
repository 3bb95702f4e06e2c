"""AdamW, optionally sharded over the data-parallel ranks, and the warm-up + cosine
learning-rate schedule shared by SFT, DPO and RL."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from rlvr.training import sharding


def optimizer_steps(steps: int, epochs: float | None, rows: int, batch_size: int) -> int:
    """`steps`, or with `epochs` set the steps that pass over `rows` examples that many
    times, `batch_size` a step: ceil(epochs × rows / batch_size)."""
    if epochs is None:
        return steps
    return max(1, math.ceil(epochs * rows / batch_size - 1e-9))


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups: the matrices (projections, embeddings, LoRA's A and B)
    decayed by `weight_decay`, the vectors (norm gains, biases) not, as Hugging Face's Trainer
    and OpenRLHF leave biases and norm weights out of the decay. Decoupled decay shrinks each
    decayed weight by lr · λ · w a step (Loshchilov & Hutter 2019, "Decoupled Weight Decay
    Regularization", Algorithm 2, line 12); pulling a norm's gain towards 0 rather than 1, or
    a bias towards 0, only fights the scale the layer needs. Every trainable parameter is in
    one group, in the model's order within it; an empty group is left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    shard: bool = False,
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, weight decay on the matrices only
    (`decay_groups`): PyTorch's fused kernel when they are all on a GPU (one kernel for every
    parameter instead of its `foreach` chain of a dozen passes), its default elsewhere. On a
    CPU the fused kernel is 5× faster too, but rounds differently from the default, and the
    demo's cold-start SFT amplifies that (`docs/benchmarks.md`, "Fused AdamW"), so the CPU
    keeps the default.

    With `shard` under several data-parallel ranks (an initialised process group), the
    optimizer state is partitioned: each rank keeps the moments of its own part of the
    parameters, steps that part from the summed gradient every rank holds, and broadcasts it
    to the others (ZeRO stage 1, Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models"; PyTorch's `ZeroRedundancyOptimizer`). AdamW's 8 bytes
    per fp32 parameter fall to about 8/R per rank, for one broadcast of the weights per step;
    each parameter takes the same AdamW arithmetic, so the weights are those of the replicated
    optimizer. In one process, or for a model FSDP already shards (`train.fsdp`), `shard`
    changes nothing."""
    groups = decay_groups(model, weight_decay)
    fused = bool(groups) and all(p.is_cuda for group in groups for p in group["params"])
    settings = {"lr": lr, "betas": betas, "fused": fused or None}
    if (
        shard
        and dist.is_initialized()
        and dist.get_world_size() > 1
        and not sharding.is_sharded(model)
    ):
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **settings)
    return torch.optim.AdamW(groups, **settings)


def reset_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget AdamW's moments and step count (each rank its own part, when sharded): the next
    step is a fresh optimizer's first. ProRL's hard reset at a reference reset (Liu et al.
    2025, "ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large
    Language Models", arXiv:2505.24864, §2.3.1); the learning rate stays the schedule's."""
    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    inner.state.clear()


def optimizer_state(
    optimizer: torch.optim.Optimizer, model: nn.Module | None = None
) -> dict[str, Any] | None:
    """The whole optimizer state, for a checkpoint. A sharded optimizer's parts (or those of
    the FSDP-sharded `model`'s, `sharding.whole_optimizer_state`) are gathered on rank 0,
    which gets the state a replicated optimizer would hold (so either kind resumes from it);
    every rank must call this, and the others get None."""
    if model is not None and sharding.is_sharded(model):
        return sharding.whole_optimizer_state(model, optimizer)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if dist.get_rank() == 0 else None
    return optimizer.state_dict()


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict[str, Any], model: nn.Module
) -> None:
    """Inverse of `optimizer_state`, on every rank (`model` is the one the optimizer trains)."""
    state = regrouped(state, optimizer, model)
    if sharding.is_sharded(model):
        sharding.load_whole_optimizer_state(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def regrouped(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, model: nn.Module
) -> dict[str, Any]:
    """A checkpoint's optimizer `state` laid out in `optimizer`'s groups: one saved before
    12-06, with every parameter in one group in the model's order (`decay_groups` came then),
    has its moments moved to their parameters' places in the groups, and each group its own
    weight decay; any other state is returned as it is."""
    groups = optimizer.param_groups
    if len(state["param_groups"]) != 1 or len(groups) == 1:
        return state
    place = {id(p): i for i, p in enumerate(p for group in groups for p in group["params"])}
    order = [place[id(p)] for p in model.parameters() if p.requires_grad]
    saved, start = state["param_groups"][0], 0
    layout = []
    for group in groups:
        count = len(group["params"])
        layout.append(
            {
                **saved,
                "weight_decay": group["weight_decay"],
                "params": list(range(start, start + count)),
            }
        )
        start += count
    moments = {order[index]: value for index, value in state["state"].items()}
    return {"state": moments, "param_groups": layout}


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
