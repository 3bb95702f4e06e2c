"""Policy losses against hand-computed values; clipped tokens must get zero gradient."""

import math

import pytest
import torch

from rlvr.algorithms import (
    POLICY_LOSSES,
    PolicyLossOutput,
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    gspo_loss,
    kl_cov_loss,
    ppo_clip_loss,
    reinforce_loss,
    sapo_loss,
    seq_mean_token_mean,
)

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
    for cap in (0.9, 1.0):  # Ye et al. 2020 require c > 1
        with pytest.raises(ValueError, match="dual_clip must be > 1"):
            ppo_clip_loss(
                logprobs, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, dual_clip=cap
            )


def test_masked_tokens_are_zero_even_with_garbage_inputs():
    ratios = RATIOS.clone()
    ratios[1, 3] = 0.0  # a padded position whose current log-prob is -inf (REINFORCE's -A·logπ
    logprobs, old = _inputs(ratios)  # would be -0·-inf = nan there without its masking)
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


def test_gmpo_asymmetric_clip_uses_low_for_negative_and_high_for_positive():
    """clip_low = 0.2 (floor −0.2 where A < 0), clip_high = 0.5 (cap +0.5 where A > 0).
    Seq 0, A = +1, log-ratios [0.6, 0.2]: 0.6 capped at 0.5 → r_0 = e^((0.5+0.2)/2) = e^0.35.
    Seq 1, A = −1, log-ratios [−0.3, −0.1]: −0.3 floored at −0.2 → r_1 = e^(−0.3/2) = e^−0.15.
    (The bounds swapped give e^0.2 and e^−0.2, or leave −0.3 unclipped.)"""
    log_ratio = torch.tensor([[0.6, 0.2], [-0.3, -0.1]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    out = gmpo_loss(
        log_ratio.clone(), torch.zeros_like(log_ratio), adv, torch.ones(2, 2), clip_low=0.2,
        clip_high=0.5,
    )  # fmt: skip
    assert out.clipped.tolist() == [[True, False], [True, False]]
    r0, r1 = math.exp(0.35), math.exp(-0.15)
    _close(out.ratio, [[r0, r0], [r1, r1]], atol=1e-12)
    _close(out.token_loss, [[-r0, -r0], [r1, r1]], atol=1e-12)  # -A·r_i


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


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "gspo", "gmpo"])
def test_a_negative_clip_range_is_refused_and_a_zero_one_is_not(name):
    """ε < 0 would turn the trust region inside out, so either bound below 0 is refused; ε = 0
    is allowed. For PPO it clips the ratio to 1 exactly: each token's loss is
    max(−A·ρ, −A), by hand from RATIOS and ADV."""
    logprobs, old = _inputs()
    loss = POLICY_LOSSES.get(name)
    for low, high in ((-0.1, 0.2), (0.2, -0.1)):
        with pytest.raises(ValueError, match=r"clip_low and clip_high must be >= 0, got"):
            loss(logprobs, old, ADV, MASK, clip_low=low, clip_high=high)
    out = loss(logprobs, old, ADV, MASK, clip_low=0.0, clip_high=0.0)
    assert torch.isfinite(out.token_loss).all()
    if name == "ppo_clip":
        _close(out.token_loss, torch.maximum(-ADV * RATIOS, -ADV))


def test_shape_mismatch_is_refused():
    logprobs, old = _inputs()
    with pytest.raises(ValueError, match="share one shape"):
        ppo_clip_loss(logprobs, old[:, :2], ADV, MASK, clip_low=0.2, clip_high=0.2)


# GSPO batch: sequence 0 has 2 response tokens (third position is padding), sequence 1 has 3.
# Log-ratios log π − log π_old: row 0 [0.1, 0.3] → mean 0.2, s_0 = e^0.2  = 1.2214028
#                               row 1 [-0.3, -0.6, -0.3] → mean -0.4, s_1 = e^-0.4 = 0.6703200
GSPO_OLD = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]], dtype=torch.float64)
GSPO_LOG_RATIO = torch.tensor([[0.1, 0.3, 7.0], [-0.3, -0.6, -0.3]], dtype=torch.float64)
GSPO_ADV = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=torch.float64)
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
S0, S1 = math.exp(0.2), math.exp(-0.4)


def _gspo_inputs():
    logprobs = (GSPO_OLD + GSPO_LOG_RATIO).clone().requires_grad_(True)
    return logprobs, GSPO_OLD.clone()


def test_gspo_hand_values_with_one_clipped_sequence():
    logprobs, old = _gspo_inputs()
    out = gspo_loss(logprobs, old, GSPO_ADV, GSPO_MASK, clip_low=0.2, clip_high=0.28)
    # s range [0.8, 1.28]; the sequence loss max(-A·s, -A·clip(s)) sits on each of its tokens
    # seq 0, A=+1: s=1.2214028 inside          → -1.2214028 on both tokens, padding 0
    # seq 1, A=-2: s=0.6703200 below 0.8       → max(1.3406401, 1.6) = 1.6 on all 3, clipped
    _close(out.token_loss, [[-S0, -S0, 0.0], [1.6, 1.6, 1.6]])
    _close(out.token_loss[0, 0], -1.2214028)
    assert out.clipped.tolist() == [[False, False, False], [True, True, True]]
    _close(out.ratio, [[S0, S0, 1.0], [S1, S1, S1]])
    # seq_mean_token_mean (G = 2) gives the paper's (1/G)·Σ_i ℓ_i = (-1.2214028 + 1.6)/2
    loss = seq_mean_token_mean(out.token_loss, GSPO_MASK, num_tokens=5, num_seqs=2, max_len=3)
    _close(loss, (-S0 + 1.6) / 2)
    _close(loss, 0.1892986)


def test_gspo_gradient_is_the_sequence_gradient():
    logprobs, old = _gspo_inputs()
    out = gspo_loss(logprobs, old, GSPO_ADV, GSPO_MASK, clip_low=0.2, clip_high=0.28)
    # Σ_i mean_t ℓ_{i,t} = Σ_i ℓ_i; unclipped: ∂/∂logπ_t = -A_i·s_i/|o_i|, clipped: 0
    # seq 0: -1·1.2214028/2 = -0.6107014 per token; seq 1 (clipped): 0
    lengths = GSPO_MASK.sum(-1, keepdim=True)
    (out.token_loss.sum(-1, keepdim=True) / lengths).sum().backward()
    _close(logprobs.grad, [[-S0 / 2, -S0 / 2, 0.0], [0.0, 0.0, 0.0]])
    _close(logprobs.grad[0, 0], -0.6107014)

    # the same gradient as autograd through the paper's objective, s_i built with its gradient
    lp = logprobs.detach().clone().requires_grad_(True)
    m = GSPO_MASK.bool()
    log_ratio = torch.where(m, lp - old, torch.zeros((), dtype=lp.dtype))
    s = torch.exp(log_ratio.sum(-1) / m.sum(-1))
    a = GSPO_ADV[:, 0]
    paper = -torch.minimum(s * a, s.clamp(0.8, 1.28) * a).mean()  # -(1/G)·Σ_i min(...)
    paper.backward()
    logprobs.grad = None
    out = gspo_loss(logprobs, old, GSPO_ADV, GSPO_MASK, clip_low=0.2, clip_high=0.28)
    seq_mean_token_mean(out.token_loss, GSPO_MASK, num_tokens=5, num_seqs=2, max_len=3).backward()
    torch.testing.assert_close(logprobs.grad, lp.grad, atol=1e-12, rtol=0)
    _close(logprobs.grad, [[-S0 / 4, -S0 / 4, 0.0], [0.0, 0.0, 0.0]])


def test_gspo_token_gradient_with_per_token_advantages():
    # GSPO-token: s_{i,t} = sg[s_i]·π_t/sg[π_t] → ∂ℓ_{i,t}/∂logπ_t = -A_{i,t}·s_i (value s_i)
    logprobs, old = _gspo_inputs()
    adv = torch.tensor([[1.0, 3.0, 0.0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    out = gspo_loss(logprobs, old, adv, GSPO_MASK, clip_low=0.5, clip_high=0.5)
    # range [0.5, 1.5]: nothing clipped; loss -A·s, gradient of the token sum -A_{i,t}·s_i
    _close(out.token_loss, [[-S0, -3 * S0, 0.0], [-0.5 * S1] * 3])
    out.token_loss.sum().backward()
    _close(logprobs.grad, [[-S0, -3 * S0, 0.0], [-0.5 * S1] * 3])
    assert not out.clipped.any()


def test_gspo_on_policy_is_minus_advantage_and_matches_grpo_gradient():
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 1, generator=gen, dtype=torch.float64).expand(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    grads = []
    for loss in (gspo_loss, ppo_clip_loss):
        lp = logprobs.clone().requires_grad_(True)
        out = loss(lp, lp.detach(), adv, mask, clip_low=3e-4, clip_high=4e-4)
        # s = 1: loss = max(-A·1, -A·clip(1)) = -A on every response token
        _close(out.token_loss, -adv * mask)
        assert not out.clipped.any()
        seq_mean_token_mean(out.token_loss, mask, num_tokens=9, num_seqs=3, max_len=5).backward()
        grads.append(lp.grad)
    # on-policy, sequence-constant A: GSPO's gradient -A_i/(G·|o_i|) is GRPO's
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)
    _close(grads[0], -adv * mask / (3 * mask.sum(-1, keepdim=True)))


def test_gspo_published_clip_range_is_the_default():
    # defaults ε_low = 3e-4, ε_high = 4e-4; A = +1
    # seq 0: mean log-ratio 2e-4 → s = 1.0002000 ≤ 1.0004 → loss -1.0002000
    # seq 1: mean log-ratio 5e-4 → s = 1.0005001 > 1.0004 → clipped, loss -1.0004
    log_ratio = torch.tensor([[1e-4, 3e-4], [5e-4, 5e-4]], dtype=torch.float64)
    logprobs = log_ratio.clone().requires_grad_(True)
    out = gspo_loss(logprobs, torch.zeros_like(logprobs), torch.ones(2, 2), torch.ones(2, 2))
    _close(out.token_loss, [[-math.exp(2e-4)] * 2, [-1.0004] * 2])
    _close(out.token_loss[0, 0], -1.0002000)
    assert out.clipped.tolist() == [[False, False], [True, True]]
    # below: seq 2's mean log-ratio −5e-4 gives s = 0.9995 < 1 − 3e-4; with A = −1 the loss
    # is the pessimistic max(s, 0.9997) = 0.9997, clipped
    low = torch.full((1, 2), -5e-4, dtype=torch.float64)
    out = gspo_loss(low, torch.zeros_like(low), -torch.ones(1, 2), torch.ones(1, 2))
    _close(out.token_loss, [[0.9997] * 2])
    assert out.clipped.all()


def test_gspo_and_gmpo_ratio_of_a_one_token_response_is_its_tokens():
    # the mean log-ratio over one token is that token's, 0.1 (the 5.0 is padding)
    logprobs = torch.tensor([[0.1, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]])
    for loss in (gspo_loss, gmpo_loss):
        out = loss(logprobs, torch.zeros_like(logprobs), -torch.ones(1, 2), mask,
                   clip_low=0.5, clip_high=0.5)  # fmt: skip
        _close(out.ratio, [[math.exp(0.1), 1.0]])
        _close(out.token_loss, [[math.exp(0.1), 0.0]])


def test_cispo_hand_values_and_clipped_tokens_keep_gradient():
    # ratios as in RATIOS, log π chosen below, log π_old = log π − log ρ
    logprobs = torch.tensor(
        [[-1.0, -2.0, -0.5, -1.0], [-1.0, -1.0, -2.0, -4.0]], dtype=torch.float64
    ).requires_grad_(True)
    old = logprobs.detach() - RATIOS.log()
    out = cispo_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    # weight w = clip(ρ, 0.8, 1.28): row 0 [1.1, 1.28, 0.8, 1.25]; row 1 [1.28, 0.8, 0.9, 0.8]
    # loss -w·A·logπ: row 0 (A=+2) [-1.1·2·-1, -1.28·2·-2, -0.8·2·-0.5, -1.25·2·-1]
    #                            = [2.2, 5.12, 0.8, 2.5]
    #                 row 1 (A=-1) [1.28·-1, 0.8·-1, 0.9·-2, 0.8·-4] = [-1.28, -0.8, -1.8, -3.2]
    _close(out.token_loss, [[2.2, 5.12, 0.8, 2.5], [-1.28, -0.8, -1.8, -3.2]])
    assert out.clipped.tolist() == [[False, True, True, False], [True, True, False, True]]
    _close(out.ratio, RATIOS)
    out.token_loss.sum().backward()
    # ∂/∂logπ = -w·A on EVERY token, clipped ones included:
    # row 0: [-2.2, -2.56, -1.6, -2.5]; row 1: [1.28, 0.8, 0.9, 0.8]
    _close(logprobs.grad, [[-2.2, -2.56, -1.6, -2.5], [1.28, 0.8, 0.9, 0.8]])
    assert (logprobs.grad != 0).all()
    # ppo_clip on the same ratios drops the gradient of its clipped tokens
    lp = RATIOS.log().clone().requires_grad_(True)
    ppo = ppo_clip_loss(lp, torch.zeros_like(lp), ADV, MASK, clip_low=0.2, clip_high=0.28)
    ppo.token_loss.sum().backward()
    assert (lp.grad[ppo.clipped] == 0).all() and ppo.clipped.any()


def test_cispo_weight_is_stop_gradient():
    # unclipped token, ρ = 1.1, A = 2, log π = -1: with sg, ∂(-w·A·logπ)/∂logπ = -w·A = -2.2;
    # without sg, w = ρ = exp(logπ − logπ_old) adds -A·logπ·∂ρ/∂logπ = -2·(-1)·1.1 → 0
    logprobs = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    old = (logprobs.detach() - math.log(1.1)).requires_grad_(True)
    adv = torch.tensor([[2.0]], dtype=torch.float64)
    out = cispo_loss(logprobs, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    out.token_loss.sum().backward()
    _close(logprobs.grad, [[-2.2]])
    assert old.grad is None
    lp = logprobs.detach().clone().requires_grad_(True)
    no_sg = -torch.exp(lp - old.detach()) * adv * lp
    no_sg.sum().backward()
    _close(lp.grad, [[0.0]])  # -A·ρ·(1 + logπ) = -2.2·0: what CISPO must NOT compute


def test_cispo_without_lower_clip_as_minimax_uses_it():
    # clip_low ≥ 1 puts the lower bound at ≤ 0: ρ = 0.5 keeps weight 0.5, only ρ > 1.28 is cut
    logprobs = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - torch.tensor([[0.5, 2.0]], dtype=torch.float64).log()
    out = cispo_loss(
        logprobs, old, torch.ones(1, 2), torch.ones(1, 2), clip_low=1e9, clip_high=0.28
    )
    # loss -w·1·(-1) = w: [0.5, 1.28]
    _close(out.token_loss, [[0.5, 1.28]])
    assert out.clipped.tolist() == [[False, True]]
    out.token_loss.sum().backward()
    _close(logprobs.grad, [[-0.5, -1.28]])


def test_new_losses_are_registered():
    assert POLICY_LOSSES.get("gspo") is gspo_loss
    assert POLICY_LOSSES.get("cispo") is cispo_loss
    assert POLICY_LOSSES.get("sapo") is sapo_loss
    assert POLICY_LOSSES.get("gmpo") is gmpo_loss


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sapo_hand_values_and_gradient_weight():
    """ℓ = -(4/τ) σ(τ(ρ - 1)) A, τ = 1 for A = +2 and 1.05 for A = -1; the gradient with
    respect to log π is -4 p (1 - p) ρ A, p = σ(τ(ρ - 1)); nothing is clipped."""
    logprobs, old = _inputs()
    out = sapo_loss(logprobs, old, ADV, MASK, tau_pos=1.0, tau_neg=1.05)
    want, grad = [], []
    for ratios, a in zip(RATIOS.tolist(), (2.0, -1.0), strict=True):
        tau = 1.0 if a > 0 else 1.05
        want.append([-(4 / tau) * sigmoid(tau * (r - 1)) * a for r in ratios])
        p = [sigmoid(tau * (r - 1)) for r in ratios]
        grad.append([-4 * q * (1 - q) * r * a for q, r in zip(p, ratios, strict=True)])
    _close(out.token_loss, want, atol=1e-12)  # e.g. ρ = 1.1, A = 2: -8 σ(0.1) = -4.200
    out.token_loss.sum().backward()
    _close(logprobs.grad, grad, atol=1e-12)
    assert not out.clipped.any()
    _close(out.ratio, RATIOS)
    # off-policy the weight decays smoothly: at ρ = 1.5, A = +2 the gradient is 0.94 of the
    # unclipped -A ρ, where PPO's clip at 1.28 gives 0
    assert logprobs.grad[0, 1] / (-2.0 * 1.5) == pytest.approx(0.9400, abs=1e-4)
    for taus in ({"tau_pos": 0.0}, {"tau_neg": 0.0}):
        with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
            sapo_loss(logprobs, old, ADV, MASK, **taus)


def test_on_policy_sapo_gradient_is_reinforce_gradient():
    """At ρ = 1 the gate's weight 4 p (1 - p) ρ is 1 whatever τ: the policy gradient."""
    gen = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).double()
    lp = logprobs.clone().requires_grad_(True)
    sapo_loss(lp, lp.detach(), adv, mask, tau_pos=0.7, tau_neg=2.0).token_loss.sum().backward()
    _close(lp.grad, -adv * mask, atol=1e-12)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_losses_said_to_vanish_at_zero_advantage_do_and_the_others_do_not(name):
    """`VANISH_AT_ZERO_ADVANTAGE` lets the update skip zero-advantage samples: for those losses
    value and gradient must be exactly 0 there, with ratios far from 1 and a dual clip on."""
    from rlvr.algorithms.policy_losses import VANISH_AT_ZERO_ADVANTAGE

    g = torch.Generator().manual_seed(0)
    logprobs = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.7).requires_grad_(True)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.7
    out = POLICY_LOSSES.get(name)(
        logprobs,
        old,
        torch.zeros_like(old),
        torch.ones(3, 5),
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        tau=0.5,
        selected=torch.ones(3, 5, dtype=torch.bool),
    )
    out.token_loss.sum().backward()
    vanishes = not out.token_loss.detach().any() and not logprobs.grad.any()
    assert vanishes == (name in VANISH_AT_ZERO_ADVANTAGE)


def test_gmpo_hand_values_clip_each_token_before_the_geometric_mean():
    """GSPO's inputs (log-ratios [0.1, 0.3 | pad] with A = +1 and [-0.3, -0.6, -0.3] with
    A = -2) at ε = 0.4 in log space: sequence 0 is inside, r_0 = e^0.2; in sequence 1 the
    -0.6 is floored at -0.4 (A < 0), r_1 = e^((-0.3 - 0.4 - 0.3)/3) = e^(-1/3)."""
    logprobs, old = _gspo_inputs()
    out = gmpo_loss(logprobs, old, GSPO_ADV, GSPO_MASK, clip_low=0.4, clip_high=0.4)
    r1 = math.exp(-1 / 3)
    _close(out.token_loss, [[-S0, -S0, 0.0], [2 * r1] * 3])
    _close(out.ratio, [[S0, S0, 1.0], [r1] * 3])
    assert out.clipped.tolist() == [[False, False, False], [False, True, False]]
    # the paper's objective by autograd: -(1/G) Σ_i A_i exp(mean_t clip_t(l)), one-sided clip
    lp = logprobs.detach().clone().requires_grad_(True)
    m = GSPO_MASK.bool()
    a = GSPO_ADV[:, :1]
    log_ratio = torch.where(m, lp - old, torch.zeros((), dtype=lp.dtype))
    one_sided = torch.where(a > 0, log_ratio.clamp(max=0.4), log_ratio.clamp(min=-0.4))
    r = torch.exp(torch.where(m, one_sided, 0.0).sum(-1) / m.sum(-1))
    (-(a[:, 0] * r).mean()).backward()
    seq_mean_token_mean(out.token_loss, GSPO_MASK, num_tokens=5, num_seqs=2, max_len=3).backward()
    torch.testing.assert_close(logprobs.grad, lp.grad, atol=1e-12, rtol=0)
    # unclipped tokens: -A_i r_i / (G |o_i|); the clipped one 0
    _close(logprobs.grad, [[-S0 / 4, -S0 / 4, 0.0], [2 * r1 / 6, 0.0, 2 * r1 / 6]])


def test_gmpo_one_sided_clip_keeps_the_pessimistic_side():
    """A > 0 caps the log-ratio above only, A < 0 floors it below only (PPO's trust region):
    a log-ratio of -0.9 with A > 0, or +0.9 with A < 0, keeps its gradient."""
    log_ratio = torch.tensor([[0.9, -0.9], [0.9, -0.9]], dtype=torch.float64)
    logprobs = log_ratio.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    out = gmpo_loss(logprobs, torch.zeros_like(log_ratio), adv, torch.ones(2, 2))
    assert out.clipped.tolist() == [[True, False], [False, True]]
    _close(out.ratio, [[math.exp(-0.25)] * 2, [math.exp(0.25)] * 2])  # (0.4 - 0.9)/2, (0.9 - 0.4)/2


def test_gmpo_on_policy_matches_grpo_gradient():
    gen = torch.Generator().manual_seed(2)
    logprobs = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 1, generator=gen, dtype=torch.float64).expand(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    grads = []
    for loss in (gmpo_loss, ppo_clip_loss):
        lp = logprobs.clone().requires_grad_(True)
        out = loss(lp, lp.detach(), adv, mask, clip_low=0.4, clip_high=0.4)
        _close(out.token_loss, -adv * mask)
        seq_mean_token_mean(out.token_loss, mask, num_tokens=9, num_seqs=3, max_len=5).backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


def test_clip_cov_is_ppo_clip_with_the_selected_tokens_left_out():
    logprobs, old = _inputs()
    selected = torch.zeros(2, 4, dtype=torch.bool)
    selected[0, 0] = selected[1, 2] = True  # ρ = 1.1 (A = +2) and ρ = 0.9 (A = -1): inside
    out = clip_cov_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28, selected=selected)
    ppo = ppo_clip_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    want = ppo.token_loss.detach().clone()
    want[selected] = 0.0
    _close(out.token_loss, want)
    assert out.clipped.tolist() == [[True, True, False, False], [False, True, True, True]]
    out.token_loss.sum().backward()
    assert (logprobs.grad[selected] == 0).all()
    # the others keep PPO's gradient: -A ρ where unclipped
    _close(logprobs.grad[0, 2:], [-2.0 * 0.5, -2.0 * 1.25])
    _close(logprobs.grad[1, 0], 1.5)
    without = clip_cov_loss(logprobs, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    _close(without.token_loss, ppo.token_loss.detach())


def test_kl_cov_penalises_the_selected_tokens_log_ratio():
    """ℓ = -A ρ + β |log ρ| on the selected tokens, -A ρ elsewhere, nothing clipped; the
    penalty's gradient is β sign(log ρ)."""
    logprobs, old = _inputs()
    selected = torch.zeros(2, 4, dtype=torch.bool)
    selected[0, 1] = selected[1, 1] = True  # ρ = 1.5 (A = +2) and ρ = 0.5 (A = -1)
    out = kl_cov_loss(logprobs, old, ADV, MASK, kl_coef=0.5, selected=selected)
    want = (-ADV * RATIOS).clone()
    want[0, 1] += 0.5 * math.log(1.5)
    want[1, 1] += 0.5 * math.log(2.0)  # |log 0.5|
    _close(out.token_loss, want, atol=1e-12)
    assert not out.clipped.any()
    out.token_loss.sum().backward()
    grad = (-ADV * RATIOS).clone()
    grad[0, 1] += 0.5
    grad[1, 1] -= 0.5
    _close(logprobs.grad, grad, atol=1e-12)
    # on-policy the penalty is 0 with no gradient: the policy gradient
    lp = torch.full((1, 3), -1.0, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    every = torch.ones(1, 3, dtype=torch.bool)
    kl_cov_loss(lp, lp.detach(), adv, torch.ones(1, 3), selected=every).token_loss.sum().backward()
    _close(lp.grad, -adv, atol=1e-12)
    # β = 0 is allowed (no penalty: -A ρ everywhere); a negative β is refused
    logprobs, old = _inputs()
    zero = kl_cov_loss(logprobs, old, ADV, MASK, kl_coef=0.0, selected=selected)
    _close(zero.token_loss, -ADV * RATIOS, atol=1e-12)
    with pytest.raises(ValueError, match=r"kl_coef must be >= 0, got -0\.1"):
        kl_cov_loss(logprobs, old, ADV, MASK, kl_coef=-0.1, selected=selected)
