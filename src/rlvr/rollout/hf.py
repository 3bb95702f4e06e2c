"""The in-process rollout engine: batched sampling from a Hugging Face model with a KV cache.

Departures from `model.generate`, all for speed and for the trainer's needs:
- each prompt is prefilled once and its KV cache repeated for its `n` samples; where the C
  kernels run the decode step (a CPU, fp32) its samples read it in place instead
  (`kv_cache.SharedPromptKV`);
- the KV cache is preallocated for prompt + budget and written in place (`PreallocatedLayer`),
  instead of being re-concatenated at every token;
- finished sequences are dropped from the batch, so late tokens cost only the live rows (the
  live rows' cache is compacted in place, copying only the filled positions: `select_rows`);
- on a CPU the cache's memory is kept from one rollout to the next (`kv_cache.BufferPool`), so a
  rollout does not fault in tens of MB of fresh pages;
- on a GPU each decode step, the next token's sampling included, is the replay of a captured
  CUDA graph (`graphs.GraphDecoder`), one launch instead of hundreds, and each step is
  launched before the host reads the previous step's tokens (`overlap`), so the GPU does not
  wait for the host between steps;
- the tokens and log-probs stay on the device until the rollout ends: between steps the host
  reads only which rows sampled EOS or completed a stop sequence (matched on the device);
- the sampling log-prob of every token is returned, computed from the temperature-scaled
  logits before top-p/top-k truncation and before `min_new_tokens` masks EOS (the
  distribution the trainer's log-probs use).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from rlvr.models import cpu_kernels, fused, kv_cache
from rlvr.models.hf_cache import cache_kwarg
from rlvr.rollout.base import Rollout, SamplingParams
from rlvr.rollout.graphs import GraphDecoder, GraphState
from rlvr.rollout.sampling import Draw, ban_bias, draw_uniform


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
        self.key_buffer = kv_cache.select_rows(self.key_buffer, indices, self.length)
        self.value_buffer = kv_cache.select_rows(self.value_buffer, indices, self.length)
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
        overlap: bool | None = None,
    ) -> None:
        self.model = model
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long)
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.generator = generator
        self.kv_pool = kv_cache.BufferPool()
        """Cache memory reused across rollouts when the model is on the CPU."""
        self.graph_state = GraphState() if cuda_graphs else None
        """Static buffers and CUDA graphs of the decode step, kept across rollouts on a GPU (a
        `GraphState(capture=False)` runs the same static-buffer steps, uncaptured, anywhere)."""
        self.overlap = overlap
        """Launch each decode step before reading the previous step's tokens (finished rows
        leave the batch one step late); None: on a GPU, where the host's turn between steps
        would otherwise leave the GPU idle, and not on a CPU, where it would only add work."""
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
        decoder: Decoder
        if not fused.supports(self.model):
            decoder = HFDecoder(self.model, capacity)
        elif (
            graphs is not None
            and (device.type == "cuda" or not graphs.capture)
            and not fused.has_adapted_linears(self.model)  # the captured step packs weights
            and params.repetition_penalty == 1.0  # the step samples without seen tokens
        ):
            decoder = GraphDecoder(self.model, capacity, graphs)
        else:
            pool = self.kv_pool if device.type == "cpu" else None
            decoder = FusedDecoder(self.model, capacity, pool)
        logits = decoder.prefill(input_ids, attention_mask, position_ids)
        n, budget = params.n, params.max_new_tokens
        rows = len(prompts) * n
        decoder.select(torch.arange(len(prompts), device=device).repeat_interleave(n))
        eos_ids = self.eos_ids.to(device)
        stops = [torch.tensor(seq, device=device) for seq in params.stop_sequences if seq]
        ban = ban_bias(logits.shape[-1], eos_ids) if params.min_new_tokens else None
        seen = None  # [rows, vocab]: the tokens of each row's prompt and completion so far
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(rows, logits.shape[-1], dtype=torch.bool, device=device)
            for i, prompt in enumerate(prompts):
                seen[i * n : (i + 1) * n, prompt] = True

        def draw(step: int, live: torch.Tensor) -> Draw:
            uniform = draw_uniform(self.generator, rows, params)
            banned = ban if step < params.min_new_tokens else None
            seen_live = None if seen is None else seen[live.to(device)]
            uniform_live = None if uniform is None else staged(uniform[live], device)
            return Draw(params, uniform_live, banned, seen_live)

        first = draw(0, torch.arange(rows)).sample(logits.repeat_interleave(n, 0))
        next_position = position_ids[:, -1].repeat_interleave(n, 0) + 1
        batch = LiveRows.start(attention_mask.repeat_interleave(n, 0), next_position, *first)
        # sampled tokens and log-probs stay on the device until the rollout ends
        sampled = torch.zeros(rows, budget, dtype=torch.long, device=device)
        sampled_logps = torch.zeros(rows, budget, dtype=batch.logp.dtype, device=device)
        lengths = torch.full((rows,), budget)
        stopped = torch.zeros(rows, dtype=torch.bool)
        overlap = device.type == "cuda" if self.overlap is None else self.overlap
        generator = self.generator or torch.default_generator
        for step in range(budget):
            sampled[batch.on_device, step] = batch.token
            sampled_logps[batch.on_device, step] = batch.logp
            if seen is not None:
                seen[batch.on_device, batch.token] = True
            ends = torch.isin(batch.token, eos_ids)
            for stop in stops:
                if step + 1 >= len(stop):
                    tail = sampled[batch.on_device, step + 1 - len(stop) : step + 1]
                    ends = ends | (tail == stop).all(dim=-1)
            read_ended = host_copy(ends)
            last = step == budget - 1
            if overlap and not last:  # step + 1 runs while the host reads step's tokens
                before = generator.get_state()
                batch.advance(decoder, draw(step + 1, batch.rows))
            ended = read_ended()
            finished = batch.rows[ended]
            lengths[finished], stopped[finished] = step + 1, True
            if last or len(finished) == len(batch.rows):
                if overlap and not last:  # step + 1 was not needed: its draws are not made
                    generator.set_state(before)
                break
            if len(finished):
                batch.keep((~ended).nonzero().squeeze(1), decoder)
            if not overlap:
                batch.advance(decoder, draw(step + 1, batch.rows))
        tokens, logps = sampled.cpu(), sampled_logps.cpu()
        for row, length in enumerate(lengths.tolist()):
            out.prompt_index.append(offset + row // n)
            out.completion_ids.append(tokens[row, :length].tolist())
            out.logprobs.append(logps[row, :length].tolist())
            out.finish_reason.append("stop" if stopped[row] else "length")


def staged(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`x` (on the CPU) in page-locked memory when it is bound for a GPU: copied from there
    with `non_blocking=True` it does not make the host wait for the GPU's queued work (a
    blocking copy to a GPU synchronises the stream, and one from pageable memory may)."""
    return x.pin_memory() if device.type == "cuda" else x


def host_copy(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start copying `x` to the CPU; the returned function waits for the copy and returns it.
    From a GPU the copy is queued behind the work already launched, and the host can launch
    more before it waits."""
    if x.device.type != "cuda":
        return lambda: x
    copy = x.to("cpu", non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> torch.Tensor:
        done.synchronize()
        return copy

    return wait


@dataclass
class LiveRows:
    """The rows a rollout is still decoding, in the decoder's batch order: each one's row in
    the chunk (`rows` on the CPU, `on_device` on the model's device), its attention mask, the
    position of its next input, its last sampled token and that token's log-prob."""

    rows: torch.Tensor
    on_device: torch.Tensor
    attention_mask: torch.Tensor
    position: torch.Tensor
    token: torch.Tensor
    logp: torch.Tensor

    @classmethod
    def start(cls, attention_mask, position, token, logp) -> LiveRows:
        """Every row of the chunk, with its prompt's mask and its first sampled token."""
        every = torch.arange(len(token))
        return cls(every, every.to(token.device), attention_mask, position, token, logp)

    def advance(self, decoder: Decoder, draw: Draw) -> None:
        """Feed each row's last token to `decoder` and sample the next one with `draw`."""
        ones = self.attention_mask.new_ones(len(self.rows), 1)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=-1)
        self.token, self.logp = decoder.next_tokens(
            self.token, self.attention_mask, self.position, draw
        )
        self.position = self.position + 1

    def keep(self, keep: torch.Tensor, decoder: Decoder) -> None:
        """Keep only the batch rows `keep` (a CPU index), in the decoder's cache too."""
        device = self.on_device.device
        kept = staged(keep, device).to(device, non_blocking=True)
        decoder.select(kept)
        self.rows, self.on_device = self.rows[keep], self.on_device[kept]
        self.token, self.logp = self.token[kept], self.logp[kept]
        self.attention_mask, self.position = self.attention_mask[kept], self.position[kept]


class SampleAfterStep:
    """`next_tokens` for a decoder whose `step` returns logits: the step, then eager sampling."""

    def next_tokens(self, token, attention_mask, position, draw: Draw) -> tuple[torch.Tensor, ...]:
        """Feed one token per row; the next token of each row and its log-prob (`draw`)."""
        return draw.sample(self.step(token, attention_mask, position))


class HFDecoder(SampleAfterStep):
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


class FusedDecoder(SampleAfterStep):
    """Decoding through `rlvr.models.fused` (same function, fewer operations)."""

    share_prompts = True
    """Keep each prompt's cache once for its samples where the C kernels run the decode step
    (`kv_cache.SharedPromptKV`); False: a copy per sample (before lever 52; for the A/B)."""

    def __init__(
        self, model: nn.Module, capacity: int, pool: kv_cache.BufferPool | None = None
    ) -> None:
        self.forward = fused.FusedForward(model)
        self.cache: kv_cache.BufferKV | kv_cache.SharedPromptKV
        self.cache = kv_cache.BufferKV(len(self.forward.layers), capacity, pool)
        self.pool = pool

    def _logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.forward.hidden(input_ids, position_ids, attention_mask, self.cache)
        return self.forward.logits(hidden[:, -1])

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Next-token logits [b, vocab] after each (left-padded) prompt."""
        return self._logits(input_ids, attention_mask, position_ids)

    def select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) cache rows: a prompt's cache repeated for its samples is shared
        by them instead where the C kernels will run the decode step."""
        cache = self.cache
        repeats = isinstance(cache, kv_cache.BufferKV) and len(rows) > cache.keys[0].shape[0]
        if repeats and self.share_prompts and cpu_kernels.usable(cache.keys[0]):
            self.cache = kv_cache.SharedPromptKV(cache, rows, self.pool)
        else:
            cache.batch_select_indices(rows)

    def step(self, token, attention_mask, position) -> torch.Tensor:
        """Feed one token per row; next-token logits [b, vocab]."""
        return self._logits(token[:, None], attention_mask, position[:, None])


Decoder = HFDecoder | FusedDecoder | GraphDecoder
"""What `HFRolloutEngine` decodes with: prefill, select (rows of the cache) and next_tokens."""
