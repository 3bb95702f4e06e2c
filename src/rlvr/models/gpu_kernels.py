"""Triton kernels for the update on a GPU.

The token statistics (`token_stats`, `logit_grad`): the log-prob of each row's token and its
entropy under softmax(logits / T) in one pass over the logits, and their gradient with respect
to the logits in one more, where PyTorch made about a dozen fp32 passes over each chunk of
[tokens, vocab] logits (`training.logprobs`).

The attention of `cpu_kernels.attention`'s layout (each row's prefix, read in place by all the
rows that share it, then the row's own positions, causal), forward and backward, in the
recomputation scheme of FlashAttention (Dao et al. 2022, Algorithms 1–2; FlashAttention-2,
Dao 2023, Algorithm 2). PyTorch's scaled-dot-product attention, which the GPU otherwise runs
(`fused.TorchOps`), needs the padded [rows, heads, positions, dim] layout and an additive
mask: the queries and keys are scattered into it and the outputs gathered back, each sample
gets its own copy of its prompt's keys (and their gradient is summed back), and every (query,
key) pair of the padded rectangle is computed, masked or not. Here only the computed
positions are read, in place; only the key blocks a query block sees are computed (half of a
causal rectangle, none of the padding); a prompt's keys are read once per sample, never
copied.

Used where `usable` says (`fused.layer_ops` for the padding-free completion forward of the
update and of the log-prob passes, `training.logprobs` for the statistics): Triton is
installed (it comes with PyTorch's CUDA builds) and the tensors are on a GPU, or
`TRITON_INTERPRET=1` was set before Triton was imported, which runs the kernels on a CPU in
Triton's interpreter (how the CPU tests check them, in fp32); `RLVR_GPU_KERNELS=0` turns them
off, with the decode step's (`rollout.triton_ops`). The kernels themselves are in
`_gpu_kernels`, imported at first use.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from types import ModuleType
from typing import NamedTuple

import torch

from rlvr.models.cpu_kernels import AttentionLayout, check_attention

INSTALLED = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (without importing it: a CPU-only install has no use for it)."""


class Tiling(NamedTuple):
    """How an attention kernel is launched: queries and keys per block, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


QUERY_TILINGS = (
    Tiling(64, 64, 4, 3),
    Tiling(128, 64, 4, 3),
    Tiling(128, 64, 8, 3),
    Tiling(128, 32, 4, 3),
    Tiling(64, 32, 4, 4),
    Tiling(128, 128, 8, 2),
    Tiling(64, 128, 8, 3),
)
"""The tilings `attention_queries_kernel` (forward, and dq) is tuned over on a GPU; the first is
the one it runs untuned (under the interpreter, or with `TUNE` off)."""

KEY_TILINGS = (
    Tiling(64, 64, 4, 3),
    Tiling(32, 64, 4, 3),
    Tiling(32, 128, 4, 3),
    Tiling(64, 128, 8, 3),
    Tiling(16, 64, 4, 4),
    Tiling(32, 128, 8, 2),
    Tiling(128, 64, 8, 3),
)
"""The same for `attention_dkv_kernel` (block_m: queries per step of its loop, block_n: keys
per program)."""

TUNE = True
"""On a GPU, time each of `QUERY_TILINGS` / `KEY_TILINGS` at the first call per head size,
group and direction, and keep the fastest (Triton's autotuner; a tiling whose blocks do not fit
the device's shared memory is skipped). The kernels write each output once, so the timed runs
leave the same results."""


DISABLE_ENV = "RLVR_GPU_KERNELS"
"""Set to 0 to keep every Triton kernel (the update's and the decode step's) off."""


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels run for tensors like `x`: on an NVIDIA GPU of compute capability 8.0
    or later (Ampere, Hopper, ...: the attention kernels' blocks take up to 140 KB of shared
    memory at a head size of 256) with Triton installed, or on a CPU under Triton's interpreter
    (`TRITON_INTERPRET=1`, which must be set before Triton is first imported); never with
    `RLVR_GPU_KERNELS=0`."""
    if not INSTALLED or os.environ.get(DISABLE_ENV) == "0":
        return False
    if x.is_cuda:
        return _capability(x.device.index) >= (8, 0)
    return os.environ.get("TRITON_INTERPRET") == "1"


@cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@cache
def kernels() -> ModuleType:
    """`rlvr.models._gpu_kernels`, imported at the first call."""
    return importlib.import_module("rlvr.models._gpu_kernels")


def _block(dim: int) -> int:
    """The power of two, at least 16 (`tl.dot`'s least), that holds `dim` lanes."""
    return max(16, 1 << (dim - 1).bit_length())


class _Launch:
    """What the two attention kernels share: the layout's tensors and every stride, the
    constants, and the grids, which depend on the tiling the launch picks."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, pk: torch.Tensor, layout: AttentionLayout
    ) -> None:
        batch, t = layout.rows.shape
        q_heads, dim = q.shape[1:]
        self.t, self.sp, self.kv_heads = t, pk.shape[2], k.shape[1]
        self.batch, self.q_heads = batch, q_heads
        self.row_prefix = layout.row_prefix  # where backward sums the prefixes' gradients
        self.tuned = TUNE and q.is_cuda
        self.tensors = (
            layout.rows,
            layout.own_mask,
            layout.prefix_mask,
            layout.row_prefix,
            layout.count,
        )
        self.strides = (
            t,
            self.sp,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            *pk.stride()[:3],
            layout.rows.stride(0),
            layout.own_mask.stride(0),
            layout.prefix_mask.stride(0),
        )
        self.constants = dict(
            GROUP=q_heads // self.kv_heads,
            DIM=dim,
            BLOCK_D=_block(dim),
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        )

    def queries(self, *args: object, backward: bool) -> None:
        """`attention_queries_kernel`: one program per (row, block of queries, query head)."""

        def grid(meta: dict) -> tuple[int, int, int]:
            return (self.batch, -(-self.t // meta["BLOCK_M"]), self.q_heads)

        constants = dict(self.constants, BACKWARD=backward)
        self._run("attention_queries_kernel", QUERY_TILINGS, grid, args, constants)

    def keys(self, *args: object) -> None:
        """`attention_dkv_kernel`: one program per (row, block of keys, key/value head), the
        prefix's blocks first."""

        def grid(meta: dict) -> tuple[int, int, int]:
            blocks = -(-self.sp // meta["BLOCK_N"]) + -(-self.t // meta["BLOCK_N"])
            return (self.batch, blocks, self.kv_heads)

        self._run("attention_dkv_kernel", KEY_TILINGS, grid, args, self.constants)

    def _run(self, name: str, tilings: tuple[Tiling, ...], grid, args, constants) -> None:
        if self.tuned:
            _tuned(name, tilings)[grid](*args, **constants)
            return
        m, n, warps, stages = tilings[0]
        getattr(kernels(), name)[grid](
            *args, **constants, BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages
        )


@cache
def _tuned(name: str, tilings: tuple[Tiling, ...]):
    """Kernel `name` of `_gpu_kernels` under Triton's autotuner over `tilings`, keyed by the
    head size, the query group and (for the queries' kernel) the direction: tuned once per
    process and key, whatever the batch's length."""
    import triton

    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)
        for m, n, warps, stages in tilings
    ]
    kernel = getattr(kernels(), name)
    key = [arg for arg in ("DIM", "GROUP", "BACKWARD") if arg in kernel.arg_names]
    return triton.autotune(configs, key=key)(kernel)


ELEMENTS_BLOCK = 1024
"""Elements per program of the element-wise kernels: `swiglu`'s columns, `rotary`'s rows
times its power-of-two head size."""


def _dense_rows(x: torch.Tensor) -> torch.Tensor:
    """x itself where its last axis is dense (the element-wise kernels take the other strides
    as they are), else a dense copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _rotary_pass(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> torch.Tensor:
    """The rotary kernel over x [n, heads, dim] (any token and head strides, the last axis
    dense) with cos, sin [n, dim]: forward or backward, into a dense result."""
    n, heads, dim = x.shape
    rows, block_d = n * heads, _block(dim)
    block_r = max(1, ELEMENTS_BLOCK // block_d)
    out = torch.empty(n, heads, dim, dtype=x.dtype, device=x.device)
    kernels().rotary_kernel[(-(-rows // block_r),)](
        x, cos, sin, out, rows, heads, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
        BACKWARD=backward, DIM=dim, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return out


class _Rotary(torch.autograd.Function):
    """`rotary`, forward and backward each one kernel; keeps only cos and sin."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotary_pass(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotary_pass(_dense_rows(grad), cos, sin, backward=True), None, None


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`fused.rotate(x, cos, sin)` for per-token x [n, heads, dim] and cos, sin [n, 1, dim]
    (one angle per token, shared by its heads), differentiable in x: one kernel each way,
    where PyTorch runs five forward and more backward. x is read in place wherever its last
    axis is dense (the query or key view of `PackedOps.projections`' packed output)."""
    x = _dense_rows(x)
    dim = x.shape[-1]
    cos, sin = cos.reshape(-1, dim).contiguous(), sin.reshape(-1, dim).contiguous()
    return _Rotary.apply(x, cos, sin)


NORM_PROGRAMS = 512
"""Programs of `add_rms_norm`'s backward, each summing its rows' share of the weight's
gradient (a few per multiprocessor of an H100 or H200)."""


class _AddRMSNorm(torch.autograd.Function):
    """`add_rms_norm`: one kernel each way; backward takes the gradients of both outputs."""

    @staticmethod
    def forward(ctx, h, delta, weight, eps):
        width = h.shape[-1]
        rows = h.numel() // width
        h2, delta2 = (_dense_rows(x.reshape(rows, width)) for x in (h, delta))
        total = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        out = torch.empty_like(total)
        rstd = torch.empty(rows, dtype=torch.float32, device=h.device)
        kernels().add_rms_norm_kernel[(rows,)](
            h2, delta2, weight, total, out, rstd, float(eps), width, h2.stride(0),
            delta2.stride(0), BLOCK=1 << (width - 1).bit_length(),
        )  # fmt: skip
        ctx.save_for_backward(total, weight, rstd)
        return total, out

    @staticmethod
    def backward(ctx, grad_total, grad_out):
        total, weight, rstd = ctx.saved_tensors
        width = total.shape[-1]
        rows = total.numel() // width
        grad_out = torch.zeros_like(total) if grad_out is None else grad_out.contiguous()
        residual = grad_total is not None
        programs = max(1, min(rows, NORM_PROGRAMS))
        grad_in = torch.empty_like(total)
        part = torch.empty(programs, width, dtype=torch.float32, device=total.device)
        kernels().add_rms_norm_backward_kernel[(programs,)](
            total, weight, rstd, grad_total.contiguous() if residual else total, grad_out,
            grad_in, part, rows, width, RESIDUAL=residual, BLOCK=1 << (width - 1).bit_length(),
        )  # fmt: skip
        grad_weight = part.sum(0).to(weight.dtype) if ctx.needs_input_grad[2] else None
        return grad_in, grad_in, grad_weight, None


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused.TorchOps.add_rms_norm`: the residual stream h + delta and its RMSNorm times
    `weight`, differentiable in all three: one kernel each way, where PyTorch runs the
    addition and the norm apart forward and, backward, the norm's two kernels and the
    addition of the stream's two gradients (the norm's and the next residual's)."""
    return _AddRMSNorm.apply(h, delta, weight, eps)


def _swiglu_pass(
    gate: torch.Tensor,
    up: torch.Tensor,
    grad: torch.Tensor | None,
    into: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The SwiGLU kernel over gate, up [rows, width] (unit column stride): silu(gate)·up, or
    with `grad` the gradients of gate and up, dense, or with `into` [rows, 2·width] written
    into its two halves."""
    rows, width = gate.shape
    if into is not None:
        outs = (into[:, :width], into[:, width:])
    else:
        outs = tuple(gate.new_empty(rows, width) for _ in range(1 if grad is None else 2))
    kernels().swiglu_kernel[(rows, -(-width // ELEMENTS_BLOCK))](
        gate, up, outs[0] if grad is None else grad, outs[0], outs[0], outs[-1], width,
        gate.stride(0), up.stride(0), outs[0].stride(0),
        BACKWARD=grad is not None, BLOCK=ELEMENTS_BLOCK,
    )  # fmt: skip
    return outs


class _SwiGLU(torch.autograd.Function):
    """`swiglu`, forward and backward each one kernel; keeps gate and up, not silu(gate)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _swiglu_pass(gate, up, None)[0]

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        return _swiglu_pass(gate, up, grad.contiguous())


class _PackedSwiGLU(torch.autograd.Function):
    """`swiglu_packed`: the same kernels over the two halves of one tensor, whose gradient
    backward writes whole; keeps that tensor."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return _swiglu_pass(*gate_up.chunk(2, dim=-1), None)[0]

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        into = torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)
        _swiglu_pass(*gate_up.chunk(2, dim=-1), grad.contiguous(), into)
        return into


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate)·up (`fused.TorchOps.silu_mul`) over the last axis, differentiable: one kernel
    each way, where PyTorch runs two forward and three backward and keeps silu(gate) as well.
    Rows are read in place wherever the columns are dense (the two halves of a packed gate/up
    projection, `triton_ops.silu_mul`); the result is dense."""
    if gate.shape != up.shape:
        raise ValueError(f"gpu_kernels.swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)}")
    width = gate.shape[-1]
    rows = [_dense_rows(x.reshape(-1, width)) for x in (gate, up)]  # views where they can be
    return _SwiGLU.apply(*rows).view(gate.shape)


def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """`swiglu` of the two halves of `gate_up`'s last axis (gate, then up: the output of one
    packed gate/up matmul), its gradient one dense tensor like `gate_up` (lever 51). Split
    into two views before `swiglu`, autograd would join the halves' gradients with a copy:
    at the 0.5B shape 2 GB of traffic per layer and 64k-token micro-batch."""
    width = gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"gpu_kernels.swiglu_packed: an odd last axis {tuple(gate_up.shape)}")
    out = _PackedSwiGLU.apply(_dense_rows(gate_up.reshape(-1, width)))
    return out.view(*gate_up.shape[:-1], width // 2)


class _PackedAttention(torch.autograd.Function):
    """`attention`: the queries' kernel forward; backward, the same kernel for the queries'
    gradient and one for the keys' and values'."""

    @staticmethod
    def forward(ctx, q, k, v, pk, pv, layout, scale):
        launch = _Launch(q, k, pk, layout)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        launch.queries(
            q, k, v, pk, pv, *launch.tensors, lse, lse, q, q, out, *launch.strides,
            lse.stride(0), scale, backward=False,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, pk, pv, out, lse)
        ctx.launch, ctx.scale = launch, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, pk, pv, out, lse = ctx.saved_tensors
        launch, scale = ctx.launch, ctx.scale
        grad = grad.contiguous()
        delta = torch.empty_like(lse)  # Σ grad·out per query, written by the dq kernel
        dq = torch.empty_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        parts = torch.zeros(2, launch.batch, launch.kv_heads, launch.sp, q.shape[2],
                            dtype=torch.float32, device=q.device)  # fmt: skip
        common = (*launch.tensors, lse, delta, grad)
        launch.queries(
            q, k, v, pk, pv, *common, out, dq, *launch.strides, lse.stride(0), scale,
            backward=True,
        )  # fmt: skip
        launch.keys(
            q, k, v, pk, pv, *common, dk, dv, parts[0], parts[1], *launch.strides,
            lse.stride(0), parts.stride(1), parts.stride(2), scale,
        )  # fmt: skip
        summed = torch.zeros(2, *pk.shape, dtype=torch.float32, device=q.device)
        summed.index_add_(1, launch.row_prefix, parts)
        return dq, dk, dv, summed[0].to(pk.dtype), summed[1].to(pv.dtype), None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
) -> torch.Tensor:
    """`cpu_kernels.attention` (same arguments, same result) by the Triton kernels: on a GPU in
    any floating dtype, the arithmetic in fp32 and the matmuls' inputs in the tensors' dtype.

    q [n, q_heads, dim], k, v [n, kv_heads, dim]: per computed position (`layout.rows`);
    prefix_k, prefix_v [prefixes, kv_heads, sp, dim] with the same strides, the last axis
    dense. Returns [n, q_heads, dim]."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    check_attention(q, k, v, prefix_k, prefix_v, layout, "gpu_kernels")
    return _PackedAttention.apply(q, k, v, prefix_k, prefix_v, layout, scale)


VOCAB_BLOCK = 4096
"""Logits per block of the token-statistics kernels."""


def token_stats(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    logp: torch.Tensor,
    entropy: torch.Tensor | None,
    lse: torch.Tensor,
) -> None:
    """Write, for each row of logits [rows, vocab] (any float dtype, last axis dense) with
    z = logits / T: log p[token] = z[token] - logsumexp(z) into logp [rows], logsumexp(z) into
    lse [rows] and, unless None, the entropy -Σ p·log p into entropy [rows] (all fp32),
    reading the logits once (`training.logprobs`' statistics in one kernel). The token ids
    must be in the vocabulary (`check_token_ids`); one that is not reads no logit."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, vocab = logits.shape
    kernels().token_stats_kernel[(rows,)](
        logits, tokens, logp, logp if entropy is None else entropy, lse, vocab,
        logits.stride(0), 1.0 / temperature, WITH_ENTROPY=entropy is not None,
        BLOCK=VOCAB_BLOCK, num_warps=8,
    )  # fmt: skip


def check_token_ids(tokens: torch.Tensor, vocab: int) -> None:
    """Raise ValueError, naming the range, when a token id is outside [0, vocab): one read of
    the ids' smallest and largest to the host, once per call of `training.logprobs`' autograd
    functions rather than per chunk, since it waits for the GPU."""
    low, high = (int(x) for x in torch.aminmax(tokens)) if tokens.numel() else (0, 0)
    if low < 0 or high >= vocab:
        raise ValueError(
            f"gpu_kernels: token ids from {low} to {high}, outside the vocabulary of {vocab} logits"
        )


def logit_grad(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    g_logp: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """d loss / d logits [rows, vocab] in `dtype` from `token_stats`' lse (and entropy) and the
    upstream gradients of the log-probs and entropies (None when unused), each element read
    and written once (`training.logprobs._logit_grad` in one kernel)."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab, dtype=dtype, device=logits.device)
    k = kernels()
    k.logit_grad_kernel[(rows, -(-vocab // VOCAB_BLOCK))](
        logits, tokens, lse, lse if entropy is None else entropy,
        lse if g_logp is None else g_logp, lse if g_entropy is None else g_entropy, out, vocab,
        logits.stride(0), out.stride(0), 1.0 / temperature, HAS_LOGP=g_logp is not None,
        HAS_ENTROPY=g_entropy is not None, BLOCK=VOCAB_BLOCK, num_warps=8,
    )  # fmt: skip
    return out
