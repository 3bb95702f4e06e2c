"""Tiny model, HF-format round trip, the rollout engine and the training-side log-probs."""

import copy
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from rlvr.config import ModelConfig
from rlvr.models import fused, loading
from rlvr.models.loading import (
    ModelLoadError,
    decode_completions,
    eos_token_ids,
    load_model_and_tokenizer,
    load_pretrained,
    resolve_device,
    save_pretrained,
)
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.graphs import GraphState
from rlvr.rollout.hf import HFRolloutEngine, PreallocatedLayer, left_pad
from rlvr.rollout.sampling import (
    blocked_inverse_cdf,
    draw_uniform,
    filter_logits,
    inverse_cdf_sample,
    penalize_repeats,
    sample_tokens,
)
from rlvr.run_layout import STATE_FILE
from rlvr.training.batching import (
    collate_shared_prefix,
    forward_logits_shared_prefix,
    token_budget_micro_batches,
)
from rlvr.training.logprobs import token_logprobs, token_logprobs_and_entropy


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, intermediate_size=128
    ), tokenizer


def test_tokenizer_is_character_level_with_single_token_tags(tiny):
    _, tok = tiny
    ids = tok("<think>12+3</think><answer>15</answer>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2 + 4 + 2 + 2
    assert tok.decode(ids) == "<think>12+3</think><answer>15</answer>"
    assert tok.pad_token_id != tok.eos_token_id


def test_checkpoint_round_trip_in_hf_format(tiny, tmp_path):
    model, tok = tiny
    save_pretrained(model, tok, tmp_path / "m")
    loaded, loaded_tok = load_pretrained(str(tmp_path / "m"))
    ids = torch.tensor([tok("What is 1+2?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded_tok.chat_template == tok.chat_template
    text = "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<think>12</think>"
    assert loaded_tok(text)["input_ids"] == tok(text)["input_ids"]


def test_saving_and_small_loads_draw_no_transformers_progress_bar_and_leave_bars_as_they_were(
    tiny, tmp_path, capfd, monkeypatch
):
    from transformers.utils import logging as transformers_logging

    save_pretrained(*tiny, tmp_path / "m")
    assert "Writing model shards" not in capfd.readouterr().err
    load_pretrained(str(tmp_path / "m"))  # a small local model loads without a bar
    assert "Loading weights" not in capfd.readouterr().err
    monkeypatch.setattr(loading, "QUIET_LOAD_BYTES", 1)  # a large one keeps it
    load_pretrained(str(tmp_path / "m"))
    assert "Loading weights" in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        save_pretrained(*tiny, tmp_path / "again")
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()


def test_the_tiny_model_is_the_one_built_from_the_seed_and_shape_given(tiny):
    shape = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 48}
    model, _ = load_model_and_tokenizer(ModelConfig(tiny=shape), seed=7)
    built = build_tiny_model(tiny[1], **shape, seed=7)
    assert model.config.num_attention_heads == 2  # not build_tiny_model's default of 4
    for name, weight in built.state_dict().items():
        assert torch.equal(model.state_dict()[name], weight), name
    other, _ = load_model_and_tokenizer(ModelConfig(tiny=shape), seed=8)
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_a_model_is_loaded_in_the_configured_dtype_and_forward(tiny, tmp_path):
    shape = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 48}
    cfg = ModelConfig(tiny=shape, dtype="bfloat16", fused_forward=False)
    model, _ = load_model_and_tokenizer(cfg)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not fused.supports(model)  # model.fused_forward: false
    save_pretrained(*tiny, tmp_path / "m")  # saved in fp32
    loaded, _ = load_pretrained(str(tmp_path / "m"), "bfloat16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_whole_weights_of_a_sharded_model_are_saved_under_its_class_before_sharding(tiny, tmp_path):
    tok = tiny[1]
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=48)
    # FSDP2 makes the sharded model's class FSDP<its class>
    model.__class__ = type("FSDPLlamaForCausalLM", (type(model),), {})
    weights = {name: 2 * w for name, w in model.state_dict().items()}  # not the module's own
    save_pretrained(model, tok, tmp_path, weights=weights)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    loaded = load_pretrained(str(tmp_path))[0].state_dict()
    for name, w in weights.items():
        assert torch.equal(loaded[name], w), name


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pretrained(str(tmp_path / "nowhere"))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="a file, not a model folder"):
        load_pretrained(str(tmp_path / "model.safetensors"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"missing config\.json"):
        load_pretrained(str(tmp_path / "empty"))
    run_checkpoint = tmp_path / "run" / "checkpoints" / "step-3"
    run_checkpoint.mkdir(parents=True)
    (run_checkpoint / STATE_FILE).write_bytes(b"")
    hint = re.escape(
        f"config.json); a run directory: give one of its checkpoints, e.g. {run_checkpoint}"
    )
    with pytest.raises(ModelLoadError, match=hint):
        load_pretrained(str(tmp_path / "run"))


def test_a_folder_without_weights_and_relative_paths_are_clear_errors(tiny, tmp_path):
    model, tok = tiny
    tok.save_pretrained(tmp_path)
    model.config.save_pretrained(tmp_path)  # config.json, but no weights
    with pytest.raises(ModelLoadError, match=r"could not be loaded \(.*model\.safetensors"):
        load_pretrained(str(tmp_path))
    with pytest.raises(ModelLoadError) as info:  # a local folder: not a hub problem
        load_pretrained(str(tmp_path))
    assert str(info.value).endswith(".)") and "hub" not in str(info.value)


def test_a_hub_name_that_cannot_be_fetched_suggests_a_local_folder(monkeypatch):
    def offline(name, **_):
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {name}")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(ModelLoadError) as info:
        load_pretrained("org/model")
    assert str(info.value) == (
        "model.name_or_path 'org/model' could not be loaded (We couldn't connect to "
        "'https://huggingface.co' to load org/model); give a local model directory, or `tiny` "
        "for the built-in model, when the hub is unreachable"
    )
    # ./ and ~ name local folders even where there is none: never looked up on the hub
    for name in ("./no/such/model", "~/no/such/model"):
        with pytest.raises(ModelLoadError, match="path does not exist"):
            load_pretrained(name)


def test_a_tokenizer_without_a_pad_token_pads_with_eos(tiny, tmp_path):
    model, tok = tiny
    save_pretrained(model, tok, tmp_path / "padded")
    assert load_pretrained(str(tmp_path / "padded"))[1].pad_token_id == tok.pad_token_id
    unpadded = copy.deepcopy(tok)
    unpadded.pad_token = None
    save_pretrained(model, unpadded, tmp_path / "unpadded")
    assert load_pretrained(str(tmp_path / "unpadded"))[1].pad_token_id == tok.eos_token_id


def test_a_damaged_weights_file_is_a_clear_error(tiny, tmp_path):
    save_pretrained(*tiny, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy cut short
    cut = re.escape(f"model.name_or_path '{tmp_path / 'm'}': a weights file cannot be read")
    with pytest.raises(ModelLoadError, match=cut + ".*damaged or cut short"):
        load_pretrained(str(tmp_path / "m"))


def test_model_device_resolves_or_names_the_key():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelLoadError, match=r"model\.device 'gpu0' is not a device"):
        resolve_device("gpu0")
    with pytest.raises(ModelLoadError, match=r"model\.device 'meta': only cpu and cuda"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match=r"model\.device 'cuda:1': no CUDA GPU"):
            resolve_device("cuda:1")


def test_a_cuda_device_index_must_name_one_of_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a machine with GPUs 0 and 1
    assert resolve_device("cuda") == torch.device("cuda")  # no index: the current GPU
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ModelLoadError, match=r"'cuda:2': this machine has 2 CUDA GPU"):
        resolve_device("cuda:2")


def test_eos_ids_are_the_tokenizers_and_the_generation_configs():
    tokenizer = SimpleNamespace(eos_token_id=2)

    def model(configured):
        return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=configured))

    assert eos_token_ids(model([7, 5, 2]), tokenizer) == [2, 5, 7]  # a list, each id once
    assert eos_token_ids(model(9), tokenizer) == [2, 9]
    assert eos_token_ids(model(None), tokenizer) == [2]


def test_decoded_completions_drop_a_final_eos_only(tiny):
    tok = tiny[1]
    ids = tok("<answer>3</answer>", add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    texts = decode_completions(tok, [[*ids, eos], ids, [], [eos, *ids]], [eos])
    # the answer tags are special tokens and stay; an EOS inside the text stays too
    assert texts == ["<answer>3</answer>"] * 2 + ["", tok.eos_token + "<answer>3</answer>"]


def test_inverse_cdf_sample_picks_the_interval_of_u():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]] * 6)
    # cumulative 0.5, 0.5, 0.8, 1.0, 1.0: u in [0, .5) -> 0, [.5, .8) -> 2, [.8, 1) -> 3
    uniform = torch.tensor([0.0, 0.4999, 0.5, 0.79, 0.8, 0.9999])
    assert inverse_cdf_sample(probs, uniform).tolist() == [0, 0, 2, 2, 3, 3]
    # unnormalised rows scale u by their total; u·total rounding up to the total gives the last
    # token with a nonempty interval, never a zero-probability one
    weights = torch.tensor([[2.0, 6.0, 0.0], [1.0, 0.0, 0.0]])
    assert inverse_cdf_sample(weights, torch.tensor([0.3, 0.5])).tolist() == [1, 0]
    assert inverse_cdf_sample(weights, torch.tensor([1.0, 1.0])).tolist() == [1, 0]


def test_greedy_decoding_draws_no_uniforms():
    # temperature 0 takes nothing from the run's generator, so what follows draws as before
    generator = torch.Generator().manual_seed(0)
    assert draw_uniform(generator, 3, SamplingParams(temperature=0.0)) is None
    drawn = draw_uniform(generator, 3, SamplingParams(temperature=1.0))
    torch.testing.assert_close(drawn, torch.rand(3, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("block", [1, 2, 3, 8])
def test_blocked_inverse_cdf_picks_the_interval_of_u(block):
    """The two-level search (block, then token; GPU) keeps `inverse_cdf_sample`'s rules, with
    blocks that split the zero-probability tokens off and a last block cut short."""
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]] * 6)
    uniform = torch.tensor([0.0, 0.4999, 0.5, 0.79, 0.8, 0.9999])
    assert blocked_inverse_cdf(probs, uniform, block).tolist() == [0, 0, 2, 2, 3, 3]
    weights = torch.tensor([[2.0, 6.0, 0.0], [1.0, 0.0, 0.0]])
    assert blocked_inverse_cdf(weights, torch.tensor([0.3, 0.5]), block).tolist() == [1, 0]
    assert blocked_inverse_cdf(weights, torch.tensor([1.0, 1.0]), block).tolist() == [1, 0]


def test_blocked_inverse_cdf_never_rounds_past_the_chosen_blocks_last_token():
    """The block's sum (a reduction) can exceed its own cumulative sum by rounding; a u·total
    falling between the two must still draw the block's last nonzero token (7), not the
    zero-probability end of the block (a row found by search)."""
    head = [4.7546803300102525e-11, 1.2825863393572945e-07, 0.004991015885025263,
            0.0010186814470216632, 1.4593177183996886e-05, 0.11334101110696793,
            0.0018445972818881273, 0.04352833703160286]  # fmt: skip
    tail = [0.0028215954080224037, 8.209983207052574e-06, 5.945397788309492e-05,
            0.02527669258415699, 1.2689748984939797e-07, 0.006427336949855089,
            0.0035371091216802597, 0.04076770693063736]  # fmt: skip
    probs = torch.tensor([head + [0.0] * 24 + tail + [0.0] * 24])
    token = blocked_inverse_cdf(probs, torch.tensor([0.6761642098426819]), block=32)
    assert token.tolist() == [7]


@pytest.mark.parametrize("vocab", [7, 256, 1000])
def test_blocked_inverse_cdf_draws_what_one_cumulative_sum_draws(vocab):
    g = torch.Generator().manual_seed(vocab)
    probs = torch.rand(64, vocab, generator=g) ** 4  # uneven, some blocks near zero
    probs[:, ::5] = 0.0
    uniform = torch.rand(64, generator=g)
    want = inverse_cdf_sample(probs, uniform)
    assert torch.equal(blocked_inverse_cdf(probs, uniform, block=16), want)
    assert len(set(want.tolist())) > min(20, vocab // 2)
    assert bool((probs.gather(-1, want[:, None]) > 0).all())


def test_inverse_cdf_sample_matches_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator().manual_seed(0)
    n = 20000
    tokens = inverse_cdf_sample(probs.expand(n, 4), torch.rand(n, generator=g))
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert freq[1] == 0.0
    # 4.5 binomial standard deviations (sqrt(p(1-p)/n) <= 0.0035)
    torch.testing.assert_close(freq, probs, atol=0.016, rtol=0)


def test_left_pad():
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]]
    assert mask.tolist() == [[1, 1], [0, 1]]


def test_sampling_draws_from_the_temperature_scaled_distribution():
    # logits [0, ln 3] at T = 0.5: z = [0, 2 ln 3], p = [1/10, 9/10], cdf = [0.1, 1.0];
    # u = 0.2 draws token 1 (at T = 1, p = [1/4, 3/4], 0.2 < 0.25 would draw token 0);
    # u = 0.05 < 0.1 draws token 0; the log-probs reported are those under T
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    params = SamplingParams(n=1, temperature=0.5, max_new_tokens=1)
    tokens, logprobs = sample_tokens(logits, params, torch.tensor([0.2, 0.05]))
    assert tokens.tolist() == [1, 0]
    expected = torch.tensor([math.log(0.9), math.log(0.1)])
    assert torch.allclose(logprobs, expected, atol=1e-6)


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    # two tokens of 0.5 each, top_p = 0.5: the first already reaches 0.5, so the nucleus is one
    # token (transformers' TopPLogitsWarper, removing cumulative <= 1 - top_p on the ascending
    # sort, also keeps one)
    assert torch.isinf(filter_logits(torch.zeros(1, 2), 0, 0.5)).sum().item() == 1


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 alone < 0.7, 0.5 + 0.3 >= 0.7, so the first two survive
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    # min-p 0.25: the floor is 0.25 * 0.5 = 0.125, so 0.15 stays and 0.05 goes; 0.5: 0.25
    assert torch.isinf(filter_logits(logits, 0, 1.0, 0.25)).tolist() == [
        [False, False, False, True]
    ]
    assert torch.isinf(filter_logits(logits, 0, 1.0, 0.5)).tolist() == [[False, False, True, True]]
    # after top-k 3 and top-p 0.9 (0.5 + 0.3 < 0.9: three stay), min-p 0.4 keeps two
    both = filter_logits(logits, 3, 0.9, 0.4)
    assert torch.isinf(both).tolist() == [[False, False, True, True]]


def test_min_p_from_the_config_reaches_the_draws(tiny):
    """`rollout.min_p` drops a token a fifth as likely as the best: without it the token is
    drawn about one time in eleven, with it never."""
    from rlvr.config import RLConfig
    from rlvr.data.problem import Problem
    from rlvr.data.tasks import Task
    from rlvr.training.sampling import rollout_batch

    tok = tiny[1]
    model = eos_or_seven_model(tok)
    eight = tok.convert_tokens_to_ids("8")
    with torch.no_grad():
        model.lm_head.bias[eight] = -math.log(5.0)  # p(8) / p(7) = 1/5
    task = Task("file", [Problem(f"What is {i}+1?", str(i + 1)) for i in range(3)], [], "math")
    counts = {}
    for min_p in (0.0, 0.3):
        settings = {"samples_per_prompt": 64, "max_new_tokens": 1, "min_p": min_p}
        cfg = RLConfig.model_validate({"data": {"template": "none"}, "rollout": settings})
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(2)
        )
        batch = rollout_batch(engine, tok, task, [0, 1, 2], cfg)
        counts[min_p] = sum(c[0] == eight for c in batch.completion_ids)
    assert 5 <= counts[0.0] <= 35  # 192 draws at 1/11: about 17
    assert counts[0.3] == 0


def _prompts(tok):
    questions = ["What is 1+2?", "What is 345+678-9?", "What is 7?"]
    return [tok(q, add_special_tokens=False)["input_ids"] for q in questions]


def test_rollout_logprobs_match_an_unpadded_forward(tiny):
    model, tok = tiny
    engine = HFRolloutEngine(
        model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(0)
    )
    prompts = _prompts(tok)
    out = engine.generate(prompts, SamplingParams(n=3, temperature=0.7, max_new_tokens=12))
    assert out.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for i, completion in enumerate(out.completion_ids):
        prompt = prompts[out.prompt_index[i]]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0] / 0.7
        expected = (
            logits.log_softmax(-1)[len(prompt) - 1 : -1]
            .gather(-1, torch.tensor(completion)[:, None])
            .squeeze(-1)
        )
        assert torch.allclose(expected, torch.tensor(out.logprobs[i]), atol=1e-4)


def eos_or_seven_model(tok):
    """A model that samples EOS or "7", each with probability 1/2, whatever the input."""
    biased = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128)
    biased.lm_head = torch.nn.Linear(64, len(tok), bias=True)
    with torch.no_grad():
        biased.lm_head.weight.zero_()
        biased.lm_head.bias.fill_(-20.0)
        biased.lm_head.bias[tok.eos_token_id] = 0.0
        biased.lm_head.bias[tok.convert_tokens_to_ids("7")] = 0.0
    return biased


def test_rollout_stops_at_eos_and_drops_finished_rows(tiny):
    _, tok = tiny
    biased = eos_or_seven_model(tok)
    engine = HFRolloutEngine(
        biased, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(1)
    )
    out = engine.generate(_prompts(tok), SamplingParams(n=8, max_new_tokens=30))
    lengths = [len(c) for c in out.completion_ids]
    assert min(lengths) < 30  # some rows stopped early and others went on
    for completion, reason in zip(out.completion_ids, out.finish_reason):
        if reason == "stop":
            assert completion[-1] == tok.eos_token_id
            assert tok.eos_token_id not in completion[:-1]
        else:
            assert len(completion) == 30 and tok.eos_token_id not in completion


def _drawn_tokens(draws, row, eos, seven, min_new=0, stop=0):
    """The tokens `eos_or_seven_model` gives a row from its uniform draws: the lower id takes
    the lower half of [0, 1); "7" while EOS is banned; up to and with the first EOS, or the
    first run of `stop` sevens (a stop sequence; 0: none)."""
    first, second = sorted([eos, seven])
    tokens = []
    for step, u in enumerate(draws[:, row].tolist()):
        tokens.append(seven if step < min_new else (first if u < 0.5 else second))
        if tokens[-1] == eos or (stop and tokens[-stop:] == [seven] * stop):
            break
    return tokens


def _draws(seed: int, steps: int) -> torch.Tensor:
    """[steps, 24] the uniforms the engine draws for 24 rows, one call a step, from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.rand(24, generator=generator) for _ in range(steps)])


def _eos_or_seven_engine(tok, seed: int) -> HFRolloutEngine:
    """The engine over `eos_or_seven_model`, its draws from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return HFRolloutEngine(
        eos_or_seven_model(tok), [tok.eos_token_id], tok.pad_token_id, generator=generator
    )


def test_each_row_draws_its_uniform_at_each_step_whatever_rows_remain(tiny):
    """Step s draws one uniform per row of the rollout from the generator, [rows] in one call,
    and row r samples with the r-th, whether or not the rows before it are still decoding; the
    tokens follow from those draws (the inverse CDF over EOS and "7", each 1/2)."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 4)
    out = engine.generate(_prompts(tok), SamplingParams(n=8, max_new_tokens=30))
    draws = _draws(4, 30)
    for row, completion in enumerate(out.completion_ids):
        assert completion == _drawn_tokens(draws, row, eos, seven)
    assert len({len(c) for c in out.completion_ids}) > 4  # rows stopped at many steps


@pytest.mark.parametrize("stop", [2, 3])
@pytest.mark.parametrize("decoder", ["fused", "static_buffers", "transformers"])
def test_a_stop_sequence_ends_a_row_as_eos_does(tiny, decoder, stop, monkeypatch):
    """With "77" (or "777") a stop sequence, each row's tokens are the ones its draws give
    (EOS or "7", each 1/2), up to its first EOS or its first "77", kept at its end, on every
    decoder."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 4)
    if decoder == "static_buffers":
        engine.graph_state = GraphState(capture=False)
    if decoder == "transformers":
        monkeypatch.setattr(fused, "supports", lambda model: False)
    params = SamplingParams(n=8, max_new_tokens=30, stop_sequences=((seven,) * stop,))
    out = engine.generate(_prompts(tok), params)
    draws = _draws(4, 30)
    stopped_by_sequence = 0
    for row, completion in enumerate(out.completion_ids):
        expected = _drawn_tokens(draws, row, eos, seven, stop=stop)
        assert completion == expected
        ended = expected[-1] == eos or expected[-stop:] == [seven] * stop
        assert out.finish_reason[row] == ("stop" if ended else "length")
        stopped_by_sequence += completion[-stop:] == [seven] * stop
    assert stopped_by_sequence >= {2: 3, 3: 2}[stop]


def test_min_new_tokens_bans_eos_until_the_minimum(tiny):
    _, tok = tiny
    # without the ban about half the rows would stop at the first token
    biased = eos_or_seven_model(tok)
    engine = HFRolloutEngine(
        biased, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(1)
    )
    out = engine.generate(_prompts(tok), SamplingParams(n=8, max_new_tokens=12, min_new_tokens=5))
    lengths = [len(c) for c in out.completion_ids]
    assert min(lengths) >= 6 and min(lengths) < 12  # EOS first possible as the 6th token
    # the reported log-prob is that of the unmasked distribution: log(1/2) for "7" and EOS
    assert all(lp == pytest.approx(math.log(0.5), abs=1e-6) for c in out.logprobs for lp in c)


def test_same_seed_same_samples(tiny):
    model, tok = tiny
    runs = []
    for _ in range(2):
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(3)
        )
        runs.append(engine.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=8)))
    assert runs[0].completion_ids == runs[1].completion_ids


def test_the_padded_reference_layout_equals_unpadded_logprobs(tiny, padded_reference):
    """`conftest.padded_logits`, the reference of the shared-prefix test below, is right."""
    model, _ = tiny
    prompts, completions = [[3, 40, 41], [3, 40, 41, 42, 43]], [[50, 51, 1], [52]]
    logits, completion_ids, response_mask = padded_reference(model, prompts, completions, [0, 1], 0)
    assert response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    logprobs = token_logprobs(logits, completion_ids, temperature=0.5)
    for row, (p, c) in enumerate(zip(prompts, completions)):
        with torch.no_grad():
            full = (model(torch.tensor([p + c])).logits[0] / 0.5).log_softmax(-1)
        for t, token in enumerate(c):
            assert logprobs[row, t].item() == pytest.approx(
                full[len(p) - 1 + t, token].item(), abs=1e-5
            )


def test_chunked_logprobs_and_entropy_match_direct_formulas():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 5))
    direct = (logits / 2).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    chunked = token_logprobs(logits, tokens, temperature=2.0, chunk_size=4)
    assert torch.allclose(direct, chunked, atol=1e-6)
    weights = torch.randn(3, 5)
    (g1,) = torch.autograd.grad((direct * weights).sum(), logits)
    (g2,) = torch.autograd.grad((chunked * weights).sum(), logits)
    assert torch.allclose(g1, g2, atol=1e-6)
    # by hand, one row: d logp[token] / d logits = (onehot(token) - softmax(logits / 2)) / 2
    onehot = torch.nn.functional.one_hot(tokens[1, 2], 11).float()
    by_hand = weights[1, 2] * (onehot - (logits[1, 2] / 2).softmax(-1)) / 2
    assert torch.allclose(g2[1, 2], by_hand.detach(), atol=1e-6)
    lp, entropy = token_logprobs_and_entropy(logits, tokens, temperature=2.0, chunk_size=4)
    logp_all = (logits / 2).log_softmax(-1)
    direct = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    direct_entropy = -(logp_all.exp() * logp_all).sum(-1)
    assert torch.allclose(lp, direct, atol=1e-6)
    assert torch.allclose(entropy, direct_entropy, atol=1e-6)
    w_lp, w_h = torch.randn(3, 5), torch.randn(3, 5)
    for a, b in ((0, 1), (1, 0), (1, 1)):  # the entropy's gradient alone, and with the log-probs'
        loss = (a * w_lp * lp + b * w_h * entropy).sum()
        reference = (a * w_lp * direct + b * w_h * direct_entropy).sum()
        (g1,) = torch.autograd.grad(reference, logits, retain_graph=True)
        (g2,) = torch.autograd.grad(loss, logits, retain_graph=True)
        assert torch.allclose(g1, g2, atol=1e-6)
    # by hand, one row: dH / d logits = -p · (log p + H) / T
    row = logp_all[2, 4].detach()
    by_hand = -row.exp() * (row + direct_entropy[2, 4].detach()) / 2
    (g,) = torch.autograd.grad(entropy[2, 4], logits)
    assert torch.allclose(g[2, 4], by_hand, atol=1e-6) and g[2, 4].abs().max() > 1e-3


def test_chunked_logprobs_keep_no_fp32_copy_of_the_logits_for_backward():
    """DESIGN rule 7: what backward keeps is the bf16 logits and one fp32 value per row."""
    logits = torch.randn(64, 1000, requires_grad=True).to(torch.bfloat16)
    tokens = torch.randint(0, 1000, (64,))
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    for temperature in (0.7, 1.0):  # 1.0: the softmax kernels read the bf16 logits directly
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = token_logprobs(logits, tokens, temperature=temperature, chunk_size=16)
        assert sum(saved) <= logits.numel() * 2 + 64 * 8  # the logits and the tokens
        (grad,) = torch.autograd.grad(lp.sum(), logits)
        reference = logits.detach().float().requires_grad_()
        direct = (reference / temperature).log_softmax(-1).gather(-1, tokens[:, None]).sum()
        (expected,) = torch.autograd.grad(direct, reference)
        assert grad.dtype == torch.bfloat16
        torch.testing.assert_close(grad.float(), expected, atol=4e-3, rtol=1e-2)


def test_token_budget_micro_batches():
    lengths = [10, 50, 20, 40, 30]
    groups = token_budget_micro_batches(list(range(5)), lengths, max_tokens=80)
    assert sorted(r for g in groups for r in g) == [0, 1, 2, 3, 4]
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[r] for r in group) <= 80
    assert token_budget_micro_batches([0], [500], max_tokens=80) == [[0]]


def test_shared_prefix_forward_equals_the_padded_one_in_value_and_gradient(tiny, padded_reference):
    model, tok = tiny
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for length in (5, 9, 3):  # three prompts of four samples each, ragged completions
        prompt = torch.randint(10, 90, (length,), generator=g).tolist()
        for _ in range(4):
            size = int(torch.randint(1, 8, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(10, 90, (size,), generator=g).tolist())
    rows = [4, 0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11]  # any order

    def shared_prefix_logits(model, prompts, completions, rows, pad_id):
        sb = collate_shared_prefix(prompts, completions, rows, pad_id)
        return forward_logits_shared_prefix(model, sb), sb.completion_ids, sb.response_mask

    results = []
    for forward in (padded_reference, shared_prefix_logits):
        model.zero_grad()
        logits, completion_ids, mask = forward(model, prompts, completions, rows, tok.pad_token_id)
        logprobs = token_logprobs(logits, completion_ids, 0.7) * mask
        (logprobs * torch.linspace(-1, 1, logprobs.numel()).view_as(logprobs)).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logprobs.detach(), grads))
    shared = collate_shared_prefix(prompts, completions, rows, tok.pad_token_id)
    assert shared.prompt_ids.shape[0] == 3  # each distinct prompt once
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)
    assert results[0][1].abs().max() > 0


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_dropout_is_off_unless_the_config_keeps_it(tiny, tmp_path, architecture):
    """`model.disable_dropout` (default true): a model saved with dropout (GPT-2's
    `nn.Dropout` modules, Llama's attention dropout) gives the same log-probs on every forward
    in training mode; with false it does not. The saved config is left as it was."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from rlvr.config import ModelConfig
    from rlvr.models.loading import load_model_and_tokenizer

    tok = tiny[1]
    if architecture == "gpt2":
        config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.5)
        with_dropout = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            attention_dropout=0.5,
        )
        with_dropout = LlamaForCausalLM(config)
    save_pretrained(with_dropout, tok, tmp_path / "m")
    ids = torch.tensor([tok("What is 1+2? The answer is 3.")["input_ids"]])
    for disable, same in ((True, True), (False, False)):
        model, _ = load_model_and_tokenizer(
            ModelConfig(name_or_path=str(tmp_path / "m"), disable_dropout=disable)
        )
        model.train()
        with torch.no_grad():
            assert torch.equal(model(ids).logits, model(ids).logits) is same
    assert (
        model.config.to_dict()["resid_pdrop" if architecture == "gpt2" else "attention_dropout"]
        == 0.5
    )


def test_repetition_penalty_by_hand():
    """Seen tokens: a positive logit divided by the penalty, a negative one multiplied."""
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    seen = torch.tensor([[True, True, False]])
    assert penalize_repeats(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5]]
    # a positive logit below 1 is divided too (0.5 -> 0.25), and a logit of 0 stays 0
    small = penalize_repeats(torch.tensor([[0.5, 0.0]]), torch.tensor([[True, True]]), 2.0)
    assert small.tolist() == [[0.25, 0.0]]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert sample_tokens(logits, greedy, None, seen=seen)[0].tolist() == [0]  # 1.0 > 0.5
    tokens, logps = sample_tokens(
        logits, SamplingParams(temperature=0.0, repetition_penalty=5.0), None, seen=seen
    )
    assert tokens.tolist() == [2]  # 0.4 < 0.5
    assert logps.tolist() == pytest.approx(logits.log_softmax(-1)[:, 2].tolist())  # no penalty


def two_token_model(tok, first: str, second: str):
    """Whatever the input, logits 2.0 for `first`, 1.5 for `second`, -20 for the rest."""
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, intermediate_size=128)
    model.lm_head = torch.nn.Linear(64, len(tok), bias=True)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.fill_(-20.0)
        model.lm_head.bias[tok.convert_tokens_to_ids(first)] = 2.0
        model.lm_head.bias[tok.convert_tokens_to_ids(second)] = 1.5
    return model


def test_repetition_penalty_counts_the_prompt_and_each_rows_own_tokens(tiny):
    """Greedy at penalty 2: a = 2.0 then 1.0 once seen, b = 1.5 then 0.75. From a prompt
    without "7": 7, then 8 (1.0 < 1.5), then 7 for good (1.0 > 0.75); from one with "7": 8
    first. The reported log-probs are the unpenalised policy's."""
    tok = tiny[1]
    model = two_token_model(tok, "7", "8")
    seven, eight = (tok.convert_tokens_to_ids(t) for t in "78")
    engine = HFRolloutEngine(model, [tok.eos_token_id], tok.pad_token_id)
    prompts = [tok("What is 1+2?")["input_ids"], tok("What is 7+1?")["input_ids"]]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=5, repetition_penalty=2.0)
    out = engine.generate(prompts, params)
    a, b = [seven, eight, seven, seven, seven], [eight, seven, seven, seven, seven]
    assert out.completion_ids == [a, a, b, b]
    policy = torch.tensor([2.0, 1.5]).log_softmax(-1)  # the two live tokens; the rest ~e^-20
    for ids, logps in zip(out.completion_ids, out.logprobs):
        expected = [float(policy[0] if t == seven else policy[1]) for t in ids]
        assert logps == pytest.approx(expected, abs=1e-4)
    plain = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=3))
    assert plain.completion_ids == [[seven] * 3, [seven] * 3]


def test_repetition_penalty_from_the_config_reaches_the_draws(tiny):
    from rlvr.config import RLConfig
    from rlvr.data.problem import Problem
    from rlvr.data.tasks import Task
    from rlvr.training.sampling import rollout_batch

    tok = tiny[1]
    model = two_token_model(tok, "7", "8")
    with torch.no_grad():  # at T = 1 as sharp as greedy: 60 vs 40, penalised 30 vs 40
        model.lm_head.bias.mul_(20.0)
    task = Task("file", [Problem("What is 1+2?", "3")], [], "math")
    settings = {"samples_per_prompt": 4, "max_new_tokens": 2}
    for penalty, second in ((1.0, "7"), (2.0, "8")):
        rollout = {**settings, "repetition_penalty": penalty}
        cfg = RLConfig.model_validate({"data": {"template": "none"}, "rollout": rollout})
        engine = HFRolloutEngine(
            model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(0)
        )
        batch = rollout_batch(engine, tok, task, [0], cfg)
        expected = [tok.convert_tokens_to_ids(t) for t in ("7", second)]
        assert batch.completion_ids == [expected] * 4


def test_eos_on_the_last_allowed_token_is_a_stop(tiny):
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 4)
    out = engine.generate(_prompts(tok), SamplingParams(n=8, max_new_tokens=3))
    draws = _draws(4, 3)
    at_last = 0
    for row, completion in enumerate(out.completion_ids):
        assert completion == _drawn_tokens(draws, row, eos, seven)
        assert out.finish_reason[row] == ("stop" if completion[-1] == eos else "length")
        at_last += len(completion) == 3 and completion[-1] == eos
    assert at_last >= 1  # some row sampled EOS as its 3rd, last allowed, token


def test_min_new_tokens_first_allows_eos_at_token_min_plus_one(tiny):
    """min_new_tokens=5 bans EOS at steps 0..4 (those draws give "7"); from step 5 on each
    row's uniform picks EOS or "7", so rows end at exactly the lengths the draws give."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 1)
    params = SamplingParams(n=8, max_new_tokens=12, min_new_tokens=5)
    out = engine.generate(_prompts(tok), params)
    draws = _draws(1, 12)
    for row, completion in enumerate(out.completion_ids):
        assert completion == _drawn_tokens(draws, row, eos, seven, min_new=5)
    assert min(len(c) for c in out.completion_ids) == 6


def test_a_preallocated_layer_holds_exactly_its_capacity():
    """Written in place, the layer hands back every filled position (keys and values of their
    own head sizes) up to `capacity` positions, and refuses one more."""
    layer = PreallocatedLayer(4)
    keys = torch.arange(1 * 2 * 3 * 4, dtype=torch.float32).reshape(1, 2, 3, 4)
    values = torch.arange(1 * 2 * 3 * 5, dtype=torch.float32).reshape(1, 2, 3, 5)
    layer.update(keys, values)
    last_key, last_value = torch.full((1, 2, 1, 4), -1.0), torch.full((1, 2, 1, 5), -2.0)
    all_keys, all_values = layer.update(last_key, last_value)  # the 4th position: full
    assert layer.get_seq_length() == 4
    assert torch.equal(all_keys, torch.cat([keys, last_key], dim=2))
    assert torch.equal(all_values, torch.cat([values, last_value], dim=2))
    with pytest.raises(ValueError, match="KV cache of 4 positions is full"):
        layer.update(last_key, last_value)


def _chunked_tokens(seed, chunk_rows, budget, eos, seven):
    """The tokens `eos_or_seven_model` gives each row when the rollout runs in chunks of
    `chunk_rows` rows: each chunk decodes on its own, one uniform per row of the chunk drawn
    at each step it reaches (until its last row ends or the budget), the lower id taking the
    lower half of [0, 1)."""
    first, second = sorted([eos, seven])
    generator = torch.Generator().manual_seed(seed)
    completions = []
    for rows in chunk_rows:
        tokens: list[list[int]] = [[] for _ in range(rows)]
        live = list(range(rows))
        for _ in range(budget):
            draws = torch.rand(rows, generator=generator).tolist()
            for row in live:
                tokens[row].append(first if draws[row] < 0.5 else second)
            live = [row for row in live if tokens[row][-1] != eos]
            if not live:
                break
        completions += tokens
    return completions


@pytest.mark.parametrize(
    ("batch_size", "prompts", "chunks"),
    [
        (2, 3, [3, 3, 3]),  # fewer rows than n: a prompt a chunk
        (6, 3, [6, 3]),  # two prompts (6 rows) a chunk
        (None, 171, [510, 3]),  # the default 512 rows: 170 prompts of 3, then one
    ],
)
def test_prompts_are_decoded_in_chunks_of_batch_size_rows(tiny, batch_size, prompts, chunks):
    """`generate` decodes `batch_size // n` prompts at a time (at least one), each chunk
    with its own draws: the tokens are those each chunk's draws give, and each completion
    names its prompt."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    sizes = {} if batch_size is None else {"batch_size": batch_size}
    engine = HFRolloutEngine(
        eos_or_seven_model(tok),
        [tok.eos_token_id],
        tok.pad_token_id,
        generator=torch.Generator().manual_seed(5),
        **sizes,
    )
    questions = [_prompts(tok)[i % 3] for i in range(prompts)]
    out = engine.generate(questions, SamplingParams(n=3, max_new_tokens=6))
    assert out.completion_ids == _chunked_tokens(5, chunks, 6, eos, seven)
    assert out.prompt_index == [i // 3 for i in range(3 * prompts)]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("min_new", [1, 5])
def test_min_new_tokens_bans_eos_for_exactly_the_first_min_new_tokens(tiny, min_new, overlap):
    """min_new_tokens=1 bans EOS at the first token only; with `overlap` (each step launched
    before the host reads the last one) the ban ends at the same step."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 1)
    engine.overlap = overlap
    out = engine.generate(
        _prompts(tok), SamplingParams(n=8, max_new_tokens=12, min_new_tokens=min_new)
    )
    draws = _draws(1, 12)
    for row, completion in enumerate(out.completion_ids):
        assert completion == _drawn_tokens(draws, row, eos, seven, min_new=min_new)
    assert min(len(c) for c in out.completion_ids) == min_new + 1


@pytest.mark.parametrize("decoder", ["fused", "static_buffers", "transformers"])
def test_each_prompts_tokens_are_penalised_in_its_own_rows_only(tiny, decoder, monkeypatch):
    """The prompt holding "7" first: its rows start with "8", the other prompt's rows, whose
    prompt has no "7", with "7" (greedy, penalty 2: a = 2.0 -> 1.0 once seen, b = 1.5), on
    every decoder (the static-buffer step cannot penalise: the engine leaves it)."""
    tok = tiny[1]
    model = two_token_model(tok, "7", "8")
    seven, eight = (tok.convert_tokens_to_ids(t) for t in "78")
    engine = HFRolloutEngine(model, [tok.eos_token_id], tok.pad_token_id)
    if decoder == "static_buffers":
        engine.graph_state = GraphState(capture=False)
    if decoder == "transformers":
        monkeypatch.setattr(fused, "supports", lambda model: False)
    prompts = [tok("What is 7+1?")["input_ids"], tok("What is 1+2?")["input_ids"]]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=3, repetition_penalty=2.0)
    out = engine.generate(prompts, params)
    a, b = [seven, eight, seven], [eight, seven, seven]
    assert out.completion_ids == [b, b, a, a]


def test_rollout_logprobs_of_a_model_with_learned_positions_match_an_unpadded_forward(tiny):
    """GPT-2 (absolute, learned position embeddings, decoded by the `transformers` forward):
    each left-padded prompt's tokens sit at positions 0, 1, ... as in an unpadded forward, so
    the rollout's log-probs are that forward's."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny[1]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2)).eval()
    engine = HFRolloutEngine(
        model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(0)
    )
    prompts = _prompts(tok)
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=8))
    for i, completion in enumerate(out.completion_ids):
        prompt = prompts[out.prompt_index[i]]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0] / 0.7
        expected = logits.log_softmax(-1)[len(prompt) - 1 : -1].gather(
            -1, torch.tensor(completion)[:, None]
        )
        assert torch.allclose(expected.squeeze(-1), torch.tensor(out.logprobs[i]), atol=1e-4)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("budget", [2, 30])
def test_consecutive_rollouts_draw_on_from_where_the_last_one_stopped(tiny, budget, overlap):
    """One generator over consecutive rollouts: each draws one uniform per row at each step it
    decodes and none after its last (the budget's, or the one at which its last row ended,
    also where `overlap` launched the next step before the host knew), so the second
    rollout's tokens are those of the draws after the first's."""
    _, tok = tiny
    eos, seven = tok.eos_token_id, tok.convert_tokens_to_ids("7")
    engine = _eos_or_seven_engine(tok, 6)
    engine.overlap = overlap
    params = SamplingParams(n=8, max_new_tokens=budget)
    first, second = (engine.generate(_prompts(tok), params).completion_ids for _ in range(2))
    assert first + second == _chunked_tokens(6, [24, 24], budget, eos, seven)
    reached = any(len(c) == budget and c[-1] != eos for c in first)
    assert reached == (budget == 2)  # at 30 every row ended first: no step was left to draw
