"""Prioritised prompt sampling (Kimi k1.5): the draw distribution, its state, and the RL loop
feeding it each problem's pass rate."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from rlvr.algorithms.groups import group_pass_rates
from rlvr.config import resolve_config
from rlvr.data.sampler import EpochSampler, PrioritizedSampler, build_sampler
from rlvr.data.tasks import load_task
from rlvr.training import rl
from tiny_run import TINY_RUN

RATES = {0: 0.0, 1: 0.5, 2: 1.0, 3: 0.75}  # priorities 1, 0.5, 0, 0.25 (sum 1.75)


def sampler_with(rates, seed=0, min_priority=0.0):
    sampler = PrioritizedSampler(len(rates), seed, min_priority)
    sampler.observe(list(rates), list(rates.values()))
    return sampler


def test_single_draws_follow_one_minus_the_pass_rate():
    sampler = sampler_with(RATES)
    counts = Counter(sampler.next(1)[0] for _ in range(20000))
    expected = {0: 1 / 1.75, 1: 0.5 / 1.75, 2: 0.0, 3: 0.25 / 1.75}  # 0.571, 0.286, 0, 0.143
    for i, p in expected.items():
        assert counts[i] / 20000 == pytest.approx(p, abs=0.015), (i, counts)
    assert counts[2] == 0  # solved every time: never drawn again (the paper's rule)


def test_pairs_follow_successive_sampling_without_replacement():
    """P({i, j}) = w_i/W · w_j/(W − w_i) + w_j/W · w_i/(W − w_j)."""
    sampler = sampler_with(RATES, seed=1)
    counts = Counter(frozenset(sampler.next(2)) for _ in range(20000))
    w = {0: 1.0, 1: 0.5, 3: 0.25}
    total = sum(w.values())
    for i, j in ((0, 1), (0, 3), (1, 3)):  # 0.6095, 0.2857, 0.1048
        p = w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j])
        assert counts[frozenset((i, j))] / 20000 == pytest.approx(p, abs=0.015), (i, j)


def test_unseen_problems_come_first_and_the_floor_brings_solved_ones_back():
    sampler = PrioritizedSampler(4, seed=0)
    sampler.observe([0, 1], [1.0, 1.0])
    assert sorted(sampler.next(2)) == [2, 3]
    # fewer problems with a priority than asked for: the rest uniformly from the others
    sampler.observe([2], [1.0])
    picks = [sampler.next(2) for _ in range(300)]
    assert all(p[0] == 3 for p in picks)
    assert {p[1] for p in picks} == {0, 1, 2}
    floored = sampler_with(RATES, min_priority=0.2)
    assert floored.priorities()[2:].tolist() == [0.2, 0.25]
    counts = Counter(floored.next(1)[0] for _ in range(20000))
    assert counts[2] / 20000 == pytest.approx(0.2 / 1.95, abs=0.015)


def test_a_step_larger_than_the_task_draws_it_again():
    sampler = sampler_with(RATES, seed=2)
    drawn = sampler.next(7)  # 3 problems have a priority: 3 + 1 uniform, then 3 again
    assert len(drawn) == 7
    assert sorted(drawn[:4]) == [0, 1, 2, 3] and sorted(drawn[4:]) == [0, 1, 3]


def test_state_round_trip_draws_the_same_problems():
    sampler = sampler_with(RATES, seed=5)
    sampler.next(3)
    state = sampler.state_dict()
    expected = [sampler.next(2) for _ in range(5)]
    resumed = PrioritizedSampler(4, seed=99)
    resumed.load_state_dict(state)
    assert [resumed.next(2) for _ in range(5)] == expected
    assert resumed.stats() == {"sampler/seen": 1.0, "sampler/solved": 0.25}


def test_bad_input_is_refused():
    sampler = PrioritizedSampler(3, seed=0)
    with pytest.raises(ValueError, match="2 problems but 1 pass rates"):
        sampler.observe([0, 1], [0.5])
    with pytest.raises(ValueError, match=r"pass rate 1\.5 of problem 0"):
        sampler.observe([0], [1.5])
    with pytest.raises(ValueError, match="min_priority"):
        PrioritizedSampler(3, seed=0, min_priority=2.0)
    with pytest.raises(ValueError, match=r"unknown data\.sampler 'curriculum'"):
        build_sampler("curriculum", 3, 0)
    assert isinstance(build_sampler("epoch", 3, 0), EpochSampler)


def test_the_sequential_sampler_keeps_the_task_order_and_resumes():
    """`data.sampler=sequential`: 0..4 in order each epoch, across the epoch boundary, and a
    restored state goes on where it stopped; `epoch` draws another order."""
    sampler = build_sampler("sequential", 5, seed=7)
    assert sampler.next(3) == [0, 1, 2] and sampler.next(4) == [3, 4, 0, 1]
    state = sampler.state_dict()
    again = build_sampler("sequential", 5, seed=0)
    again.load_state_dict(state)
    assert again.next(4) == sampler.next(4) == [2, 3, 4, 0]
    assert build_sampler("epoch", 5, seed=7).next(5) != [0, 1, 2, 3, 4]


def test_group_pass_rates_by_hand():
    correct = torch.tensor([True, False, True, True, False, False])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert group_pass_rates(correct, groups, 3) == [0.5, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"groups \[3\] have no sample"):
        group_pass_rates(correct, groups, 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
        group_pass_rates(correct, groups, 2)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got \[-1, -1, 0"):
        group_pass_rates(correct, groups - 1, 3)
    assert (
        group_pass_rates(torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long), 0)
        == []
    )


def first_digit_even(prompts, completions, **columns):
    """Scores a sample by its problem alone: 1 when the question's first number starts with an
    even digit, so each problem's pass rate is 0 or 1 whatever the policy writes."""
    return [float(int(re.search(r"What is (\d)", p).group(1)) % 2 == 0) for p in prompts]


def drawn_questions(tmp_path, monkeypatch, sampler):
    """The questions each step of a 6-step run drew (every sample is logged)."""
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "data.train_size=8",
            "rollout.prompts_per_step=3",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=4",
            "train.steps=6",
            "train.log_samples=6",
            f"data.sampler={sampler}",
            f"train.output_dir={tmp_path / sampler}",
        ],
    )
    task = load_task(cfg.data)
    task.reward = "test_data_sampler:first_digit_even"
    monkeypatch.setattr(rl, "load_task", lambda data: task)
    run_dir = rl.train(cfg, show_progress=False)
    steps: dict[int, set[str]] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "prompt" in record:
            question = re.search(r"What is [^?]*\?", record["prompt"]).group(0)
            steps.setdefault(record["step"], set()).add(question)
    metrics = [json.loads(m) for m in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return steps, metrics


def test_a_sequential_run_draws_the_task_in_its_order(tmp_path, monkeypatch):
    """Six steps of three over eight problems: 0-2, 3-5, 6, 7, 0, ... as the task lists them."""
    steps, _ = drawn_questions(tmp_path, monkeypatch, "sequential")
    cfg = resolve_config(preset="grpo", overrides=[*TINY_RUN, "data.train_size=8"])
    questions = [
        re.search(r"What is [^?]*\?", p.question).group(0) for p in load_task(cfg.data).train
    ]
    assert steps == {k + 1: {questions[(3 * k + i) % 8] for i in range(3)} for k in range(6)}


def test_the_loop_stops_drawing_problems_it_always_solves(tmp_path, monkeypatch):
    steps, metrics = drawn_questions(tmp_path, monkeypatch, "prioritized")
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and all(len(q) == 3 for q in steps.values())
    appearances = Counter(q for qs in steps.values() for q in qs)
    solved = {q for q in appearances if first_digit_even([q], [""])[0] == 1.0}
    failed = set(appearances) - solved
    assert solved and failed
    assert all(appearances[q] == 1 for q in solved), appearances  # once seen solved, never again
    assert max(appearances[q] for q in failed) >= 3
    assert metrics[-1]["sampler/solved"] == len(solved) / 8
    assert metrics[-1]["sampler/seen"] == len(appearances) / 8
    # uniform sampling over the same 8 problems draws solved ones again (18 draws, 2+ epochs)
    steps, _ = drawn_questions(tmp_path, monkeypatch, "epoch")
    appearances = Counter(q for qs in steps.values() for q in qs)
    assert max(appearances[q] for q in appearances if first_digit_even([q], [""])[0]) >= 2


def test_min_priority_one_is_accepted_and_makes_draws_uniform():
    sampler = PrioritizedSampler(3, seed=0, min_priority=1.0)
    sampler.observe([0, 1, 2], [1.0, 1.0, 0.5])
    assert sampler.priorities().tolist() == [1.0, 1.0, 1.0]


def test_a_task_of_one_problem_is_drawn_every_time_and_none_is_refused():
    """One problem is a task (every draw is it); no problem is not (an epoch of none would
    never end)."""
    assert EpochSampler(1, seed=0).next(3) == [0, 0, 0]
    assert PrioritizedSampler(1, seed=0).next(2) == [0, 0]
    for sampler in (EpochSampler, PrioritizedSampler):
        with pytest.raises(ValueError, match="the task has no training problems"):
            sampler(0, seed=0)


def test_the_epoch_sampler_saves_its_epoch_and_resumes_the_same_shuffle():
    """The state is (epoch, position): (0, 0) fresh, (0, 2) after two draws, (1, 3) after six
    more over five problems. A sampler restored at (0, 2) draws what the first one drew next,
    each epoch every problem once."""
    sampler = EpochSampler(5, seed=3)
    assert sampler.state_dict() == {"epoch": 0, "position": 0}
    first = sampler.next(2)
    assert sampler.state_dict() == {"epoch": 0, "position": 2}
    rest = sampler.next(6)
    assert sampler.state_dict() == {"epoch": 1, "position": 3}
    assert sorted(first + rest[:3]) == [0, 1, 2, 3, 4] and len(set(rest[3:])) == 3
    resumed = EpochSampler(5, seed=3)
    resumed.load_state_dict({"epoch": 0, "position": 2})
    assert resumed.next(6) == rest


def test_the_prioritized_sampler_s_default_floor_is_the_paper_s_zero():
    """`build_sampler("prioritized", ...)` without `min_priority` never draws a problem solved
    every time again."""
    sampler = build_sampler("prioritized", 3, seed=0)
    sampler.observe([0, 1, 2], [1.0, 0.5, 1.0])
    assert {sampler.next(1)[0] for _ in range(50)} == {1}


def test_a_draw_short_of_prioritised_problems_fills_up_to_its_count_exactly():
    """One problem of four has a priority: a draw of two is it and one uniform other, no more."""
    sampler = sampler_with({0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}, seed=4)
    for _ in range(20):
        drawn = sampler.next(2)
        assert len(drawn) == 2 and drawn[0] == 1 and drawn[1] in (0, 2, 3)
