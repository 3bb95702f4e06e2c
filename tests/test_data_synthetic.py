"""Synthetic tasks, templates and the resumable prompt sampler."""

import random
import re
import zlib
from fractions import Fraction

import pytest

from rlvr.config import ConfigError, DataConfig, resolve_config
from rlvr.data.problem import Problem
from rlvr.data.sampler import EpochSampler
from rlvr.data.synthetic import arithmetic_problem, countdown_problem, synthetic_splits
from rlvr.data.tasks import load_task
from rlvr.data.templates import apply_template, longest_prompt, short_prompts
from rlvr.models.tiny import build_tiny_tokenizer


def test_arithmetic_solution_steps_are_correct():
    rng = random.Random(0)
    for _ in range(200):
        problem = arithmetic_problem(rng, max_digits=3, max_terms=4)
        expression = problem.question.removeprefix("What is ").removesuffix("?")
        assert str(eval(expression)) == problem.answer  # trusted, generated text
        steps = problem.solution.split("<think>")[1].split("</think>")[0].split("\n")
        for step in steps:
            lhs, rhs = step.split("=")
            assert eval(lhs) == int(rhs)
        assert problem.solution.endswith(f"<answer>{problem.answer}</answer>")


def test_countdown_recorded_solution_reaches_the_target():
    rng = random.Random(1)
    for _ in range(200):
        problem = countdown_problem(rng)
        expression = problem.solution.split("<answer>")[1].split("</answer>")[0]
        value = eval(expression.replace("/", "*Fraction(1)/"), {"Fraction": Fraction})
        assert value == problem.columns["target"] == int(problem.answer)
        used = sorted(
            int(t)
            for t in expression.replace("(", " ")
            .replace(")", " ")
            .replace("+", " ")
            .replace("-", " ")
            .replace("*", " ")
            .replace("/", " ")
            .split()
        )
        assert used == sorted(problem.columns["numbers"])


def test_splits_are_disjoint_deterministic_and_test_is_stable():
    train, test = synthetic_splits("arithmetic", train_size=300, test_size=100, seed=5)
    assert not {p.question for p in train} & {p.question for p in test}
    assert len({p.question for p in train}) == 300
    _, test_again = synthetic_splits("arithmetic", train_size=50, test_size=100, seed=5)
    assert [p.question for p in test] == [p.question for p in test_again]


def test_too_small_task_space_is_an_error():
    with pytest.raises(ValueError, match="distinct"):
        synthetic_splits(
            "arithmetic", train_size=5000, test_size=10, seed=0, max_digits=1, max_terms=2
        )


def test_load_task_names_its_verifier():
    task = load_task(DataConfig(task="countdown", train_size=20, test_size=5))
    assert task.reward == "countdown" and len(task.train) == 20 and len(task.test) == 5
    with pytest.raises(ConfigError, match=r"'data\.task': Input should be 'arithmetic'"):
        resolve_config(overrides=["data.task=algebra"])
    with pytest.raises(ValueError, match=r"data\.path"):
        load_task(DataConfig(task="file"))


def test_templates():
    tok = build_tiny_tokenizer()
    assert apply_template("chat", "Q?", tok) == "<|user|>Q?<|im_end|><|assistant|>"
    assert apply_template("r1", "Q?", tok).endswith("User: Q?\nAssistant: <think>")
    assert "\\boxed{}" in apply_template("qwen_math", "Q?", tok)
    assert apply_template("none", "Q?", tok) == "Q?"
    with pytest.raises(KeyError, match=r"unknown data\.template"):
        apply_template("alpaca", "Q?", tok)


def test_prompt_lengths_count_the_templated_tokens():
    """One token per character and one per chat tag: a `chat` prompt is its question's
    length + 3 (user, end-of-turn and assistant tags); a prompt of exactly the limit is kept."""
    tok = build_tiny_tokenizer()
    problems = [Problem(q, "0") for q in ("1+2=?", "10+20=?", "3+4=?")]  # 5, 7 and 5 chars
    assert longest_prompt("chat", problems, tok) == 10
    assert longest_prompt("none", problems, tok) == 7
    assert longest_prompt("chat", [], tok) == 0
    assert short_prompts("chat", problems, tok, 8) == [problems[0], problems[2]]
    assert short_prompts("chat", problems, tok, 7) == []
    assert short_prompts("none", problems, tok, 7) == problems


def test_sampler_covers_each_epoch_and_resumes_exactly():
    sampler = EpochSampler(10, seed=3)
    first_epoch = sampler.next(10)
    assert sorted(first_epoch) == list(range(10))
    sampler.next(4)
    state = sampler.state_dict()
    expected = sampler.next(13)
    resumed = EpochSampler(10, seed=3)
    resumed.load_state_dict(state)
    assert resumed.next(13) == expected


def test_each_epoch_draws_a_fresh_permutation():
    sampler = EpochSampler(10, seed=3)
    epochs = [sampler.next(10) for _ in range(4)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4


def test_countdown_intermediate_results_are_positive():
    rng = random.Random(0)
    for _ in range(3000):
        p = countdown_problem(rng)
        steps = re.search(r"<think>(.*)</think>", p.solution, re.S).group(1).split("\n")
        assert all(int(s.split("=")[1]) > 0 for s in steps), p.solution


def test_shortcut_frac_zero_keeps_every_worked_solution():
    # a question whose crc32 is 0 mod 1000 is the one that a shortcut_frac of 0.001 shortcuts;
    # at 0 it keeps its worked solution
    for seed in range(100_000):
        p = arithmetic_problem(random.Random(seed))
        if zlib.crc32(p.question.encode()) % 1000 == 0:
            break
    assert "<think></think>" not in p.solution
    shortcut = arithmetic_problem(random.Random(seed), shortcut_frac=0.001)
    assert "<think></think>" in shortcut.solution


def test_operands_cover_the_whole_digit_range():
    rng = random.Random(0)
    terms = set()
    for _ in range(500):
        question = arithmetic_problem(rng, max_digits=1).question
        terms |= {int(t) for t in re.findall(r"\d+", question)}
    assert terms == set(range(10))


def test_load_task_passes_the_seed_on():
    one = load_task(DataConfig(task="countdown", seed=1, train_size=5, test_size=2))
    zero = load_task(DataConfig(task="countdown", seed=0, train_size=5, test_size=2))
    assert [p.question for p in one.train] != [p.question for p in zero.train]
