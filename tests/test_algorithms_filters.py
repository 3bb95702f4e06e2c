"""Dynamic-sampling, GPG's β_th and overlong filters against hand-worked masks, and
`collect_step`'s sampling rounds and ranks against scripted completions."""

from types import SimpleNamespace

import pytest
import torch

from rlvr.algorithms.advantages import gpg_advantages
from rlvr.algorithms.filters import (
    DynamicSampling,
    informative_groups,
    informative_quota,
    overlong_mask,
    top_up_with_constant_groups,
)
from rlvr.config import ConfigError, RLConfig, resolve_config
from rlvr.data.sampler import EpochSampler
from rlvr.data.tasks import Task, load_task
from rlvr.data.templates import encode_prompts
from rlvr.models.tiny import build_tiny_model
from rlvr.training import sampling
from rlvr.training.distributed import Ranks
from rlvr.training.rewarding import RewardScorer
from rlvr.training.rl import check_choices
from scripted_engine import TOK, Scripted

T, F = True, False


def test_informative_groups_non_contiguous_ids_and_singletons():
    # group 7: rewards {1, 0, 1} → mixed → informative
    # group -2: {0, 0} → all equal → not informative
    # groups 40 and 11: one sample each → singleton → not informative
    ids = torch.tensor([7, -2, 7, 40, -2, 7, 11])
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0, 0.0, 1.0, 2.0])
    mask = informative_groups(rewards, ids)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [T, F, T, F, F, T, F]


def test_informative_groups_shaped_rewards_and_all_equal():
    # non-binary rewards: group 3 = {0.2, 0.3} differs; group 4 = {0.1, 0.1, 0.1} does not
    ids = torch.tensor([3, 4, 3, 4, 4])
    rewards = torch.tensor([0.2, 0.1, 0.3, 0.1, 0.1], dtype=torch.float64)
    assert informative_groups(rewards, ids).tolist() == [T, F, T, F, F]
    # an all-correct batch has nothing to learn from
    assert not informative_groups(torch.ones(4), torch.tensor([0, 0, 1, 1])).any()
    # integer rewards work as well
    assert informative_groups(torch.tensor([1, 0]), torch.tensor([0, 0])).tolist() == [T, T]


def test_informative_groups_empty_and_bad_inputs():
    empty = informative_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,) and empty.dtype == torch.bool
    with pytest.raises(ValueError, match="integer"):
        informative_groups(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        informative_groups(torch.zeros(2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        informative_groups(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long))


def test_dynamic_sampling_reaches_target_over_three_rounds():
    ds = DynamicSampling(target_groups=4, max_rounds=5)
    assert not ds.full and ds.rounds == 0 and ds.accepted == 0

    # round 1: group 0 = {1, 0} yes, group 1 = {1, 1} no, group 2 = {0, 1} yes → 2 accepted
    keep = ds.add(torch.tensor([1.0, 0, 1, 1, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert keep.tolist() == [T, T, F, F, T, T]
    assert (ds.accepted, ds.rounds, ds.full) == (2, 1, False)

    # round 2: every group all-equal → nothing accepted, but the round counts
    keep = ds.add(torch.tensor([0.0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert keep.tolist() == [F, F, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (2, 2, False)

    # round 3: interleaved ids 5, 9, 3, 8 — all four informative, only 4 - 2 = 2 places left.
    # Accepted in order of first appearance (5 at position 0, 9 at 1), not by id (3 < 5),
    # each with both of its samples: group 5 = positions {0, 3}, group 9 = positions {1, 4}.
    ids = torch.tensor([5, 9, 3, 5, 9, 3, 8, 8])
    rewards = torch.tensor([1.0, 1, 0, 0, 0, 1, 1, 0])
    keep = ds.add(rewards, ids)
    assert keep.tolist() == [T, T, F, T, T, F, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (4, 3, True)

    with pytest.raises(RuntimeError, match="full"):
        ds.add(rewards, ids)


def test_dynamic_sampling_stops_at_max_rounds_short_of_target():
    ds = DynamicSampling(target_groups=3, max_rounds=2)
    # round 1: group 1 = {0, 1} informative, group 2 = {1, 1} not → 1 of 3
    keep = ds.add(torch.tensor([0.0, 1, 1, 1]), torch.tensor([1, 1, 2, 2]))
    assert keep.tolist() == [T, T, F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (1, 1, False)
    # round 2: nothing informative; max_rounds reached → full, with 1 group instead of 3
    keep = ds.add(torch.tensor([0.0, 0]), torch.tensor([1, 1]))
    assert keep.tolist() == [F, F]
    assert (ds.accepted, ds.rounds, ds.full) == (1, 2, True)
    with pytest.raises(RuntimeError):
        ds.add(torch.tensor([0.0, 1]), torch.tensor([1, 1]))


def test_dynamic_sampling_properties_are_read_only_and_args_checked():
    ds = DynamicSampling(target_groups=1, max_rounds=1)
    with pytest.raises(AttributeError):
        ds.full = True
    with pytest.raises(AttributeError):
        ds.rounds = 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            DynamicSampling(target_groups=bad, max_rounds=1)
        with pytest.raises(ValueError, match="positive int"):
            DynamicSampling(target_groups=1, max_rounds=bad)
        with pytest.raises(ValueError, match="positive int"):
            DynamicSampling(target_groups=1, max_rounds=1, quota=bad)
    with pytest.raises(ValueError, match="quota 3 must be at most target_groups 2"):
        DynamicSampling(target_groups=2, max_rounds=1, quota=3)


def test_gpg_quota_rounds_up_and_ignores_float_error():
    # 0.6 * 5 = 3.0000000000000004 in floats: 3 groups, not 4; 0.7 * 4 = 2.8 → 3
    assert [informative_quota(f, b) for f, b in [(0.6, 5), (0.7, 4), (0.5, 4), (1.0, 4)]] == [
        3,
        3,
        2,
        4,
    ]
    assert informative_quota(0.01, 4) == 1  # at least one group


def test_a_quota_stops_sampling_before_the_target_but_accepts_up_to_it():
    ds = DynamicSampling(target_groups=4, max_rounds=5, quota=3)
    # round 1: groups 0 and 2 informative → 2 < 3
    ds.add(torch.tensor([1.0, 0, 1, 1, 0, 1, 0, 0]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert (ds.accepted, ds.full) == (2, False)
    # round 2: all three informative, room for 4 - 2 = 2 of them → 4 accepted, full
    keep = ds.add(torch.tensor([1.0, 0, 0, 1, 1, 0]), torch.tensor([4, 4, 5, 5, 6, 6]))
    assert keep.tolist() == [T, T, T, T, F, F]
    assert (ds.accepted, ds.full) == (4, True)


def test_top_up_fills_the_step_with_the_first_constant_groups_in_sampling_order():
    """B = 4, quota 3. Round 1: groups 0 and 3 informative, 1 and 2 constant; round 2: 5
    informative, 4, 6 and 7 constant. 3 informative groups, so one constant group fills the
    step: group 1, the first sampled (not 4, the first of the last round)."""
    ds = DynamicSampling(target_groups=4, max_rounds=4, quota=3)
    ids1, ids2 = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.tensor([4, 4, 5, 5, 6, 6, 7, 7])
    r1 = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 1])
    r2 = torch.tensor([1.0, 1, 0, 1, 0, 0, 1, 1])
    a1 = ds.add(r1, ids1)
    a2 = ds.add(r2, ids2)
    assert ds.full and ds.accepted == 3
    m1, m2 = top_up_with_constant_groups([(r1, ids1, a1), (r2, ids2, a2)], 4)
    assert m1.tolist() == [T, T, T, T, F, F, T, T]  # groups 0, 1 (the fill) and 3
    assert m2.tolist() == [F, F, T, T, F, F, F, F]  # group 5
    # two fills needed (quota 2 reached in round 1 with groups 0 and 3): 1 and 2, the round
    # is the whole step as it was sampled
    ds = DynamicSampling(target_groups=4, max_rounds=4, quota=2)
    (m1,) = top_up_with_constant_groups([(r1, ids1, ds.add(r1, ids1))], 4)
    assert m1.all()


def test_top_up_keeps_a_short_step_when_the_rounds_run_out():
    """max_rounds reached with 1 informative group of a quota of 3: the step is that group
    and the constant ones up to B = 3, here all the round has (groups 1 and 2)."""
    ds = DynamicSampling(target_groups=3, max_rounds=1, quota=3)
    ids, rewards = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([1.0, 0, 1, 1, 0, 0])
    (mask,) = top_up_with_constant_groups([(rewards, ids, ds.add(rewards, ids))], 3)
    assert ds.full and mask.all()


def test_overlong_mask_zeroes_truncated_rows():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0]])
    truncated = torch.tensor([F, T, F])
    out = overlong_mask(mask, truncated)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]]))
    assert mask[1].sum() == 3  # input untouched
    # a bool mask stays bool
    out_bool = overlong_mask(mask.bool(), truncated)
    assert out_bool.dtype == torch.bool
    assert out_bool.tolist() == [[T, T, F], [F, F, F], [T, F, F]]


def test_overlong_mask_bad_inputs():
    with pytest.raises(ValueError, match="2-D"):
        overlong_mask(torch.ones(3), torch.tensor([F, F, F]))
    with pytest.raises(ValueError, match="shape"):
        overlong_mask(torch.ones(3, 2), torch.tensor([F, F]))
    with pytest.raises(ValueError, match="bool"):
        overlong_mask(torch.ones(2, 2), torch.tensor([0, 1]))


def test_dynamic_sampling_orders_groups_by_first_not_last_sample():
    # group 5 at positions {0, 3}, group 3 at {1, 2}, both informative ({1, 0} and {0, 1}):
    # by first appearance 5 (position 0) comes before 3 (position 1), so with room for one
    # group, 5 is kept (by last appearance 3, at position 2, would come before 5, at 3)
    ds = DynamicSampling(target_groups=1, max_rounds=1)
    keep = ds.add(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([5, 3, 3, 5]))
    assert keep.tolist() == [T, F, F, T]
    assert ds.accepted == 1


class RecordingSampler(EpochSampler):
    """The task's own order, recording each `observe(indices, pass_rates)`."""

    def __init__(self, size: int) -> None:
        super().__init__(size, seed=0, shuffle=False)
        self.observed: list[tuple[list[int], list[float]]] = []

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        self.observed.append((indices, pass_rates))


def _step_setup(*overrides: str) -> tuple[RLConfig, Task, RecordingSampler, RewardScorer]:
    """Four prompts a step, two samples each, on eight arithmetic problems."""
    settings = ["data.train_size=8", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=2"]
    cfg = resolve_config(overrides=[*settings, *overrides])
    task = load_task(cfg.data)
    return cfg, task, RecordingSampler(len(task.train)), RewardScorer(cfg, task)


def _scripted(task: Task, *rounds: dict[int, str]) -> Scripted:
    """An engine answering one round per `generate`: for each problem index, a sign per
    sample, "+" its gold answer and "-" a wrong one (``{0: "+-"}``: right, then wrong)."""
    turns = [
        [
            f"<answer>{task.train[i].answer if sign == '+' else 'x'}</answer>?"
            for i, signs in answers.items()
            for sign in signs
        ]
        for answers in rounds
    ]
    engine = Scripted(*turns)
    engine.model = build_tiny_model(TOK, hidden_size=32, num_layers=1, intermediate_size=64)
    return engine


def test_collect_step_samples_rounds_until_enough_groups_are_informative(monkeypatch):
    """Dynamic sampling, 2 informative groups wanted (`prompts_per_step=2`): round 1 draws
    prompts 0 and 1 (only 1's rewards differ), round 2 prompts 2 and 3 (only 2's): 2 rounds,
    groups numbered across the step, the sampler told each round's pass rates, and the
    rollout and reward times summed over the rounds from the clock."""
    cfg, task, sampler, rewarder = _step_setup(
        "rollout.prompts_per_step=2", "algorithm.dynamic_sampling=true"
    )
    engine = _scripted(task, {0: "++", 1: "+-"}, {2: "-+", 3: "--"})
    ticks = iter([0.0, 1.0, 3.0, 10.0, 14.0, 20.0])  # round 1: t0, t1, end; round 2: the same
    monkeypatch.setattr(sampling, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    step = sampling.collect_step(engine, TOK, task, sampler, cfg, rewarder)
    assert step.rounds == 2
    assert step.sampled.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert step.sampled.rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert step.kept.group_ids.tolist() == [1, 1, 2, 2]
    assert step.kept.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert sampler.observed == [([0, 1], [1.0, 0.5]), ([2, 3], [0.5, 0.0])]
    assert (step.rollout_seconds, step.reward_seconds) == (1.0 + 4.0, 2.0 + 6.0)


def test_collect_step_on_rank_1_of_2_samples_its_chunk_and_returns_the_gathered_step():
    """Of 4 drawn prompts rank 1 samples 2 and 3, numbers their groups 2 and 3, and returns
    rank 0's part then its own; the sampler sees the pass rates of all 4."""
    cfg, task, sampler, rewarder = _step_setup()
    batch = sampling.rollout_batch(_scripted(task, {0: "+-", 1: "++"}), TOK, task, [0, 1], cfg)
    rank0 = (batch, rewarder(batch))  # what rank 0 samples and scores: prompts 0 and 1

    class RankOne(Ranks):
        def gather(self, obj):
            return [rank0, obj]

    rank1 = _scripted(task, {2: "+-", 3: "--"})
    step = sampling.collect_step(rank1, TOK, task, sampler, cfg, rewarder, RankOne(1, 2))
    ((prompts, _),) = rank1.asked
    problems = [task.train[2].prompt, task.train[3].prompt]
    assert prompts == encode_prompts(cfg.data.template, problems, TOK)[1]
    assert step.sampled.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert step.sampled.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert step.rewards.total == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert sampler.observed == [([0, 1, 2, 3], [0.5, 1.0, 0.5, 0.0])]


def test_collect_step_with_gpgs_threshold_samples_again_then_fills_with_constant_groups():
    """β_th = 0.75 of 4 groups: round 1 has 2 informative groups (1 and 3), so a second round
    is sampled; its group 5 is the third, and the step is filled with group 0, the first
    constant group sampled. GPG's α is then 4 / 3 over the kept groups."""
    cfg, task, sampler, rewarder = _step_setup(
        "algorithm.min_informative_fraction=0.75", "algorithm.advantage=gpg"
    )
    engine = _scripted(
        task, {0: "++", 1: "+-", 2: "--", 3: "-+"}, {4: "++", 5: "+-", 6: "--", 7: "++"}
    )
    step = sampling.collect_step(engine, TOK, task, sampler, cfg, rewarder)
    assert step.rounds == 2
    assert step.kept.group_ids.tolist() == [0, 0, 1, 1, 3, 3, 5, 5]
    assert step.kept.rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert len(step.sampled) == 16
    advantages = gpg_advantages(step.kept.rewards, step.kept.group_ids)
    third = 2 / 3  # α · 0.5 with α = 8 samples / 6 in informative groups
    expected = [0.0, 0.0, third, -third, -third, third, third, -third]
    torch.testing.assert_close(advantages, torch.tensor(expected))


def test_collect_step_with_gpgs_threshold_keeps_a_first_round_that_has_enough():
    cfg, task, sampler, rewarder = _step_setup("algorithm.min_informative_fraction=0.5")
    engine = _scripted(task, {0: "++", 1: "+-", 2: "--", 3: "-+"})
    step = sampling.collect_step(engine, TOK, task, sampler, cfg, rewarder)
    assert step.rounds == 1
    assert (
        step.kept.group_ids.tolist() == step.sampled.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.dynamic_sampling=true"], "set one of them"),
        (["rollout.samples_per_prompt=1", "algorithm.advantage=reinforce_pp"], "sample at least 2"),
    ],
)
def test_gpgs_threshold_refuses_dynamic_sampling_and_single_samples(overrides, message):
    cfg = resolve_config(overrides=["algorithm.min_informative_fraction=0.6", *overrides])
    with pytest.raises(ConfigError, match=message):
        check_choices(cfg)
