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


def two_group_batch() -> RolloutBatch:
    """Six samples of random token ids in two groups of three, with lengths and advantages
    that differ from row to row."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (int(k),), generator=g).tolist() for k in (3, 5, 4, 7, 2, 6)]
    completions = [
        torch.randint(10, 90, (int(k),), generator=g).tolist() for k in (1, 9, 4, 6, 3, 8)
    ]
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.4])
    return token_batch(prompts, completions, torch.tensor([0, 0, 0, 1, 1, 1]), advantages)
