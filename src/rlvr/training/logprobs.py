"""Token log-probs and entropies, a chunk of rows at a time, from the logits or straight from
the last hidden states and the LM head.

With z = logits / T (DESIGN rule 1: the temperature divides the logits first), p = softmax(z)
and log p = z - logsumexp(z), each position gives log p[y] for its token y and the entropy
H = -Σ p · log p. Both have a gradient:

    d log p[y] / dz = onehot(y) - p
    d H / dz        = -p · (log p + H)

(the second from dp_i / dz_j = p_i (δ_ij - p_j)). Two autograd functions share that backward
(`_logit_grad`) and keep no fp32 copy of a chunk for it (DESIGN rule 7):

- `_ChunkedLogprobs` reads logits that already exist ([n, vocab], kept for backward);
- `_LinearLogprobs` takes the hidden states and the LM head and never holds the [n, vocab]
  logits: each chunk's logits are made, used and dropped in forward, and made again in
  backward, where the chunk's logit gradient goes straight into the hidden states' and the
  head's gradients. It pays one more LM-head matmul for not keeping the logits and their
  gradient (2 · n · vocab values), the way fused linear cross-entropy kernels do for SFT
  (Liger-Kernel, Hsu et al. 2024, arXiv:2410.10989).

On a GPU the statistics of a chunk are one Triton kernel (`gpu_kernels.token_stats`, one read
of the logits, which also keeps each row's log-sum-exp for backward) and its logit gradient
another (`gpu_kernels.logit_grad`, one read and one write in the logits' dtype); elsewhere
PyTorch computes them in fp32.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from rlvr.models import gpu_kernels
from rlvr.rollout.sampling import scale

CHUNK_ELEMENTS = 1 << 26
"""Logits per chunk of `linear_token_stats` on a CPU: 64M values, 256 MB in fp32, whatever the
vocabulary. Larger chunks amortise the head gradient's read-modify-write of [vocab, hidden]
per chunk."""
GPU_CHUNK_ELEMENTS = 1 << 28
"""Logits per chunk on a GPU: 256M values. At the Qwen2.5-0.5B shape a 64M-logit chunk is 441
rows, and each chunk's head gradient added into the fp32 [vocab, hidden] sum moves 1.4 GB;
256M-logit chunks made the 0.5b's GRPO mini-batch 1.05–1.08× faster on an H200 for 9 % more
peak memory (`benchmarks/gpu_ab.py --parts chunks`, docs/benchmarks.md)."""


def default_chunk_elements(device: torch.device) -> int:
    """`GPU_CHUNK_ELEMENTS` on a CUDA device, else `CHUNK_ELEMENTS` (each read at each call)."""
    return GPU_CHUNK_ELEMENTS if device.type == "cuda" else CHUNK_ELEMENTS


def _logit_grad(
    logits: torch.Tensor,
    rows: slice,
    tokens: torch.Tensor,
    entropy: torch.Tensor,
    lse: torch.Tensor,
    g_logp: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """d loss / d logits [c, vocab] in `dtype` of the chunk `rows`, from its logits, its tokens
    and entropies and the upstream gradients of the log-probs and entropies (None when
    unused): (g_logp · (onehot(y) - p) - g_entropy · p · (log p + H)) / T. Where the forward
    kept the log-sum-exps (`lse` not empty: on a GPU), by one Triton kernel
    (`gpu_kernels.logit_grad`); else by PyTorch, in fp32."""
    if lse.numel():
        return gpu_kernels.logit_grad(
            logits, tokens[rows], lse[rows], entropy[rows] if g_entropy is not None else None,
            None if g_logp is None else g_logp[rows],
            None if g_entropy is None else g_entropy[rows], temperature, dtype,
        )  # fmt: skip
    z = scale(logits, temperature)
    g = torch.zeros_like(entropy[rows]) if g_logp is None else g_logp[rows]
    g = (g / temperature)[:, None]
    if g_entropy is None:
        grad = F.softmax(z, -1, dtype=torch.float32).mul_(-g)
    else:
        logp = F.log_softmax(z, -1, dtype=torch.float32)
        p = logp.exp()
        weight = logp.add_(entropy[rows, None]).mul_((g_entropy[rows] / temperature)[:, None])
        grad = weight.add_(g).mul_(p).neg_()
    return grad.scatter_add_(-1, tokens[rows, None], g).to(dtype)


def _stats_into(
    out: torch.Tensor,
    entropy: torch.Tensor,
    lse: torch.Tensor,
    rows: slice,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
) -> None:
    """Write log p[token] (and H, when `entropy` is not empty) of the chunk `rows` of
    softmax(logits / T); where `lse` is not empty (on a GPU), by one Triton kernel
    (`gpu_kernels.token_stats`), which also writes the log-sum-exps there for backward."""
    if lse.numel():
        chunk_entropy = entropy[rows] if entropy.numel() else None
        gpu_kernels.token_stats(
            logits, tokens[rows], temperature, out[rows], chunk_entropy, lse[rows]
        )
        return
    z = scale(logits, temperature)
    logp = F.log_softmax(z, -1, dtype=torch.float32)
    out[rows] = logp.gather(-1, tokens[rows, None]).squeeze(-1)
    if entropy.numel():
        entropy[rows] = -torch.linalg.vecdot(logp.exp(), logp)


def _outputs(
    x: torch.Tensor, tokens: torch.Tensor, vocab: int, with_entropy: bool, check: bool = True
) -> tuple[torch.Tensor, ...]:
    """The fp32 log-probs [n], entropies ([n], or empty without `with_entropy`) and, where the
    Triton kernels run (`gpu_kernels.usable`: on a GPU), log-sum-exps [n] (else empty) of the
    n rows of x. The kernels' path checks the token ids here, once, unless `check` is off
    because the caller checked them on the host (PyTorch's gather checks them on the
    other)."""
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    entropy = torch.empty_like(out) if with_entropy else out.new_empty(0)
    if not gpu_kernels.usable(x):
        return out, entropy, out.new_empty(0)
    if check:
        gpu_kernels.check_token_ids(tokens, vocab)
    return out, entropy, torch.empty_like(out)


class _ChunkedLogprobs(torch.autograd.Function):
    """log softmax(x / T)[token] and the entropy of softmax(x / T), per row of the logits
    x [n, vocab], `chunk` rows at a time.

    Forward keeps x (already alive), the tokens and the entropies; backward recomputes each
    chunk's softmax (`_logit_grad`). Autograd through `logsumexp` would instead keep an fp32
    copy of every chunk, together a full [tokens, vocab] fp32 tensor (DESIGN rule 7).
    """

    @staticmethod
    def forward(ctx, x, tokens, temperature, chunk, with_entropy):
        out, entropy, lse = _outputs(x, tokens, x.shape[-1], with_entropy)
        for i in range(0, x.shape[0], chunk):
            rows = slice(i, i + chunk)
            _stats_into(out, entropy, lse, rows, x[rows], tokens, temperature)
        ctx.save_for_backward(x, tokens, entropy, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        return out, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        x, tokens, entropy, lse = ctx.saved_tensors
        t = ctx.temperature
        grad_x = torch.empty_like(x)
        for i in range(0, x.shape[0], ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            grad_x[rows] = _logit_grad(
                x[rows], rows, tokens, entropy, lse, g_logp, g_entropy, t, x.dtype
            )
        return grad_x, None, None, None, None


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """total + a @ b for an fp32 `total` (the head gradient's sum over chunks). fp32 a, b: in
    place. bf16/fp16 a, b on a GPU where PyTorch's matmul can write fp32 itself
    (`fp32_output_matmul`): one cuBLAS call that accumulates in fp32 and adds `total`, instead
    of writing the product in a, b's dtype and adding that to `total` (at the 0.5B's
    [152k, 896] head, 1.6 GB of memory traffic per chunk become 1.1 GB, and the product is
    not rounded to bf16 first). Written into `total` itself where that form runs
    (`fp32_output_in_place`): a new output would first get a copy of `total`, 545 MB at that
    head, once per chunk. Elsewhere the product is added."""
    if a.dtype == torch.float32:
        return total.addmm_(a, b)
    if fp32_output_in_place(a.device, a.dtype):
        return torch.addmm(total, a, b, out_dtype=torch.float32, out=total)
    if fp32_output_matmul(a.device, a.dtype):
        return torch.addmm(total, a, b, out_dtype=torch.float32)
    return total.add_(a @ b)


def _fp32_output_probe(device: torch.device, dtype: torch.dtype, in_place: bool) -> bool:
    """Whether c + aᵀ·b by `torch.addmm(c, aᵀ, b, out_dtype=torch.float32)` for `dtype` a, b
    on `device` gives the fp32 result, written into c itself with `in_place` (``out=c``), on
    small matrices; False where PyTorch refuses the call."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(shape, generator=g) for shape in ((24, 16), (24, 8), (16, 8)))
    low = [x.to(device, dtype) for x in (a, b)]
    total = c.to(device)
    try:
        if in_place:
            out = torch.addmm(total, low[0].T, low[1], out_dtype=torch.float32, out=total)
        else:
            out = torch.addmm(total, low[0].T, low[1], out_dtype=torch.float32)
    except (RuntimeError, TypeError):
        return False
    expected = c + low[0].float().cpu().T @ low[1].float().cpu()
    written = out.data_ptr() == total.data_ptr() if in_place else torch.equal(total.cpu(), c)
    right = out.dtype == torch.float32 and torch.allclose(out.cpu(), expected, atol=1e-3)
    return written and right


@cache
def fp32_output_matmul(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch.addmm(..., out_dtype=torch.float32)` runs for `dtype` inputs on `device`
    (CUDA, PyTorch ≥ 2.8) and gives the fp32 product of a transposed operand: tried once per
    device and dtype on small matrices."""
    return device.type == "cuda" and _fp32_output_probe(device, dtype, in_place=False)


@cache
def fp32_output_in_place(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether that matmul also runs with its fp32 input as its output (``out=``), so that
    cuBLAS adds the input in place instead of PyTorch copying it into a new output first."""
    return fp32_output_matmul(device, dtype) and _fp32_output_probe(device, dtype, True)


class _LinearLogprobs(torch.autograd.Function):
    """`_ChunkedLogprobs` of the logits F.linear(hidden, weight, bias), `chunk` rows at a time,
    without the [n, vocab] logits: forward keeps the hidden states, the tokens and the
    entropies; backward makes each chunk's logits again and sends their gradient dz through
    the head: hidden dz @ W, weight Σ dzᵀ @ h (summed over the chunks in fp32), bias Σ dz."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk, with_entropy, check):
        out, entropy, lse = _outputs(hidden, tokens, weight.shape[0], with_entropy, check)
        for i in range(0, hidden.shape[0], chunk):
            rows = slice(i, i + chunk)
            logits = F.linear(hidden[rows], weight, bias)
            _stats_into(out, entropy, lse, rows, logits, tokens, temperature)
        ctx.save_for_backward(hidden, weight, bias, tokens, entropy, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        return out, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, bias, tokens, entropy, lse = ctx.saved_tensors
        t = ctx.temperature
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        for i in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            h = hidden[rows]
            logits = F.linear(h, weight, bias)
            dz = _logit_grad(logits, rows, tokens, entropy, lse, g_logp, g_entropy, t, h.dtype)
            if need_hidden:
                grad_hidden[rows] = dz @ weight
            if need_weight:
                grad_weight = _add_product(grad_weight, dz.T, h)
            if need_bias:
                grad_bias += dz.sum(0)
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T)[token] in fp32 and, from the same pass over the logits, the
    entropy of softmax(logits / T) per position, both differentiable, `chunk_size` rows at a
    time (`_ChunkedLogprobs`). Without `with_entropy` the second tensor is empty."""
    flat_logits, flat_tokens = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)
    logp, entropy = _ChunkedLogprobs.apply(
        flat_logits, flat_tokens, temperature, chunk_size, with_entropy
    )
    return logp.reshape(tokens.shape), entropy.reshape(tokens.shape if with_entropy else (0,))


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096
) -> torch.Tensor:
    """log softmax(logits / temperature)[token] in fp32, computed `chunk_size` rows at a time;
    for backward only the logits are kept (`_ChunkedLogprobs`)."""
    return token_logprobs_and_entropy(logits, tokens, temperature, chunk_size, False)[0]


def linear_token_stats(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int | None = None,
    host_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs_and_entropy(head(hidden), tokens, temperature)` for hidden [n, d] and
    tokens [n], without the [n, vocab] logits (`_LinearLogprobs`): at most `chunk_elements`
    (default `default_chunk_elements` of hidden's device) logits exist at a time, in forward
    and in backward. `host_tokens`: the same ids on the CPU, whose range is checked there
    (`gpu_kernels.check_token_ids`) instead of reading the GPU's back (lever 54)."""
    chunk_elements = chunk_elements or default_chunk_elements(hidden.device)
    chunk = max(1, chunk_elements // head.out_features)
    if host_tokens is not None:
        gpu_kernels.check_token_ids(host_tokens, head.out_features)
    return _LinearLogprobs.apply(
        hidden, head.weight, head.bias, tokens, temperature, chunk, with_entropy,
        host_tokens is None,
    )  # fmt: skip
