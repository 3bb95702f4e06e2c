"""LUSPO and VESPO, the sequence-level losses of TRL's newest loss types, against hand values
and autograd through the papers' objectives."""

import math

import torch

from rlvr.algorithms import (
    gspo_loss,
    luspo_loss,
    reinforce_loss,
    seq_mean_token_mean,
    token_mean,
    vespo_loss,
    vespo_weights,
)

F64 = torch.float64
OLD = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]], dtype=F64)
LOG_RATIO = torch.tensor([[0.1, 0.3, 7.0], [-0.3, -0.6, -0.3]], dtype=F64)  # 7.0 is padding
ADV = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
S0, S1 = math.exp(0.2), math.exp(-0.4)  # GSPO's ratios: exp of the mean log-ratio


def _inputs():
    return (OLD + LOG_RATIO).clone().requires_grad_(True), OLD.clone()


def _close(actual, expected, atol=1e-9):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def test_luspo_is_gspo_times_the_length_and_its_gradient_is_the_papers():
    """Ranges [0.8, 1.28]: sequence 0 (2 tokens, A = +1, s = e^0.2) unclipped, sequence 1
    (3 tokens, A = -2, s = e^-0.4 below 0.8) clipped at 1.6. LUSPO lays |o_i| ℓ_i on each
    token; after seq_mean_token_mean the loss is (2·(-S0) + 3·1.6)/2 and the gradient that of
    mean_i |o_i| ℓ_i written with s_i differentiable: -A s_i / G on every unclipped token."""
    logprobs, old = _inputs()
    out = luspo_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    _close(out.token_loss, [[-2 * S0, -2 * S0, 0.0], [4.8, 4.8, 4.8]])
    gspo = gspo_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    assert torch.equal(out.clipped, gspo.clipped) and torch.equal(out.ratio, gspo.ratio)
    loss = seq_mean_token_mean(out.token_loss, MASK, num_tokens=5, num_seqs=2, max_len=3)
    _close(loss, (-2 * S0 + 4.8) / 2)
    loss.backward()
    lp = logprobs.detach().clone().requires_grad_(True)
    m = MASK.bool()
    s = torch.exp(torch.where(m, lp - old, torch.zeros((), dtype=F64)).sum(-1) / m.sum(-1))
    a = ADV[:, 0]
    paper = (m.sum(-1) * -torch.minimum(s * a, s.clamp(0.8, 1.28) * a)).mean()
    paper.backward()
    torch.testing.assert_close(logprobs.grad, lp.grad, atol=1e-12, rtol=0)
    _close(logprobs.grad, [[-S0 / 2, -S0 / 2, 0.0], [0.0, 0.0, 0.0]])


def test_vespo_weights_by_hand():
    """log w is the sum of the token log-ratios (not their mean): 0.4 and -1.2.
    Sequence 0, A ≥ 0: k, λ = 2, 3 -> φ = exp(3 + 2·0.4 - 3e^0.4); sequence 1, A < 0:
    k, λ = 3, 2 -> φ = exp(2 + 3·(-1.2) - 2e^-1.2). φ(1) = 1 for any shape."""
    phi = vespo_weights(LOG_RATIO, ADV, MASK)
    p0 = math.exp(3 + 2 * 0.4 - 3 * math.exp(0.4))
    p1 = math.exp(2 + 3 * -1.2 - 2 * math.exp(-1.2))
    _close(phi, [[p0, p0, 0.0], [p1, p1, p1]], atol=1e-6)
    on_policy = vespo_weights(torch.zeros(2, 3), ADV, MASK, k_pos=5.0, lambda_pos=0.5)
    _close(on_policy, MASK.float(), atol=1e-6)
    # far off-policy: log w clamped to [log 1e-8, 20], φ finite and about 0
    far = vespo_weights(torch.tensor([[30.0, 0.0, 0.0], [-40.0, 0.0, 0.0]]), ADV, MASK)
    assert torch.isfinite(far).all() and far.max() < 1e-12
    # the floor is log 1e-8 exactly: log w = −40 (two tokens at the ±20 token clamp) becomes
    # log 1e-8, so φ = e^λ · (1e-8)^k · e^(−λ·1e-8): e^3·1e-16 (A ≥ 0), e^2·1e-24 (A < 0)
    floor = vespo_weights(torch.tensor([[-25.0, -25.0, 0.0], [-20.0, -20.0, 0.0]]), ADV, MASK)
    torch.testing.assert_close(
        floor[:, 0], torch.tensor([math.exp(3) * 1e-16, math.exp(2) * 1e-24]), rtol=1e-4, atol=0
    )


def test_vespo_loss_is_reinforce_times_a_detached_weight():
    """ℓ_t = -sg[φ] A log π_t: hand values, gradient -φ A per token (none through φ), 0 on
    padding even where its log-prob is -inf; on-policy (φ = 1) it is REINFORCE."""
    logprobs, old = _inputs()
    out = vespo_loss(logprobs, old, ADV, MASK)
    phi = vespo_weights(LOG_RATIO, ADV, MASK).to(F64)
    lp = (OLD + LOG_RATIO) * MASK
    _close(out.token_loss, -phi * ADV * lp, atol=1e-12)
    assert not out.clipped.any()
    out.token_loss.sum().backward()
    _close(logprobs.grad, -phi * ADV, atol=1e-12)
    garbage = logprobs.detach().clone()
    garbage[0, 2] = -math.inf
    garbage.requires_grad_(True)
    vespo_loss(garbage, old, ADV, MASK).token_loss.sum().backward()
    assert torch.isfinite(garbage.grad).all() and garbage.grad[0, 2] == 0
    current = logprobs.detach().clone().requires_grad_(True)
    plain = current.detach().clone().requires_grad_(True)
    on = vespo_loss(current, current.detach(), ADV, MASK).token_loss
    ref = reinforce_loss(plain, plain.detach(), ADV, MASK).token_loss
    _close(on, ref.detach(), atol=1e-12)
    token_mean(on, MASK, num_tokens=5, num_seqs=2, max_len=3).backward()
    token_mean(ref, MASK, num_tokens=5, num_seqs=2, max_len=3).backward()
    torch.testing.assert_close(current.grad, plain.grad, atol=1e-12, rtol=0)


def test_vespo_zero_advantage_takes_the_positive_shape():
    # A = 0 counts as A ≥ 0, (k, λ) = (2, 3): φ = exp(3 + 2·0.5 − 3e^0.5) = 0.3055;
    # the negative shape (3, 2) would give exp(2 + 1.5 − 2e^0.5) = 1.2331
    phi = vespo_weights(
        torch.tensor([[0.5]], dtype=F64), torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    )
    _close(phi, [[math.exp(3 + 2 * 0.5 - 3 * math.exp(0.5))]], atol=1e-6)  # fp32 weights
