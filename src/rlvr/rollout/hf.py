"""The in-process rollout engine: batched sampling from a Hugging Face model with a KV cache.

Departures from `model.generate`, all for speed and for the trainer's needs:
- each prompt is prefilled once and its KV cache repeated for its `n` samples;
- the KV cache is preallocated for prompt + budget and written in place (`PreallocatedLayer`),
  instead of being re-concatenated at every token;
- finished sequences are dropped from the batch, so late tokens cost only the live rows (the
  live rows' cache is compacted in place, copying only the filled positions: `select_rows`);
- on a CPU the cache's memory is kept from one rollout to the next (`fused.BufferPool`), so a
  rollout does not fault in tens of MB of fresh pages;
- on a GPU each decode step is the replay of a captured CUDA graph (`graphs.GraphDecoder`),
  one launch instead of hundreds;
- the sampling log-prob of every token is returned, computed from the temperature-scaled
  logits before top-p/top-k truncation and before `min_new_tokens` masks EOS (the
  distribution the trainer's log-probs use).
"""

from __future__ import annotations

import threading
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from rlvr.models import fused
from rlvr.models.hf_cache import cache_kwarg
from rlvr.rollout.base import Rollout, SamplingParams
from rlvr.rollout.graphs import GraphDecoder, GraphState


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists right-aligned: (input_ids, attention_mask), both [batch, max_len]."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
    return ids, mask


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


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row, never one of `banned`; return (tokens, log-probs under the
    temperature-scaled logits)."""
    logits = logits.float()
    allowed = logits if banned is None else logits.index_fill(-1, banned, float("-inf"))
    if params.temperature <= 0:
        tokens = allowed.argmax(-1)
        return tokens, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    logprobs = scaled.log_softmax(-1)
    probs = filter_logits(allowed / params.temperature, params.top_k, params.top_p).softmax(-1)
    # one uniform per row from the run's generator (on the CPU, whatever the model's device)
    uniform = torch.rand(probs.shape[0], generator=generator, dtype=probs.dtype)
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


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer with room for `capacity` positions, filled in place.

    `DynamicLayer` concatenates the whole cache with each new token (quadratic copying over a
    generation); this one writes the new keys/values into a buffer allocated at the first
    update and hands the attention a view of the filled part.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate [batch, heads, capacity, head_dim] buffers."""
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.key_buffer = key_states.new_empty(b, h, self.capacity, d)
        self.value_buffer = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions; return keys and values of every filled position."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} positions is full")
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """Positions filled so far."""
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows `indices` (finished sequences leave the batch)."""
        self.key_buffer = fused.select_rows(self.key_buffer, indices, self.length)
        self.value_buffer = fused.select_rows(self.value_buffer, indices, self.length)
        self._views()


class HFRolloutEngine:
    """Samples from the policy module itself, so weight sync is free.

    One `generate` runs at a time per engine (a lock): the calls share the cache pool and the
    module's train/eval mode.
    """

    def __init__(
        self,
        model: nn.Module,
        eos_ids: list[int],
        pad_id: int,
        batch_size: int = 512,
        generator: torch.Generator | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.model = model
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long)
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.generator = generator
        self.kv_pool = fused.BufferPool()
        """Cache memory reused across rollouts when the model is on the CPU."""
        self.graph_state = GraphState() if cuda_graphs else None
        """Static buffers and CUDA graphs of the decode step, kept across rollouts on a GPU (a
        `GraphState(capture=False)` runs the same static-buffer steps, uncaptured, anywhere)."""
        self._lock = threading.Lock()

    def sync_weights(self, model: nn.Module) -> None:
        """The in-process engine shares the trainer's module."""
        self.model = model

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt, `batch_size` sequences at a time."""
        per_chunk = max(1, self.batch_size // params.n)
        out = Rollout([], [], [], [])
        with self._lock:
            was_training = self.model.training
            self.model.eval()
            try:
                for start in range(0, len(prompts), per_chunk):
                    chunk = prompts[start : start + per_chunk]
                    self._generate_chunk(chunk, params, start, out)
            finally:
                self.model.train(was_training)
        return out

    @torch.inference_mode()
    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, offset: int, out: Rollout
    ) -> None:
        device = next(self.model.parameters()).device
        input_ids, attention_mask = (t.to(device) for t in left_pad(prompts, self.pad_id))
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        capacity = input_ids.shape[1] + params.max_new_tokens
        graphs = self.graph_state
        decoder: HFDecoder | FusedDecoder | GraphDecoder
        if not fused.supports(self.model):
            decoder = HFDecoder(self.model, capacity)
        elif graphs is not None and (device.type == "cuda" or not graphs.capture):
            decoder = GraphDecoder(self.model, capacity, graphs)
        else:
            pool = self.kv_pool if device.type == "cpu" else None
            decoder = FusedDecoder(self.model, capacity, pool)
        logits = decoder.prefill(input_ids, attention_mask, position_ids)
        n = params.n
        decoder.select(torch.arange(len(prompts), device=device).repeat_interleave(n))
        logits = logits.repeat_interleave(n, 0)
        attention_mask = attention_mask.repeat_interleave(n, 0)
        next_position = position_ids[:, -1].repeat_interleave(n, 0) + 1
        rows = len(prompts) * n
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        live = list(range(rows))
        eos, eos_set = self.eos_ids.to(device), set(self.eos_ids.tolist())
        for step in range(params.max_new_tokens):
            banned = eos if step < params.min_new_tokens else None
            token, logp = sample_tokens(logits, params, self.generator, banned)
            # one device-to-host copy per step: tokens and log-probs together (exact in fp64)
            host_tokens, host_logps = torch.stack([token.double(), logp.double()]).tolist()
            keep = []
            for i, (row, tok, lp) in enumerate(zip(live, map(int, host_tokens), host_logps)):
                tokens[row].append(tok)
                logps[row].append(lp)
                if tok in eos_set:
                    finish[row] = "stop"
                else:
                    keep.append(i)
            if step == params.max_new_tokens - 1 or not keep:
                break
            if len(keep) < len(live):
                kept = torch.tensor(keep, device=device)
                decoder.select(kept)
                live, token = [live[i] for i in keep], token[kept]
                attention_mask, next_position = attention_mask[kept], next_position[kept]
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones(len(live), 1)], dim=-1
            )
            logits = decoder.step(token, attention_mask, next_position)
            next_position = next_position + 1
        out.prompt_index.extend(offset + r // n for r in range(rows))
        out.completion_ids.extend(tokens)
        out.logprobs.extend(logps)
        out.finish_reason.extend(finish)


class HFDecoder:
    """Decoding through the `transformers` forward with a preallocated cache."""

    def __init__(self, model: nn.Module, capacity: int) -> None:
        self.model = model
        self.cache = Cache(layer_class_to_replicate=partial(PreallocatedLayer, capacity))

    def _logits(self, input_ids, attention_mask, position_ids, keep: int) -> torch.Tensor:
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=keep,
            **cache_kwarg(self.model, self.cache),
        ).logits[:, -1]

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Next-token logits [b, vocab] after each (left-padded) prompt."""
        return self._logits(input_ids, attention_mask, position_ids, 1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) cache rows."""
        self.cache.batch_select_indices(rows)

    def step(self, token, attention_mask, position) -> torch.Tensor:
        """Feed one token per row; next-token logits [b, vocab]."""
        return self._logits(token[:, None], attention_mask, position[:, None], 0)


class FusedDecoder:
    """Decoding through `rlvr.models.fused` (same function, fewer operations)."""

    def __init__(
        self, model: nn.Module, capacity: int, pool: fused.BufferPool | None = None
    ) -> None:
        self.forward = fused.FusedForward(model)
        self.cache = fused.BufferKV(len(self.forward.layers), capacity, pool)

    def _logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.forward.hidden(input_ids, position_ids, attention_mask, self.cache)
        return self.forward.logits(hidden[:, -1])

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Next-token logits [b, vocab] after each (left-padded) prompt."""
        return self._logits(input_ids, attention_mask, position_ids)

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) cache rows."""
        self.cache.batch_select_indices(rows)

    def step(self, token, attention_mask, position) -> torch.Tensor:
        """Feed one token per row; next-token logits [b, vocab]."""
        return self._logits(token[:, None], attention_mask, position[:, None])
