"""Outcome-reward advantage estimators: one scalar per sampled sequence.

Every estimator here takes the scalar rewards of N sequences and the id of the prompt group each
came from (the G samples of one prompt share an id), and returns one advantage per sequence;
the training loop broadcasts it over the sequence's response tokens. An estimator that reads
more names it as a keyword argument, and the loop passes it: ``lengths`` (each sequence's
trained tokens), ``baselines`` (the reward of its prompt's greedy completion), ``k``
(``algorithm.pass_k``), ``positive_weight`` (``algorithm.positive_weight``). The estimators
that read the rewards as a verifier's verdicts (``pass_at_k``, ``w_reinforce``) live in
:mod:`rlvr.algorithms.verdict_advantages`, and the REINFORCE baselines that are not the
group's mean (``reinforce_pp``, ``reinforce_pp_baseline``, ``remax``) in
:mod:`rlvr.algorithms.reinforce_advantages`.

How this code departs from the papers:

- Groups are given by arbitrary integer ids (not necessarily contiguous, not necessarily of
  equal size, e.g. after dynamic-sampling filters), and are handled vectorised with
  ``unique``/``index_add``: no Python loop over groups.
- Statistics are computed in float64 and the result is cast back to the rewards' float dtype.
- A group whose rewards are all equal (including a group of one) gets advantage exactly 0 in
  every mode (DESIGN rule 6): there is nothing to learn from it, and ``x - mean(x)`` is not
  always exactly zero in floating point.
- ``std_normalization`` means the same for every group-baseline estimator here (``grpo``,
  ``rloo``): ``"group"`` divides by the sample's group std (unbiased, like ``torch.std``),
  ``"batch"`` by the std of all N rewards (unbiased), ``"none"`` does not divide. An epsilon is
  added to the std before dividing. ``reinforce_pp`` has no groups and always whitens over
  the batch; it validates ``std_normalization`` and ignores it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlvr.algorithms.groups import check_grouped, constant_groups
from rlvr.algorithms.registry import ADVANTAGES

STD_NORMALIZATIONS = ("group", "batch", "none")

GROUP_BASELINES = frozenset(
    {"grpo", "rloo", "gpg", "reinforce_pp_baseline", "opo", "pass_at_k", "best_of_group", "prime"}
)
"""The estimators that compare each sample with the others of its prompt: with one sample per
prompt every advantage they give is 0 (as TRL, they need ``num_generations`` >= 2); `prime`,
PRIME's leave-one-out (`rlvr.algorithms.implicit_prm`), is one of them."""

GREEDY_BASELINES = frozenset({"remax"})
"""The estimators that take the reward of a greedy completion of each sample's prompt
(``baselines=``): the loop samples one per prompt and scores it, untrained."""


def _check_inputs(rewards: Tensor, group_ids: Tensor, std_normalization: str) -> None:
    check_grouped(rewards, group_ids)
    if std_normalization not in STD_NORMALIZATIONS:
        raise ValueError(
            f"std_normalization must be one of {', '.join(STD_NORMALIZATIONS)}; "
            f"got {std_normalization!r}"
        )


def _out_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


class GroupStatistics(NamedTuple):
    """Per-sample group statistics (`_group_statistics`), each indexed per sample (float64 but
    `constant`, bool, and `inverse`, long)."""

    r: Tensor
    """The rewards."""
    counts: Tensor
    """The size G of the sample's group."""
    centered: Tensor
    """r_i − mean_g."""
    group_var: Tensor
    """The unbiased variance of the sample's group (0 for G = 1)."""
    constant: Tensor
    """True where every reward of the group is equal."""
    inverse: Tensor
    """Each sample's group as an index 0..groups−1 (for `_group_sums`)."""


def _group_sums(values: Tensor, inverse: Tensor) -> Tensor:
    """Each sample's group total of `values` (float64), the groups given by `inverse`."""
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    totals = torch.zeros(groups, dtype=torch.float64, device=values.device)
    return totals.index_add_(0, inverse, values.to(torch.float64))[inverse]


def _group_statistics(rewards: Tensor, group_ids: Tensor) -> GroupStatistics:
    """Per-sample group statistics, vectorised over groups (`GroupStatistics`)."""
    r = rewards.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    counts = _group_sums(torch.ones_like(r), inverse)
    centered = r - _group_sums(r, inverse) / counts
    var = _group_sums(centered.square(), inverse) / (counts - 1).clamp(min=1)
    return GroupStatistics(r, counts, centered, var, constant_groups(rewards, group_ids), inverse)


def _batch_std(r: Tensor) -> Tensor:
    """Unbiased std of all rewards (0 for a batch of one)."""
    n = r.numel()
    if n < 2:
        return torch.zeros((), dtype=r.dtype, device=r.device)
    return ((r - r.mean()).square().sum() / (n - 1)).sqrt()


def _refuse_group_std(name: str, std_normalization: str, why: str) -> None:
    """The estimators without groups to normalise in (`remax`, `w_reinforce`)."""
    if std_normalization == "group":
        raise ValueError(f"{name}: std_normalization='group' {why}; use 'none' or 'batch'")


def _ungrouped(values: Tensor, r: Tensor, std_normalization: str, epsilon: float) -> Tensor:
    """`values` divided by the std of all the rewards `r` (``"batch"``), or as they are."""
    return values / (_batch_std(r) + epsilon) if std_normalization == "batch" else values


def _normalize(
    values: Tensor, r: Tensor, group_var: Tensor, std_normalization: str, epsilon: float
) -> Tensor:
    if std_normalization == "group":
        return values / (group_var.sqrt() + epsilon)
    if std_normalization == "batch":
        return values / (_batch_std(r) + epsilon)
    return values


@ADVANTAGES.register("grpo")
def group_normalized_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "group",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""Group-relative advantages of GRPO and its variants.

    .. math::

        A_i = \frac{r_i - \operatorname{mean}(\{r_j : g_j = g_i\})}{\sigma + \varepsilon}

    - ``std_normalization="group"``: σ = std of the sample's group (unbiased) — GRPO's outcome
      supervision (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300, §4.1.2).
    - ``"batch"``: σ = std of all N rewards of the batch (group mean, batch std) — LitePPO
      (Liu et al. 2025, *Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning*,
      arXiv:2508.08221), also REINFORCE++-baseline's normalisation.
    - ``"none"``: A_i = r_i − mean_group — Dr. GRPO, which removes the std term that biases
      updates towards too-easy and too-hard prompts (Liu et al. 2025, *Understanding
      R1-Zero-Like Training: A Critical Perspective*, arXiv:2503.20783, §3).

    A group whose rewards are all equal, and a group of size 1, get advantage exactly 0.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group (any values, any order).
        std_normalization: ``"group"``, ``"batch"`` or ``"none"``.
        epsilon: added to σ before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    r, _, centered, group_var, constant, _ = _group_statistics(rewards, group_ids)
    adv = _normalize(centered, r, group_var, std_normalization, epsilon)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))


def decoupled_group_advantages(
    parts: Tensor, weights: Tensor, group_ids: Tensor, *, epsilon: float = 1e-6
) -> Tensor:
    r"""GDPO's advantages for several rewards: each normalised in its group, then the sum.

    .. math::

        \hat A_i = \sum_k w_k \frac{r_{ik} - \operatorname{mean}_g(r_k)}
                    {\operatorname{std}_g(r_k) + \varepsilon},
        \qquad A_i = \frac{\hat A_i}{\operatorname{std}(\hat A) + \varepsilon}

    (Liu et al. 2026, *GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization*, arXiv:2601.05242; TRL's
    ``multi_objective_aggregation="normalize_then_sum"``), with std_g the unbiased std of the
    sample's group and std(Â) that of the batch. GRPO normalises the weighted sum, in which
    different combinations of rewards can collapse onto one advantage and a reward of wide
    spread drowns one of narrow spread; here each reward is its own GRPO advantage first.

    A reward constant in a group adds 0 there, as in ``group_normalized_advantages``. Each
    group's Â sums to 0, so the batch mean of Â is 0 and is not subtracted (TRL subtracts it,
    which leaves a rounding residue): a group in which every reward is constant keeps
    advantage exactly 0. A reward that returned None ("does not apply") enters as 0, as in the
    authors' TRL code (``nan_to_num`` before the group statistics).

    Args:
        parts: ``[N, K]`` unweighted reward k of sequence i.
        weights: ``[K]`` weight of each reward.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        epsilon: added to each std before dividing.

    Returns:
        ``[N]`` advantages, in the parts' float dtype, without a gradient.
    """
    if parts.dim() != 2 or weights.shape != (parts.shape[1],):
        raise ValueError(
            f"parts must be [N, K] and weights [K], got {tuple(parts.shape)} and "
            f"{tuple(weights.shape)}"
        )
    total = torch.zeros(parts.shape[0], dtype=torch.float64, device=parts.device)
    for k in range(parts.shape[1]):
        normalized = group_normalized_advantages(
            parts[:, k].to(torch.float64), group_ids, std_normalization="group", epsilon=epsilon
        )
        total += float(weights[k]) * normalized
    return (total / (_batch_std(total) + epsilon)).to(_out_dtype(parts))


@ADVANTAGES.register("rloo")
def rloo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""REINFORCE Leave-One-Out: the baseline of each sample is the mean of the others.

    .. math::

        A_i = r_i - \frac{1}{G-1}\sum_{j \ne i,\ g_j = g_i} r_j
            = \frac{G}{G-1}\,\bigl(r_i - \operatorname{mean}_{\text{group}}\bigr)

    (Ahmadian et al. 2024, *Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs*, arXiv:2402.14740; Kool et al. 2019, *Buy 4
    REINFORCE Samples, Get a Baseline for Free!*.) G is the size of the sample's own group, so
    unequal groups are handled; a group of size 1 has no leave-one-out baseline and gets 0, as
    does a group whose rewards are all equal.

    ``std_normalization`` is applied exactly as in :func:`group_normalized_advantages` — the
    leave-one-out advantage is divided by the group std (``"group"``), the batch std
    (``"batch"``) or left as is (``"none"``, the paper's RLOO and this function's default) —
    so the config knob never silently does nothing. Note the training loop passes the config's
    value, whose default is ``"group"``: an RLOO preset should set ``std_normalization: none``.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        std_normalization: ``"group"``, ``"batch"`` or ``"none"``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    r, counts, centered, group_var, constant, _ = _group_statistics(rewards, group_ids)
    loo = centered * counts / (counts - 1).clamp(min=1)
    adv = _normalize(loo, r, group_var, std_normalization, epsilon)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))


@ADVANTAGES.register("gpg")
def gpg_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""Group Policy Gradient's advantages: the group-centred reward, scaled up by the share
    of the batch that carries a gradient.

    .. math::

        A_i = \alpha\,\frac{r_i - \operatorname{mean}(\{r_j : g_j = g_i\})}{F_{norm}},
        \qquad \alpha = \frac{B}{B - M}

    (Chu et al. 2025, *GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning*, arXiv:2504.02546.) B is the number of samples in the batch and M the number in
    groups whose rewards are all equal, which get advantage 0. With a token-mean loss over
    the whole batch those samples still count in the denominator and shrink every gradient by
    (B − M)/B; α undoes that shrinkage ("accurate gradient estimation"). F_norm = 1 is the
    paper's choice (``std_normalization="none"``, this function's default); ``"group"`` is
    its F_norm = std variant, ``"batch"`` divides by the batch std. When every group is
    constant, every advantage is 0 and α is taken as 1. The authors' trainer (the paper's
    repository, ``adjust_gd``) divides the loss by max(1 − M/B, 0.05) instead, which caps α
    at 20; rlvr does not cap it (the two agree whenever at least 5 % of the batch learns).

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        std_normalization: ``"none"`` (F_norm = 1), ``"group"`` or ``"batch"``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    adv = group_normalized_advantages(
        rewards, group_ids, std_normalization=std_normalization, epsilon=epsilon
    )
    constant = constant_groups(rewards, group_ids)
    learning = int((~constant).sum())
    alpha = rewards.numel() / learning if learning else 1.0
    return adv * alpha


@ADVANTAGES.register("opo")
def opo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    lengths: Tensor | None = None,
    std_normalization: str = "none",
    epsilon: float = 1e-6,
) -> Tensor:
    r"""OPO: the baseline is the group's rewards weighted by the responses' lengths.

    .. math::

        b_g = \frac{\sum_{j:\,g_j = g} l_j\, r_j}{\sum_{j:\,g_j = g} l_j}, \qquad
        A_i = r_i - b_{g_i}

    (Hao et al. 2025, *On-Policy RL with Optimal Reward Baseline*, arXiv:2505.23585.) The
    baseline that minimises the variance of the policy gradient is
    :math:`\mathbb{E}[\lVert\nabla\log\pi(y)\rVert^2 r] /
    \mathbb{E}[\lVert\nabla\log\pi(y)\rVert^2]`; taking the squared gradient norm of a
    response proportional to its length :math:`l` (its tokens' gradients roughly orthogonal
    and of equal size) gives :math:`b_g`. With equal lengths it is GRPO's group mean (Dr.
    GRPO's advantage). The assumption holds for a sequence gradient that sums its tokens' —
    the ``token_mean`` and ``seq_mean_token_sum`` aggregations, not ``seq_mean_token_mean``.

    A group whose rewards are all equal, and a group of one, get exactly 0.
    ``std_normalization`` is applied as in :func:`group_normalized_advantages` (the paper's
    OPO: ``"none"``).

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of each sequence's prompt group.
        lengths: ``[N]`` number of trained tokens of each sequence (required; > 0 in every
            group with differing rewards).
        std_normalization: ``"group"``, ``"batch"`` or ``"none"``.
        epsilon: added to the std before dividing.

    Returns:
        ``[N]`` advantages, in the rewards' float dtype, without a gradient.
    """
    _check_inputs(rewards, group_ids, std_normalization)
    if lengths is None or lengths.shape != rewards.shape:
        shape = None if lengths is None else tuple(lengths.shape)
        raise ValueError(f"opo needs lengths of shape {tuple(rewards.shape)}, got {shape}")
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=_out_dtype(rewards), device=rewards.device)
    r, _, _, group_var, constant, inverse = _group_statistics(rewards, group_ids)
    length = lengths.detach().to(torch.float64)
    baseline = _group_sums(length * r, inverse) / _group_sums(length, inverse).clamp(min=1.0)
    adv = _normalize(r - baseline, r, group_var, std_normalization, epsilon)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))
