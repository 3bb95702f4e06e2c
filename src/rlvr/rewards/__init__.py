"""Rewards: answer extraction, verification, the reward registry and weighted composition.

- `extract_answer` / `last_boxed_content` pull a final answer out of text (`extract`).
- `answers_match` compares answers exactly, then with math-verify under a hard, killable
  timeout that raises `VerifierTimeout` (`verify`).
- `register_reward` / `get_reward` name reward functions with TRL's signature
  ``f(prompts, completions, **columns) -> list[float]`` (`registry`); ``math``, ``format``
  (with ``format_strict`` and ``format_lenient``) and ``countdown`` are built in (`builtin`).
- `compose_rewards` sums weighted rewards into a `RewardOutput`, counting errors and
  timeouts instead of raising (`compose`). A reward reports a verifier timeout by returning
  NaN for that completion.
- `run_python` runs untrusted code in a sandbox with resource limits and no network
  (`sandbox`); the ``code`` reward scores programs on stdin/stdout or assert test cases with it
  (`code`); ``language`` is R1's language-consistency reward (`language`).
"""

from rlvr.rewards.builtin import (
    TIMED_OUT,
    countdown_reward,
    countdown_score,
    evaluate_countdown,
    format_lenient_reward,
    format_lenient_score,
    format_reward,
    format_score,
    format_strict_reward,
    format_strict_score,
    math_reward,
    math_score,
)
from rlvr.rewards.code import code_reward, code_score, extract_program, parse_tests
from rlvr.rewards.compose import (
    RewardComposer,
    RewardOutput,
    TrainerState,
    compose_rewards,
    concat_outputs,
)
from rlvr.rewards.extract import extract_answer, last_boxed_content, last_number
from rlvr.rewards.language import language_consistency_score, language_reward
from rlvr.rewards.registry import (
    RewardFn,
    UnknownRewardError,
    get_reward,
    list_rewards,
    register_reward,
)
from rlvr.rewards.sandbox import (
    SandboxError,
    SandboxResult,
    best_isolation,
    isolation_report,
    run_python,
)
from rlvr.rewards.verify import (
    VerifierError,
    VerifierTimeout,
    answers_match,
    current_verifier_timeout,
    normalize_answer,
    parse_number,
    shutdown_verifier_pool,
    verifier_timeout,
)

__all__ = [
    "TIMED_OUT",
    "RewardComposer",
    "RewardFn",
    "RewardOutput",
    "SandboxError",
    "SandboxResult",
    "TrainerState",
    "UnknownRewardError",
    "VerifierError",
    "VerifierTimeout",
    "answers_match",
    "best_isolation",
    "code_reward",
    "code_score",
    "compose_rewards",
    "concat_outputs",
    "countdown_reward",
    "countdown_score",
    "current_verifier_timeout",
    "evaluate_countdown",
    "extract_answer",
    "extract_program",
    "format_lenient_reward",
    "format_lenient_score",
    "format_reward",
    "format_score",
    "format_strict_reward",
    "format_strict_score",
    "get_reward",
    "isolation_report",
    "language_consistency_score",
    "language_reward",
    "last_boxed_content",
    "last_number",
    "list_rewards",
    "math_reward",
    "math_score",
    "normalize_answer",
    "parse_number",
    "parse_tests",
    "register_reward",
    "run_python",
    "shutdown_verifier_pool",
    "verifier_timeout",
]
