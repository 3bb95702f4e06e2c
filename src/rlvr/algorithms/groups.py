"""Shared checks and statistics over prompt groups (samples with the same `group_ids` value)."""

from __future__ import annotations

import torch
from torch import Tensor


def check_grouped(rewards: Tensor, group_ids: Tensor) -> None:
    """Raise ValueError unless `rewards` is [N] and `group_ids` an integer [N] tensor."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape "
            f"{tuple(rewards.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def constant_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[N] bool: True where every reward of the sample's group is equal (singletons included).

    Vectorised over groups (`unique` + `scatter_reduce`); ids may be any integers in any order.
    """
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    r = rewards.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1
    empty = torch.empty(num_groups, dtype=torch.float64, device=r.device)
    gmax = empty.scatter_reduce(0, inverse, r, reduce="amax", include_self=False)
    gmin = empty.scatter_reduce(0, inverse, r, reduce="amin", include_self=False)
    return (gmax == gmin)[inverse]


def group_pass_rates(correct: Tensor, group_ids: Tensor, num_groups: int) -> list[float]:
    """Share of correct samples in each group 0..num_groups-1 (``group_ids`` counted from 0).

    Raises ValueError if a group has no sample or an id is outside [0, num_groups).
    """
    check_grouped(correct.float(), group_ids)
    if len(group_ids) and (int(group_ids.min()) < 0 or int(group_ids.max()) >= num_groups):
        raise ValueError(f"group ids must lie in [0, {num_groups}), got {group_ids.tolist()}")
    counts = torch.zeros(num_groups).index_add_(0, group_ids, torch.ones(len(group_ids)))
    if bool((counts == 0).any()):
        raise ValueError(f"groups {(counts == 0).nonzero().flatten().tolist()} have no sample")
    hits = torch.zeros(num_groups).index_add_(0, group_ids, correct.float())
    return (hits / counts).tolist()
