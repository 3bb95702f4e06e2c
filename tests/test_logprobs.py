"""Log-probs and entropies straight from the hidden states (`linear_token_stats`) against the
direct formulas through materialised logits, and what they keep in memory."""

import pytest
import torch
import torch.nn.functional as F

from rlvr.models import fused
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training import logprobs as logprobs_module
from rlvr.training.batching import collate_shared_prefix, completion_token_stats
from rlvr.training.logprobs import linear_token_stats

N, D, VOCAB = 10, 6, 13


def direct_stats(hidden, head, tokens, temperature):
    """log p[token] and H through the full logits, by autograd (the independent formula)."""
    logp = (head(hidden) / temperature).log_softmax(-1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def grads(outputs, weights, inputs):
    loss = sum((w * o).sum() for w, o in zip(weights, outputs))
    return torch.autograd.grad(loss, inputs, retain_graph=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_match_the_logits_path(temperature, bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(D, VOCAB, bias=bias)
    hidden = torch.randn(N, D, requires_grad=True)
    tokens = torch.randint(0, VOCAB, (N,))
    inputs = [hidden, *head.parameters()]
    # 3 rows per chunk: four chunks, the last one short
    lp, entropy = linear_token_stats(hidden, head, tokens, temperature, chunk_elements=3 * VOCAB)
    direct_lp, direct_entropy = direct_stats(hidden, head, tokens, temperature)
    assert torch.allclose(lp, direct_lp, atol=1e-6)
    assert torch.allclose(entropy, direct_entropy, atol=1e-6)
    w_lp, w_h = torch.randn(N), torch.randn(N)
    for a, b in ((1, 0), (0, 1), (1, 1)):
        expected = grads((direct_lp, direct_entropy), (a * w_lp, b * w_h), inputs)
        got = grads((lp, entropy), (a * w_lp, b * w_h), inputs)
        for e, g in zip(expected, got):
            assert torch.allclose(e, g, atol=1e-6)
        assert min(float(g.abs().max()) for g in got) > 1e-3
    lp_only, empty = linear_token_stats(hidden, head, tokens, temperature, with_entropy=False)
    assert torch.allclose(lp_only, direct_lp, atol=1e-6) and empty.numel() == 0


@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_token_ids_given_on_the_host_are_checked_there(monkeypatch, bad):
    """`host_tokens` (lever 54): their range is checked on the host, with the kernels' error
    naming it, even where the kernels' path would not check (`_outputs` is told not to, so a
    GPU is never read back for it); ids in range give the values of the unchecked call."""
    torch.manual_seed(1)
    head = torch.nn.Linear(D, VOCAB)
    hidden = torch.randn(N, D)
    tokens = torch.randint(0, VOCAB, (N,))
    plain = linear_token_stats(hidden, head, tokens)
    checked = linear_token_stats(hidden, head, tokens, host_tokens=tokens.clone())
    for a, b in zip(plain, checked, strict=True):
        assert torch.equal(a, b)
    wrong = tokens.clone()
    wrong[3] = bad
    low, high = min(int(tokens.min()), bad), max(int(tokens.max()), bad)
    shown = f"from {low} to {high}"
    with pytest.raises(ValueError, match=f"token ids {shown}, outside the vocabulary of {VOCAB}"):
        linear_token_stats(hidden, head, tokens, host_tokens=wrong)
    seen = []
    monkeypatch.setattr(logprobs_module.gpu_kernels, "usable", lambda x: True)
    monkeypatch.setattr(logprobs_module.gpu_kernels, "check_token_ids", lambda *a: seen.append(a))
    monkeypatch.setattr(logprobs_module, "_stats_into", lambda *a: None)
    host = tokens.clone()
    linear_token_stats(hidden, head, tokens, host_tokens=host)  # checked once, on the host
    linear_token_stats(hidden, head, tokens)  # checked once, in `_outputs`
    assert len(seen) == 2 and seen[0][0] is host and seen[1][0] is tokens


def test_only_a_chunk_of_logits_exists_and_backward_keeps_no_logits(monkeypatch):
    torch.manual_seed(0)
    head = torch.nn.Linear(D, VOCAB, bias=False)
    hidden = torch.randn(N, D, requires_grad=True)
    tokens = torch.randint(0, VOCAB, (N,))
    made = []
    real_linear = F.linear

    def recording_linear(x, weight, bias=None):
        out = real_linear(x, weight, bias)
        made.append(out.numel())
        return out

    monkeypatch.setattr(logprobs_module.F, "linear", recording_linear)
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, entropy = linear_token_stats(hidden, head, tokens, chunk_elements=4 * VOCAB)
    forward_logits = list(made)
    (lp.sum() + entropy.sum()).backward()
    assert forward_logits == [4 * VOCAB, 4 * VOCAB, 2 * VOCAB]  # chunks of 4 rows
    assert made[3:] == forward_logits  # backward makes them again, a chunk at a time
    # hidden, weight, tokens, entropies and the log-sum-exps, empty on a CPU (the GPU kernels
    # keep them): nothing of the [rows, vocab] shape
    assert sorted(saved) == sorted([N * D, VOCAB * D, N, N, 0])
    # a budget below one row's logits still goes one row at a time, never two
    made.clear()
    linear_token_stats(hidden, head, tokens, chunk_elements=VOCAB // 2)
    assert made == [VOCAB] * N


def test_bf16_gradients_are_close_to_fp32_and_keep_the_dtype():
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 500, bias=False)
    hidden = torch.randn(300, 64)
    tokens = torch.randint(0, 500, (300,))
    w = torch.randn(300)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        h = hidden.to(dtype, copy=True).requires_grad_()
        lm = torch.nn.Linear(64, 500, bias=False, dtype=dtype)
        lm.weight.data.copy_(head.weight.detach())
        lp, _ = linear_token_stats(h, lm, tokens, 0.7, chunk_elements=64 * 500)
        (w * lp).sum().backward()
        assert h.grad.dtype == dtype and lm.weight.grad.dtype == dtype
        results.append((lp, h.grad.float(), lm.weight.grad.float()))
    for fp32, bf16 in zip(*results):
        torch.testing.assert_close(bf16.detach(), fp32.detach(), atol=0.05, rtol=0.05)


def test_completion_token_stats_equal_the_logits_path_on_the_fused_forward(logits_reference):
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    prompts = [[3, 40, 41]] * 2 + [[3, 44, 45, 46, 47]] * 2
    completions = [[50, 51, 1], [52], [53, 54, 55, 56], [57, 58]]
    sb = collate_shared_prefix(prompts, completions, [0, 1, 2, 3], tok.pad_token_id)
    w = torch.randn(sb.response_mask.shape) * sb.response_mask
    results = []
    for stats in (completion_token_stats, logits_reference):
        model.zero_grad()
        lp, entropy = stats(model, sb, 0.8)
        (w * (lp + 0.1 * entropy)).sum().backward()
        results.append(
            (lp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()])
        )
    (lp, entropy, g), (ref_lp, ref_entropy, ref_g) = results
    assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(entropy, ref_entropy, atol=1e-6)
    assert lp[1, 1:].eq(0).all() and entropy[1, 1:].eq(0).all()  # zero at padding
    for a, b in zip(g, ref_g):
        assert torch.allclose(a, b, atol=1e-6)
    assert model.lm_head.weight.grad.abs().max() > 1e-3


def test_the_default_chunk_is_larger_on_a_gpu_and_read_at_each_call(monkeypatch):
    assert logprobs_module.default_chunk_elements(torch.device("cpu")) == 1 << 26
    assert logprobs_module.default_chunk_elements(torch.device("cuda", 0)) == 1 << 28
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 3 * VOCAB)
    torch.manual_seed(0)
    head = torch.nn.Linear(D, VOCAB, bias=False)
    made = []
    real_linear = F.linear

    def recording_linear(x, weight, bias=None):
        made.append(x.shape[0])
        return real_linear(x, weight, bias)

    monkeypatch.setattr(logprobs_module.F, "linear", recording_linear)
    linear_token_stats(torch.randn(N, D), head, torch.randint(0, VOCAB, (N,)))
    assert made == [3, 3, 3, 1]  # CPU tensors: CHUNK_ELEMENTS as patched, 3 rows a chunk


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_head_gradient_sums_bf16_products_in_fp32_on_a_gpu():
    """On a GPU a bf16 chunk's head gradient goes into the fp32 sum by one matmul that writes
    fp32 (`fp32_output_matmul`), so the sum is as exact as the fp32 product of the bf16
    operands, closer than adding a bf16-rounded product; written into the sum itself where
    PyTorch takes it as its own output (`fp32_output_in_place`)."""
    device = torch.device("cuda")
    assert logprobs_module.fp32_output_matmul(device, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(512, 256, generator=g).to(torch.bfloat16) for _ in range(2))
    total = torch.randn(256, 256, generator=g)
    exact = total + a.float().T @ b.float()
    into = total.to(device)
    summed = logprobs_module._add_product(into, a.to(device).T, b.to(device))
    rounded = total + (a.float().T @ b.float()).to(torch.bfloat16).float()
    error, rounding = (summed.cpu() - exact).abs().max(), (rounded - exact).abs().max()
    assert summed.dtype == torch.float32 and error < rounding / 4
    in_place = logprobs_module.fp32_output_in_place(device, torch.bfloat16)
    assert (summed.data_ptr() == into.data_ptr()) == in_place


def test_non_fused_completion_stats_are_zero_at_padding():
    """The transformers forward (a model the fused forward does not take) zeroes the log-probs
    and entropies at padding, as the fused one does."""
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    setattr(model, fused.ENABLE_ATTR, False)
    assert not fused.supports(model)
    sb = collate_shared_prefix([[3, 40, 41]] * 2, [[50, 51, 1], [52]], [0, 1], tok.pad_token_id)
    with torch.no_grad():
        lp, entropy = completion_token_stats(model, sb, 0.8)
    assert sb.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert lp[1, 1:].eq(0).all() and entropy[1, 1:].eq(0).all()
    assert lp[0].ne(0).all() and entropy[0].ne(0).all()
