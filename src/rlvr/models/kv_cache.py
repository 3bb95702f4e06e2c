"""The KV caches of the fused forward (`rlvr.models.fused`): differentiable ones for training
(`ConcatKV`), and the rollout's preallocated decode buffers (`BufferKV`, over a `BufferPool`
kept between rollouts on a CPU; `SharedPromptKV`, whose samples read their prompt's keys in
place), with the row selection that drops finished rows (`select_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from rlvr.models import cpu_kernels


def padded(x: torch.Tensor, flat: torch.Tensor | None, b: int, t: int) -> torch.Tensor:
    """[b, heads, t, d] from per-token rows x [N, heads, d] at the `flat` positions of the
    [b·t] layout (zeros at padding), or from x [b, t, heads, d] where `flat` is None."""
    if flat is not None:
        x = x.new_zeros(b * t, *x.shape[1:]).index_copy(0, flat, x)
    return x.view(b, t, *x.shape[-2:]).transpose(1, 2)


class ConcatKV:
    """Per-layer keys/values grown by concatenation: differentiable (training).

    A row selection (`batch_select_indices`, e.g. a prompt's cache for each of its samples) and
    positions appended per token (`append_tokens`) are kept as they are until the keys are read
    (`update`), so that the attention kernels can read a prompt's keys once for its samples
    (`KernelOps`)."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.rows: list[torch.Tensor | None] = [None] * num_layers
        self.tails: list[tuple | None] = [None] * num_layers
        self.length = 0

    def stored(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer`'s keys and values [b, kv_heads, s, d] with the pending selection and
        positions applied."""
        k, v, rows, tail = self.keys[layer], self.values[layer], self.rows[layer], self.tails[layer]
        if rows is not None:
            k, v = k.index_select(0, rows), v.index_select(0, rows)
        if tail is not None:
            tk, tv, flat, b, t = tail
            k = torch.cat([k, padded(tk, flat, b, t)], dim=2)
            v = torch.cat([v, padded(tv, flat, b, t)], dim=2)
        self.keys[layer], self.values[layer] = k, v
        self.rows[layer] = self.tails[layer] = None
        return k, v

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append positions to `layer`; return all of its keys and values."""
        if self.keys[layer] is not None:
            old_k, old_v = self.stored(layer)
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def append_tokens(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        flat: torch.Tensor | None,
        b: int,
        t: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append positions given per token (`padded`'s input) to a filled `layer` without laying
        them out; return the keys and values before them and the pending row selection of those
        (None: none) as they are."""
        if self.tails[layer] is not None:
            self.stored(layer)
        before = self.keys[layer], self.values[layer], self.rows[layer]
        self.tails[layer] = (k, v, flat, b, t)
        return before

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep (or repeat) rows `indices`, e.g. a prompt's cache for each of its samples."""
        for layer, tail in enumerate(self.tails):
            if tail is not None:
                self.stored(layer)
        self.rows = [
            None if k is None else indices if r is None else r.index_select(0, indices)
            for k, r in zip(self.keys, self.rows, strict=True)
        ]


Allocate = Callable[[tuple[int, ...]], torch.Tensor]
"""Returns an uninitialised buffer of the given shape (for `select_rows`)."""


def select_rows(
    buffer: torch.Tensor, rows: torch.Tensor, length: int, allocate: Allocate | None = None
) -> torch.Tensor:
    """Rows `rows` of a [batch, heads, capacity, dim] cache buffer whose first `length`
    positions are filled; only those positions are copied.

    When no more rows are asked for than the buffer has (finished rows leaving the batch, `rows`
    increasing), they are compacted into its leading rows and a view of those is returned: on a
    CPU by `cpu_kernels.compact_rows`, which copies each moved row once. Otherwise (a prompt's
    cache repeated for its samples) a new buffer is taken from `allocate` (default: a fresh
    tensor), which must not share memory with `buffer`.
    """
    n = len(rows)
    if n <= buffer.shape[0]:
        if not cpu_kernels.compact_rows(buffer, rows, length):
            buffer[:n, :, :length] = buffer[rows, :, :length]
        return buffer[:n]
    shape = (n, *buffer.shape[1:])
    out = allocate(shape) if allocate is not None else buffer.new_empty(shape)
    out[:, :, :length] = buffer[rows, :, :length]
    return out


class BufferPool:
    """Flat storages that outlive one rollout, for the decode cache on a CPU.

    A rollout's cache is tens of MB. glibc returns such freed blocks to the kernel, so a fresh
    cache every rollout is fresh pages that fault in one by one (about 16k minor faults for the
    systems-mode batch of `benchmarks/vs_trl.py`). Keeping the memory between rollouts avoids
    that (`benchmarks/kv_reuse_ab.py`). On a GPU PyTorch's caching allocator already reuses
    freed memory, and holding the cache there would keep it from the update's activations, so
    the rollout engine uses a pool on the CPU only. One storage per key, grown to the largest
    size asked for; its contents are never read before they are written.
    """

    def __init__(self) -> None:
        self.storages: dict[tuple, torch.Tensor] = {}

    def empty(self, key: tuple, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised [shape] tensor of `like`'s dtype and device, stored under `key`."""
        numel = math.prod(shape)
        storage = self.storages.get(key)
        if (
            storage is None
            or storage.numel() < numel
            or storage.dtype != like.dtype
            or storage.device != like.device
        ):
            storage = self.storages[key] = like.new_empty(numel)
        return storage[:numel].view(shape)


class BufferKV:
    """Per-layer [batch, kv_heads, capacity, head_dim] buffers written in place (inference).

    With a `pool`, the buffers come from it: each layer's keys and values alternate between two
    of its storages, so a prompt's cache repeated for its samples never overwrites its source.
    """

    def __init__(
        self, num_layers: int, capacity: int, pool: BufferPool | None = None, slot: int = 0
    ) -> None:
        """`slot`: the pool's first storage slot for these buffers (`SharedPromptKV` keeps its
        rows' own apart from the prompts' slots 0 and 1)."""
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.capacity, self.length = capacity, 0
        self.pool = pool
        self.slot = slot

    def _empty(
        self, name: str, layer: int, like: torch.Tensor, shape: tuple[int, ...]
    ) -> torch.Tensor:
        if self.pool is None:
            return like.new_empty(shape)
        return self.pool.empty((name, layer, self.slot), like, shape)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write positions [length, length + t) of `layer`; return the filled part."""
        if self.keys[layer] is None:
            b, h, _, d = k.shape
            self.keys[layer] = self._empty("keys", layer, k, (b, h, self.capacity, d))
            self.values[layer] = self._empty("values", layer, v, (b, h, self.capacity, v.shape[-1]))
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} positions is full")
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep (or repeat) rows `indices`; repeated rows go to the pool's other slot."""
        if any(len(indices) > k.shape[0] for k in self.keys if k is not None):
            self.slot = 1 - self.slot
        for name, store in (("keys", self.keys), ("values", self.values)):
            for layer, buffer in enumerate(store):
                allocate = partial(self._empty, name, layer, buffer)
                store[layer] = select_rows(buffer, indices, self.length, allocate)


class SharedPromptKV:
    """A decode cache that keeps each prompt's keys and values once for all of its samples
    (for `cpu_kernels.DecodeOps`, whose attention reads them in place): the prefill's
    `BufferKV` [prompts, kv_heads, capacity, head_dim] holds the prompts' positions, and
    per-layer [rows, kv_heads, capacity - prompt length, head_dim] buffers the positions each
    row decodes. Row b's prompt is `prompt_of[b]`. A CPU decode step reads every key of every
    row once, so a prompt's keys, copied into each of its `n` rows' cache, were read n times.

    `update` returns the row's own keys and values, then the prompts' and `prompt_of`, as
    `DecodeOps.attention` takes them; only finished rows leaving the batch are selected later
    (`batch_select_indices`), the prompts' buffers staying as they are.
    """

    def __init__(
        self, prompts: BufferKV, prompt_of: torch.Tensor, pool: BufferPool | None = None
    ) -> None:
        """`prompt_of` is checked where the attention reads it (`DecodeOps.attention`)."""
        self.prompts, self.prompt_length = prompts, prompts.length
        self.prompt_of = prompt_of.to(torch.long).contiguous()
        self.own = BufferKV(len(prompts.keys), prompts.capacity - prompts.length, pool, slot=2)

    @property
    def length(self) -> int:
        """Positions filled so far, the prompts' and each row's own."""
        return self.prompt_length + self.own.length

    @length.setter
    def length(self, value: int) -> None:
        self.own.length = value - self.prompt_length

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write the rows' positions [length, length + t) of `layer`; return their own filled
        part, the prompts' keys and values, and `prompt_of`."""
        end = self.prompt_length
        prompt_k = self.prompts.keys[layer][:, :, :end]
        prompt_v = self.prompts.values[layer][:, :, :end]
        return *self.own.update(layer, k, v), prompt_k, prompt_v, self.prompt_of

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (increasing: finished rows leaving the batch)."""
        if len(indices) > len(self.prompt_of):
            raise ValueError("SharedPromptKV: rows can leave the batch, not be repeated")
        if self.own.keys[0] is not None:  # not before the first decode step
            self.own.batch_select_indices(indices)
        self.prompt_of = self.prompt_of[indices]


class KVStore(Protocol):
    """What the forward needs of a cache (`ConcatKV`, `BufferKV`, `SharedPromptKV`, the CUDA-graph
    `SlotKV`)."""

    length: int

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Add positions to `layer`; return the keys and values attention reads."""
        ...
