"""A reward that hangs: the composer abandons the call, counts it, and training goes on.

The composer gives a call of a reward on ``n`` completions ``timeout_s * (2 * n + 2)`` seconds;
then the completions of that call score 0 and count as timeouts. The hung call's daemon thread
is left behind (a Python thread cannot be killed) and never delays interpreter exit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from rlvr.config import resolve_config
from rlvr.rewards import compose_rewards, math_reward, register_reward, registry as registry_module
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from tiny_run import TINY_RUN

RELEASE = threading.Event()
"""Set at teardown: hung calls return (long after they were abandoned) and their threads end."""


class HangEveryOtherCall:
    """A reward whose odd-numbered calls block until `RELEASE`; the others score 1.0.

    It records how many completions each call got, hung or not, to check the counts against.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.hung: list[int] = []
        self.scored: list[int] = []

    def __call__(self, prompts: list[str], completions: list[str], **_: object) -> list[float]:
        with self.lock:
            hang = self.calls % 2 == 1
            self.calls += 1
            (self.hung if hang else self.scored).append(len(completions))
        if hang:
            RELEASE.wait(600)
        return [1.0] * len(completions)


@pytest.fixture
def hanging_reward() -> Iterator[HangEveryOtherCall]:
    """`HangEveryOtherCall` registered as ``test_hang`` for the duration of one test."""
    before = dict(registry_module._REGISTRY)
    reward = HangEveryOtherCall()
    register_reward("test_hang")(reward)
    RELEASE.clear()
    yield reward
    RELEASE.set()
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(before)


def test_the_composer_abandons_a_hung_call_and_keeps_the_rest(
    hanging_reward: HangEveryOtherCall,
) -> None:
    composer = compose_rewards([("test_hang", 1.0), ("format", 1.0)], max_workers=2, timeout_s=0.2)
    completions = ["<think>a</think><answer>1</answer>", "b", "c", "d", "e"]
    start = time.monotonic()
    out = composer(["p"] * 5, completions, {})
    elapsed = time.monotonic() - start
    # chunks [0:3] and [3:5]; the second call hangs and is abandoned after 0.2 * (2*2 + 2) s
    assert composer.deadline("test_hang", 2) == pytest.approx(1.2)
    assert 1.2 <= elapsed < 3.0
    assert out.per_reward["test_hang"] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert out.per_reward["format"] == [1.0, 0.0, 0.0, 0.0, 0.0]  # other rewards unaffected
    assert out.total == [2.0, 1.0, 1.0, 0.0, 0.0]
    assert (out.timeouts, out.errors) == (2, 0)
    assert hanging_reward.hung == [2]
    [message] = out.error_examples
    assert message.startswith("test_hang: timeout: no result after 1.2 s for 2 completion(s)")
    assert "'d'" in message  # the first completion of the abandoned call


def test_deadlines() -> None:
    composer = compose_rewards([("format", 1.0), ("math", 1.0)], timeout_s=0.5)
    assert composer.deadline("format", 3) == pytest.approx(0.5 * (2 * 3 + 2))
    assert getattr(math_reward, "self_timed", False)
    assert composer.deadline("math", 3) is None  # bounded by its killable verifier processes
    fixed = compose_rewards([("format", 1.0)], timeout_s=0.5, call_timeout_s=30.0)
    assert fixed.deadline("format", 100) == 30.0


def test_training_with_a_hanging_reward_completes_and_counts_the_timeouts(
    tmp_path, hanging_reward: HangEveryOtherCall
) -> None:
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *TINY_RUN,
            "train.steps=3",
            f"train.output_dir={tmp_path / 'run'}",
            "reward.timeout_s=0.5",
            "reward.functions=[{name: test_hang, weight: 0.5}, {name: math, weight: 1.0}]",
        ],
    )
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"^step 1: rewards failed \(0 error\(s\), [1-9]") as seen:
        run_dir = train(cfg, show_progress=False)
    elapsed = time.monotonic() - start
    assert len([w for w in seen if "rewards failed" in str(w.message)]) == 1  # once a run

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    batch = 3 * 4  # rollout.prompts_per_step * rollout.samples_per_prompt
    hung, scored = sum(hanging_reward.hung), sum(hanging_reward.scored)
    assert hung > 0 and hung + scored == 3 * batch
    # Every hung completion is a counted timeout (math may add its own, never fewer).
    assert sum(m["reward/timeouts"] for m in metrics) >= hung
    assert sum(m["reward/errors"] for m in metrics) == 0
    # The calls that returned in time kept their scores: the mean of the reward says how many.
    assert sum(m["reward/test_hang"] for m in metrics) * batch == pytest.approx(scored)
    # Each step waited for the hung calls at most their deadline (chunks of 3: 0.5 * 8 = 4 s).
    assert all(m["time/reward"] < 4.0 + 2.0 for m in metrics)
    assert elapsed < 120
    # A few messages per step land in samples.jsonl, this reward's first (it is listed first).
    samples = read_jsonl(run_dir / "samples.jsonl")
    first_error = {}
    for sample in samples:
        if "reward_error" in sample:
            first_error.setdefault(sample["step"], sample["reward_error"])
    assert sorted(first_error) == [1, 2, 3]
    assert all(e.startswith("test_hang: timeout: no result") for e in first_error.values())


EXIT_SCRIPT = textwrap.dedent(
    """
    import threading

    from rlvr.rewards import compose_rewards, register_reward

    @register_reward("hang_forever")
    def hang_forever(prompts, completions, **columns):
        threading.Event().wait()

    out = compose_rewards([("hang_forever", 1.0)], timeout_s=0.2)(["p"], ["c"], {})
    print(out.timeouts, out.total)
    """
)


def test_an_abandoned_call_does_not_delay_interpreter_exit() -> None:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "[0.0]"]
    assert time.monotonic() - start < 60  # importing rlvr dominates; the hang costs 0.8 s
