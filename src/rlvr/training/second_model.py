"""A second model the RL step trains beside the policy (the critic, PRIME's implicit PRM).

It starts from the policy's weights or from a model of its own, has its own AdamW at its own
learning rate (the policy's weight decay, betas and optimizer sharding), scores and trains in
the policy's micro-batch budget, and is saved in the trainer state of each checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.config import TrainConfig
from rlvr.models.loading import load_pretrained
from rlvr.training.batching import model_device
from rlvr.training.distributed import Ranks
from rlvr.training.optim import build_optimizer, load_optimizer_state, optimizer_state


def starting_weights(policy: torch.nn.Module, name_or_path: str | None) -> torch.nn.Module:
    """The model a second model starts from: `name_or_path`'s, or the policy when None."""
    return policy if name_or_path is None else load_pretrained(name_or_path)[0]


class SecondModel:
    """Owns `model` (on its device) and its AdamW at learning rate `lr`; with several ranks,
    every rank starts from rank 0's weights."""

    def __init__(
        self, model: torch.nn.Module, lr: float, train: TrainConfig, pad_id: int, ranks: Ranks
    ) -> None:
        self.model, self.ranks = model, ranks
        self.device = model_device(model)
        self.optimizer = build_optimizer(
            model, lr, train.weight_decay, train.betas, train.shard_optimizer
        )
        self.budget, self.pad_id = train.micro_batch_tokens, pad_id
        ranks.copy_from_main(model)

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer state (saved in the trainer state of a checkpoint; every rank
        calls it, as `optim.optimizer_state` asks)."""
        return {"model": self.model.state_dict(), "optimizer": optimizer_state(self.optimizer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"], self.model)
