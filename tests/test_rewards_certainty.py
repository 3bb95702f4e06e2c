"""Certainty rewards (Intuitor's self-certainty, RENT's negative entropy, EM-RL's log-likelihood):
the per-token measures by hand, the batched scorer against a plain forward pass on both of the
tiny model's forwards, the ``confidence`` model reward and a short RL run that uses it."""

import json
import math

import pytest
import torch

from rlvr.config import ConfigError, ModelConfig, RewardSpec, TinyModelConfig, resolve_config
from rlvr.models import fused
from rlvr.models.loading import load_model_and_tokenizer
from rlvr.rewards import certainty
from rlvr.rewards.certainty import certainty_rewards, token_certainty
from rlvr.rewards.model_based import RewardContext, build_model_rewards, score_model_reward
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from tiny_run import TINY_RUN

TINY = ModelConfig(
    tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
)


def test_token_certainty_by_hand():
    # Row 0: uniform over 4 tokens: KL(U || U) = 0, H = ln 4, p[y] = 1/4.
    # Row 1: probabilities (1/2, 1/4, 1/8, 1/8) (logits = their logs, any shift):
    #   KL(U || p) = (1/4) Σ ln((1/4) / p_j) = (1/4) (ln(1/2) + 0 + ln 2 + ln 2) = ln(2) / 4
    #   -H = Σ p ln p = -(1/2 ln 2 + 1/4 ln 4 + 2 · 1/8 ln 8) = -(7/4) ln 2
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    logits = torch.stack([torch.zeros(4), probs.log() + 3.0])
    got = token_certainty(logits, torch.tensor([2, 1]))
    assert got["self_certainty"].tolist() == pytest.approx([0.0, math.log(2) / 4], abs=1e-6)
    assert got["negative_entropy"].tolist() == pytest.approx(
        [-math.log(4), -1.75 * math.log(2)], abs=1e-6
    )
    assert got["logprob"].tolist() == pytest.approx([math.log(0.25), math.log(0.25)], abs=1e-6)


def test_token_certainty_divides_the_logits_by_the_temperature_first():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    at_two = token_certainty(logits, torch.tensor([0]), temperature=2.0)
    at_one = token_certainty(logits / 2, torch.tensor([0]))
    for measure in at_one:
        assert at_two[measure].item() == pytest.approx(at_one[measure].item(), abs=1e-6)
    # KL(U || p) by its definition, (1/|V|) Σ_j ln((1/|V|) / p_j), at T = 2
    p = torch.softmax(logits[0] / 2, -1)
    kl = float((torch.log(torch.tensor(1 / 3) / p)).mean())
    assert at_two["self_certainty"].item() == pytest.approx(kl, abs=1e-6)


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer(TINY, seed=0)


PROMPT_IDS = [[5, 6, 7], [5, 6, 7], [8, 9]]
COMPLETION_IDS = [[10, 11, 12, 13], [14], [15, 16]]


def by_hand(model, prompt: list[int], completion: list[int]) -> dict[str, list[float]]:
    """Each measure of each completion token from one unpadded forward pass, in float64."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double()
    # the logits at position len(prompt) - 1 + k score completion token k (DESIGN rule 3)
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    logp = rows.log_softmax(-1)
    vocab = rows.shape[-1]
    return {
        "self_certainty": (math.log(1 / vocab) - logp).mean(-1).tolist(),
        "negative_entropy": (logp.exp() * logp).sum(-1).tolist(),
        "logprob": [logp[k, t].item() for k, t in enumerate(completion)],
    }


@pytest.mark.parametrize("lean_forward", [True, False], ids=["fused", "hf"])
@pytest.mark.parametrize("measure", ["self_certainty", "negative_entropy", "logprob"])
def test_certainty_rewards_match_a_plain_forward_pass(tiny, measure, lean_forward, monkeypatch):
    model, tokenizer = tiny
    vocab = model.lm_head.out_features
    # two positions a chunk of logits: the 7 completion tokens in one micro-batch take four
    monkeypatch.setattr(certainty, "default_chunk_elements", lambda _device: 2 * vocab)
    setattr(model, fused.ENABLE_ATTR, lean_forward)
    try:
        assert fused.supports(model) == lean_forward
        model.train()
        masks = [[True, False, True, True], [True], [True, True]]  # token 1 of row 0: a tool's
        means = certainty_rewards(
            model,
            PROMPT_IDS,
            COMPLETION_IDS,
            tokenizer.pad_token_id,
            measure=measure,
            token_masks=masks,
            micro_batch_tokens=7,  # one sample a micro-batch
        )
        sums = certainty_rewards(  # one micro-batch, rows 0 and 1 sharing their prompt
            model, PROMPT_IDS, COMPLETION_IDS, tokenizer.pad_token_id, measure=measure,
            aggregate="sum",
        )  # fmt: skip
        assert model.training  # scored in eval mode, the module's mode restored
    finally:
        setattr(model, fused.ENABLE_ATTR, True)
    for i, (prompt, completion) in enumerate(zip(PROMPT_IDS, COMPLETION_IDS)):
        values = by_hand(model, prompt, completion)[measure]
        kept = [v for v, m in zip(values, masks[i]) if m]
        assert means[i] == pytest.approx(sum(kept) / len(kept), abs=2e-5), i
        assert sums[i] == pytest.approx(sum(values), abs=5e-5), i


def test_certainty_rewards_input_errors(tiny):
    model, tokenizer = tiny
    pad = tokenizer.pad_token_id
    with pytest.raises(ValueError, match="unknown certainty measure 'entropy'"):
        certainty_rewards(model, [[1]], [[2]], pad, measure="entropy")
    with pytest.raises(ValueError, match="unknown aggregate 'max'"):
        certainty_rewards(model, [[1]], [[2]], pad, aggregate="max")
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        certainty_rewards(model, [[1], [2]], [[3]], pad)
    with pytest.raises(ValueError, match="1 prompts for 1 completions, 2 token masks"):
        certainty_rewards(model, [[1]], [[3]], pad, token_masks=[[True], [True]])
    with pytest.raises(ValueError, match="sample 0: 1 mask entries for 2 tokens"):
        certainty_rewards(model, [[1]], [[3, 4]], pad, token_masks=[[True]])
    # a completion with no token of the policy's scores 0
    assert certainty_rewards(model, [[1]], [[3, 4]], pad, token_masks=[[False, False]]) == [0.0]


def test_confidence_reward_scores_with_the_policy_or_the_frozen_start():
    policy, tokenizer = load_model_and_tokenizer(TINY, seed=0)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.5)  # the policy has trained away from its initial weights
    initial, _ = load_model_and_tokenizer(TINY, seed=0)
    context = RewardContext(policy, tokenizer, model_config=TINY, seed=0)
    columns = {"prompt_ids": PROMPT_IDS, "completion_ids": COMPLETION_IDS}
    groups = torch.tensor([0, 0, 1])
    scores = {}
    for which, scorer in [("policy", policy), ("frozen", initial)]:
        spec = RewardSpec(name="confidence", weight=0.5, options={"model": which})
        (weight, reward), *_ = build_model_rewards([spec], context).values()
        result = score_model_reward("confidence", reward, ["p"] * 3, ["c"] * 3, groups, columns)
        expected = certainty_rewards(scorer, PROMPT_IDS, COMPLETION_IDS, tokenizer.pad_token_id)
        assert weight == 0.5 and result.errors == 0
        assert result.scores == pytest.approx(expected, abs=1e-6)
        scores[which] = result.scores
    assert all(abs(a - b) > 1e-3 for a, b in zip(scores["policy"], scores["frozen"]))
    missing = score_model_reward("confidence", reward, ["p"], ["c"], torch.zeros(1), {})
    assert missing.scores == [0.0] and missing.errors == 1
    assert "no reward column 'prompt_ids'" in missing.error_examples[0]


def test_confidence_option_errors(tiny):
    context = RewardContext(*tiny)
    with pytest.raises(ConfigError, match=r"reward 'confidence': option 'measure'"):
        build_model_rewards([RewardSpec(name="confidence", options={"measure": "H"})], context)
    with pytest.raises(ConfigError, match=r"reward 'confidence': option 'model'"):
        build_model_rewards([RewardSpec(name="confidence", options={"model": "/m"})], context)
    with pytest.raises(ConfigError, match=r"unknown option 'agregate' \(did you mean 'aggre"):
        build_model_rewards([RewardSpec(name="confidence", options={"agregate": "sum"})], context)
    with pytest.raises(ConfigError, match=r"option 'temperature'"):
        build_model_rewards([RewardSpec(name="confidence", options={"temperature": 0})], context)


def test_confidence_end_to_end_reads_the_sampled_tokens(tmp_path):
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            f"train.output_dir={tmp_path}",
            "reward.functions=[{name: confidence, weight: 0.5}, {name: math}]",
        ],
    )
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        part = m["reward/confidence"]
        # KL(U || p) >= 0, and 0 only for a uniform p: the untrained tiny model is not quite
        assert math.isfinite(part) and part > 0.0
        assert m["reward/errors"] == 0
        assert m["reward/mean"] == pytest.approx(0.5 * part + m["reward/math"], abs=1e-6)


def unlabelled_run(tmp_path, preset: str, *more: str):
    """The config of a 2-step run of `preset` on 20 questions without gold answers."""
    rows = [{"prompt": f"What is {a}+{b}?"} for a in range(5) for b in range(4)]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [
        *TINY_RUN,
        "data.task=file",
        f"data.path={path}",
        "data.answer_column=null",
        "data.test_size=0",
        "train.steps=2",
        f"train.output_dir={tmp_path / 'run'}",
        *more,
    ]
    return resolve_config(preset=preset, overrides=overrides)


def test_intuitor_trains_on_rows_without_gold_answers(tmp_path):
    """The label-free preset on a data file read with `data.answer_column=null`: it trains on
    its own reward, and the step's `accuracy` is null (no row can be judged), not 0."""
    cfg = unlabelled_run(tmp_path, "intuitor")
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["accuracy"] is None and m["reward/math"] is None
        assert m["reward/confidence"] > 0.0 and m["reward/errors"] == 0


def test_a_run_whose_only_reward_needs_the_missing_answers_is_refused(tmp_path):
    """GRPO's default reward is the `math` verifier: on rows without gold answers every
    sample would score 0. Refused before the run directory is made, naming the file and the
    ways out; a weighted reward that needs no answer beside it is accepted."""
    cfg = unlabelled_run(tmp_path, "grpo")
    with pytest.raises(ConfigError, match=r"questions\.jsonl: no row has a gold answer"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "run").exists()
    verifier_only = "reward.functions=[{name: verifier, weight: 2.0}]"
    with pytest.raises(ConfigError, match="--preset ttrl or --preset intuitor"):
        train(unlabelled_run(tmp_path, "grpo", verifier_only), show_progress=False)
    both = "reward.functions=[{name: math}, {name: confidence, weight: 0.1}]"
    run_dir = train(unlabelled_run(tmp_path, "grpo", both), show_progress=False)
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]


def test_model_reward_options_are_checked_before_the_run_starts(tmp_path):
    """A bad option of a model reward was found only when the trainer built the reward,
    after the run directory was written and the model loaded."""
    bad = "reward.functions=[{name: confidence, options: {measure: self-certainty}}]"
    cfg = resolve_config(preset="intuitor", overrides=[bad, f"train.output_dir={tmp_path}/run"])
    with pytest.raises(ConfigError, match=r"reward 'confidence': option 'measure': Input should"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "run").exists()


def documented_model_reward(monkeypatch) -> str:
    """The code of docs/rewards.md's `group_diversity` example; what registering it adds to
    `MODEL_REWARDS` is undone after the test."""
    import re
    from pathlib import Path

    from rlvr.rewards.model_based import MODEL_REWARDS

    monkeypatch.setattr(MODEL_REWARDS, "_entries", dict(MODEL_REWARDS._entries))
    text = (Path(__file__).parents[1] / "docs" / "rewards.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "diversity" in b]
    return example


def test_the_documented_model_reward_registers_with_its_options(monkeypatch):
    """docs/rewards.md's `group_diversity` example, run as written: its options are checked
    (`check_options`) and it scores a completion no other of its group repeats."""
    from rlvr.rewards.model_based import MODEL_REWARDS, check_options

    exec(compile(documented_model_reward(monkeypatch), "docs/rewards.md", "exec"), {})
    spec = RewardSpec(name="group_diversity", options={"bonus": 0.5})
    check_options([spec])
    with pytest.raises(ConfigError, match=r"unknown option 'bonuss' \(did you mean 'bonus'"):
        check_options([RewardSpec(name="group_diversity", options={"bonuss": 1})])
    reward = MODEL_REWARDS.get("group_diversity")(spec.options, RewardContext())
    result = reward(["p"] * 3, ["a", "a", "b"], torch.tensor([0, 0, 0]), {})
    assert result.scores == [0.0, 0.0, 0.5]


def test_a_model_reward_named_by_file_path_trains_from_the_cli(tmp_path, monkeypatch):
    """A model reward in a file of one's own, named `file.py:builder` in reward.functions,
    trains from the CLI without a launcher script (it was taken for a TRL-signature reward and
    refused): each sample scores the documented diversity bonus within its group, and a bad
    option is refused before the run directory is written."""
    from typer.testing import CliRunner

    from rlvr.cli import app

    reward_file = tmp_path / "diversity.py"
    reward_file.write_text(documented_model_reward(monkeypatch))
    name = f"{reward_file}:build_group_diversity"
    runner = CliRunner()
    base = [
        "train",
        *TINY_RUN,
        "train.steps=2",
        "train.log_samples=12",
        "rollout.temperature=0.1",
        "rollout.max_new_tokens=3",
    ]
    bad = f"reward.functions=[{{name: '{name}', options: {{bonuss: 0.5}}}}]"
    refused = runner.invoke(app, [*base, f"train.output_dir={tmp_path / 'bad'}", bad])
    assert refused.exit_code != 0
    assert f"reward '{name}': unknown option 'bonuss' (did you mean 'bonus'" in refused.output
    assert not (tmp_path / "bad").exists()
    run_dir = tmp_path / "run"
    good = f"reward.functions=[{{name: '{name}', options: {{bonus: 0.5}}}}]"
    result = runner.invoke(app, [*base, f"train.output_dir={run_dir}", good])
    assert result.exit_code == 0, result.output
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if "completion" in s]
    assert len(samples) == 2 * 12
    groups = {}
    for sample in samples:
        groups.setdefault((sample["step"], sample["prompt"]), []).append(sample["completion"])
    expected = [
        0.5 if groups[s["step"], s["prompt"]].count(s["completion"]) == 1 else 0.0 for s in samples
    ]
    assert [s["reward"] for s in samples] == expected and 0 < sum(expected) < 0.5 * len(samples)
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["reward/errors"] == 0 and f"reward/{name}" in m for m in steps)
