"""Checks of `rlvr.rollout.triton_ops` under Triton's interpreter, on a CPU in fp32. Run by
`test_cuda_graphs.test_the_triton_kernels_under_the_interpreter` in a process of its own with
`TRITON_INTERPRET=1` (set before Triton is imported), not collected by the suite itself. The
`check_*` functions take a device and a dtype: `test_cuda_graphs` runs them on a GPU in bf16
and fp32, where the kernels are compiled."""

import os

import pytest
import torch
import torch.nn.functional as F

from attention_cases import packed_attention_case, packed_attention_reference
from batches import token_batch
from rlvr.config import resolve_config
from rlvr.models import flash_varlen, fused, gpu_kernels
from rlvr.models.cpu_kernels import AttentionLayout
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout import graph_step, graphs, triton_ops
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.graphs import GraphState
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.sampling import ban_bias, below, sample_tokens
from rlvr.training import logprobs, update
from rlvr.training.update import LossSettings
from test_flash_varlen import reference_varlen
from test_fused_forward import MODELS, logprobs_and_grads, ragged_batch, ragged_samples

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"
)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to one rounding to `actual`'s dtype (the kernels round once, from fp32)."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(actual.float(), expected.float(), rtol=8e-3, atol=1e-2)


def close_gradient(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """A gradient of fp32 autograd's to 1e-4 in fp32; in bf16 to 3 % in norm, since element by
    element bf16 logits move single entries of a sum over the vocabulary by more than any
    fixed tolerance (PyTorch's own bf16 path is 0.9–1.4 % off in norm in
    `check_token_stats`, and an entry 0.15 off at T = 0.7)."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=1e-4)
    else:
        error = float((actual.float().cpu() - expected).norm() / expected.norm())
        assert error < 3e-2, f"{error:.4f} of the gradient's norm off"


def row_norm(rows: int, width: int, hidden: int, device: str, dtype, bias: bool):
    """A `triton_ops.RowNorm` over random hidden states of a width that is not a power of
    two (the masked lanes), and the row scales and bias it stands for, in fp32."""
    g = torch.Generator().manual_seed(5)
    h = (torch.randn(rows, hidden, generator=g) * torch.rand(rows, 1, generator=g) * 3).to(
        device, dtype
    )
    b = torch.randn(width, generator=g).to(device, dtype) if bias else None
    norm = triton_ops.RowNorm(h, 1e-5, b)
    scale = torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    return norm, scale, (torch.zeros(width) if b is None else b.float())


def check_rotate_and_store(
    heads: int, kv_heads: int, dim: int, device: str, dtype, normed: str = "no norm"
) -> None:
    """Queries out, keys and values at the column `where` of the first b rows, nothing else
    written (a head size that is not a power of two: the kernel's masked lanes). `normed`:
    "no norm", or "norm" / "norm and bias" for a `RowNorm`: each row of qkv scaled by its
    rsqrt(mean(h²) + ε) and the bias added before the rotation."""
    g = torch.Generator().manual_seed(0)
    b, rows, capacity, column = 5, 8, 10, 7
    qkv = torch.randn(b, (heads + 2 * kv_heads) * dim, generator=g).to(device, dtype)
    cos, sin = (torch.randn(b, 1, dim, generator=g).to(device, dtype) for _ in range(2))
    kv = torch.zeros(2, rows, kv_heads, capacity, dim, device=device, dtype=dtype)
    keys, values = kv[0, :b], kv[1, :b]
    where = torch.tensor([column], device=device)
    norm, exact = None, qkv.float()
    if normed != "no norm":
        norm, scale, bias = row_norm(b, qkv.shape[1], 100, device, dtype, normed != "norm")
        exact = exact * scale + bias.to(device)
    q = triton_ops.rotate_and_store(
        qkv, *graph_step.rotary_pair(cos, sin), keys, values, where, heads, norm
    )
    split = exact.view(b, heads + 2 * kv_heads, dim)
    cos, sin = cos.float(), sin.float()
    close(q, fused.rotate(split[:, :heads], cos, sin))
    close(kv[0, :b, :, column], fused.rotate(split[:, heads : heads + kv_heads], cos, sin))
    if norm is None:
        assert torch.equal(kv[1, :b, :, column].float(), split[:, heads + kv_heads :])
    else:
        close(kv[1, :b, :, column], split[:, heads + kv_heads :])
    written = torch.zeros_like(kv, dtype=torch.bool)
    written[:, :b, :, column] = True
    assert not kv[~written].any()


def check_silu_mul(device: str, dtype, normed: str = "no norm") -> None:
    """silu(gate)·up over 1,500 columns (two blocks, the second partial); `normed` as for
    `check_rotate_and_store`, gate and up each scaled (and biased) before the SiLU."""
    gate_up = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(1))
    gate_up = gate_up.to(device, dtype)
    norm, exact = None, gate_up.float()
    if normed != "no norm":
        norm, scale, bias = row_norm(3, 2 * 1500, 100, device, dtype, normed != "norm")
        exact = exact * scale + bias.to(device)
    close(triton_ops.silu_mul(gate_up, norm), F.silu(exact[:, :1500]) * exact[:, 1500:])


def check_decode_attention(
    heads: int, kv_heads: int, dim: int, span: int, splits: int | None, device: str, dtype
) -> None:
    """`triton_ops.decode_attention` against `graph_step.sdpa_decode_attention`:
    keys and values read as the first `span` positions of a larger cache (its strides), a
    span that is no multiple of the key block, rows with hidden keys (one whose whole first
    split is hidden, one that sees its last key only), one split or several."""
    g = torch.Generator().manual_seed(6)
    b, capacity = 4, span + 40
    q = torch.randn(b, heads, dim, generator=g).to(device, dtype)
    kv = torch.randn(2, b, kv_heads, capacity, dim, generator=g).to(device, dtype)
    keys, values = kv[0, :, :, :span], kv[1, :, :, :span]
    visible = torch.rand(b, span, generator=g) < 0.7
    visible[1, :70] = False
    visible[2, :] = False
    visible[:, span - 1] = True
    bias = fused.additive_bias(visible[:, None, :].to(device), dtype)
    got = triton_ops.decode_attention(q, keys, values, bias, 0.3, splits)
    expected = graph_step.sdpa_decode_attention(
        q.float(), keys.float(), values.float(), bias.float(), 0.3
    )
    close(got, expected)


def check_sample(temperature: float, block: int, banned: bool, device: str, dtype) -> None:
    """Rows of 2,500 logits in chunks of 512 or 1,024 (the last one partial) or in one chunk
    of 4,096 (the default): the same tokens as `sample_tokens`' PyTorch path and the same
    log-probs. Banned tokens, made the likeliest (but in row 0, where an allowed token beats
    them in their chunk) and filling the last chunk, are never drawn; a uniform just below 1
    draws the last token of nonzero probability."""
    g = torch.Generator().manual_seed(2)
    rows, vocab = 48, 2500
    logits = torch.randn(rows, vocab, generator=g) * 3
    uniform = torch.rand(rows, generator=g)
    banned_ids = torch.tensor([5, 17, *range(2048, vocab)])
    last = 2047 if banned else vocab - 1
    logits[-4:, last] = 12.0  # a wide last interval, so that rounding cannot move the draw
    uniform[-4:] = below(torch.ones(4))
    if banned:
        logits[:, banned_ids] = 10.0
        logits[0, 6] = 14.0
    logits, uniform = logits.to(device, dtype), uniform.to(device)
    ban = ban_bias(vocab, banned_ids.to(device)) if banned else None
    tokens, logps = triton_ops.sample(logits, temperature, uniform, ban, block)
    usable, triton_ops.usable = triton_ops.usable, lambda x: False
    try:
        params = SamplingParams(temperature=temperature)
        expected, expected_logps = sample_tokens(logits, params, uniform, ban)
    finally:
        triton_ops.usable = usable
    assert tokens.tolist() == expected.tolist()
    torch.testing.assert_close(logps, expected_logps, rtol=0, atol=1e-5)
    assert (tokens[-4:] == last).all()
    assert not (banned and torch.isin(tokens, banned_ids.to(device)).any())


def test_rlvr_gpu_kernels_0_turns_every_triton_kernel_off(monkeypatch):
    """With `RLVR_GPU_KERNELS=0` neither the update nor the decode step uses a Triton kernel:
    the padding-free forward gets PyTorch's operations, and so do the token statistics."""
    x = torch.zeros(2, 3)
    key_mask, flat = torch.ones(2, 5, dtype=torch.long), torch.tensor([0, 1, 3])
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    assert gpu_kernels.usable(x) and triton_ops.usable(x)
    assert type(fused.layer_ops(x, key_mask, 2, flat)) is fused.PackedOps
    monkeypatch.setenv("RLVR_GPU_KERNELS", "0")
    assert not gpu_kernels.usable(x) and not triton_ops.usable(x)
    assert type(fused.layer_ops(x, key_mask, 2, flat)) is fused.TorchOps
    tokens = torch.zeros(2, dtype=torch.long)
    assert logprobs._outputs(x, tokens, 3, True)[2].numel() == 0  # no log-sum-exps: PyTorch's


def check_packed_attention(heads, kv_heads, dim, t, sp, device: str, dtype) -> None:
    """`gpu_kernels.attention`'s outputs and the gradients of q, k, v and the prefixes' keys and
    values against `packed_attention_reference` in fp32 on the CPU."""
    inputs, layout = packed_attention_case(heads, kv_heads, dim, t, sp)
    scale = dim**-0.5
    exact = [x.clone().requires_grad_() for x in inputs]
    expected = packed_attention_reference(*exact, layout, scale)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5))
    expected.backward(grad)
    placed = [x.detach().to(device, dtype).requires_grad_() for x in inputs]
    on_device = AttentionLayout(*(x.to(device) for x in (
        layout.rows, layout.own_mask, layout.prefix_mask, layout.starts)))  # fmt: skip
    out = gpu_kernels.attention(*placed, on_device, scale)
    out.backward(grad.to(device, dtype))
    tolerance = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float().cpu(), expected.detach(), **tolerance)
    for name, x, reference in zip(["q", "k", "v", "pk", "pv"], placed, exact, strict=True):
        torch.testing.assert_close(x.grad.float().cpu(), reference.grad, **tolerance, msg=name)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "t", "sp"), [(4, 4, 16, 9, 12), (6, 2, 24, 150, 70)]
)
def test_packed_attention_matches_the_masked_padded_attention(heads, kv_heads, dim, t, sp):
    check_packed_attention(heads, kv_heads, dim, t, sp, "cpu", torch.float32)


@pytest.mark.parametrize(
    ("queries", "keys"),
    list(zip(gpu_kernels.QUERY_TILINGS[1:], gpu_kernels.KEY_TILINGS[1:], strict=True)),
    ids=lambda t: f"{t.block_m}x{t.block_n}",
)
def test_every_tiling_the_gpu_may_pick_computes_the_same_attention(monkeypatch, queries, keys):
    """Each block shape the autotuner may choose on a GPU (`QUERY_TILINGS`, `KEY_TILINGS`; the
    interpreter runs the first of each, as an untuned launch does): 300 positions and 140
    prefix keys, so several blocks of 128 and partial ones."""
    monkeypatch.setattr(gpu_kernels, "QUERY_TILINGS", (queries,))
    monkeypatch.setattr(gpu_kernels, "KEY_TILINGS", (keys,))
    check_packed_attention(4, 2, 16, 300, 140, "cpu", torch.float32)


@pytest.mark.parametrize("varlen", [False, True], ids=["Triton attention", "varlen attention"])
@pytest.mark.parametrize("name", MODELS)
def test_the_padding_free_forward_with_packed_attention_equals_the_transformers_one(
    monkeypatch, name, varlen
):
    """The update's shared-prefix forward (Llama, and Qwen2 with GQA), its completions through
    `fused.PackedOps`: the log-probs and every parameter's gradient of the `transformers`
    forward (`test_fused_forward`'s check, with the C kernels off); its attention by the
    Triton kernels, or by `flash_varlen` with `reference_varlen` as the kernel (lever 41)."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    if varlen:
        monkeypatch.setattr(flash_varlen, "usable", lambda q: True)
        monkeypatch.setattr(flash_varlen, "varlen", reference_varlen)
        monkeypatch.setattr(gpu_kernels, "attention", None)  # not called
    calls = []
    run = fused.PackedOps.attention_kernel
    monkeypatch.setattr(
        fused.PackedOps, "attention_kernel", staticmethod(lambda *a: calls.append(1) or run(*a))
    )
    tok = build_tiny_tokenizer()
    model = MODELS[name](tok)
    mb = ragged_batch(tok)
    expected_lp, expected_grads = logprobs_and_grads(model, mb, enabled=False)
    lp, grads = logprobs_and_grads(model, mb, enabled=True)
    torch.testing.assert_close(lp, expected_lp, rtol=0, atol=1e-5)
    for param_name, expected in expected_grads.items():
        torch.testing.assert_close(grads[param_name], expected, rtol=0, atol=1e-5, msg=param_name)
    assert len(calls) == model.config.num_hidden_layers  # the completions' pass, every layer


def check_token_stats(temperature: float, uses: str, device: str, dtype) -> None:
    """`logprobs.token_logprobs_and_entropy` (chunks of 16 rows) and `linear_token_stats` (an LM
    head with a bias), run by `gpu_kernels.token_stats` and `logit_grad` on 37 rows of 5,000
    logits (two blocks, the second partial): the log-probs, the entropies and the gradients
    of a loss that `uses` the log-probs, the entropies or both, against autograd through
    log_softmax in fp32."""
    g = torch.Generator().manual_seed(6)
    rows, vocab, width = 37, 5000, 24
    hidden = torch.randn(rows, width, generator=g)
    head = torch.nn.Linear(width, vocab)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=g) * 0.6)
        head.bias.copy_(torch.randn(vocab, generator=g))
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    weights = torch.randn(2, rows, generator=g)

    def loss(logp: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        terms = {"logp": [logp], "entropy": [entropy], "both": [logp, entropy]}[uses]
        return sum((x * w.to(x.device)).sum() for x, w in zip(terms, weights, strict=False))

    exact = [x.detach().clone().requires_grad_() for x in (hidden, head.weight, head.bias)]
    z = F.linear(*exact).div(temperature)
    all_logp = z.log_softmax(-1)
    expected_logp = all_logp.gather(-1, tokens[:, None]).squeeze(-1)
    expected_entropy = -(all_logp.exp() * all_logp).sum(-1)
    loss(expected_logp, expected_entropy).backward()
    tolerance = dict(rtol=0, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)

    placed_head = torch.nn.Linear(width, vocab, device=device, dtype=dtype)
    with torch.no_grad():
        placed_head.weight.copy_(head.weight)
        placed_head.bias.copy_(head.bias)
    placed_hidden = hidden.to(device, dtype).requires_grad_()
    logp, entropy = logprobs.linear_token_stats(
        placed_hidden, placed_head, tokens.to(device), temperature, chunk_elements=16 * vocab
    )
    loss(logp, entropy).backward()
    for actual, expected in ((logp, expected_logp), (entropy, expected_entropy)):
        torch.testing.assert_close(actual.float().cpu(), expected.detach(), **tolerance)
    pairs = zip((placed_hidden, placed_head.weight, placed_head.bias), exact, strict=True)
    for actual, expected in pairs:
        close_gradient(actual.grad, expected.grad)

    logits = F.linear(*exact).detach()
    exact_logits = logits.clone().requires_grad_()
    z = exact_logits.div(temperature).log_softmax(-1)
    loss(z.gather(-1, tokens[:, None]).squeeze(-1), -(z.exp() * z).sum(-1)).backward()
    placed_logits = logits.to(device, dtype).requires_grad_()
    logp, entropy = logprobs.token_logprobs_and_entropy(
        placed_logits, tokens.to(device), temperature, chunk_size=16
    )
    loss(logp, entropy).backward()
    torch.testing.assert_close(logp.float().cpu(), expected_logp.detach(), **tolerance)
    close_gradient(placed_logits.grad, exact_logits.grad)


def check_add_rms_norm(device: str, dtype, residual: bool, programs: int) -> None:
    """`gpu_kernels.add_rms_norm` (13 rows of 100: masked lanes; delta read in place from a
    wider tensor; gains away from 1) against autograd through h + delta and `F.rms_norm` from
    the same (rounded) inputs: both outputs and the gradients of h, delta and the gain, with
    the stream's own gradient (`residual`) or only the norm's, and the gain's gradient summed
    by `programs` programs (fewer than the rows: each takes several)."""
    g = torch.Generator().manual_seed(8)

    def inputs(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).float()

    h, wide = inputs(13, 100), inputs(13, 150) * 2
    gain = (0.5 + torch.rand(100, generator=g)).to(dtype).float()
    grad_out, grad_total = inputs(13, 100), inputs(13, 100)
    exact = [t.clone().requires_grad_() for t in (h, wide, gain)]
    total = exact[0] + exact[1][:, 20:120]
    out = F.rms_norm(total, (100,), exact[2], 1e-6)
    loss = (out * grad_out).sum() + ((total * grad_total).sum() if residual else 0)
    loss.backward()
    placed = [t.to(device, dtype).requires_grad_() for t in (h, wide, gain)]
    saved = gpu_kernels.NORM_PROGRAMS
    gpu_kernels.NORM_PROGRAMS = programs
    try:
        got_total, got_out = gpu_kernels.add_rms_norm(
            placed[0], placed[1][:, 20:120], placed[2], 1e-6
        )
        got = (got_out * grad_out.to(device, dtype)).sum()
        if residual:
            got = got + (got_total * grad_total.to(device, dtype)).sum()
        got.backward()
    finally:
        gpu_kernels.NORM_PROGRAMS = saved
    close(got_total.cpu(), total.detach().to(dtype))
    close(got_out.cpu(), out.detach().to(dtype))
    for actual, reference in zip(placed, exact, strict=True):
        close_gradient(actual.grad, reference.grad)


def check_rotary_and_swiglu(device: str, dtype) -> None:
    """`gpu_kernels.rotary` (three heads of 24 per token, one angle per token; and three of
    five heads read in place, a token stride of 120) and `swiglu` (1,500 columns: two blocks,
    the second partial) against PyTorch's autograd through
    `fused.rotate` and silu(gate)·up from the same (rounded) inputs: values and the inputs'
    gradients."""
    g = torch.Generator().manual_seed(7)

    def inputs(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).float()

    x, cos, sin, gate, up, wide, gate_up = (
        inputs(11, 3, 24),
        inputs(11, 1, 24),
        inputs(11, 1, 24),
        inputs(7, 1500),
        inputs(7, 1500),
        inputs(11, 5, 24),
        inputs(7, 3100),
    )
    cases = [
        (gpu_kernels.rotary, lambda x: fused.rotate(x, cos, sin), [x], [cos, sin]),
        (gpu_kernels.swiglu, lambda a, b: F.silu(a) * b, [gate, up], []),
        (  # the first 3,000 columns of 3,100 as one packed gate/up output, read in place
            lambda w: gpu_kernels.swiglu_packed(w[:, :3000]),
            lambda w: F.silu(w[:, :1500]) * w[:, 1500:3000],
            [gate_up],
            [],
        ),
        (  # heads 1-3 of five, read in place as from PackedOps.projections' packed output
            lambda w, c, s: gpu_kernels.rotary(w[:, 1:4], c, s),
            lambda w: fused.rotate(w[:, 1:4], cos, sin),
            [wide],
            [cos, sin],
        ),
    ]
    for kernel, reference, differentiable, constants in cases:
        exact = [t.clone().requires_grad_() for t in differentiable]
        expected = reference(*exact)
        grad = inputs(*expected.shape)
        expected.backward(grad)
        placed = [t.to(device, dtype).requires_grad_() for t in differentiable]
        out = kernel(*placed, *(t.to(device, dtype) for t in constants))
        out.backward(grad.to(device, dtype))
        close(out.cpu(), expected.detach().to(dtype))
        for actual, reference_input in zip(placed, exact, strict=True):
            close(actual.grad.cpu(), reference_input.grad.to(dtype))


def test_rotary_and_swiglu_kernels_match_pytorch_forward_and_backward():
    check_rotary_and_swiglu("cpu", torch.float32)


def test_the_packed_mlp_inner_gives_torch_ops_values_and_one_gate_up_gradient():
    """`PackedOps.mlp_inner` (lever 51): SiLU·up reads the packed gate/up matmul's output
    whole, so its gradient reaches the matmul with no split node, whose backward would join
    the two halves' gradients with a copy; values and gradients are `TorchOps`'."""
    torch.manual_seed(3)
    gate, up = torch.nn.Linear(16, 24), torch.nn.Linear(16, 24)
    x = torch.randn(5, 16, requires_grad=True)
    differentiable = [x, gate.weight, gate.bias, up.weight, up.bias]
    expected = fused.TorchOps(torch.zeros(1, 1, 1, 1)).mlp_inner(x, gate, up)
    grad = torch.randn(expected.shape)
    expected_grads = torch.autograd.grad(expected, differentiable, grad)
    out = fused.PackedOps(torch.ones(1, 5), 5).mlp_inner(x, gate, up)
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    assert not [node.name() for node in seen if "Split" in node.name()]
    close(out, expected.detach())
    actual_grads = torch.autograd.grad(out, differentiable, grad)
    for actual, reference in zip(actual_grads, expected_grads, strict=True):
        close(actual, reference)


def test_the_token_statistics_refuse_a_token_outside_the_vocabulary():
    """A token id past the vocabulary, or negative, is a clear error naming the range, before
    any kernel runs (an unchecked read would give a plausible wrong log-prob), from both of
    `logprobs`' functions."""
    g = torch.Generator().manual_seed(9)
    logits, hidden = torch.randn(3, 50, generator=g), torch.randn(3, 8, generator=g)
    head = torch.nn.Linear(8, 50)
    for tokens, shown in (([1, 50, 2], "from 1 to 50"), ([-1, 3, 2], "from -1 to 3")):
        with pytest.raises(ValueError, match=f"token ids {shown}, outside the vocabulary of 50"):
            logprobs.token_logprobs_and_entropy(logits, torch.tensor(tokens))
        with pytest.raises(ValueError, match=f"token ids {shown}, outside the vocabulary of 50"):
            logprobs.linear_token_stats(hidden, head, torch.tensor(tokens))
    logp, _ = logprobs.token_logprobs_and_entropy(logits, torch.tensor([1, 49, 0]))
    torch.testing.assert_close(logp, logits.log_softmax(-1)[[0, 1, 2], [1, 49, 0]])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("uses", ["logp", "entropy", "both"])
def test_token_stats_kernels_give_the_log_probs_entropies_and_gradients(
    monkeypatch, temperature, uses
):
    calls = []
    for name in ("token_stats", "logit_grad"):
        run = getattr(gpu_kernels, name)
        monkeypatch.setattr(
            gpu_kernels, name, lambda *a, run=run, name=name: calls.append(name) or run(*a)
        )
    check_token_stats(temperature, uses, "cpu", torch.float32)
    assert calls.count("token_stats") == 2 * 3  # two functions, three chunks each
    assert calls.count("logit_grad") == 2 * 3


def check_grpo_update(monkeypatch, device: str, atol: float) -> None:
    """One GRPO mini-batch (`minibatch_backward`: shared-prefix micro-batches of at most 40
    tokens, the log-probs and entropies without logits, the clipped loss with an entropy
    bonus at T = 0.8) on the Qwen2-GQA test model (fp32), with the update's Triton kernels and
    with PyTorch's operations: the same statistics and parameter gradients."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    tok = build_tiny_tokenizer()
    model = MODELS["qwen2_gqa"](tok).to(device)
    g = torch.Generator().manual_seed(8)
    prompts, completions = ragged_samples(g)
    signs = torch.randint(0, 2, (12,), generator=g).float() * 2 - 1
    batch = token_batch(prompts, completions, torch.arange(12) // 4, signs)
    algo = resolve_config(preset="grpo").algorithm
    settings = LossSettings(algo, 0.8, 12, 40, tok.pad_token_id, entropy_coef=0.01)
    usable, calls = gpu_kernels.usable, []
    stats_kernel = gpu_kernels.token_stats
    monkeypatch.setattr(
        gpu_kernels, "token_stats", lambda *a: calls.append("stats") or stats_kernel(*a)
    )
    runs = []
    for kernels in (True, False):
        monkeypatch.setattr(gpu_kernels, "usable", usable if kernels else lambda x: False)
        model.zero_grad(set_to_none=True)
        stats = update.minibatch_backward(model, batch, list(range(12)), settings)
        runs.append((stats, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (stats, grads), (expected_stats, expected_grads) = runs
    assert stats == pytest.approx(expected_stats, rel=10 * atol, abs=atol)
    for name, expected in expected_grads.items():
        torch.testing.assert_close(grads[name], expected, rtol=0, atol=atol, msg=name)
    assert calls and max(x.abs().max() for x in expected_grads.values()) > 1e-3
    assert len(update.micro_batches(batch, list(range(12)), 40, model)) > 1


def test_a_grpo_update_with_the_kernels_gives_the_pytorch_gradients(monkeypatch):
    check_grpo_update(monkeypatch, "cpu", 1e-5)


NORMS = ["no norm", "norm", "norm and bias"]


@pytest.mark.parametrize(("residual", "programs"), [(True, 512), (False, 512), (True, 4)])
def test_add_rms_norm_gives_the_addition_and_the_norm_with_their_gradients(residual, programs):
    check_add_rms_norm("cpu", torch.float32, residual, programs)


@pytest.mark.parametrize("normed", NORMS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 16), (6, 2, 24)])
def test_rotate_and_store_writes_what_the_rotary_embedding_gives(heads, kv_heads, dim, normed):
    check_rotate_and_store(heads, kv_heads, dim, "cpu", torch.float32, normed)


@pytest.mark.parametrize("normed", NORMS)
def test_silu_mul_is_silu_of_gate_times_up(normed):
    check_silu_mul("cpu", torch.float32, normed)


DECODE_ATTENTION_CASES = [  # heads, kv_heads, dim, span, splits (None: `decode_splits`)
    (4, 4, 16, 64, 1),
    (6, 2, 24, 150, 3),
    (14, 2, 64, 130, None),
    (14, 2, 64, 300, 1),
]


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "span", "splits"), DECODE_ATTENTION_CASES)
def test_the_decode_attention_kernel_gives_pytorchs_attention(heads, kv_heads, dim, span, splits):
    check_decode_attention(heads, kv_heads, dim, span, splits, "cpu", torch.float32)


@pytest.mark.parametrize(("temperature", "block"), [(1.0, 512), (0.7, 1024), (1.0, 4096)])
@pytest.mark.parametrize("banned", [False, True])
def test_sample_draws_what_the_pytorch_sampler_draws(temperature, block, banned):
    check_sample(temperature, block, banned, "cpu", torch.float32)


@pytest.mark.parametrize(
    "weights", ["packed, norms folded", "packed", "separate", "packed, norms folded, our attention"]
)
def test_the_step_with_kernels_samples_what_the_eager_decoder_samples(monkeypatch, weights):
    """The static-buffer engine, whose step runs the three kernels, against the eager
    fused decoder with PyTorch's operations (a Qwen2 shape: GQA, q/k/v biases; RMSNorm gains
    away from 1): the same tokens, rows finishing at many steps, several spans. With the
    projections packed and the norms folded into them (the default where the kernels run),
    packed alone, one by one, and with `triton_ops.decode_attention` for the attention."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 4)
    monkeypatch.setattr(graph_step, "FOLD_NORMS", weights.startswith("packed, norms folded"))
    ours = weights.endswith("our attention")
    names = ("rotate_and_store", "silu_mul", "sample") + (("decode_attention",) if ours else ())
    if weights == "separate":
        monkeypatch.setattr(graph_step, "PACK_MEMORY_SHARE", 0.0)
    usable, calls = triton_ops.usable, []
    for name in names:
        run = getattr(triton_ops, name)
        monkeypatch.setattr(
            triton_ops, name, lambda *a, run=run, name=name: calls.append(name) or run(*a)
        )
    if ours:  # the step's own choice, from one row on
        monkeypatch.setattr(graph_step, "OUR_ATTENTION_ROWS", 1)
    tok = build_tiny_tokenizer()
    model = MODELS["qwen2_gqa"](tok)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    params = SamplingParams(n=6, temperature=0.9, max_new_tokens=30)
    ends = [tok.eos_token_id, 20, 21, 22, 23]
    runs, graph_state = [], GraphState(capture=False)
    for state, kernels in ((None, False), (graph_state, True)):
        monkeypatch.setattr(triton_ops, "usable", usable if kernels else lambda x: False)
        engine = HFRolloutEngine(
            model, ends, tok.pad_token_id, generator=torch.Generator().manual_seed(3)
        )
        engine.graph_state = state
        runs.append(engine.generate(prompts, params))
    eager, with_kernels = runs
    assert with_kernels.completion_ids == eager.completion_ids
    for a, b in zip(with_kernels.logprobs, eager.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert len({len(c) for c in eager.completion_ids}) > 3
    assert set(calls) == set(names)  # each kernel ran (two per layer and one per step)
    used = graph_state.buffers.weights
    assert isinstance(
        used, graph_step.SeparateWeights if weights == "separate" else graph_step.PackedWeights
    )
    assert used.folded == weights.startswith("packed, norms folded")
