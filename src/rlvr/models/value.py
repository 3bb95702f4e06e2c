"""A value model: the policy's transformer backbone with a scalar head on every position.

PPO-style critics for LLMs start from a copy of the policy (or of a reward model) and replace
the LM head by a linear layer to one scalar. Here the backbone is a copy of the policy's
(`model.base_model`, which every Hugging Face causal LM has), so the critic has the policy's
architecture and initial features but its own weights and optimizer; the head starts at 0, so
the first values are 0 and the first GAE advantages are the plain returns.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.cache_utils import Cache

from rlvr.models.hf_cache import cache_kwarg, returned_cache


class ValueModel(nn.Module):
    """`values[b, s]` = V(state after the first s + 1 tokens of row b)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)
        self.backbone.requires_grad_(True)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1, dtype=next(policy.parameters()).dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache | None = None,
        keep_last: int | None = None,
        flat: torch.Tensor | None = None,
        host: object = None,
    ) -> tuple[torch.Tensor, Cache]:
        """Values [b, keep_last] of the last `keep_last` positions (all when None), and the
        KV cache (extended in place when one is given). Every position is computed; `flat`
        and `host` are accepted for the `PrefixStep` signature."""
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **cache_kwarg(self.backbone, cache),
        )
        hidden = out.last_hidden_state
        if keep_last is not None:
            hidden = hidden[:, -keep_last:]
        return self.head(hidden).squeeze(-1), returned_cache(out)
