"""The C kernels of a CPU decode step (`rlvr.models.cpu_kernels`) compute what the PyTorch
operations compute, are used exactly where they may be, and a failed build falls back with a
message that names the compiler or the source."""

import logging
import platform
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlvr.models import cpu_kernels, fused, gpu_kernels, kv_cache
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import FusedDecoder, HFRolloutEngine

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None, reason="no C compiler to build the kernels"
)


@pytest.fixture
def ops():
    """Kernels over a [3, 7] key mask with some keys hidden (the last key always visible)."""
    visible = torch.ones(3, 7, dtype=torch.bool)
    visible[0, :2] = False
    visible[2, 3] = False
    with torch.inference_mode():
        return cpu_kernels.DecodeOps(visible), visible


@needs_compiler
@pytest.mark.parametrize("rows", [5, 400])  # 400 rows cross the kernels' parallel threshold
def test_rms_norm_rotary_and_silu_mul_equal_the_torch_operations(rows):
    g = torch.Generator().manual_seed(0)
    kernels = cpu_kernels.DecodeOps(torch.ones(1, 1, dtype=torch.bool))
    x, weight = torch.randn(rows, 1, 96, generator=g), torch.rand(96, generator=g) + 0.5
    expected = fused.TorchOps.rms_norm(x, weight, 1e-6)
    assert torch.allclose(kernels.rms_norm(x, weight, 1e-6), expected, rtol=1e-5, atol=1e-6)
    # by hand: x / sqrt(mean(x²) + eps) · w
    by_hand = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * weight
    assert torch.allclose(expected, by_hand, rtol=1e-5, atol=1e-6)

    heads, dim = 3, 16
    q = torch.randn(rows, 1, heads, dim, generator=g)
    angles = torch.rand(rows, 1, 1, dim // 2, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    expected = fused.rotate(q, cos, sin)
    rotated = kernels.rotate(q.clone(), cos, sin)
    assert torch.allclose(rotated, expected, atol=1e-6)
    # x [tokens, heads, dim] as well: the heads and head size are the last two axes
    flat = kernels.rotate(q[:, 0].clone(), cos[:, 0], sin[:, 0])
    assert torch.allclose(flat, expected[:, 0], atol=1e-6)
    # a rotation keeps each half-pair's norm
    pair_norm = q[..., :8].pow(2) + q[..., 8:].pow(2)
    assert torch.allclose(rotated[..., :8].pow(2) + rotated[..., 8:].pow(2), pair_norm, atol=1e-5)

    gate, up = torch.randn(rows, 1, 48, generator=g), torch.randn(rows, 1, 48, generator=g)
    expected = gate * torch.sigmoid(gate) * up
    assert torch.allclose(kernels.silu_mul(gate.clone(), up), expected, atol=1e-6)


@needs_compiler
@pytest.mark.parametrize("q_heads, kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("dim", [8, 48, 64, 128])  # the kernel has its own loops for 48/64/128
def test_decode_attention_equals_the_torch_attention_on_a_cache_view(ops, q_heads, kv_heads, dim):
    """Keys and values are the first 7 of 11 positions of a [3, kv_heads, 11, dim] cache, some
    keys masked, grouped-query heads included."""
    kernels, visible = ops
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(3, kv_heads, 11, dim, generator=g)[:, :, :7]
    values = torch.randn(3, kv_heads, 11, dim, generator=g)[:, :, :7]
    q = torch.randn(3, q_heads, 1, dim, generator=g)
    bias = torch.zeros(3, 1, 1, 7).masked_fill(~visible.view(3, 1, 1, 7), float("-inf"))
    expected = fused.attention(q, keys, values, bias, 0.3)
    out = kernels.attention(q, keys, values, scale=0.3)
    assert torch.allclose(out, expected, atol=1e-6)
    # an independent formula for row 0, query head 1 (key/value head 1 // group)
    head = 1 // (q_heads // kv_heads)
    scores = (keys[0, head] @ q[0, 1, 0]) * 0.3
    weights = scores.masked_fill(~visible[0], float("-inf")).softmax(-1)
    assert torch.allclose(out[0, 1, 0], weights @ values[0, head], atol=1e-6)
    assert weights[:2].sum() == 0  # the hidden keys got no weight


@needs_compiler
def test_decode_attention_gives_hidden_keys_no_weight_whatever_their_scores():
    """Row 0 sees only its last key, whose score is far below the hidden ones' (the kernel
    gives a hidden key the score -3e38, whose exp is 0): its output is that key's value
    exactly. Row 1 sees every key."""
    visible = torch.zeros(2, 5, dtype=torch.bool)
    visible[0, -1] = True
    visible[1] = True
    kernels = cpu_kernels.DecodeOps(visible)
    keys = torch.ones(2, 1, 5, 48)
    keys[:, :, -1] = -1.0
    values = torch.randn(2, 1, 5, 48, generator=torch.Generator().manual_seed(2))
    q = torch.full((2, 1, 1, 48), 50.0)  # scores: 2,400 for the hidden keys, -2,400 for the last
    out = kernels.attention(q, keys, values, scale=1.0)
    assert torch.equal(out[0, 0, 0], values[0, 0, -1])
    # row 1: the last key's weight is exp(-4800) / (4 + exp(-4800)) = 0 in fp32
    assert torch.allclose(out[1, 0, 0], values[1, 0, :4].mean(0), atol=1e-6)


@needs_compiler
@pytest.mark.parametrize("q_heads, kv_heads, dim", [(4, 4, 48), (4, 2, 8)])
def test_decode_attention_reads_a_shared_prompt_as_if_each_row_had_a_copy(q_heads, kv_heads, dim):
    """Rows 0-1 share prompt 0 and rows 2-4 prompt 1, whose first key is hidden (left padding);
    each row has 3 positions of its own, one hidden in row 3. Reading the prompts' keys in
    place gives, to the bit, what a cache holding each row's copy gives, and the masked
    attention of `fused.attention`."""
    g = torch.Generator().manual_seed(5)
    plen, own = 4, 3
    prompt_k = torch.randn(2, kv_heads, 9, dim, generator=g)[:, :, :plen]  # views of a cache
    prompt_v = torch.randn(2, kv_heads, 9, dim, generator=g)[:, :, :plen]
    prompt_of = torch.tensor([0, 0, 1, 1, 1])
    keys = torch.randn(5, kv_heads, 6, dim, generator=g)[:, :, :own]
    values = torch.randn(5, kv_heads, 6, dim, generator=g)[:, :, :own]
    q = torch.randn(5, q_heads, 1, dim, generator=g)
    visible = torch.ones(5, plen + own, dtype=torch.bool)
    visible[2:, 0] = False
    visible[3, plen + 1] = False
    kernels = cpu_kernels.DecodeOps(visible)
    shared = kernels.attention(q, keys, values, prompt_k, prompt_v, prompt_of, scale=0.3)
    copied_k = torch.cat([prompt_k[prompt_of], keys], dim=2)
    copied_v = torch.cat([prompt_v[prompt_of], values], dim=2)
    assert torch.equal(shared, kernels.attention(q, copied_k, copied_v, scale=0.3))
    bias = torch.zeros(5, 1, 1, plen + own).masked_fill(~visible.view(5, 1, 1, -1), float("-inf"))
    expected = fused.attention(q, copied_k, copied_v, bias, 0.3)
    assert torch.allclose(shared, expected, atol=1e-6)
    assert not torch.allclose(shared[2], shared[0], atol=1e-3)  # the rows read their own prompt


@needs_compiler
def test_a_shared_prompt_that_does_not_fit_is_refused():
    kernels = cpu_kernels.DecodeOps(torch.ones(2, 5, dtype=torch.bool))
    q, k = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 3, 8)
    prompts, rows = torch.randn(1, 2, 2, 8), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="prompt keys, values or rows do not match"):
        kernels.attention(q, k, k, prompts, prompts, rows.int(), scale=1.0)
    with pytest.raises(ValueError, match="prompt keys, values or rows do not match"):
        kernels.attention(q, k, k, prompts, prompts, torch.tensor([0]), scale=1.0)
    with pytest.raises(ValueError, match="prompt keys, values or rows do not match"):
        kernels.attention(q, k, k, prompts[:, :1], prompts[:, :1], rows, scale=1.0)
    with pytest.raises(ValueError, match="a row's prompt is not given"):
        kernels.attention(q, k, k, prompts, prompts, torch.tensor([0, 1]), scale=1.0)
    with pytest.raises(ValueError, match="a row's prompt is not given"):
        kernels.attention(q, k, k, prompts, prompts, torch.tensor([-1, 0]), scale=1.0)
    with pytest.raises(ValueError, match="mask does not match the keys"):
        kernels.attention(q, k[:, :, :2], k[:, :, :2], prompts, prompts, rows, scale=1.0)
    assert kernels.attention(q, k, k, prompts, prompts, rows, scale=1.0).shape == q.shape
    finished = cpu_kernels.DecodeOps(torch.ones(0, 5, dtype=torch.bool))  # no row left
    out = finished.attention(q[:0], k[:0], k[:0], prompts, prompts, rows[:0], scale=1.0)
    assert out.shape == (0, 2, 1, 8)


def test_a_shared_prompt_cache_refuses_rows_it_cannot_hold():
    prompts = kv_cache.BufferKV(1, 6)
    prompts.update(0, torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    prompts.length = 3
    cache = kv_cache.SharedPromptKV(prompts, torch.tensor([0, 0, 1, 1]))
    assert cache.length == 3
    cache.length += 1  # as the forward advances it
    assert (cache.length, cache.own.length) == (4, 1)
    with pytest.raises(ValueError, match="rows can leave the batch, not be repeated"):
        cache.batch_select_indices(torch.tensor([0, 0, 1, 2, 3]))
    cache.batch_select_indices(torch.tensor([1, 3]))
    assert cache.prompt_of.tolist() == [0, 1]


def test_a_shared_prompt_cache_decodes_into_the_positions_left_after_the_prompt():
    """Each row's own buffer holds capacity - prompt length positions (6 - 3 here): the
    update returns the rows' own positions, the prompts' 3 and `prompt_of`; keeping every row
    is allowed, and a 4th own position is refused."""
    prompts = kv_cache.BufferKV(1, 6)
    prompt_keys = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    prompts.update(0, prompt_keys, -prompt_keys)
    prompts.length = 3
    cache = kv_cache.SharedPromptKV(prompts, torch.tensor([0, 0, 1, 1]))
    step = torch.arange(4 * 4, dtype=torch.float32).view(4, 1, 1, 4) + 100
    own_k, own_v, pk, pv, prompt_of = cache.update(0, step, -step)
    assert torch.equal(own_k, step) and torch.equal(own_v, -step)
    assert torch.equal(pk, prompt_keys) and torch.equal(pv, -prompt_keys)
    assert prompt_of.tolist() == [0, 0, 1, 1]
    cache.length += 1
    cache.batch_select_indices(torch.tensor([0, 1, 2, 3]))  # no row finished: all kept
    two = torch.ones(4, 1, 2, 4)
    own_k, *_ = cache.update(0, two, two)
    assert torch.equal(own_k, torch.cat([step, two], dim=2))
    cache.length += 2
    assert (cache.length, cache.own.length) == (6, 3)
    with pytest.raises(ValueError, match="KV cache of 3 positions is full"):
        cache.update(0, step, step)


@needs_compiler
def test_bad_layouts_are_refused_with_the_operation_named(ops):
    kernels, _ = ops
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="rms_norm needs contiguous input"):
        kernels.rms_norm(x.t(), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="silu_mul: gate and up differ"):
        kernels.silu_mul(torch.randn(3), torch.randn(4))
    with pytest.raises(ValueError, match="one cos/sin row per token"):
        kernels.rotate(torch.randn(2, 1, 2, 8), torch.ones(3, 1, 1, 8), torch.ones(3, 1, 1, 8))
    k = torch.randn(3, 2, 8, 7).transpose(-1, -2)  # positions not dense
    with pytest.raises(ValueError, match="cache positions not dense"):
        kernels.attention(torch.randn(3, 2, 1, 8), k, k, scale=1.0)
    k = torch.randn(3, 2, 5, 8)
    with pytest.raises(ValueError, match="mask does not match the keys"):
        kernels.attention(torch.randn(3, 2, 1, 8), k, k, scale=1.0)
    # each input checked alone, the others fitting: a kernel reading it flat would misread it
    cos = torch.ones(2, 1, 1, 16)[..., :8]
    with pytest.raises(ValueError, match="rotate needs contiguous input"):
        kernels.rotate(torch.randn(2, 1, 2, 8), cos, torch.ones(2, 1, 1, 8))
    with pytest.raises(ValueError, match="silu_mul needs contiguous input"):
        kernels.silu_mul(torch.randn(4, 3), torch.randn(3, 4).t())
    k = torch.randn(3, 2, 7, 8)
    with pytest.raises(ValueError, match="one contiguous query per row"):
        kernels.attention(torch.randn(3, 2, 1, 16)[..., :8], k, k, scale=1.0)
    with pytest.raises(ValueError, match="one contiguous query per row"):
        kernels.attention(torch.randn(3, 2, 2, 8), k, k, scale=1.0)
    k = torch.randn(3, 2, 7, 16)[..., :8]  # each key's first half: positions 16 floats apart
    with pytest.raises(ValueError, match="cache positions not dense"):
        kernels.attention(torch.randn(3, 2, 1, 8), k, k, scale=1.0)


@needs_compiler
def test_kernels_run_only_for_cpu_fp32_decode_steps_outside_autograd(monkeypatch):
    h, mask = torch.randn(2, 1, 8), torch.ones(2, 5)
    with torch.inference_mode():
        assert isinstance(fused.layer_ops(h, mask, 1), cpu_kernels.DecodeOps)
        assert isinstance(fused.layer_ops(h, mask, 2), fused.TorchOps)  # a prefill
        padding_free = fused.layer_ops(h, mask, 1, torch.tensor([1]))
        assert isinstance(padding_free, fused.TorchOps)
        assert isinstance(fused.layer_ops(h.double(), mask, 1), fused.TorchOps)
        monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "0")
        assert isinstance(fused.layer_ops(h, mask, 1), fused.TorchOps)
    monkeypatch.delenv(cpu_kernels.DISABLE_ENV)
    assert isinstance(fused.layer_ops(h, mask, 1), fused.TorchOps)  # autograd on


@needs_compiler
def test_a_rollout_with_the_kernels_samples_what_the_torch_operations_sample(monkeypatch):
    """Same seed, with and without the kernels: the same tokens (rows finishing at many steps)
    and the same sampling log-probs to fp32 rounding."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (4, 9, 6)]
    params = SamplingParams(n=4, temperature=0.9, max_new_tokens=24)
    outs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(cpu_kernels.DISABLE_ENV, setting)
        generator = torch.Generator().manual_seed(4)
        engine = HFRolloutEngine(model, [20, 21], tok.pad_token_id, generator=generator)
        outs[setting] = engine.generate(prompts, params)
    ref, out = outs["0"], outs["1"]
    assert len({len(c) for c in out.completion_ids}) > 2  # rows left the batch at many steps
    assert out.completion_ids == ref.completion_ids
    for a, b in zip(out.logprobs, ref.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


@needs_compiler
def test_a_rollout_with_shared_prompts_samples_what_copied_prompts_sample(monkeypatch):
    """Same seed, with each prompt's cache shared by its samples (`kv_cache.SharedPromptKV`) and
    copied into each: the same tokens and log-probs, bit for bit, with rows finishing at many
    steps (the rows' own positions compacted, the prompts' left in place); one sample per
    prompt repeats nothing, so it shares nothing."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (4, 9, 6)]
    made = []
    shared_cache = kv_cache.SharedPromptKV

    def counted(*args, **kwargs):
        made.append(args[1].tolist())
        return shared_cache(*args, **kwargs)

    monkeypatch.setattr(kv_cache, "SharedPromptKV", counted)
    for n in (4, 1):
        params = SamplingParams(n=n, temperature=0.9, max_new_tokens=24)
        outs = []
        for share in (False, True):
            monkeypatch.setattr(FusedDecoder, "share_prompts", share)
            made.clear()
            engine = HFRolloutEngine(
                model, [20, 21], tok.pad_token_id, generator=torch.Generator().manual_seed(4)
            )
            outs.append(engine.generate(prompts, params))
            assert made == ([[0] * 4 + [1] * 4 + [2] * 4] if share and n > 1 else [])
        copied, shared = outs
        assert shared.completion_ids == copied.completion_ids
        assert shared.logprobs == copied.logprobs
    assert len({len(c) for c in shared.completion_ids}) > 1


def test_a_missing_compiler_falls_back_with_a_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv(cpu_kernels.CACHE_ENV, str(tmp_path / "cache"))
    cpu_kernels.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
            assert cpu_kernels.load() is None
        assert "no-such-cc" in caplog.text and "not found" in caplog.text
        with torch.inference_mode():
            assert not cpu_kernels.usable(torch.randn(2))
    finally:
        cpu_kernels.load.cache_clear()
    assert not (tmp_path / "cache").exists()


@needs_compiler
def test_a_source_that_does_not_compile_is_reported_with_the_compiler_message(
    monkeypatch, tmp_path
):
    broken = tmp_path / "broken.c"
    broken.write_text("void f(void) { this is not C; }\n")
    monkeypatch.setattr(cpu_kernels, "SOURCE", broken)
    with pytest.raises(cpu_kernels.KernelBuildError, match=r"broken\.c") as error:
        cpu_kernels.build("cc", tmp_path / "cache")
    assert "error:" in str(error.value)  # the compiler's own diagnostic is quoted
    assert list((tmp_path / "cache").iterdir()) == []  # no partial library left behind


def test_a_failed_build_quotes_the_end_of_each_attempts_compiler_message(tmp_path: Path) -> None:
    """A compiler that fails with a long message: each attempt (with glibc's vector math
    library, then without) is quoted by its command and the last 500 characters of what the
    compiler wrote, where its error is."""
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\nprintf 'early %0600d late error\\n' 0 >&2\nexit 1\n")
    compiler.chmod(0o755)
    written = "early " + "0" * 600 + " late error"
    with pytest.raises(cpu_kernels.KernelBuildError) as error:
        cpu_kernels.build(str(compiler), tmp_path / "cache")
    first, *attempts = str(error.value).splitlines()
    assert first == f"building {cpu_kernels.SOURCE} failed:"
    assert len(attempts) == len(cpu_kernels.LIBRARIES) == 2
    for attempt, libraries in zip(attempts, cpu_kernels.LIBRARIES, strict=True):
        command = [str(compiler), *cpu_kernels.FLAGS, str(cpu_kernels.SOURCE), *libraries]
        assert attempt == f"{' '.join(command)}: {written[-500:]}"


@needs_compiler
def test_a_build_is_kept_and_reused_by_any_checkout_of_the_same_source(monkeypatch, tmp_path):
    first = cpu_kernels.build("cc", tmp_path / "cache")
    stamp = first.stat().st_mtime_ns
    assert cpu_kernels.build("cc", tmp_path / "cache") == first
    copy = tmp_path / "elsewhere" / "cpu_kernels.c"
    copy.parent.mkdir()
    copy.write_bytes(cpu_kernels.SOURCE.read_bytes())
    monkeypatch.setattr(cpu_kernels, "SOURCE", copy)
    assert cpu_kernels.build("cc", tmp_path / "cache") == first
    assert first.stat().st_mtime_ns == stamp
    copy.write_text(copy.read_text() + "\n/* changed */\n")
    assert cpu_kernels.build("cc", tmp_path / "cache") != first  # a new source, a new build


def test_the_cpu_is_named_by_the_platform_where_proc_cpuinfo_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The build's key then holds the processor's name, or the machine's where it has none."""

    def unreadable(path: str) -> SimpleNamespace:
        def read_text() -> str:
            raise OSError(f"{path}: no such file")

        return SimpleNamespace(read_text=read_text)

    monkeypatch.setattr(cpu_kernels, "Path", unreadable)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_kernels._cpu_signature() == "x86_64"
    monkeypatch.setattr(platform, "processor", lambda: "AMD EPYC")
    assert cpu_kernels._cpu_signature() == "AMD EPYC"


@needs_compiler
def test_an_older_build_opens_with_the_kernels_it_has(tmp_path):
    """`benchmarks/cpu_kernels_ab.py` opens builds of older sources, which lack newer kernels."""
    old = tmp_path / "cpu_kernels.c"
    source = cpu_kernels.SOURCE.read_text()
    start, end = source.index("/* Moves rows rows[0..n)"), source.index("/* out = silu(gate)")
    old.write_text(source[:start] + source[end:])  # as before compact_rows was added
    library = cpu_kernels.open_library(cpu_kernels.build("cc", tmp_path / "cache", old))
    assert library.decode_attention.argtypes == cpu_kernels.SIGNATURES["decode_attention"]
    assert not hasattr(library, "compact_rows")


@needs_compiler
def test_compact_rows_moves_the_kept_rows_filled_positions_into_place():
    g = torch.Generator().manual_seed(2)
    buffer = torch.randn(7, 2, 6, 3, generator=g)
    before = buffer.clone()
    rows = torch.tensor([0, 1, 3, 4, 6])
    with torch.inference_mode():
        assert cpu_kernels.compact_rows(buffer, rows, 4)
    # by hand: destination i holds source rows[i]'s first 4 positions, the rest is as it was
    for i, r in enumerate(rows.tolist()):
        assert torch.equal(buffer[i, :, :4], before[r, :, :4])
        assert torch.equal(buffer[i, :, 4:], before[i, :, 4:])
    assert torch.equal(buffer[5:], before[5:])  # rows past the kept ones are not written


@needs_compiler
def test_compact_rows_takes_any_length_from_none_to_the_whole_capacity() -> None:
    """Length 0 (nothing filled yet) moves nothing and is no error; the whole capacity moves
    every position; past it, or below 0, is refused."""
    buffer = torch.arange(4 * 1 * 3 * 2, dtype=torch.float32).view(4, 1, 3, 2)
    before = buffer.clone()
    with torch.inference_mode():
        assert cpu_kernels.compact_rows(buffer, torch.tensor([1, 3]), 0)
        assert torch.equal(buffer, before)
        assert cpu_kernels.compact_rows(buffer, torch.tensor([1, 3]), 3)
        assert torch.equal(buffer[:2], before[[1, 3]]) and torch.equal(buffer[2:], before[2:])
        for length in (4, -1):
            with pytest.raises(ValueError, match="compact_rows: length outside the buffer"):
                cpu_kernels.compact_rows(buffer, torch.tensor([1]), length)


@needs_compiler
def test_select_rows_compacts_with_the_kernel_as_with_torch_and_falls_back_otherwise(
    monkeypatch,
):
    g = torch.Generator().manual_seed(3)
    source = torch.randn(6, 2, 5, 4, generator=g)
    outs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(cpu_kernels.DISABLE_ENV, setting)
        with torch.inference_mode():
            outs[setting] = kv_cache.select_rows(source.clone(), torch.tensor([1, 2, 5]), 3)
    assert torch.equal(outs["1"][:, :, :3], outs["0"][:, :, :3])
    assert torch.equal(outs["1"][:, :, :3], source[[1, 2, 5], :, :3])
    with torch.inference_mode():  # not increasing: the kernel declines, torch gathers
        assert not cpu_kernels.compact_rows(source.clone(), torch.tensor([2, 1]), 3)
        swapped = kv_cache.select_rows(source.clone(), torch.tensor([2, 1]), 3)
        assert not cpu_kernels.compact_rows(source[:, :, 1:], torch.tensor([1]), 3)
    assert torch.equal(swapped[:, :, :3], source[[2, 1], :, :3])


def _same_values_and_gradients(got, want, inputs, upstream):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(
        torch.autograd.grad(got, inputs, upstream),
        torch.autograd.grad(want, inputs, upstream),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("rows", [5, 700])  # 700 rows cross the kernels' parallel threshold
def test_training_kernels_equal_the_torch_operations_forward_and_backward(rows):
    g = torch.Generator().manual_seed(6)
    gate = torch.randn(rows, 40, generator=g, requires_grad=True)
    up = torch.randn(rows, 40, generator=g, requires_grad=True)
    upstream = torch.randn(rows, 40, generator=g)
    _same_values_and_gradients(
        cpu_kernels.swiglu(gate, up), fused.TorchOps.silu_mul(gate, up), (gate, up), upstream
    )

    x = torch.randn(rows, 3, 16, generator=g, requires_grad=True)
    angles = torch.randn(rows, 1, 8, generator=g).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    upstream = torch.randn(rows, 3, 16, generator=g)
    got, want = cpu_kernels.rotary(x, cos, sin), fused.rotate(x, cos, sin)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(got, x, upstream)
    torch.testing.assert_close(grad, torch.autograd.grad(want, x, upstream)[0])
    # by hand: a rotation keeps norms, and its backward is the rotation by the negated angles
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(grad, fused.rotate(upstream, cos, -sin), rtol=1e-5, atol=1e-6)

    x = torch.randn(rows, 2, 24, generator=g, requires_grad=True)
    weight = torch.randn(24, generator=g, requires_grad=True)
    upstream = torch.randn(rows, 2, 24, generator=g)
    got, want = cpu_kernels.rms_norm(x, weight, 1e-6), fused.TorchOps.rms_norm(x, weight, 1e-6)
    _same_values_and_gradients(got, want, (x, weight), upstream)


@needs_compiler
def test_rms_norm_kernel_by_hand():
    """x = [3, 4], w = [1, 2], eps = 0: r = 1 / sqrt(12.5), y = [3r, 8r]; with upstream [1, 0],
    dw = [3r, 0] and dx = r ([1, 0] - x r² · 3 / 2)."""
    x = torch.tensor([[3.0, 4.0]], requires_grad=True)
    weight = torch.tensor([1.0, 2.0], requires_grad=True)
    y = cpu_kernels.rms_norm(x, weight, 0.0)
    r = 12.5**-0.5
    torch.testing.assert_close(y, torch.tensor([[3 * r, 8 * r]]))
    dx, dw = torch.autograd.grad(y, (x, weight), torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(dw, torch.tensor([3 * r, 0.0]))
    expected = r * (torch.tensor([1.0, 0.0]) - torch.tensor([3.0, 4.0]) * r**2 * 1.5)
    torch.testing.assert_close(dx, expected.view(1, 2))


@needs_compiler
def test_training_steps_use_the_training_kernels_where_they_may(monkeypatch):
    h, mask, flat = torch.randn(2, 3, 8), torch.ones(2, 5), torch.tensor([0, 2, 3])
    assert type(fused.layer_ops(h, mask, 3, flat)) is fused.KernelOps  # autograd on
    assert type(fused.layer_ops(h.double(), mask, 3, flat)) is fused.TorchOps
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "0")
    assert type(fused.layer_ops(h, mask, 3, flat)) is fused.TorchOps


def _attention_case(prefixes, group, q_heads, kv_heads, t, sp, d, seed):
    """Rows in groups sharing a left-padded prefix (strided, as a prompt pass leaves it), own
    positions per token with ragged lengths (padding-free), as a shared-prefix update has."""
    g = torch.Generator().manual_seed(seed)
    b = prefixes * group
    prefix_mask = torch.ones(prefixes, sp, dtype=torch.long)
    for p in range(prefixes):
        prefix_mask[p, : int(torch.randint(0, sp, (1,), generator=g))] = 0
    select = torch.arange(b) // group
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    flat = fused.real_positions(torch.arange(t)[None, :] < lengths[:, None])
    key_mask = torch.cat([prefix_mask[select], torch.ones(b, t, dtype=torch.long)], dim=1)
    n = len(flat)
    tensors = [
        torch.randn(n, q_heads, d, generator=g),
        torch.randn(n, kv_heads, d, generator=g),
        torch.randn(n, kv_heads, d, generator=g),
        torch.randn(prefixes, sp, kv_heads, d, generator=g).transpose(1, 2),
        torch.randn(prefixes, sp, kv_heads, d, generator=g).transpose(1, 2),
    ]
    return [x.requires_grad_() for x in tensors], key_mask, flat, select


def _attend(ops, q, k, v, pk, pv, select):
    """A completion pass's attention through a `ConcatKV` holding the prompt pass's keys."""
    cache = kv_cache.ConcatKV(1)
    cache.update(0, pk, pv)
    cache.batch_select_indices(select)
    return ops.attend(q, *ops.cached(cache, 0, k, v), scale=0.3), cache


@needs_compiler
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "t", "sp", "d", "order"),
    [
        (4, 4, 6, 5, 48, "grouped"),
        (6, 2, 7, 3, 32, "grouped"),
        (4, 1, 16, 9, 64, "shuffled"),
        (2, 2, 3, 4, 17, "grouped"),
        (4, 2, 75, 13, 48, "grouped"),  # rows of 29-88 keys, four over one 64-key block
    ],
)
def test_kernel_attention_equals_the_torch_attention_forward_and_backward(
    q_heads, kv_heads, t, sp, d, order
):
    """Values and the gradients of q, k, v and the shared prefix's keys and values; rows whose
    prefixes are not in group order get their own copy of it (`shuffled`)."""
    tensors, key_mask, flat, select = _attention_case(3, 4, q_heads, kv_heads, t, sp, d, seed=t)
    if order == "shuffled":
        select = select[torch.randperm(len(select), generator=torch.Generator().manual_seed(0))]
        key_mask[:, :sp] = key_mask[select[0], :sp]  # one prefix mask, whatever the order
    upstream = torch.randn(len(flat), q_heads * d, generator=torch.Generator().manual_seed(1))
    bias = fused.mask_bias(key_mask, t, torch.float32)
    want, want_cache = _attend(fused.TorchOps(bias, flat), *tensors, select)
    ops = fused.KernelOps(key_mask, t, flat)
    got, cache = _attend(ops, *tensors, select)
    assert ops.gather == (order == "shuffled")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(got, tensors, upstream)
    for grad, expected in zip(grads, torch.autograd.grad(want, tensors, upstream)):
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)
    for stored, expected in zip(cache.stored(0), want_cache.stored(0)):  # laid out on demand
        torch.testing.assert_close(stored, expected)


@needs_compiler
def test_kernel_attention_of_a_prompt_pass_sees_its_left_padding_as_torch_does():
    """No prefix: the queries are the keys, some hidden (left padding), each query seeing
    itself."""
    g = torch.Generator().manual_seed(3)
    b, t, heads, d = 3, 5, 2, 8
    key_mask = torch.ones(b, t, dtype=torch.long)
    key_mask[0, :2] = key_mask[2, :4] = 0
    q, k, v = (torch.randn(b, t, heads, d, generator=g, requires_grad=True) for _ in range(3))
    results = []
    for ops in (
        fused.TorchOps(fused.mask_bias(key_mask, t, torch.float32)),
        fused.KernelOps(key_mask, t),
    ):
        out = ops.attend(q, *ops.cached(kv_cache.ConcatKV(1), 0, k, v), scale=0.5)
        results.append([out, *torch.autograd.grad(out.square().sum(), (q, k, v))])
    for got, want in zip(*results[::-1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_kernel_attention_by_hand():
    """One row, one head, d = 1: a prefix key (1, value 10) hidden by its mask, own keys 2 and
    3 (values 20, 30) with queries 1 and 2: the first sees only itself, the second its two
    own keys with weights softmax(0.5 · 2 · [2, 3])."""
    q = torch.tensor([[[1.0]], [[2.0]]], requires_grad=True)
    k, v = torch.tensor([2.0, 3.0]).view(2, 1, 1), torch.tensor([20.0, 30.0]).view(2, 1, 1)
    pk, pv = torch.ones(1, 1, 1, 1), torch.full((1, 1, 1, 1), 10.0)
    layout = cpu_kernels.AttentionLayout(
        torch.tensor([[0, 1]]), torch.ones(1, 2), torch.zeros(1, 1), torch.tensor([0, 1])
    )
    out = cpu_kernels.attention(q, k, v, pk, pv, layout, 0.5)
    w = torch.softmax(torch.tensor([2.0, 3.0]) * 0.5 * 2.0, 0)
    torch.testing.assert_close(out.view(2), torch.stack([torch.tensor(20.0), w @ v.view(2)]))
    # d out_2 / d q_2 = 0.5 · sum_j w_j (k_j - k̄) v_j; out_1 does not depend on q_1
    (grad,) = torch.autograd.grad(out.sum(), q)
    keys = torch.tensor([2.0, 3.0])
    slope = 0.5 * (w * (keys - w @ keys) * v.view(2)).sum()
    torch.testing.assert_close(grad.view(2), torch.stack([torch.tensor(0.0), slope]))


@needs_compiler
def test_kernel_attention_refuses_bad_inputs_with_what_is_wrong():
    (q, k, v, pk, pv), key_mask, flat, select = _attention_case(2, 3, 4, 2, 5, 3, 8, seed=0)
    ops = fused.KernelOps(key_mask, 5, flat)
    _attend(ops, q, k, v, pk, pv, select)
    layout = ops.layout
    with pytest.raises(ValueError, match="cpu_kernels: attention: rows point past q"):
        cpu_kernels.attention(q[:-1], k[:-1], v[:-1], pk, pv, layout, 1.0)
    with pytest.raises(ValueError, match="gpu_kernels: attention: rows point past q"):
        gpu_kernels.attention(q[:-1], k[:-1], v[:-1], pk, pv, layout, 1.0)  # checked first
    with pytest.raises(ValueError, match="query heads not a multiple"):
        cpu_kernels.attention(q[:, :3], k, v, pk, pv, layout, 1.0)
    with pytest.raises(ValueError, match="prefix keys and values layout"):
        cpu_kernels.attention(q, k, v, pk, pv.contiguous(), layout, 1.0)
    with pytest.raises(ValueError, match="prefix_mask is not"):
        cpu_kernels.attention(q, k, v, pk[:1], pv[:1], layout, 1.0)
    with pytest.raises(ValueError, match="prefix shape"):  # one key fewer, the same strides
        cpu_kernels.attention(q, k, v, pk, pv[:, :, :-1], layout, 1.0)
    with pytest.raises(ValueError, match="prefix shape"):  # half of each key and value
        cpu_kernels.attention(q, k, v, pk[..., :4], pv[..., :4], layout, 1.0)
    with pytest.raises(ValueError, match="starts must run from 0 to batch"):
        cpu_kernels.AttentionLayout(
            layout.rows, layout.own_mask, torch.ones(2, 3), torch.tensor([0, 3, 5])
        )
    with pytest.raises(ValueError, match="starts must run from 0 to batch"):  # decreasing
        cpu_kernels.AttentionLayout(
            layout.rows, layout.own_mask, torch.ones(3, 3), torch.tensor([0, 4, 2, 6])
        )
    with pytest.raises(ValueError, match="own_mask is not"):
        cpu_kernels.AttentionLayout(
            layout.rows, layout.own_mask[:, 1:], torch.ones(6, 0), torch.arange(7)
        )


def test_attention_layout_derives_each_rows_prefix_and_computed_length_by_hand() -> None:
    """Rows 0-1 share prefix 0, prefix 1 has no row (allowed: starts may repeat), rows 2-4
    share prefix 2. `count` is one past a row's last computed position (rows[b, i] >= 0, row 0
    of the per-token tensors included), 0 for a row with none; `queries` one past the largest
    row. With no positions at all, both are 0."""
    rows = torch.tensor(
        [[1, -1, 2, -1], [-1, -1, -1, -1], [0, -1, -1, -1], [3, 4, 5, 6], [-1, 7, -1, -1]]
    )
    starts = torch.tensor([0, 2, 2, 5])
    layout = cpu_kernels.AttentionLayout(rows, torch.ones(5, 4), torch.ones(3, 2), starts)
    assert layout.row_prefix.tolist() == [0, 0, 2, 2, 2]
    assert layout.count.tolist() == [3, 0, 1, 4, 2]
    assert layout.queries == 8
    empty = cpu_kernels.AttentionLayout(
        torch.zeros(2, 0), torch.ones(2, 0), torch.ones(1, 2), torch.tensor([0, 2])
    )
    assert empty.count.tolist() == [0, 0] and empty.queries == 0
    assert empty.row_prefix.tolist() == [0, 0]


@needs_compiler
def test_kernel_attention_that_cannot_allocate_its_scratch_raises_memory_error():
    """A prefix of 2⁴⁰ positions (held by no prefix, so no tensor is large) asks each thread for
    terabytes of scratch: the kernels report it and nothing runs on the missing memory."""
    sp = 1 << 40
    q = torch.zeros(0, 2, 8, requires_grad=True)
    k = v = torch.zeros(0, 1, 8)
    pk = pv = torch.zeros(0, 1, sp, 8)
    layout = cpu_kernels.AttentionLayout(
        torch.zeros(0, 3, dtype=torch.long), torch.ones(0, 3), torch.zeros(0, sp), torch.zeros(1)
    )
    with pytest.raises(MemoryError, match=f"scratch for {sp} prefix keys of size 8"):
        cpu_kernels.attention(q, k, v, pk, pv, layout, 1.0)
    out, lse = torch.zeros(0, 2, 8), torch.zeros(0, 2)
    ctx = SimpleNamespace(saved_tensors=(q, k, v, pk, pv, out, lse), layout=layout, scale=1.0)
    with pytest.raises(MemoryError, match="attention could not allocate"):
        cpu_kernels._Attention.backward(ctx, torch.zeros(0, 2, 8))


def test_concat_kv_lays_out_a_selection_only_for_the_layers_it_holds():
    """The lazy selection and appended positions give the keys the eager cache gave: the
    held layer's rows repeated then its new positions added; a layer filled after the
    selection is not selected."""
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    cache = kv_cache.ConcatKV(2)
    cache.update(0, keys, -keys)
    cache.batch_select_indices(torch.tensor([0, 0, 1]))
    tail = torch.ones(3, 1, 1, 2)
    k, v = cache.update(0, tail, tail)
    torch.testing.assert_close(k, torch.cat([keys[[0, 0, 1]], tail], dim=2))
    torch.testing.assert_close(v, torch.cat([-keys[[0, 0, 1]], tail], dim=2))
    late = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 1, 4, 2)
    cache.update(1, late, late)
    torch.testing.assert_close(cache.stored(1)[0], late)


def test_concat_kv_pending_selections_and_appended_tokens_compose_as_eager_operations():
    """Selections and appended positions stack up lazily: a selection of a selection picks
    from the selected rows, a second `append_tokens` keeps the first's positions, a selection
    after appended positions selects them too, and reading twice gives the same keys. The
    reference does each operation at once with plain indexing and concatenation."""
    keys = torch.arange(2 * 1 * 2 * 2, dtype=torch.float32).view(2, 1, 2, 2)
    first = torch.arange(3 * 2, dtype=torch.float32).view(3, 1, 1, 2) + 100  # [b, t, heads, d]
    second = torch.arange(3 * 2, dtype=torch.float32).view(3, 1, 1, 2) + 200
    cache = kv_cache.ConcatKV(1)
    cache.update(0, keys, -keys)
    cache.batch_select_indices(torch.tensor([1, 0]))
    cache.batch_select_indices(torch.tensor([0, 1, 0]))  # rows 1, 0, 1 of `keys`
    k, v, rows = cache.append_tokens(0, first, -first, None, 3, 1)
    assert torch.equal(k, keys) and rows.tolist() == [1, 0, 1]  # handed over as they are
    eager = torch.cat([keys[[1, 0, 1]], first.transpose(1, 2)], dim=2)
    k, v, rows = cache.append_tokens(0, second, -second, None, 3, 1)
    assert torch.equal(k, eager) and torch.equal(v, -eager) and rows is None
    eager = torch.cat([eager, second.transpose(1, 2)], dim=2)[[2, 0]]
    cache.batch_select_indices(torch.tensor([2, 0]))
    for _ in range(2):
        k, v = cache.stored(0)
        assert torch.equal(k, eager) and torch.equal(v, -eager)


@needs_compiler
def test_panel_products_by_hand():
    """x = [1, 2] through W = [[1, 0], [0, 1], [1, 1]] with bias [0.5, 0, -1]: [1.5, 2, 2]."""
    layer = torch.nn.Linear(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        layer.bias.copy_(torch.tensor([0.5, 0.0, -1.0]))
    (y,) = cpu_kernels.PanelStore().products(torch.tensor([[1.0, 2.0]]), (layer,))
    assert y.tolist() == [[1.5, 2.0, 2.0]]


@needs_compiler
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 128])  # the kernel takes rows six at a time
@pytest.mark.parametrize("threads", [1, 2])
def test_panel_products_equal_linear_for_any_rows_widths_and_biases(rows, threads):
    """Outputs of 7, 16 and 107 columns (panels of 16, the last partly used), with and
    without a bias, from one call; each contiguous and equal to `F.linear`."""
    g = torch.Generator().manual_seed(0)
    modules = (
        torch.nn.Linear(50, 7),
        torch.nn.Linear(50, 16, bias=False),
        torch.nn.Linear(50, 107),
    )
    x = torch.randn(rows, 1, 50, generator=g)
    store = cpu_kernels.PanelStore()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = store.products(x, modules)
    finally:
        torch.set_num_threads(before)
    for out, module in zip(outs, modules, strict=True):
        assert out.shape == (rows, 1, module.out_features) and out.is_contiguous()
        expected = torch.nn.functional.linear(x, module.weight, module.bias)
        assert torch.allclose(out, expected.detach(), rtol=1e-5, atol=1e-5)
    panels = store.groups[tuple(id(m) for m in modules)].panels
    assert store.products(x, modules)[0].equal(outs[0])
    assert store.groups[tuple(id(m) for m in modules)].panels is panels  # packed once


@needs_compiler
def test_panel_products_refuse_bad_inputs_with_what_is_wrong():
    store = cpu_kernels.PanelStore()
    with pytest.raises(ValueError, match="fp32 weights"):
        store.products(torch.randn(3, 8), (torch.nn.Linear(8, 4).double(),))
    with pytest.raises(ValueError, match="input sizes differ"):
        store.products(torch.randn(3, 8), (torch.nn.Linear(8, 4), torch.nn.Linear(9, 4)))
    assert not store.groups  # nothing half-packed is kept
    layer = torch.nn.Linear(8, 4)
    with pytest.raises(ValueError, match="contiguous fp32 x of the modules' input size"):
        store.products(torch.randn(8, 3).T, (layer,))
    with pytest.raises(ValueError, match="contiguous fp32 x of the modules' input size"):
        store.products(torch.randn(3, 7), (layer,))
    with pytest.raises(ValueError, match="contiguous fp32 x of the modules' input size"):
        store.products(torch.randn(3, 8, dtype=torch.float64), (layer,))


@needs_compiler
def test_decode_steps_add_the_residual_and_run_the_mlp_as_the_formulas_say() -> None:
    """`add_rms_norm` returns h + delta and its RMSNorm, `mlp_inner` silu(x W_gateᵀ + b) ·
    x W_upᵀ, with and without the panel products (`TorchOps` shares these composites, so
    comparing the two kinds of operations cannot see them)."""
    g = torch.Generator().manual_seed(8)
    h, delta = torch.randn(4, 1, 16, generator=g), torch.randn(4, 1, 16, generator=g)
    weight = torch.rand(16, generator=g) + 0.5
    gate, up = torch.nn.Linear(16, 24), torch.nn.Linear(16, 24, bias=False)
    summed = h + delta
    normed = summed / (summed.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * weight
    with torch.no_grad():
        inner = torch.nn.functional.silu(normed @ gate.weight.T + gate.bias) * (
            normed @ up.weight.T
        )
        for panels in (None, cpu_kernels.PanelStore()):
            ops = cpu_kernels.DecodeOps(torch.ones(4, 1, dtype=torch.bool), panels)
            got_summed, got_normed = ops.add_rms_norm(h, delta, weight, 1e-6)
            assert torch.equal(got_summed, summed)
            torch.testing.assert_close(got_normed, normed, rtol=1e-5, atol=1e-6)
            got = ops.mlp_inner(got_normed, gate, up)
            torch.testing.assert_close(got, inner, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_decode_projections_put_a_lora_layers_base_into_the_panels_and_add_its_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With panels, plain layers and a LoRA layer's base go through one panel product and the
    adapter's low-rank term is added; without panels each runs by its own forward, LoRA or
    not; both compute what the modules compute."""
    from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.adapted, self.plain = torch.nn.Linear(24, 20), torch.nn.Linear(24, 12)

    pair = inject_adapter_in_model(PeftLoraConfig(r=2, target_modules=["adapted"]), Pair())
    with torch.no_grad():
        pair.adapted.lora_B["default"].weight.normal_(generator=torch.Generator().manual_seed(9))
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(10))
    products = count_panel_products(monkeypatch)
    monkeypatch.setattr(cpu_kernels, "panels_pay", lambda: True)
    with torch.no_grad():
        expected = (pair.adapted(x), pair.plain(x))
        assert not torch.allclose(expected[0], pair.adapted.base_layer(x), atol=1e-3)
        for panels, calls in ((cpu_kernels.PanelStore(), 1), (None, 0)):
            ops = cpu_kernels.DecodeOps(torch.ones(5, 1, dtype=torch.bool), panels)
            products.clear()
            got = ops.projections(x, pair.adapted, pair.plain)
            assert len(products) == calls
            for a, b in zip(got, expected, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            products.clear()
            (plain,) = ops.projections(x, pair.plain)
            assert len(products) == calls
            torch.testing.assert_close(plain, expected[1], rtol=1e-5, atol=1e-5)


def cpuinfo(vendor: str, family: int, flags: str) -> str:
    """/proc/cpuinfo of a two-core CPU (the fields read, and a few others)."""
    core = f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: {flags}\n"
    return "\n".join(f"processor\t: {i}\n{core}" for i in range(2))


def test_only_amd_zen_4_splits_512_bit_vectors():
    avx512 = "fpu sse2 avx avx2 fma avx512f avx512dq avx512bw"
    assert cpu_kernels.splits_512_bit_vectors(cpuinfo("AuthenticAMD", 25, avx512))  # Zen 4
    assert not cpu_kernels.splits_512_bit_vectors(cpuinfo("AuthenticAMD", 25, "avx2 fma"))  # Zen 3
    assert not cpu_kernels.splits_512_bit_vectors(cpuinfo("AuthenticAMD", 26, avx512))  # Zen 5
    assert not cpu_kernels.splits_512_bit_vectors(cpuinfo("GenuineIntel", 6, avx512))
    assert not cpu_kernels.splits_512_bit_vectors("")  # no /proc/cpuinfo fields at all


@needs_compiler
def test_decode_steps_take_the_panel_products_where_measured_to_pay():
    """Two threads or more on a CPU with AVX2 and FMA and without AVX-512 (as /proc/cpuinfo
    lists its flags), or on an AMD Zen 4; one thread never."""
    text = Path("/proc/cpuinfo").read_text()
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    zen_4 = "vendor_id\t: AuthenticAMD" in text and "cpu family\t: 25" in text
    measured = {"avx2", "fma"} <= flags and ("avx512f" not in flags or zen_4)
    threads = torch.get_num_threads()
    store = cpu_kernels.PanelStore()
    try:
        torch.set_num_threads(2)
        assert cpu_kernels.panels_pay() is measured
        ops = cpu_kernels.DecodeOps(torch.ones(1, 1, dtype=torch.bool), store)
        assert ops.panels is (store if measured else None)
        torch.set_num_threads(1)
        assert not cpu_kernels.panels_pay()
        assert cpu_kernels.DecodeOps(torch.ones(1, 1, dtype=torch.bool), store).panels is None
    finally:
        torch.set_num_threads(threads)


def test_panels_pay_with_two_threads_where_the_library_or_the_cpu_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever this CPU is: the library's verdict (AVX2 and FMA, no AVX-512) or an AMD Zen 4
    suffices with two threads; neither, one thread, or no library, and they do not pay."""
    threads = torch.get_num_threads()
    cases = [(1, False, 2, True), (0, True, 2, True), (0, False, 2, False), (1, True, 1, False)]
    try:
        for library_says, zen_4, n, pays in cases:
            library = SimpleNamespace(panels_pay=lambda says=library_says: says)
            monkeypatch.setattr(cpu_kernels, "load", lambda library=library: library)
            monkeypatch.setattr(cpu_kernels, "splits_512_bit_vectors", lambda zen_4=zen_4: zen_4)
            torch.set_num_threads(n)
            assert cpu_kernels.panels_pay() is pays
        monkeypatch.setattr(cpu_kernels, "load", lambda: None)
        torch.set_num_threads(2)
        assert cpu_kernels.panels_pay() is False
    finally:
        torch.set_num_threads(threads)


def count_panel_products(monkeypatch) -> list[int]:
    """A list that gets an entry at each call of `PanelStore.products` from now on."""
    products: list[int] = []
    panel_products = cpu_kernels.PanelStore.products

    def counted(self, *args):
        products.append(1)
        return panel_products(self, *args)

    monkeypatch.setattr(cpu_kernels.PanelStore, "products", counted)
    return products


@needs_compiler
@pytest.mark.parametrize("pay", [True, False])
def test_the_lm_head_takes_the_panel_products_only_where_they_pay(monkeypatch, pay):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=1, intermediate_size=128, seed=3)
    products = count_panel_products(monkeypatch)
    monkeypatch.setattr(cpu_kernels, "panels_pay", lambda: pay)
    hidden = torch.randn(3, 64)
    with torch.no_grad():
        logits = fused.FusedForward(model).logits(hidden)
        torch.testing.assert_close(logits, model.lm_head(hidden), rtol=1e-5, atol=1e-5)
    assert len(products) == int(pay)


@needs_compiler
def test_each_rollout_multiplies_by_the_weights_of_its_time(monkeypatch):
    """The packed weights are copies made for one rollout: after the weights change in place
    without a version bump (as `p.data.copy_` or a fused optimizer step leave them), the next
    rollout samples what the PyTorch operations sample with the new weights."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (4, 9, 6)]
    params = SamplingParams(n=4, temperature=0.9, max_new_tokens=24)
    products = count_panel_products(monkeypatch)
    monkeypatch.setattr(cpu_kernels, "panels_pay", lambda: True)  # on any CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:

        def rollout(kernels: str):
            monkeypatch.setenv(cpu_kernels.DISABLE_ENV, kernels)
            engine = HFRolloutEngine(
                model, [20, 21], tok.pad_token_id, generator=torch.Generator().manual_seed(4)
            )
            return engine.generate(prompts, params)

        before = rollout("1")
        for p in model.parameters():
            p.data.copy_(p.data * 1.5 + 0.01)
        count = len(products)
        after, reference = rollout("1"), rollout("0")
    finally:
        torch.set_num_threads(threads)
    assert count > 0 and len(products) > count
    assert after.completion_ids == reference.completion_ids
    assert after.completion_ids != before.completion_ids
    for a, b in zip(after.logprobs, reference.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
