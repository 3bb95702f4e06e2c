"""The `reward_model` model reward: a sequence classifier's first logit at the last token."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaForSequenceClassification
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError, ModelConfig
from rlvr.models.loading import save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rewards.model_based import (
    RewardContext,
    RewardModelOptions,
    build_reward_model,
    load_reward_model,
    parse_options,
)
from rlvr.rewards.reward_model import reward_model_texts
from tiny_run import TINY_RUN


def tiny_classifier(seed: int = 0) -> tuple[LlamaForSequenceClassification, object]:
    """A one-layer Llama sequence classifier on the tiny tokenizer, random weights."""
    tokenizer = build_tiny_tokenizer()
    lm = build_tiny_model(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64
    )
    lm.config.num_labels = 1
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(lm.config).eval(), tokenizer


@pytest.fixture(scope="module")
def saved_classifier(tmp_path_factory) -> tuple[str, LlamaForSequenceClassification, object]:
    folder = tmp_path_factory.mktemp("rm")
    model, tokenizer = tiny_classifier()
    save_pretrained(model, tokenizer, folder)
    return str(folder), model, tokenizer


def one_at_a_time(model, tokenizer, text: str, keep: int | None = None) -> float:
    """The classifier's score of `text` alone (no padding), its last `keep` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][-(keep or 0) :]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_texts_use_the_reward_model_s_chat_template_or_prompt_then_completion() -> None:
    tokenizer = build_tiny_tokenizer()
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert reward_model_texts(tokenizer, ["P"], ["C"], [chat], True) == [
        "<|system|>S<|im_end|><|user|>U<|im_end|><|assistant|>C<|im_end|>"
    ]
    assert reward_model_texts(tokenizer, ["P"], ["C"], None, True) == [
        "<|user|>P<|im_end|><|assistant|>C<|im_end|>"
    ]
    assert reward_model_texts(tokenizer, ["P", "Q"], ["C", "D"], [chat] * 2, False) == ["PC", "QD"]


def test_scores_are_the_classifier_s_on_each_text_alone(saved_classifier) -> None:
    """Batched and padded on the right, the scores equal one forward per unpadded text."""
    path, model, tokenizer = saved_classifier
    prompts = ["1+2=", "3+4+5=", "9=", "0+0=", "7+1="]
    completions = ["3", "twelve, since 3+4 is 7", "", "0 0 0 0 0 0", "8"]
    for options, keep in (({"batch_size": 2}, None), ({"batch_size": 3, "max_length": 6}, 6)):
        reward = build_reward_model(
            {"model": path, "chat_template": False, **options}, RewardContext()
        )
        got = reward(prompts, completions, torch.arange(5), {}).scores
        want = [one_at_a_time(model, tokenizer, p + c, keep) for p, c in zip(prompts, completions)]
        assert got == pytest.approx(want, abs=1e-5)
        assert len(set(got)) == 5
    reward = build_reward_model({"model": path}, RewardContext())  # its tokenizer has a template
    chat = [[{"role": "user", "content": p}] for p in prompts]
    got = reward(prompts, completions, torch.arange(5), {"prompt_messages": chat}).scores
    texts = reward_model_texts(tokenizer, prompts, completions, chat, True)
    assert got == pytest.approx([one_at_a_time(model, tokenizer, t) for t in texts], abs=1e-5)


def test_the_reward_model_takes_the_policy_s_dtype_or_its_own(saved_classifier) -> None:
    path = saved_classifier[0]
    policy = RewardContext(model_config=ModelConfig(dtype="bfloat16"))
    for options, context, dtype in (
        ({}, RewardContext(), torch.float32),
        ({}, policy, torch.bfloat16),
        ({"dtype": "float32"}, policy, torch.float32),
    ):
        model, _ = load_reward_model(RewardModelOptions(model=path, **options), context)
        assert {p.dtype for p in model.parameters()} == {dtype}
        assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_a_causal_lm_or_a_missing_folder_is_a_config_error(tmp_path) -> None:
    tokenizer = build_tiny_tokenizer()
    save_pretrained(build_tiny_model(tokenizer, hidden_size=16, num_layers=1), tokenizer, tmp_path)
    with pytest.raises(ConfigError, match="is a LlamaForCausalLM, not a \\*ForSequenceClass"):
        build_reward_model({"model": str(tmp_path)}, RewardContext())
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"model '{missing}': no Hugging Face model there"):
        build_reward_model({"model": str(missing)}, RewardContext())
    with pytest.raises(ConfigError, match="option 'model' is required"):
        build_reward_model({}, RewardContext())


def test_reward_model_option_bounds() -> None:
    # One sequence per forward and a one-token window are the smallest settings.
    opts = parse_options(RewardModelOptions, "reward_model", {"model": "m", "batch_size": 1})
    assert (opts.batch_size, opts.max_length) == (1, None)
    smallest = {"model": "m", "batch_size": 1, "max_length": 1}
    assert parse_options(RewardModelOptions, "reward_model", smallest).max_length == 1
    for key in ("batch_size", "max_length"):
        with pytest.raises(ConfigError, match=f"option '{key}': Input should be greater"):
            parse_options(RewardModelOptions, "reward_model", {"model": "m", key: 0})


def test_training_on_the_reward_model_logs_its_scores(saved_classifier, tmp_path) -> None:
    """Each logged sample's reward is the classifier's score of its prompt and completion."""
    path, model, tokenizer = saved_classifier
    options = f"{{model: {path}, chat_template: false}}"
    reward = f"reward.functions=[{{name: reward_model, options: {options}}}]"
    settings = [*TINY_RUN, "train.steps=2", "train.log_samples=12", f"train.output_dir={tmp_path}"]
    result = CliRunner().invoke(app, ["train", *settings, reward])
    assert result.exit_code == 0, result.output
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 24
    for sample in samples:
        want = one_at_a_time(model, tokenizer, sample["prompt"] + sample["completion"])
        assert sample["reward"] == pytest.approx(want, abs=1e-5)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(m["reward/errors"] == 0 and "reward/reward_model" in m for m in steps)


def test_the_policy_learns_what_the_reward_model_prefers(tmp_path) -> None:
    """A classifier that scores only the last token (attention and MLP outputs zeroed), 1 for
    `5` and less for any other: GRPO on it makes the completions end with `5`."""
    model, tokenizer = tiny_classifier()
    target = tokenizer.convert_tokens_to_ids("5")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        last = model.model.norm(model.model.embed_tokens.weight[target])
        model.score.weight.copy_(last[None] / last.norm() ** 2)
    save_pretrained(model, tokenizer, tmp_path / "rm")
    options = f"{{model: {tmp_path / 'rm'}, chat_template: false}}"
    settings = [
        *TINY_RUN,
        f"reward.functions=[{{name: reward_model, options: {options}}}]",
        "rollout.samples_per_prompt=8",
        "rollout.max_new_tokens=4",
        "train.lr=1e-2",
        "train.steps=30",
        f"train.output_dir={tmp_path / 'run'}",
    ]
    result = CliRunner().invoke(app, ["train", *settings])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rewards = [json.loads(line)["reward/mean"] for line in lines]
    assert sum(rewards[:3]) / 3 < 0.2 and sum(rewards[-3:]) / 3 > 0.8, rewards
    samples = [
        json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    ]
    assert all(s["completion"].endswith("5") for s in samples if s["step"] == 30)
