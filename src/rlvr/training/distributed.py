"""Data parallelism across the processes `torchrun` starts: replicated weights, summed gradients.

How one RL step splits across R ranks (`rlvr.training.rl`):

- every rank draws the same prompts (same sampler, same seed); rank r samples and scores its
  contiguous chunk of them (`Ranks.chunk`) with its own generator (seed + r), and the scored
  chunks are gathered in rank order, so every rank holds the whole batch, in the order one
  process would have built it;
- filters, advantages, controllers and metrics then run on every rank from identical inputs;
- each mini-batch's rows are split among the ranks (`Ranks.share`); a rank runs forward and
  backward on its share only, normalised over the whole mini-batch (DESIGN rule 4), and the
  gradients are summed across ranks, so the optimizer steps on the single-process gradient
  whatever the number of ranks (tests/test_distributed.py);
- weights are replicated, as in DDP, and so is the optimizer state unless
  `train.shard_optimizer` partitions it over the ranks (ZeRO stage 1, `optim.build_optimizer`),
  or `train.fsdp` shards weights, gradients and state (FSDP2, `rlvr.training.sharding`); the
  held-out evaluation is split by chunks of problems too; rank 0 alone writes logs and
  checkpoints.

`rlvr sft` and `rlvr dpo` split their batches the same way. One process is `Ranks()`, rank 0
of 1, whose collectives do nothing.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rlvr.config import ConfigError

T = TypeVar("T")
BUCKET_ELEMENTS = 1 << 24
"""Gradient elements summed per collective (64 MB of fp32): few calls, bounded extra memory."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks, and the collectives the loop uses."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Whether this rank writes the run directory (rank 0)."""
        return self.rank == 0

    def chunk(self, n: int) -> range:
        """This rank's contiguous part of `n` items; the first `n % world` ranks take one more."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def share(self, rows: Sequence[int], groups: Sequence[int], costs: Sequence[int]) -> list[int]:
        """This rank's part of the mini-batch `rows`, in their order.

        `groups[r]` and `costs[r]` are row r's group id and token count. Whole groups are
        dealt out (a group's samples share one prompt prefix in the packed forward), largest
        first, each to the least loaded rank (Graham's LPT rule); when there are fewer groups
        than ranks, single rows are. Every rank computes the same deal from the same inputs.
        """
        if self.world == 1:
            return list(rows)
        units: dict[int, list[int]] = {}
        for r in rows:
            units.setdefault(groups[r], []).append(r)
        parts = list(units.values())
        if len(parts) < self.world:
            parts = [[r] for r in rows]
        load = [0] * self.world
        owner: dict[int, int] = {}
        for part in sorted(parts, key=lambda p: -sum(costs[r] for r in p)):
            rank = min(range(self.world), key=lambda k: (load[k], k))
            load[rank] += sum(costs[r] for r in part)
            owner.update(dict.fromkeys(part, rank))
        return [r for r in rows if owner[r] == self.rank]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place; return it."""
        if self.world == 1:
            return tensor
        if tensor.device.type == "cpu" and dist.get_backend() == "nccl":
            tensor.copy_(self.sum_(tensor.cuda()).cpu())
        else:
            dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        """Wait for every rank to get here."""
        if self.world > 1:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` (picklable), on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def on_main(self, make: Callable[[], T]) -> T:
        """`make()` run on rank 0 and its result (picklable) given to every rank. What it
        raises is raised on every rank, so that none waits for a result that never comes."""
        outcome: tuple[Any, BaseException | None] = (None, None)
        if self.main:
            try:
                outcome = (make(), None)
            except Exception as error:  # re-raised below, on every rank
                outcome = (None, error)
        result, error = self.broadcast(outcome)
        if error is not None:
            raise error
        return result

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the `.grad` of the trainable `params` over the ranks, a bucket per collective; a
        rank that computed no gradient for a parameter contributes zeros."""
        if self.world == 1:
            return
        grads = []
        for p in params:
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        for bucket in _buckets(grads, BUCKET_ELEMENTS):
            flat = torch.cat([g.flatten() for g in bucket])
            dist.all_reduce(flat)
            for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(part.view_as(g))

    def copy_from_main(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's parameters and buffers (run once, after loading)."""
        if self.world == 1:
            return
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def check_in_sync(self, module: torch.nn.Module, what: str) -> None:
        """Raise if any rank's parameters differ from rank 0's: replicas that drift apart
        would train different models while rank 0's alone is saved."""
        if self.world == 1:
            return
        names, params = zip(*module.named_parameters(), strict=True)
        prints = torch.stack(
            [torch.stack([p.double().sum(), p.double().square().sum()]) for p in params]
        )
        everyone = self.gather(prints.cpu())
        for rank, theirs in enumerate(everyone[1:], start=1):
            differ = (theirs != everyone[0]).any(-1).nonzero()
            if len(differ):
                raise RuntimeError(
                    f"{what}: rank {rank}'s parameter {names[int(differ[0])]} differs from rank "
                    "0's; the replicas have drifted apart"
                )


ONE_PROCESS = Ranks()
"""A run without `torchrun`."""


def _buckets(tensors: list[torch.Tensor], limit: int) -> Iterator[list[torch.Tensor]]:
    """`tensors` in consecutive runs of one dtype and device, each of at most `limit`
    elements (a larger tensor alone)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (
            size + t.numel() > limit or (t.dtype, t.device) != (bucket[0].dtype, bucket[0].device)
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


def launched_ranks() -> int:
    """The number of processes `torchrun` started (its WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextmanager
def data_parallel(device: torch.device) -> Iterator[Ranks]:
    """The ranks of this run, for the length of the block.

    Under `torchrun` (WORLD_SIZE > 1) the process group is started, with NCCL for a CUDA
    `device` (this rank's GPU, LOCAL_RANK, becomes the current one) and gloo on the CPU, and
    closed at the end, after a barrier when the block ends normally (so that no rank closes
    it while another still sends); a group the caller started is used and left open.
    Otherwise one process.

    Raises:
        ConfigError: a GPU named by its index (`model.device=cuda:N`) under torchrun, where
            each rank takes its own."""
    if launched_ranks() == 1 and not dist.is_initialized():
        yield Ranks()
        return
    if device.type == "cuda" and device.index is not None:
        raise ConfigError(
            f"model.device={device}: under torchrun each rank uses its own GPU (LOCAL_RANK); "
            "set model.device=cuda or auto"
        )
    started = not dist.is_initialized()
    if started:
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size())
        # a normal end: no rank tears the group down while another still uses it (vLLM's
        # shutdown may have taken it down already, after a barrier of its own)
        if started and dist.is_initialized():
            gc.collect()  # FSDP's modules hold the group in reference cycles: free them first
            dist.barrier()
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def rank_state(state: dict[str, Any], ranks: Ranks, checkpoint: Path) -> dict[str, Any]:
    """This rank's saved sampling generator and global random states (`generator`, `rng`).

    A checkpoint of R > 1 ranks holds each rank's under `ranks`; resuming it with another
    number of ranks could not continue the same trajectory (DESIGN rule 10), so it is an
    error naming the checkpoint.

    Raises:
        ConfigError: the checkpoint holds another number of ranks than this run has."""
    saved = state.get("ranks") or [{"generator": state["generator"], "rng": state["rng"]}]
    if len(saved) != ranks.world:
        raise ConfigError(
            f"{checkpoint}: written by a run of {len(saved)} rank(s); resume it with the same "
            f"number of processes, not {ranks.world}"
        )
    return saved[ranks.rank]
