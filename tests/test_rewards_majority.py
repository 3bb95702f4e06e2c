"""TTRL's majority-vote reward: the vote, the rewards against it, and what it logs."""

import pytest
import torch

from rlvr.config import ConfigError
from rlvr.evaluation.metrics import majority_label
from rlvr.rewards.majority import majority_vote_rewards
from rlvr.rewards.model_based import MODEL_REWARDS, RewardContext
from rlvr.rewards.verify import VerifierError, VerifierTimeout, answers_match


def tagged(answer: str) -> str:
    return f"<think>...</think><answer>{answer}</answer>"


def test_the_majority_is_the_most_frequent_answer_the_first_given_on_a_tie():
    assert majority_label(["3", None, "5", "5", None]) == "5"
    assert majority_label(["7", "3", "3", "7"]) == "7"  # tied: the first given
    assert majority_label([None, "2"]) == "2"  # no answer never wins
    assert majority_label([None, None]) is None


def test_each_completion_scores_one_when_it_agrees_with_its_groups_majority():
    # group 0 votes 12 (2 of 4 as written; 12.0 is not the vote but the same number, so it
    # scores 1 too), group 1 votes 4 over 9 (2 to 1, the no-answer completion does not vote),
    # group 2 has no answer at all
    completions = [
        tagged("12"), tagged("12"), tagged("12.0"), tagged("13"),
        tagged("4"), "no answer here", tagged("9"), tagged("4"),
        "nothing", "nothing either",
    ]  # fmt: skip
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    vote = majority_vote_rewards(completions, groups, answers_match)
    assert vote.labels == {0: "12", 1: "4", 2: None}
    assert vote.rewards == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert vote.agreement == {0: 2 / 4, 1: 2 / 4, 2: 0.0}  # "12.0" agrees but is not the vote
    assert (vote.errors, vote.timeouts) == ([], 0)


def test_each_completion_has_the_share_of_its_group_that_gave_its_answer():
    """EMPO's reward, the probability of the completion's semantic cluster: group 0 gives
    12, 12, 12.0, 13 (12.0 is its own cluster: the vote's clusters are normalised texts),
    group 1 gives 4, none, 9, 4 (the completion without an answer scores 0, and counts in the
    group's size), group 2 no answer at all."""
    completions = [
        tagged("12"), tagged("12"), tagged("12.0"), tagged("13"),
        tagged("4"), "no answer here", tagged("9"), tagged("4"),
        "nothing", "nothing either",
    ]  # fmt: skip

    def no_call(answer: str, label: str) -> bool:
        raise AssertionError("the share needs no verifier")

    vote = majority_vote_rewards(completions, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2], no_call, "share")
    assert vote.rewards == [0.5, 0.5, 0.25, 0.25, 0.5, 0.0, 0.25, 0.5, 0.0, 0.0]
    assert vote.labels == {0: "12", 1: "4", 2: None}
    assert vote.agreement == {0: 2 / 4, 1: 2 / 4, 2: 0.0}
    with pytest.raises(ValueError, match="unknown score 'soft'"):
        majority_vote_rewards(completions, [0] * 10, no_call, "soft")


def test_the_share_score_is_a_model_reward_option_and_keeps_the_logged_numbers():
    reward = MODEL_REWARDS.get("majority_vote")({"score": "share"}, RewardContext())
    completions = [tagged("5"), tagged("5"), tagged("6"), tagged("8"), tagged("7"), tagged("7")]
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    out = reward(["p"] * 6, completions, groups, {"answer": ["5", "5", "5", "8", "8", "8"]})
    assert out.scores == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 2 / 3, 2 / 3])
    assert out.metrics == pytest.approx({"agreement": 2 / 3, "label_accuracy": 0.5})
    assert (out.errors, out.timeouts) == (0, 0)
    with pytest.raises(ConfigError, match=r"reward 'majority_vote': option 'score'"):
        MODEL_REWARDS.get("majority_vote")({"score": "soft"}, RewardContext())


def test_an_undecided_comparison_scores_zero_and_is_counted():
    def verifier(answer: str, label: str) -> bool:
        raise VerifierTimeout("slow") if answer == "x + 1" else VerifierError("died")

    completions = [tagged("x"), tagged("x"), tagged("x + 1"), tagged("y")]
    vote = majority_vote_rewards(completions, [0, 0, 0, 0], verifier)
    assert vote.rewards == [1.0, 1.0, 0.0, 0.0]  # identical to the label: no call needed
    assert vote.timeouts == 1
    assert vote.errors == ["majority_vote: VerifierError: died"]


def test_the_model_reward_reads_no_gold_answer_to_score_and_logs_how_often_the_vote_is_right():
    reward = MODEL_REWARDS.get("majority_vote")({}, RewardContext())
    completions = [tagged("5"), tagged("5"), tagged("6"), tagged("8"), tagged("7"), tagged("7")]
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    right = reward(["p"] * 6, completions, groups, {"answer": ["5", "5", "5", "8", "8", "8"]})
    wrong = reward(["p"] * 6, completions, groups, {"answer": ["0"] * 6})
    assert right.scores == wrong.scores == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert right.metrics == pytest.approx({"agreement": 2 / 3, "label_accuracy": 0.5})
    assert wrong.metrics["label_accuracy"] == 0.0
    for unlabelled in ({}, {"answer": [""] * 6}):  # data.answer_column=null gives ""
        out = reward(["p"] * 6, completions, groups, unlabelled)
        assert out.metrics == pytest.approx({"agreement": 2 / 3})


def test_an_unknown_option_is_named():
    with pytest.raises(ConfigError, match=r"reward 'majority_vote': unknown option 'timeout'"):
        MODEL_REWARDS.get("majority_vote")({"timeout": 3}, RewardContext())


def test_its_numbers_reach_the_steps_metrics_under_the_rewards_name():
    from rlvr.rewards.compose import RewardOutput
    from rlvr.rewards.model_based import add_model_rewards

    reward = MODEL_REWARDS.get("majority_vote")({}, RewardContext())
    out = RewardOutput(total=[0.0, 0.0], per_reward={}, errors=0, timeouts=0)
    add_model_rewards(
        out,
        {"majority_vote": (2.0, reward)},
        ["p", "p"],
        [tagged("3"), tagged("3")],
        torch.tensor([0, 0]),
        {"answer": ["4", "4"]},
    )
    assert out.total == [2.0, 2.0] and out.per_reward["majority_vote"] == [1.0, 1.0]
    assert out.metrics == {
        "reward/majority_vote/agreement": [1.0],
        "reward/majority_vote/label_accuracy": [0.0],
    }
