"""The recipe knobs inside the loop: critic warm-up, schedules, shaping, top-entropy tokens."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.algorithms import decoupled_group_advantages
from rlvr.config import ConfigError, RLConfig, resolve_config
from rlvr.data.problem import Problem
from rlvr.data.tasks import load_task
from rlvr.models.loading import ModelLoadError, load_model_and_tokenizer, save_pretrained
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import response_mask_from_lengths
from rlvr.training.checkpoint import load_trainer_state
from rlvr.training.estimation import keep_high_entropy_tokens
from rlvr.training.rewarding import RewardScorer
from rlvr.training.rl import train
from rlvr.training.sampling import config_for_step
from tiny_run import TINY_RUN


def test_critic_warmup_trains_the_critic_and_leaves_the_policy_alone(tmp_path):
    cfg = resolve_config(
        preset="ppo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            "algorithm.critic.warmup_steps=2",
            "algorithm.critic.lr=1e-2",
            f"train.output_dir={tmp_path}",
            # a dense reward, so the critic has something to fit from the first step
            "reward.functions=[{name: format, weight: 0.0}, {name: test_rl_recipes:length_reward}]",
        ],
    )
    run_dir = train(cfg, show_progress=False)
    initial, _ = load_model_and_tokenizer(cfg.model, seed=cfg.train.seed)
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-2")
    for (name, before), after in zip(initial.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(before, after), name
    critic = load_trainer_state(run_dir / "checkpoints" / "step-2")["critic"]["model"]
    assert critic["head.weight"].abs().sum() > 0  # it started at zero
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["value_loss"] > 0 for m in metrics)


def length_reward(prompts, completions, **columns):
    """A dense reward: the completion's length in characters / 10."""
    return [len(c) / 10 for c in completions]


def test_schedule_changes_budget_and_temperature_from_their_steps():
    cfg = RLConfig.model_validate(
        {
            "rollout": {
                "max_new_tokens": 10,
                "temperature": 1.0,
                "schedule": [
                    {"from_step": 5, "budget_scale": 2.0},
                    {"from_step": 3, "temperature": 0.7},
                    {"from_step": 8, "max_new_tokens": 50},
                ],
            }
        }
    )
    seen = {s: config_for_step(cfg, s).rollout for s in (1, 3, 5, 8)}
    assert [(r.max_new_tokens, r.temperature) for r in seen.values()] == [
        (10, 1.0),
        (10, 0.7),
        (20, 0.7),
        (50, 0.7),
    ]
    assert config_for_step(cfg, 1) is cfg
    # a scaled budget under one token is one token: 0.04 × 10 rounds to 0
    stage = {"from_step": 2, "budget_scale": 0.04}
    scaled = RLConfig.model_validate({"rollout": {"max_new_tokens": 10, "schedule": [stage]}})
    assert config_for_step(scaled, 2).rollout.max_new_tokens == 1


def test_scheduled_budget_reaches_the_rollout(tmp_path):
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            "rollout.max_new_tokens=3",
            "rollout.schedule=[{from_step: 2, budget_scale: 4.0}]",
            f"train.output_dir={tmp_path}",
        ],
    )
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert metrics[0]["response_length/mean"] <= 3 < metrics[1]["response_length/mean"] <= 12


def scored_batch(lengths, truncated, correct_answers):
    problems = [Problem("1+1", "2") for _ in lengths]
    return RolloutBatch(
        problems=problems,
        prompt_ids=[[1]] * len(lengths),
        completion_ids=[[7, 8, 7, 8, 7, 8][:n] for n in lengths],
        prompt_texts=["q"] * len(lengths),
        completion_texts=["2" if ok else "3" for ok in correct_answers],
        group_ids=torch.tensor([0, 0, 1, 1]),
        truncated=torch.tensor(truncated),
        response_mask=response_mask_from_lengths(lengths),
        rollout_logprobs=torch.zeros(len(lengths), max(lengths)),
    )


def scorer(*overrides):
    cfg = resolve_config(overrides=["data.train_size=4", "data.test_size=1", *overrides])
    return RewardScorer(cfg, load_task(cfg.data))


def test_truncation_reward_replaces_the_reward_of_truncated_samples():
    rewarder = scorer("algorithm.overlong.truncation_reward=-1.0")
    batch = scored_batch([2, 2, 6, 6], [False, True, False, True], [True, True, False, True])
    rewarder(batch)
    assert batch.rewards.tolist() == [1.0, -1.0, 0.0, -1.0]


def test_kimi_length_reward_switches_on_at_its_step():
    rewarder = scorer("algorithm.shaping.length_coef=0.5", "algorithm.shaping.length_start_step=3")
    batch = scored_batch([2, 6, 2, 6], [False] * 4, [True, True, False, False])
    rewarder.step = 2
    rewarder(batch)
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    rewarder.step = 3
    rewarder(batch)
    # group 0 (both correct): lambda = 0.5 and -0.5; group 1 (both wrong): min(0, lambda)
    assert batch.rewards.tolist() == [1.25, 0.75, 0.0, -0.25]
    assert batch.reward_parts["length"].tolist() == [0.5, -0.5, 0.0, -0.5]


def test_repetition_penalty_is_weighted_into_the_reward():
    rewarder = scorer(
        "algorithm.shaping.repetition_coef=2.0", "algorithm.shaping.repetition_ngram=2"
    )
    batch = scored_batch([2, 6, 3, 4], [False] * 4, [True, True, False, False])
    rewarder(batch)
    # 7 8 7 8 7 8: bigrams 78 87 78 87 78 -> 3 of 5 repeat -> -0.6; 7 8 7 8: 1 of 3 -> -1/3
    assert batch.reward_parts["repetition"].tolist() == pytest.approx([0.0, -0.6, 0.0, -1 / 3])
    assert batch.rewards.tolist() == pytest.approx([1.0, 1.0 - 1.2, 0.0, -2 / 3])


def test_soft_overlong_punishment_is_added_with_weight_one():
    """DAPO's ramp over the last `buffer` x max_new_tokens tokens: max 6, buffer 0.5 -> 3
    tokens, so lengths [2, 6, 4, 5] get [0, -1, -1/3, -2/3] on top of the verifier's [1, 1, 0,
    0]. The total is the weighted sum of the parts (GDPO reads the weights). A buffer under
    half a token still ramps over one (0.05 x 6 rounds to 0): length 5 is free, 6 gets -1;
    no buffer punishes nothing, a full-length sample included."""
    rewarder = scorer("algorithm.overlong.buffer=0.5", "rollout.max_new_tokens=6")
    batch = scored_batch([2, 6, 4, 5], [False] * 4, [True, True, False, False])
    rewarder(batch)
    assert batch.reward_parts["overlong"].tolist() == pytest.approx([0.0, -1.0, -1 / 3, -2 / 3])
    assert batch.rewards.tolist() == pytest.approx([1.0, 0.0, -1 / 3, -2 / 3])
    weighted = sum(rewarder.weights[k] * part for k, part in batch.reward_parts.items())
    torch.testing.assert_close(batch.rewards, weighted)
    rewarder = scorer("algorithm.overlong.buffer=0.05", "rollout.max_new_tokens=6")
    batch = scored_batch([2, 6, 4, 5], [False] * 4, [True, True, False, False])
    rewarder(batch)
    assert batch.reward_parts["overlong"].tolist() == [0.0, -1.0, 0.0, 0.0]
    rewarder = scorer("rollout.max_new_tokens=6")
    batch = scored_batch([2, 6, 4, 5], [False] * 4, [True, True, False, False])
    rewarder(batch)
    assert "overlong" not in batch.reward_parts
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_a_verifier_left_out_of_the_rewards_scores_with_weight_zero():
    """`reward.functions` without the task's verifier: the verifier still runs (its part and
    `correct`), and the total is the listed rewards' alone."""
    rewarder = scorer("reward.functions=[{name: test_rl_recipes:length_reward, weight: 2.0}]")
    batch = scored_batch([2, 6, 4, 5], [False] * 4, [True, False, True, False])
    rewarder(batch)
    assert rewarder.weights["math"] == 0.0
    assert batch.reward_parts["math"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch.correct.tolist() == [True, False, True, False]
    assert batch.rewards.tolist() == pytest.approx([0.2] * 4)  # 2 x len("2") / 10


def solution_reward(prompts, completions, solution, **columns):
    """A TRL reward that reads the gold answer from its dataset's `solution` column."""
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


def test_a_files_answer_column_reaches_the_rewards_under_its_own_name_too(tmp_path):
    """TRL passes every dataset column by its name: a file whose answers are in `solution`
    (data.answer_column=solution) gives its rewards `solution=` as well as `answer=`."""
    rows = [{"prompt": f"{i}+1?", "solution": str(i + 1)} for i in range(6)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewarder = scorer(
        "data.task=file",
        f"data.path={tmp_path / 's.jsonl'}",
        "data.answer_column=solution",
        "reward.functions=[{name: test_rl_recipes:solution_reward}]",
    )
    batch = scored_batch([2, 2, 2, 2], [False] * 4, [True, False, True, False])
    batch.problems = [Problem("q", "2"), Problem("q", "2"), Problem("q", "3"), Problem("q", "3")]
    rewarder(batch)
    assert batch.reward_parts["test_rl_recipes:solution_reward"].tolist() == [1.0, 0.0, 0.0, 1.0]


def global_step_reward(prompts, completions, trainer_state, **columns):
    """TRL's `trainer_state` keyword: the steps completed before the one scored."""
    return [float(trainer_state.global_step)] * len(completions)


def test_rewards_see_the_steps_completed_before_the_scored_one():
    """A fresh scorer and the first step's both see global_step 0, step 3's sees 2; a fresh
    scorer is before step 1, so a length reward starting at step 1 is still off."""
    rewarder = scorer(
        "reward.functions=[{name: test_rl_recipes:global_step_reward}]",
        "algorithm.shaping.length_coef=0.5",
        "algorithm.shaping.length_start_step=1",
    )
    seen = []
    for step in (None, 1, 3):
        if step is not None:
            rewarder.step = step
        batch = scored_batch([2, 6, 2, 6], [False] * 4, [True, True, True, True])
        rewarder(batch)
        seen.append(batch.reward_parts["test_rl_recipes:global_step_reward"].tolist())
        if step is None:
            assert "length" not in batch.reward_parts
    assert seen == [[0.0] * 4, [0.0] * 4, [2.0] * 4]


def test_top_entropy_tokens_keep_their_advantages_only():
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    entropy = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.2, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # 5 response tokens, top 40% -> 2 tokens: entropies 0.9 and 0.8 (the 5.0 is padding)
    got = keep_high_entropy_tokens(advantages, entropy, mask, 0.4)
    assert got.tolist() == [[0.0, 1.0, 0.0], [-2.0, 0.0, 0.0]]


def test_top_entropy_training_keeps_only_the_top_tokens_advantages(tmp_path):
    seen = []

    def record(batch):  # the loop adds the advantages to this same object after the filters
        seen.append(batch)
        return batch

    cfg = resolve_config(
        preset="dapo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            "algorithm.entropy.top_frac=0.2",
            f"train.output_dir={tmp_path}",
        ],
    )
    train(cfg, filters=(record,), show_progress=False)
    assert len(seen) == 2
    nonzero = 0
    for batch in seen:
        tokens = int(batch.response_mask.sum())
        kept = int((batch.advantages != 0).sum())
        assert kept <= math.ceil(0.2 * tokens)  # never more than the top 20 % of the tokens
        nonzero += kept
    assert nonzero > 0  # dynamic sampling kept informative groups: some tokens were trained


def test_the_entropy_advantage_logs_its_share_of_the_advantages(tmp_path):
    """Cheng et al.'s figure 7 as a metric: Σ ψ(H_t) / Σ |A_t| over the trained tokens, above 0
    (the term is on) and at most 1/κ (its clip); absent when the term is off."""
    common = [
        *TINY_RUN,
        "train.steps=2",
        "reward.functions=[{name: 'test_rl_recipes:odd_length'}]",  # the samples disagree
    ]
    on = [
        "algorithm.entropy.advantage_alpha=0.4",
        "algorithm.entropy.advantage_kappa=4",
        f"train.output_dir={tmp_path}/on",
    ]
    metrics = read_jsonl(
        train(resolve_config(preset="grpo", overrides=[*common, *on]), show_progress=False)
        / "metrics.jsonl"
    )
    ratios = [m["entropy_advantage_ratio"] for m in metrics]
    assert len(ratios) == 2 and all(0.0 < r <= 0.25 + 1e-6 for r in ratios), ratios
    off = resolve_config(preset="grpo", overrides=[*common, f"train.output_dir={tmp_path}/off"])
    metrics = read_jsonl(train(off, show_progress=False) / "metrics.jsonl")
    assert all("entropy_advantage_ratio" not in m for m in metrics)


def test_critic_can_start_from_a_separate_model(tmp_path):
    other = resolve_config(overrides=["model.tiny.hidden_size=48", "model.tiny.num_layers=1"])
    model, tokenizer = load_model_and_tokenizer(other.model, seed=3)
    save_pretrained(model, tokenizer, tmp_path / "critic_init")
    cfg = resolve_config(
        preset="ppo",
        overrides=[
            *TINY_RUN,
            "train.steps=1",
            f"algorithm.critic.model={tmp_path / 'critic_init'}",
            f"train.output_dir={tmp_path / 'run'}",
        ],
    )
    run_dir = train(cfg, show_progress=False)
    critic = load_trainer_state(run_dir / "checkpoints" / "step-1")["critic"]["model"]
    assert critic["head.weight"].shape == (1, 48)  # the separate model's width, not the policy's


def test_critic_from_a_missing_model_is_a_clear_error(tmp_path):
    cfg = resolve_config(
        preset="ppo",
        overrides=[
            *TINY_RUN,
            f"algorithm.critic.model={tmp_path / 'nope'}",
            f"train.output_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ModelLoadError, match="nope"):
        train(cfg, show_progress=False)


def odd_length(prompts, completions, **columns):
    """A test reward that the untrained tiny model's samples split: 1 for an odd length."""
    return [float(len(c) % 2) for c in completions]


def test_normalize_then_sum_trains_on_gdpo_advantages_of_the_weighted_rewards(tmp_path):
    seen = []

    def record(batch):  # the loop adds the advantages to this same object after the filters
        seen.append(batch)
        return batch

    rewards = "[{name: math, weight: 1.0}, {name: 'test_rl_recipes:odd_length', weight: 0.5}]"
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=2",
            f"train.output_dir={tmp_path}",
            "algorithm.reward_aggregation=normalize_then_sum",
            f"reward.functions={rewards}",
        ],
    )
    train(cfg, filters=(record,), show_progress=False)
    for batch in seen:
        parts = torch.stack(
            [batch.reward_parts["math"], batch.reward_parts["test_rl_recipes:odd_length"]], dim=1
        )
        weights = torch.tensor([1.0, 0.5])
        expected = decoupled_group_advantages(parts, weights, batch.group_ids, epsilon=1e-6)
        torch.testing.assert_close(batch.advantages[:, 0], expected)
        assert expected.abs().sum() > 0
    clashing = ["algorithm.std_normalization=none", "algorithm.kl.in_reward=true"]
    with pytest.raises(ConfigError, match=r"change algorithm\.std_normalization, algorithm\.kl"):
        resolve_config(overrides=["algorithm.reward_aggregation=normalize_then_sum", *clashing])
