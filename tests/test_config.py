"""Config tree: presets, dotted overrides, and errors that name the key."""

import pytest

from rlvr.config import ConfigError, RLConfig, SFTConfig, preset_names, resolve_config


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


def test_dr_grpo_preset_settings():
    cfg = resolve_config(preset="dr_grpo")
    assert cfg.algorithm.std_normalization == "none"
    assert cfg.algorithm.aggregation == "seq_mean_token_sum"
    assert cfg.algorithm.kl.coef == 0.0


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


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'train\.steps'"):
        resolve_config(overrides=["train.steps=many"])


def test_bad_enum_names_the_key():
    with pytest.raises(ConfigError, match=r"'algorithm\.aggregation'"):
        resolve_config(overrides=["algorithm.aggregation=token_sum"])


def test_unknown_preset_suggests_one():
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        resolve_config(preset="grp")


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
