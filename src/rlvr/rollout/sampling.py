"""Drawing the next token from a decode step's logits, shared by every decoder of the rollout
engine: eagerly after a step (`rollout.hf`) or inside the step's CUDA graph
(`rollout.graphs`), with the same operations, so both draw the same tokens.

Randomness is one uniform per row per step from the run's generator, drawn on the CPU
(`draw_uniform`), so a seed gives the same samples on any device and with or without graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlvr.rollout.base import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k set and outside the top-p nucleus to -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw_uniform(
    generator: torch.Generator | None, rows: int, params: SamplingParams
) -> torch.Tensor | None:
    """One uniform in [0, 1) per row from the run's generator, on the CPU whatever the model's
    device; None for greedy decoding (temperature <= 0), which draws nothing."""
    if params.temperature <= 0:
        return None
    return torch.rand(rows, generator=generator, dtype=torch.float32)


def ban_bias(vocab: int, banned: torch.Tensor) -> torch.Tensor:
    """[vocab] fp32 additive bias that keeps the token ids `banned` from being drawn: -inf on
    them, 0 elsewhere (EOS before `min_new_tokens`)."""
    return torch.zeros(vocab, device=banned.device).index_fill_(0, banned, float("-inf"))


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    uniform: torch.Tensor | None,
    ban: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row with `uniform` [b] (`draw_uniform`; None when greedy), never one
    that `ban` (`ban_bias`) bans; return (tokens, log-probs under the temperature-scaled
    logits, before top-k/top-p truncation and the ban)."""
    logits = logits.float()
    allowed = logits if ban is None else logits + ban
    if params.temperature <= 0:
        tokens = allowed.argmax(-1)
        return tokens, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert uniform is not None, "sampling at a temperature > 0 needs draw_uniform's draws"
    scaled = logits / params.temperature
    logprobs = scaled.log_softmax(-1)
    probs = filter_logits(allowed / params.temperature, params.top_k, params.top_p).softmax(-1)
    tokens = inverse_cdf_sample(probs, uniform.to(probs.device))
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def inverse_cdf_sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Token i of each row with cdf[i - 1] <= u·total < cdf[i] (inverse-transform sampling).

    probs: [b, vocab], rows need not sum to 1; uniform: [b] in [0, 1). A zero-probability
    token has an empty interval and is never drawn; if rounding puts u·total at or above the
    last cumulative value, it is moved just below it, so the drawn token is the last one whose
    interval is not empty.
    """
    cdf = cumulative(probs)
    total = cdf[:, -1:]
    below_total = torch.nextafter(total, torch.zeros_like(total))
    target = torch.minimum(uniform[:, None] * total, below_total)
    return (cdf <= target).sum(-1).clamp_(max=probs.shape[-1] - 1)


def cumulative(probs: torch.Tensor) -> torch.Tensor:
    """probs.cumsum(-1); on a GPU `blocked_cumsum`."""
    return blocked_cumsum(probs) if probs.is_cuda else probs.cumsum(-1)


def blocked_cumsum(probs: torch.Tensor, block: int = 256) -> torch.Tensor:
    """cumsum along the last axis of [b, vocab] in two levels: within blocks of `block`
    tokens, then the blocks' totals. On a GPU one scan along a 150k-token row is a slow kernel
    (250 µs for 128 rows on an H100); many short scans are fast."""
    b, vocab = probs.shape
    blocks = F.pad(probs, (0, -vocab % block)).view(b, -1, block).cumsum(-1)
    totals = blocks[..., -1]
    before = totals.cumsum(-1) - totals
    return (blocks + before[..., None]).view(b, -1)[:, :vocab]
