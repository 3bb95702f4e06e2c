"""Sampling-based evaluation metrics: unbiased pass@k and majority-vote maj@k.

Pure functions on plain Python lists; no model, tokenizer or tensor in sight, so each can be
tested against brute-force enumeration.

How this departs from the papers: nothing for pass@k (it is the estimator of Chen et al. 2021,
in its numerically stable product form). maj@k is *not* averaged over all k-subsets of the n
samples (that would be the unbiased analogue); it votes over the first k samples, which is what
the DeepSeek-R1 and Qwen evaluation scripts report as "maj@k" / "cons@k".
"""

from __future__ import annotations

import operator
from collections.abc import Sequence


def _as_int(name: str, value: object) -> int:
    """`value` as an int (numpy integers welcome); ValueError for bools, floats, strings."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer count, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer count, got {value!r}") from None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct.

    pass@k = 1 - C(n - c, k) / C(n, k)                      (Chen et al. 2021, eq. 1)

    i.e. the probability that a uniformly random k-subset of the n samples contains at least
    one correct sample. The binomials overflow (or lose precision) for realistic n, so it is
    computed in the product form of the paper's reference implementation:

        C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

    When n - c < k every k-subset contains a correct sample and the result is exactly 1.0.

    Reference: M. Chen et al., "Evaluating Large Language Models Trained on Code", 2021,
    arXiv:2107.03374, Sec. 2.1.

    Args:
        n: number of samples drawn for the problem (n >= 1).
        c: number of those samples that are correct (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).

    Raises:
        ValueError: for k > n, k < 1, n < 1, c outside [0, n], or non-integer counts.
    """
    n, c, k = _as_int("n", n), _as_int("c", c), _as_int("k", k)
    if n < 1:
        raise ValueError(f"pass_at_k: need at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: correct count c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass_at_k: k={k} must be in [1, n={n}] (cannot estimate pass@{k} from {n} samples)"
        )
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems.

    mean_pass@k = (1 / P) * sum_p pass_at_k(n_p, c_p, k)

    where problem p has n_p = len(correct[p]) samples, c_p of them correct. Problems may have
    different sample counts, but each needs n_p >= k.

    Raises:
        ValueError: if there are no problems, or a problem has fewer than k samples (the
            message names the problem index).
    """
    if len(correct) == 0:
        raise ValueError("mean_pass_at_k: no problems given")
    total = 0.0
    for index, samples in enumerate(correct):
        try:
            total += pass_at_k(len(samples), sum(bool(x) for x in samples), k)
        except ValueError as exc:
            raise ValueError(f"mean_pass_at_k: problem {index}: {exc}") from None
    return total / len(correct)


def majority_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k of one problem: majority vote over the extracted answers of the first k samples.

    Definition (the "maj@k" / "cons@k" of the DeepSeek-R1 and Qwen2.5-Math evaluations):

    1. Take the first k samples and their extracted final answers ``answers[:k]``.
    2. The voted answer is the most frequent non-None answer; ties go to the answer that
       occurs first. ``None`` (no answer could be extracted) never wins, unless all k answers
       are None, in which case the vote falls to the first sample.
    3. maj@k = 1.0 if the first sample carrying the voted answer is correct, else 0.0.

    Answers are compared as exact strings: normalise them (e.g. with the answer extractor)
    before voting. Unlike :func:`pass_at_k` this is not averaged over all k-subsets of the n
    samples; with n > k only the first k are used.

    References: DeepSeek-AI, "DeepSeek-R1", 2025, arXiv:2501.12948 (cons@64); Wang et al.,
    "Self-Consistency Improves Chain of Thought Reasoning in Language Models", 2022,
    arXiv:2203.11171 (majority voting over sampled answers).

    Raises:
        ValueError: if ``answers`` and ``correct`` differ in length, or k is not in [1, n].
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"majority_at_k: {len(answers)} answers but {len(correct)} correctness flags"
        )
    k = _as_int("k", k)
    if not 1 <= k <= len(answers):
        raise ValueError(f"majority_at_k: k={k} must be in [1, n={len(answers)}]")
    voted = majority_label(answers[:k])
    first = 0 if voted is None else list(answers).index(voted)
    return 1.0 if correct[first] else 0.0


def majority_label(answers: Sequence[str | None]) -> str | None:
    """The voted answer of maj@k (and of TTRL's label-free reward): the most frequent non-None
    answer, the one given first among equally frequent ones; None when no answer was given."""
    counts: dict[str, int] = {}
    for answer in answers:
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
    # max() returns the first maximal key; dicts keep insertion (= first occurrence) order.
    return max(counts, key=counts.__getitem__) if counts else None


def mean_majority_at_k(
    answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], k: int
) -> float:
    """Mean of :func:`majority_at_k` over problems: (1 / P) * sum_p maj@k(answers_p, correct_p).

    Raises:
        ValueError: if there are no problems, the two lists differ in length, or a problem
            fails :func:`majority_at_k`'s checks (the message names the problem index).
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"mean_majority_at_k: answers for {len(answers)} problems but "
            f"correctness for {len(correct)}"
        )
    if len(answers) == 0:
        raise ValueError("mean_majority_at_k: no problems given")
    total = 0.0
    for index, (problem_answers, problem_correct) in enumerate(zip(answers, correct, strict=True)):
        try:
            total += majority_at_k(problem_answers, problem_correct, k)
        except ValueError as exc:
            raise ValueError(f"mean_majority_at_k: problem {index}: {exc}") from None
    return total / len(answers)


def mean_best_of_k(scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]) -> float:
    """Best-of-N selection by a score: the share of problems whose highest-scoring sample is
    correct (the first of equal scores). With the samples' self-certainty as the score this is
    Kang et al. 2025's selection (arXiv:2502.18581), `sc@k` beside maj@k.

    Raises:
        ValueError: if there are no problems, or a problem's scores and verdicts differ in
            number or are empty (the message names the problem index).
    """
    if len(scores) != len(correct) or not scores:
        raise ValueError(
            f"mean_best_of_k: scores for {len(scores)} problems and correctness for "
            f"{len(correct)}; both must be the same, non-zero number"
        )
    hits = 0
    for index, (problem_scores, problem_correct) in enumerate(zip(scores, correct, strict=True)):
        if len(problem_scores) != len(problem_correct) or not problem_scores:
            raise ValueError(
                f"mean_best_of_k: problem {index} has {len(problem_scores)} scores and "
                f"{len(problem_correct)} verdicts"
            )
        best = max(range(len(problem_scores)), key=problem_scores.__getitem__)
        hits += bool(problem_correct[best])
    return hits / len(scores)
