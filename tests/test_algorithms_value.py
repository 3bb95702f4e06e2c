"""Critic-side estimators and the Kimi / VAPO losses against numbers worked out by hand."""

import pytest
import torch

from rlvr.algorithms import POLICY_LOSSES
from rlvr.algorithms.value import (
    clipped_value_loss,
    gae_advantages,
    length_adaptive_lambda,
    outcome_token_rewards,
    positive_example_nll,
    whiten,
)

# two sequences: lengths 3 and 2 in a width of 3; outcome rewards 1 and -1
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.8], [0.2, -0.4, 99.0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


def test_outcome_token_rewards_put_the_reward_on_the_last_token_minus_penalty():
    got = outcome_token_rewards(torch.tensor([1.0, -1.0]), MASK)
    assert torch.equal(got, TOKEN_REWARDS)
    penalty = torch.full((2, 3), 0.1)
    got = outcome_token_rewards(torch.tensor([1.0, -1.0]), MASK, penalty)
    expected = torch.tensor([[-0.1, -0.1, 0.9], [-0.1, -1.1, 0.0]])
    assert torch.allclose(got, expected)


def test_outcome_token_rewards_skip_empty_responses_and_check_shapes():
    got = outcome_token_rewards(torch.tensor([1.0, 2.0]), torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert torch.equal(got, torch.tensor([[0.0, 0.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="rewards must be"):
        outcome_token_rewards(torch.ones(3), MASK)


def test_gae_by_hand():
    # seq 0, gamma 1, lambda 0.5: deltas 0.1, 0.2, 0.2 -> A2 = 0.2, A1 = 0.2 + 0.5*0.2 = 0.3,
    # A0 = 0.1 + 0.5*0.3 = 0.25; returns = A + V = 0.75, 0.9, 1.0
    # seq 1: V after the last token is 0 (the 99 is padding): delta1 = -1 + 0.4 = -0.6,
    # delta0 = -0.4 - 0.2 = -0.6, A0 = -0.6 + 0.5 * -0.6 = -0.9; returns -0.7, -1.0
    adv, ret = gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.3, 0.2], [-0.9, -0.6, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.75, 0.9, 1.0], [-0.7, -1.0, 0.0]]))


def test_a_tools_result_inside_a_completion_is_skipped():
    """Sequence 0 of test_gae_by_hand with two tool tokens (mask 0) after its first token: the
    reward sits on the last kept token, and GAE's advantages and returns on the kept tokens
    are those of the sequence without the hole (0 on the hole, whatever its values)."""
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, -9.0, 0.6, 0.8]])
    rewards = outcome_token_rewards(torch.tensor([1.0]), torch.tensor([[1.0, 0, 0, 1, 1, 0]]))
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]]
    adv, ret = gae_advantages(rewards[:, :5], values, mask, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.0, 0.0, 0.3, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.75, 0.0, 0.0, 0.9, 1.0]]))


def test_gae_lambda_one_is_the_monte_carlo_return_minus_the_value():
    # gamma 0.5: G0 = 0.25 * 1, so A0 = 0.25 - 0.5 = -0.25; A1 = 0.5 - 0.6; A2 = 1 - 0.8
    adv, ret = gae_advantages(TOKEN_REWARDS[:1], VALUES[:1], MASK[:1], gamma=0.5, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[-0.25, -0.1, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.25, 0.5, 1.0]]))


def test_gae_takes_one_lambda_per_sequence():
    # lambda 1 for seq 0: A0 = R - V0 = 0.5, A1 = 0.4; lambda 0 for seq 1: A = deltas
    adv, _ = gae_advantages(TOKEN_REWARDS, VALUES, MASK, lam=torch.tensor([1.0, 0.0]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.2], [-0.6, -0.6, 0.0]]))


@pytest.mark.parametrize(
    "kwargs",
    [{"gamma": 1.5}, {"gamma": -0.1}, {"lam": -0.1}, {"lam": torch.tensor([0.5, 2.0])}],
)
def test_gae_rejects_out_of_range_parameters(kwargs):
    with pytest.raises(ValueError, match="must be in"):
        gae_advantages(TOKEN_REWARDS, VALUES, MASK, **kwargs)


def test_gae_with_gamma_0_is_the_one_step_error():
    """γ = 0 is allowed: δ_t = r_t − V_t and nothing flows back, A_t = δ_t whatever λ; the
    returns are the token rewards."""
    adv, ret = gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=0.0, lam=0.9)
    assert torch.allclose(adv, torch.tensor([[-0.5, -0.6, 0.2], [-0.2, -0.6, 0.0]]))
    assert torch.allclose(ret, TOKEN_REWARDS)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one 2-D"):
        gae_advantages(TOKEN_REWARDS, VALUES[:, :2], MASK)


def test_length_adaptive_lambda():
    # 1 - 1/(0.05 l): l=100 -> 0.8, l=1000 -> 0.98, l=10 -> -1 clamped to 0
    got = length_adaptive_lambda(torch.tensor([100, 1000, 10]), alpha=0.05)
    assert torch.allclose(got, torch.tensor([0.8, 0.98, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(torch.tensor([10]), alpha=0.0)


def test_whiten_uses_the_masked_entries_only():
    values = torch.tensor([[1.0, 2.0, 3.0], [50.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = whiten(values, mask, epsilon=0.0)  # mean 2, unbiased std 1
    assert torch.allclose(got, torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # two entries, 1 and 3: mean 2, unbiased std √2
    pair = whiten(values, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), epsilon=0.0)
    half = 2**-0.5
    assert torch.allclose(pair, torch.tensor([[-half, 0.0, half], [0.0, 0.0, 0.0]]))
    # one entry has no spread to divide by: it is returned as it is, the rest 0
    one = whiten(values, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(one, torch.tensor([[0.0, 0.0, 0.0], [50.0, 0.0, 0.0]]))


def test_clipped_value_loss_by_hand_and_its_gradient():
    values = torch.tensor([[1.0, 1.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[0.0, 2.0]])
    # token 0: unclipped 0.5*1 = 0.5 > clipped 0.5*0.7^2 = 0.245 -> 0.5, not clipped
    # token 1: unclipped 0.5*1 = 0.5 < clipped 0.5*(0.7-2)^2 = 0.845 -> 0.845, clipped
    loss, clipped = clipped_value_loss(values, old, returns, torch.ones(1, 2), clip=0.2)
    assert torch.allclose(loss, torch.tensor([[0.5, 0.845]]))
    assert clipped.tolist() == [[False, True]]
    loss.sum().backward()
    # d/dV of 0.5 (V - R)^2 = V - R = 1 on token 0; the clipped branch is flat in V
    assert torch.allclose(values.grad, torch.tensor([[1.0, 0.0]]))
    plain, _ = clipped_value_loss(values, old, returns, torch.ones(1, 2), clip=None)
    assert torch.allclose(plain, torch.tensor([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="value clip must be > 0, got 0"):
        clipped_value_loss(values, old, returns, torch.ones(1, 2), clip=0.0)


def test_positive_example_nll_keeps_correct_samples_only():
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    got = positive_example_nll(logprobs, mask, torch.tensor([True, False]))
    assert torch.equal(got, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))


def test_kimi_omd_loss_value_and_gradient_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, -1.9]], dtype=torch.float64)
    adv = torch.full((1, 2), 0.5, dtype=torch.float64)
    out = POLICY_LOSSES.get("kimi_omd")(logprobs, old, adv, torch.ones(1, 2), tau=0.2)
    # S = 0.2 - 0.1 = 0.1; penalty per token = 0.5 * 0.2 * 0.01 / 2 = 0.0005
    assert torch.allclose(out.token_loss, torch.tensor([[0.5005, 1.0005]], dtype=torch.float64))
    out.token_loss.sum().backward()
    # d/dlp_t [-A sum(lp) + tau/2 S^2] = -A + tau S = -0.5 + 0.02
    assert torch.allclose(logprobs.grad, torch.full((1, 2), -0.48, dtype=torch.float64))
    assert not out.clipped.any()
    # the logged ratio is π_θ/π_θi per token: e^0.2 and e^−0.1
    assert torch.allclose(out.ratio, torch.tensor([[0.2, -0.1]], dtype=torch.float64).exp())


def test_kimi_omd_loss_ignores_padding_and_rejects_negative_tau():
    logprobs = torch.tensor([[-1.0, 5.0]], requires_grad=True)
    out = POLICY_LOSSES.get("kimi_omd")(
        logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), tau=1.0
    )
    # S = -1 on the one real token: 1 + 0.5 * 1 * 1 / 1
    assert torch.allclose(out.token_loss, torch.tensor([[1.5, 0.0]]))
    with pytest.raises(ValueError, match="tau"):
        POLICY_LOSSES.get("kimi_omd")(logprobs, logprobs, logprobs, torch.ones(1, 2), tau=-1.0)
    # τ = 0 is allowed: the plain policy gradient, −A·log π on the real token
    plain = POLICY_LOSSES.get("kimi_omd")(
        logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), tau=0.0
    )
    assert torch.allclose(plain.token_loss, torch.tensor([[1.0, 0.0]]))


def test_clipped_value_loss_does_not_flag_tokens_inside_the_clip_range():
    # token 0: V = V_old = 1 (a critic's first step): clipped V = V, both losses 0.5·1² = 0.5
    # token 1: V − V_old = 0.125 < c = 0.25: clipped V = V, both losses 0.5·0.625² = 0.1953125:
    # a tie, not a clip
    values = torch.tensor([[1.0, 0.625]])
    old = torch.tensor([[1.0, 0.5]])
    loss, clipped = clipped_value_loss(values, old, torch.zeros(1, 2), torch.ones(1, 2), clip=0.25)
    assert torch.equal(loss, torch.tensor([[0.5, 0.1953125]]))
    assert clipped.tolist() == [[False, False]]
