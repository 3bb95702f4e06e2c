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
    with pytest.raises(ValueError, match="fewer than 5010 distinct"):
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
    with pytest.raises(ConfigError, match=r"unknown data\.template"):
        apply_template("alpaca", "Q?", tok)
    tok.chat_template = None  # a base model's tokenizer
    with pytest.raises(
        ConfigError,
        match=r"data\.template=chat needs a tokenizer with a chat template; this one has none "
        r"\(use data\.template=r1, qwen_math or none\)",
    ):
        apply_template("chat", "Q?", tok)


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


def _terms(question: str) -> list[int]:
    return [int(t) for t in re.findall(r"\d+", question)]


def test_arithmetic_defaults_and_each_digit_counts_whole_range():
    """Defaults: 2 or 3 terms of 1 to 3 digits (0 to 999); a term of d > 1 digits lies in
    [10^(d−1), 10^d − 1]: two-digit terms run from 10 to 99, three-digit ones from 100 to 999."""
    rng = random.Random(0)
    questions = [arithmetic_problem(rng).question for _ in range(2000)]
    assert {len(_terms(q)) for q in questions} == {2, 3}
    every = [t for q in questions for t in _terms(q)]
    assert (min(every), max(every)) == (0, 999)
    for d, bounds in ((2, (10, 99)), (3, (100, 999))):
        rng = random.Random(0)
        terms = [
            t
            for _ in range(2000)
            for t in _terms(arithmetic_problem(rng, min_digits=d, max_digits=d).question)
        ]
        assert (min(terms), max(terms)) == bounds


def test_shortcut_frac_shortcuts_the_questions_whose_crc_falls_below_it():
    """A question is shortcut when crc32(question) mod 1000 < 1000 · shortcut_frac: a quarter
    of them at 0.25, and a question whose residue is exactly 250 keeps its steps at 0.25 and
    loses them at 0.251."""
    rng = random.Random(0)
    problems = [arithmetic_problem(rng, shortcut_frac=0.25) for _ in range(400)]
    shortcut = ["<think></think>" in p.solution for p in problems]
    assert shortcut == [zlib.crc32(p.question.encode()) % 1000 < 250 for p in problems]
    assert sum(shortcut) == 100
    on_the_bound = arithmetic_problem(random.Random(1791), shortcut_frac=0.25)
    assert zlib.crc32(on_the_bound.question.encode()) % 1000 == 250
    assert on_the_bound.solution.startswith("<think>631+2=633\n")
    past = arithmetic_problem(random.Random(1791), shortcut_frac=0.251)
    assert past.solution == "<think></think><answer>366</answer>"


def test_countdown_defaults_and_divisions():
    """Defaults: 3 or 4 numbers from 1 to 25; a division is offered only by a divisor above 1
    (a step such as 7/1=7 would add nothing), so 2 divides and 1 never does."""
    rng = random.Random(0)
    problems = [countdown_problem(rng) for _ in range(3000)]
    assert {len(p.columns["numbers"]) for p in problems} == {3, 4}
    every = [n for p in problems for n in p.columns["numbers"]]
    assert (min(every), max(every)) == (1, 25)
    steps = [s for p in problems for s in p.solution.split("</think>")[0].split("\n")]
    assert not [s for s in steps if "/1=" in s]
    assert any("/2=" in s for s in steps)


class _ScriptedRng(random.Random):
    """Draws written out: `randint` and `randrange` return `draws` in turn, `choice` takes the
    candidate of the next operator in `ops`, `shuffle` keeps the order."""

    def __init__(self, draws: list[int], ops: str) -> None:
        super().__init__(0)
        self.draws, self.ops = iter(draws), iter(ops)

    def randint(self, a: int, b: int) -> int:
        return next(self.draws)

    def randrange(self, *args: int) -> int:
        return next(self.draws)

    def choice(self, seq: list[tuple[str, int]]) -> tuple[str, int]:
        op = next(self.ops)
        return next(c for c in seq if c[0] == op)

    def shuffle(self, x: list) -> None:
        pass


def test_countdown_writes_the_larger_operand_first_and_the_first_drawn_on_a_tie():
    """Numbers 3, 2, 5, every pop from the front: 3 and 2 give 3+2=5; then 5 and (3+2) tie at
    5, so they stay in the order drawn: 5*5=25, the expression 5*(3+2)."""
    rng = _ScriptedRng([3, 3, 2, 5, 0, 0, 0, 0], "+*")
    problem = countdown_problem(rng)
    assert problem.question == "Use 3, 2, 5 to make 25."
    assert problem.solution == "<think>3+2=5\n5*5=25</think><answer>5*(3+2)</answer>"


def test_a_seed_fixes_every_problem_verbatim():
    """The seeded stream is the data's identity (a run's held-out split must be the same in a
    later version): `synthetic_splits`' default seed 0 draws these first test and train
    problems."""
    train, test = synthetic_splits("arithmetic", train_size=1, test_size=1)
    assert (test[0].question, train[0].question) == ("What is 15-75-61?", "What is 323+242-27?")
    assert train[0].solution == "<think>323+242=565\n565-27=538</think><answer>538</answer>"
    train, test = synthetic_splits("countdown", train_size=1, test_size=1)
    assert (test[0].question, train[0].question) == (
        "Use 9, 14, 2, 25 to make 277.",
        "Use 24, 10, 4 to make 60.",
    )
    assert train[0].solution == "<think>24*10=240\n240/4=60</think><answer>(24*10)/4</answer>"
