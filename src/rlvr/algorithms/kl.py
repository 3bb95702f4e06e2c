r"""Per-token estimators of KL(π_θ ‖ π_ref) from sampled tokens.

Schulman (2020), *Approximating KL Divergence* (http://joschu.net/blog/kl-approx.html). With
tokens sampled from π_θ and the log-ratio
:math:`x = \log\pi_\theta(o_t) - \log\pi_{\text{ref}}(o_t)`:

=====  =====================================  ==================  ============================
name   per-token value                        as a KL *value*     as a *loss* (its gradient)
=====  =====================================  ==================  ============================
k1     :math:`x`                              unbiased            useless: E[∇k1] = 0
k2     :math:`\tfrac12 x^2`                   biased (low var.)   unbiased ∇KL(π_θ‖π_ref)
k3     :math:`e^{-x} + x - 1`                 unbiased, ≥ 0       biased: ∇KL(π_ref‖π_θ)
=====  =====================================  ==================  ============================

DESIGN rule 5: **k1 in the reward** (subtracted from the reward, so it reaches the gradient
through the score function) and **k2 in the loss** are the unbiased ways to regularise towards
π_ref. GRPO's k3-in-the-loss (Shao et al. 2024, eq. 4) is what its presets reproduce, but its
gradient is that of the *reverse* KL (on-policy: E_θ[(1 − π_ref/π_θ) ∇ log π_θ] = ∇KL(π_ref‖π_θ)),
see Zhang et al. 2025, *On the Design of KL-Regularized Policy Gradient Algorithms for LLM
Reasoning* (arXiv:2505.17508) and Tang & Munos 2025 (arXiv:2506.09477).

Departure from the blog post: k3's log-ratio is clamped into [−20, 20] before ``exp`` (as verl
does), so an extreme token cannot overflow to inf; beyond the clamp, k3's gradient is 0.
The estimators are elementwise: the caller masks and aggregates them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.registry import KL_ESTIMATORS

K3_LOG_RATIO_CLAMP = 20.0
"""k3 clamps log(π_ref/π_θ) into [−K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP] before exp."""


def _check(logprobs: Tensor, ref_logprobs: Tensor) -> None:
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs shape {tuple(logprobs.shape)} must equal ref_logprobs shape "
            f"{tuple(ref_logprobs.shape)}"
        )


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    r"""k1 = log π_θ(o_t) − log π_ref(o_t).

    Unbiased as a KL *value* (E_θ[k1] = KL(π_θ‖π_ref)) but high-variance and can be negative
    per token. Use it **in the reward** (r ← r − β Σ_t k1, e.g. PPO-RLHF, Ouyang et al. 2022):
    then the policy gradient of the shaped reward is an unbiased gradient of the KL penalty.
    As a **loss** it is useless: E_θ[∇ log π_θ] = 0, so its expected gradient is 0.
    """
    _check(logprobs, ref_logprobs)
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    r"""k2 = ½ (log π_θ(o_t) − log π_ref(o_t))².

    Biased as a KL *value* (low variance, ≥ 0; exact to second order as π_θ → π_ref). As a
    **loss** it is the unbiased choice: on-policy, E_θ[∇k2] = E_θ[(log π_θ − log π_ref)
    ∇ log π_θ] = ∇_θ KL(π_θ‖π_ref). Its derivative w.r.t. ``logprobs`` is ``logprobs −
    ref_logprobs``.
    """
    _check(logprobs, ref_logprobs)
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    r"""k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 = e^{y} − y − 1 with y = log π_ref − log π_θ.

    Unbiased as a KL *value* (E_θ[e^y] = 1) and ≥ 0 per token: the estimator of GRPO (Shao et
    al. 2024, *DeepSeekMath*, arXiv:2402.03300, eq. 4). As a **loss** its gradient is
    **biased**: ∂k3/∂log π_θ = 1 − e^{y}, whose on-policy expectation is ∇KL(π_ref‖π_θ), the
    reverse KL, not ∇KL(π_θ‖π_ref). Prefer k2 in the loss or k1 in the reward (DESIGN rule 5).

    ``y`` is clamped into [−20, 20] before ``exp`` for numerical safety; the value is then
    that of the clamped ratio and the gradient there is 0.
    """
    _check(logprobs, ref_logprobs)
    y = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return torch.exp(y) - y - 1.0
