"""The RL loop end to end on the tiny model: run directory contract, resume, non-finite guard."""

import json
import math
import re
import warnings

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import ConfigError, resolve_config
from rlvr.data.tasks import load_task
from rlvr.evaluation.evaluate import evaluate_as_configured
from rlvr.models.loading import load_model_and_tokenizer, load_pretrained
from rlvr.run_layout import (
    STATE_FILE,
    checkpoint_path,
    evaluated_folder,
    latest_checkpoint,
    saved_config,
)
from rlvr.tracking.jsonl import JsonlWriter, read_jsonl
from rlvr.training import rl
from rlvr.training.checkpoint import CheckpointError, load_trainer_state
from rlvr.training.rl import NonFiniteError, check_choices, train
from tiny_run import TINY_RUN

CONTRACT_METRICS = [
    "step",
    "reward/mean",
    "reward/std",
    "accuracy",
    "response_length/mean",
    "response_length/correct",
    "response_length/incorrect",
    "truncated_frac",
    "entropy",
    "kl",
    "clip_frac",
    "grad_norm",
    "loss",
    "zero_std_frac",
    "time/rollout",
    "time/reward",
    "time/train",
    "time/step",
    "tokens_per_s",
]
TIMING = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}


def small_config(tmp_path, *extra):
    return resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "rollout.max_new_tokens=12",
            "train.mini_batches=2",
            "train.micro_batch_tokens=64",
            f"train.output_dir={tmp_path}",
            *extra,
        ],
    )


def test_run_directory_contract(tmp_path):
    cfg = small_config(tmp_path / "run", "train.steps=2", "train.save_every=1")
    run_dir = train(cfg, show_progress=False)
    assert (run_dir / "config.yaml").is_file()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for name in CONTRACT_METRICS:
        assert name in metrics[0], name
    assert metrics[0]["kl"] >= 0.0 and 0.0 <= metrics[0]["clip_frac"] <= 1.0
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {"prompt", "completion", "reward", "answer"} <= set(samples[0])
    for step in (1, 2):
        assert (run_dir / "checkpoints" / f"step-{step}" / "model.safetensors").is_file()
        # the trainer state, written last, by the name the layout documents
        assert (run_dir / "checkpoints" / f"step-{step}" / "trainer_state.pt").is_file()
    assert not list((run_dir / "checkpoints").glob(".*tmp"))


ADAPTIVE = (
    "algorithm.entropy.coef=0.01",
    "algorithm.entropy.target=5.0",
    "algorithm.entropy.delta=0.01",
    "algorithm.kl.adaptive_target=0.001",
    "algorithm.kl.horizon=10",
    "algorithm.kl.reference_ema=0.5",
)


CRITIC = (
    "algorithm.advantage=gae",
    "algorithm.critic.lr=1e-3",
    "algorithm.critic.warmup_steps=1",
    "algorithm.kl.in_reward=true",
    "algorithm.kl.estimator=k1",
)


# the untrained tiny model earns no reward: an entropy bonus makes the adapters move
LORA = ("model.lora.rank=4", "algorithm.entropy.coef=0.05", "algorithm.kl.coef=0.1")
# ProRL's hard reset at step 2: the step-2 checkpoint holds no optimizer state to resume from
HARD_RESET = (
    "algorithm.kl.coef=0.1",
    "algorithm.kl.reference_reset_every=2",
    "algorithm.kl.reset_optimizer=true",
    "algorithm.entropy.coef=0.05",
)


@pytest.mark.parametrize(
    "extra",
    [(), ADAPTIVE, CRITIC, ("data.sampler=prioritized",), LORA, HARD_RESET],
    ids=[
        "fixed",
        "adaptive_controllers_and_ema",
        "gae_critic_with_warmup",
        "prioritized",
        "lora",
        "hard_reset",
    ],
)
def test_resume_continues_the_same_trajectory(tmp_path, extra):
    straight = train(small_config(tmp_path / "a", "train.steps=4", *extra), show_progress=False)
    train(small_config(tmp_path / "b", "train.steps=2", *extra), show_progress=False)
    resumed = train(
        small_config(tmp_path / "b", "train.steps=4", *extra), resume=True, show_progress=False
    )
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl")
    if extra == CRITIC:  # the critic learned, so the comparison covers its saved state
        assert all(m["value_loss"] > 0 for m in a[1:])
    if extra == LORA:  # the adapters moved the policy away from its reference, the base
        assert a[-1]["kl"] > 1e-6
    if extra == HARD_RESET:  # the resumed run started from the reset's empty optimizer state
        assert load_trainer_state(resumed / "checkpoints" / "step-2")["optimizer"]["state"] == {}
    if extra == ADAPTIVE:  # the controllers really moved, so the comparison covers their state
        assert len({m["kl_coef"] for m in a}) > 1 and len({m["entropy_coef"] for m in a}) > 1
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for left, right in zip(a, b):
        for key in left:
            if key in TIMING:
                continue
            l_val, r_val = left[key], right[key]
            if isinstance(l_val, float) and math.isnan(l_val):
                assert math.isnan(r_val), key
            else:
                assert l_val == r_val, (left["step"], key, l_val, r_val)


def test_a_hard_reset_clears_the_optimizer_state_at_each_reference_reset(tmp_path):
    cfg = small_config(tmp_path, "train.steps=3", "train.save_every=1", *HARD_RESET)
    run_dir = train(cfg, show_progress=False)
    states = [
        load_trainer_state(run_dir / "checkpoints" / f"step-{step}")["optimizer"]["state"]
        for step in (1, 2, 3)
    ]
    assert states[0] and not states[1] and states[2]  # reset at step 2, fresh again at step 3
    # two optimizer steps a step (train.mini_batches=2): 2 since the reset, 4 without it
    assert all(moments["step"] == 2 for moments in states[2].values())
    kept = small_config(tmp_path / "kept", "train.steps=2", *HARD_RESET[:2], *HARD_RESET[3:])
    state = load_trainer_state(train(kept, show_progress=False) / "checkpoints" / "step-2")
    assert all(moments["step"] == 4 for moments in state["optimizer"]["state"].values())


EVAL = ("eval.every_steps=2", "eval.samples=6", "eval.k=2", "eval.max_new_tokens=24")
# An entropy bonus trains on every sample (the tiny model's rewards are all 0 here), so the
# model, and with it the held-out samples, move between the first evaluation and the last.
MOVING = ("algorithm.entropy.coef=0.05", "train.lr=1e-2")
SCORES = ("pass@1", "pass@2", "maj@2", "response_length/mean", "truncated_frac")


def test_held_out_evaluations_are_logged_and_leave_the_trajectory_alone(tmp_path):
    plain = train(small_config(tmp_path / "plain", "train.steps=3", *MOVING), show_progress=False)
    cfg = small_config(tmp_path / "eval", "train.steps=3", *MOVING, *EVAL)
    run_dir = train(cfg, show_progress=False)
    assert not (plain / "eval.jsonl").exists()
    for left, right in zip(
        read_jsonl(plain / "metrics.jsonl"), read_jsonl(run_dir / "metrics.jsonl"), strict=True
    ):
        assert {k: v for k, v in left.items() if k not in TIMING} == {
            k: v for k, v in right.items() if k not in TIMING
        }
    lines = read_jsonl(run_dir / "eval.jsonl")
    assert [line["step"] for line in lines] == [0, 2, 3]  # before, every 2 steps, at the end
    assert all(line["problems"] == 6 and line["k"] == 2 for line in lines)
    # The first and last lines are what `evaluate` gives the initial and the saved final model.
    task = load_task(cfg.data)
    initial, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.train.seed)
    final, _ = load_pretrained(str(run_dir / "checkpoints" / "step-3"))
    for line, model in ((lines[0], initial), (lines[-1], final)):
        expected = evaluate_as_configured(model, tokenizer, task.test[:6], task.reward, cfg)
        assert {key: line[key] for key in SCORES} == {key: expected[key] for key in SCORES}
    assert [lines[0][key] for key in SCORES] != [lines[-1][key] for key in SCORES]


def test_resume_keeps_the_evaluations_of_the_same_trajectory(tmp_path):
    straight = train(small_config(tmp_path / "a", "train.steps=4", *EVAL), show_progress=False)
    train(small_config(tmp_path / "b", "train.steps=2", *EVAL), show_progress=False)
    with JsonlWriter(tmp_path / "b" / "eval.jsonl") as log:  # what a crash after step 2 leaves
        log.write({"step": 3, "pass@1": 1.0})
    resumed = train(
        small_config(tmp_path / "b", "train.steps=4", *EVAL), resume=True, show_progress=False
    )

    def scores(run_dir):
        return [
            {k: v for k, v in r.items() if k != "seconds"}
            for r in read_jsonl(run_dir / "eval.jsonl")
        ]

    assert [r["step"] for r in scores(resumed)] == [0, 2, 4]
    assert scores(resumed) == scores(straight)


# ProRL's hard reset when the held-out pass@1 stalls for 2 evaluations, one after every step
STALL_RESET = (
    "algorithm.kl.coef=0.1",
    "algorithm.kl.reference_reset_patience=2",
    "algorithm.kl.reset_optimizer=true",
    *MOVING,
    *EVAL,
    "eval.every_steps=1",
)


def test_a_stalled_pass_at_1_hard_resets_and_a_resumed_run_counts_on(tmp_path):
    """The tiny model's held-out pass@1 is 1/6 before step 1 (the best), 1/6 after steps 1
    and 2 (ties: a stall of 2, a reset), 1/6 after step 3 and 1/12 after step 4 (a reset
    again). The step-2 checkpoint holds no optimizer state and a reference equal to its
    weights; a run resumed from it counts on from the saved stall count (a fresh count would
    set the best at step 3 and reset nothing at step 4) and follows the straight run step for
    step."""
    straight = train(
        small_config(tmp_path / "a", "train.steps=4", *STALL_RESET), show_progress=False
    )
    lines = read_jsonl(straight / "eval.jsonl")
    assert [line["pass@1"] for line in lines] == pytest.approx([1 / 6] * 4 + [1 / 12])
    assert [line["reference_reset"] for line in lines] == [False, False, True, False, True]
    first_half = small_config(tmp_path / "b", "train.steps=2", *STALL_RESET, "train.save_every=1")
    train(first_half, show_progress=False)
    checkpoint = tmp_path / "b" / "checkpoints"
    state = load_trainer_state(checkpoint / "step-2")
    assert load_trainer_state(checkpoint / "step-1")["optimizer"]["state"]
    assert not state["optimizer"]["state"]
    weights = load_file(checkpoint / "step-2" / "model.safetensors")
    reference = state["regularization"]["reference"]
    assert all(torch.equal(reference[name], weights[name]) for name in weights)
    resumed = train(
        small_config(tmp_path / "b", "train.steps=4", *STALL_RESET),
        resume=True,
        show_progress=False,
    )
    assert read_jsonl(resumed / "eval.jsonl")[-1]["reference_reset"]
    for left, right in zip(
        read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl"), strict=True
    ):
        assert {k: v for k, v in left.items() if k not in TIMING} == {
            k: v for k, v in right.items() if k not in TIMING
        }
    with pytest.raises(ConfigError, match=r"eval\.every_steps=0 makes none"):
        small_config(tmp_path / "c", *STALL_RESET, "eval.every_steps=0")


def test_held_out_evaluation_needs_held_out_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"'eval\.every_steps': Input should be greater"):
        small_config(tmp_path / "negative", "eval.every_steps=-1")
    with pytest.raises(ConfigError, match=r"'eval\.samples': Input should be greater"):
        small_config(tmp_path / "zero", "eval.every_steps=1", "eval.samples=0")
    cfg = small_config(tmp_path / "none", "eval.every_steps=1", "data.test_size=0")
    with pytest.raises(ConfigError, match=r"eval\.every_steps=1: no held-out problems"):
        train(cfg, show_progress=False)


def test_resume_names_the_settings_that_differ_from_the_run(tmp_path):
    train(small_config(tmp_path, "train.steps=1"), show_progress=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(small_config(tmp_path, "train.steps=2"), resume=True, show_progress=False)
    assert not [w for w in seen if "--resume" in str(w.message)]  # more steps is the usual case
    changed = small_config(tmp_path, "train.steps=3", "algorithm.clip.high=0.28")
    with pytest.warns(UserWarning, match=r"differ .*: algorithm\.clip\.high: 0\.2 -> 0\.28$"):
        train(changed, resume=True, show_progress=False)
    assert "high: 0.28" in (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text("- a list, not a config\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not a saved config"):
        train(small_config(tmp_path, "train.steps=4"), resume=True, show_progress=False)


def test_a_run_directory_never_mixes_two_runs(tmp_path, monkeypatch):
    run_dir = train(small_config(tmp_path, "train.steps=1"), show_progress=False)
    logged = (run_dir / "metrics.jsonl").read_text()
    monkeypatch.setattr(rl, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded"))
    earlier = re.escape(f"train.output_dir='{tmp_path}' holds an earlier run (checkpoint step-1)")
    with pytest.raises(ConfigError, match=earlier + ".*--resume"):
        train(small_config(tmp_path, "train.steps=2", "train.lr=0.1"), show_progress=False)
    assert (run_dir / "metrics.jsonl").read_text() == logged  # the earlier run keeps its logs
    with pytest.raises(FileNotFoundError, match="--resume: no complete checkpoint"):
        train(small_config(tmp_path / "none", "train.steps=1"), resume=True, show_progress=False)


def test_the_latest_checkpoint_is_the_complete_one_with_the_highest_step(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    folder = tmp_path / "checkpoints"
    for name, complete in [
        ("step-2", True),
        ("step-10", True),
        ("step-11", False),  # no trainer state: not a checkpoint
        ("step-best", True),  # a user's copy
        ("step-²", True),
        ("20", True),  # a number without the `step-` prefix is not a checkpoint either
        (".step-12.tmp", True),  # a save in progress
    ]:
        (folder / name).mkdir(parents=True)
        if complete:
            (folder / name / STATE_FILE).write_bytes(b"")
    assert latest_checkpoint(tmp_path) == folder / "step-10"


def test_a_model_folder_is_evaluated_itself_and_a_run_directory_by_its_latest(tmp_path):
    # `rlvr eval --model PATH`: a model folder (config.json) is evaluated as it is, even when
    # it holds checkpoints of its own (`rlvr sft` with `sft.save_every`); a run directory
    # without config.json stands for its latest complete checkpoint; anything else is itself
    sft = tmp_path / "sft"
    for folder in (sft, sft / "checkpoints" / "step-3"):
        folder.mkdir(parents=True)
    (sft / "config.json").write_text("{}")
    (sft / "checkpoints" / "step-3" / STATE_FILE).write_bytes(b"")
    assert evaluated_folder(sft) == sft
    (sft / "config.json").unlink()
    assert evaluated_folder(sft) == sft / "checkpoints" / "step-3"
    assert evaluated_folder(tmp_path / "elsewhere") == tmp_path / "elsewhere"


def test_a_saved_model_s_config_is_the_one_beside_it_else_its_run_s(tmp_path):
    # `rlvr sft`/`rlvr dpo` write config.yaml beside the model; `rlvr train`'s checkpoints
    # RUN_DIR/checkpoints/step-N take RUN_DIR/config.yaml; the one beside wins where both are
    run_dir = tmp_path / "run"
    step = checkpoint_path(run_dir, 4)
    assert step == tmp_path / "run" / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    assert saved_config(step) is None
    (run_dir / "config.yaml").write_text("{}")
    assert saved_config(step) == run_dir / "config.yaml"
    (step / "config.yaml").write_text("{}")
    assert saved_config(step) == step / "config.yaml"
    # a folder outside `checkpoints/` does not read the config two levels up
    other = run_dir / "exports" / "final"
    other.mkdir(parents=True)
    assert saved_config(other) is None


def test_a_checkpoint_that_cannot_be_loaded_is_named(tmp_path):
    step = train(small_config(tmp_path, "train.steps=1"), show_progress=False) / "checkpoints"
    step = step / "step-1"
    weights, state = step / "model.safetensors", step / STATE_FILE
    good = weights.read_bytes()
    weights.write_bytes(good[:1000])  # cut short, as by a full disk outside rlvr's atomic save
    damaged = ".*delete that folder and --resume continues from the checkpoint before it"
    with pytest.raises(
        CheckpointError, match=re.escape(f"{step}: the weights cannot be read") + damaged
    ):
        train(small_config(tmp_path, "train.steps=2"), resume=True, show_progress=False)
    weights.write_bytes(good)
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=re.escape(f"{state} cannot be read") + damaged):
        train(small_config(tmp_path, "train.steps=2"), resume=True, show_progress=False)
    other_shape = small_config(tmp_path, "train.steps=2", "model.tiny.hidden_size=16")
    misfit = re.escape(f"{step}: the weights do not fit this run's model (size mismatch")
    changed = pytest.warns(UserWarning, match="model.tiny.hidden_size: 32 -> 16")
    with changed, pytest.raises(CheckpointError, match=misfit + ".*the model settings the run"):
        train(other_shape, resume=True, show_progress=False)


def test_a_skipped_non_finite_step_leaves_the_lr_and_a_clean_step_resets_the_count(tmp_path):
    """Steps 1 and 3 have NaN rewards, step 2 is clean: with max_nonfinite_steps=2 the run
    finishes (the clean step resets the count of consecutive bad steps), and a skipped update
    does not step the LR schedule either: step 2's LR is a clean run's step 1's."""
    calls = []

    def poison(batch):
        calls.append(1)
        if len(calls) in (1, 3):
            batch.rewards = torch.full_like(batch.rewards, float("nan"))
        return batch

    cosine = ("train.steps=3", "train.schedule=cosine")
    cfg = small_config(tmp_path / "nan", *cosine, "train.max_nonfinite_steps=2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, filters=(poison,), show_progress=False)
    rows = read_jsonl(tmp_path / "nan" / "metrics.jsonl")
    assert len(calls) == 3 and len(rows) == 3
    clean = read_jsonl(
        train(small_config(tmp_path / "clean", *cosine), show_progress=False) / "metrics.jsonl"
    )
    assert rows[1]["lr"] == clean[0]["lr"] != rows[0]["lr"]


def test_non_finite_rewards_skip_steps_then_stop(tmp_path):
    def poison(batch):
        batch.rewards = torch.full_like(batch.rewards, float("nan"))
        return batch

    cfg = small_config(tmp_path / "nan", "train.steps=5", "train.max_nonfinite_steps=2")
    with (
        pytest.warns(UserWarning, match="non-finite"),
        pytest.raises(NonFiniteError, match="2 consecutive steps"),
    ):
        train(cfg, filters=(poison,), show_progress=False)
    assert len(read_jsonl(tmp_path / "nan" / "metrics.jsonl")) == 1


def test_gradient_checkpointing_follows_the_same_trajectory(tmp_path, recomputed_regions):
    plain = train(small_config(tmp_path / "plain", "train.steps=3"), show_progress=False)
    assert not recomputed_regions
    checkpointed = train(
        small_config(tmp_path / "ck", "train.steps=3", "train.gradient_checkpointing=true"),
        show_progress=False,
    )
    assert recomputed_regions  # the layers really were recomputed
    a, b = read_jsonl(plain / "metrics.jsonl"), read_jsonl(checkpointed / "metrics.jsonl")
    assert len(a) == len(b) == 3
    for left, right in zip(a, b):
        for key in left.keys() - TIMING:
            assert left[key] == right[key] or (math.isnan(left[key]) and math.isnan(right[key])), (
                left["step"],
                key,
            )


def test_gradient_checkpointing_without_the_fused_forward_is_a_config_error(tmp_path):
    extra = ("train.steps=1", "train.gradient_checkpointing=true", "model.fused_forward=false")
    cfg = small_config(tmp_path / "hf", *extra)
    with pytest.raises(ConfigError, match=r"train\.gradient_checkpointing: .*fused forward"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "hf").exists()  # nothing written, no earlier run's config replaced


@pytest.mark.parametrize("preset", ["grpo", "rloo", "reinforce_pp", "gpg"])
def test_a_group_baseline_with_one_sample_per_prompt_is_refused(tmp_path, preset):
    overrides = [f"train.output_dir={tmp_path}", "rollout.samples_per_prompt=1"]
    with pytest.raises(ConfigError, match=r"rollout\.samples_per_prompt=1 would train nothing"):
        train(resolve_config(preset=preset, overrides=overrides), show_progress=False)
    assert not tmp_path.joinpath("config.yaml").exists()
    beta_th = ["algorithm.min_informative_fraction=0"]  # gpg's β_th counts groups too
    for alone in ("algorithm.advantage=reinforce_pp", "algorithm.advantage=gae"):
        check_choices(resolve_config(preset=preset, overrides=[*overrides, alone, *beta_th]))


def test_the_verifier_entry_is_the_task_s_own_reward(tmp_path):
    """`reward.functions` entry `verifier` runs as the task's verifier (`math`, `countdown`),
    with its weight; naming it beside that verifier, as any reward listed twice, is refused
    before the run directory is written, a misspelt one with its key, and no reward may be
    registered under the name."""
    from rlvr.rewards import register_reward
    from rlvr.training.rewarding import RewardScorer

    weighted = "reward.functions=[{name: verifier, weight: 2.0}, {name: format, weight: 0.1}]"
    for task_name, verifier in (("arithmetic", "math"), ("countdown", "countdown")):
        cfg = resolve_config(overrides=[f"data.task={task_name}", "data.train_size=8", weighted])
        assert RewardScorer(cfg, load_task(cfg.data)).compose.weights == {
            verifier: 2.0,
            "format": 0.1,
        }
    twice = {
        "[{name: verifier}, {name: math}]": r"lists 'math' twice \('verifier' is this task's ",
        "[{name: math}, {name: format}, {name: math, weight: 0.5}]": r"lists 'math' twice: keep",
    }
    for functions, message in twice.items():
        overrides = [*TINY_RUN, f"train.output_dir={tmp_path}", f"reward.functions={functions}"]
        with pytest.raises(ConfigError, match=rf"reward\.functions {message}"):
            train(resolve_config(overrides=overrides), show_progress=False)
        assert not tmp_path.joinpath("config.yaml").exists()
    with pytest.raises(
        ConfigError, match=r"reward\.functions\[0\]\.name: unknown reward 'verifer'"
    ):
        check_choices(resolve_config(overrides=["reward.functions=[{name: verifer}]"]))
    with pytest.raises(ValueError, match="stands for the task's own verifier"):
        register_reward("verifier")(lambda prompts, completions, **_: [0.0] * len(completions))


def test_pass_at_k_needs_k_below_the_group_size():
    overrides = ["algorithm.advantage=pass_at_k", "rollout.samples_per_prompt=4"]
    check_choices(resolve_config(overrides=[*overrides, "algorithm.pass_k=3"]))
    with pytest.raises(ConfigError, match=r"algorithm\.pass_k=4: .*the other .* = 3, so k must"):
        check_choices(resolve_config(overrides=[*overrides, "algorithm.pass_k=4"]))
    with pytest.raises(ConfigError, match=r"counts passes.*: algorithm\.overlong\.buffer$"):
        resolve_config(preset="dapo", overrides=overrides)  # its soft overlong punishment


def test_one_sample_per_prompt_is_remaxs_and_not_dynamic_samplings():
    check_choices(resolve_config(preset="remax"))  # one sample per prompt, the greedy baseline
    with pytest.raises(ConfigError, match=r"dynamic_sampling keeps the groups whose samples"):
        check_choices(resolve_config(preset="remax", overrides=["algorithm.dynamic_sampling=true"]))


def terms(text: str) -> int:
    """The terms of a one-digit sum: its digits."""
    return sum(c.isdigit() for c in text)


def test_prompts_over_max_prompt_tokens_are_left_out_of_training(tmp_path, capsys):
    """One-digit sums of two or three terms template to 15 or 17 tokens: with a 15-token
    limit only the two-term prompts are sampled, and the run says how many it left out."""
    settings = [*TINY_RUN, "data.min_terms=2", "data.max_terms=3", "train.steps=3"]
    settings += ["train.log_samples=12", "rollout.max_prompt_tokens=15"]
    cfg = resolve_config(overrides=[*settings, f"train.output_dir={tmp_path}"])
    three_terms = sum(terms(p.question) == 3 for p in load_task(cfg.data).train)
    assert 0 < three_terms < cfg.data.train_size
    train(cfg, show_progress=True)
    said = f"{three_terms} of {cfg.data.train_size} training prompts are longer and left out"
    assert said in capsys.readouterr().out
    samples = read_jsonl(tmp_path / "samples.jsonl")
    assert len(samples) == 36
    assert all(terms(s["prompt"]) == 2 for s in samples)
    _, tokenizer = load_model_and_tokenizer(cfg.model)
    assert all(
        len(tokenizer(s["prompt"], add_special_tokens=False)["input_ids"]) <= 15 for s in samples
    )

    cfg = resolve_config(overrides=[*settings, "rollout.max_prompt_tokens=14"])
    with pytest.raises(ConfigError, match="max_prompt_tokens=14: all 100 training prompts are"):
        train(
            cfg.model_copy(
                update={"train": cfg.train.model_copy(update={"output_dir": str(tmp_path / "b")})}
            )
        )
    assert not (tmp_path / "b").exists()  # refused before the run directory is made


def test_keep_checkpoints_deletes_the_older_ones_and_resume_goes_on(tmp_path):
    """TRL's save_total_limit: with a checkpoint each step and 2 kept, steps 3 and 4 remain,
    a folder that is not a step-N checkpoint stays, and --resume continues from step 4."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-best").mkdir(parents=True)
    settings = ["train.save_every=1", "train.keep_checkpoints=2"]
    train(small_config(run_dir, "train.steps=4", *settings), show_progress=False)
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["step-3", "step-4", "step-best"]
    train(small_config(run_dir, "train.steps=5", *settings), resume=True, show_progress=False)
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-4",
        "step-5",
        "step-best",
    ]
