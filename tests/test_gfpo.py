"""GFPO (Group Filtered Policy Optimization): the retained set against hand-worked and brute-force
rankings, its refusals, and an RL run that trains on exactly the k shortest of each group."""

import math

import pytest
import torch

from rlvr.algorithms.filters import (
    GROUP_FILTER_SCORES,
    first_sampled,
    shortest,
    token_efficiency,
    top_k_per_group,
)
from rlvr.config import ConfigError, resolve_config
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import check_choices, train
from tiny_run import TINY_RUN


def test_scores_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, -1.0])
    lengths = torch.tensor([10, 3, 4, 0])
    assert shortest(rewards, lengths).tolist() == [-10.0, -3.0, -4.0, 0.0]
    # reward per token; a response of no tokens counts as one
    assert token_efficiency(rewards, lengths).tolist() == [0.1, 0.0, 0.25, -1.0]
    assert first_sampled(rewards, lengths).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert GROUP_FILTER_SCORES.names() == ["first", "length", "token_efficiency"]
    ids = torch.tensor([3, 1, 3, 3, 1, 1])  # each group keeps its first two samples
    keep = top_k_per_group(first_sampled(torch.rand(6), torch.arange(6)), ids, 2)
    assert keep.tolist() == [True, True, True, False, True, False]


def test_top_k_by_hand_with_ties_and_unsorted_ids():
    # group 5: lengths 10, 3, 5, 7 -> the two shortest are positions 2 and 4
    # group -1: lengths 4, 4, 9, 2 -> 2 first (position 7), then the tie of 4s goes to the
    # earlier sample (position 1)
    ids = torch.tensor([5, -1, 5, -1, 5, -1, 5, -1])
    lengths = torch.tensor([10, 4, 3, 4, 5, 9, 7, 2])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    keep = top_k_per_group(shortest(rewards, lengths), ids, 2)
    assert keep.tolist() == [False, True, True, False, True, False, False, True]
    # by reward per token: group 5 has 0.1, 0, 0.2, 0.143 -> positions 4 and 6; group -1 has
    # 0, 0, 0.111, 0 -> position 5, then the zero ties go to the earliest (position 1), not to
    # the shortest (position 7): a length tie-break would only ever penalise short wrong answers
    keep = top_k_per_group(token_efficiency(rewards, lengths), ids, 2)
    assert keep.tolist() == [False, True, False, False, True, True, True, False]
    # a group of k or fewer keeps all its samples
    assert top_k_per_group(torch.zeros(3), torch.tensor([0, 0, 1]), 2).all()
    assert top_k_per_group(torch.tensor([0.5]), torch.tensor([7]), 1).tolist() == [True]


def test_top_k_matches_a_sort_of_each_group():
    generator = torch.Generator().manual_seed(0)
    for trial in range(50):
        n = int(torch.randint(1, 40, (1,), generator=generator))
        ids = torch.randint(-3, 5, (n,), generator=generator)
        lengths = torch.randint(1, 6, (n,), generator=generator)
        rewards = torch.randint(0, 3, (n,), generator=generator).float()
        k = int(torch.randint(1, 5, (1,), generator=generator))
        scores = token_efficiency(rewards, lengths)
        keep = top_k_per_group(scores, ids, k)
        expected = torch.zeros(n, dtype=torch.bool)
        for g in ids.unique().tolist():
            members = [i for i in range(n) if ids[i] == g]
            members.sort(key=lambda i: (-float(scores[i]), i))
            expected[members[:k]] = True
        assert torch.equal(keep, expected), trial


def test_top_k_refuses_bad_input():
    ids = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="k must be at least 1"):
        top_k_per_group(torch.zeros(2), ids, 0)
    with pytest.raises(ValueError, match="group_ids shape"):
        top_k_per_group(torch.zeros(3), ids, 1)
    with pytest.raises(ValueError, match="integer tensor"):
        top_k_per_group(torch.zeros(2), torch.zeros(2), 1)
    assert top_k_per_group(torch.zeros(0), torch.zeros(0, dtype=torch.long), 1).numel() == 0


def test_the_config_refuses_what_gfpo_cannot_do():
    check_choices(resolve_config(preset="gfpo"))
    with pytest.raises(ConfigError, match=r"group_filter\.keep=16 keeps every one of .*=16"):
        check_choices(resolve_config(preset="gfpo", overrides=["algorithm.group_filter.keep=16"]))
    with pytest.raises(ConfigError, match=r"group_filter\.keep=1 would train nothing; keep at"):
        check_choices(resolve_config(preset="gfpo", overrides=["algorithm.group_filter.keep=1"]))
    with pytest.raises(ConfigError, match=r"algorithm\.group_filter\.by: .*'lenght'.*'length'"):
        check_choices(resolve_config(preset="gfpo", overrides=["algorithm.group_filter.by=lenght"]))
    # PKPO's k is compared with the retained group, not the sampled one
    pass_k = ["algorithm.advantage=pass_at_k", "algorithm.pass_k=8"]
    with pytest.raises(ConfigError, match=r"pass_k=8: .*group_filter\.keep - 1 = 7"):
        check_choices(resolve_config(preset="gfpo", overrides=pass_k))
    # without GFPO, a filter setting that is off is not looked at
    check_choices(resolve_config(overrides=["algorithm.group_filter.by=lenght"]))


def test_a_gfpo_run_trains_on_the_k_shortest_with_their_own_statistics(tmp_path):
    seen = []

    def record(batch):
        seen.append(batch)
        return batch

    cfg = resolve_config(
        preset="gfpo",
        overrides=[
            *TINY_RUN,
            "rollout.samples_per_prompt=6",
            "algorithm.group_filter.keep=2",
            "train.steps=3",
            f"train.output_dir={tmp_path}",
        ],
    )
    metrics = read_jsonl(train(cfg, filters=(record,), show_progress=False) / "metrics.jsonl")
    lengths_seen = 0
    for batch, m in zip(seen, metrics, strict=True):
        assert m["trained_samples"] == 3 * 2 == len(batch)
        assert [int((batch.group_ids == g).sum()) for g in batch.group_ids.unique()] == [2, 2, 2]
        assert m["response_length/trained"] == pytest.approx(sum(batch.lengths) / 6)
        assert m["response_length/trained"] <= m["response_length/mean"]
        lengths_seen += m["response_length/trained"] < m["response_length/mean"]
        # the z-scores of two samples are ±1/√2 (unbiased std) or 0; over all six they would not be
        per_sample = batch.advantages.sum(1) / batch.response_mask.sum(1).clamp(min=1)
        for g in batch.group_ids.unique():
            pair = per_sample[batch.group_ids == g]
            rewards = batch.rewards[batch.group_ids == g]
            expected = 0.0 if rewards[0] == rewards[1] else 1 / math.sqrt(2)
            assert pair.abs().tolist() == pytest.approx([expected, expected], abs=1e-4)
    assert lengths_seen  # the filter chose something shorter than the average at least once
