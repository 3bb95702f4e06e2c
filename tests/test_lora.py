"""LoRA adapters (`model.lora`): the adapted function, what trains, saving, resuming, the
reference, and a run of each training command with them."""

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from rlvr.config import ConfigError, LoraConfig, ModelConfig, resolve_config
from rlvr.config_offline import SFTConfig
from rlvr.models import lora
from rlvr.models.loading import load_model_and_tokenizer, load_pretrained, save_pretrained
from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.regularization import Regularization
from rlvr.training.rl import train
from rlvr.training.sft import run_sft
from tiny_run import TINY_RUN

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 48}


def tiny(rank: int = 0, **lora_settings) -> torch.nn.Module:
    cfg = ModelConfig(tiny=TINY, lora=LoraConfig(rank=rank, **lora_settings))
    torch.manual_seed(0)  # peft draws A from the global generator: the same A in any test order
    return load_model_and_tokenizer(cfg, seed=0)


def randomize_adapters(model: torch.nn.Module) -> None:
    """Give B (zero at the start) values, so that the adapters change the function."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


IDS = torch.tensor([[5, 9, 14, 3, 27, 8, 11], [2, 40, 7, 7, 19, 30, 6]])


def test_only_the_low_rank_factors_train():
    model, _ = tiny(rank=4)
    c = model.config
    hidden, inner, kv = c.hidden_size, c.intermediate_size, c.num_key_value_heads * c.head_dim
    # per layer, r · (in + out) for q, k, v, o, gate, up, down; the LM head is not adapted
    per_layer = 4 * (
        (hidden + hidden) + 2 * (hidden + kv) + (hidden + hidden) + 2 * (hidden + inner)
    ) + 4 * (inner + hidden)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(trainable.values()) == c.num_hidden_layers * per_layer
    assert all("lora_A" in n or "lora_B" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)


def test_adapted_projection_is_w_plus_scaled_b_a():
    base, _ = tiny()
    model, _ = tiny(rank=4, alpha=6.0)
    assert torch.equal(logits(model, IDS), logits(base, IDS))  # B = 0: the base function
    randomize_adapters(model)
    q = model.model.layers[0].self_attn.q_proj
    w = base.model.layers[0].self_attn.q_proj.weight
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight
    x = torch.randn(3, w.shape[1])
    by_hand = x @ w.T + (6.0 / 4) * (x @ a.T) @ b.T  # Hu et al. 2021, eq. 3
    torch.testing.assert_close(q(x), by_hand, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits(model, IDS), logits(base, IDS))


def test_the_update_term_is_what_the_adapter_adds_and_nothing_when_disabled():
    model, _ = tiny(rank=4)
    randomize_adapters(model)
    up = model.eval().model.layers[1].mlp.up_proj
    x = torch.randn(5, up.in_features)
    with torch.no_grad():
        by_hand = (16.0 / 4) * x @ up.lora_A["default"].weight.T @ up.lora_B["default"].weight.T
        torch.testing.assert_close(lora.update_term(up, x), by_hand)
        torch.testing.assert_close(up.base_layer(x) + lora.update_term(up, x), up(x))
        with lora.adapters_disabled(model):
            assert lora.update_term(up, x) is None
        plain = up.base_layer(x)
        up.merge()  # the term folded into the base weight: adding it again would count it twice
        assert lora.update_term(up, x) is None
        torch.testing.assert_close(up.base_layer(x), plain + by_hand, rtol=1e-5, atol=1e-5)
    assert lora.update_term(up.base_layer, x) is None
    assert lora.base_layer(up) is up.base_layer and lora.base_layer(model.lm_head) is model.lm_head


def test_the_update_term_sums_the_active_adapters():
    from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model

    model, _ = tiny(rank=4)
    inject_adapter_in_model(PeftLoraConfig(r=2, target_modules=["up_proj"]), model, "other")
    randomize_adapters(model)
    up = model.eval().model.layers[1].mlp.up_proj
    up.set_adapter(["default", "other"])
    x = torch.randn(5, up.in_features)
    with torch.no_grad():
        both = lora.update_term(up, x)
        torch.testing.assert_close(up.base_layer(x) + both, up(x))
        alone = (8.0 / 2) * x @ up.lora_A["other"].weight.T @ up.lora_B["other"].weight.T
        assert not torch.allclose(both, alone)  # not the last adapter's term alone


def test_adapters_disabled_computes_the_base_model_and_turns_them_back_on():
    base, _ = tiny()
    model, _ = tiny(rank=4)
    randomize_adapters(model)
    adapted = logits(model, IDS)
    with lora.adapters_disabled(model):
        torch.testing.assert_close(logits(model, IDS), logits(base, IDS), rtol=0, atol=0)
    assert torch.equal(logits(model, IDS), adapted)
    with pytest.raises(KeyError), lora.adapters_disabled(model):
        raise KeyError("inside")
    assert torch.equal(logits(model, IDS), adapted)


def test_a_saved_lora_model_is_merged_and_its_adapter_loads_in_peft_and_rlvr(tmp_path):
    model, tokenizer = tiny(rank=4)
    randomize_adapters(model)
    expected = logits(model, IDS)
    save_pretrained(model, tokenizer, tmp_path)
    merged, _ = load_pretrained(str(tmp_path))
    assert not lora.has_lora(merged)
    q = model.model.layers[1].self_attn.q_proj
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight
    by_hand = q.base_layer.weight + (16.0 / 4) * b @ a  # the default alpha is 16
    torch.testing.assert_close(merged.model.layers[1].self_attn.q_proj.weight, by_hand)
    # the same function up to fp32 rounding (the product of merged weights rounds differently)
    scale = expected.abs().max()
    torch.testing.assert_close(logits(merged, IDS) / scale, expected / scale, rtol=0, atol=1e-5)
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all(k.startswith("base_model.model.") and "lora_" in k for k in saved)
    base, _ = tiny()
    assert set(lora.merged_state_dict(model)) == set(base.state_dict())  # no adapter keys
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(logits(peft_model, IDS), expected, rtol=0, atol=0)
    fresh, _ = tiny(rank=4)
    lora.load_adapter(fresh, tmp_path)
    assert torch.equal(logits(fresh, IDS), expected)


@pytest.mark.parametrize(
    ("settings", "match"),
    [({"rank": 8}, "size mismatch"), ({"rank": 4, "target_modules": ["q_proj"]}, "unexpected")],
)
def test_an_adapter_of_other_settings_is_an_error_naming_the_file(tmp_path, settings, match):
    model, tokenizer = tiny(rank=4)
    save_pretrained(model, tokenizer, tmp_path)
    other, _ = tiny(**settings)
    with pytest.raises(ValueError, match=rf"adapter_model\.safetensors.*{match}"):
        lora.load_adapter(other, tmp_path)


def test_an_adapter_on_fewer_modules_than_the_model_has_is_an_error(tmp_path):
    model, tokenizer = tiny(rank=4, target_modules=["q_proj"])
    save_pretrained(model, tokenizer, tmp_path)
    other, _ = tiny(rank=4)  # all-linear: k_proj and the others would keep their own B, A
    with pytest.raises(ValueError, match=r"adapter_model\.safetensors.*missing: \['"):
        lora.load_adapter(other, tmp_path)


def test_the_saved_adapter_names_the_model_it_adapts(tmp_path):
    model, tokenizer = tiny()
    save_pretrained(model, tokenizer, tmp_path / "base")
    cfg = ModelConfig(name_or_path=str(tmp_path / "base"), lora=LoraConfig(rank=4))
    adapted, _ = load_model_and_tokenizer(cfg)
    save_pretrained(adapted, tokenizer, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "base")


def test_an_adapter_folder_loads_as_its_base_model_with_the_adapter_merged(tmp_path):
    base, tokenizer = tiny()
    save_pretrained(base, tokenizer, tmp_path / "base")
    cfg = ModelConfig(name_or_path=str(tmp_path / "base"), lora=LoraConfig(rank=4))
    torch.manual_seed(0)
    adapted, _ = load_model_and_tokenizer(cfg)
    randomize_adapters(adapted)
    save_pretrained(adapted, tokenizer, tmp_path / "out")
    folder = tmp_path / "out" / "adapter"  # adapter_config.json and weights, no config.json
    model, loaded_tokenizer = load_pretrained(str(folder))
    assert not lora.has_lora(model)
    merged, _ = load_pretrained(str(tmp_path / "out"))  # rlvr's own merged weights
    for name, weight in merged.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], weight, rtol=0, atol=1e-6)
    assert not torch.allclose(logits(model, IDS), logits(base, IDS))  # the adapter changed it
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()


def test_an_adapter_folder_without_its_base_model_is_an_error_naming_both(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    for settings in ({"peft_type": "LORA"}, {"base_model_name_or_path": ""}):
        (folder / "adapter_config.json").write_text(json.dumps(settings))
        with pytest.raises(ValueError, match=r"'.*adapter': a PEFT adapter whose .* names no"):
            load_pretrained(str(folder))
    gone = str(tmp_path / "gone")
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": gone}))
    with pytest.raises(
        ValueError,
        match=r"adapter'.*its base model \(adapter_config.json's base_model_name_or_path\) "
        r"'.*gone': no Hugging Face model there \(path does not exist\)",
    ):
        load_pretrained(str(folder))
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"adapter': cannot read adapter_config\.json \("):
        load_pretrained(str(folder))


def test_an_adapter_folder_on_another_base_model_is_an_error_naming_both(tmp_path):
    model, tokenizer = tiny(rank=4)
    save_pretrained(model, tokenizer, tmp_path / "out")
    other = ModelConfig(tiny={**TINY, "hidden_size": 16, "intermediate_size": 24})
    save_pretrained(*load_model_and_tokenizer(other), tmp_path / "other")
    settings = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = str(tmp_path / "other")
    (tmp_path / "out" / "adapter" / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(
        ValueError, match=r"adapter': the adapter does not load onto its base model '.*other' \("
    ):
        load_pretrained(str(tmp_path / "out" / "adapter"))


def test_a_missing_adapter_is_an_error_naming_the_path(tmp_path):
    model, _ = tiny(rank=4)
    with pytest.raises(FileNotFoundError, match=r"adapter_model\.safetensors"):
        lora.load_adapter(model, tmp_path)


def test_the_adapters_dropout_is_the_configured_one():
    model, _ = tiny(rank=4, dropout=0.25)  # after disable_dropout_: the adapters' own stays
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q.lora_dropout["default"], torch.nn.Dropout)
    assert q.lora_dropout["default"].p == 0.25


def test_an_unknown_target_module_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules.*no_such_proj"):
        tiny(rank=4, target_modules=["no_such_proj"])


def test_a_target_module_that_matches_nothing_is_named_even_when_others_match():
    """peft refuses a list of target modules only when none of them matches; one mistyped
    name among good ones would train fewer modules than asked without a word."""
    with pytest.raises(ConfigError) as caught:
        tiny(rank=4, target_modules=["q_proj", "v_prj", "mlp.up_proj", "self_attn.o"])
    assert str(caught.value) == (
        "model.lora.target_modules=['q_proj', 'v_prj', 'mlp.up_proj', 'self_attn.o']: this "
        "model has no module named v_prj, self_attn.o (its linear layers: down_proj, "
        "gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj)"
    )
    model, _ = tiny(rank=4, target_modules=["q_proj", "mlp.up_proj"])  # a dotted suffix is a name
    assert sorted(lora.lora_layers(model)) == [
        f"model.layers.{i}.{name}" for i in (0, 1) for name in ("mlp.up_proj", "self_attn.q_proj")
    ]


def test_an_adapter_on_a_tied_lm_head_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules.*ties its LM head"):
        tiny(rank=4, target_modules=["q_proj", "lm_head"])


def test_the_fixed_reference_of_a_lora_policy_is_the_policy_itself():
    model, _ = tiny(rank=4)
    fixed = resolve_config(preset="grpo", overrides=["algorithm.kl.coef=0.1"]).algorithm
    assert Regularization(fixed, model).reference is model
    off = fixed.model_copy(update={"kl": fixed.kl.model_copy(update={"coef": 0.0})})
    assert Regularization(off, model).reference is None  # no KL term: nothing to score
    moving = fixed.model_copy(update={"kl": fixed.kl.model_copy(update={"reference_ema": 0.5})})
    copied = Regularization(moving, model).reference
    assert copied is not model and lora.has_lora(copied)


def rl_config(tmp_path, *extra):
    return resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "model.lora.rank=4",
            "model.lora.alpha=8",
            # the untrained tiny model earns no reward; an entropy bonus trains every sample
            "algorithm.entropy.coef=0.05",
            "train.lr=1e-2",
            f"train.output_dir={tmp_path}",
            *extra,
        ],
    )


def test_an_rl_run_trains_the_adapters_only_against_the_base_model(tmp_path):
    cfg = rl_config(tmp_path, "train.steps=3", "algorithm.kl.coef=0.1")
    run_dir = train(cfg, show_progress=False)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # step 1's policy is the base model, its reference; the adapters move it away after
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics[-1]["kl"] > 1e-5
    checkpoint = latest_checkpoint(run_dir)
    without = cfg.model.model_copy(update={"lora": LoraConfig()})
    base, _ = load_model_and_tokenizer(without, seed=cfg.train.seed)
    trained = load_pretrained(str(checkpoint))[0].state_dict()
    for name, weight in base.state_dict().items():
        adapted = name.endswith("_proj.weight")
        assert torch.equal(trained[name], weight) != adapted, name
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()


def test_sft_with_lora_lowers_the_loss_and_saves_the_merged_model(tmp_path):
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": TINY, "lora": {"rank": 8, "alpha": 16}},
            "data": {"max_digits": 1, "max_terms": 3, "train_size": 200, "test_size": 10},
            "sft": {"steps": 120, "lr": 1e-2, "batch_size": 16, "output_dir": str(tmp_path)},
        }
    )
    out = run_sft(cfg, show_progress=False)
    losses = [r["loss"] for r in read_jsonl(out / "metrics.jsonl")]
    # measured: 4.66 -> 4.37 nats (lr 0: 4.68 -> 4.68); the random base's frozen embeddings
    # and head leave rank-8 updates of a 32-wide model far slower than full fine-tuning
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.15
    merged, _ = load_pretrained(str(out))
    without = cfg.model.model_copy(update={"lora": LoraConfig()})
    base, _ = load_model_and_tokenizer(without, seed=cfg.sft.seed)
    assert torch.equal(merged.lm_head.weight, base.lm_head.weight)
    up = merged.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(up, base.model.layers[0].mlp.up_proj.weight)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
