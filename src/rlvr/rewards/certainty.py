"""Certainty rewards: the policy's confidence in its own completion, no answer read.

With z_t the logits at completion position t, p_t = softmax(z_t / T) over the vocabulary V
and y_t the sampled token, each position gives (`token_certainty`)

- ``self_certainty``: KL(U || p_t) = (1/|V|) Σ_j log((1/|V|) / p_t[j])
  = logsumexp(z_t / T) - mean_j(z_t[j] / T) - log |V|, how far p_t is from uniform
  (Kang et al. 2025, "Scalable Best-of-N Selection for Large Language Models via
  Self-Certainty", arXiv:2502.18581). Intuitor (Zhao et al. 2025, "Learning to Reason without
  External Rewards", arXiv:2505.19590) trains GRPO on its mean over the response as the only
  reward; its code drops the constant log |V|, which the group's advantages cancel anyway;
- ``negative_entropy``: -H(p_t) = Σ_j p_t[j] log p_t[j]: RENT (Prabhudesai et al. 2025,
  "Maximizing Confidence Alone Improves Reasoning", arXiv:2505.22660) and the token-level
  reward of EM-RL (Agarwal et al. 2025, "The Unreasonable Effectiveness of Entropy
  Minimization in LLM Reasoning", arXiv:2505.15134);
- ``logprob``: log p_t[y_t]; summed over the completion it is log π(y | x), EM-RL's
  trajectory-level reward (the negative of a one-sample estimate of the sequence entropy).

A completion's reward is the mean (or the sum) over the tokens the policy wrote: a tool's
output inside the completion is context, not the policy's choice, and is left out. Scored by
the policy itself (Intuitor's online self-certainty, which the paper finds resists the reward
hacking that a frozen scorer invites) or by the frozen initial policy; the token ids are the
sampled ones, not the decoded text encoded again.

Every measure is computed from one pass over each chunk of logits under `torch.no_grad`: the
fused forward's hidden states go through the LM head a chunk of positions at a time, so no
[tokens, vocab] logits exist at once there (DESIGN rule 7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rlvr.models import fused
from rlvr.rollout.sampling import scale
from rlvr.training.batching import (
    SharedPrefixBatch,
    forward_logits_shared_prefix,
    fused_hidden_step,
    placed_at,
    score_completion_tokens,
    shared_prefix_forward,
)
from rlvr.training.logprobs import default_chunk_elements

CERTAINTY_MEASURES = ("self_certainty", "negative_entropy", "logprob")
"""The per-token measures of `token_certainty`."""


def token_certainty(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> dict[str, torch.Tensor]:
    """Each `CERTAINTY_MEASURES` entry [n] of logits [n, vocab] and sampled tokens [n], in
    fp32 (the module docstring gives the formulas)."""
    z = scale(logits, temperature).float()
    lse = torch.logsumexp(z, dim=-1)
    logp = z - lse[:, None]
    return {
        "self_certainty": lse - z.mean(dim=-1) - math.log(z.shape[-1]),
        "negative_entropy": (logp.exp() * logp).sum(dim=-1),
        "logprob": logp.gather(-1, tokens[:, None]).squeeze(-1),
    }


def _chunked(
    logits_of: Callable[[int, int], torch.Tensor],
    tokens: torch.Tensor,
    vocab: int,
    measure: str,
    temperature: float,
) -> torch.Tensor:
    """`token_certainty(...)[measure]` of n positions whose logits `logits_of(i, j)` makes a
    chunk of rows at a time."""
    n = tokens.shape[0]
    step = max(1, default_chunk_elements(tokens.device) // vocab)
    values = torch.zeros(n, device=tokens.device)
    for i in range(0, n, step):
        j = min(i + step, n)
        values[i:j] = token_certainty(logits_of(i, j), tokens[i:j], temperature)[measure]
    return values


def completion_certainty(
    model: nn.Module, sb: SharedPrefixBatch, measure: str, temperature: float = 1.0
) -> torch.Tensor:
    """`measure` [b, T] at every completion token of a collated micro-batch, zero at padding
    (call it under `torch.no_grad`; `score_completion_tokens` does)."""
    flat = fused.real_positions(sb.response_mask.bool())
    tokens = sb.completion_ids.reshape(-1).index_select(0, flat)
    if fused.supports(model):

        def through_head() -> torch.Tensor:
            hidden = shared_prefix_forward(fused_hidden_step(model), sb)
            rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)
            head = model.lm_head
            return _chunked(
                lambda i, j: head(rows[i:j]), tokens, head.out_features, measure, temperature
            )

        values = fused.within(model, through_head)
    else:
        logits = forward_logits_shared_prefix(model, sb)
        rows = logits.reshape(-1, logits.shape[-1]).index_select(0, flat)
        values = _chunked(lambda i, j: rows[i:j], tokens, rows.shape[-1], measure, temperature)
    return placed_at(values, flat, sb.response_mask)


def certainty_rewards(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    measure: str = "self_certainty",
    aggregate: str = "mean",
    temperature: float = 1.0,
    token_masks: Sequence[Sequence[bool] | torch.Tensor] | None = None,
    micro_batch_tokens: int = 4096,
) -> list[float]:
    """The reward of each completion: `measure` of its tokens, averaged (``mean``) or added
    (``sum``) over those `token_masks` marks as the policy's (None: all of them); 0.0 for a
    completion without such a token."""
    if measure not in CERTAINTY_MEASURES:
        raise ValueError(f"unknown certainty measure {measure!r}; choose from {CERTAINTY_MEASURES}")
    if aggregate not in ("mean", "sum"):
        raise ValueError(f"unknown aggregate {aggregate!r}; choose mean or sum")
    n = len(completion_ids)
    if len(prompt_ids) != n or (token_masks is not None and len(token_masks) != n):
        masks = "" if token_masks is None else f", {len(token_masks)} token masks"
        raise ValueError(f"{len(prompt_ids)} prompts for {n} completions{masks}")
    per_token = score_completion_tokens(
        model,
        [list(p) for p in prompt_ids],
        [list(c) for c in completion_ids],
        pad_id,
        lambda m, sb: completion_certainty(m, sb, measure, temperature),
        micro_batch_tokens,
    )
    rewards = []
    for i, values in enumerate(per_token):
        if token_masks is not None:
            if len(token_masks[i]) != len(values):
                raise ValueError(
                    f"sample {i}: {len(token_masks[i])} mask entries for {len(values)} tokens"
                )
            values = values[torch.as_tensor(token_masks[i], dtype=torch.bool)]
        total = float(values.double().sum())
        rewards.append(total / len(values) if aggregate == "mean" and len(values) else total)
    return rewards
