"""TTRL's label-free reward: each group's majority answer stands in for the gold answer.

For the G completions of one prompt, the extracted final answers (normalised by
`normalize_answer`) vote as maj@k votes (`majority_label`: ties go to the answer given first,
a completion without an answer does not vote); the winner becomes the group's pseudo-label,
and each completion scores 1 when the verifier finds its answer equal to that label, else 0
(Zuo et al. 2025, *TTRL: Test-Time Reinforcement Learning*, arXiv:2504.16084: label
estimation by majority voting, then the rule-based reward against the estimate). A group in
which no completion has an answer scores 0 throughout.

EMPO (Zhang et al. 2025, *Right Question is Already Half the Answer: Fully Unsupervised LLM
Reasoning Incentivization*, arXiv:2504.05812) rewards each completion with the probability of
its semantic cluster instead, the share of its group that gave the same answer
(``score="share"``; 0 without an answer): minimising the group's semantic entropy. Here
the clusters are the vote's, answers equal after `normalize_answer`.

The vote is over every sample of the prompt. The authors' code can train on only the first
of them (``n_votes_per_prompt`` above ``n_samples_per_prompt``): here that is the group
filter, which runs after the rewards, ``algorithm.group_filter.keep=K`` with
``algorithm.group_filter.by=first``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlvr.evaluation.metrics import majority_label
from rlvr.rewards.extract import extract_answer
from rlvr.rewards.verify import VerifierError, VerifierTimeout, normalize_answer


@dataclass
class MajorityVote:
    """The rewards of a batch under the majority vote (TTRL's or EMPO's), and what the vote
    decided."""

    rewards: list[float]
    labels: dict[int, str | None]
    """Each group's pseudo-label (None: no completion in it gave an answer)."""
    agreement: dict[int, float]
    """Each group's share of completions that gave the pseudo-label (TTRL's majority ratio)."""
    errors: list[str] = field(default_factory=list)
    """Comparisons the verifier could not decide (those completions scored 0)."""
    timeouts: int = 0


def majority_vote_rewards(
    completions: Sequence[str],
    group_ids: Sequence[int],
    matches: Callable[[str, str], bool],
    score: str = "majority",
) -> MajorityVote:
    """The reward of each completion, from the extracted answers (`extract_answer`'s),
    normalised (`normalize_answer`) for the vote. ``majority`` (TTRL): 1.0 when `matches(its
    answer, its group's majority answer)`, else 0.0; an answer identical to the label scores 1
    without a call to `matches`. ``share`` (EMPO): the share of its group that gave the same
    answer (0 without one), with no call to `matches`."""
    if score not in ("majority", "share"):
        raise ValueError(f"unknown score {score!r}; choose majority or share")
    answers = [extract_answer(c) for c in completions]
    keys = [None if a is None else normalize_answer(a) for a in answers]
    members: dict[int, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(int(group), []).append(index)
    vote = MajorityVote([0.0] * len(completions), {}, {})
    for group, rows in members.items():
        counts = Counter(keys[i] for i in rows if keys[i] is not None)
        label = majority_label([keys[i] for i in rows])
        vote.labels[group] = label
        vote.agreement[group] = counts[label] / len(rows) if label is not None else 0.0
        for i in rows:
            if keys[i] is None:
                continue
            if score == "share":
                vote.rewards[i] = counts[keys[i]] / len(rows)
                continue
            try:
                right = keys[i] == label or matches(answers[i], label)
            except VerifierTimeout:
                vote.timeouts += 1
                continue
            except VerifierError as exc:
                vote.errors.append(f"majority_vote: {type(exc).__name__}: {exc}")
                continue
            vote.rewards[i] = float(right)
    return vote
