"""REINFORCE baselines other than a group's mean: batch whitening and the greedy completion.

``reinforce_pp`` whitens the rewards over the whole batch (no groups), ``reinforce_pp_baseline``
whitens what is left after each group's mean, and ``remax`` subtracts the reward of the
prompt's greedy completion. They share the input checks and conventions of
:mod:`rlvr.algorithms.advantages` (float64 statistics, the result in the rewards' dtype, an
epsilon on every std, exactly 0 where there is nothing to learn).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms.advantages import (
    _batch_std,
    _check_inputs,
    _group_statistics,
    _out_dtype,
    _refuse_group_std,
    _ungrouped,
)
from rlvr.algorithms.registry import ADVANTAGES


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "batch",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""REINFORCE++: the rewards whitened over the global batch, no per-group baseline.

    .. math::

        A_i = \frac{r_i - \operatorname{mean}_{\text{batch}}(r)}
                   {\operatorname{std}_{\text{batch}}(r) + \varepsilon}

    (Hu 2025, *REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models*, arXiv:2501.03262: global advantage normalisation.) The baseline and the scale
    are those of all N sequences of the batch, never of a prompt group, so ``group_ids`` does
    not change the result (it is still checked to be an integer ``[N]`` tensor), and
    ``std_normalization`` is ignored: REINFORCE++ always divides by the batch std (the value is
    validated so that a typo still fails). The std is unbiased, as for ``"batch"`` elsewhere in
    this module. A batch whose rewards are all equal (or of one sequence) gets exactly 0.

    How this departs from the paper: REINFORCE++ whitens a token-level return
    :math:`r - \beta\sum_{s \ge t}\mathrm{KL}_s`; here the advantage is per sequence — with
    ``algorithm.kl.in_reward`` the loop subtracts the whole sequence's KL from the reward before
    calling this, and the advantage is broadcast over the sequence's tokens.
    For groups of samples use ``reinforce_pp_baseline``.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer group ids (checked, otherwise unused).
        std_normalization: validated and ignored (always the batch std).
        epsilon: added to the batch std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    r = rewards.detach().to(torch.float64)
    adv = (r - r.mean()) / (_batch_std(r) + epsilon)
    if bool(r.max() == r.min()):
        adv = torch.zeros_like(adv)
    return adv.to(_out_dtype(rewards))


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "batch",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""REINFORCE++ with baseline: group-mean baseline, then global whitening of what is left.

    .. math::

        \tilde A_i = r_i - \operatorname{mean}_{\text{group}(i)}(r), \qquad
        A_i = \frac{\tilde A_i}{\operatorname{std}_{\text{batch}}(\tilde A) + \varepsilon}

    (Hu 2025, arXiv:2501.03262, the variant for several samples per prompt.) It differs from
    ``grpo`` with ``std_normalization="batch"`` (LitePPO), which divides by the batch std of the
    raw rewards: here the std is that of the group-centred rewards, so groups whose rewards are
    all equal do not shrink the scale of the others. Such groups get exactly 0; a batch whose
    centred rewards are all 0 gets 0. ``std_normalization`` is validated and ignored.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer group ids.
        std_normalization: validated and ignored (always the batch std of the centred rewards).
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    _, _, centered, _, constant, _ = _group_statistics(rewards, group_ids)
    centered = torch.where(constant, torch.zeros_like(centered), centered)
    adv = centered / (_batch_std(centered) + epsilon)
    return adv.to(_out_dtype(rewards))


@ADVANTAGES.register("remax")
def remax_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    baselines: Tensor | None = None,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""ReMax: the baseline is the reward of the prompt's greedy completion.

    .. math::

        A_i = r(x_i, y_i) - r(x_i, \bar y_i), \qquad
        \bar y_i = \text{the argmax decoding of } \pi_\theta(\cdot \mid x_i)

    (Li et al. 2023, *ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
    for Aligning Large Language Models*, arXiv:2310.10505.) The greedy completion's reward
    depends on the prompt only, so it is a valid baseline (no bias), and it tracks what the
    policy already does best: a sample scores above 0 when it beats the greedy answer. Unlike
    the group baselines it needs no second sample (``rollout.samples_per_prompt`` may be 1);
    the price is one greedy completion per prompt, sampled and scored but not trained on.

    ``std_normalization``: ``"none"`` (the paper) or ``"batch"`` (divide by the std of all N
    rewards); ``"group"`` is refused, a group of one sample having no spread.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group (checked).
        baselines: ``[N]`` reward of the greedy completion of each sequence's prompt.
        std_normalization: ``"none"`` or ``"batch"``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    _refuse_group_std("remax", std_normalization, "has no spread to divide by with one sample")
    if baselines is None or baselines.shape != rewards.shape:
        shape = None if baselines is None else tuple(baselines.shape)
        raise ValueError(f"remax needs baselines of shape {tuple(rewards.shape)}, got {shape}")
    r = rewards.detach().to(torch.float64)
    adv = _ungrouped(r - baselines.detach().to(torch.float64), r, std_normalization, epsilon)
    return adv.to(_out_dtype(rewards))
