"""Reference-likelihood rewards: the three reward forms by hand, the batched scorer against a
plain forward pass on the tiny model, the ``reference_likelihood`` model reward and a short RL
run that uses it."""

import math

import pytest
import torch

from rlvr.config import ConfigError, ModelConfig, RewardSpec, TinyModelConfig, resolve_config
from rlvr.models.loading import load_model_and_tokenizer, save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rewards.likelihood import (
    likelihood_improvement,
    reasoning_part,
    reference_likelihood_rewards,
    target_logprobs,
)
from rlvr.rewards.model_based import RewardContext, build_model_rewards, score_model_reward
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from tiny_run import TINY_RUN

TINY = ModelConfig(
    tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
)

# Per-token probabilities of a 2-token reference with and without the reasoning.
WITH = torch.log(torch.tensor([0.5, 0.25]))
WITHOUT = torch.log(torch.tensor([0.25, 0.125]))


def test_likelihood_improvement_by_hand():
    # logprob: mean(ln .5, ln .25) - mean(ln .25, ln .125) = ln 2 (each token twice as likely)
    assert likelihood_improvement(WITH, WITHOUT, "logprob") == pytest.approx(math.log(2))
    # perplexity: PPL_with = 1/sqrt(.5 * .25), PPL_without = 2 * PPL_with -> 100 (1 - 1/2) = 50
    assert likelihood_improvement(WITH, WITHOUT, "perplexity") == pytest.approx(50.0)
    # probability (RLPR): mean(.5, .25) - mean(.25, .125) = .375 - .1875
    assert likelihood_improvement(WITH, WITHOUT, "probability") == pytest.approx(0.1875)
    # the reverse: log-PPL and VR-CLI go negative (PPL doubles: 100 (1 - 2) = -100); RLPR clips
    assert likelihood_improvement(WITHOUT, WITH, "logprob") == pytest.approx(-math.log(2))
    assert likelihood_improvement(WITHOUT, WITH, "perplexity") == pytest.approx(-100.0)
    assert likelihood_improvement(WITHOUT, WITH, "probability") == 0.0
    with pytest.raises(ValueError, match="unknown likelihood mode 'ppl'"):
        likelihood_improvement(WITH, WITHOUT, "ppl")


def test_reasoning_part():
    assert reasoning_part("<think>3+4</think><answer>7</answer>", "<answer>") == (
        "<think>3+4</think>"
    )
    assert reasoning_part("no marker", "<answer>") == "no marker"
    assert reasoning_part("all of it", None) == "all of it"


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer(TINY, seed=0)


def hand_mean_logprob(model, tokenizer, context: str, target: str) -> tuple[float, float]:
    """(mean log-prob, mean prob) of `target` after `context`: one unpadded forward pass."""
    c = tokenizer(context, add_special_tokens=False)["input_ids"]
    t = tokenizer(target, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([c + t])).logits[0].double()
    logprobs = logits.log_softmax(-1)
    # logits at position len(c) - 1 + k score target token k (DESIGN rule 3)
    picked = torch.stack([logprobs[len(c) - 1 + k, tok] for k, tok in enumerate(t)])
    return float(picked.mean()), float(picked.exp().mean())


PROMPTS = ["<|user|>What is 3+4?<|im_end|><|assistant|>"] * 3 + ["<|user|>2-9?<|assistant|>"]
COMPLETIONS = [
    "<think>3+4=7</think><answer>7</answer>",
    "<think>no idea at all</think><answer>8</answer>",
    "",
    "<think>2-9=-7</think>",
]
REFERENCES = ["7", "7", "7", "-7"]


@pytest.mark.parametrize("mode", ["logprob", "perplexity", "probability"])
def test_reference_likelihood_matches_a_plain_forward_pass(tiny, mode):
    model, tokenizer = tiny
    model.train()
    rewards = reference_likelihood_rewards(
        model,
        tokenizer,
        PROMPTS,
        COMPLETIONS,
        REFERENCES,
        mode=mode,
        answer_prefix="<answer>",
        answer_suffix="</answer>",
        reasoning_stop="<answer>",
        micro_batch_tokens=80,  # several micro-batches, with padding
    )
    assert model.training  # scoring ran in eval mode and restored the module's mode
    for i, reward in enumerate(rewards):
        reasoning = COMPLETIONS[i].split("<answer>")[0]
        target = REFERENCES[i] + "</answer>"
        lp_with, p_with = hand_mean_logprob(
            model, tokenizer, PROMPTS[i] + reasoning + "<answer>", target
        )
        lp_without, p_without = hand_mean_logprob(model, tokenizer, PROMPTS[i] + "<answer>", target)
        expected = {
            "logprob": lp_with - lp_without,
            "perplexity": 100 * (1 - math.exp(-lp_with) / math.exp(-lp_without)),
            "probability": min(max(p_with - p_without, 0.0), 1.0),
        }[mode]
        scale = 100.0 if mode == "perplexity" else 1.0  # VR-CLI's I is in percent
        assert reward == pytest.approx(expected, abs=2e-5 * scale), i
    assert rewards[2] == pytest.approx(0.0, abs=1e-6)  # empty reasoning: no change


def test_target_logprobs_layout_and_errors(tiny):
    model, tokenizer = tiny
    contexts, targets = [[10, 11, 12], [13]], [[14, 15], [16, 17, 18]]
    scored = target_logprobs(model, contexts, targets, tokenizer.pad_token_id)
    assert [s.shape[0] for s in scored] == [2, 3]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[13, 16, 17, 18]])).logits[0].log_softmax(-1)
    by_hand = [logits[k, token].item() for k, token in enumerate([16, 17, 18])]
    assert scored[1].tolist() == pytest.approx(by_hand, abs=1e-5)
    with pytest.raises(ValueError, match="2 contexts for 1 targets"):
        target_logprobs(model, contexts, targets[:1], 0)
    with pytest.raises(ValueError, match="pair 1: the context and the target must both be"):
        target_logprobs(model, [[1], []], [[2], [3]], 0)


def test_target_logprobs_keeps_each_forward_within_the_token_budget(tiny):
    # Two pairs of 3 + 2 = 5 tokens under a budget of 5: one pair per forward pass.
    model, tokenizer = tiny
    rows: list[int] = []
    embeddings = model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    try:
        contexts, targets = [[10, 11, 12], [13, 14, 15]], [[16, 17], [18, 19]]
        target_logprobs(model, contexts, targets, tokenizer.pad_token_id, micro_batch_tokens=5)
    finally:
        hook.remove()
    assert rows and set(rows) == {1}  # every forward (the context's and the target's) one row


def test_reference_likelihood_input_errors(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="2 prompts, 1 completions, 1 references"):
        reference_likelihood_rewards(model, tokenizer, ["a", "b"], ["c"], ["d"])
    with pytest.raises(ValueError, match="sample 0: the reference must be a non-empty string"):
        reference_likelihood_rewards(model, tokenizer, ["a"], ["c"], [""])
    with pytest.raises(ValueError, match="unknown likelihood mode 'nll'"):
        reference_likelihood_rewards(model, tokenizer, ["a"], ["c"], ["d"], mode="nll")


def test_a_model_path_loads_that_model_with_or_without_the_policy(tmp_path, tiny):
    tokenizer = build_tiny_tokenizer()
    save_pretrained(build_tiny_model(tokenizer, hidden_size=16, num_layers=1), tokenizer, tmp_path)
    # The path's model, not the policy (hidden size 32) nor its initial weights (model_config).
    for context in (RewardContext(), RewardContext(*tiny, model_config=TINY)):
        model, _ = context.model(str(tmp_path), "model")
        assert model.config.hidden_size == 16


def test_policy_and_frozen_need_the_policy_and_its_tokenizer(tiny):
    model, _ = tiny
    for context, which in [(RewardContext(), "frozen"), (RewardContext(model), "policy")]:
        with pytest.raises(ConfigError, match=f"model={which!r} needs the policy and its token"):
            context.model(which, "model")


def test_frozen_is_the_initial_policy_not_the_current_one():
    policy, tokenizer = load_model_and_tokenizer(TINY, seed=0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)  # the policy has trained away from its initial weights
    context = RewardContext(policy, tokenizer, model_config=TINY, seed=0)
    spec = RewardSpec(name="reference_likelihood", options={"model": "frozen"})
    (weight, reward), *_ = build_model_rewards([spec], context).values()
    frozen, _ = context.model("frozen", "model")
    initial, _ = load_model_and_tokenizer(TINY, seed=0)
    for a, b in zip(frozen.state_dict().values(), initial.state_dict().values()):
        assert torch.equal(a, b)
    assert not any(p.requires_grad for p in frozen.parameters())
    result = score_model_reward(
        "reference_likelihood",
        reward,
        PROMPTS,
        COMPLETIONS,
        torch.tensor([0, 0, 0, 1]),
        {"answer": REFERENCES},
    )
    expected = reference_likelihood_rewards(initial, tokenizer, PROMPTS, COMPLETIONS, REFERENCES)
    assert weight == 1.0 and result.errors == 0
    assert result.scores == pytest.approx(expected, abs=1e-6)
    # a missing reference column or a missing reference is counted, not raised
    missing = score_model_reward("reference_likelihood", reward, ["p"], ["c"], torch.zeros(1), {})
    assert missing.scores == [0.0] and missing.errors == 1
    assert "no reward column 'answer'" in missing.error_examples[0]
    none = score_model_reward(
        "reference_likelihood", reward, ["p"], ["c"], torch.zeros(1), {"answer": [None]}
    )
    assert none.errors == 1 and "non-empty string" in none.error_examples[0]


def test_likelihood_option_errors(tiny):
    context = RewardContext(*tiny)
    with pytest.raises(ConfigError, match=r"reward 'reference_likelihood': option 'mode'"):
        build_model_rewards(
            [RewardSpec(name="reference_likelihood", options={"mode": "ppl"})], context
        )
    with pytest.raises(ConfigError, match=r"unknown option 'colum' \(did you mean 'column'\?"):
        build_model_rewards(
            [RewardSpec(name="reference_likelihood", options={"colum": "x"})], context
        )


def test_reference_likelihood_end_to_end(tmp_path):
    options = (
        "{model: frozen, reasoning_stop: '<answer>', answer_prefix: '<answer>', "
        "answer_suffix: '</answer>'}"
    )
    functions = f"[{{name: reference_likelihood, weight: 0.5, options: {options}}}, {{name: math}}]"
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            f"train.output_dir={tmp_path}",
            f"reward.functions={functions}",
        ],
    )
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        part = m["reward/reference_likelihood"]
        assert math.isfinite(part) and part != 0.0
        assert m["reward/errors"] == 0
        assert m["reward/mean"] == pytest.approx(0.5 * part + m["reward/math"], abs=1e-6)
