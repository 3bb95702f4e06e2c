"""A lean forward pass for Llama-family causal LMs (Llama, Mistral, Qwen2), used by the rollout
engine and the policy update in place of the `transformers` module stack.

It computes the same function as the Hugging Face model from the same parameters (tested to
fp32 rounding, gradients included), with less work:
- padding-free training: given the real positions of a padded batch, only those tokens go
  through the matmuls and norms; attention alone sees the padded layout, except in the C
  kernels (CPU, fp32) and the Triton kernels (GPU, `gpu_kernels`), which read the real
  positions where they are;
- attention for one query position (a decode step) is two batched matmuls with the grouped
  query heads folded into the query axis (no repeated K/V, and not the CPU flash-attention
  kernel, which is slow for one query); longer queries use the fused SDPA kernel;
- the decode KV cache is one preallocated buffer per layer, written in place
  (`rlvr.models.kv_cache`);
- on a CPU, a decode step's RMSNorm, rotary embedding, SiLU·up and attention are C kernels
  (`cpu_kernels`), one pass each, where PyTorch spends more on per-operation overhead than on
  the arithmetic of tensors this small;
- with activation checkpointing on (`enable_activation_checkpointing`), each layer's
  activations are recomputed in backward, in two regions around the KV-cache update, which
  must not run twice.

Concatenating q/k/v and gate/up into one matmul each was measured and dropped here: no gain
in decoding on a CPU at batch 128, a loss in training (the gradient split costs more than it
saves). A GPU's captured decode step does use it (`rollout.graph_step`).

Only plain modules are accepted (`supports`): exact `nn.Linear` projections, or adapters around
them (LoRA, `rlvr.models.lora`), which run by their own forward where a plain projection would
run by its weight (never in the packed products; a CPU decode step's panel products take a
LoRA layer's base weight and add its low-rank term); SiLU MLP, full attention
without dropout, rotary types that do not depend on the sequence length. Anything else
(quantised projections, an adapted LM head) uses the `transformers` forward, as does
`model.fused_forward: false`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlvr.models import cpu_kernels, flash_varlen, gpu_kernels
from rlvr.models.cpu_kernels import linear
from rlvr.models.kv_cache import ConcatKV, KVStore, padded

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
ENABLE_ATTR = "rlvr_fused_forward"
"""Attribute on the model that turns the fused forward off when False (`model.fused_forward`)."""
CHECKPOINT_ATTR = "rlvr_activation_checkpointing"
"""Model attribute that turns activation checkpointing on (`train.gradient_checkpointing`)."""
FSDP_CALL = "rlvr_fsdp_call"
"""Attribute of a module that FSDP2 shards (`training.sharding.shard`): `module.rlvr_fsdp_call(
fn, *args)` runs `fn(*args)` as a forward of the module, its weights gathered before and its
gradient's reduce-scatter hooked on (`within`)."""


def within(module: nn.Module, fn: Callable, *args: object) -> object:
    """`fn(*args)` as a forward of `module` where FSDP shards it (`FSDP_CALL`), plainly
    elsewhere: the fused forward reads weights without calling the modules, so it names the
    module whose weights a step reads."""
    call = getattr(module, FSDP_CALL, None)
    return fn(*args) if call is None else call(fn, *args)


def _plain_linear(module: object) -> bool:
    return type(module) is nn.Linear


def adapted_linear(module: object) -> bool:
    """Whether `module` is an adapter around a plain `nn.Linear` (a peft tuner layer such as
    LoRA's), whose own forward computes the adapted projection."""
    base = getattr(module, "get_base_layer", None)
    return base is not None and module is not base() and _plain_linear(base())


def has_adapted_linears(model: nn.Module) -> bool:
    """Whether any module of `model` is an `adapted_linear`."""
    return any(adapted_linear(m) for m in model.modules())


def supports(model: nn.Module) -> bool:
    """Whether the fused forward computes exactly what `model` computes."""
    if not getattr(model, ENABLE_ATTR, True):
        return False
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return False
    full_attention = all(t == "full_attention" for t in getattr(cfg, "layer_types", None) or [])
    window = getattr(cfg, "sliding_window", None)
    if cfg.model_type == "qwen2" and not getattr(cfg, "use_sliding_window", False):
        window = None
    if not full_attention or window is not None or getattr(cfg, "hidden_act", "") != "silu":
        return False
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    try:
        base, head = model.model, model.lm_head
        rope_type = getattr(base.rotary_emb, "rope_type", "default")
        layers = list(base.layers)
    except AttributeError:
        return False
    if rope_type in ("dynamic", "longrope") or type(base.embed_tokens) is not nn.Embedding:
        return False
    projections = [head]
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        if getattr(a, "attention_dropout", 0.0):  # 0 after `disable_dropout_`
            return False
        projections += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return _plain_linear(head) and all(
        _plain_linear(p) or adapted_linear(p) for p in projections[1:]
    )


def real_positions(real: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries of a [b, t] mask in its flattened [b·t] layout."""
    return real.reshape(-1).nonzero().squeeze(-1)


class HostIndex(NamedTuple):
    """A padding-free forward's index tensors on the CPU, of which the forward's inputs are
    copies: the key mask [b, s], the computed positions (`real_positions`; None: all) and each
    row's prefix (its prompt's row in a filled `ConcatKV`; None: its own), with `send`, which
    copies a CPU tensor to the forward's device without waiting for it. From them
    `KernelOps` lays the attention out on the host and sends the layout: a forward on a GPU
    then never waits to read the GPU back, and the host prepares the next micro-batch while
    the GPU runs this one (lever 54)."""

    key_mask: torch.Tensor
    flat: torch.Tensor | None
    select: torch.Tensor | None
    send: Callable[[torch.Tensor], torch.Tensor]


def prefix_layout(
    key_mask: torch.Tensor,
    t: int,
    flat: torch.Tensor | None,
    select: torch.Tensor | None,
    prefixes: int,
) -> tuple[cpu_kernels.AttentionLayout, bool]:
    """The attention's layout when row b reads the keys of prefix `select[b]` (None: its
    own) before its own t positions, of which those in `flat` (in the [b·t] layout; None: all)
    are computed, key_mask [b, s] 1 on real keys; and whether the rows must gather their
    prefixes' keys (a selection not in group order: each row then gets its own copy)."""
    b, s = key_mask.shape
    sp, device = s - t, key_mask.device
    if flat is None:
        rows = torch.arange(b * t, device=device).view(b, t)
    else:
        rows = torch.full((b * t,), -1, dtype=torch.long, device=device)
        rows = rows.index_copy_(0, flat, torch.arange(len(flat), device=device)).view(b, t)
    gather = select is not None and not bool((select[1:] >= select[:-1]).all())
    if select is not None and not gather:
        starts = torch.searchsorted(select, torch.arange(prefixes + 1, device=device))
        firsts = starts[:-1].clamp(max=max(b - 1, 0))
    else:
        starts = torch.arange(b + 1, device=device)
        firsts = starts[:-1]
    own_mask, prefix_mask = key_mask[:, sp:], key_mask[firsts, :sp]
    return cpu_kernels.AttentionLayout(rows, own_mask, prefix_mask, starts), gather


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021, RoFormer eq. 34, half-split layout as in Llama):
    x·cos + rotate_half(x)·sin, with rotate_half(x1, x2) = (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias)·v with grouped-query heads (K/V head j serves query heads
    j·g … j·g + g − 1, as in `transformers`' repeat_kv).

    q: [b, heads, t, d], k, v: [b, kv_heads, s, d], bias: [b, 1, t, s] additive mask (0 or
    -inf). Two batched matmuls with the g query heads folded into the query axis (no K/V is
    repeated) serve one query position (a decode step) and, in fp32 on a CPU, short queries
    whose scores are small (`SMALL_ATTENTION`; there PyTorch's flash kernel, built for long
    blocks, is 1.2–1.7× slower). Otherwise the fused scaled-dot-product kernel runs, which
    does not keep the [t, s] scores for backward.
    """
    b, nq, t, d = q.shape
    nkv, s = k.shape[1], k.shape[2]
    g = nq // nkv
    small = (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and t <= SMALL_ATTENTION[0]
        and b * nq * t * s <= SMALL_ATTENTION[1]
    )
    if t > 1 and not small:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, scale=scale, enable_gqa=nq != nkv
        )
    scores = torch.matmul(q.reshape(b, nkv, g * t, d) * scale, k.transpose(-1, -2))
    scores = scores.view(b, nkv, g, t, s) + bias.view(b, 1, 1, t, s)
    probs = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs.view(b, nkv, g * t, s), v).view(b, nq, t, d)


SMALL_ATTENTION = (48, 1 << 22)
"""Longest query and most score elements (16 MiB in fp32) for which a CPU computes attention
with explicit scores (`attention`); measured with `benchmarks/revision_ab.py` (lever 18)."""


def visible_keys(key_mask: torch.Tensor, t: int) -> torch.Tensor:
    """[b, t, s] bool: which keys each query sees. The last t keys are the queries (causal
    among them), earlier keys are visible where `key_mask` [b, s] is 1. A query always sees
    itself, so the left padding of a prompt gets finite (unused) outputs instead of NaN."""
    s = key_mask.shape[1]
    query_pos = torch.arange(s - t, s, device=key_mask.device)[:, None]
    key_pos = torch.arange(s, device=key_mask.device)[None, :]
    visible = (key_pos <= query_pos) & key_mask[:, None, :].bool()
    return visible | (key_pos == query_pos)


def additive_bias(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[b, 1, t, s] attention bias from a [b, t, s] bool mask: 0 where visible, -inf elsewhere."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return bias.masked_fill_(~visible, float("-inf")).unsqueeze(1)


def mask_bias(key_mask: torch.Tensor, t: int, dtype: torch.dtype) -> torch.Tensor:
    """[b, 1, t, s] additive bias: 0 where `visible_keys`, -inf elsewhere."""
    return additive_bias(visible_keys(key_mask, t), dtype)


class TorchOps(cpu_kernels.Composites):
    """The lean forward's per-layer operations in PyTorch: any device and dtype, differentiable.
    `bias` [b, 1, t, s] is the attention's additive mask (`mask_bias`); `flat` the positions
    the forward computes in the [b·t] layout (`real_positions`; None: all, [b, t, ...])."""

    def __init__(self, bias: torch.Tensor, flat: torch.Tensor | None = None) -> None:
        self.bias, self.flat = bias, flat

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of the last axis (Zhang & Sennrich 2019, eq. 4), times `weight`."""
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def projections(x: torch.Tensor, *modules: nn.Linear) -> tuple[torch.Tensor, ...]:
        """x through each of `modules` (a layer's q, k, v or gate, up projections)."""
        return tuple(linear(x, module) for module in modules)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`rotate` (looked up at each call, so a benchmark can swap it)."""
        return rotate(x, cos, sin)

    @staticmethod
    def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) · up, the SwiGLU MLP's inner product (Shazeer 2020, eq. 6)."""
        return F.silu(gate) * up

    def cached(self, cache: KVStore, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Add the per-token k, v [*lead, kv_heads, d] to `cache`; return what `attend` reads
        (all of the layer's keys and values, [b, kv_heads, s, d])."""
        b, _, t, _ = self.bias.shape
        return cache.update(layer, padded(k, self.flat, b, t), padded(v, self.flat, b, t))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float
    ) -> torch.Tensor:
        """`attention` of the per-token queries q [*lead, heads, d] under this forward's mask
        over `cached`'s keys; returns [*lead, heads·d] (only attention sees the padded layout)."""
        b, _, t, _ = self.bias.shape
        a = attention(padded(q, self.flat, b, t), k, v, self.bias, scale).transpose(1, 2)
        a = a.reshape(b * t, -1)
        return a.view(*q.shape[:-2], -1) if self.flat is None else a.index_select(0, self.flat)


class KernelOps(TorchOps):
    """`TorchOps` with RMSNorm, the rotary embedding, SiLU·up and the attention, forward and
    backward, each one pass of a C kernel (`cpu_kernels.rms_norm`, `cpu_kernels.rotary`,
    `cpu_kernels.swiglu`, `cpu_kernels.attention`): fp32 on a CPU, where PyTorch runs the
    first three as several memory-bound operations each, and the attention over the padded
    layout of every row, with each sample's copy of its prompt's keys. `key_mask` [b, s] is 1
    on real keys, of which the last t are the queries'."""

    def __init__(
        self,
        key_mask: torch.Tensor,
        t: int,
        flat: torch.Tensor | None = None,
        host: HostIndex | None = None,
    ) -> None:
        self.key_mask, self.t, self.flat, self.host = key_mask, t, flat, host
        self.layout: cpu_kernels.AttentionLayout | None = None
        self.gather = False

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm by the kernel."""
        return cpu_kernels.rms_norm(x, weight, eps)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`rotate` by the kernel."""
        return cpu_kernels.rotary(x, cos, sin)

    @staticmethod
    def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) · up by the kernel."""
        return cpu_kernels.swiglu(gate, up)

    def cached(self, cache: KVStore, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Add the per-token k, v [*lead, kv_heads, d] to `cache`; return what `attend` reads:
        k, v and the keys and values before them, one entry per prefix. A filled `ConcatKV`
        whose row selection is in group order (a prompt's samples together) gives one prefix
        per prompt, read in place; otherwise each row is its own prefix."""
        b, t = self.key_mask.shape[0], self.t
        if isinstance(cache, ConcatKV) and cache.keys[layer] is not None:
            pk, pv, select = cache.append_tokens(layer, k, v, self.flat, b, t)
        else:
            full_k, full_v = cache.update(
                layer, padded(k, self.flat, b, t), padded(v, self.flat, b, t)
            )
            s = full_k.shape[2] - t
            pk, pv, select = full_k[:, :, :s], full_v[:, :, :s], None
        if self.layout is None:
            self.layout = self._layout(select, len(pk), k)
        if self.gather:  # a selection not in group order: each row gets its own copy
            pk, pv = pk.index_select(0, select), pv.index_select(0, select)
        heads, d = k.shape[-2:]
        return k.reshape(-1, heads, d), v.reshape(-1, heads, d), pk, pv

    @staticmethod
    def plans_on_host(k: torch.Tensor) -> bool:
        """Whether a layout made on the host (`HostIndex`) for keys like k [n, kv_heads, d]
        gets its FlashAttention-2 plan there: not for the C kernels, which do not use it."""
        return False

    def _layout(
        self, select: torch.Tensor | None, prefixes: int, k: torch.Tensor
    ) -> cpu_kernels.AttentionLayout:
        """`prefix_layout` of these rows (`select[b]` is row b's prefix; None: row b's own),
        made from the `HostIndex` on the host and sent, where there is one, with the
        FlashAttention-2 plan where `plans_on_host(k)`."""
        host = self.host
        if host is None:
            layout, self.gather = prefix_layout(self.key_mask, self.t, self.flat, select, prefixes)
            return layout
        chosen = None if select is None else host.select
        layout, self.gather = prefix_layout(host.key_mask, self.t, host.flat, chosen, prefixes)
        if self.plans_on_host(k):
            _ = layout.varlen  # made here, on the host, and sent with the layout
        return layout.sent(host.send)

    attention_kernel = staticmethod(cpu_kernels.attention)

    def attend(self, q: torch.Tensor, *kv: torch.Tensor, scale: float) -> torch.Tensor:
        """`TorchOps.attend` by the kernel; `kv` as `cached` returns it."""
        heads, d = q.shape[-2:]
        out = self.attention_kernel(q.reshape(-1, heads, d), *kv, self.layout, scale)
        return out.view(*q.shape[:-2], heads * d)


def gpu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: cpu_kernels.AttentionLayout,
    scale: float,
) -> torch.Tensor:
    """`cpu_kernels.attention` on a GPU: by FlashAttention-2's variable-length kernel where
    `flash_varlen.usable` (bf16 or fp16) and the layout allows it (lever 41), else by the
    Triton kernels (`gpu_kernels.attention`, any dtype)."""
    packed = layout.varlen if flash_varlen.usable(q) else None
    if packed is None:
        return gpu_kernels.attention(q, k, v, prefix_k, prefix_v, layout, scale)
    return flash_varlen.attention(q, k, v, prefix_k, prefix_v, layout, scale, packed)


class PackedOps(KernelOps):
    """`KernelOps` on a GPU, by the Triton kernels of `gpu_kernels`: the attention
    (`gpu_attention`: FlashAttention-2's variable-length kernel in bf16 or fp16, else
    `gpu_kernels.attention`, which reads only the computed positions, a shared prompt's keys
    in place and the key blocks each query block sees); the rotary embedding and SiLU·up,
    one kernel each way, reading the views of one packed q/k/v and one gate/up matmul
    (`projections`, `mlp_inner`); each residual addition with the RMSNorm after it
    (`add_rms_norm`, one kernel each way). The embeddings' RMSNorm by PyTorch."""

    rms_norm = staticmethod(TorchOps.rms_norm)
    add_rms_norm = staticmethod(gpu_kernels.add_rms_norm)
    rotate = staticmethod(gpu_kernels.rotary)
    silu_mul = staticmethod(gpu_kernels.swiglu)
    attention_kernel = staticmethod(gpu_attention)

    @staticmethod
    def plans_on_host(k: torch.Tensor) -> bool:
        """Where `gpu_attention` will run FlashAttention-2 on keys like k, whose dtype and head
        size it takes (`flash_varlen.supports`; bf16 or fp16): not for the Triton kernels'
        fp32, which would make a plan they never read."""
        return flash_varlen.supports(k.dtype, k.shape[-1])

    @staticmethod
    def projections(x: torch.Tensor, *modules: nn.Linear) -> tuple[torch.Tensor, ...]:
        """`TorchOps.projections` as one matmul (`packed_linear`), its output split into views
        that the kernels read in place: one GEMM each way instead of one per module, so the
        narrow k and v projections of a GQA model are no GEMMs of their own. Modules of
        which only some have a bias keep their own matmuls."""
        y = packed_linear(x, *modules)
        if y is None:
            return TorchOps.projections(x, *modules)
        return y.split([module.out_features for module in modules], dim=-1)

    def mlp_inner(self, x: torch.Tensor, gate: nn.Linear, up: nn.Linear) -> torch.Tensor:
        """`TorchOps.mlp_inner` by one gate/up matmul (`packed_linear`) and
        `gpu_kernels.swiglu_packed`, whose backward writes the matmul output's gradient whole,
        where split views would have autograd join the two halves' gradients with a copy
        (lever 51)."""
        y = packed_linear(x, gate, up)
        if y is None:
            return super().mlp_inner(x, gate, up)
        return gpu_kernels.swiglu_packed(y)


def packed_linear(x: torch.Tensor, *modules: nn.Linear) -> torch.Tensor | None:
    """x through `modules` as one matmul over their weights (and biases) concatenated, a copy
    per call whose gradient autograd splits back; None where only some have a bias, or where
    one is an adapter (`adapted_linear`)."""
    biases = [module.bias for module in modules]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    if not all(_plain_linear(module) for module in modules):
        return None
    bias = None if biases[0] is None else torch.cat(biases)
    return F.linear(x, torch.cat([module.weight for module in modules]), bias)


def layer_ops(
    h: torch.Tensor,
    key_mask: torch.Tensor,
    t: int,
    flat: torch.Tensor | None = None,
    panels: cpu_kernels.PanelStore | None = None,
    host: HostIndex | None = None,
    after_cache: bool = True,
) -> TorchOps | cpu_kernels.DecodeOps:
    """The C kernels for a decode step (one position per row after cached ones, no
    padding-free layout) where `cpu_kernels.usable`; else the PyTorch operations, with
    RMSNorm, the rotary embedding, SiLU·up and the attention by kernels where
    `cpu_kernels.trainable` (`KernelOps`), and the
    attention, the rotary embedding and SiLU·up of a padding-free forward by Triton kernels
    where `gpu_kernels.usable` (on a GPU: `PackedOps`). `flat`: the positions computed in the
    [b·t] layout (`real_positions`), None for all; `panels`: the decode step's packed weights
    (`cpu_kernels.PanelStore`), None for PyTorch's products; `host`: the index tensors on
    the CPU, from which the kernels' attention is laid out there (`HostIndex`);
    `after_cache`: whether positions are cached before these (a one-token prompt's forward
    has none, and a `ConcatKV` then hands its keys back in the projection's strided layout,
    which the decode kernels do not read)."""
    if t == 1 and after_cache and flat is None and cpu_kernels.usable(h):
        return cpu_kernels.DecodeOps(visible_keys(key_mask, 1).squeeze(1), panels)
    if cpu_kernels.trainable(h):
        return KernelOps(key_mask, t, flat, host)
    if flat is not None and gpu_kernels.usable(h):
        return PackedOps(key_mask, t, flat, host)
    return TorchOps(mask_bias(key_mask, t, h.dtype), flat)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them
    (activation checkpointing, Chen et al. 2016, "Training Deep Nets with Sublinear Memory
    Cost"): a layer then keeps only its input, its queries and the KV cache, not its norms,
    attention output and 3 × hidden-wide MLP activations, for one more forward of the layer.
    Raises ValueError when `model` does not run through the fused forward (`supports`)."""
    if not supports(model):
        raise ValueError(
            "activation checkpointing needs rlvr's fused forward (a Llama, Mistral or Qwen2 "
            "model with model.fused_forward true)"
        )
    setattr(model, CHECKPOINT_ATTR, True)


def recompute_in_backward(model: nn.Module, layer: nn.Module) -> bool:
    """Whether `layer`'s activations are recomputed in backward: gradients are recorded and
    either `enable_activation_checkpointing` was called or the layer's own
    `gradient_checkpointing` flag (`model.gradient_checkpointing_enable()`) is set."""
    if not torch.is_grad_enabled():  # a rollout's decode step: no lookups
        return False
    return bool(
        getattr(model, CHECKPOINT_ATTR, False) or getattr(layer, "gradient_checkpointing", False)
    )


def _direct(function: Callable, *args: object) -> object:
    return function(*args)


def _recomputed(function: Callable, *args: object) -> object:
    return checkpoint(function, *args, use_reentrant=False)


class FusedForward:
    """The decoder of a supported model as plain tensor operations.

    Its CPU decode steps multiply by packed copies of the weights (`panels`), made at the
    first step: an instance serves weights that do not change, as the rollout engine's
    decoder, made for each rollout, does."""

    def __init__(self, model: nn.Module) -> None:
        cfg = model.config
        self.model = model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = model.model.norm.variance_epsilon
        self.scale = model.model.layers[0].self_attn.scaling
        self.layers = list(model.model.layers)
        self.panels = cpu_kernels.PanelStore()

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor,
        cache: KVStore,
        flat: torch.Tensor | None = None,
        ops: TorchOps | None = None,
        host: HostIndex | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states of `input_ids` [b, t] placed after the cached positions.

        key_mask [b, cache.length + t] is 1 on real tokens. With `flat` (the indices of the N
        used positions in the flattened [b·t] layout, `real_positions`), only those go through
        the matmuls (padding-free): the result is [N, hidden] in that order, and only attention
        sees the padded layout.
        Without it the result is [b, t, hidden]. `ops` replaces the per-layer operations
        `layer_ops` would pick (a CUDA-graph decode step brings its own attention mask);
        `host`: key_mask and flat on the CPU, for `layer_ops` (`HostIndex`).
        """
        b, t = input_ids.shape
        d = self.head_dim
        lead = (b, t) if flat is None else (flat.shape[0],)
        h = self.model.model.embed_tokens(
            input_ids if flat is None else input_ids.reshape(-1)[flat]
        )
        cos, sin = self.model.model.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        if flat is not None:
            cos, sin = cos.reshape(b * t, 1, d)[flat], sin.reshape(b * t, 1, d)[flat]
        ops = ops or layer_ops(h, key_mask, t, flat, self.panels, host, cache.length > 0)

        def qkv(
            layer: nn.Module, h: torch.Tensor, x: torch.Tensor | None
        ) -> tuple[torch.Tensor, ...]:
            """The layer's rotated queries and keys and its values, per token, from its
            normed input x (which `rest` makes with the residual addition before it), or
            with x None from the stream h, normed here (a recomputed region: it then keeps
            h, which the layer's `rest` keeps too, instead of a tensor of its own)."""
            attn = layer.self_attn
            if x is None:
                x = ops.rms_norm(h, layer.input_layernorm.weight, self.eps)
            q, k, v = ops.projections(x, attn.q_proj, attn.k_proj, attn.v_proj)
            q = ops.rotate(q.view(*lead, self.heads, d), cos, sin)
            k = ops.rotate(k.view(*lead, self.kv_heads, d), cos, sin)
            return q, k, v.view(*lead, self.kv_heads, d)

        def rest(
            layer: nn.Module,
            gain: torch.Tensor | None,
            h: torch.Tensor,
            q: torch.Tensor,
            *kv: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            """The layer's output from its input h, its queries and the keys and values
            `ops.cached` gave, and that output's RMSNorm by `gain` (the next layer's input
            norm, or the final one; None: not normed)."""
            attn, mlp = layer.self_attn, layer.mlp
            attended = ops.linear(ops.attend(q, *kv, scale=self.scale), attn.o_proj)
            h, x = ops.add_rms_norm(h, attended, layer.post_attention_layernorm.weight, self.eps)
            out = ops.linear(ops.mlp_inner(x, mlp.gate_proj, mlp.up_proj), mlp.down_proj)
            return (h + out, None) if gain is None else ops.add_rms_norm(h, out, gain, self.eps)

        def sharded_layer(layer: nn.Module, i: int, h: torch.Tensor) -> torch.Tensor:
            """Layer i's output from its input h, all within the layer's FSDP forward
            (`within`), so it norms its own input and leaves the next layer's norm to it."""
            run = _recomputed if recompute_in_backward(self.model, layer) else _direct
            q, k, v = run(qkv, layer, h, None)
            return run(rest, layer, None, h, q, *ops.cached(cache, i, k, v))[0]

        if torch.is_grad_enabled() and hasattr(self.layers[0], FSDP_CALL):
            for i, layer in enumerate(self.layers):
                h = within(layer, sharded_layer, layer, i, h)
            cache.length += t
            return ops.rms_norm(h, self.model.model.norm.weight, self.eps)
        gains = [layer.input_layernorm.weight for layer in self.layers[1:]]
        gains.append(self.model.model.norm.weight)
        x = ops.rms_norm(h, self.layers[0].input_layernorm.weight, self.eps)
        for i, (layer, gain) in enumerate(zip(self.layers, gains, strict=True)):
            recompute = recompute_in_backward(self.model, layer)
            run = _recomputed if recompute else _direct
            q, k, v = run(qkv, layer, h, None if recompute else x)
            h, x = run(rest, layer, gain, h, q, *ops.cached(cache, i, k, v))
        cache.length += t
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head; outside autograd on a CPU in fp32 by the packed products
        (`cpu_kernels.PanelStore`) where they pay (its 107 columns for the tiny model's
        vocabulary ran at about 15 GFLOP/s by PyTorch's BLAS)."""
        head = self.model.lm_head
        if cpu_kernels.usable(hidden) and cpu_kernels.panels_pay() and _plain_linear(head):
            return self.panels.products(hidden.contiguous(), (head,))[0]
        return head(hidden)
