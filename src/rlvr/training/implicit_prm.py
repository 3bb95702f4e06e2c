"""PRIME's implicit PRM in the RL step (`algorithm.advantage: prime`): its update, its rewards.

The PRM is a copy of the initial policy (or of `algorithm.prime.model`) with its own AdamW,
scored against a frozen copy of the same weights (`rlvr.algorithms.implicit_prm`). Each step
(`ImplicitPRM.step`), as verl's PRIME recipe does by default (``update: before``), it first
takes one optimizer step of the cross entropy on the batch's verifier labels, then scores
every response token with its updated weights, the reference scored once for both; the
policy's advantages are then PRIME's (`prime_advantages`).
"""

from __future__ import annotations

import copy
import math

import torch

from rlvr.algorithms.implicit_prm import (
    implicit_prm_loss,
    implicit_process_rewards,
    pairwise_accuracy,
    scale_by_largest_return,
)
from rlvr.config import PrimeConfig, TrainConfig
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import (
    collate_shared_prefix,
    completion_token_stats,
    model_device,
    rows_on,
    to_device,
)
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.second_model import SecondModel, starting_weights
from rlvr.training.update import batch_logprobs, micro_batches, rank_share


class ImplicitPRM(SecondModel):
    """Owns the PRM, its frozen reference and its optimizer; with several ranks, each scores
    and trains its share of the rows and the gradients and scores are summed over the ranks.
    A checkpoint keeps the PRM and its optimizer (`state_dict`); the reference is rebuilt from
    the initial model."""

    def __init__(
        self,
        settings: PrimeConfig,
        policy: torch.nn.Module,
        train: TrainConfig,
        pad_id: int,
        ranks: Ranks = ONE_PROCESS,
    ) -> None:
        base = starting_weights(policy, settings.model)
        device = model_device(policy)
        super().__init__(copy.deepcopy(base).to(device).train(), settings.lr, train, pad_id, ranks)
        self.settings = settings
        self.reference = copy.deepcopy(base).to(device).eval().requires_grad_(False)
        ranks.copy_from_main(self.reference)

    def step(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float | None]]:
        """PRIME's step (verl's ``update: before``): `update` on the batch, then its
        `process_rewards` under the updated PRM; the frozen reference is scored once for both.
        Returns the rewards and the update's statistics."""
        ref = self.reference_logprobs(batch)
        stats = self.update(batch, ref)
        return self.process_rewards(batch, ref), stats

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[N, T] log π_ref of every response token (no gradient)."""
        return batch_logprobs(self.reference, batch, 1.0, self.budget, self.pad_id, self.ranks)

    def update(self, batch: RolloutBatch, ref: torch.Tensor) -> dict[str, float | None]:
        """One optimizer step of L_CE (`implicit_prm_loss`, the mean over the batch) on the
        verifier's labels `batch.correct`, `ref` the reference's log-probs
        (`reference_logprobs`); returns ``prm/loss`` and ``prm/accuracy`` (how often
        the PRM, before this step, ranks a right sample of a prompt above a wrong one); None
        for what the batch cannot measure (no rows, no right and wrong pair)."""
        beta, n = self.settings.beta, len(batch)
        if n == 0:  # the filters kept nothing: nothing to learn from
            return {"prm/loss": None, "prm/accuracy": None}
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        labels = batch.correct.float()
        scores = torch.zeros(n, dtype=torch.float64)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        mine = rank_share(batch, list(range(n)), self.ranks)
        for rows in micro_batches(batch, mine, self.budget, self.model):
            mb = collate_shared_prefix(batch.prompt_ids, batch.completion_ids, rows, self.pad_id)
            mb = to_device(mb, self.device)
            width = mb.completion_ids.shape[1]
            mask = rows_on(batch.response_mask, rows, width, self.device)
            logprobs, _ = completion_token_stats(self.model, mb, 1.0, with_entropy=False)
            base = rows_on(ref, rows, width, self.device)
            loss = implicit_prm_loss(logprobs, base, mask, labels[rows].to(self.device), beta)
            (loss.sum() / n).backward()
            loss_sum += loss.detach().sum().double()
            rewards = implicit_process_rewards(logprobs.detach(), base, mask, beta)
            scores[rows] = rewards.sum(-1).double().cpu()
        self.ranks.sum_gradients(self.model.parameters())
        self.ranks.sum_(loss_sum)
        self.ranks.sum_(scores)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        loss_value = float(loss_sum) / n
        if math.isfinite(loss_value):
            self.optimizer.step()
        accuracy = pairwise_accuracy(scores, batch.correct, batch.group_ids)
        return {"prm/loss": loss_value, "prm/accuracy": accuracy}

    @torch.no_grad()
    def process_rewards(self, batch: RolloutBatch, ref: torch.Tensor) -> torch.Tensor:
        """[N, T] r_φ(y_t) of every response token under the current PRM, `ref` the
        reference's log-probs (`reference_logprobs`), divided by the batch's largest absolute
        return when `algorithm.prime.scale_returns`."""
        self.model.eval()
        logprobs = batch_logprobs(self.model, batch, 1.0, self.budget, self.pad_id, self.ranks)
        rewards = implicit_process_rewards(logprobs, ref, batch.response_mask, self.settings.beta)
        if self.settings.scale_returns:
            rewards = scale_by_largest_return(rewards, batch.response_mask)
        return rewards
