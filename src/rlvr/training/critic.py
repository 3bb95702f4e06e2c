"""The critic of PPO-style presets (`algorithm.advantage: gae`): values, targets, its update.

The critic is a `ValueModel` (the policy's backbone copied, or that of `critic.model`, plus a
scalar head) with its own AdamW. Each step it predicts V for every response token before the
update (these are the "old" values of the clipped value loss and the baseline of GAE), then
learns the returns with the same mini-batches as the policy, normalised over the mini-batch's
tokens (DESIGN rule 4).
"""

from __future__ import annotations

import math

import torch

from rlvr.algorithms import aggregate
from rlvr.algorithms.value import clipped_value_loss
from rlvr.config import CriticConfig, TrainConfig
from rlvr.models.value import ValueModel
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import (
    collate_shared_prefix,
    model_device,
    rows_on,
    shared_prefix_forward,
    to_device,
)
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.second_model import SecondModel, starting_weights
from rlvr.training.update import micro_batches, rank_share


class Critic(SecondModel):
    """Owns the value model and its optimizer; with several ranks, each scores and trains its
    share of the rows and the values and gradients are summed over the ranks."""

    def __init__(
        self,
        settings: CriticConfig,
        policy: torch.nn.Module,
        train: TrainConfig,
        pad_id: int,
        ranks: Ranks = ONE_PROCESS,
    ) -> None:
        value_model = ValueModel(starting_weights(policy, settings.model)).to(model_device(policy))
        super().__init__(value_model, settings.lr, train, pad_id, ranks)
        self.settings = settings
        self.max_grad_norm = train.max_grad_norm or math.inf

    def _values(self, batch: RolloutBatch, rows: list[int]) -> torch.Tensor:
        """[b, T] values of the completion tokens of `rows`, on the critic's device."""
        mb = collate_shared_prefix(batch.prompt_ids, batch.completion_ids, rows, self.pad_id)
        return shared_prefix_forward(self.model, to_device(mb, self.device))

    @torch.no_grad()
    def predict(self, batch: RolloutBatch) -> torch.Tensor:
        """[N, T] values of every response token (0 elsewhere)."""
        self.model.eval()
        out = torch.zeros_like(batch.response_mask)
        mine = rank_share(batch, list(range(len(batch))), self.ranks)
        for rows in micro_batches(batch, mine, self.budget, self.model):
            values = self._values(batch, rows).float().cpu()
            width = values.shape[1]
            out[rows, :width] = values * batch.response_mask[rows, :width]
        return self.ranks.sum_(out)

    def update(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        """One optimizer step of the clipped value loss on the mini-batch `rows`; the
        statistics are read back once, after the last micro-batch (`update.SUMMED`)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        num_tokens = float(batch.response_mask[rows].sum().clamp(min=1))
        norm = {"num_tokens": num_tokens, "num_seqs": float(len(rows)), "max_len": 1}
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        mine = rank_share(batch, rows, self.ranks)
        for mb_rows in micro_batches(batch, mine, self.budget, self.model):
            values = self._values(batch, mb_rows)
            width = values.shape[1]
            mask = rows_on(batch.response_mask, mb_rows, width, self.device)
            token_loss, clipped = clipped_value_loss(
                values,
                rows_on(batch.values, mb_rows, width, self.device),
                rows_on(batch.returns, mb_rows, width, self.device),
                mask,
                self.settings.value_clip,
            )
            loss = aggregate("token_mean", token_loss, mask, **norm)
            loss.backward()
            sums += torch.stack([x.sum().double() for x in (loss.detach(), clipped * mask)])
        self.ranks.sum_gradients(self.model.parameters())
        self.ranks.sum_(sums)
        stats = dict(zip(("value_loss", "value_clip_tokens"), sums.tolist(), strict=True))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        if math.isfinite(stats["value_loss"]):
            self.optimizer.step()
        return stats
