"""The update's attention by FlashAttention-2's variable-length kernel (`models.flash_varlen`,
lever 41): the layout as packed sequences, checked by hand; everything around the kernel
against the masked padded attention on the CPU, with `reference_varlen` (the kernel's
definition in PyTorch) in its place; the kernel itself on a GPU."""

import pytest
import torch

from attention_cases import packed_attention_case, packed_attention_reference
from rlvr.models import flash_varlen, fused, gpu_kernels
from rlvr.models.cpu_kernels import AttentionLayout


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """`flash_varlen.varlen` in PyTorch: per sequence, softmax(q·kᵀ·scale)·v with query i of lq
    seeing keys 0 … lk - lq + i, the K/V heads repeated for their groups of query heads."""
    group = q.shape[1] // k.shape[1]
    lq, lk = cu_q.diff().tolist(), cu_k.diff().tolist()
    assert (max_q, max_k) == (max(lq), max(lk))
    outs = []
    for s in range(len(lq)):
        qs = q[int(cu_q[s]) : int(cu_q[s + 1])]
        ks, vs = (x[int(cu_k[s]) : int(cu_k[s + 1])].repeat_interleave(group, 1) for x in (k, v))
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        seen = torch.arange(lk[s])[None, :] <= torch.arange(lq[s])[:, None] + lk[s] - lq[s]
        probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vs))
    return torch.cat(outs)


def test_the_plan_lays_each_row_out_as_its_visible_prefix_keys_then_its_own_positions():
    """Two prefixes of three keys (the first's key 0 padded); row 0 (prefix 0) computes
    positions 0 and 1, row 1 (prefix 0) none, row 2 (prefix 1) all three. Keys are numbered
    in the prefixes flattened (2 × 3) and then the per-token rows."""
    layout = AttentionLayout(
        torch.tensor([[0, 1, -1], [-1, -1, -1], [2, 3, 4]]),
        torch.ones(3, 3, dtype=torch.long),
        torch.tensor([[0, 1, 1], [1, 1, 1]]),
        torch.tensor([0, 2, 3]),
    )
    plan = layout.varlen
    assert plan.keys.tolist() == [1, 2, 6, 7, 3, 4, 5, 8, 9, 10]
    assert plan.cu_q.tolist() == [0, 2, 5] and plan.cu_k.tolist() == [0, 4, 10]
    assert plan.cu_q.dtype == plan.cu_k.dtype == torch.int32
    assert (plan.max_q, plan.max_k) == (3, 6)
    assert plan.queries.tolist() == [0, 1, 2, 3, 4] and plan.in_order
    shuffled = AttentionLayout(
        torch.tensor([[1, 0, -1], [-1, -1, -1], [4, 2, 3]]), *(
            layout.own_mask, layout.prefix_mask, layout.starts)
    )  # fmt: skip
    assert shuffled.varlen.queries.tolist() == [1, 0, 4, 2, 3] and not shuffled.varlen.in_order
    assert shuffled.varlen.keys.tolist() == [1, 2, 7, 6, 3, 4, 5, 10, 8, 9]


def test_a_computed_position_hidden_from_later_queries_has_no_plan():
    """Causal sequences cannot hide a computed key from the queries after it: no plan, and
    `fused.gpu_attention` runs the Triton kernels instead; nor is there one without queries."""
    _, layout = packed_attention_case(4, 2, 8, 9, 12, hidden_key=True)
    assert layout.varlen is None
    _, visible = packed_attention_case(4, 2, 8, 9, 12, hidden_key=False)
    assert visible.varlen is not None
    nothing = AttentionLayout(*(torch.full((2, 3), value) for value in (-1, 1)), *(
        torch.ones(1, 2), torch.tensor([0, 2])))  # fmt: skip
    assert nothing.varlen is None  # no query: nothing for the kernel to launch


@pytest.mark.parametrize("shuffled", [True, False], ids=["shuffled rows", "rows in order"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "t", "sp"), [(4, 4, 8, 9, 12), (6, 2, 16, 70, 30)]
)
def test_the_varlen_attention_equals_the_masked_padded_attention(
    monkeypatch, heads, kv_heads, dim, t, sp, shuffled
):
    """Outputs and the gradients of q, k, v and the prefixes' keys and values (summed over
    each prefix's rows), with `reference_varlen` as the kernel, against
    `packed_attention_reference`: a row without queries, padded and hidden prefix keys,
    grouped K/V heads, per-token rows shuffled or in order (read in place)."""
    monkeypatch.setattr(flash_varlen, "varlen", reference_varlen)
    inputs, layout = packed_attention_case(heads, kv_heads, dim, t, sp, False, shuffled)
    assert layout.varlen.in_order is not shuffled
    scale = dim**-0.5
    grad = torch.randn(len(inputs[0]), heads, dim, generator=torch.Generator().manual_seed(5))
    runs = []
    for attention in (packed_attention_reference, flash_varlen.attention):
        leaves = [x.clone().requires_grad_() for x in inputs]
        extra = (layout.varlen,) if attention is flash_varlen.attention else ()
        out = attention(*leaves, layout, scale, *extra)
        out.backward(grad)
        runs.append([out.detach(), *(x.grad for x in leaves)])
    for name, got, expected in zip(["out", "q", "k", "v", "pk", "pv"], runs[1], runs[0]):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=name)


def test_gpu_attention_runs_the_varlen_kernel_where_it_may_and_the_triton_one_otherwise(
    monkeypatch,
):
    calls = []
    monkeypatch.setattr(
        flash_varlen, "varlen", lambda *a: calls.append("varlen") or reference_varlen(*a)
    )
    monkeypatch.setattr(gpu_kernels, "attention", lambda *a: calls.append("triton"))
    monkeypatch.setattr(flash_varlen, "usable", lambda q: True)
    for hidden_key in (False, True):
        inputs, layout = packed_attention_case(4, 2, 8, 9, 12, hidden_key)
        fused.gpu_attention(*inputs, layout, 0.3)
    monkeypatch.setattr(flash_varlen, "usable", lambda q: False)
    inputs, layout = packed_attention_case(4, 2, 8, 9, 12, hidden_key=False)
    fused.gpu_attention(*inputs, layout, 0.3)
    assert calls == ["varlen", "triton", "triton"]


def test_the_varlen_kernel_takes_bf16_and_fp16_head_sizes_of_8k_and_can_be_turned_off(
    monkeypatch,
):
    assert flash_varlen.supports(torch.bfloat16, 64) and flash_varlen.supports(torch.float16, 256)
    assert not flash_varlen.supports(torch.float32, 64)  # fp32: the Triton kernels
    assert not flash_varlen.supports(torch.bfloat16, 60)
    assert not flash_varlen.supports(torch.bfloat16, 264)
    assert not flash_varlen.usable(torch.zeros(3, 2, 64, dtype=torch.bfloat16))  # on a CPU
    monkeypatch.setenv("RLVR_FLASH_VARLEN", "0")
    assert not flash_varlen.supports(torch.bfloat16, 64)
    monkeypatch.delenv("RLVR_FLASH_VARLEN")
    monkeypatch.setattr(flash_varlen, "ENABLED", False)
    assert not flash_varlen.supports(torch.bfloat16, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_varlen_kernel_on_a_gpu_gives_the_masked_padded_attention(dtype):
    """PyTorch's FlashAttention-2 kernel through `fused.gpu_attention` (so its causal mask is
    aligned to the bottom right, as `plan` assumes): outputs and gradients against the fp32
    reference on the CPU, to bf16's rounding."""
    inputs, layout = packed_attention_case(14, 2, 64, 300, 130, hidden_key=False)
    scale = 64**-0.5
    exact = [x.clone().requires_grad_() for x in inputs]
    expected = packed_attention_reference(*exact, layout, scale)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5))
    expected.backward(grad)
    placed = [x.detach().to("cuda", dtype).requires_grad_() for x in inputs]
    on_device = AttentionLayout(*(x.cuda() for x in (
        layout.rows, layout.own_mask, layout.prefix_mask, layout.starts)))  # fmt: skip
    assert flash_varlen.usable(placed[0]) and on_device.varlen is not None
    out = fused.gpu_attention(*placed, on_device, scale)
    out.backward(grad.to("cuda", dtype))
    torch.testing.assert_close(out.float().cpu(), expected.detach(), rtol=2e-2, atol=2e-2)
    for name, x, reference in zip(["q", "k", "v", "pk", "pv"], placed, exact, strict=True):
        error = float((x.grad.float().cpu() - reference.grad).norm() / reference.grad.norm())
        assert error < 2e-2, f"{name}: {error:.4f} of the gradient's norm off"
