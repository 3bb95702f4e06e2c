"""Config tree: presets, dotted overrides, and errors that name the key."""

import re
from pathlib import Path

import pytest

from rlvr import foreign_keys
from rlvr.config import (
    ConfigError,
    RLConfig,
    changed_settings,
    data_config,
    describe_fields,
    preset_names,
    resolve_config,
    save_config,
)
from rlvr.config_files import PREFERENCE_PRESETS, RL_PRESETS, parse_override
from rlvr.config_offline import CurateConfig, DPOConfig, SFTConfig


def test_defaults_and_overrides_are_typed():
    cfg = resolve_config(
        overrides=["algorithm.clip.high=0.28", "train.steps=7", "data.task=countdown"]
    )
    assert cfg.algorithm.clip.high == 0.28
    assert cfg.train.steps == 7
    assert cfg.data.task == "countdown"
    assert cfg.algorithm.clip.low == 0.2


def test_preset_then_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  kl:\n    coef: 0.1\ntrain:\n  steps: 3\n")
    cfg = resolve_config(path, "grpo", ["train.steps=5"])
    assert cfg.preset == "grpo"
    assert cfg.algorithm.aggregation == "seq_mean_token_mean"  # from the preset
    assert cfg.algorithm.kl.coef == 0.1  # the file wins over the preset
    assert cfg.train.steps == 5  # the override wins over the file


def test_a_run_config_under_another_preset_keeps_its_changes_and_takes_that_preset(tmp_path):
    run = resolve_config(None, "grpo", ["train.lr=1e-4", "data.max_digits=1", "train.steps=9"])
    path = tmp_path / "config.yaml"
    save_config(run, path)  # a run's config.yaml: every key, `preset: grpo`
    cfg = resolve_config(path, "dapo", ["train.steps=5"])
    dapo = resolve_config(None, "dapo")
    assert cfg.preset == "dapo"
    assert cfg.algorithm == dapo.algorithm  # dynamic sampling, clip-higher, no KL: DAPO's
    assert (cfg.train.lr, cfg.data.max_digits, cfg.train.steps) == (1e-4, 1, 5)
    assert cfg.rollout == dapo.rollout  # grpo's own rollout settings are not carried over
    assert resolve_config(path, "grpo") == run  # under its own preset, the file as it is
    assert resolve_config(path) == run


def test_a_preset_override_chooses_the_preset_as_the_option_does():
    assert resolve_config(overrides=["preset=dapo"]) == resolve_config(preset="dapo")
    assert resolve_config(preset="dapo", overrides=["preset=dapo"]).preset == "dapo"
    with pytest.raises(ConfigError, match=r"--preset grpo and preset=dapo: give one preset"):
        resolve_config(preset="grpo", overrides=["preset=dapo"])
    with pytest.raises(ConfigError, match=r"unknown config key 'preset'"):  # SFT has none
        resolve_config(overrides=["preset=grpo"], model=SFTConfig)


def test_dr_grpo_preset_settings():
    cfg = resolve_config(preset="dr_grpo")
    assert cfg.algorithm.std_normalization == "none"
    assert cfg.algorithm.aggregation == "seq_mean_token_sum"
    assert cfg.algorithm.kl.coef == 0.0


def test_gpg_preset_settings():
    algo = resolve_config(preset="gpg").algorithm
    assert (algo.advantage, algo.std_normalization, algo.loss, algo.aggregation) == (
        "gpg",
        "none",
        "reinforce",
        "token_mean",
    )
    assert algo.kl.coef == 0.0 and algo.entropy.coef == 0.0


def test_unknown_key_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"'algorithm\.clip\.hihg'.*'algorithm\.clip\.high'"):
        resolve_config(overrides=["algorithm.clip.hihg=0.28"])


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  temprature: 0.6\n")
    with pytest.raises(
        ConfigError, match=r"bad\.yaml.*'rollout\.temprature'.*'rollout\.temperature'"
    ):
        resolve_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "train:\n  steps: 2\n lr: 1\n",
            "bad.yaml, line 3, column 2: invalid YAML (while parsing a block mapping: expected "
            "<block end>, but found '<block mapping start>')",
        ),
        ("preset: grpoo\n", "bad.yaml: preset: unknown preset 'grpoo'; did you mean 'grpo'?"),
    ],
)
def test_a_config_file_that_breaks_is_named_with_the_line_or_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        resolve_config(path)
    assert str(info.value).startswith(f"{tmp_path}/{message}")


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'train\.steps'"):
        resolve_config(overrides=["train.steps=many"])


def test_bad_enum_names_the_key():
    with pytest.raises(ConfigError, match=r"'algorithm\.aggregation'"):
        resolve_config(overrides=["algorithm.aggregation=token_sum"])


def test_unknown_preset_suggests_one():
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        resolve_config(preset="grp")


@pytest.mark.parametrize(
    ("model", "package", "preset", "command"),
    [(RLConfig, RL_PRESETS, "simpo", "dpo"), (DPOConfig, PREFERENCE_PRESETS, "grpo", "train")],
)
def test_the_other_command_s_preset_is_answered_with_that_command(model, package, preset, command):
    with pytest.raises(ConfigError) as info:
        resolve_config(preset=preset, model=model, preset_package=package)
    assert str(info.value) == (
        f"preset {preset!r} is not one of this command's; it is `rlvr {command}`'s: "
        f"rlvr {command} --preset {preset}"
    )


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="key=value"):
        resolve_config(overrides=["train.steps"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_config(tmp_path / "nope.yaml")


def test_every_field_has_a_docstring():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation)

    walk(RLConfig)
    walk(SFTConfig)


def test_shipped_presets_validate():
    assert {"grpo", "dr_grpo"} <= set(preset_names())
    for name in preset_names():
        resolve_config(preset=name)


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("rollout.temperature=0", r"'rollout\.temperature': Input should be greater than 0"),
        ("rollout.temperature=-1", r"'rollout\.temperature'"),
        ("rollout.samples_per_prompt=0", r"'rollout\.samples_per_prompt'"),
        ("rollout.top_p=0", r"'rollout\.top_p'"),
        ("rollout.top_p=1.5", r"'rollout\.top_p'"),
        ("rollout.top_k=-1", r"'rollout\.top_k'"),
        ("rollout.max_new_tokens=0", r"'rollout\.max_new_tokens'"),
        ("rollout.batch_size=0", r"'rollout\.batch_size'"),
        ("rollout.schedule=[{from_step: 0}]", r"'rollout\.schedule\.0\.from_step'"),
        ("rollout.schedule=[{from_step: 3, temperature: 0}]", r"'rollout\.schedule\.0\.temp"),
        ("algorithm.clip.dual=0.5", r"'algorithm\.clip\.dual': Input should be greater than 1"),
        ("algorithm.kl.coef=-0.1", r"'algorithm\.kl\.coef'"),
        ("algorithm.entropy.top_frac=0", r"'algorithm\.entropy\.top_frac'"),
        ("algorithm.critic.lam=1.5", r"'algorithm\.critic\.lam'"),
        ("algorithm.overlong.buffer=1", r"'algorithm\.overlong\.buffer'"),
        ("reward.timeout_s=0", r"'reward\.timeout_s'"),
        ("train.steps=0", r"'train\.steps'"),
        ("train.lr=-1e-6", r"'train\.lr'"),
        ("train.epochs=0", r"'train\.epochs'"),
        ("train.mini_batches=0", r"'train\.mini_batches'"),
        ("train.micro_batch_tokens=0", r"'train\.micro_batch_tokens'"),
        ("train.min_lr_ratio=2", r"'train\.min_lr_ratio'"),
        ("eval.k=0", r"'eval\.k'"),
        ("eval.temperature=-1", r"'eval\.temperature'"),
        ("data.shortcut_frac=1.5", r"'data\.shortcut_frac'"),
        ("model.tiny.num_layers=0", r"'model\.tiny\.num_layers'"),
    ],
)
def test_out_of_range_values_name_the_key(override, names):
    with pytest.raises(ConfigError, match=names):
        resolve_config(overrides=[override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.min_new_tokens=65"], r"rollout\.min_new_tokens \(65\) is above .*\(64\)"),
        (["data.min_terms=4", "data.max_terms=3"], r"data\.min_terms \(4\) is above"),
        (["data.operators='*'"], r"data\.operators '\*': the arithmetic task draws from"),
        (["data.path=p.jsonl"], r"data\.path names a file, but data\.task=arithmetic is gen"),
        (["data.task=countdown", "data.test_path=t.jsonl"], r"data\.test_path .*=countdown"),
        (["model.tiny.num_heads=3"], r"hidden_size \(256\) is not a multiple of .*num_heads \(3\)"),
    ],
)
def test_settings_that_contradict_each_other_name_both_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=overrides)


def test_edges_of_the_ranges_are_accepted():
    cfg = resolve_config(
        overrides=[
            "rollout.samples_per_prompt=1",
            "rollout.top_p=1",
            "rollout.min_new_tokens=64",
            "algorithm.clip.low=1.0",
            "eval.temperature=0",
            "train.lr=0",
            "data.operators=+",
        ]
    )
    assert (cfg.rollout.min_new_tokens, cfg.eval.temperature, cfg.data.operators) == (64, 0, "+")


def test_an_override_that_is_not_yaml_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'data\.operators=\*': the value is not valid YAML"):
        resolve_config(overrides=["data.operators=*"])


def test_sft_and_dpo_sections_are_range_checked_too():
    with pytest.raises(ConfigError, match=r"'sft\.batch_size'"):
        resolve_config(overrides=["sft.batch_size=0"], model=SFTConfig)
    with pytest.raises(ConfigError, match=r"'dpo\.micro_batch_tokens'"):
        resolve_config(overrides=["dpo.micro_batch_tokens=0"], model=DPOConfig)


def test_changed_settings_lists_each_differing_leaf_but_the_ignored_ones():
    saved = resolve_config(overrides=["train.steps=5"]).model_dump(mode="json")
    saved["rollout"].pop("top_k")  # a key the saved file lacks reads as None
    now = resolve_config(
        overrides=["train.steps=9", "rollout.temperature=0.7", "train.log_to=[tensorboard]"]
    )
    assert changed_settings(saved, now, ignore=("train.steps",)) == [
        "rollout.temperature: 1.0 -> 0.7",
        "rollout.top_k: None -> 0",
        "train.log_to: [] -> ['tensorboard']",
    ]
    assert changed_settings(saved, now)[-2] == "train.steps: 5 -> 9"


def test_help_config_rows_show_each_default_with_its_range():
    rows = {key: (default, doc) for key, default, doc in describe_fields(RLConfig)}
    assert rows["rollout.temperature"][0] == "1.0 (> 0)"
    assert rows["rollout.top_p"][0] == "1.0 (> 0.0, <= 1.0)"
    assert rows["algorithm.clip.dual"][0] == "None (> 1.0)"
    assert rows["train.seed"][0] == "0"  # no range
    assert rows["train.steps"] == ("100 (>= 1)", "Number of RL steps (one rollout batch each).")


@pytest.mark.parametrize(
    ("model", "override", "message"),
    [
        (RLConfig, "num_generations=16", "TRL's name for rlvr's 'rollout.samples_per_prompt'"),
        (RLConfig, "beta=0.04", "TRL's name for rlvr's 'algorithm.kl.coef'"),
        (DPOConfig, "beta=0.5", "TRL's name for rlvr's 'dpo.beta'"),  # the command decides
        (SFTConfig, "learning_rate=1e-5", "TRL's name for rlvr's 'sft.lr'"),
        (
            RLConfig,  # a whole unknown section: the leaf under it is named
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "'actor_rollout_ref.actor.clip_ratio_high' is verl's name for rlvr's "
            "'algorithm.clip.high'",
        ),
        (RLConfig, "data.train_batch_size=64", "verl's name for rlvr's 'rollout.prompts_per_step'"),
        (RLConfig, "algorithm.clip.hihg=0.3", "did you mean 'algorithm.clip.high'?"),
        (  # the tail of verl's path, as a verl user shortens it
            RLConfig,
            "rollout.n=8",
            "the end of verl's 'actor_rollout_ref.rollout.n', rlvr's 'rollout.samples_per_prompt'",
        ),
        (RLConfig, "clip_ratio_high=0.28", "rlvr's 'algorithm.clip.high'"),
        (RLConfig, "rollout.max_tokens=9", "did you mean 'rollout.max_new_tokens'?"),
        (RLConfig, "rollout.q=1", "did you mean 'rollout.top_p'?"),  # not its section, `rollout`
        (
            RLConfig,
            "lr=1e-6",
            "unknown config key 'lr'; did you mean 'algorithm.critic.lr', 'algorithm.prime.lr' or "
            "'train.lr'?",
        ),
        (
            RLConfig,
            "coef=0.1",
            "did you mean 'algorithm.kl.coef', 'algorithm.entropy.coef' or "
            "'algorithm.distill.coef'?",
        ),
        (SFTConfig, "steps=3", "unknown config key 'steps'; did you mean 'sft.steps'?"),
        (DPOConfig, "num_generations=4", "unknown config key 'num_generations'"),
        (
            RLConfig,
            "reward_model.model.path=/rm",
            "'reward_model.model.path' is verl's name for rlvr's 'reward.functions'",
        ),
    ],
)
def test_a_trl_or_verl_name_is_answered_with_rlvrs_key(model, override, message):
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=[override], model=model)
    assert message in str(info.value)
    if model is DPOConfig and "num_generations" in override:
        assert "name for" not in str(info.value)  # dpo has no group size to point at


def test_a_whole_verl_section_names_rlvrs_key_for_each_of_its_settings(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text(
        "actor_rollout_ref:\n  actor:\n    optim: {lr: 1.0e-6}\n    ppo_mini_batch_size: 8\n"
        "  rollout: {n: 8, gpu_memory_utilization: 0.5}\n"
    )
    with pytest.raises(ConfigError) as info:
        resolve_config(path)
    assert str(info.value) == (
        f"{path}: unknown config key 'actor_rollout_ref': "
        "'actor_rollout_ref.actor.optim.lr' is verl's name for rlvr's 'train.lr'; "
        "'actor_rollout_ref.actor.ppo_mini_batch_size' is verl's name for rlvr's "
        "'train.mini_batches'; "
        "'actor_rollout_ref.rollout.n' is verl's name for rlvr's 'rollout.samples_per_prompt'; "
        "'actor_rollout_ref.rollout.gpu_memory_utilization' is verl's name for rlvr's "
        "'rollout.vllm_memory'"
    )


def test_a_verl_tail_with_two_meanings_gets_no_hint():
    with pytest.raises(ConfigError) as info:  # verl's rollout.n and rollout.val_kwargs.n
        resolve_config(overrides=["n=8"])
    assert str(info.value) == "config + overrides: unknown config key 'n'"


def test_every_foreign_name_points_at_a_key_and_the_docs_list_them_all():
    valid = {key for m in (RLConfig, SFTConfig, DPOConfig) for key, _, _ in describe_fields(m)}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "migrating.md").read_text()
    for table in (foreign_keys.TRL, foreign_keys.VERL, foreign_keys.OPENRLHF):
        for name, ours in table.items():
            assert ours and set(ours) <= valid, name
            assert f"| `{name}` | {', '.join(f'`{k}`' for k in ours)} |" in docs, name
    for name, answer in {**foreign_keys.ANSWERS, **foreign_keys.OPENRLHF_ANSWERS}.items():
        assert f"| `{name}` | {answer} |" in docs, name


@pytest.mark.parametrize(
    ("model", "override", "message"),
    [
        (
            RLConfig,
            "bf16=true",
            "unknown config key 'bf16': TRL's setting, not rlvr's: rlvr's model.dtype=bfloat16 "
            "(the weights themselves in bf16, no fp32 copy)",
        ),
        (  # a key in rlvr sft, none in rlvr train
            RLConfig,
            "per_device_train_batch_size=8",
            "TRL's setting, not rlvr's: TRL's GRPO counts completions, rlvr counts prompts: "
            "rollout.prompts_per_step, each sampled rollout.samples_per_prompt times",
        ),
        (SFTConfig, "per_device_train_batch_size=8", "TRL's name for rlvr's 'sft.batch_size'"),
        (
            RLConfig,
            "trainer.n_gpus_per_node=8",
            "unknown config key 'trainer': 'trainer.n_gpus_per_node' is verl's setting, not "
            "rlvr's: torchrun sets the ranks: torchrun --nproc_per_node=N -m rlvr train",
        ),
    ],
)
def test_a_setting_rlvr_has_no_key_for_is_answered_with_what_rlvr_does(model, override, message):
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=[override], model=model)
    assert message in str(info.value) and "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [  # before the table, the nearest spellings: rollout.batch_size, data.prompt_column, ...
        ("rollout_batch_size=128", "OpenRLHF's name for rlvr's 'rollout.prompts_per_step'"),
        ("prompt_max_len=1024", "OpenRLHF's name for rlvr's 'rollout.max_prompt_tokens'"),
        ("advantage_estimator=rloo", "OpenRLHF's name for rlvr's 'algorithm.advantage'"),
        ("micro_train_batch_size=2", "OpenRLHF's name for rlvr's 'train.micro_batch_tokens'"),
        ("train_batch_size=128", "OpenRLHF's name for rlvr's 'train.mini_batches'"),
        ("n_samples_per_prompt=8", "OpenRLHF's name for rlvr's 'rollout.samples_per_prompt'"),
        (
            "packing_samples=true",
            "unknown config key 'packing_samples': OpenRLHF's setting, not rlvr's: rlvr "
            "batches by tokens",
        ),
        ("data.train_batch_size=64", "verl's name for rlvr's 'rollout.prompts_per_step'"),
    ],
)
def test_openrlhf_arguments_are_answered_with_rlvr_s_key(override, message):
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=[override])
    assert message in str(info.value) and "did you mean" not in str(info.value)


def test_an_override_keeps_later_equals_signs_and_an_empty_value_is_an_empty_string():
    assert parse_override("data.path=a=b.jsonl") == (["data", "path"], "a=b.jsonl")
    assert parse_override("data.prompt_column=") == (["data", "prompt_column"], "")
    assert parse_override("train.steps = 5") == (["train", "steps"], 5)


def test_hydra_s_add_prefixes_set_the_key_and_its_remove_prefix_is_answered():
    """verl's scripts write `+key=value` and `++key=value`; a verl name behind the prefix is
    still answered with rlvr's key."""
    cfg = resolve_config(overrides=["+train.steps=3", "++rollout.temperature=0.7"])
    assert (cfg.train.steps, cfg.rollout.temperature) == (3, 0.7)
    with pytest.raises(ConfigError, match=r"'trainer\.total_training_steps' is verl's name"):
        resolve_config(overrides=["+trainer.total_training_steps=3"])
    for removal in ("~train.steps", "~train.steps=3"):
        with pytest.raises(ConfigError, match=r"~key removes a key.*leave 'train\.steps' out"):
            resolve_config(overrides=[removal])


def test_the_named_preset_wins_over_the_files_preset(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: dr_grpo\ntrain:\n  steps: 3\n")
    assert resolve_config(path).algorithm.aggregation == "seq_mean_token_sum"
    assert resolve_config(path, "grpo").algorithm.aggregation == "seq_mean_token_mean"


# Each bound of the algorithm section, written out: the edge value that is still accepted and
# the nearest one that is refused, with the key named (a bound moved or loosened fails here).
ALGORITHM_BOUNDS = [
    ("clip.low", 0.0, -0.01), ("clip.high", 0.0, -0.01), ("clip.dual", 1.01, 1.0),
    ("covariance.fraction", 1.0, 1.01), ("covariance.fraction", 1e-6, 0.0),
    ("covariance.kl_coef", 0.0, -0.1),
    ("kl.coef", 0.0, -0.1), ("kl.adaptive_target", 0.01, 0.0), ("kl.horizon", 1, 0),
    ("kl.reference_ema", 0.0, -0.01), ("kl.reference_ema", 1.0, 1.01),
    ("kl.reference_reset_every", 0, -1), ("kl.reference_reset_mix", 1.0, 1.01),
    ("kl.reference_reset_patience", 0, -1),
    ("entropy.coef", 0.0, -0.1), ("entropy.target", 0.01, 0.0), ("entropy.delta", 0.0, -0.1),
    ("entropy.max_coef", 0.0, -0.1), ("entropy.top_frac", 1.0, 1.01),
    ("entropy.top_frac", 0.01, 0.0), ("entropy.advantage_alpha", 0.0, -0.1),
    ("entropy.advantage_kappa", 1.01, 1.0),
    ("overlong.buffer", 0.0, -0.1), ("overlong.buffer", 0.99, 1.0), ("overlong.penalty", 0.0, -0.1),
    ("group_filter.keep", 0, -1),
    ("shaping.length_start_step", 0, -1), ("shaping.repetition_ngram", 1, 0),
    ("critic.gamma", 0.0, -0.01), ("critic.gamma", 1.0, 1.01), ("critic.lam", 0.0, -0.01),
    ("critic.lam", 1.0, 1.01), ("critic.critic_lam", 1.0, 1.01),
    ("critic.critic_lam", 0.0, -0.01), ("critic.length_adaptive_alpha", 0.01, 0.0),
    ("critic.value_clip", 0.01, 0.0), ("critic.lr", 1e-9, 0.0), ("critic.warmup_steps", 0, -1),
    ("rollout_is.min_ratio", 0.0, -0.1), ("rollout_is.max_ratio", 0.01, 0.0),
    ("vespo.k_pos", 0.0, -0.1), ("vespo.lambda_pos", 0.01, 0.0), ("vespo.k_neg", 0.0, -0.1),
    ("vespo.lambda_neg", 0.01, 0.0),
    ("distill.coef", 0.01, 0.0), ("distill.discount", 1.0, 1.01),
    ("distill.discount", 0.0, -0.01), ("distill.outcome_weight", 0.0, -0.1),
    ("epsilon", 0.0, -1e-9), ("pass_k", 1, 0), ("positive_weight", 0.0, -0.1),
    ("max_sampling_rounds", 1, 0), ("positive_lm_coef", 0.0, -0.1), ("omd_tau", 0.01, 0.0),
    ("sapo_tau_pos", 0.01, 0.0), ("sapo_tau_neg", 0.01, 0.0), ("off_policy_mask", 0.0, -0.1),
]  # fmt: skip


@pytest.mark.parametrize(("key", "edge", "beyond"), ALGORITHM_BOUNDS)
def test_each_algorithm_bound_takes_its_edge_and_refuses_beyond_it(key, edge, beyond):
    cfg = resolve_config(preset="grpo", overrides=[f"algorithm.{key}={edge}"])
    section = cfg.algorithm
    for part in key.split("."):
        section = getattr(section, part)
    assert section == edge
    with pytest.raises(ConfigError, match=re.escape(f"config key 'algorithm.{key}'")):
        resolve_config(preset="grpo", overrides=[f"algorithm.{key}={beyond}"])


# The same for the sections of `rlvr sft`, `rlvr dpo` and `rlvr curate` (curate's pass-rate
# band closed on either end: the test after).
OFFLINE_BOUNDS = [
    *[("sft", key, edge, beyond) for key, edge, beyond in [
        ("steps", 1, 0), ("epochs", 1e-6, 0), ("max_length", 2, 1), ("batch_size", 1, 0),
        ("lr", 0.0, -1e-9), ("weight_decay", 0.0, -0.01), ("warmup_steps", 0, -1),
        ("min_lr_ratio", 0.0, -0.01), ("min_lr_ratio", 1.0, 1.01),
        ("max_grad_norm", 0.0, -0.1), ("micro_batch_tokens", 1, 0), ("save_every", 0, -1),
        ("keep_checkpoints", 0, -1), ("threads", 0, -1),
    ]],
    *[("dpo", key, edge, beyond) for key, edge, beyond in [
        ("beta", 1e-6, 0), ("label_smoothing", 0.0, -0.01), ("label_smoothing", 0.49, 0.5),
        ("kto_desirable_weight", 1e-6, 0), ("kto_undesirable_weight", 1e-6, 0),
        ("discopop_tau", 1e-6, 0), ("ld_alpha", 0.0, -0.01), ("ld_alpha", 1.0, 1.01),
        ("nll_coef", 0.0, -0.1), ("steps", 1, 0), ("epochs", 1e-6, 0), ("max_length", 2, 1),
        ("batch_size", 1, 0), ("lr", 0.0, -1e-9), ("weight_decay", 0.0, -0.01),
        ("warmup_steps", 0, -1), ("min_lr_ratio", 0.0, -0.01), ("min_lr_ratio", 1.0, 1.01),
        ("max_grad_norm", 0.0, -0.1), ("micro_batch_tokens", 1, 0),
        ("eval_every_steps", 0, -1), ("eval_pairs", 0, -1), ("prompts", 1, 0),
        ("samples_per_prompt", 2, 1), ("temperature", 1e-6, 0), ("max_new_tokens", 1, 0),
        ("save_every", 0, -1), ("keep_checkpoints", 0, -1), ("threads", 0, -1),
    ]],
    *[("curate", key, edge, beyond) for key, edge, beyond in [
        ("samples_per_prompt", 1, 0), ("temperature", 1e-6, 0), ("max_new_tokens", 1, 0),
        ("max_problems", 0, -1), ("min_pass_rate", 0.0, -0.01), ("max_pass_rate", 1.0, 1.01),
    ]],
]  # fmt: skip
READ_BY = {
    "kto_desirable_weight": "kto",
    "kto_undesirable_weight": "kto",
    "discopop_tau": "discopop",
}
"""The loss that reads a dpo setting (another loss refuses it)."""


@pytest.mark.parametrize(("section", "key", "edge", "beyond"), OFFLINE_BOUNDS)
def test_each_offline_bound_takes_its_edge_and_refuses_beyond_it(section, key, edge, beyond):
    model = {"sft": SFTConfig, "dpo": DPOConfig, "curate": CurateConfig}[section]
    loss = [f"dpo.loss={READ_BY[key]}"] if section == "dpo" and key in READ_BY else []
    cfg = resolve_config(overrides=[*loss, f"{section}.{key}={edge}"], model=model)
    assert getattr(getattr(cfg, section), key) == edge
    with pytest.raises(ConfigError, match=re.escape(f"config key '{section}.{key}'")):
        resolve_config(overrides=[*loss, f"{section}.{key}={beyond}"], model=model)


def test_curates_band_may_close_on_either_end():
    for rate in (0.0, 1.0):
        overrides = [f"curate.min_pass_rate={rate}", f"curate.max_pass_rate={rate}"]
        band = resolve_config(overrides=overrides, model=CurateConfig).curate
        assert (band.min_pass_rate, band.max_pass_rate) == (rate, rate)


@pytest.mark.parametrize("section", ["covariance", "rollout_is"])
def test_a_band_of_equal_ends_is_refused(section):
    # Clip-Cov's (low, high) and rollout IS's [min_ratio, max_ratio] need low below high
    low, high = ("low", "high") if section == "covariance" else ("min_ratio", "max_ratio")
    overrides = [f"algorithm.{section}.{low}=1.5", f"algorithm.{section}.{high}=1.5"]
    with pytest.raises(ConfigError, match=rf"{low} \(1\.5\) must be below .*{high} \(1\.5\)"):
        resolve_config(preset="grpo", overrides=overrides)


# The same for `rlvr train`'s other sections (the algorithm's are above); COMPANIONS holds the
# settings an edge needs beside it (a 1-wide model has one head, one term at most needs one at
# least).
RL_BOUNDS = [
    ("model.tiny.hidden_size", 1, 0), ("model.tiny.num_layers", 1, 0),
    ("model.tiny.num_heads", 1, 0), ("model.tiny.intermediate_size", 1, 0),
    ("model.lora.rank", 0, -1), ("model.lora.alpha", 0.01, 0), ("model.lora.dropout", 0.0, -0.01),
    ("model.lora.dropout", 0.99, 1.0),
    ("data.min_priority", 0.0, -0.01), ("data.min_priority", 1.0, 1.01), ("data.train_size", 1, 0),
    ("data.test_size", 0, -1), ("data.max_digits", 1, 0), ("data.min_terms", 1, 0),
    ("data.max_terms", 1, 0), ("data.shortcut_frac", 0.0, -0.01), ("data.shortcut_frac", 1.0, 1.01),
    ("rollout.max_tool_calls", 1, 0), ("rollout.tool_timeout", 0.01, 0),
    ("rollout.vllm_memory", 0.01, 0), ("rollout.vllm_memory", 1.0, 1.01),
    ("rollout.vllm_cpu_kv_cache_gib", 1, 0), ("rollout.vllm_max_model_len", 1, 0),
    ("rollout.prompts_per_step", 1, 0), ("rollout.samples_per_prompt", 1, 0),
    ("rollout.temperature", 0.01, 0), ("rollout.top_p", 0.01, 0), ("rollout.top_p", 1.0, 1.01),
    ("rollout.top_k", 0, -1), ("rollout.min_p", 0.0, -0.01), ("rollout.min_p", 1.0, 1.01),
    ("rollout.repetition_penalty", 0.01, 0), ("rollout.max_new_tokens", 1, 0),
    ("rollout.min_new_tokens", 0, -1), ("rollout.max_prompt_tokens", 1, 0),
    ("rollout.batch_size", 1, 0), ("rollout.attempts", 1, 0),
    ("reward.timeout_s", 0.01, 0),
    ("train.steps", 1, 0), ("train.lr", 0.0, -1e-9), ("train.weight_decay", 0.0, -0.01),
    ("train.warmup_steps", 0, -1), ("train.min_lr_ratio", 0.0, -0.01),
    ("train.min_lr_ratio", 1.0, 1.01), ("train.max_grad_norm", 0.0, -0.1), ("train.epochs", 1, 0),
    ("train.mini_batches", 1, 0), ("train.micro_batch_tokens", 1, 0), ("train.save_every", 0, -1),
    ("train.keep_checkpoints", 0, -1), ("train.log_samples", 0, -1),
    ("train.max_nonfinite_steps", 1, 0), ("train.threads", 0, -1),
    ("eval.samples", 1, 0), ("eval.k", 1, 0), ("eval.temperature", 0.0, -0.01),
    ("eval.max_new_tokens", 1, 0), ("eval.every_steps", 0, -1), ("eval.attempts", 1, 0),
]  # fmt: skip
COMPANIONS = {
    "model.tiny.hidden_size": ["model.tiny.num_heads=1"],
    "data.max_terms": ["data.min_terms=1"],
}


@pytest.mark.parametrize(("key", "edge", "beyond"), RL_BOUNDS)
def test_each_rl_bound_takes_its_edge_and_refuses_beyond_it(key, edge, beyond):
    companions = COMPANIONS.get(key, [])
    section = resolve_config(overrides=[*companions, f"{key}={edge}"])
    for part in key.split("."):
        section = getattr(section, part)
    assert section == edge
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}'")):
        resolve_config(overrides=[*companions, f"{key}={beyond}"])


@pytest.mark.parametrize(
    ("key", "edge", "beyond"),
    [
        ("from_step", 1, 0),
        ("max_new_tokens", 1, 0),
        ("budget_scale", 0.01, 0),
        ("temperature", 0.01, 0),
    ],
)
def test_each_bound_of_a_rollout_stage_takes_its_edge_and_refuses_beyond_it(key, edge, beyond):
    def stage(value):
        first = "" if key == "from_step" else "from_step: 2, "
        return [f"rollout.schedule=[{{{first}{key}: {value}}}]"]

    assert getattr(resolve_config(overrides=stage(edge)).rollout.schedule[0], key) == edge
    with pytest.raises(ConfigError, match=re.escape(f"config key 'rollout.schedule.0.{key}'")):
        resolve_config(overrides=stage(beyond))


def test_adams_betas_lie_in_zero_to_one_open_at_one():
    # PyTorch's AdamW refuses a beta outside [0, 1): the config says so, naming the beta,
    # instead of a traceback once the model has loaded
    for edge in ([0.0, 0.0], [0.99, 0.9999]):
        assert resolve_config(overrides=[f"train.betas={edge}"]).train.betas == tuple(edge)
    for betas, index in (
        ([1.0, 0.999], 0),
        ([0.9, 1.0], 1),
        ([-0.01, 0.999], 0),
        ([0.9, -0.01], 1),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"config key 'train.betas.{index}'")):
            resolve_config(overrides=[f"train.betas={betas}"])


@pytest.mark.parametrize("model", [RLConfig, SFTConfig, DPOConfig, CurateConfig])
def test_a_saved_default_tree_loads_again(model, tmp_path):
    # every default lies inside its own bounds: a run's config.yaml of the defaults is valid
    path = tmp_path / "config.yaml"
    save_config(model(), path)
    again = resolve_config(path, model=model)
    assert again.model_dump(mode="json") == model().model_dump(mode="json")


@pytest.mark.parametrize(
    "overrides",
    [
        ["data.template=none"],  # one attempt, no chat-template arguments, no tools
        ["data.template=none", "rollout.tools=[calculator]"],  # tags need no chat template
        ["rollout.attempts=2", "eval.attempts=3"],  # the chat template (the default) retries
        ["rollout.tools=[calculator]", "rollout.tool_format=hermes"],
        ["data.chat_template_kwargs={enable_thinking: false}"],
        ["model.lora.rank=4"],  # LoRA without FSDP
        ["train.fsdp=true"],  # FSDP without LoRA
        ["data.path=null", "data.test_path=null"],
        ["data.task=file", "data.path=[a.jsonl, b.jsonl]", "data.test_path=[t.jsonl]"],
        ["algorithm.kl.coef=0.04", "algorithm.kl.reference_reset_patience=2", "eval.every_steps=5"],
        ["reward.functions=[{name: math}]"],  # no tool reward, no tools needed
        ["rollout.tools=[python]", "reward.functions=[{name: tool_error}]"],
    ],
)
def test_settings_that_agree_are_accepted(overrides):
    resolve_config(overrides=overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.template=none", "rollout.attempts=2"],
            r"rollout\.attempts / eval\.attempts > 1 tell .*data\.template=none does not use",
        ),
        (["data.template=r1", "eval.attempts=2"], r"data\.template=r1 does not use"),
        (
            ["data.template=none", "rollout.tools=[calculator]", "rollout.tool_format=hermes"],
            r"rollout\.tool_format=hermes passes .*data\.template=none does not use",
        ),
        (
            ["train.fsdp=true", "model.lora.rank=4"],
            r"train\.fsdp with model\.lora\.rank > 0: LoRA trains small adapters",
        ),
        (
            ["data.template=none", "data.chat_template_kwargs={enable_thinking: false}"],
            r"data\.chat_template_kwargs .*data\.template=none has none",
        ),
        (["data.task=file", "data.path=[]"], r"'data\.path': an empty list names no file"),
        (["data.task=file", "data.test_path=[]"], r"'data\.test_path': an empty list names no"),
        (
            ["algorithm.kl.coef=0.04", "algorithm.kl.reference_reset_patience=2"],
            r"reference_reset_patience=2 counts held-out evaluations .*eval\.every_steps=0",
        ),
        (
            ["reward.functions=[{name: math}, {name: tool_error}]"],
            r"reward\.functions has tool_error, .*rollout\.tools is empty",
        ),
        (
            ["rollout.tools=[calculater]"],
            r"'rollout\.tools': unknown tool 'calculater'; did you mean 'calculator'\?",
        ),
    ],
)
def test_settings_that_disagree_are_refused_with_the_keys_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=overrides)


def test_a_command_that_takes_only_a_task_takes_only_data_keys():
    data = data_config({"task": "countdown"}, ["data.max_digits=2"])
    assert (data.task, data.max_digits) == ("countdown", 2)
    with pytest.raises(ConfigError, match=r"'train\.steps=3': this command takes only data\."):
        data_config({}, ["train.steps=3"])


def test_the_settings_documented_as_off_are_off_by_default():
    """A default that the docs call "off" is the value that turns the knob off: plain sampling
    at the temperature (as TRL's and vLLM's defaults sample), the whole arithmetic cold start
    worked out, one checkpoint at the end and none deleted, torch's own thread count."""
    cfg = resolve_config()
    r = cfg.rollout
    assert (r.top_p, r.top_k, r.min_p, r.repetition_penalty, r.min_new_tokens) == (
        1.0,
        0,
        0.0,
        1.0,
        0,
    )
    assert cfg.data.shortcut_frac == 0.0
    t = cfg.train
    assert (t.save_every, t.keep_checkpoints, t.threads) == (0, 0, 0)
