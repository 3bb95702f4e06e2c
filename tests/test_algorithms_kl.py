"""KL estimators: hand values, analytic gradients, and which one is unbiased for what."""

import math

import pytest
import torch

from rlvr.algorithms import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3

LOGP = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
REF = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
# x = logp - ref = [0.5, -1.0, 0.0];  y = ref - logp = -x = [-0.5, 1.0, 0.0]


def _close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_hand_values():
    _close(kl_k1(LOGP, REF), [0.5, -1.0, 0.0])
    _close(kl_k2(LOGP, REF), [0.125, 0.5, 0.0])  # ½x²
    # e^y - y - 1: e^-0.5 + 0.5 - 1 = 0.1065307; e - 1 - 1 = 0.7182818; 0
    _close(kl_k3(LOGP, REF), [0.1065307, 0.7182818, 0.0])
    assert KL_ESTIMATORS.get("k3") is kl_k3


def test_analytic_gradients_wrt_logprobs():
    gen = torch.Generator().manual_seed(0)
    logp = -3 * torch.rand(4, 6, generator=gen, dtype=torch.float64)
    ref = -3 * torch.rand(4, 6, generator=gen, dtype=torch.float64)
    for fn, derivative in (
        (kl_k1, lambda: torch.ones_like(logp)),
        (kl_k2, lambda: logp - ref),  # d/dlogp ½(logp-ref)² = logp - ref
        (kl_k3, lambda: 1 - torch.exp(ref - logp)),  # d/dlogp (e^y - y - 1), y = ref - logp
    ):
        lp = logp.clone().requires_grad_(True)
        fn(lp, ref).sum().backward()
        torch.testing.assert_close(lp.grad, derivative(), atol=1e-12, rtol=0)
    # the hand example: k3' = 1 - e^y = [1 - e^-0.5, 1 - e, 0] = [0.3934693, -1.7182818, 0]
    lp = LOGP.clone().requires_grad_(True)
    kl_k3(lp, REF).sum().backward()
    _close(lp.grad, [0.3934693, -1.7182818, 0.0])


@pytest.mark.parametrize("name", ["k2", "k3"])
def test_non_negative_on_random_inputs(name):
    gen = torch.Generator().manual_seed(1)
    logp = 5 * torch.randn(1000, generator=gen)
    ref = 5 * torch.randn(1000, generator=gen)
    assert (KL_ESTIMATORS.get(name)(logp, ref) >= 0).all()


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_zero_when_policies_agree(name):
    logp = -torch.rand(2, 3)
    assert torch.equal(KL_ESTIMATORS.get(name)(logp, logp), torch.zeros(2, 3))


def test_k3_log_ratio_is_clamped():
    logp = torch.tensor([0.0, -1000.0], requires_grad=True)
    ref = torch.tensor([-1000.0, 0.0])
    value = kl_k3(logp, ref)
    # y clamped to -20 → e^-20 + 20 - 1 ≈ 19; y clamped to 20 → e^20 - 21
    assert torch.isfinite(value).all()
    expected = torch.tensor([math.exp(-20) + 19, math.exp(20) - 21])  # float32, like value
    torch.testing.assert_close(value.detach(), expected, rtol=1e-6, atol=0)
    value.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(2))


P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
# KL(P‖Q) = 0.5·ln 2.5 + 0.3·ln 1 + 0.2·ln 0.4 = 0.3·ln 2.5 = 0.2748872
TRUE_KL = 0.3 * math.log(2.5)


def test_monte_carlo_k1_and_k3_estimate_true_kl():
    gen = torch.Generator().manual_seed(0)
    samples = torch.multinomial(P, 200_000, replacement=True, generator=gen)
    logp, ref = P.log()[samples], Q.log()[samples]
    assert abs(TRUE_KL - 0.2748872) < 1e-6
    # standard errors ≈ 0.0015 (k1) and 0.0006 (k3)
    assert abs(kl_k1(logp, ref).mean().item() - TRUE_KL) < 0.01
    assert abs(kl_k3(logp, ref).mean().item() - TRUE_KL) < 0.01


def test_exact_expectations_value_bias():
    # E_P[k] by enumeration over the 3 outcomes: k1 and k3 are unbiased, k2 is not.
    # E_P[k2] = ½·(ln 2.5)²·(0.5 + 0.2) = 0.2938560
    logp, ref = P.log(), Q.log()
    _close((P * kl_k1(logp, ref)).sum(), TRUE_KL, atol=1e-12)
    _close((P * kl_k3(logp, ref)).sum(), TRUE_KL, atol=1e-12)
    _close((P * kl_k2(logp, ref)).sum(), 0.2938560)


def test_exact_expected_gradients_rule_5():
    # π_θ = softmax(θ). Used as a loss, the on-policy expected gradient of an estimator is
    # Σ_x π(x) ∇_θ k(x) (samples fixed, π(x) detached). DESIGN rule 5:
    #   k2 → ∇KL(π‖ref) (unbiased), k3 → ∇KL(ref‖π) (biased), k1 → 0.
    theta = P.log().clone().requires_grad_(True)

    def expected_grad(fn):
        theta.grad = None
        pi = torch.softmax(theta, -1)
        (pi.detach() * fn(pi.log(), Q.log())).sum().backward()
        return theta.grad.clone()

    def true_grad(kl):
        theta.grad = None
        kl(torch.softmax(theta, -1)).backward()
        return theta.grad.clone()

    forward = true_grad(lambda pi: (pi * (pi.log() - Q.log())).sum())  # ∇KL(π‖ref)
    reverse = true_grad(lambda pi: (Q * (Q.log() - pi.log())).sum())  # ∇KL(ref‖π)
    torch.testing.assert_close(expected_grad(kl_k2), forward, atol=1e-12, rtol=0)
    torch.testing.assert_close(expected_grad(kl_k3), reverse, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        expected_grad(kl_k1), torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert (forward - reverse).abs().max() > 0.05  # the two really differ here


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="shape"):
        kl_k2(LOGP, REF[:2])
