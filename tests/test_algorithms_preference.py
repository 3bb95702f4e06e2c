"""Preference losses: hand values, analytic gradients, and DPO against its other written form."""

import math

import pytest
import torch

from rlvr.algorithms import (
    PREFERENCE_LOSSES,
    REFERENCE_FREE,
    aot_loss,
    aot_matching,
    aot_unpaired_loss,
    apo_down_loss,
    apo_zero_loss,
    bco_pair_loss,
    cpo_loss,
    discopop_loss,
    dpo_loss,
    exo_pair_loss,
    f_divergence_scores,
    hinge_loss,
    ipo_loss,
    kto_loss,
    length_normalized_dpo_loss,
    nca_pair_loss,
    orpo_loss,
    preference_loss,
    robust_dpo_loss,
    simpo_loss,
    sppo_hard_loss,
)
from rlvr.algorithms.preference_step import wpo_weights

F64 = torch.float64
CHOSEN = torch.tensor([-10.0, -20.0], dtype=F64)
REJECTED = torch.tensor([-12.0, -18.0], dtype=F64)
REF_CHOSEN = torch.tensor([-11.0, -19.0], dtype=F64)
REF_REJECTED = torch.tensor([-11.0, -19.0], dtype=F64)
# log-ratios: chosen [+1, -1], rejected [-1, +1]
LEN_CHOSEN = torch.tensor([2.0, 4.0], dtype=F64)
LEN_REJECTED = torch.tensor([4.0, 2.0], dtype=F64)
ARGS = (CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, LEN_CHOSEN, LEN_REJECTED)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def _close(actual, expected, atol=1e-7):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), atol=atol, rtol=0)


def test_registry_names_and_reference_free():
    assert PREFERENCE_LOSSES.names() == [
        "aot",
        "aot_unpaired",
        "apo_down",
        "apo_zero",
        "bco_pair",
        "cpo",
        "discopop",
        "dpo",
        "exo_pair",
        "hinge",
        "ipo",
        "kto",
        "ln_dpo",
        "nca_pair",
        "orpo",
        "robust",
        "simpo",
        "sppo_hard",
    ]
    assert PREFERENCE_LOSSES.get("simpo") is simpo_loss
    assert {"simpo", "cpo", "orpo"} == REFERENCE_FREE


def test_dpo_hand_values():
    out = dpo_loss(*ARGS, beta=0.1)
    # z = 0.1·(+1) - 0.1·(-1) = 0.2, then -0.2: -log σ(z) = softplus(-z)
    _close(out.losses, [softplus(-0.2), softplus(0.2)])  # 0.5981389, 0.7981389
    _close(out.chosen_rewards, [0.1, -0.1])
    _close(out.rejected_rewards, [-0.1, 0.1])
    # conservative DPO, ε = 0.1: 0.9·softplus(-0.2) + 0.1·softplus(0.2) = 0.6181389
    smoothed = dpo_loss(*ARGS, beta=0.1, label_smoothing=0.1)
    _close(smoothed.losses[0], 0.6181389, atol=1e-7)


def test_length_normalized_dpo_hand_values():
    out = length_normalized_dpo_loss(*ARGS, beta=1.0)
    # pair 1: +1/2 - (-1/4) = 0.75; pair 2: -1/4 - 1/2 = -0.75
    _close(out.losses, [softplus(-0.75), softplus(0.75)])  # 0.3868950, 1.1368950
    _close(out.chosen_rewards, [0.5, -0.25])


def test_ipo_hand_values():
    out = ipo_loss(*ARGS, beta=0.5)  # target margin 1/(2β) = 1
    _close(out.losses, [(0.75 - 1) ** 2, (-0.75 - 1) ** 2])  # 0.0625, 3.0625
    with pytest.raises(ValueError, match="label smoothing"):
        ipo_loss(*ARGS, beta=0.5, label_smoothing=0.1)
    # β = 0.25: target 1/(2β) = 2 (at β = 0.5 it equals 2β, which hides a flipped division)
    _close(ipo_loss(*ARGS, beta=0.25).losses, [(0.75 - 2) ** 2, (-0.75 - 2) ** 2])


def test_hinge_hand_values_and_gradient():
    # β = 0.1: margins z = 0.1·(+1 + 1) = 0.2 and -0.2, losses 1 - z
    out = hinge_loss(*ARGS, beta=0.1)
    _close(out.losses, [0.8, 1.2])
    _close(out.chosen_rewards, [0.1, -0.1])
    # β = 1: z = 2 meets the margin (no loss, no gradient), z = -2 gives 3 and gradient ∓β
    chosen, rejected = CHOSEN.clone().requires_grad_(), REJECTED.clone().requires_grad_()
    out = hinge_loss(chosen, rejected, *ARGS[2:], beta=1.0)
    _close(out.losses, [0.0, 3.0])
    out.losses.sum().backward()
    _close(chosen.grad, [0.0, -1.0])
    _close(rejected.grad, [0.0, 1.0])
    with pytest.raises(ValueError, match="hinge has no label smoothing"):
        hinge_loss(*ARGS, beta=0.1, label_smoothing=0.1)


def test_robust_dpo_is_unbiased_under_label_flips():
    """(1-ε)·L(z) + ε·L(-z), the expected loss when the label is flipped with probability ε,
    is the clean DPO loss -log σ(z) = softplus(-z) (Chowdhury et al. 2024)."""
    eps = 0.2
    out = robust_dpo_loss(*ARGS, beta=0.1, label_smoothing=eps)
    # z = 0.2 and -0.2: L(z) = ((1-ε)·softplus(-z) - ε·softplus(z)) / (1-2ε)
    by_hand = [(0.8 * softplus(-z) - 0.2 * softplus(z)) / 0.6 for z in (0.2, -0.2)]
    _close(out.losses, by_hand)
    expected_loss = (1 - eps) * out.losses + eps * out.losses.flip(0)  # the pairs are ±z
    _close(expected_loss, [softplus(-0.2), softplus(0.2)])
    _close(out.chosen_rewards, [0.1, -0.1])
    clean = robust_dpo_loss(*ARGS, beta=0.1)
    torch.testing.assert_close(clean.losses, dpo_loss(*ARGS, beta=0.1).losses)
    # log-ratios other than ±1: chosen +2, rejected -0.5, β = 0.5 -> rewards 1 and -0.25,
    # z = 1.25, and with ε = 0.1 L = (0.9·softplus(-1.25) - 0.1·softplus(1.25)) / 0.8
    pair = [torch.tensor([v], dtype=F64) for v in (-8.0, -10.5, -10.0, -10.0, 1.0, 1.0)]
    out = robust_dpo_loss(*pair, beta=0.5, label_smoothing=0.1)
    _close(out.losses, [(0.9 * softplus(-1.25) - 0.1 * softplus(1.25)) / 0.8])
    _close(out.chosen_rewards, [1.0])
    _close(out.rejected_rewards, [-0.25])


def test_simpo_hand_values_ignore_the_reference():
    out = simpo_loss(CHOSEN, REJECTED, None, None, LEN_CHOSEN, LEN_REJECTED, beta=2.0, gamma=1.0)
    # pair 1: 2·(-10)/2 = -10 vs 2·(-12)/4 = -6, z = -10 + 6 - 1 = -5
    # pair 2: 2·(-20)/4 = -10 vs 2·(-18)/2 = -18, z = -10 + 18 - 1 = 7
    _close(out.losses, [softplus(5.0), softplus(-7.0)])  # 5.0067153, 0.0009115
    _close(out.chosen_rewards, [-10.0, -10.0])
    _close(out.rejected_rewards, [-6.0, -18.0])


def test_dpo_equals_its_policy_minus_reference_log_ratio_form():
    """Eq. 7 regrouped (TRL's form): β[(log π_w - log π_l) - (log ref_w - log ref_l)]."""
    gen = torch.Generator().manual_seed(0)
    logps = [-30 * torch.rand(16, generator=gen, dtype=F64) for _ in range(4)]
    lengths = torch.ones(16, dtype=F64)
    out = dpo_loss(*logps, lengths, lengths, beta=0.3)
    z = 0.3 * ((logps[0] - logps[1]) - (logps[2] - logps[3]))
    torch.testing.assert_close(out.losses, -torch.log(torch.sigmoid(z)), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["dpo", "ln_dpo", "simpo"])
def test_bradley_terry_gradient(name):
    """dL/dz = σ(z) - (1 - ε) for L = -(1-ε) log σ(z) - ε log σ(-z); dz/d log π(y_w) = β/|y_w|
    (β for DPO), and -β/|y_l| for the rejected response."""
    beta, eps = 0.7, 0.2
    chosen = CHOSEN.clone().requires_grad_(True)
    rejected = REJECTED.clone().requires_grad_(True)
    out = preference_loss(
        name,
        chosen,
        rejected,
        REF_CHOSEN,
        REF_REJECTED,
        LEN_CHOSEN,
        LEN_REJECTED,
        beta=beta,
        gamma=0.0,
        label_smoothing=eps,
    )
    out.losses.sum().backward()
    z = out.chosen_rewards - out.rejected_rewards
    dz = torch.sigmoid(z) - (1 - eps)
    scale_w = beta if name == "dpo" else beta / LEN_CHOSEN
    scale_l = beta if name == "dpo" else beta / LEN_REJECTED
    torch.testing.assert_close(chosen.grad, dz * scale_w, atol=1e-12, rtol=0)
    torch.testing.assert_close(rejected.grad, -dz * scale_l, atol=1e-12, rtol=0)
    assert chosen.grad.abs().min() > 1e-3


def test_ipo_gradient():
    chosen = CHOSEN.clone().requires_grad_(True)
    out = ipo_loss(chosen, REJECTED, REF_CHOSEN, REF_REJECTED, LEN_CHOSEN, LEN_REJECTED, beta=0.5)
    out.losses.sum().backward()
    # d/dlogπ_w (h - 1)² = 2(h - 1)/|y_w|: 2·(-0.25)/2 = -0.25, 2·(-1.75)/4 = -0.875
    _close(chosen.grad, [-0.25, -0.875])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="needs the reference"):
        preference_loss("dpo", CHOSEN, REJECTED, None, None, LEN_CHOSEN, LEN_REJECTED, beta=0.1)
    # a reference-free loss goes without them
    free = preference_loss(
        "simpo", CHOSEN, REJECTED, None, None, LEN_CHOSEN, LEN_REJECTED, beta=2.0
    )
    _close(free.chosen_rewards, [-10.0, -10.0])
    with pytest.raises(ValueError, match="share one shape"):
        dpo_loss(CHOSEN, REJECTED[:1], REF_CHOSEN, REF_REJECTED, LEN_CHOSEN, LEN_REJECTED, beta=1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(*ARGS, beta=0.1, label_smoothing=0.5)
    with pytest.raises(KeyError, match="did you mean 'simpo'"):
        preference_loss("simpoo", *ARGS, beta=0.1)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_log_ratio_losses_hand_values():
    """Log-ratios a = [+1, -1], b = [-1, +1] at β = 0.5 (so 1/(2β) = 1)."""
    s = sigmoid
    apo_zero = apo_zero_loss(*ARGS, beta=0.5)  # 1 - σ(βa) + σ(βb)
    _close(apo_zero.losses, [1 - s(0.5) + s(-0.5), 1 - s(-0.5) + s(0.5)])  # 0.755, 1.245
    _close(apo_zero.chosen_rewards, [0.5, -0.5])
    _close(apo_zero.rejected_rewards, [-0.5, 0.5])
    apo_down = apo_down_loss(*ARGS, beta=0.5)  # σ(βa) + 1 - σ(β(a - b))
    _close(apo_down.losses, [s(0.5) + 1 - s(1.0), s(-0.5) + 1 - s(-1.0)])  # 0.891, 1.109
    # -log σ(x) = softplus(-x): softplus(-βa) + ½ softplus(βa) + ½ softplus(βb)
    nca = nca_pair_loss(*ARGS, beta=0.5)
    by_hand = [
        softplus(-c) + softplus(c) / 2 + softplus(r) / 2 for c, r in ((0.5, -0.5), (-0.5, 0.5))
    ]
    _close(nca.losses, by_hand)
    sppo = sppo_hard_loss(*ARGS, beta=0.5)  # (a - 1)² + (b + 1)²
    _close(sppo.losses, [0.0, 8.0])
    for loss in (apo_zero_loss, apo_down_loss, nca_pair_loss, sppo_hard_loss):
        with pytest.raises(ValueError, match="has no label smoothing"):
            loss(*ARGS, beta=0.5, label_smoothing=0.1)


def test_anchored_losses_move_each_response_its_own_way():
    """APO-zero raises the chosen and lowers the rejected likelihood; APO-down lowers both,
    the rejected more: the signs of the gradient with respect to the policy's log-probs."""
    chosen, rejected = CHOSEN.clone().requires_grad_(), REJECTED.clone().requires_grad_()
    apo_zero_loss(chosen, rejected, *ARGS[2:], beta=0.5).losses.sum().backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()  # descent: up, down
    chosen.grad, rejected.grad = None, None
    apo_down_loss(chosen, rejected, *ARGS[2:], beta=0.5).losses.sum().backward()
    assert (chosen.grad > 0).all() and (rejected.grad > 0).all()  # both down
    assert (rejected.grad > chosen.grad).any()


def test_bco_and_discopop_hand_values():
    """Log-ratios a = [+1, -1], b = [-1, +1] at β = 0.5: β a = [0.5, -0.5], ρ = β (a - b) =
    [1, -1]."""
    bco = bco_pair_loss(*ARGS, beta=0.5)  # softplus(-βa) + softplus(βb)
    _close(bco.losses, [2 * softplus(-0.5), 2 * softplus(0.5)])  # 0.948, 1.948
    _close(bco.chosen_rewards, [0.5, -0.5])
    s = sigmoid
    # (1 - σ(ρ/τ)) softplus(-ρ) + σ(ρ/τ) e^{-ρ}, τ = 0.5: σ(±2)
    by_hand = [
        (1 - s(2.0)) * softplus(-1.0) + s(2.0) * math.exp(-1.0),  # 0.357
        (1 - s(-2.0)) * softplus(1.0) + s(-2.0) * math.exp(1.0),  # 1.426
    ]
    _close(discopop_loss(*ARGS, beta=0.5, tau=0.5).losses, by_hand)
    # τ → 0 switches to the exponential loss when ρ > 0 and the logistic one when ρ < 0
    _close(discopop_loss(*ARGS, beta=0.5, tau=1e-4).losses, [math.exp(-1.0), softplus(1.0)])
    for loss in (bco_pair_loss, discopop_loss):
        with pytest.raises(ValueError, match="has no label smoothing"):
            loss(*ARGS, beta=0.5, label_smoothing=0.1)


def test_log_ratio_losses_off_unit_log_ratios():
    """Log-ratios a = [2, -0.5], b = [0.5, -3] at β = 0.25: the unit log-ratios of `ARGS` make
    β a equal β / a and 1/(2β) + b squared equal twice it, so they cannot tell those apart.
    β a = [0.5, -0.125], β b = [0.125, -0.75], 1/(2β) = 2, ρ = β (a - b) = [0.375, 0.625]."""
    chosen = torch.tensor([-8.0, -20.5], dtype=F64)
    rejected = torch.tensor([-10.5, -22.0], dtype=F64)
    ref_chosen, ref_rejected = torch.tensor([-10.0, -20.0], dtype=F64), REF_REJECTED
    args = (chosen, rejected, ref_chosen, ref_rejected, LEN_CHOSEN, LEN_REJECTED)
    beta_a, beta_b = [0.5, -0.125], [0.125, -0.75]
    nca = nca_pair_loss(*args, beta=0.25)
    by_hand = [softplus(-c) + softplus(c) / 2 + softplus(r) / 2 for c, r in zip(beta_a, beta_b)]
    _close(nca.losses, by_hand)
    _close(nca.chosen_rewards, beta_a)
    _close(nca.rejected_rewards, beta_b)
    bco = bco_pair_loss(*args, beta=0.25)
    _close(bco.losses, [softplus(-c) + softplus(r) for c, r in zip(beta_a, beta_b)])
    _close(sppo_hard_loss(*args, beta=0.25).losses, [0.0 + 6.25, 6.25 + 1.0])  # (a-2)² + (b+2)²
    # τ defaults to the paper's 0.05: σ(ρ/τ) = σ([7.5, 12.5])
    s = sigmoid
    by_hand = [
        (1 - s(r / 0.05)) * softplus(-r) + s(r / 0.05) * math.exp(-r) for r in (0.375, 0.625)
    ]
    _close(discopop_loss(*args, beta=0.25).losses, by_hand)


def test_exo_is_the_kl_between_two_point_distributions():
    """EXO's pair loss is KL(p ‖ q) with p = (σ(z), σ(-z)) and q = (1 - ε, ε): checked
    against torch's own KL of the two Bernoullis, and 0 with no gradient where p = q."""
    eps, beta = 0.01, 0.5
    out = exo_pair_loss(*ARGS, beta=beta, label_smoothing=eps)
    z = torch.tensor([1.0, -1.0], dtype=F64)  # β (a - b)
    p = torch.distributions.Bernoulli(probs=torch.sigmoid(z))
    q = torch.distributions.Bernoulli(probs=torch.tensor(1 - eps, dtype=F64))
    _close(out.losses, torch.distributions.kl_divergence(p, q).tolist())
    _close(out.chosen_rewards, [0.5, -0.5])
    # z* = log((1 - ε)/ε): chosen log-ratio z*/β, rejected 0
    at = torch.tensor([math.log((1 - eps) / eps) / beta], dtype=F64, requires_grad=True)
    zero = torch.zeros(1, dtype=F64)
    loss = exo_pair_loss(at, zero, zero, zero, zero + 1, zero + 1, beta=beta, label_smoothing=eps)
    loss.losses.sum().backward()
    assert abs(loss.losses.item()) < 1e-12 and abs(at.grad.item()) < 1e-12
    with pytest.raises(ValueError, match="exo_pair needs label_smoothing"):
        exo_pair_loss(*ARGS, beta=beta)


@pytest.mark.parametrize("tau", [0.05, 0.1, 0.5])
def test_discopop_slope_where_the_policy_is_its_reference(tau):
    """At ρ = 0 (the first step) d L/d ρ = (1 - log 2)/(4τ) - 3/4: for τ below
    (1 - log 2)/3 ≈ 0.102, the paper's 0.05 among them, descent first lowers ρ."""
    rho = torch.zeros(1, dtype=F64, requires_grad=True)
    zero, one = torch.zeros(1, dtype=F64), torch.ones(1, dtype=F64)
    discopop_loss(rho, zero, zero, zero, one, one, beta=1.0, tau=tau).losses.sum().backward()
    assert rho.grad.item() == pytest.approx((1 - math.log(2)) / (4 * tau) - 0.75, abs=1e-12)
    assert (rho.grad.item() > 0) == (tau < (1 - math.log(2)) / 3)


def test_cpo_and_orpo_hand_values_without_a_reference():
    """CPO: -log σ(β ℓ_w - β ℓ_l) on the summed log-probs [-10, -20] vs [-12, -18]; ORPO:
    -β log σ(log odds_w - log odds_l) with odds = P/(1 - P), P = exp(ℓ/|y|). Neither reads
    the reference (None)."""
    none = (CHOSEN, REJECTED, None, None, LEN_CHOSEN, LEN_REJECTED)
    cpo = cpo_loss(*none, beta=0.5)
    _close(cpo.losses, [softplus(-1.0), softplus(1.0)])  # z = 0.5·(+2), 0.5·(-2)
    _close(cpo.chosen_rewards, [-5.0, -10.0])

    def log_odds(mean_logp):
        p = math.exp(mean_logp)
        return math.log(p / (1 - p))

    # mean token log-probs: chosen -10/2, -20/4 = -5, -5; rejected -12/4, -18/2 = -3, -9
    by_hand = [
        0.5 * softplus(-(log_odds(c) - log_odds(r))) for c, r in ((-5.0, -3.0), (-5.0, -9.0))
    ]
    orpo = orpo_loss(*none, beta=0.5)
    _close(orpo.losses, by_hand)
    _close(orpo.chosen_rewards, [-2.5, -2.5])
    _close(orpo.rejected_rewards, [-1.5, -4.5])
    with pytest.raises(ValueError, match="orpo has no label smoothing"):
        orpo_loss(*none, beta=0.5, label_smoothing=0.1)


def test_orpo_odds_stay_finite_when_a_response_is_certain():
    """A response of probability 1 (every token log-prob 0) has infinite odds; ORPO holds P
    below 1 - 1e-6, so its loss and gradient stay finite."""
    chosen = torch.tensor([0.0, -1.0], dtype=F64, requires_grad=True)
    rejected = torch.tensor([-2.0, 0.0], dtype=F64)
    ones = torch.ones(2, dtype=F64)
    out = orpo_loss(chosen, rejected, None, None, ones, ones, beta=0.1)
    out.losses.sum().backward()
    assert torch.isfinite(out.losses).all() and torch.isfinite(chosen.grad).all()
    # log odds of 1 - 1e-6 is log(1e6 - 1): the pair ranked right by about 13.8 - log odds(e^-2)
    assert out.losses[0].item() == pytest.approx(
        0.1 * softplus(-(math.log(1e6 - 1) - math.log(math.exp(-2) / (1 - math.exp(-2))))),
        rel=1e-6,
    )


def test_f_divergence_scores_are_f_prime_of_the_ratio():
    """f'(t) at t = π/π_ref = e^u, written in t: forward KL 1 - 1/t, JS log(2t/(t + 1)),
    α-divergence (t^(α-1) - 1)/(α - 1); reverse KL (DPO) and α = 1 give u itself."""
    u = torch.tensor([-1.0, 0.0, 0.5, 3.0], dtype=F64)
    t = u.exp()
    _close(f_divergence_scores(u, "reverse_kl"), u.tolist())
    _close(f_divergence_scores(u, "forward_kl"), (1 - 1 / t).tolist())
    _close(f_divergence_scores(u, "js_divergence"), (2 * t / (t + 1)).log().tolist())
    _close(f_divergence_scores(u, "alpha_divergence", 0.5), ((t**-0.5 - 1) / -0.5).tolist())
    _close(f_divergence_scores(u, "alpha_divergence", 1.0), u.tolist())
    for kind in ("forward_kl", "js_divergence", "alpha_divergence"):
        assert f_divergence_scores(u, kind)[1] == 0  # the policy is its reference: score 0
    with pytest.raises(ValueError, match="unknown f-divergence 'kl'"):
        f_divergence_scores(u, "kl")


def test_kto_values_each_response_against_the_reference_point():
    """Log-ratios a = [+1, -1], b = [-1, +1] at β = 0.5 and z0 = 0.4 (β z0 = 0.2):
    ½ [λ_D (1 - σ(β a - 0.2)) + λ_U (1 - σ(0.2 - β b))]."""
    s = sigmoid
    out = kto_loss(*ARGS, beta=0.5, z0=0.4)
    _close(out.losses, [0.5 * (2 - s(0.3) - s(0.7)), 0.5 * (2 - s(-0.7) - s(-0.3))])
    _close(out.chosen_rewards, [0.5, -0.5])
    weighted = kto_loss(*ARGS, beta=0.5, z0=0.4, desirable_weight=2.0, undesirable_weight=0.5)
    _close(weighted.losses, [0.5 * (2 * (1 - s(0.3)) + 0.5 * (1 - s(0.7))),
                             0.5 * (2 * (1 - s(-0.7)) + 0.5 * (1 - s(-0.3)))])  # fmt: skip
    # the rewards are β times the log-ratios: a = +2, b = -0.5 give 1 and -0.25
    pair = [torch.tensor([v], dtype=F64) for v in (-8.0, -10.5, -10.0, -10.0, 1.0, 1.0)]
    out = kto_loss(*pair, beta=0.5, z0=0.0)
    _close(out.chosen_rewards, [1.0])
    _close(out.rejected_rewards, [-0.25])
    with pytest.raises(ValueError, match="kto has no label smoothing"):
        kto_loss(*ARGS, beta=0.5, z0=0.0, label_smoothing=0.1)


def test_kto_on_one_sided_pairs_takes_the_present_side_alone():
    """Rows of an unpaired file: row 0 desirable only (rejected length 0), row 1 undesirable
    only (chosen length 0): each row's loss is its one term, not halved; a whole pair keeps
    the ½ (checked above)."""
    s = sigmoid
    one_sided = (  # a one-token response is present
        *ARGS[:4],
        torch.tensor([1.0, 0.0], dtype=F64),
        torch.tensor([0.0, 1.0], dtype=F64),
    )
    out = kto_loss(*one_sided, beta=0.5, z0=0.4, desirable_weight=2.0, undesirable_weight=0.5)
    _close(out.losses, [2 * (1 - s(0.5 - 0.2)), 0.5 * (1 - s(0.2 - 0.5))])


def _smoothed(z, eps):
    return -(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)


@pytest.mark.parametrize("unpaired", [False, True])
def test_aot_per_pair_is_the_sorted_batch_loss_in_value_and_gradient(unpaired):
    """TRL's AOT written out over a batch of 6 pairs (sort each side, compare rank by rank)
    against the mean of rlvr's per-pair losses with `aot_matching`: equal values and equal
    gradients with respect to the policy's log-probs."""
    g = torch.Generator().manual_seed(3)
    chosen, rejected, ref_c, ref_r = (torch.randn(6, generator=g, dtype=F64) * 2 for _ in "abcd")
    beta, eps = 0.5, 0.1
    c1, r1 = chosen.clone().requires_grad_(), rejected.clone().requires_grad_()
    if unpaired:
        left, right = c1 - ref_c, r1 - ref_r
    else:
        left, right = c1 - r1, ref_c - ref_r
    batch = _smoothed(beta * (torch.sort(left).values - torch.sort(right).values), eps).mean()
    batch.backward()
    c2, r2 = chosen.clone().requires_grad_(), rejected.clone().requires_grad_()
    matched = aot_matching(chosen, rejected, ref_c, ref_r, unpaired)
    loss = aot_unpaired_loss if unpaired else aot_loss
    ones = torch.ones(6, dtype=F64)
    out = loss(c2, r2, ref_c, ref_r, ones, ones, beta=beta, label_smoothing=eps, matched=matched)
    out.losses.mean().backward()
    assert out.losses.mean().item() == pytest.approx(batch.item(), rel=1e-12)
    torch.testing.assert_close(c2.grad, c1.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(r2.grad, r1.grad, atol=1e-12, rtol=0)
    _close(out.chosen_rewards, (beta * (chosen - ref_c)).tolist())
    _close(out.rejected_rewards, (beta * (rejected - ref_r)).tolist())
    assert c1.grad.abs().min() > 0 and not torch.equal(matched[:, 0], (ref_c - ref_r))


def test_aot_matching_by_hand():
    """Policy margins [3, -1, 1] rank [2, 0, 1]; reference margins [0, 2, -2] sorted
    [-2, 0, 2]: the pairs meet -> [2, -2, 0]."""
    chosen = torch.tensor([3.0, -1.0, 1.0], dtype=F64)
    zero = torch.zeros(3, dtype=F64)
    ref_c = torch.tensor([0.0, 2.0, -2.0], dtype=F64)
    matched = aot_matching(chosen, zero, ref_c, zero, unpaired=False)
    assert matched[:, 0].tolist() == [2.0, -2.0, 0.0]


def test_wpo_weight_by_hand():
    """Two responses over a 3-token vocabulary: w = exp(mean_t log(p(y_t) / Σ_v p(v)²)), the
    padded position ignored; a uniform policy gives w = 1."""
    logits = torch.tensor(
        [[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]]], dtype=F64
    )
    tokens = torch.tensor([[0, 2], [1, 0]])
    mask = torch.tensor([[1, 1], [1, 0]])

    def ratio(row, token):
        p = torch.softmax(row, -1)
        return math.log(p[token] / (p**2).sum())

    first = math.exp((ratio(logits[0, 0], 0) + ratio(logits[0, 1], 2)) / 2)
    _close(wpo_weights(logits, tokens, mask), [first, 1.0], atol=1e-12)
    assert first < 1.5 and ratio(logits[0, 0], 0) > 0  # the likeliest token's ratio is above 1
    # three positions: the mean runs over each row's own tokens, one token divides by 1
    row = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    logits = torch.stack([row.expand(3, 3), row.expand(3, 3)])
    tokens = torch.tensor([[0, 1, 2], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    both = [math.exp(sum(ratio(row, t) for t in range(3)) / 3), math.exp(ratio(row, 0))]
    _close(wpo_weights(logits, tokens, mask), both, atol=1e-12)
