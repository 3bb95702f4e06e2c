"""A rollout batch of token ids alone, for tests of the update (imported by test modules)."""

import torch

from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import response_mask_from_lengths


def token_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    group_ids: torch.Tensor,
    advantages: torch.Tensor,
) -> RolloutBatch:
    """One row per sample: its prompt and completion token ids, its group and one advantage
    ([N]) on every completion token; no problems or texts."""
    n = len(prompt_ids)
    mask = response_mask_from_lengths([len(c) for c in completion_ids])
    return RolloutBatch(
        problems=[],
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        prompt_texts=[],
        completion_texts=[],
        group_ids=group_ids,
        truncated=torch.zeros(n, dtype=torch.bool),
        response_mask=mask,
        rollout_logprobs=torch.zeros_like(mask),
        advantages=advantages[:, None] * mask,
    )
