"""The CUDA-graph decode path (`rlvr.rollout.graphs`) samples what the eager fused decoder
samples. Its static-buffer steps run uncaptured on a CPU (`GraphState(capture=False)`); the
capture itself is checked where a GPU is present."""

import itertools
import re
import warnings
from pathlib import Path

import pytest
import torch

from rlvr.models import fused, gpu_kernels
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout import graph_step, graphs, hf, triton_ops
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.graphs import GraphState, batch_bucket, span_bucket
from rlvr.rollout.hf import FusedDecoder, GraphDecoder, HFRolloutEngine
from rlvr.training.batching import completion_token_stats, to_device
from test_fused_forward import ADAPTED, MODELS, logprobs_and_grads, ragged_batch


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def eos_heavy(model, tok, push: float = 0.4):
    """Make EOS likely, so rows finish at many different steps."""
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += push * model.model.embed_tokens.weight.mean(0)
    return model


def engine(
    model, tok, seed: int, state: GraphState | None, overlap: bool | None = None
) -> HFRolloutEngine:
    e = HFRolloutEngine(
        model,
        [tok.eos_token_id],
        tok.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
        overlap=overlap,
    )
    e.graph_state = state
    return e


def test_buckets_round_up_to_a_power_of_two_and_to_the_span_step():
    assert [batch_bucket(n, 48) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [
        1, 2, 4, 8, 16, 32, 48, 48,
    ]  # fmt: skip
    step = graphs.SPAN_STEP
    assert span_bucket(1, 1000) == step
    assert span_bucket(step, 1000) == step
    assert span_bucket(step + 1, 1000) == 2 * step
    assert span_bucket(step + 1, step + 5) == step + 5  # never past the buffer


@pytest.mark.parametrize("name", MODELS)
def test_static_buffer_steps_sample_what_the_eager_decoder_samples(tok, name, monkeypatch):
    """Rows finish at many steps (compaction, padded batches) and the written length crosses
    several spans; samples and log-probs equal the eager fused decoder's."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 4)
    model = eos_heavy(MODELS[name](tok), tok, 0.25)
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    params = SamplingParams(n=6, temperature=0.9, max_new_tokens=40)
    ref = engine(model, tok, 3, None).generate(prompts, params)
    state = GraphState(capture=False)
    out = engine(model, tok, 3, state).generate(prompts, params)
    assert out.completion_ids == ref.completion_ids
    assert out.finish_reason == ref.finish_reason
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    lengths = [len(c) for c in out.completion_ids]
    assert len(set(lengths)) > 5 and max(lengths) > 12  # many batch sizes and spans were used
    assert state.buffers is not None and state.buffers.rows == 18


@pytest.mark.parametrize("name", ADAPTED)
def test_a_model_with_adapters_decodes_eagerly(tok, name, monkeypatch):
    """The captured step multiplies packed copies of the base weights, which know nothing of
    LoRA adapters: a model with adapters decodes by the eager fused decoder instead, and
    samples what the `transformers` forward samples."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    model = eos_heavy(ADAPTED[name](tok), tok, 0.25)
    prompts = [[20, 30, 40], [50, 60]]
    params = SamplingParams(n=4, temperature=0.9, max_new_tokens=24)
    state = GraphState(capture=False)
    out = engine(model, tok, 3, state).generate(prompts, params)
    assert state.buffers is None  # no static-buffer step ran
    setattr(model, fused.ENABLE_ATTR, False)
    ref = engine(model, tok, 3, None).generate(prompts, params)
    assert out.completion_ids == ref.completion_ids
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


@pytest.mark.parametrize(
    ("params", "some_stop"),
    [
        (SamplingParams(n=4, temperature=0.7, top_k=9, max_new_tokens=40, min_new_tokens=6), 1),
        (SamplingParams(n=4, temperature=1.1, top_p=0.8, max_new_tokens=40, min_new_tokens=40), 0),
        (SamplingParams(n=2, temperature=0.0, max_new_tokens=40, min_new_tokens=4), 0),
        (SamplingParams(n=4, temperature=1.3, max_new_tokens=40, min_new_tokens=6, min_p=0.2), 1),
    ],
    ids=["top-k, EOS banned for 6", "top-p, EOS always banned", "greedy", "min-p"],
)
def test_sampling_inside_the_step_draws_what_eager_sampling_draws(
    tok, params, some_stop, monkeypatch
):
    """The static-buffer step samples in its own run (what a graph captures): truncation, the
    EOS ban before min_new_tokens and greedy decoding give the eager decoder's tokens."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 8)
    model = eos_heavy(MODELS["llama"](tok), tok, 0.25)
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    ref = engine(model, tok, 5, None).generate(prompts, params)
    state = GraphState(capture=False)
    out = engine(model, tok, 5, state).generate(prompts, params)
    assert out.completion_ids == ref.completion_ids
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    stopped = [len(c) for c, r in zip(out.completion_ids, out.finish_reason) if r == "stop"]
    assert all(length > params.min_new_tokens for length in stopped)  # EOS not before
    assert bool(stopped) == bool(some_stop)


def test_the_graph_step_gives_the_eager_step_logits(tok, monkeypatch):
    """`GraphDecoder.step` (logits, sampled outside) computes the eager decoder's logits."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    model = MODELS["qwen2_gqa"](tok)
    ids = torch.tensor([[0, 20, 30], [50, 60, 70]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    eager, graph = FusedDecoder(model, 8), GraphDecoder(model, 8, GraphState(capture=False))
    with torch.inference_mode():
        for decoder in (eager, graph):
            decoder.prefill(ids, mask, positions)
            decoder.select(torch.tensor([0, 0, 1]))
        token, full_mask = torch.tensor([5, 6, 7]), torch.ones(3, 4, dtype=torch.long)
        full_mask[:2, 0] = 0
        position = torch.tensor([2, 2, 3])
        want = eager.step(token, full_mask, position)
        got = graph.step(token, full_mask, position)
    assert got.shape == want.shape == (3, model.config.vocab_size)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    ("rows", "usable", "ours"), [(512, True, True), (511, True, False), (512, False, False)]
)
def test_the_step_attention_is_ours_from_512_rows_where_triton_runs(
    monkeypatch, rows, usable, ours
):
    """`graph_step.decode_attention` hands 512 rows or more to `triton_ops.decode_attention`
    where Triton runs (lever 46, faster there on an H200) and anything else to PyTorch's SDPA,
    whose result it returns: softmax(q·kᵀ·scale + bias)·v computed here by hand."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(rows, 4, 8, generator=g)
    keys, values = torch.randn(2, rows, 2, 5, 8, generator=g)
    called = []
    monkeypatch.setattr(triton_ops, "usable", lambda x: usable)
    monkeypatch.setattr(triton_ops, "decode_attention", lambda *a: called.append(a) or "ours")
    bias = torch.zeros(rows, 1, 1, 5)
    bias[:, :, :, 0] = float("-inf")
    got = graph_step.decode_attention(q, keys, values, bias, 0.5)
    assert (got == "ours") == ours == bool(called)
    if not ours:
        k, v = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)
        scores = torch.einsum("bhd,bhsd->bhs", q, k) * 0.5 + bias[:, 0]
        want = torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v).reshape(rows, 32)
        assert torch.allclose(got, want, atol=1e-5)


def test_kept_buffers_never_leak_stale_values(tok, monkeypatch):
    """One state serves rollouts of other widths, group sizes and budgets; before each, the
    kept buffers are filled with NaN, so a read of anything not written this rollout would
    poison the logits. Each rollout equals the eager decoder's."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 8)
    model = eos_heavy(MODELS["qwen2_gqa"](tok), tok, 0.2)
    state = GraphState(capture=False)
    rounds = [
        ([[20, 30, 40, 50, 60, 70], [50, 60]], SamplingParams(n=6, max_new_tokens=20)),
        ([[50, 60], [25, 35, 45], [26]], SamplingParams(n=4, max_new_tokens=30)),
        ([[22, 32, 42], [52, 62, 72, 82]], SamplingParams(n=3, max_new_tokens=12)),
    ]
    sizes = []
    for seed, (prompts, params) in enumerate(rounds):
        if state.buffers is not None:
            with torch.inference_mode():
                state.buffers.kv.fill_(float("nan"))
                state.buffers.key_mask.fill_(1)
        out = engine(model, tok, seed, state).generate(prompts, params)
        ref = engine(model, tok, seed, None).generate(prompts, params)
        assert out.completion_ids == ref.completion_ids
        for a, b in zip(out.logprobs, ref.logprobs):
            assert a == pytest.approx(b, abs=1e-5)
        sizes.append((state.buffers.rows, state.buffers.capacity))
    # 12 rows × 6 + 20 positions, then 12 rows × 3 + 30 (grown), then kept for a smaller one
    assert sizes == [(12, 32), (12, 40), (12, 40)]


def test_packed_weights_follow_the_optimizers_in_place_updates(tok, monkeypatch):
    """The graph step reads q/k/v and gate/up packed into one matrix each (copies); after the
    weights change in place between rollouts (an optimizer step: same storages, so the graphs
    are kept), the next rollout samples what the eager decoder samples with the new weights."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    model = MODELS["qwen2_gqa"](tok)  # q/k/v biases
    prompts, params = [[20, 30, 40], [50, 60]], SamplingParams(n=4, max_new_tokens=16)
    state = GraphState(capture=False)
    engine(model, tok, 0, state).generate(prompts, params)
    buffers = state.buffers
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "proj" in name:
                p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=g))
    out = engine(model, tok, 1, state).generate(prompts, params)
    ref = engine(model, tok, 1, None).generate(prompts, params)
    assert state.buffers is buffers  # the kept buffers and packed copies
    assert isinstance(buffers.weights, graph_step.PackedWeights)
    assert out.completion_ids == ref.completion_ids
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_packed_weights_with_the_norms_folded_in_give_the_normed_projections(tok):
    """Folded packed weights (lever 45): the raw hidden state's matmul, scaled per row by
    rsqrt(mean(h²) + ε) and plus the bias (what the kernels' `RowNorm` does), equals the
    projections of RMSNorm(h) with gains away from 1, for q/k/v and gate/up; `refresh` folds
    the model's current weights again, not the folded copies a second time."""
    model = MODELS["qwen2_gqa"](tok)
    forward = fused.FusedForward(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    weights = graph_step.PackedWeights(forward, fold_norms=True)
    h = torch.randn(5, model.config.hidden_size, generator=g) * 3

    def check() -> None:
        for i, layer in enumerate(forward.layers):
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            for group, (modules, norm) in enumerate(zip(forward_groups[i], norms, strict=True)):
                x = torch.nn.functional.rms_norm(h, (h.shape[-1],), norm.weight, forward.eps)
                expected = torch.cat([fused.linear(x, m) for m in modules], dim=-1)
                rest = weights.norm(i, group, h, forward.eps)
                scale = torch.rsqrt(rest.hidden.pow(2).mean(-1, keepdim=True) + rest.eps)
                bias = 0 if rest.bias is None else rest.bias
                got = weights.project(i, group, h) * scale + bias
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)

    forward_groups = graph_step.projection_groups(forward)
    with torch.no_grad():
        check()
        weights.refresh()
        weights.refresh()
        check()
        for name, p in model.named_parameters():
            if "proj" in name or "norm" in name:
                p.mul_(1 + 0.3 * torch.rand(p.shape, generator=g))
        weights.refresh()
        check()
    assert weights.folded and not graph_step.PackedWeights(forward).folded


def test_the_rotary_table_holds_what_each_step_would_compute(tok, monkeypatch):
    """`rotary_table` row p is the (cos, signed sin) the step computes for position p, bit for
    bit, for a Llama and a Qwen2 shape; an embedding whose frequencies change with the
    positions (dynamic NTK) gets no table, and its steps compute their own."""
    for name in ("llama", "qwen2_gqa"):
        forward = fused.FusedForward(MODELS[name](tok))
        like = torch.zeros(1, dtype=torch.float32)
        table = graph_step.rotary_table(forward, 40, like)
        position = torch.tensor([0, 7, 39, 3])
        cos, sin = forward.model.model.rotary_emb(like, position[:, None])
        cos, signed_sin = graph_step.rotary_pair(cos, sin)
        assert table.shape == (40, 2, forward.head_dim)
        assert torch.equal(table[position, :1], cos) and torch.equal(
            table[position, 1:], signed_sin
        )
        assert not torch.equal(table[1], table[2])
    monkeypatch.setattr(forward.model.model.rotary_emb, "rope_type", "dynamic")
    assert graph_step.rotary_table(forward, 40, like) is None


def test_folded_weights_without_the_kernels_are_refused(tok):
    """Weights that hold the RMSNorm gains need the kernels that finish the norm: a decode
    step without them raises instead of sampling from unnormalised states."""
    model = MODELS["llama"](tok)
    forward = fused.FusedForward(model)
    weights = graph_step.PackedWeights(forward, fold_norms=True)
    kv = torch.zeros(len(forward.layers), 2, 1, forward.kv_heads, 8, forward.head_dim)
    cache = graph_step.SlotKV(kv, 1, 1, torch.zeros(1, dtype=torch.long))
    with pytest.raises(RuntimeError, match="hold the RMSNorm gains need the Triton kernels"):
        token, position, bias = torch.tensor([5]), torch.tensor([0]), torch.zeros(1, 1, 1, 1)
        graph_step.decode_hidden(forward, weights, token, position, bias, cache, None)


def test_a_model_too_large_to_pack_reads_its_projections_one_by_one(tok, monkeypatch):
    """Packed copies are made only while they take at most PACK_MEMORY_SHARE of the device's
    memory; past it the step reads q/k/v and gate/up separately and samples the same."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    model = eos_heavy(MODELS["qwen2_gqa"](tok), tok, 0.25)
    forward = fused.FusedForward(model)
    packed = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if any(f"{proj}_proj" in name for proj in ("q", "k", "v", "gate", "up"))
    )
    share = packed / graph_step.device_memory(torch.device("cpu"))
    monkeypatch.setattr(graph_step, "PACK_MEMORY_SHARE", share)
    assert isinstance(
        graph_step.decode_weights(forward, torch.device("cpu")), graph_step.PackedWeights
    )
    monkeypatch.setattr(graph_step, "PACK_MEMORY_SHARE", share * 0.999)
    assert isinstance(
        graph_step.decode_weights(forward, torch.device("cpu")), graph_step.SeparateWeights
    )
    prompts, params = [[20, 30, 40], [50, 60]], SamplingParams(n=4, max_new_tokens=24)
    state = GraphState(capture=False)
    out = engine(model, tok, 2, state).generate(prompts, params)
    ref = engine(model, tok, 2, None).generate(prompts, params)
    assert isinstance(state.buffers.weights, graph_step.SeparateWeights)
    assert out.completion_ids == ref.completion_ids
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_the_rotary_pair_rotates_as_the_model_does():
    """x·cos + roll(x, d/2)·signed_sin equals `fused.rotate` (RoFormer's rotation)."""
    g = torch.Generator().manual_seed(0)
    x, cos, sin = (torch.randn(3, 5, 8, generator=g) for _ in range(3))
    cos, signed = graph_step.rotary_pair(cos, sin)
    got = x * cos + x.roll(4, -1) * signed
    assert torch.allclose(got, fused.rotate(x, cos, sin), atol=1e-6)
    assert not torch.allclose(got, x * cos + x.roll(4, -1) * sin, atol=1e-3)


def test_graphs_are_dropped_when_the_parameters_move(tok):
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    forward = fused.FusedForward(model)
    state = GraphState(capture=False)
    like = torch.zeros(1, dtype=torch.float32)
    first = state.buffers_for(forward, 4, 10, like)
    state.graphs[(4, 64)] = lambda: like
    assert state.buffers_for(forward, 2, 8, like) is first and state.graphs  # kept: it fits
    with torch.no_grad():
        model.lm_head.weight.data = model.lm_head.weight.data.clone()  # a new storage
    assert state.buffers_for(forward, 2, 8, like) is not first and not state.graphs


@pytest.mark.parametrize("decoder", [FusedDecoder, GraphDecoder])
def test_overlapped_steps_sample_what_sequential_steps_sample(tok, decoder, monkeypatch):
    """With `overlap` each step is launched before the host reads the previous step's tokens,
    so a row that sampled EOS is still in the next step's batch (one step late): the batch
    sizes lag the sequential engine's by one step, and the samples are the same."""
    monkeypatch.setenv("RLVR_CPU_KERNELS", "0")
    monkeypatch.setattr(graphs, "SPAN_STEP", 4)
    batches: list[int] = []
    steps = decoder.next_tokens
    monkeypatch.setattr(
        decoder,
        "next_tokens",
        lambda self, token, *a: batches.append(len(token)) or steps(self, token, *a),
    )
    model = MODELS["qwen2_gqa"](tok)
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    params = SamplingParams(n=6, temperature=0.9, max_new_tokens=100)
    ends = [tok.eos_token_id, 20, 21, 22, 23]  # frequent: every row stops, at many steps
    runs, sizes = [], []
    for overlap in (False, True):
        e = HFRolloutEngine(
            model,
            ends,
            tok.pad_token_id,
            generator=torch.Generator().manual_seed(3),
            overlap=overlap,
        )
        e.graph_state = GraphState(capture=False) if decoder is GraphDecoder else None
        runs.append(e.generate(prompts, params))
        sizes.append(batches.copy())
        batches.clear()
    sequential, overlapped = runs
    assert overlapped.completion_ids == sequential.completion_ids
    for a, b in zip(overlapped.logprobs, sequential.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-5)  # other batch sizes: other rounding
    assert overlapped.finish_reason == sequential.finish_reason == ["stop"] * 18
    assert len(set(sizes[0])) > 5  # rows left at many steps
    assert sizes[1] == [18, *sizes[0]]  # one step late, and one step more after the last EOS


def test_the_engine_picks_the_graph_decoder_only_on_a_gpu_or_when_asked(tok, monkeypatch):
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    made = []
    for cls in (FusedDecoder, GraphDecoder):
        monkeypatch.setattr(hf, cls.__name__, lambda *a, c=cls: made.append(c) or c(*a))
    params = SamplingParams(n=2, max_new_tokens=3)
    engine(model, tok, 0, GraphState()).generate([[20, 30]], params)  # CPU: eager
    engine(model, tok, 0, GraphState(capture=False)).generate([[20, 30]], params)
    assert made == [FusedDecoder, GraphDecoder]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", MODELS)
def test_captured_graphs_sample_what_the_eager_decoder_samples_on_a_gpu(tok, name):
    model = eos_heavy(MODELS[name](tok), tok, 0.25).cuda()
    prompts = [[20, 30, 40], [50, 60], [21, 31, 41, 51, 61, 71, 81]]
    params = SamplingParams(n=6, temperature=0.9, top_p=0.95, max_new_tokens=100, min_new_tokens=3)
    # eager sequential steps against captured overlapped ones (the default on a GPU)
    ref = engine(model, tok, 3, None, overlap=False).generate(prompts, params)
    state = GraphState()
    for _ in range(2):  # captured (EOS banned, then allowed), then replayed from the kept graphs
        out = engine(model, tok, 3, state).generate(prompts, params)
        assert out.completion_ids == ref.completion_ids
        for a, b in zip(out.logprobs, ref.logprobs):
            assert a == pytest.approx(b, abs=1e-4)
    assert len(state.graphs) > 3


ON_A_GPU = "on a GPU the kernels run compiled (test_the_triton_kernels_on_a_gpu)"


@pytest.mark.skipif(torch.cuda.is_available(), reason=ON_A_GPU)
def test_the_triton_kernels_under_the_interpreter(interpreted_checks):
    """`interpreted_triton.py` (the decode step's Triton kernels against PyTorch, and the step
    with them against the eager decoder) in a process with `TRITON_INTERPRET=1`; `conftest`
    starts it in the background and runs this test last."""
    status, output = interpreted_checks.result()
    assert status == 0, output[-6000:]
    summary = output.strip().splitlines()[-1]  # every collected check passed, none skipped
    assert re.match(r"\d+ passed(, \d+ warnings?)? in ", summary), summary


# The GPU checks of whole computations below turn `gpu_kernels.TUNE` off ("untuned"): the
# autotuner compiles all seven tilings of each attention kernel per head size, group and
# dtype (about a second each), likely what took them past their stage's 150 s in
# `gpu_checks.sh`; `test_every_tiling_on_a_gpu_computes_the_same_attention` checks each
# tiling on its own.


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_kernels_on_a_gpu(monkeypatch, dtype):
    """`interpreted_triton`'s checks of the decode step's kernels and of the update's (the
    packed attention, the token statistics, the rotary embedding and SiLU·up), compiled and
    run on a GPU, the attention untuned."""
    pytest.importorskip("triton")
    import interpreted_triton as checks

    monkeypatch.setattr(gpu_kernels, "TUNE", False)

    for normed in checks.NORMS:
        for heads, kv_heads, dim in [(4, 4, 16), (6, 2, 24), (14, 2, 64)]:
            checks.check_rotate_and_store(heads, kv_heads, dim, "cuda", dtype, normed)
        checks.check_silu_mul("cuda", dtype, normed)
    for case in checks.DECODE_ATTENTION_CASES:
        checks.check_decode_attention(*case, "cuda", dtype)
    for temperature, block in [(1.0, 512), (0.7, 1024), (1.0, 4096)]:
        for banned in (False, True):
            checks.check_sample(temperature, block, banned, "cuda", dtype)
    for heads, kv_heads, dim, t, sp in [
        (4, 4, 16, 9, 12),
        (6, 2, 24, 150, 70),
        (14, 2, 64, 300, 130),
    ]:
        checks.check_packed_attention(heads, kv_heads, dim, t, sp, "cuda", dtype)
    for temperature in (1.0, 0.7):
        for uses in ("logp", "entropy", "both"):
            checks.check_token_stats(temperature, uses, "cuda", dtype)
    checks.check_rotary_and_swiglu("cuda", dtype)
    for residual, programs in [(True, 512), (False, 512), (True, 4)]:
        checks.check_add_rms_norm("cuda", dtype, residual, programs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_grpo_update_on_a_gpu_with_the_kernels_gives_the_pytorch_gradients(monkeypatch):
    """`interpreted_triton.check_grpo_update` with the compiled kernels, in fp32, untuned."""
    pytest.importorskip("triton")
    import interpreted_triton as checks

    monkeypatch.setattr(gpu_kernels, "TUNE", False)
    checks.check_grpo_update(monkeypatch, "cuda", 1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["llama", "qwen2_gqa"])
def test_the_padding_free_forward_on_a_gpu_runs_the_packed_attention(monkeypatch, tok, name):
    """On a GPU the update's completions go through `fused.PackedOps`, and the log-probs and
    gradients (fp32) are the `transformers` forward's (the attention untuned)."""
    pytest.importorskip("triton")
    monkeypatch.setattr(gpu_kernels, "TUNE", False)
    model = MODELS[name](tok).cuda()
    mb = to_device(ragged_batch(tok), torch.device("cuda"))
    calls = []
    run = fused.PackedOps.attention_kernel
    fused.PackedOps.attention_kernel = staticmethod(lambda *a: calls.append(1) or run(*a))
    try:
        expected_lp, expected_grads = logprobs_and_grads(model, mb, enabled=False)
        lp, grads = logprobs_and_grads(model, mb, enabled=True)
    finally:
        fused.PackedOps.attention_kernel = staticmethod(run)
    torch.testing.assert_close(lp, expected_lp, rtol=0, atol=1e-4)
    for param_name, expected in expected_grads.items():
        torch.testing.assert_close(grads[param_name], expected, rtol=1e-3, atol=1e-4)
    assert len(calls) == model.config.num_hidden_layers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["llama", "qwen2_gqa"])
def test_a_micro_batch_on_a_gpu_never_waits_for_it(monkeypatch, tok, name):
    """Lever 54: a bf16 micro-batch's copy to the GPU, padding-free forward (FlashAttention-2's
    varlen plan made on the host), log-probs and backward run under PyTorch's sync debug mode
    set to raise: the host never waits for the GPU, so it can prepare the next micro-batch
    while this one runs. A first pass compiles the kernels."""
    pytest.importorskip("triton")
    monkeypatch.setattr(gpu_kernels, "TUNE", False)
    model = MODELS[name](tok).to("cuda", torch.bfloat16)
    mb = ragged_batch(tok)

    def micro_batch() -> None:
        logp, entropy = completion_token_stats(model, to_device(mb, torch.device("cuda")), 0.7)
        (logp.sum() + entropy.sum()).backward()

    micro_batch()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        micro_batch()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("queries", "keys"),
    list(zip(gpu_kernels.QUERY_TILINGS, gpu_kernels.KEY_TILINGS, strict=True)),
    ids=lambda t: f"{t.block_m}x{t.block_n}",
)
def test_every_tiling_on_a_gpu_computes_the_same_attention(monkeypatch, queries, keys):
    """Each block shape the autotuner may choose, compiled and run on a GPU in bf16, against
    the padded reference: 300 positions and 140 prefix keys (several blocks of 128 and
    partial ones), a group of 2 query heads per key head."""
    pytest.importorskip("triton")
    import interpreted_triton as checks

    monkeypatch.setattr(gpu_kernels, "TUNE", False)
    monkeypatch.setattr(gpu_kernels, "QUERY_TILINGS", (queries,))
    monkeypatch.setattr(gpu_kernels, "KEY_TILINGS", (keys,))
    checks.check_packed_attention(4, 2, 64, 300, 140, "cuda", torch.bfloat16)


HOPPER_SHARED_MEMORY = 227 * 1024
"""The shared memory one block of an H100 or H200 may take (bytes)."""


@pytest.mark.skipif(torch.cuda.is_available(), reason=ON_A_GPU)
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_the_triton_kernels_compile_for_a_hopper_gpu():
    """Each kernel of `_triton_kernels` and `models._gpu_kernels` compiles to a cubin for sm_90
    (H100/H200) with bf16 tensors, with the ptxas that ships with Triton: no GPU needed. The
    interpreter runs the kernels as NumPy code; this checks that they also lower to the GPU's,
    the attention kernels in every tiling the autotuner may pick, each within the shared
    memory of a Hopper block."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rlvr.models import _gpu_kernels as training
    from rlvr.rollout import _triton_kernels as kernels

    pointers = {
        "where": "*i64",
        "uniform": "*fp32",
        "tokens": "*i64",
        "logps": "*fp32",
        "stats": "*fp32",
        **dict.fromkeys(["rows", "row_prefix", "count"], "*i64"),
        **dict.fromkeys(["own_mask", "prefix_mask"], "*u8"),
        **dict.fromkeys(["lse", "delta", "part_dpk", "part_dpv", "logp", "entropy"], "*fp32"),
        **dict.fromkeys(["g_logp", "g_entropy"], "*fp32"),
        **dict.fromkeys(["temperature", "scale", "inverse_t", "eps"], "fp32"),
        **dict.fromkeys(["t", "sp", "n_rows", "heads", "span", "per_split", "splits"], "i32"),
        **dict.fromkeys(["partial", "rstd", "part_w"], "*fp32"),
    }
    sampling = {"HAS_BAN": True, "BLOCK": 4096}
    hidden = {"HIDDEN": 896, "BLOCK_W": 1024}  # the 0.5B's
    norm = {"NORM": True, "BIAS": True, **hidden}
    attention = {  # the 0.5B's 14 query heads of 64 over 2 key/value heads, in bf16
        "GROUP": 7, "DIM": 64, "BLOCK_D": 64, "PRECISION": "tf32"
    }  # fmt: skip
    constants = {  # kernel: (constexprs, warps), as triton_ops and gpu_kernels launch them
        kernels.rotate_and_store_kernel: (
            {"HEADS": 14, "KV_HEADS": 2, "DIM": 64, "BLOCK_H": 32, "BLOCK": 64, **norm},
            4,
        ),
        kernels.normed_silu_mul_kernel: ({"BIAS": True, "BLOCK": 1024, **hidden}, 4),
        kernels.decode_attention_merge_kernel: ({"DIM": 64, "BLOCK_S": 8, "BLOCK_D": 64}, 4),
        kernels.sample_chunk_kernel: (sampling, 8),
        kernels.sample_pick_kernel: ({**sampling, "CHUNKS": 64}, 8),
        training.token_stats_kernel: ({"WITH_ENTROPY": True, "BLOCK": 4096}, 8),
        training.logit_grad_kernel: ({"HAS_LOGP": True, "HAS_ENTROPY": True, "BLOCK": 4096}, 8),
    }
    jobs = [(kernel, *launch, 3) for kernel, launch in constants.items()]
    for split in (False, True):
        decode = {"GROUP": 7, "DIM": 64, "SPLIT": split, "PRECISION": "tf32"}
        blocks = {"BLOCK_G": 16, "BLOCK_D": 64, "BLOCK_N": triton_ops.DECODE_KEY_BLOCK}
        jobs.append((kernels.decode_attention_kernel, {**decode, **blocks}, 4, 3))
    for backward in (False, True):  # each way of the kernels with a backward flag
        rotary = {"BACKWARD": backward, "DIM": 64, "BLOCK_R": 16, "BLOCK_D": 64}
        jobs.append((training.rotary_kernel, rotary, 4, 3))
        jobs.append((training.swiglu_kernel, {"BACKWARD": backward, "BLOCK": 1024}, 4, 3))
        norm = (training.add_rms_norm_backward_kernel, {"RESIDUAL": backward, "BLOCK": 1024})
        jobs.append((*norm, 4, 3))
    jobs.append((training.add_rms_norm_kernel, {"BLOCK": 1024}, 4, 3))
    tilings = [  # every tiling the autotuner may launch: (kernel, BACKWARD flags, tilings)
        (training.attention_queries_kernel, (False, True), gpu_kernels.QUERY_TILINGS),
        (training.attention_dkv_kernel, (None,), gpu_kernels.KEY_TILINGS),
    ]
    for kernel, flags, choices in tilings:
        for flag, (m, n, warps, stages) in itertools.product(flags, choices):
            blocks = {"BLOCK_M": m, "BLOCK_N": n} | ({} if flag is None else {"BACKWARD": flag})
            jobs.append((kernel, {**attention, **blocks}, warps, stages))
    integers = ("row", "head", "position", "stride", "width", "vocab", "chunks", "prefix", "pos")
    for kernel, constexprs, warps, stages in jobs:
        signature = {}
        for name in kernel.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name in pointers:
                signature[name] = pointers[name]
            elif name.endswith(integers):
                signature[name] = "i32"
            else:
                signature[name] = "*bf16"
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        target = GPUTarget("cuda", 90, 32)
        options = {"num_warps": warps, "num_stages": stages}
        compiled = triton.compile(source, target=target, options=options)
        assert compiled.asm["cubin"], kernel.__name__
        assert compiled.metadata.shared <= HOPPER_SHARED_MEMORY, (kernel.__name__, constexprs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_steps_do_not_wait_for_the_gpu(tok):
    """Between decode steps the host waits only for the EOS flags (an event, which PyTorch's
    sync debug mode does not count): a rollout of 96 steps makes as many synchronising calls
    as one of 32 (those of its start and end), so each step is queued while the last runs."""
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128).cuda()
    e = engine(model, tok, 3, GraphState())
    prompts = [[20, 30, 40], [50, 60]]

    def forced(length: int) -> SamplingParams:
        return SamplingParams(n=4, max_new_tokens=length, min_new_tokens=length)

    e.generate(prompts, forced(96))  # captures every graph the runs below replay
    counts = []
    for length in (32, 96):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                e.generate(prompts, forced(length))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("called a synchronizing" in str(w.message) for w in caught))
    assert counts[0] > 0  # the debug mode does see the start's and the end's copies
    assert counts[0] == counts[1]


def test_the_triton_kernels_need_an_ampere_or_later_gpu(monkeypatch):
    """`gpu_kernels.usable` (which the decode step's `triton_ops.usable` is) takes a CUDA
    tensor only on compute capability 8.0 or later, where the attention kernels' shared memory
    fits, and nothing with `RLVR_GPU_KERNELS=0`."""
    pytest.importorskip("triton")
    from types import SimpleNamespace

    from rlvr.models import gpu_kernels

    on_gpu = SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0))
    monkeypatch.delenv("RLVR_GPU_KERNELS", raising=False)
    for capability, usable in (((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(gpu_kernels, "_capability", lambda index, c=capability: c)
        assert gpu_kernels.usable(on_gpu) is usable
    monkeypatch.setenv("RLVR_GPU_KERNELS", "0")
    assert gpu_kernels.usable(on_gpu) is False
    assert not gpu_kernels.usable(torch.zeros(1))  # a CPU tensor outside the interpreter


def test_swiglu_packed_refuses_an_odd_width():
    from rlvr.models import gpu_kernels

    with pytest.raises(ValueError, match=r"swiglu_packed: an odd last axis \(2, 5\)"):
        gpu_kernels.swiglu_packed(torch.zeros(2, 5))


def test_swiglu_refuses_gate_and_up_of_different_shapes():
    from rlvr.models import gpu_kernels

    with pytest.raises(ValueError, match=r"gate \(2, 3\) and up \(2, 4\)"):
        gpu_kernels.swiglu(torch.zeros(2, 3), torch.zeros(2, 4))


def test_every_way_of_the_mini_batch_ab_keeps_the_operations_call_signatures(monkeypatch):
    """`benchmarks/gpu_ab.py`'s kernels part swaps `PackedOps`' operations per way; each must
    take the arguments `FusedForward.hidden` passes, as `TorchOps`' do (a staticmethod set
    back as a plain function is bound to the instance and takes one argument fewer: the
    lever-50 A/B crashed on an H200 that way)."""
    import inspect

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    import gpu_ab

    reference = fused.TorchOps(torch.zeros(1, 1, 1, 1))
    names = ["add_rms_norm", "rotate", "silu_mul", "projections", "mlp_inner", "rms_norm"]
    try:
        for way in gpu_ab.TRAIN_KERNEL_WAYS.values():
            gpu_ab.use_train_kernels(way)
            ops = fused.PackedOps(torch.ones(1, 1), 1)
            for name in names:
                expected = inspect.signature(getattr(reference, name)).parameters
                assert list(inspect.signature(getattr(ops, name)).parameters) == list(expected)
    finally:
        gpu_ab.use_train_kernels(gpu_ab.ALL_ON)
