"""Synthetic verifiable tasks with worked solutions, generated offline from a seed.

`arithmetic`: chains of additions and subtractions of multi-digit numbers; the worked solution
evaluates left to right, one operation per line. `countdown`: reach a target from a few numbers
with + - * / (TinyZero's Countdown task); the worked solution shows each intermediate result.
Both produce R1-style targets: ``<think>steps</think><answer>final</answer>``.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator

from rlvr.config import ConfigError
from rlvr.data.problem import Problem


def r1_solution(steps: list[str], answer: str) -> str:
    """The worked-solution text: reasoning lines inside think tags, then the answer tags."""
    return "<think>" + "\n".join(steps) + "</think><answer>" + answer + "</answer>"


def arithmetic_problem(
    rng: random.Random,
    *,
    min_digits: int = 1,
    max_digits: int = 3,
    min_terms: int = 2,
    max_terms: int = 3,
    operators: str = "+-",
    shortcut_frac: float = 0.0,
) -> Problem:
    """One left-to-right chain such as ``What is 347+589-123?`` with one line per operation.

    With `shortcut_frac` > 0, that share of worked solutions skips the steps and states the
    answer at once: a cold start of mixed quality, as SFT data distilled from a weaker model
    would be. Which problems get a shortcut depends only on the question text (a CRC), so the
    problems themselves, and the held-out split, are the same for every `shortcut_frac`.
    """
    n_terms = rng.randint(min_terms, max_terms)
    terms = [
        rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
        for d in (rng.randint(min_digits, max_digits) for _ in range(n_terms))
    ]
    ops = [rng.choice(operators) for _ in range(n_terms - 1)]
    expression = str(terms[0]) + "".join(op + str(t) for op, t in zip(ops, terms[1:]))
    value, steps = terms[0], []
    for op, term in zip(ops, terms[1:]):
        new_value = value + term if op == "+" else value - term
        steps.append(f"{value}{op}{term}={new_value}")
        value = new_value
    question = f"What is {expression}?"
    if zlib.crc32(question.encode()) % 1000 < shortcut_frac * 1000:
        steps = []
    return Problem(question=question, answer=str(value), solution=r1_solution(steps, str(value)))


def countdown_problem(
    rng: random.Random, *, min_numbers: int = 3, max_numbers: int = 4, max_value: int = 25
) -> Problem:
    """A Countdown puzzle built backwards: combine random numbers with random exact operations.

    Every intermediate result is a positive integer, so the puzzle always has the recorded
    solution; the verifier accepts any expression that uses the numbers at most once each.
    """
    numbers = [rng.randint(1, max_value) for _ in range(rng.randint(min_numbers, max_numbers))]
    pool = [(str(n), n) for n in numbers]
    steps = []
    while len(pool) > 1:
        (ea, a), (eb, b) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
        if a < b:
            (ea, a), (eb, b) = (eb, b), (ea, a)
        candidates = [("+", a + b), ("*", a * b)]
        if a > b:
            candidates.append(("-", a - b))
        if b > 1 and a % b == 0:
            candidates.append(("/", a // b))
        op, value = rng.choice(candidates)
        steps.append(f"{a}{op}{b}={value}")
        pool.append((f"({ea}{op}{eb})", value))
    expression, target = pool[0][0], pool[0][1]
    if expression.startswith("(") and expression.endswith(")"):
        expression = expression[1:-1]
    shuffled = numbers[:]
    rng.shuffle(shuffled)
    return Problem(
        question=f"Use {', '.join(map(str, shuffled))} to make {target}.",
        answer=str(target),
        solution=r1_solution(steps, expression),
        columns={"numbers": shuffled, "target": target},
    )


GENERATORS = {"arithmetic": arithmetic_problem, "countdown": countdown_problem}


def _unique_problems(task: str, seed: int, **kwargs: float) -> Iterator[Problem]:
    rng = random.Random(seed)
    seen: set[str] = set()
    generate = GENERATORS[task]
    misses = 0
    while misses < 10_000:
        problem = generate(rng, **kwargs)
        if problem.question in seen:
            misses += 1
            continue
        seen.add(problem.question)
        misses = 0
        yield problem


def synthetic_splits(
    task: str, *, train_size: int, test_size: int, seed: int = 0, **kwargs: float
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and test sets of unique questions from one seeded stream.

    The test split is drawn first, so it stays the same whatever `train_size` is.
    """
    if task not in GENERATORS:
        raise KeyError(f"unknown synthetic task {task!r}; choose from {sorted(GENERATORS)}")
    stream = _unique_problems(task, seed, **kwargs)
    test = [p for _, p in zip(range(test_size), stream)]
    train = [p for _, p in zip(range(train_size), stream)]
    if len(test) < test_size or len(train) < train_size:
        raise ConfigError(
            f"task {task!r} with {kwargs} has fewer than {train_size + test_size} distinct "
            "problems; lower data.train_size/data.test_size or widen the task settings"
        )
    return train, test
