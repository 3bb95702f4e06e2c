"""FSDP2: the policy's weights, gradients and optimizer state sharded over the ranks
(`train.fsdp`).

PyTorch's `fully_shard` (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded
Data Parallel"; FSDP2 is its per-parameter DTensor rewrite) keeps 1/R of every parameter, its
gradient and its AdamW moments on each of R ranks. Each decoder layer is one group, the rest of
the model (embeddings, final norm, LM head) the root's; a layer's weights are gathered before
its forward and its backward and freed after, and its gradient is reduce-scattered after its
backward.

How rlvr departs from a plain FSDP2 training loop:

- the rollout, the no-gradient scoring before the update and the held-out evaluation run on
  the whole weights (`full_weights`): every group is gathered once, and the fused forward
  (`rlvr.models.fused`) and the KV-cache decoder run as in one process, with no collective per
  forward, however many tokens each rank decodes;
- the policy update runs the fused forward too. It reads the weights without calling the
  modules, which is where FSDP2 hooks its gathers, so `shard` registers a forward method on
  every group (`fused.FSDP_CALL`, `register_fsdp_forward_method`): the update's token
  statistics run as a forward of the root (embeddings, final norm, LM head), and within it
  each layer as a forward of its own group, which norms its own input (`fused.within`);
- gradients are summed over the ranks, not averaged (`set_gradient_divide_factor(1)`), as the
  replicated path's are (DESIGN rule 4), and only the last micro-batch reduce-scatters; every
  rank runs as many micro-batches as the busiest one (`passes`), each in two forward
  passes (`min_width`), since each forward and backward gathers;
- checkpoints hold the whole weights and the whole AdamW state, in the format one process
  writes, so a run resumes with or without FSDP.

The critic and the reference model stay replicated. `rlvr sft` and `rlvr dpo` (`sft.fsdp`,
`dpo.fsdp`) use the same pieces around their own backward loops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from rlvr.models import fused
from rlvr.training.distributed import Ranks

RESHARD_ATTR = "rlvr_fsdp_reshard_after_forward"
"""Model attribute: `shard`'s `reshard_after_forward`."""
T = TypeVar("T")
WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Gather the whole tensors on rank 0, in host memory (the other ranks get an empty dict)."""


def is_sharded(model: nn.Module) -> bool:
    """Whether `shard` sharded `model`."""
    return isinstance(model, FSDPModule)


def shard(
    model: nn.Module, ranks: Ranks, reshard_after_forward: bool = True, announce: bool = False
) -> None:
    """Shard `model` over the ranks with FSDP2: each decoder layer (the model's
    `_no_split_modules` classes) a group, then the root, each with the forward method the
    fused forward calls (`fused.FSDP_CALL`); with `announce`, rank 0 prints the parameters it
    keeps. One process keeps `model` whole. (The config refuses LoRA with FSDP.)

    `reshard_after_forward` False (FSDP's option of that name): a layer gathered by the
    update's first forward stays whole through every forward and backward until the
    optimizer step's last backward has run (`sum_gradients` reshards it), one gather a layer
    per step instead of one per pass, for the whole weights held during the update."""
    if ranks.world == 1:
        return
    layers = set(getattr(model, "_no_split_modules", None) or [])
    for module in list(model.modules()):
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    for module in _groups(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no other)
        setattr(module, fused.FSDP_CALL, _call)
        register_fsdp_forward_method(module, fused.FSDP_CALL)
        module.set_reshard_after_backward(reshard_after_forward, recurse=False)
    setattr(model, RESHARD_ATTR, reshard_after_forward)
    _reshard_after_forward_as_set(model)
    if announce and ranks.main:
        whole = sum(p.numel() for p in model.parameters())
        kept = sum(p.to_local().numel() for p in model.parameters() if isinstance(p, DTensor))
        print(
            f"FSDP: rank 0 of {ranks.world} keeps {kept:,} of the {whole:,} parameters", flush=True
        )


def _reshard_after_forward_as_set(model: nn.Module) -> None:
    """Each layer group freed after its forward as `shard` was asked (`RESHARD_ATTR`); the
    root kept, as FSDP2 keeps it (its backward comes first)."""
    for group in _groups(model):
        after = group is not model and getattr(model, RESHARD_ATTR)
        group.set_reshard_after_forward(after, recurse=False)


def _groups(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _call(fn: Callable, *args: object) -> object:
    """`fn(*args)`: a module's `fused.FSDP_CALL`, which `shard` registers as a forward."""
    return fn(*args)


@contextmanager
def full_weights(model: nn.Module) -> Iterator[None]:
    """A sharded `model` with its whole weights for the block: every group gathered once and
    kept through any forward (without gradients, the fused forward then runs its layers as in
    one process); sharded again after. Every rank must enter it. Other models are left as
    they are.

    Read the weights within, never write them: the shards are what the optimizer steps and
    what is sharded again. Nested in another such block, it leaves the weights whole."""
    if not is_sharded(model) or getattr(model, _WHOLE, False):
        yield
        return
    groups = _groups(model)
    for group in groups:
        group.set_reshard_after_forward(False, recurse=False)
        group.unshard()
    setattr(model, _WHOLE, True)
    try:
        yield
    finally:
        setattr(model, _WHOLE, False)
        for group in groups:
            group.reshard()
        _reshard_after_forward_as_set(model)


_WHOLE = "_rlvr_whole_weights"
"""Set on a sharded model while `full_weights` holds its whole weights."""


def passes(model: nn.Module, parts: list[T], ranks: Ranks) -> list[T | None]:
    """This rank's micro-batches `parts`, then a None for each zero-weighted forward/backward
    pass it adds so that it runs as many passes as the busiest rank (none unless `model` is
    sharded, where every pass gathers weights). Before each pass, `sync_gradients`; after the
    last, `sum_gradients`."""
    fillers = max(ranks.gather(len(parts))) - len(parts) if is_sharded(model) else 0
    return [*parts, *[None] * fillers]


def min_width(model: nn.Module) -> int:
    """The fewest completion columns of an update's micro-batch (`collate_shared_prefix`): 2
    for a sharded `model`, so that every micro-batch runs the prompt pass and the completion
    pass of `shared_prefix_forward`, and every rank gathers the weights as often; 1 otherwise."""
    return 2 if is_sharded(model) else 1


def sync_gradients(model: nn.Module, last: bool) -> None:
    """Reduce-scatter the gradients after the next backward only when it is the `last` of the
    optimizer step (a sharded `model`); earlier ones accumulate."""
    if is_sharded(model):
        model.set_requires_gradient_sync(last)


def sum_gradients(model: nn.Module, ranks: Ranks) -> None:
    """Sum the gradients over the ranks after the optimizer step's last backward: an
    all-reduce for a replicated `model`; for a sharded one, whose last backward
    reduce-scattered them, only the resharding of weights kept whole through the update
    (`shard(reshard_after_forward=False)`), so that the optimizer steps the shards."""
    if not is_sharded(model):
        ranks.sum_gradients(model.parameters())
    elif not getattr(model, RESHARD_ATTR):
        for group in _groups(model):
            group.reshard()


def check_in_sync(model: nn.Module, ranks: Ranks, what: str) -> None:
    """`Ranks.check_in_sync` for a replicated `model`; a sharded one's shards differ by design."""
    if not is_sharded(model):
        ranks.check_in_sync(model, what)


def whole_state(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole weights of a sharded `model` on rank 0, a tensor tied to another (the LM head
    to the embeddings) once, under its first name (every rank must call; the others get
    None); None for a model that is not sharded."""
    if not is_sharded(model):
        return None
    state = get_model_state_dict(model, options=WHOLE)
    once = {name for name, _ in [*model.named_parameters(), *model.named_buffers()]}
    return {name: tensor for name, tensor in state.items() if name in once} or None


def load_whole_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load the whole weights `state` (every rank holds them) into `model`, sharded or not."""
    if is_sharded(model):
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(state)


def _trained_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of `optimizer`'s parameters in its order, group after group: the place of
    each in one process's `optimizer.state_dict()`."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def whole_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    """The whole AdamW state of a sharded `model` on rank 0, keyed by parameter index as one
    process's `optimizer.state_dict()` is (every rank must call; the others get None)."""
    state = get_optimizer_state_dict(model, optimizer, options=WHOLE)
    if not state:
        return None
    index = {name: i for i, name in enumerate(_trained_names(model, optimizer))}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def load_whole_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Inverse of `whole_optimizer_state` on every rank: one process's `state` into the
    optimizer of a sharded `model`, each rank keeping its shards."""
    names = _trained_names(model, optimizer)
    by_name = {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
    )
