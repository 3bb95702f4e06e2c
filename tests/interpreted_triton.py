"""Checks of `rlvr.rollout.triton_ops` under Triton's interpreter, on a CPU in fp32. Run by
`test_cuda_graphs.test_the_triton_kernels_under_the_interpreter` in a process of its own with
`TRITON_INTERPRET=1` (set before Triton is imported), not collected by the suite itself. The
`check_*` functions take a device and a dtype: `test_cuda_graphs` runs them on a GPU in bf16
and fp32, where the kernels are compiled."""

import os

import pytest
import torch
import torch.nn.functional as F

from rlvr.models import fused
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout import graph_step, graphs, triton_ops
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.graphs import GraphState
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.sampling import ban_bias, below, sample_tokens
from test_fused_forward import MODELS

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"
)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to one rounding to `actual`'s dtype (the kernels round once, from fp32)."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(actual.float(), expected.float(), rtol=8e-3, atol=1e-2)


def check_rotate_and_store(heads: int, kv_heads: int, dim: int, device: str, dtype) -> None:
    """Queries out, keys and values at the column `where` of the first b rows, nothing else
    written (a head size that is not a power of two: the kernel's masked lanes)."""
    g = torch.Generator().manual_seed(0)
    b, rows, capacity, column = 5, 8, 10, 7
    qkv = torch.randn(b, (heads + 2 * kv_heads) * dim, generator=g).to(device, dtype)
    cos, sin = (torch.randn(b, 1, dim, generator=g).to(device, dtype) for _ in range(2))
    kv = torch.zeros(2, rows, kv_heads, capacity, dim, device=device, dtype=dtype)
    keys, values = kv[0, :b], kv[1, :b]
    where = torch.tensor([column], device=device)
    q = triton_ops.rotate_and_store(
        qkv, *graph_step.rotary_pair(cos, sin), keys, values, where, heads
    )
    split = qkv.float().view(b, heads + 2 * kv_heads, dim)
    cos, sin = cos.float(), sin.float()
    close(q, fused.rotate(split[:, :heads], cos, sin))
    close(kv[0, :b, :, column], fused.rotate(split[:, heads : heads + kv_heads], cos, sin))
    assert torch.equal(kv[1, :b, :, column].float(), split[:, heads + kv_heads :])
    written = torch.zeros_like(kv, dtype=torch.bool)
    written[:, :b, :, column] = True
    assert not kv[~written].any()


def check_silu_mul(device: str, dtype) -> None:
    """silu(gate)·up over 1,500 columns (two blocks, the second partial)."""
    gate_up = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(1))
    gate_up = gate_up.to(device, dtype)
    exact = gate_up.float()
    close(triton_ops.silu_mul(gate_up), F.silu(exact[:, :1500]) * exact[:, 1500:])


def check_sample(temperature: float, block: int, banned: bool, device: str, dtype) -> None:
    """Rows of 2,500 logits in chunks of 512 or 1,024 (the last one partial) or in one chunk
    of 4,096 (the default): the same tokens as `sample_tokens`' PyTorch path and the same
    log-probs. Banned tokens, made the likeliest and filling the last chunk, are never drawn;
    a uniform just below 1 draws the last token of nonzero probability."""
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


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 16), (6, 2, 24)])
def test_rotate_and_store_writes_what_the_rotary_embedding_gives(heads, kv_heads, dim):
    check_rotate_and_store(heads, kv_heads, dim, "cpu", torch.float32)


def test_silu_mul_is_silu_of_gate_times_up():
    check_silu_mul("cpu", torch.float32)


@pytest.mark.parametrize(("temperature", "block"), [(1.0, 512), (0.7, 1024), (1.0, 4096)])
@pytest.mark.parametrize("banned", [False, True])
def test_sample_draws_what_the_pytorch_sampler_draws(temperature, block, banned):
    check_sample(temperature, block, banned, "cpu", torch.float32)


def test_the_step_with_kernels_samples_what_the_eager_decoder_samples(monkeypatch):
    """The static-buffer engine, whose step runs the three kernels, against the eager
    fused decoder with PyTorch's operations (a Qwen2 shape: GQA, q/k/v biases): the same
    tokens, rows finishing at many steps, several spans."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 4)
    usable, calls, names = triton_ops.usable, [], ("rotate_and_store", "silu_mul", "sample")
    for name in names:
        run = getattr(triton_ops, name)
        monkeypatch.setattr(
            triton_ops, name, lambda *a, run=run, name=name: calls.append(name) or run(*a)
        )
    tok = build_tiny_tokenizer()
    model = MODELS["qwen2_gqa"](tok)
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    params = SamplingParams(n=6, temperature=0.9, max_new_tokens=30)
    ends = [tok.eos_token_id, 20, 21, 22, 23]
    runs = []
    for state, kernels in ((None, False), (GraphState(capture=False), True)):
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
