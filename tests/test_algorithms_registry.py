"""Registries: duplicate names refused, unknown names explained."""

import functools

import pytest

from rlvr.algorithms import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, Registry


def test_register_get_and_names():
    reg = Registry("widget")

    @reg.register("beta")
    def beta():
        return "b"

    @reg.register("alpha")
    def alpha():
        return "a"

    assert reg.get("alpha") is alpha  # the decorator returns the function unchanged
    assert reg.get("beta")() == "b"
    assert reg.names() == ["alpha", "beta"]
    assert "alpha" in reg and "gamma" not in reg
    assert len(reg) == 2


def test_duplicate_name_is_refused():
    reg = Registry("widget")
    reg.register("same")(lambda: 1)
    with pytest.raises(ValueError, match="widget 'same' is already registered"):
        reg.register("same")(lambda: 2)
    assert reg.get("same")() == 1  # the first registration survives


def test_a_definition_run_again_replaces_itself_and_no_other():
    reg = Registry("tool")

    def lookup():
        return 1

    reg.register("lookup")(lookup)
    first = lookup

    def lookup():  # the same cell run again, edited
        return 2

    reg.register("lookup")(lookup)
    assert reg.get("lookup")() == 2
    with pytest.raises(ValueError, match="tool 'lookup' is already registered"):
        reg.register("lookup")(functools.partial(first))  # a callable with no name
    assert reg.get("lookup")() == 2


def test_unknown_name_lists_choices_and_closest():
    reg = Registry("advantage estimator")
    for name in ("grpo", "rloo", "gae"):
        reg.register(name)(lambda: None)
    with pytest.raises(KeyError) as info:
        reg.get("grpoo")
    message = str(info.value)
    assert "unknown advantage estimator 'grpoo'" in message
    assert "did you mean 'grpo'?" in message
    assert "gae, grpo, rloo" in message


def test_unknown_name_without_a_close_match():
    reg = Registry("widget")
    reg.register("alpha")(lambda: None)
    with pytest.raises(KeyError) as info:
        reg.get("zzzzzz")
    assert "did you mean" not in str(info.value)
    assert "alpha" in str(info.value)


def test_builtin_registries_hold_the_documented_names():
    assert {"grpo", "rloo"} <= set(ADVANTAGES.names())
    assert {"ppo_clip", "reinforce"} <= set(POLICY_LOSSES.names())
    assert set(AGGREGATIONS.names()) >= {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum"}
    assert set(KL_ESTIMATORS.names()) >= {"k1", "k2", "k3"}
    with pytest.raises(KeyError, match="did you mean 'token_mean'"):
        AGGREGATIONS.get("token-mean")
