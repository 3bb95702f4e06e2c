"""Decoding on a GPU with CUDA graphs: each decode step is one replay of a captured graph.

A small model's eager decode step is hundreds of kernel launches (about 33 per layer), and on
a GPU each costs more CPU time than the kernel runs; `benchmarks/gpu.py` measured 7.6 ms per
step for a ~110M model at 128 rows against a memory-bandwidth bound of 0.6 ms. A CUDA graph
replays all of a step's kernels for one launch. A graph fixes its tensors' shapes and
addresses, so:

- the KV cache is one static tensor [layers, 2, rows, kv_heads, capacity, head_dim], kept by
  the engine from one rollout to the next, zero past the written positions;
- a step writes its keys and values at column `where` (a device tensor) and attends to the
  first `span` columns, the written length rounded up to `SPAN_STEP`; the attention mask hides
  the columns not yet written;
- the batch is rounded up to a power of two: finished rows leave by compaction into the
  leading rows, and the rows past the live ones are computed and ignored;
- one graph per (batch, span) is captured at first use and kept; all share one memory pool.

The step itself is `graph_step.decode_hidden` (packed matmuls, a fused attention kernel: few
kernels per layer). A step's graph also samples the next token (`GraphDecoder.next_tokens`,
`sample_tokens` on the logits: passes over [rows, vocab] that would otherwise be launched one
by one, with the CPU waiting between steps); the uniforms it draws with come from the run's
generator on the CPU and are copied in before the replay, so the samples are those of the
eager decoders. Prefill stays eager. `GraphState(capture=False)` runs the same static-buffer
steps without capturing, which is how they are tested on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

import torch
from torch import nn

from rlvr.models import fused, kv_cache
from rlvr.rollout import graph_step, triton_ops
from rlvr.rollout.graph_step import SlotKV, decode_hidden, decode_weights
from rlvr.rollout.sampling import Draw, sample_tokens

T = TypeVar("T")

SPAN_STEP = 64
"""Attention reads the written positions rounded up to a multiple of this (one graph each)."""


def batch_bucket(live: int, rows: int) -> int:
    """The graph batch for `live` rows: the next power of two, at most `rows`."""
    return min(rows, 1 << max(live - 1, 0).bit_length())


def round_up(length: int) -> int:
    """`length` rounded up to a multiple of `SPAN_STEP`."""
    return -(-length // SPAN_STEP) * SPAN_STEP


def span_bucket(length: int, capacity: int) -> int:
    """Columns a step attends to when `length` are written: rounded up to `SPAN_STEP`, at most
    the buffer's `capacity`."""
    return min(capacity, round_up(length))


class StaticBuffers:
    """The tensors a captured step reads and writes, for `rows` rows of `capacity` positions."""

    def __init__(self, forward: fused.FusedForward, rows: int, capacity: int, like: torch.Tensor):
        layers, kv_heads, d = len(forward.layers), forward.kv_heads, forward.head_dim
        self.rows, self.capacity = rows, capacity
        self.kv = like.new_zeros(layers, 2, rows, kv_heads, capacity, d)
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=like.device)
        self.position = torch.zeros(rows, 1, dtype=torch.long, device=like.device)
        self.key_mask = torch.zeros(rows, capacity, dtype=torch.long, device=like.device)
        self.where = torch.zeros(1, dtype=torch.long, device=like.device)
        self.uniform = torch.zeros(rows, device=like.device)
        self.ban = torch.zeros(forward.model.lm_head.weight.shape[0], device=like.device)
        fold = graph_step.FOLD_NORMS and triton_ops.usable(like)
        self.weights = decode_weights(forward, like.device, fold)
        self.rotary = graph_step.rotary_table(forward, capacity, like)


class GraphState:
    """What a rollout engine keeps between rollouts: the static buffers and captured graphs.

    Graphs read the parameters by address: they are dropped when any parameter's storage
    moves (a new model, `.to()`), and kept while the optimizer updates the weights in place.
    """

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.buffers: StaticBuffers | None = None
        self.graphs: dict[tuple, Callable[[], object]] = {}
        self.signature: tuple = ()
        self.pool = None

    def buffers_for(
        self, forward: fused.FusedForward, rows: int, capacity: int, like: torch.Tensor
    ) -> StaticBuffers:
        """Static buffers of at least `rows` rows and `capacity` positions: the kept ones when
        they are large enough, else new ones (and the graphs are captured again)."""
        signature = (tuple(p.data_ptr() for p in forward.model.parameters()), like.dtype)
        kept = self.buffers
        if (
            signature != self.signature
            or kept is None
            or kept.rows < rows
            or kept.capacity < capacity
            or kept.kv.device != like.device
        ):
            self.graphs.clear()
            self.buffers = None  # freed before the larger one is allocated
            rows = max(rows, kept.rows if kept is not None else 0)
            capacity = round_up(max(capacity, kept.capacity if kept is not None else 0))
            self.buffers = StaticBuffers(forward, rows, capacity, like)
            self.signature = signature
        return self.buffers

    def step(self, key: tuple, make_run: Callable[[], Callable[[], T]]) -> T:
        """The result of the step `make_run()` builds, replayed from the graph captured for
        `key` (built and captured only when `key` is new)."""
        if not self.capture:
            return make_run()()
        replay = self.graphs.get(key)
        if replay is None:
            replay = self.graphs[key] = self._capture(make_run())
        return replay()

    def _capture(self, run: Callable[[], T]) -> Callable[[], T]:
        """`capture` into the graphs' shared memory pool."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return capture(run, self.pool)


def capture(run: Callable[[], T], pool: object = None) -> Callable[[], T]:
    """Capture `run` after one warm-up call on a side stream (as PyTorch recommends); returns
    a function that replays it and returns the captured call's result (whose tensors each
    replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()

    def replay() -> T:
        graph.replay()
        return out

    return replay


class GraphDecoder:
    """`FusedDecoder`'s interface with decode steps replayed from CUDA graphs."""

    def __init__(self, model: nn.Module, capacity: int, state: GraphState) -> None:
        self.forward = fused.FusedForward(model)
        self.capacity, self.state = capacity, state
        self.prefill_cache: kv_cache.BufferKV | None = None
        self.buffers: StaticBuffers | None = None
        self.ban: torch.Tensor | None = None
        """The ban last copied into the static buffers (`next_tokens`)."""
        self.length = 0

    def prefill(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Next-token logits [b, vocab] after each (left-padded) prompt (eager)."""
        self.prefill_cache = kv_cache.BufferKV(len(self.forward.layers), input_ids.shape[1])
        hidden = self.forward.hidden(input_ids, position_ids, attention_mask, self.prefill_cache)
        self.length = self.prefill_cache.length
        return self.forward.logits(hidden[:, -1])

    def select(self, rows: torch.Tensor) -> None:
        """Repeat the prompts' caches into the static buffer (the first call), then keep only
        `rows` by compacting them into the leading rows."""
        n, end = len(rows), self.length
        if self.buffers is None:
            assert self.prefill_cache is not None, "prefill comes first"
            like = self.prefill_cache.keys[0]
            self.buffers = b = self.state.buffers_for(self.forward, n, self.capacity, like)
            for layer, (k, v) in enumerate(zip(self.prefill_cache.keys, self.prefill_cache.values)):
                b.kv[layer, 0, :n, :, :end] = k[rows, :, :end]
                b.kv[layer, 1, :n, :, :end] = v[rows, :, :end]
            b.kv[:, :, :n, :, end:].zero_()
            b.key_mask[:n].zero_()
            b.weights.refresh()  # the optimizer has updated the model since the last rollout
            self.prefill_cache = None
        else:
            kv = self.buffers.kv
            kv[:, :, :n, :, :end] = kv[:, :, rows, :, :end]

    def _feed(self, token, attention_mask, position) -> tuple[StaticBuffers, int, int]:
        """Write a step's inputs into the static buffers; return them and the step's (batch,
        span) buckets."""
        b = self.buffers
        assert b is not None
        n, end = token.shape[0], self.length
        b.token[:n, 0] = token
        b.position[:n, 0] = position
        b.key_mask[:n, : end + 1] = attention_mask
        b.where.fill_(end)
        self.length = end + 1
        return b, batch_bucket(n, b.rows), span_bucket(end + 1, b.capacity)

    def step(self, token, attention_mask, position) -> torch.Tensor:
        """Feed one token per row; next-token logits [b, vocab]."""
        b, batch, span = self._feed(token, attention_mask, position)
        logits = self.state.step((batch, span), partial(self._runner, b, batch, span, None))
        return logits[: token.shape[0]]

    def next_tokens(self, token, attention_mask, position, draw: Draw) -> tuple[torch.Tensor, ...]:
        """Feed one token per row; the next token of each row and its log-prob, sampled inside
        the step's graph (`sample_tokens` with the draw's uniforms and ban, copied in first).
        One graph per (batch, span, temperature, top-p, top-k, min-p, whether tokens are
        banned)."""
        n, params, banned = token.shape[0], draw.params, draw.ban is not None
        b, batch, span = self._feed(token, attention_mask, position)
        if draw.uniform is not None:  # from page-locked memory on a GPU (`hf.staged`)
            b.uniform[:n].copy_(draw.uniform, non_blocking=True)
        if banned and draw.ban is not self.ban:  # once per rollout
            b.ban.copy_(draw.ban)
            self.ban = draw.ban
        key = (batch, span, params.temperature, params.top_p, params.top_k, params.min_p, banned)
        run = partial(self._runner, b, batch, span, (params, banned))
        tokens, logps = self.state.step(key, run)
        return tokens[:n], logps[:n]

    def _runner(
        self, b: StaticBuffers, batch: int, span: int, sampling: tuple | None
    ) -> Callable[[], object]:
        """The step over the first `batch` rows and `span` positions: its logits, or with
        `sampling` (the params, of which only temperature, top-p and top-k are read, and
        whether tokens are banned) its sampled tokens and log-probs."""

        def run() -> object:
            mask = b.key_mask[:batch, :span]
            bias = fused.additive_bias(mask[:, None, :] != 0, b.kv.dtype)
            cache = SlotKV(b.kv, batch, span, b.where)
            token, position = b.token[:batch, 0], b.position[:batch, 0]
            hidden = decode_hidden(self.forward, b.weights, token, position, bias, cache, b.rotary)
            logits = self.forward.logits(hidden)
            if sampling is None:
                return logits
            params, banned = sampling
            return sample_tokens(logits, params, b.uniform[:batch], b.ban if banned else None)

        return run
