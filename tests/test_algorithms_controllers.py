"""Entropy / KL controllers, EMA reference, high-entropy mask and entropy-based advantage
against hand-worked values."""

import json
import math

import pytest
import torch
from torch import nn

from rlvr.algorithms.controllers import (
    AdaptiveEntropyCoef,
    AdaptiveKLCoef,
    StallWatch,
    ema_update_,
    entropy_advantage_bonus,
    high_entropy_mask,
)


def test_entropy_coef_crosses_target_both_ways_with_cap_and_floor():
    # binary-exact numbers: target 0.5, Δ = 0.25, c_max = 0.5, c_0 = 0
    ctl = AdaptiveEntropyCoef(init_coef=0.0, target=0.5, delta=0.25, max_coef=0.5)
    assert ctl.coef == 0.0
    steps = [
        # entropy, returned α, state c
        (0.3, 0.25, 0.25),  # below: c = 0 + .25, bonus on
        (0.2, 0.5, 0.5),  # below: c = .5
        (0.1, 0.5, 0.5),  # below: .75 capped at c_max = .5
        (0.7, 0.0, 0.25),  # above: c = .25, bonus off
        (0.5, 0.0, 0.0),  # equal to target counts as above: c = 0, off
        (0.9, 0.0, 0.0),  # above: −.25 floored at 0
        (0.4, 0.25, 0.25),  # below again: back on
    ]
    for entropy, alpha, c in steps:
        assert ctl.update(entropy) == alpha
        assert ctl.coef == c


def test_entropy_coef_bad_values():
    with pytest.raises(ValueError, match="init_coef"):
        AdaptiveEntropyCoef(init_coef=0.6, target=0.5, delta=0.1, max_coef=0.5)
    with pytest.raises(ValueError, match="delta"):
        AdaptiveEntropyCoef(init_coef=0.0, target=0.5, delta=-0.1, max_coef=0.5)
    ctl = AdaptiveEntropyCoef(init_coef=0.0, target=0.5, delta=0.1, max_coef=0.5)
    with pytest.raises(ValueError, match="entropy"):
        ctl.update(float("nan"))
    # Δ = 0 is allowed: the coefficient then never moves
    still = AdaptiveEntropyCoef(init_coef=0.25, target=0.5, delta=0.0, max_coef=0.5)
    assert [still.update(0.1), still.update(0.9)] == [0.25, 0.0] and still.coef == 0.25


def test_kl_coef_by_hand_above_below_and_clipped():
    ctl = AdaptiveKLCoef(init_coef=0.2, target=6.0, horizon=10000)
    # 6.6/6 − 1 = 0.1 (inside the clip): 0.2 · (1 + 0.1 · 256/10000) = 0.2 · 1.00256
    assert ctl.update(6.6, n_steps=256) == pytest.approx(0.200512, rel=1e-12)
    # 3/6 − 1 = −0.5 → clipped to −0.2: · (1 − 0.2 · 0.0256) = · 0.99488
    assert ctl.update(3.0, n_steps=256) == pytest.approx(0.19948537856, rel=1e-12)
    # 60/6 − 1 = 9 → clipped to +0.2: · (1 + 0.2 · 500/10000) = · 1.01
    assert ctl.update(60.0, n_steps=500) == pytest.approx(0.2014802323456, rel=1e-12)
    # 5.4/6 − 1 = −0.1: · (1 − 0.1 · 10000/10000) = · 0.9
    assert ctl.update(5.4, n_steps=10000) == pytest.approx(0.18133220911104, rel=1e-12)
    # on target: unchanged
    assert ctl.update(6.0, n_steps=256) == pytest.approx(0.18133220911104, rel=1e-12)
    assert ctl.coef == pytest.approx(0.18133220911104, rel=1e-12)


def test_kl_coef_floor_and_bad_values():
    ctl = AdaptiveKLCoef(init_coef=1.0, target=1.0, horizon=1)
    # error −0.2, n_steps/horizon = 10: 1 − 2 = −1 → floored at 0
    assert ctl.update(0.0, n_steps=10) == 0.0
    with pytest.raises(ValueError, match=r"target and horizon must be > 0, got 0\.0 and 10"):
        AdaptiveKLCoef(init_coef=0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match=r"target and horizon must be > 0, got 1\.0 and 0"):
        AdaptiveKLCoef(init_coef=0.1, target=1.0, horizon=0)
    with pytest.raises(ValueError, match="init_coef must be >= 0"):
        AdaptiveKLCoef(init_coef=-0.1, target=1.0, horizon=10)
    # β = 0 is a valid start (it stays 0: the update is multiplicative), n_steps = 0 no move
    assert AdaptiveKLCoef(init_coef=0.0, target=1.0, horizon=10).update(5.0, n_steps=3) == 0.0
    assert AdaptiveKLCoef(init_coef=0.5, target=1.0, horizon=10).update(5.0, n_steps=0) == 0.5
    with pytest.raises(ValueError, match="n_steps"):
        ctl.update(1.0, n_steps=-1)
    with pytest.raises(ValueError, match="kl"):
        ctl.update(float("inf"), n_steps=1)


@pytest.mark.parametrize(
    ("make", "feed"),
    [
        (
            lambda: AdaptiveEntropyCoef(init_coef=0.001, target=0.4, delta=0.003, max_coef=0.01),
            lambda ctl, x: ctl.update(x),
        ),
        (
            lambda: AdaptiveKLCoef(init_coef=0.05, target=0.45, horizon=1000),
            lambda ctl, x: ctl.update(x, n_steps=64),
        ),
    ],
)
def test_state_dict_round_trip_continues_identically(make, feed):
    inputs = [0.3, 0.35, 0.5, 0.2, 0.9, 0.1, 0.45, 0.6]
    original = make()
    for x in inputs[:4]:
        feed(original, x)
    state = json.loads(json.dumps(original.state_dict()))  # plain, serialisable
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.coef == original.coef
    for x in inputs[4:]:
        assert feed(resumed, x) == feed(original, x)
        assert resumed.coef == original.coef


def _linear(w, b):
    layer = nn.Linear(2, 1).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([w], dtype=torch.float64))
        layer.bias.copy_(torch.tensor([b], dtype=torch.float64))
    return layer


def test_ema_update_by_hand():
    ref, pol = _linear([1.0, 2.0], 0.0), _linear([3.0, -2.0], 1.0)
    ema_update_(ref, pol, decay=0.9)
    # 0.9·1 + 0.1·3 = 1.2; 0.9·2 + 0.1·(−2) = 1.6; 0.9·0 + 0.1·1 = 0.1
    torch.testing.assert_close(ref.weight, torch.tensor([[1.2, 1.6]], dtype=torch.float64))
    torch.testing.assert_close(ref.bias, torch.tensor([0.1], dtype=torch.float64))
    # the policy is untouched and no graph is recorded
    assert pol.weight.tolist() == [[3.0, -2.0]] and pol.bias.tolist() == [1.0]
    assert ref.weight.grad_fn is None and ref.weight.is_leaf


def test_ema_update_decay_one_and_zero_are_exact():
    ref, pol = _linear([0.1, 0.7], 0.3), _linear([-0.9, 0.2], 0.6)
    ema_update_(ref, pol, decay=1.0)
    assert ref.weight.tolist() == [[0.1, 0.7]] and ref.bias.tolist() == [0.3]
    ema_update_(ref, pol, decay=0.0)
    assert ref.weight.tolist() == [[-0.9, 0.2]] and ref.bias.tolist() == [0.6]


def test_ema_update_bad_inputs():
    ref = _linear([1.0, 2.0], 0.0)
    with pytest.raises(ValueError, match="names differ"):
        ema_update_(ref, nn.Sequential(_linear([1.0, 2.0], 0.0)), decay=0.5)
    with pytest.raises(ValueError, match="shape"):
        ema_update_(ref, nn.Linear(3, 1).double(), decay=0.5)
    for decay in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="decay"):
            ema_update_(ref, _linear([0.0, 0.0], 0.0), decay=decay)
    assert ref.weight.tolist() == [[1.0, 2.0]]  # nothing changed on error


def test_high_entropy_mask_hand_example():
    # position (0, 2) is padding: its huge entropy must be ignored
    entropy = torch.tensor([[0.9, 0.1, 5.0], [0.4, 0.7, 0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # n = 5 response tokens, k = ceil(0.5 · 5) = 3: entropies .9 > .7 > .4 kept, .2 and .1 not
    out = high_entropy_mask(entropy, mask, top_frac=0.5)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    # top_frac = 1 returns the response mask, in its own dtype
    assert high_entropy_mask(entropy, mask, top_frac=1.0).tolist() == mask.tolist()
    bool_mask = mask.bool()
    assert torch.equal(high_entropy_mask(entropy, bool_mask, top_frac=1.0), bool_mask)
    # a tiny fraction still keeps one token (the max, 0.9)
    assert high_entropy_mask(entropy, mask, 0.01).tolist() == [[1.0, 0, 0], [0, 0, 0]]


def test_high_entropy_mask_ties_rounding_and_empty():
    # k = ceil(0.25 · 4) = 1, but three tokens are tied at the threshold 1.0: all kept
    entropy = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    out = high_entropy_mask(entropy, torch.ones(1, 4), top_frac=0.25)
    assert out.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    # 0.28 · 25 is 7.000000000000001 in floats: exactly 7 tokens kept, the 7 largest, not 8
    # (0.2 · 10 is exactly 2.0, which would not test the rounding)
    assert 0.28 * 25 > 7
    entropy = torch.arange(25.0).reshape(5, 5)
    out = high_entropy_mask(entropy, torch.ones(5, 5), 0.28)
    assert out.flatten().tolist() == [0.0] * 18 + [1.0] * 7
    # no response tokens at all
    assert high_entropy_mask(entropy, torch.zeros(5, 5), 0.5).sum().item() == 0


def test_high_entropy_mask_bad_values():
    entropy, mask = torch.zeros(2, 3), torch.ones(2, 3)
    for top_frac in (0.0, -0.1, 1.5, math.nan, True):
        with pytest.raises(ValueError, match="top_frac"):
            high_entropy_mask(entropy, mask, top_frac)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        high_entropy_mask(torch.zeros(2, 4), mask, 0.5)


def test_a_step_that_trained_no_token_leaves_the_entropy_coefficient_alone():
    """The entropy metric is NaN when the filters left nothing to train: no measurement."""
    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    algo = AlgorithmConfig.model_validate(
        {"entropy": {"target": 0.5, "delta": 0.25, "max_coef": 0.5}}
    )
    reg = Regularization(algo, nn.Linear(2, 2))
    reg.after_step(1, nn.Linear(2, 2), kl=0.0, entropy=0.2)
    assert reg.entropy_coef == 0.25
    reg.after_step(2, nn.Linear(2, 2), kl=0.0, entropy=float("nan"))
    assert reg.entropy_coef == 0.25
    reg.after_step(3, nn.Linear(2, 2), kl=0.0, entropy=0.1)
    assert reg.entropy_coef == 0.5


def test_reference_resets_mix_the_policy_in_every_n_steps():
    """TR-DPO's soft update (TRL's sync_ref_model): every 2 steps θ_ref ← 0.75·θ + 0.25·θ_ref;
    between resets the reference stays put. Hand values on a 1×1 linear layer."""
    from pydantic import ValidationError

    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    kl = {"coef": 0.1, "reference_reset_every": 2, "reference_reset_mix": 0.75}
    policy = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(4.0)
    reg = Regularization(AlgorithmConfig.model_validate({"kl": kl}), policy)
    for step, policy_weight, reference_weight in [(1, 8.0, 4.0), (2, 8.0, 7.0), (3, 0.0, 7.0)]:
        with torch.no_grad():
            policy.weight.fill_(policy_weight)
        assert reg.after_step(step, policy, kl=0.0, entropy=0.0) == (step == 2)  # a reset?
        assert reg.reference.weight.item() == reference_weight
    assert reg.after_step(4, policy, kl=0.0, entropy=0.0)
    assert reg.reference.weight.item() == 1.75  # 0.75 · 0 + 0.25 · 7
    for alone in ({"reference_reset_mix": 0.5}, {"reset_optimizer": True}):
        with pytest.raises(ValidationError, match=r"reference_reset_every or .*_patience too"):
            AlgorithmConfig.model_validate({"kl": {"coef": 0.1, **alone}})


def test_the_stall_watch_counts_evaluations_without_a_better_score():
    """Patience 2, by hand: 0.3 sets the best; 0.2 stalls (1); 0.3 ties, which is no better
    (2: a reset, the count back to 0); 0.5 is the new best; 0.5 (1); 0.4 (2: a reset); 0.1
    (1); 0.6 the new best, the count back to 0; 0.55 (1). A watch loaded from the state after
    the fifth score answers the last four as the first does."""
    scores = [0.3, 0.2, 0.3, 0.5, 0.5, 0.4, 0.1, 0.6, 0.55]
    watch = StallWatch(2)
    assert watch.state_dict() == {"best": None, "stalled": 0}
    answers = [watch.update(score) for score in scores[:5]]
    resumed = StallWatch(2)
    resumed.load_state_dict(watch.state_dict())
    assert resumed.state_dict() == {"best": 0.5, "stalled": 1}
    answers += [watch.update(score) for score in scores[5:]]
    assert answers == [False, False, True, False, False, True, False, False, False]
    assert [resumed.update(score) for score in scores[5:]] == answers[5:]
    for patience in (0, 1.5, True):
        with pytest.raises(ValueError, match="patience must be an int >= 1"):
            StallWatch(patience)
    with pytest.raises(ValueError, match="score must be a finite number"):
        StallWatch(1).update(float("nan"))


def test_a_stalled_pass_at_1_resets_the_reference_to_the_policy():
    """`reference_reset_patience=1`: the first evaluation (0.2) sets the best and leaves the
    reference at the policy's starting weight 4; a better one (0.5) leaves it too; an equal
    one (0.5) copies the policy's weight 8 into it. The per-step schedule resets nothing. The
    setting needs a KL term to reset and evaluations to count."""
    from pydantic import ValidationError

    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    policy = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(4.0)
    kl = {"coef": 0.1, "reference_reset_patience": 1}
    reg = Regularization(AlgorithmConfig.model_validate({"kl": kl}), policy)
    assert reg.follows_policy
    with torch.no_grad():
        policy.weight.fill_(8.0)
    assert not reg.after_step(1, policy, kl=0.0, entropy=0.0)
    assert [reg.after_eval(score, policy) for score in (0.2, 0.5)] == [False, False]
    assert reg.reference.weight.item() == 4.0
    assert reg.after_eval(0.5, policy) and reg.reference.weight.item() == 8.0
    assert reg.state_dict()["stalls"] == {"best": 0.5, "stalled": 0}
    with pytest.raises(ValidationError, match=r"set algorithm\.kl\.coef above 0"):
        AlgorithmConfig.model_validate({"kl": {"reference_reset_patience": 2}})


def test_the_reference_exists_only_with_a_kl_term_and_is_saved_only_when_it_moves():
    """kl.coef = 0 keeps no reference, even with `reference_ema` set (nothing to regularise,
    nothing to save); a fixed reference (coef > 0, no EMA or resets) is a copy the run can
    rebuild, so checkpoints leave it out and loading one leaves it as it is."""
    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    policy = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(4.0)
    off = Regularization(AlgorithmConfig.model_validate({"kl": {"reference_ema": 0.5}}), policy)
    assert off.reference is None and not off.follows_policy
    assert off.state_dict()["reference"] is None
    assert not off.after_step(1, policy, kl=0.0, entropy=0.0)
    fixed = Regularization(AlgorithmConfig.model_validate({"kl": {"coef": 0.1}}), policy)
    assert fixed.reference is not policy and not fixed.follows_policy
    state = fixed.state_dict()
    assert state["reference"] is None
    fixed.load_state_dict(state)
    assert fixed.reference.weight.item() == 4.0


def test_the_adaptive_kl_coefficient_takes_one_controller_step_per_rl_step():
    """Ziegler et al.'s controller through `after_step`: target 0.1, horizon 10, β₀ = 0.2.
    KL 0.3 clips the error 2 to +0.2: β = 0.2 · (1 + 0.2/10) = 0.204; KL 0.05 clips −0.5 to
    −0.2: β = 0.204 · 0.98 = 0.19992."""
    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    kl = {"coef": 0.2, "adaptive_target": 0.1, "horizon": 10}
    reg = Regularization(AlgorithmConfig.model_validate({"kl": kl}), nn.Linear(1, 1))
    reg.after_step(1, nn.Linear(1, 1), kl=0.3, entropy=0.0)
    assert reg.kl_coef == pytest.approx(0.204, abs=1e-12)
    reg.after_step(2, nn.Linear(1, 1), kl=0.05, entropy=0.0)
    assert reg.kl_coef == pytest.approx(0.19992, abs=1e-12)


def test_a_checkpoint_from_before_the_stall_watch_loads_with_a_fresh_one():
    """States saved before `reference_reset_patience` existed have no "stalls" entry: the
    watch starts afresh. A state with a watch loads into a run without one, which ignores it."""
    from rlvr.config import AlgorithmConfig
    from rlvr.training.regularization import Regularization

    patient = AlgorithmConfig.model_validate({"kl": {"coef": 0.1, "reference_reset_patience": 2}})
    reg = Regularization(patient, nn.Linear(1, 1))
    reg.after_eval(0.5, nn.Linear(1, 1))
    state = reg.state_dict()
    assert state["stalls"] == {"best": 0.5, "stalled": 0}
    old = {k: v for k, v in state.items() if k != "stalls"}
    resumed = Regularization(patient, nn.Linear(1, 1))
    resumed.load_state_dict(old)
    assert resumed.stalls.state_dict() == {"best": None, "stalled": 0}
    plain = Regularization(AlgorithmConfig.model_validate({"kl": {"coef": 0.1}}), nn.Linear(1, 1))
    plain.load_state_dict(state)
    assert plain.stalls is None


def test_entropy_advantage_bonus_hand_example():
    advantages = torch.tensor([[1.0, -0.5, 0.0, 2.0], [0.25, 0.25, -4.0, 0.0]])
    entropy = torch.tensor([[0.5, 3.0, 1.0, 10.0], [0.25, 0.5, 0.0, 7.0]], requires_grad=True)
    # α·H = [0.2, 1.2, 0.4, 4.0], [0.1, 0.2, 0, 2.8]; |A|/κ = [0.5, 0.25, 0, 1], [.125, .125, 2, 0]
    bonus = entropy_advantage_bonus(advantages, entropy, alpha=0.4, kappa=2.0)
    assert bonus.flatten().tolist() == pytest.approx([0.2, 0.25, 0, 1.0, 0.1, 0.125, 0, 0])
    shaped = advantages + bonus
    assert shaped.flatten().tolist() == pytest.approx([1.2, -0.25, 0, 3.0, 0.35, 0.375, -4.0, 0])
    assert not bonus.requires_grad  # detached: the gradient's form stays the policy loss's
    # the sign of every advantage is kept, a zero one stays zero
    assert torch.equal(torch.sign(shaped), torch.sign(advantages))
    assert not entropy_advantage_bonus(advantages, entropy, alpha=0.0).any()
    # κ defaults to the paper's 2
    assert torch.equal(entropy_advantage_bonus(advantages, entropy, alpha=0.4), bonus)
    # a larger κ clips harder: at κ = 4 the 2.0 advantage gets 0.5, not 1.0
    assert float(entropy_advantage_bonus(advantages, entropy, 0.4, 4.0)[0, 3]) == 0.5


def test_entropy_advantage_bonus_bad_values():
    a, h = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="alpha"):
        entropy_advantage_bonus(a, h, alpha=-0.1)
    for kappa in (1.0, 0.5):
        with pytest.raises(ValueError, match="kappa"):
            entropy_advantage_bonus(a, h, alpha=0.4, kappa=kappa)
    with pytest.raises(ValueError, match="one shape"):
        entropy_advantage_bonus(a, torch.ones(2, 4), alpha=0.4)
