"""Sample filters: which sequences of a rollout the policy update trains on.

Everything here returns a mask; the training loop applies it (drops samples, or zeroes the
``response_mask`` rows of the ones it keeps in the batch). Nothing here changes rewards; for the
reward-side alternatives (soft overlong penalty, truncation reward) see ``shaping.py``.

How this code departs from the papers:

- Groups are given by arbitrary integer ids (not necessarily contiguous, sorted or of equal
  size) and handled vectorised with ``unique``/``scatter_reduce``: no Python loop over groups.
- "Informative" is "the group's rewards are not all equal", which for 0/1 rewards is exactly
  DAPO's 0 < |{o_i correct}| < G and extends it to shaped, non-binary rewards. A group of one
  is never informative (its group-relative advantage is 0).
- DAPO's dynamic sampling keeps sampling until the batch is full. ``DynamicSampling`` also stops
  after ``max_rounds`` rounds (verl's ``max_num_gen_batches``), so a task that is too easy or too
  hard cannot stall training; the loop then trains on the (smaller) batch it has.
- GFPO's samples outside the retained set are dropped from the update rather than kept with a
  zero advantage (as TRL's ``GFPOTrainer`` does): no forward or backward pass is spent on
  them, and a token-level loss is normalised over the retained tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.algorithms.groups import check_grouped, constant_groups
from rlvr.algorithms.registry import Registry


def informative_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """True for each sample whose group's rewards are not all equal (DAPO dynamic sampling).

    DAPO (Yu et al. 2025, arXiv:2503.14476), eq. (11), constrains every prompt in the batch to

        0 < |{o_i | is_equivalent(a, o_i)}| < G,

    i.e. drops groups whose G samples are all correct or all wrong: their group-relative
    advantages are all zero, so they add no gradient but dilute the batch. Here a group is
    kept when ``max(r) != min(r)`` over its samples, which is the same test for 0/1 rewards.

    Args:
        rewards: ``[N]`` scalar reward of each sequence.
        group_ids: ``[N]`` integer id of the prompt group of each sequence (any values, any
            order).

    Returns:
        ``[N]`` bool, True where the sample's group has at least two distinct rewards. A
        singleton group is False.
    """
    check_grouped(rewards, group_ids)
    return ~constant_groups(rewards, group_ids)


class DynamicSampling:
    """DAPO dynamic sampling as a filter object, so the RL loop never forks for it.

    Collect rounds of rollouts until ``target_groups`` informative groups (see
    :func:`informative_groups`) have been accepted::

        sampler = DynamicSampling(target_groups=prompts_per_step, max_rounds=4)
        while not sampler.full:
            rollout = generate(next_prompts())
            keep = sampler.add(rollout.rewards, rollout.group_ids)   # [N] bool
            batch.extend(rollout[keep])

    Whole groups only: a group is accepted with all its samples or not at all. When a round
    offers more informative groups than are still needed, they are accepted in the order of
    their first sample in the round, up to the target, and the rest are dropped.

    After ``max_rounds`` rounds ``full`` is True even if fewer than ``target_groups`` groups
    were accepted: the loop then trains on the smaller batch it has (and should log
    ``accepted`` against ``target_groups``), rather than sampling forever on a task the policy
    always or never solves.

    ``quota`` (``target_groups`` by default) is how many accepted groups make it ``full``:
    GPG's β_th stops sampling at ⌈β_th · target_groups⌉ (:func:`top_up_with_constant_groups`
    then fills the step), while still accepting informative groups up to ``target_groups``.

    Groups are identified within a round: ids may repeat from one round to the next.
    """

    def __init__(self, target_groups: int, max_rounds: int, quota: int | None = None) -> None:
        quota = target_groups if quota is None else quota
        for name, value in (
            ("target_groups", target_groups),
            ("max_rounds", max_rounds),
            ("quota", quota),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if quota > target_groups:
            raise ValueError(f"quota {quota} must be at most target_groups {target_groups}")
        self.target_groups = target_groups
        self.max_rounds = max_rounds
        self.quota = quota
        self._accepted = 0
        self._rounds = 0

    @property
    def full(self) -> bool:
        """True once ``quota`` groups are accepted or ``max_rounds`` rounds added."""
        return self._accepted >= self.quota or self._rounds >= self.max_rounds

    @property
    def rounds(self) -> int:
        """Number of rounds passed to :meth:`add` so far."""
        return self._rounds

    @property
    def accepted(self) -> int:
        """Number of groups accepted so far (≤ ``target_groups``)."""
        return self._accepted

    def add(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        """Offer one round of rollouts; return the ``[N]`` bool mask of samples to keep.

        Raises:
            RuntimeError: if called once ``full`` is True (the loop should have stopped).
        """
        if self.full:
            raise RuntimeError(
                f"DynamicSampling is full ({self._accepted}/{self.target_groups} groups after "
                f"{self._rounds}/{self.max_rounds} rounds); start a new one for the next step"
            )
        keep = informative_groups(rewards, group_ids)
        self._rounds += 1
        if not bool(keep.any()):
            return keep
        _, inverse = torch.unique(group_ids, return_inverse=True)
        num_groups = int(inverse.max()) + 1
        positions = torch.arange(inverse.numel(), device=inverse.device)
        first = torch.full((num_groups,), inverse.numel(), device=inverse.device)
        first = first.scatter_reduce(0, inverse, positions, reduce="amin")
        group_informative = torch.zeros(num_groups, dtype=torch.bool, device=inverse.device)
        group_informative[inverse[keep]] = True
        # informative groups in order of first appearance; accept the first `room` of them
        candidates = torch.nonzero(group_informative).squeeze(1)
        candidates = candidates[torch.argsort(first[candidates])]
        room = self.target_groups - self._accepted
        accepted = torch.zeros(num_groups, dtype=torch.bool, device=inverse.device)
        accepted[candidates[:room]] = True
        self._accepted += int(min(room, candidates.numel()))
        return accepted[inverse]


def informative_quota(fraction: float, target_groups: int) -> int:
    """⌈fraction · target_groups⌉ groups, at least 1: GPG's β_th as a count (a product such as
    0.6 · 5 = 3.0000000000000004 counts as 3)."""
    return max(1, math.ceil(round(fraction * target_groups, 9)))


def top_up_with_constant_groups(
    rounds: list[tuple[Tensor, Tensor, Tensor]], target_groups: int
) -> list[Tensor]:
    """Each round's samples to train on under GPG's β_th: its accepted informative groups, and
    the constant groups first sampled, in sampling order, until the step holds
    ``target_groups`` groups.

    GPG (Chu et al. 2025, arXiv:2504.02546, the authors' trainer's ``min_inverse_alpha``)
    samples again while fewer than β_th of a batch's B groups have rewards that differ, keeps
    the informative groups of every round and fills the rest of the B groups with constant
    ones, so that the batch keeps its size and α = B / (B − M) (:func:`gpg_advantages`) stays
    at most 1 / β_th. When the first round already has enough, it is the whole step, as
    without the threshold.

    Args:
        rounds: per round ``(rewards [N], group_ids [N], accepted [N] bool)``, ``accepted``
            being :meth:`DynamicSampling.add`'s mask; a round's groups appear in the order of
            their ids.
        target_groups: B, the groups a step trains on.

    Returns:
        per round, the ``[N]`` bool mask of its samples in the step.
    """
    need = target_groups - sum(len(ids[accepted].unique()) for _, ids, accepted in rounds)
    masks = []
    for rewards, ids, accepted in rounds:
        constant = ids[constant_groups(rewards, ids)].unique()[: max(need, 0)]
        need -= len(constant)
        masks.append(accepted | torch.isin(ids, constant))
    return masks


def overlong_mask(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the ``response_mask`` rows of truncated responses (overlong filtering).

    DAPO (Yu et al. 2025, arXiv:2503.14476, §3.4 "Overlong Filtering") and AceReason-Nemotron
    (Chen et al. 2025, arXiv:2505.16400) mask the loss of responses cut off at the generation
    limit: a truncated reasoning chain gets a low reward for its length, not its reasoning, and
    training on it is noise. The samples stay in the batch (their rewards still count in their
    group's statistics); they only contribute no tokens to the loss.

    Args:
        response_mask: ``[N, T]`` mask of response tokens (any dtype).
        truncated: ``[N]`` bool, True where the response hit the length limit without EOS.

    Returns:
        ``[N, T]`` the mask, same dtype, with the rows of truncated responses set to 0.
    """
    if response_mask.ndim != 2:
        raise ValueError(
            f"response_mask must be 2-D [N, T], got shape {tuple(response_mask.shape)}"
        )
    if truncated.shape != response_mask.shape[:1]:
        raise ValueError(
            f"truncated shape {tuple(truncated.shape)} must be [N] = ({response_mask.shape[0]},)"
        )
    if truncated.dtype != torch.bool:
        raise ValueError(f"truncated must be a bool tensor, got {truncated.dtype}")
    return torch.where(truncated[:, None], torch.zeros_like(response_mask), response_mask)


GROUP_FILTER_SCORES: Registry = Registry("group filter score")
"""`algorithm.group_filter.by`, the score GFPO ranks a group's samples by (highest kept):
``fn(rewards[N], lengths[N]) -> scores[N]``."""


@GROUP_FILTER_SCORES.register("length")
def shortest(rewards: Tensor, lengths: Tensor) -> Tensor:
    """GFPO's length score: −|o_i|, so the shortest responses rank first (Shrivastava et al.
    2025, arXiv:2508.09726)."""
    return -lengths.to(torch.float64)


@GROUP_FILTER_SCORES.register("token_efficiency")
def token_efficiency(rewards: Tensor, lengths: Tensor) -> Tensor:
    """GFPO's token-efficiency score R(q, o_i) / |o_i|, the reward per response token
    (Shrivastava et al. 2025, arXiv:2508.09726). A response of no tokens counts as one."""
    return rewards.to(torch.float64) / lengths.clamp(min=1).to(torch.float64)


@GROUP_FILTER_SCORES.register("first")
def first_sampled(rewards: Tensor, lengths: Tensor) -> Tensor:
    """No preference: every sample scores 0, so each group keeps its first k samples (ties go
    to the earlier one). TTRL's downsampling: the rewards vote over all the samples of a
    prompt, and the first of them are trained on (Zuo et al. 2025, arXiv:2504.16084)."""
    return torch.zeros(rewards.shape, dtype=torch.float64, device=rewards.device)


def top_k_per_group(scores: Tensor, group_ids: Tensor, k: int) -> Tensor:
    """[N] bool: the ``k`` best samples of each group, GFPO's retained set S (Group Filtered
    Policy Optimization, Shrivastava et al. 2025, arXiv:2508.09726).

    GFPO samples G responses a prompt, ranks them by a score (:data:`GROUP_FILTER_SCORES`) and
    trains on the top k only: the group statistics of the advantages are taken over S,

        Â_i = (R_i − mean_{j∈S} R_j) / std_{j∈S} R_j   for i ∈ S,   and 0 outside S,

    so the loop drops the samples outside S and computes the advantages of the rest as usual.
    Ties go to the earlier sample (the samples of a group are drawn independently, so this is
    a uniform choice among them; a tie-break by length would bias which wrong answers of equal
    token efficiency are penalised). A group of k or fewer keeps all its samples.

    Args:
        scores: ``[N]`` the ranking score of each sample (higher is better).
        group_ids: ``[N]`` integer group id of each sample (any values, any order).
        k: samples kept per group, ≥ 1.
    """
    check_grouped(scores, group_ids)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=scores.device)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    order = torch.argsort(-scores, stable=True)
    order = order[torch.argsort(inverse[order], stable=True)]
    sizes = torch.bincount(inverse)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device) - starts[inverse[order]]
    return rank < k
