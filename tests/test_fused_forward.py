"""The lean forward (`rlvr.models.fused`) computes what the `transformers` model computes.

Checked on a Llama (multi-head) and a Qwen2 (grouped-query heads, q/k/v biases) model, each
also with LoRA adapters on every projection: the
training log-probs and gradients (padding-free, shared prefix), the decode samples and their
log-probs, and which models fall back to the `transformers` forward.
"""

import pytest
import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlvr.config import LoraConfig
from rlvr.models import fused, kv_cache, lora
from rlvr.models.loading import disable_dropout_
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.training.batching import (
    collate_shared_prefix,
    completion_token_stats,
    forward_logits_shared_prefix,
    packed_micro_batches,
    to_device,
    token_budget_micro_batches,
)
from rlvr.training.logprobs import token_logprobs


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def qwen2_gqa(tok) -> nn.Module:
    """4 query heads sharing 2 K/V heads, biases on q/k/v (Qwen2's layout)."""
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def llama(tok) -> nn.Module:
    return build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128, seed=3)


def with_lora(build):
    """`build`'s model with LoRA adapters on every projection, B drawn so that they matter."""

    def adapted(tok) -> nn.Module:
        model = lora.add_lora(build(tok), LoraConfig(rank=4, alpha=8.0))
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        return model

    return adapted


MODELS = {"llama": llama, "qwen2_gqa": qwen2_gqa}
ADAPTED = {"llama_lora": with_lora(llama), "qwen2_gqa_lora": with_lora(qwen2_gqa)}
CASES = {**MODELS, **ADAPTED}


def ragged_samples(g: torch.Generator) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts (lengths 5, 9, 3) with four completions each of 1..11 tokens: the 12
    samples' prompt and completion ids."""
    prompts, completions = [], []
    for length in (5, 9, 3):
        prompt = torch.randint(10, 90, (length,), generator=g).tolist()
        for _ in range(4):
            size = int(torch.randint(1, 12, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(10, 90, (size,), generator=g).tolist())
    return prompts, completions


def ragged_batch(tok, seed: int = 0):
    """`ragged_samples` collated into one shared-prefix micro-batch."""
    prompts, completions = ragged_samples(torch.Generator().manual_seed(seed))
    return collate_shared_prefix(prompts, completions, list(range(12)), tok.pad_token_id)


def logprobs_and_grads(model: nn.Module, mb, enabled: bool):
    setattr(model, fused.ENABLE_ATTR, enabled)
    model.zero_grad()
    lp = token_logprobs(forward_logits_shared_prefix(model, mb), mb.completion_ids, 0.7)
    lp = lp * mb.response_mask
    (lp * torch.linspace(-1, 1, lp.numel(), device=lp.device).view_as(lp)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return lp.detach(), grads


@pytest.mark.parametrize("name", CASES)
def test_training_logprobs_and_gradients_equal_the_transformers_forward(tok, name):
    model = CASES[name](tok)
    assert fused.supports(model)
    mb = ragged_batch(tok)
    ref_lp, ref_grads = logprobs_and_grads(model, mb, enabled=False)
    lp, grads = logprobs_and_grads(model, mb, enabled=True)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    assert (ref_lp != 0).sum() == mb.response_mask.sum()
    for param_name, ref in ref_grads.items():
        assert torch.allclose(grads[param_name], ref, atol=1e-5), param_name
    assert max(g.abs().max() for g in ref_grads.values()) > 1e-3


def test_training_runs_only_real_positions_through_the_matmuls(tok):
    """Padding-free: the embedding (and so every matmul after it) sees the distinct prompts'
    padded tokens and then exactly the completion inputs that score a real token."""
    model = llama(tok)
    mb = ragged_batch(tok)
    seen = []
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].numel())
    )
    try:
        forward_logits_shared_prefix(model, mb)
    finally:
        hook.remove()
    real_inputs = int(mb.response_mask.sum() - len(mb.rows))  # token t+1 scored by input t
    assert seen == [mb.prompt_ids.numel(), real_inputs]
    assert real_inputs < mb.completion_ids[:, :-1].numel()  # there was padding to skip


@pytest.mark.parametrize("name", CASES)
def test_decode_gives_the_same_samples_and_logprobs(tok, name):
    model = CASES[name](tok)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (4, 9, 6)]
    params = SamplingParams(n=4, temperature=0.9, max_new_tokens=16)
    outs = []
    for enabled in (False, True):
        setattr(model, fused.ENABLE_ATTR, enabled)
        assert fused.supports(model) is enabled  # the two runs take the two paths
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(5)
        )
        outs.append(engine.generate(prompts, params))
    ref, out = outs
    assert out.completion_ids == ref.completion_ids
    assert out.finish_reason == ref.finish_reason
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_decode_drops_finished_rows_and_keeps_sampling_the_live_ones(tok):
    """An EOS-heavy model: rows finish at different steps, the others continue exactly."""
    model = llama(tok)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 0.4 * model.model.embed_tokens.weight.mean(0)
    prompts = [[20, 30, 40], [50, 60]]
    outs = []
    for enabled in (False, True):
        setattr(model, fused.ENABLE_ATTR, enabled)
        assert fused.supports(model) is enabled
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(2)
        )
        outs.append(engine.generate(prompts, SamplingParams(n=6, max_new_tokens=24)))
    lengths = {len(c) for c in outs[1].completion_ids}
    assert len(lengths) > 2 and "stop" in outs[1].finish_reason
    assert outs[1].completion_ids == outs[0].completion_ids


@pytest.mark.parametrize("rows", [[0, 2, 3], [3, 1], [0, 1, 2, 3], [0, 0, 1, 1, 2, 2, 3, 3]])
def test_select_rows_copies_the_filled_positions_of_the_chosen_rows(rows):
    buffer = torch.randn(4, 2, 10, 3)
    expected = buffer[rows, :, :6].clone()
    out = kv_cache.select_rows(buffer, torch.tensor(rows), length=6)
    assert out.shape == (len(rows), 2, 10, 3)
    torch.testing.assert_close(out[:, :, :6], expected, rtol=0, atol=0)
    shares_storage = out.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    assert shares_storage is (len(rows) <= 4)  # compacted in place, or a new buffer
    out[:, :, 6:7] = 1.0  # the next decode position can be written to every row
    assert bool((out[:, :, 6] == 1.0).all())


def test_a_reused_engine_samples_what_fresh_engines_sample(tok):
    """The cache pool keeps memory between rollouts; its stale contents must never be read.

    One engine runs three rollouts of different prompt widths, group sizes and finishing
    steps; before each, every pooled storage is filled with NaN, so a read of a position that
    was not written would poison the logits. Each rollout must equal a fresh engine's with the
    same generator state, and the pool holds one storage per (keys/values, layer, slot): slot
    0 the prompts' positions, slot 2 the positions each sample decodes (`SharedPromptKV`).
    """
    model = llama(tok)
    rounds = [
        ([[20, 30, 40, 50, 60, 70], [50, 60]], SamplingParams(n=6, max_new_tokens=20)),
        ([[50, 60], [25, 35, 45]], SamplingParams(n=7, max_new_tokens=30)),
        ([[22, 32, 42], [52, 62, 72, 82], [25]], SamplingParams(n=6, max_new_tokens=24)),
    ]
    reused = HFRolloutEngine(
        model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(4)
    )
    for prompts, params in rounds:
        with torch.inference_mode():  # the rollout made them inside inference mode
            for storage in reused.kv_pool.storages.values():
                storage.fill_(float("nan"))
        state = reused.generator.get_state()
        out = reused.generate(prompts, params)
        fresh = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator()
        )
        fresh.generator.set_state(state)
        expected = fresh.generate(prompts, params)
        assert out.completion_ids == expected.completion_ids
        assert out.logprobs == expected.logprobs
        assert len({len(c) for c in out.completion_ids}) > 2  # rows finished at several steps
    layers = model.config.num_hidden_layers
    assert set(reused.kv_pool.storages) == {
        (name, layer, slot)
        for name in ("keys", "values")
        for layer in range(layers)
        for slot in (0, 2)
    }


def test_buffer_pool_reuses_and_grows_its_storage():
    pool = kv_cache.BufferPool()
    like = torch.zeros(1)
    a = pool.empty(("k", 0, 0), like, (2, 3, 4))
    b = pool.empty(("k", 0, 0), like, (1, 3, 4))  # smaller: same memory
    assert b.data_ptr() == a.data_ptr() and b.shape == (1, 3, 4)
    c = pool.empty(("k", 0, 0), like, (4, 3, 4))  # larger: a new, larger storage
    assert c.shape == (4, 3, 4) and pool.storages[("k", 0, 0)].numel() == 48
    d = pool.empty(("k", 0, 1), like, (4, 3, 4))  # another key never shares memory
    assert d.data_ptr() != c.data_ptr()
    e = pool.empty(("k", 0, 0), torch.zeros(1, dtype=torch.float64), (2, 3, 4))
    assert e.dtype == torch.float64  # another dtype: a new storage


def test_buffer_pool_reuses_a_storage_of_exactly_the_size_asked_and_not_across_devices():
    pool = kv_cache.BufferPool()
    a = pool.empty(("k", 0, 0), torch.zeros(1), (2, 3, 4))
    b = pool.empty(("k", 0, 0), torch.zeros(1), (4, 3, 2))  # 24 elements again: same memory
    assert b.data_ptr() == a.data_ptr() and b.shape == (4, 3, 2)
    c = pool.empty(("k", 0, 0), torch.zeros(1, device="meta"), (2, 3, 4))
    assert c.device.type == "meta"  # another device: a new storage there


def test_buffer_kv_writes_positions_in_place_up_to_its_capacity():
    """Keys and values (of their own width) are written at [length, length + t) and the filled
    part returned; a write past the capacity is refused, one that fills it exactly is not."""
    cache = kv_cache.BufferKV(1, capacity=5)
    k1 = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 1, 2, 3)
    v1 = torch.arange(2 * 2 * 4, dtype=torch.float32).view(2, 1, 2, 4)
    k, v = cache.update(0, k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1)
    cache.length = 2  # as the forward advances it
    k2, v2 = torch.full((2, 1, 3, 3), 7.0), torch.full((2, 1, 3, 4), -7.0)
    k, v = cache.update(0, k2, v2)  # positions 2, 3, 4: exactly full
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], 2))
    cache.length = 5
    with pytest.raises(ValueError, match="KV cache of 5 positions is full"):
        cache.update(0, k2[:, :, :1], v2[:, :, :1])


def test_a_pooled_cache_repeats_rows_into_the_other_slot_not_over_its_source():
    """A prompt's cache repeated for its samples is taken from the pool's slot 1 while the
    prompts' keys are in slot 0, so it never shares their memory, also in a second rollout
    whose slot 0 the first one left large enough for the repeated rows, and after a
    selection that kept every row."""
    pool = kv_cache.BufferPool()
    prompt_keys = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    for _ in range(2):
        cache = kv_cache.BufferKV(1, 4, pool)
        cache.update(0, prompt_keys, -prompt_keys)
        cache.length = 3
        cache.batch_select_indices(torch.tensor([0, 1]))  # every row kept: stays in place
        source = cache.keys[0]
        cache.batch_select_indices(torch.tensor([0, 0, 1, 1]))
        assert cache.keys[0].data_ptr() != source.data_ptr()
        assert cache.keys[0].data_ptr() == pool.storages[("keys", 0, 1)].data_ptr()
        assert torch.equal(cache.keys[0][:, :, :3], prompt_keys[[0, 0, 1, 1]])
        assert torch.equal(cache.values[0][:, :, :3], -prompt_keys[[0, 0, 1, 1]])


class WrappedLinear(nn.Linear):
    """Stands for an adapter or quantised layer: its forward is not a plain matmul."""


def test_unsupported_models_use_the_transformers_forward(tok):
    plain = llama(tok)
    assert fused.supports(plain)
    setattr(plain, fused.ENABLE_ATTR, False)  # model.fused_forward: false
    assert not fused.supports(plain)

    wrapped = llama(tok)
    old = wrapped.model.layers[0].self_attn.q_proj
    wrapped.model.layers[0].self_attn.q_proj = WrappedLinear(old.in_features, old.out_features)
    assert not fused.supports(wrapped)

    windowed = MistralForCausalLM(
        MistralConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            sliding_window=16,
        )
    )
    assert not fused.supports(windowed)
    dropout = llama(tok)
    dropout.model.layers[0].self_attn.attention_dropout = 0.1  # the fused attention has none
    assert not fused.supports(dropout)
    disable_dropout_(dropout)  # model.disable_dropout (the default)
    assert fused.supports(dropout)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    assert not fused.supports(gpt2)
    # and the training path still works on the fallback
    mb = ragged_batch(tok)
    assert forward_logits_shared_prefix(gpt2, mb).shape == (*mb.completion_ids.shape, len(tok))


def small_llama(tok, **settings) -> nn.Module:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        **settings,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    "settings",
    [
        {"hidden_act": "gelu"},  # the fused MLP is SwiGLU only
        {"pretraining_tp": 2},  # transformers then splits each projection into slices
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},  # depends on the length
    ],
)
def test_llama_settings_outside_the_fused_forward_use_the_transformers_forward(tok, settings):
    assert fused.supports(small_llama(tok))
    assert not fused.supports(small_llama(tok, **settings))


def test_the_fused_forward_norms_with_the_models_epsilon(tok):
    # an RMSNorm epsilon of 0.5, far above the hidden states' mean square (about 4e-4 at
    # initialisation), changes every norm: the log-probs agree only if the fused one reads it
    model = small_llama(tok, rms_norm_eps=0.5)
    mb = ragged_batch(tok)
    ref, _ = logprobs_and_grads(model, mb, enabled=False)
    lp, _ = logprobs_and_grads(model, mb, enabled=True)
    torch.testing.assert_close(lp, ref)


class ScaledEmbedding(nn.Embedding):
    """Stands for an embedding whose forward is not a plain lookup (Gemma scales it)."""


def test_a_custom_embedding_uses_the_transformers_forward_and_qwen2s_unused_window_not(tok):
    model = llama(tok)
    old = model.model.embed_tokens
    model.model.embed_tokens = ScaledEmbedding(old.num_embeddings, old.embedding_dim)
    assert not fused.supports(model)
    # Qwen2 checkpoints carry a sliding_window with use_sliding_window false (transformers 4
    # keeps the number): every layer then attends in full, as the fused forward does
    qwen2 = qwen2_gqa(tok)
    qwen2.config.sliding_window = 4096
    assert not qwen2.config.use_sliding_window and fused.supports(qwen2)


def test_adapters_run_by_their_own_forward_never_packed_and_never_on_the_lm_head(tok):
    model = ADAPTED["llama_lora"](tok)
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, attn.q_proj.in_features)
    assert fused.packed_linear(x, attn.q_proj, attn.k_proj) is None  # would drop B·A
    plain = llama(tok).model.layers[0].self_attn
    packed = fused.packed_linear(x, plain.q_proj, plain.k_proj)
    torch.testing.assert_close(packed, torch.cat([plain.q_proj(x), plain.k_proj(x)], -1))
    head = lora.add_lora(qwen2_gqa(tok), LoraConfig(rank=2, target_modules=["q_proj", "lm_head"]))
    assert not fused.supports(head)  # the chunked log-probs read the head's weight


def test_packed_projections_keep_their_biases(tok):
    attn = qwen2_gqa(tok).model.layers[0].self_attn  # q, k, v with (nonzero) biases
    x = torch.randn(3, attn.q_proj.in_features)
    each = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
    packed = fused.packed_linear(x, attn.q_proj, attn.k_proj, attn.v_proj)
    torch.testing.assert_close(packed, torch.cat(each, -1))
    assert fused.packed_linear(x, attn.q_proj, attn.o_proj) is None  # o_proj has no bias


def test_packed_micro_batches_count_each_prompt_once_and_only_real_tokens():
    groups, prompts = [0, 0, 0, 1, 1], [10] * 5
    completions = [5, 5, 5, 20, 20]
    # 10 + 5 + 5 + 5 = 25 fits 30; group 1 costs 10 + 20 = 30, then 20 more: a cut each time
    assert packed_micro_batches(list(range(5)), groups, prompts, completions, 30) == [
        [0, 1, 2],
        [3],
        [4],
    ]
    # at 60 the second group's prompt is counted once: 25 + 30 = 55, then + 20 = 75 > 60
    assert packed_micro_batches(list(range(5)), groups, prompts, completions, 60) == [
        [0, 1, 2, 3],
        [4],
    ]
    # the padded layout (rows x longest completion) stays within 3 x the budget: 34 real
    # tokens fit 40, but 5 rows x 30 = 150 slots > 120
    ragged = packed_micro_batches(list(range(5)), [0] * 5, [0] * 5, [1, 1, 1, 1, 30], 40)
    assert ragged == [[0, 1, 2, 3], [4]]
    # a row over the budget on its own
    assert packed_micro_batches([0, 1], [0, 1], [5, 5], [100, 1], 30) == [[0], [1]]


def test_token_budget_micro_batches_sort_by_length():
    lengths = [30, 5, 28, 6, 29, 4]
    assert token_budget_micro_batches(list(range(6)), lengths, 60) == [[5, 1, 3], [2, 4], [0]]


@pytest.mark.parametrize("name", CASES)
def test_bfloat16_models_agree_with_the_transformers_forward(tok, name):
    """bf16 training (the GPU setting): same log-probs as the HF forward in bf16, and both
    within bf16 rounding of the fp32 model."""
    model = CASES[name](tok)
    mb = ragged_batch(tok)
    fp32, _ = logprobs_and_grads(model, mb, enabled=False)
    model = model.to(torch.bfloat16)
    ref, ref_grads = logprobs_and_grads(model, mb, enabled=False)
    lp, grads = logprobs_and_grads(model, mb, enabled=True)
    assert lp.dtype == torch.float32  # log-probs are taken in fp32 from bf16 logits
    assert torch.allclose(lp, ref, atol=2e-2)
    assert 0 < (lp - fp32).abs().max() < 5e-2
    for param_name, g in ref_grads.items():
        assert grads[param_name].dtype == torch.bfloat16
        assert torch.allclose(grads[param_name].float(), g.float(), atol=2e-2, rtol=5e-2)


def saved_for_backward(model: nn.Module, mb) -> dict[int, tuple[int, torch.Size]]:
    """The storages autograd keeps for backward during the shared-prefix forward: address ->
    (bytes, shape of a tensor saved from it)."""
    saved = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_logits_shared_prefix(model, mb)
    return saved


@pytest.mark.parametrize("name", CASES)
def test_activation_checkpointing_keeps_less_and_gives_the_same_gradients(
    tok, name, recomputed_regions
):
    model = CASES[name](tok)
    mb = ragged_batch(tok)
    kept = saved_for_backward(model, mb)
    lp, grads = logprobs_and_grads(model, mb, enabled=True)
    assert not recomputed_regions  # off until enabled

    fused.enable_activation_checkpointing(model)
    kept_checkpointed = saved_for_backward(model, mb)
    # what a checkpointed forward holds: the tensors saved outside the regions, plus each
    # region's inputs
    held = {address: size for address, (size, _) in kept_checkpointed.items()}
    for _, inputs in recomputed_regions:
        held.update(inputs)
    names = [name for name, _ in recomputed_regions]
    # two regions per layer and forward pass (the prompts, then the completions)
    assert names.count("qkv") == names.count("rest") == 2 * len(model.model.layers)
    # a layer's two regions keep one stream tensor between them, not the stream and its norm
    pairs = zip(recomputed_regions[::2], recomputed_regions[1::2], strict=True)
    for (first, qkv_inputs), (second, rest_inputs) in pairs:
        assert (first, second) == ("qkv", "rest") and set(qkv_inputs) <= set(rest_inputs)
    ck_lp, ck_grads = logprobs_and_grads(model, mb, enabled=True)
    assert torch.equal(ck_lp, lp)
    for param_name, ref in grads.items():
        assert torch.equal(ck_grads[param_name], ref), param_name
    mlp_width = model.config.intermediate_size
    assert any(shape[-1] == mlp_width for _, shape in kept.values())
    assert not any(shape[-1] == mlp_width for _, shape in kept_checkpointed.values())
    assert sum(held.values()) < 0.5 * sum(size for size, _ in kept.values())


def test_activation_checkpointing_follows_the_layers_own_flag_and_needs_gradients(tok):
    model = llama(tok)
    layer = model.model.layers[0]
    assert not fused.recompute_in_backward(model, layer)
    layer.gradient_checkpointing = True  # what model.gradient_checkpointing_enable() sets
    assert fused.recompute_in_backward(model, layer)
    with torch.no_grad():
        assert not fused.recompute_in_backward(model, layer)


def test_activation_checkpointing_refuses_models_outside_the_fused_forward(tok):
    model = llama(tok)
    setattr(model, fused.ENABLE_ATTR, False)
    with pytest.raises(ValueError, match="fused forward"):
        fused.enable_activation_checkpointing(model)
    assert not getattr(model, fused.CHECKPOINT_ATTR, False)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_short_cpu_attention_with_explicit_scores_equals_the_fused_kernel(
    monkeypatch: pytest.MonkeyPatch, kv_heads: int
) -> None:
    """Short fp32 queries on a CPU take explicit scores (`fused.SMALL_ATTENTION`); values and
    gradients equal those of PyTorch's scaled-dot-product kernel under the same mask, with
    grouped heads, padded keys and a causal block."""
    g = torch.Generator().manual_seed(5)
    b, t, s, d = 3, 6, 9, 8
    q = torch.randn(b, 4, t, d, generator=g, requires_grad=True)
    k = torch.randn(b, kv_heads, s, d, generator=g, requires_grad=True)
    v = torch.randn(b, kv_heads, s, d, generator=g, requires_grad=True)
    key_mask = torch.ones(b, s)
    key_mask[0, :2] = 0  # a left-padded prompt
    bias = fused.mask_bias(key_mask, t, torch.float32)
    upstream = torch.randn(b, 4, t, d, generator=g)

    def run() -> list[torch.Tensor]:
        out = fused.attention(q, k, v, bias, 0.35)
        return [out, *torch.autograd.grad(out, (q, k, v), upstream)]

    explicit = run()
    monkeypatch.setattr(fused, "SMALL_ATTENTION", (0, 0))
    kernel = run()
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, scale=0.35, enable_gqa=kv_heads != 4
    )
    torch.testing.assert_close(kernel[0], expected)
    for got, want in zip(explicit, kernel, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert explicit[0][0, 0, 0].abs().sum() > 0


def test_cpu_queries_up_to_48_positions_take_explicit_scores(monkeypatch):
    """`SMALL_ATTENTION` (lever 18): fp32 queries of 2 to 48 positions on a CPU skip PyTorch's
    scaled-dot-product kernel, a 49th position takes it."""
    kernel, lengths = torch.nn.functional.scaled_dot_product_attention, []

    def counted(q, *args, **kwargs):
        lengths.append(q.shape[2])
        return kernel(q, *args, **kwargs)

    monkeypatch.setattr(fused.F, "scaled_dot_product_attention", counted)
    for t in (2, 48, 49):
        q, k = torch.randn(1, 2, t, 4), torch.randn(1, 2, t, 4)
        fused.attention(q, k, k, fused.mask_bias(torch.ones(1, t), t, torch.float32), 0.5)
    assert lengths == [49]


@pytest.mark.parametrize("name", CASES)
def test_the_padding_free_forward_and_backward_never_read_the_device_back(tok, name):
    """Lever 54: with the model and the micro-batch's tensors on PyTorch's meta device, where
    every read of a value (`nonzero`, `bool`, `int`) raises, `completion_token_stats` and its
    backward still run: the positions, masks and token checks come from the CPU batch
    (`SharedPrefixBatch.host`), so on a GPU the host never waits for the device there. The
    shapes are the CPU run's."""
    model = CASES[name](tok)
    mb = ragged_batch(tok)
    want, _ = completion_token_stats(model, to_device(mb, torch.device("cpu")), 0.7)
    model.to("meta")
    sb = to_device(mb, torch.device("meta"))
    assert sb.host is mb and sb.completion_ids.is_meta
    logp, entropy = completion_token_stats(model, sb, 0.7)
    (logp.sum() + entropy.sum()).backward()
    assert logp.is_meta and logp.shape == entropy.shape == want.shape
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and p.grad.is_meta for p in trained)


def test_a_prompt_whose_samples_all_left_the_batch_gets_an_empty_group():
    """`prefix_layout` with `select` [0, 0, 1, 1] of 3 prompts (prompt 2's rows dropped, as
    finished rows are in decoding): prompt 2 owns rows 4..4, none, and its key-mask row is a
    placeholder read from the last row, not from past the batch's 4 rows."""
    key_mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    layout, gather = fused.prefix_layout(key_mask, 1, None, torch.tensor([0, 0, 1, 1]), 3)
    assert not gather and layout.starts.tolist() == [0, 2, 4, 4]
    assert layout.prefix_mask.tolist() == [[0, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert layout.own_mask.tolist() == [[1]] * 4 and layout.rows.tolist() == [[0], [1], [2], [3]]


def test_a_forward_lays_its_attention_out_once_for_all_its_layers(tok, monkeypatch):
    layouts = []
    made = fused.prefix_layout
    monkeypatch.setattr(fused, "prefix_layout", lambda *args: layouts.append(1) or made(*args))
    forward_logits_shared_prefix(llama(tok), ragged_batch(tok))  # 2 layers
    assert len(layouts) == 2  # the prompts' forward and the completions', not one a layer


def layout_case(order: str) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """A completion forward's key mask [4, 3 + 5] (prompt keys left-padded), its computed
    positions (ragged rows of 5, 2, 4 and 1) and each row's prompt, in group order or not."""
    select = torch.tensor([0, 0, 1, 1] if order == "in order" else [1, 0, 1, 0])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    lengths = torch.tensor([5, 2, 4, 1])
    real = torch.arange(5)[None, :] < lengths[:, None]
    key_mask = torch.cat([prompt_mask[select], torch.ones(4, 5, dtype=torch.long)], dim=1)
    return key_mask, 5, fused.real_positions(real), select


def layout_tensors(layout) -> dict[str, torch.Tensor]:
    return {k: v for k, v in vars(layout).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("order", ["in order", "shuffled"])
def test_a_layout_made_on_the_host_is_the_devices_and_is_sent_without_a_read(order):
    """`KernelOps._layout` with a `HostIndex` (lever 54) gives the layout made from the
    device's tensors (every tensor, the query count and whether rows gather their prompt's
    keys), with the FlashAttention-2 plan made on the host for `PackedOps` where its keys are
    bf16 (and not where they are fp32, for which the plan goes unread, nor for `KernelOps`);
    and with the device tensors on the meta device, where a read raises, the layout arrives
    there whole."""
    key_mask, t, flat, select = layout_case(order)
    keys = torch.zeros(int(flat.numel()), 2, 16, dtype=torch.bfloat16)
    device_made = fused.KernelOps(key_mask, t, flat)
    want = device_made._layout(select, 2, keys)
    host = fused.HostIndex(key_mask, flat, select, lambda x: x)
    ops = fused.PackedOps(key_mask, t, flat, host)
    got = ops._layout(select, 2, keys)
    assert ops.gather == device_made.gather == (order == "shuffled")
    assert got.queries == want.queries == int(flat.numel())
    for name, tensor in layout_tensors(want).items():
        assert torch.equal(layout_tensors(got)[name], tensor), name
    assert "varlen" in vars(got) and "varlen" not in vars(want)
    for got_part, want_part in zip(got.varlen, want.varlen, strict=True):
        assert (
            torch.equal(got_part, want_part)
            if torch.is_tensor(want_part)
            else got_part == want_part
        )
    fp32 = fused.PackedOps(key_mask, t, flat, host)._layout(select, 2, keys.float())
    assert "varlen" not in vars(fp32)
    kernels = fused.KernelOps(key_mask, t, flat, host)._layout(select, 2, keys)
    assert "varlen" not in vars(kernels)

    meta = fused.HostIndex(key_mask, flat, select, lambda x: x.to("meta"))
    ops = fused.PackedOps(key_mask.to("meta"), t, flat.to("meta"), meta)
    sent = ops._layout(select.to("meta"), 2, keys.to("meta"))
    assert ops.gather == (order == "shuffled")
    assert sent.queries == want.queries
    for name, tensor in layout_tensors(want).items():
        assert (
            layout_tensors(sent)[name].is_meta and layout_tensors(sent)[name].shape == tensor.shape
        )
    assert all(x.is_meta for x in sent.varlen if torch.is_tensor(x))


def test_a_one_token_prompt_is_scored_without_gradient_as_with_the_model_s_own_forward():
    """The prompt's forward is one position long with nothing cached: not a decode step (the
    decode kernels refused its keys, which a `ConcatKV` hands back in the projection's
    strides)."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    sb = collate_shared_prefix([[25], [23]], [[37, 38, 39], [34, 35]], [0, 1], tok.pad_token_id)
    with torch.no_grad():
        lean, _ = completion_token_stats(model, sb, 1.0, with_entropy=False)
        for row, ids in enumerate(([25, 37, 38, 39], [23, 34, 35])):
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            own = logits.log_softmax(-1)[0:-1].gather(-1, torch.tensor(ids[1:])[:, None])
            torch.testing.assert_close(lean[row, : len(ids) - 1], own[:, 0], atol=1e-5, rtol=1e-5)
