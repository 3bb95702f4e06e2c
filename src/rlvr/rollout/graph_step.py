"""The decode step a CUDA graph captures (`rollout.graphs`), in as few kernels as PyTorch
allows: one token per row through a `fused.FusedForward` model, reading and writing the
static KV buffer.

Inside a graph a kernel costs no launch time, but each still runs for a few microseconds
however little it does, and the small ones leave most of the GPU idle; with about 36 kernels
per layer the 24-layer 0.5B shape spent most of a 64-row step on them (`docs/benchmarks.md`,
levers 25 and 27). Per layer this step runs:

- q, k and v as one matmul, and gate and up as one, over weights packed once per rollout
  (`PackedWeights`; the copies cost 2/3 of the layer weights' memory while a rollout engine
  keeps its graphs, so a model whose copies would take more than `PACK_MEMORY_SHARE` of the
  device's memory reads its projections one by one instead);
- the rotary embedding of q and k together, as x·cos + roll(x, d/2)·(±sin) (three kernels,
  RoFormer eq. 34 in Llama's half-split layout);
- attention as one fused kernel that reads each K/V head once for its group of query heads
  (`decode_attention`): PyTorch's SDPA, or from `OUR_ATTENTION_ROWS` rows on where Triton
  runs our split-KV kernel (`triton_ops.decode_attention`, lever 46);
- the residual additions inside the output matmuls, in place (`residual_linear`);
- where Triton runs (`triton_ops.usable`: a GPU), the rotary embedding with the KV-cache write
  as one kernel and SiLU·up as one (`triton_ops`, lever 29), instead of six and two;
- and there, with packed weights, no RMSNorm kernel before the two packed matmuls: the
  packed copies hold the norms' gains, and those two kernels scale each row by its
  rsqrt(mean(h²) + ε) (`triton_ops.RowNorm`, lever 45; `FOLD_NORMS`);
- the rotary embedding's cos and signed sin of each row's position gathered from a table
  made once per set of static buffers (`rotary_table`, lever 49), one kernel instead of the
  dozen that compute them.

It computes what `FusedForward.hidden` computes for one position, up to rounding (tested
against the eager decoder's samples).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from rlvr.models import fused
from rlvr.rollout import triton_ops

PACK_MEMORY_SHARE = 0.05
"""Most of the device's memory the packed copies may take (`decode_weights`): on an 80 GB GPU
models up to about 3B parameters; a 7B Llama's would take 9 GB."""

FOLD_NORMS = True
"""Whether packed weights hold the RMSNorm gains where the Triton kernels run (lever 45;
`benchmarks/gpu_ab.py` turns it off for its A/B)."""

Groups = tuple[list[nn.Linear], list[nn.Linear]]


def projection_groups(forward: fused.FusedForward) -> list[Groups]:
    """Per layer, the projections of one packed matmul each: (q, k, v) and (gate, up)."""
    return [
        (
            [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
            [layer.mlp.gate_proj, layer.mlp.up_proj],
        )
        for layer in forward.layers
    ]


def _packed_bias(modules: list[nn.Linear]) -> torch.Tensor | None:
    """The modules' biases end to end (zeros for one without), or None when none has one."""
    if all(m.bias is None for m in modules):
        return None
    return torch.cat(
        [m.weight.new_zeros(m.out_features) if m.bias is None else m.bias for m in modules]
    )


def norm_gains(forward: fused.FusedForward) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the gains of the RMSNorms before each group of `projection_groups`."""
    return [(layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            for layer in forward.layers]  # fmt: skip


class PackedWeights:
    """Each group of `projection_groups` stacked into one matrix (and one bias): one matmul
    instead of three or two. Copies, which `refresh` rewrites in place: the optimizer updates
    the model's weights between rollouts, and the graphs read the copies by address.

    With `fold_norms` each matrix's columns are also multiplied by the gain g of the RMSNorm
    before it, so that RMSNorm(h)·Wᵀ = rsqrt(mean(h²) + ε)·(h·(W·diag g)ᵀ): `project` then
    takes the raw hidden state and leaves out the bias, and `norm` gives what the next kernel
    must still apply (`triton_ops.RowNorm`)."""

    def __init__(self, forward: fused.FusedForward, fold_norms: bool = False) -> None:
        self.sources = projection_groups(forward)
        self.gains = norm_gains(forward) if fold_norms else None
        self.weights = [
            [torch.cat([m.weight for m in g]) for g in groups] for groups in self.sources
        ]
        self.biases = [[_packed_bias(g) for g in groups] for groups in self.sources]
        self._fold()

    @property
    def folded(self) -> bool:
        """Whether the matrices hold the RMSNorm gains."""
        return self.gains is not None

    def _fold(self) -> None:
        """Multiply each matrix's columns by its RMSNorm's gain, in place (when folding)."""
        if self.gains is None:
            return
        for weights, gains in zip(self.weights, self.gains, strict=True):
            for weight, gain in zip(weights, gains, strict=True):
                weight.mul_(gain)

    def refresh(self) -> None:
        """Copy the model's current weights into the packed tensors, module by module."""
        for groups, weights, biases in zip(self.sources, self.weights, self.biases, strict=True):
            for modules, weight, bias in zip(groups, weights, biases, strict=True):
                start = 0
                for m in modules:
                    end = start + m.out_features
                    weight[start:end].copy_(m.weight)
                    if bias is not None and m.bias is not None:
                        bias[start:end].copy_(m.bias)
                    start = end
        self._fold()

    def project(self, layer: int, group: int, x: torch.Tensor) -> torch.Tensor:
        """The outputs of `layer`'s projection group `group` (0: q/k/v, 1: gate/up), end to
        end; when folded, of the raw hidden state x and without the bias."""
        bias = None if self.folded else self.biases[layer][group]
        return F.linear(x, self.weights[layer][group], bias)

    def norm(
        self, layer: int, group: int, hidden: torch.Tensor, eps: float
    ) -> triton_ops.RowNorm | None:
        """When folded, the rest of the RMSNorm of `hidden` for `project`'s output, with the
        group's bias; else None (`project` had it all)."""
        if not self.folded:
            return None
        return triton_ops.RowNorm(hidden, eps, self.biases[layer][group])


class SeparateWeights:
    """`PackedWeights`' interface over the model's own projections, one matmul each (no
    copies), for a model whose packed copies would take too much memory (`decode_weights`)."""

    def __init__(self, forward: fused.FusedForward) -> None:
        self.sources = projection_groups(forward)

    def refresh(self) -> None:
        """Nothing to copy: the projections are read where they are."""

    folded = False

    def project(self, layer: int, group: int, x: torch.Tensor) -> torch.Tensor:
        """`PackedWeights.project` as one matmul per projection."""
        return torch.cat([fused.linear(x, m) for m in self.sources[layer][group]], dim=-1)

    def norm(self, layer: int, group: int, hidden: torch.Tensor, eps: float) -> None:
        """Nothing left for the next kernel: the projections had all of the RMSNorm."""


def device_memory(device: torch.device) -> int:
    """Bytes of memory of `device`: a GPU's own, else the machine's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def decode_weights(
    forward: fused.FusedForward, device: torch.device, fold_norms: bool = False
) -> PackedWeights | SeparateWeights:
    """Packed copies of the projections while they take at most `PACK_MEMORY_SHARE` of the
    device's memory (holding the RMSNorm gains with `fold_norms`), else the projections as
    they are."""
    groups = [m for layer in projection_groups(forward) for g in layer for m in g]
    size = sum(p.numel() * p.element_size() for m in groups for p in m.parameters())
    if size <= PACK_MEMORY_SHARE * device_memory(device):
        return PackedWeights(forward, fold_norms)
    return SeparateWeights(forward)


class SlotKV:
    """A cache view for one captured step: writes at the device-side column `where`, reads the
    first `span` columns of the first `batch` rows of the static buffer."""

    def __init__(self, kv: torch.Tensor, batch: int, span: int, where: torch.Tensor) -> None:
        self.kv, self.batch, self.span, self.where = kv, batch, span, where
        self.length = 0

    def buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's keys and values [batch, kv_heads, capacity, d], every position."""
        return self.kv[layer, 0, : self.batch], self.kv[layer, 1, : self.batch]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write one position per row at `where`; return the first `span` positions."""
        keys, values = self.buffers(layer)
        keys.index_copy_(2, self.where, k)
        values.index_copy_(2, self.where, v)
        return keys[:, :, : self.span], values[:, :, : self.span]


def residual_linear(h: torch.Tensor, x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
    """h + module(x) written into h, with the addition in the matmul's epilogue: an
    out-of-place `addmm` first copies h into its new output, one more kernel per call (two
    per layer, 50 device copies per step in the H200 profile of the 0.5B shape)."""
    h.addmm_(x, module.weight.t())
    return h if module.bias is None else h.add_(module.bias)


def rotary_pair(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) such that x·cos + roll(x, d/2)·signed_sin = `fused.rotate(x, cos,
    sin)`: roll(x, d/2) = (x2, x1) and rotate_half(x) = (-x2, x1)."""
    half = sin.shape[-1] // 2
    sign = torch.ones(sin.shape[-1], dtype=sin.dtype, device=sin.device)
    sign[:half] = -1
    return cos, sin * sign


STATIC_ROPE = ("default", "linear", "llama3", "yarn")
"""`transformers` rotary embeddings whose frequencies are fixed (not "dynamic" or "longrope",
which change them with the positions a call sees)."""


def rotary_table(
    forward: fused.FusedForward, capacity: int, like: torch.Tensor
) -> torch.Tensor | None:
    """[capacity, 2, d]: `rotary_pair`'s (cos, signed sin) of positions 0 … capacity − 1 in
    `like`'s dtype and device, by the model's own rotary embedding (an element-wise function
    of the position, so each row is what a step would compute); None where the embedding's
    frequencies are not fixed (`STATIC_ROPE`)."""
    rotary = forward.model.model.rotary_emb
    if getattr(rotary, "rope_type", None) not in STATIC_ROPE:
        return None
    positions = torch.arange(capacity, device=like.device)[None]
    cos, signed_sin = rotary_pair(*rotary(like, positions))
    return torch.stack([cos[0], signed_sin[0]], dim=1)


OUR_ATTENTION_ROWS = 512
"""From this many rows on, `decode_attention` runs our split-KV kernel where Triton runs. On an
H200 (`docs/benchmarks.md`, lever 46) it made the captured step 1.11× faster for the ≈110M
shape and 1.01–1.02× for the 0.5B shape at 512 rows (two sessions for the 0.5B shape), and
0.98× (0.5B) and 1.00–1.03× (≈110M) at 64 rows; between the two it has not been timed."""


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """`fused.attention` for one query per row, q [b, heads, d], against keys and values
    [b, kv_heads, s, d] under the additive `bias` [b, 1, 1, s]; returns [b, heads·d]. By
    `triton_ops.decode_attention` from `OUR_ATTENTION_ROWS` rows on where `triton_ops.usable`,
    else by `sdpa_decode_attention`."""
    if q.shape[0] >= OUR_ATTENTION_ROWS and triton_ops.usable(q):
        return triton_ops.decode_attention(q, keys, values, bias, scale)
    return sdpa_decode_attention(q, keys, values, bias, scale)


def sdpa_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """`decode_attention` by PyTorch's SDPA, one fused kernel that reads each K/V head for its
    group of query heads without repeating it (`enable_gqa`)."""
    b, heads, d = q.shape
    out = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=bias, scale=scale, enable_gqa=heads != keys.shape[1]
    )
    return out.reshape(b, heads * d)


def stored_attention_inputs(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    cache: SlotKV,
    layer: int,
    heads: int,
    norm: triton_ops.RowNorm | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`triton_ops.rotate_and_store` of the packed projections `qkv` (the rest of their
    RMSNorm in `norm`) into `cache`'s `layer`: the rotated queries [b, heads, d] and the first
    `span` keys and values, this step's written among them."""
    keys, values = cache.buffers(layer)
    q = triton_ops.rotate_and_store(qkv, cos, signed_sin, keys, values, cache.where, heads, norm)
    return q, keys[:, :, : cache.span], values[:, :, : cache.span]


def decode_hidden(
    forward: fused.FusedForward,
    weights: PackedWeights | SeparateWeights,
    token: torch.Tensor,
    position: torch.Tensor,
    bias: torch.Tensor,
    cache: SlotKV,
    rotary: torch.Tensor | None,
) -> torch.Tensor:
    """Final-norm hidden states [b, hidden] after one token per row, token and position [b],
    attending under the additive mask `bias` [b, 1, 1, s] to the keys `cache` returns (the
    first s of its positions, this one written among them). `rotary`: `rotary_table`'s
    table to gather the positions' rotations from, or None to compute them."""
    base = forward.model.model
    heads, kv, d, eps = forward.heads, forward.kv_heads, forward.head_dim, forward.eps
    b = token.shape[0]
    h = base.embed_tokens(token)
    if rotary is None:
        cos, signed_sin = rotary_pair(*base.rotary_emb(h, position[:, None]))
    else:
        pair = rotary.index_select(0, position)
        cos, signed_sin = pair[:, :1], pair[:, 1:]  # [b, 1, d]: broadcast over the heads
    kernels = triton_ops.usable(h)
    if weights.folded and not kernels:
        raise RuntimeError("decode weights that hold the RMSNorm gains need the Triton kernels")
    for i, layer in enumerate(forward.layers):
        gain = layer.input_layernorm.weight
        x = h if weights.folded else F.rms_norm(h, (h.shape[-1],), gain, eps)
        qkv = weights.project(i, 0, x)
        if kernels:
            norm = weights.norm(i, 0, h, eps)
            q, keys, values = stored_attention_inputs(qkv, cos, signed_sin, cache, i, heads, norm)
        else:
            qk = qkv[:, : (heads + kv) * d].view(b, heads + kv, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), signed_sin)
            v = qkv[:, (heads + kv) * d :].view(b, kv, d)
            q, (keys, values) = qk[:, :heads], cache.update(i, qk[:, heads:, None], v[:, :, None])
        a = decode_attention(q, keys, values, bias, forward.scale)
        h = residual_linear(h, a, layer.self_attn.o_proj)
        gain = layer.post_attention_layernorm.weight
        x = h if weights.folded else F.rms_norm(h, (h.shape[-1],), gain, eps)
        gate_up = weights.project(i, 1, x)
        if kernels:
            inner = triton_ops.silu_mul(gate_up, weights.norm(i, 1, h, eps))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            inner = F.silu(gate) * up
        h = residual_linear(h, inner, layer.mlp.down_proj)
    cache.length += 1
    return F.rms_norm(h, (h.shape[-1],), base.norm.weight, eps)
