"""PRIME's implicit-PRM formulas, against values worked by hand or the paper's sums written
as loops."""

import math

import pytest
import torch

from rlvr.algorithms.implicit_prm import (
    implicit_prm_loss,
    implicit_process_rewards,
    pairwise_accuracy,
    prime_advantages,
    scale_by_largest_return,
)


def test_process_rewards_are_the_scaled_log_ratio_on_response_tokens():
    prm = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards = implicit_process_rewards(prm, ref, mask, beta=0.1)
    assert rewards.flatten().tolist() == pytest.approx([0.05, -0.1, 0.0])


def test_loss_is_the_cross_entropy_of_the_summed_reward():
    """Eq. 4 by hand: r(y) = 0.5 · (0.4 + 1.6) = 1 for the first sample, 0.5 · (−1) = −0.5
    for the second; the padding's ratio (9.0) is not counted."""
    prm = torch.tensor([[0.4, 1.6, 9.0], [-1.0, 0.0, 0.0]])
    ref = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])

    def sigmoid(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    loss = implicit_prm_loss(prm, ref, mask, torch.tensor([1.0, 0.0]), beta=0.5)
    assert loss.tolist() == pytest.approx([-math.log(sigmoid(1)), -math.log(1 - sigmoid(-0.5))])
    flipped = implicit_prm_loss(prm, ref, mask, torch.tensor([0.0, 1.0]), beta=0.5)
    assert flipped.tolist() == pytest.approx([-math.log(1 - sigmoid(1)), -math.log(sigmoid(-0.5))])


def test_scaling_divides_by_the_largest_absolute_return():
    rewards = torch.tensor([[1.0, -3.0, 1.0], [2.0, 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # returns: [-1, -2, 1] and [2, 0, 0] (the 5 is padding): the largest |return| is 2
    scaled = scale_by_largest_return(rewards, mask, epsilon=0.0)
    assert scaled.flatten().tolist() == pytest.approx([0.5, -1.5, 0.5, 1.0, 0.0, 0.0])


def paper_advantages(process, outcome, lengths, groups, wp, wo):
    """Eq. 5 as loops: A_t^i = wp Σ_{s≥t} [r_s^i − mean_{j≠i} (Σ_s r_s^j / |y^j|)]
    + wo (r_o^i − mean_{j≠i} r_o^j), then whitened over the tokens (unbiased std)."""
    n = len(lengths)
    token_mean = [sum(process[j][: lengths[j]]) / lengths[j] for j in range(n)]
    raw = []
    for i in range(n):
        others = [j for j in range(n) if groups[j] == groups[i] and j != i]
        base = sum(token_mean[j] for j in others) / len(others)
        outcome_term = outcome[i] - sum(outcome[j] for j in others) / len(others)
        raw.append(
            [
                wp * sum(process[i][s] - base for s in range(t, lengths[i])) + wo * outcome_term
                for t in range(lengths[i])
            ]
        )
    flat = [a for row in raw for a in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((a - mean) ** 2 for a in flat) / (len(flat) - 1))
    return [[(a - mean) / std for a in row] for row in raw]


def test_prime_advantages_follow_the_papers_sums():
    process = [[0.3, -0.1, 0.2], [0.1, 0.0, 0.0], [-0.2, 0.4, 0.0], [0.5, 0.1, -0.3]]
    lengths = [3, 1, 2, 3]
    outcome = [1.0, 0.0, 1.0, 1.0]
    groups = [0, 0, 1, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in lengths])
    got = prime_advantages(
        torch.tensor(process) * mask,
        torch.tensor(outcome),
        mask,
        torch.tensor(groups),
        process_coef=2.0,
        outcome_coef=5.0,
    )
    expected = paper_advantages(process, outcome, lengths, groups, 2.0, 5.0)
    for i, n in enumerate(lengths):
        assert got[i, :n].tolist() == pytest.approx(expected[i], abs=1e-6)
        assert got[i, n:].abs().sum() == 0


def test_prime_advantages_of_equal_outcomes_come_from_the_process_rewards_alone():
    """A group whose outcomes agree gets no outcome signal; its tokens are still ranked by
    the process rewards (PRIME's dense signal)."""
    mask = torch.ones(2, 2)
    process = torch.tensor([[0.2, 0.2], [-0.2, -0.2]])
    got = prime_advantages(process, torch.ones(2), mask, torch.zeros(2, dtype=torch.long), 1.0, 5.0)
    assert bool((got[0] > 0).all()) and bool((got[1] < 0).all())
    assert got[0, 0] > got[0, 1]  # the first token's return sums both of its tokens


def test_pairwise_accuracy_counts_same_prompt_pairs_with_different_labels():
    scores = torch.tensor([0.9, 0.1, 0.5, 0.7, 0.2, 0.3])
    labels = torch.tensor([1, 0, 0, 1, 0, 1])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    # group 0: (0 over 1) right, (0 over 2) right; group 1: (3 over 4) right; group 2: none
    assert pairwise_accuracy(scores, labels, groups) == pytest.approx(1.0)
    assert pairwise_accuracy(-scores, labels, groups) == pytest.approx(0.0)
    assert pairwise_accuracy(torch.tensor([0.1, 0.2, 0.0]), labels[:3], groups[:3]) == 0.5
    assert pairwise_accuracy(scores[:2], torch.ones(2), groups[:2]) is None
    tie = torch.tensor([0.5, 0.5])
    assert pairwise_accuracy(tie, torch.tensor([1, 0]), torch.zeros(2)) == 0.0  # not ranked
