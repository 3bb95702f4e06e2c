"""Policy losses against hand-computed values; clipped tokens must get zero gradient."""

import math

import pytest
import torch

from rlvr.algorithms import POLICY_LOSSES, PolicyLossOutput, ppo_clip_loss, reinforce_loss

# old log-probs are 0, so ratio = exp(logprobs) = the numbers below.
RATIOS = torch.tensor([[1.1, 1.5, 0.5, 1.25], [1.5, 0.5, 0.9, 0.75]], dtype=torch.float64)
ADV = torch.tensor([[2.0] * 4, [-1.0] * 4], dtype=torch.float64)
MASK = torch.ones(2, 4)


def _inputs(ratios=RATIOS):
    logprobs = ratios.log().clone().requires_grad_(True)
    return logprobs, torch.zeros_like(logprobs)


def _close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_ppo_clip_asymmetric_hand_values():
    logprobs, old = _inputs()
    out = ppo_clip_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    assert isinstance(out, PolicyLossOutput)
    # ratio range [0.8, 1.28]; loss = max(-A·ρ, -A·clip(ρ))
    # A=+2: ρ=1.1  inside          → max(-2.2, -2.2)  = -2.2
    #       ρ=1.5  above 1.28      → max(-3.0, -2.56) = -2.56  clipped
    #       ρ=0.5  below 0.8       → max(-1.0, -1.6)  = -1.0   (pessimistic: not clipped)
    #       ρ=1.25 inside (≤ 1.28) → -2.5
    # A=-1: ρ=1.5  above 1.28      → max(1.5, 1.28)   = 1.5    (not clipped)
    #       ρ=0.5  below 0.8       → max(0.5, 0.8)    = 0.8    clipped
    #       ρ=0.9  inside          → 0.9
    #       ρ=0.75 below 0.8       → max(0.75, 0.8)   = 0.8    clipped
    _close(out.token_loss, [[-2.2, -2.56, -1.0, -2.5], [1.5, 0.8, 0.9, 0.8]])
    assert out.clipped.tolist() == [[False, True, False, False], [False, True, False, True]]
    _close(out.ratio, RATIOS)


def test_ppo_clip_symmetric_clips_what_clip_higher_lets_through():
    logprobs, old = _inputs()
    out = ppo_clip_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.2)
    # ρ=1.25 with A=+2 is now above 1.2 → max(-2.5, -2.4) = -2.4, clipped
    _close(out.token_loss, [[-2.2, -2.4, -1.0, -2.4], [1.5, 0.8, 0.9, 0.8]])
    assert out.clipped.tolist() == [[False, True, False, True], [False, True, False, True]]


def test_ppo_clip_gradient_is_zero_exactly_on_clipped_tokens():
    logprobs, old = _inputs()
    out = ppo_clip_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    out.token_loss.sum().backward()
    # unclipped: d(-A·ρ)/d logπ = -A·ρ; clipped: 0
    # row 0: [-2·1.1, 0, -2·0.5, -2·1.25]; row 1: [1.5, 0, 0.9, 0]
    _close(logprobs.grad, [[-2.2, 0.0, -1.0, -2.5], [1.5, 0.0, 0.9, 0.0]])
    assert torch.all((logprobs.grad == 0) == out.clipped)


def test_dual_clip_caps_negative_advantage_losses():
    ratios = torch.tensor([[5.0, 2.0, 5.0, 0.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    logprobs, old = _inputs(ratios)
    out = ppo_clip_loss(
        logprobs, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, dual_clip=3.0
    )
    # A=-1, ρ=5: max(5, 1.2) = 5 > cap 3·1 → 3, clipped
    # A=-1, ρ=2: max(2, 1.2) = 2 ≤ 3 → 2
    # A=+1, ρ=5: max(-5, -1.2) = -1.2 (ordinary clip; dual clip only acts on A<0)
    # A=-1, ρ=0.5: max(0.5, 0.8) = 0.8, clipped by the ordinary clip
    _close(out.token_loss, [[3.0, 2.0, -1.2, 0.8]])
    assert out.clipped.tolist() == [[True, False, True, True]]
    out.token_loss.sum().backward()
    _close(logprobs.grad, [[0.0, 2.0, 0.0, 0.0]])
    # without dual clip the first token would have loss 5 and gradient 5
    plain = ppo_clip_loss(
        logprobs.detach(), old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2
    )
    _close(plain.token_loss[0, 0], 5.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_clip_loss(
            logprobs, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, dual_clip=0.9
        )


def test_masked_tokens_are_zero_even_with_garbage_inputs():
    logprobs, old = _inputs()
    old = old.clone()
    old[1, 3] = -math.inf  # a padded position whose old log-prob is garbage
    adv = ADV.clone()
    adv[1, 3] = math.nan
    mask = MASK.clone()
    mask[1, 3] = 0
    for name in POLICY_LOSSES.names():
        logprobs.grad = None
        out = POLICY_LOSSES.get(name)(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28)
        assert out.token_loss[1, 3] == 0 and not out.clipped[1, 3]
        out.token_loss.sum().backward()
        assert torch.isfinite(logprobs.grad).all() and logprobs.grad[1, 3] == 0, name


def test_extreme_log_ratio_is_clamped_not_overflowed():
    logprobs = torch.zeros(1, 2, requires_grad=True)  # float32
    old = torch.tensor([[-100.0, 100.0]])  # ρ = e^100 and e^-100, clamped to e^±20
    out = ppo_clip_loss(
        logprobs, old, -torch.ones(1, 2), torch.ones(1, 2), clip_low=0.2, clip_high=0.2
    )
    assert torch.isfinite(out.token_loss).all()
    _close(out.token_loss.double(), [[math.exp(20.0), 0.8]], atol=1e3)


def test_on_policy_ppo_gradient_equals_reinforce_gradient():
    # At ρ = 1 (old = current, detached), ∇(-A·ρ) = -A·∇logπ = ∇(-A·logπ).
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).double()
    grads = []
    for loss in (ppo_clip_loss, reinforce_loss):
        lp = logprobs.clone().requires_grad_(True)
        out = loss(lp, lp.detach(), adv, mask, clip_low=0.2, clip_high=0.28)
        out.token_loss.sum().backward()
        grads.append(lp.grad)
        assert not out.clipped.any()
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)
    _close(grads[1], -adv * mask)


def test_reinforce_hand_values():
    logprobs = torch.tensor([[-0.5, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    out = reinforce_loss(logprobs, torch.zeros_like(logprobs), adv, mask)
    # -A·logπ = [-2·-0.5, -2·-1.0, masked] = [1, 2, 0]; gradient -A = -2 where unmasked
    _close(out.token_loss, [[1.0, 2.0, 0.0]])
    out.token_loss.sum().backward()
    _close(logprobs.grad, [[-2.0, -2.0, 0.0]])
    assert out.ratio is None and not out.clipped.any()


def test_shape_mismatch_is_refused():
    logprobs, old = _inputs()
    with pytest.raises(ValueError, match="share one shape"):
        ppo_clip_loss(logprobs, old[:, :2], ADV, MASK, clip_low=0.2, clip_high=0.2)
