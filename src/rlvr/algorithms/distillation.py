"""On-policy distillation: a teacher's log-probs of the student's own tokens as a dense reward.

The student samples; a frozen teacher scores every sampled token; each token's reward is the
teacher's log-prob minus the student's, the negative of the one-sample estimate of the reverse
KL divergence KL(π_student ‖ π_teacher) at that position. The policy-gradient loss then moves
the student towards what the teacher would have written, on the prefixes the student itself
reaches. Training on the student's own samples scored by a teacher is GKD's on-policy
distillation (Agarwal et al. 2024, *On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes*, arXiv:2306.13649, which takes the divergence over the whole
vocabulary at each position); the one-sample reward per token, trained as RL with a discount
of 0, is Lu and Thinking Machines Lab's (2025, *On-Policy Distillation*).

How this code departs from them: the reward may be discounted over the tokens that follow
(``discount`` = 1 gives the unbiased gradient of the sequence-level reverse KL, 0 the
per-token reward of the blog post), and a tool's result inside a completion (mask 0) is
skipped, as GAE skips it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.value import gae_advantages


def teacher_token_advantages(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    response_mask: Tensor,
    *,
    discount: float = 0.0,
) -> Tensor:
    r"""Per-token advantages from a teacher's log-probs of the student's sampled tokens.

    .. math::

        g_t = \log \pi_T(y_t \mid y_{<t}) - \log \pi_S(y_t \mid y_{<t}), \qquad
        A_t = \sum_{s \ge t} \gamma^{\,s-t} g_s

    over the response tokens the mask keeps. With γ = 1,
    :math:`\mathbb{E}_{y\sim\pi_S}[\sum_t A_t \nabla\log\pi_S(y_t \mid y_{<t})] =
    -\nabla\,\mathrm{KL}(\pi_S \,\|\, \pi_T)` over whole sequences (the score-function
    gradient with causality: a token's choice does not change the terms before it); γ = 0
    keeps each token's own term, a biased but lower-variance estimate (Lu and Thinking
    Machines Lab 2025, *On-Policy Distillation*). ``-g_t`` averaged over the tokens is the
    k1 estimate of the per-token reverse KL (the ``distill/reverse_kl`` metric).

    Args:
        student_logprobs: ``[N, T]`` log-probs of the sampled tokens under the student that
            sampled them (the rollout's).
        teacher_logprobs: ``[N, T]`` log-probs of the same tokens under the teacher, at the
            same temperature.
        response_mask: ``[N, T]`` the response tokens trained on (a tool's result is 0).
        discount: γ in [0, 1].

    Returns:
        ``[N, T]`` advantages, 0 outside the mask, without a gradient.
    """
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"student and teacher log-probs differ in shape: {tuple(student_logprobs.shape)} "
            f"vs {tuple(teacher_logprobs.shape)}"
        )
    gap = (teacher_logprobs.detach() - student_logprobs.detach()) * response_mask
    if discount == 0.0:
        return gap
    advantages, _ = gae_advantages(gap, torch.zeros_like(gap), response_mask, gamma=discount)
    return advantages


def reverse_kl_estimate(
    student_logprobs: Tensor, teacher_logprobs: Tensor, response_mask: Tensor
) -> float:
    """The mean over the response tokens of log π_S − log π_T of the student's samples: the
    k1 estimate of the per-token KL(π_S ‖ π_T) (0 when there are no tokens)."""
    tokens = float(response_mask.sum())
    if not tokens:
        return 0.0
    return float(((student_logprobs - teacher_logprobs) * response_mask).sum()) / tokens
