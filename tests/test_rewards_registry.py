"""Reward registry, weighted composition, and the format and countdown rewards."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from rlvr.rewards import (
    RewardComposer,
    RewardOutput,
    TrainerState,
    UnknownRewardError,
    compose_rewards,
    concat_outputs,
    countdown_reward,
    countdown_score,
    evaluate_countdown,
    format_score,
    get_reward,
    list_rewards,
    math_reward,
    register_reward,
    registry as registry_module,
)
from rlvr.rewards.builtin import tool_error_reward
from rlvr.rewards.compose import signature_mismatch


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Rewards registered inside a test are removed afterwards."""
    before = dict(registry_module._REGISTRY)
    yield
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(before)


def length_reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """A custom reward, loaded by import path: the completion length."""
    return [float(len(c)) for c in completions]


# ------------------------------------------------------------------------------- registry


def test_builtins_are_registered() -> None:
    assert {"math", "format", "countdown"} <= set(list_rewards())
    assert get_reward("math") is math_reward


def test_math_does_not_apply_to_a_row_without_a_gold_answer() -> None:
    """`data.answer_column=null` gives the rows an empty answer: TRL's None ("does not
    apply"), so the step's `accuracy` leaves them out rather than counting them wrong."""
    completions = ["<answer>5</answer>", "<answer>5</answer>", "<answer>4</answer>"]
    assert math_reward(["p"] * 3, completions, answer=["5", "", "5"]) == [1.0, None, 0.0]


def test_duplicate_name_is_refused(scratch_registry: None) -> None:
    @register_reward("test_dup")
    def first(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="test_dup"):

        @register_reward("test_dup")
        def second(prompts: list[str], completions: list[str], **_: object) -> list[float]:
            return [1.0] * len(completions)

    assert get_reward("test_dup") is first
    with pytest.raises(ValueError, match="math"):
        register_reward("math")(first)


def test_the_same_definition_run_again_replaces_itself(scratch_registry: None) -> None:
    """A notebook cell that registers a reward, edited and run again: the new one counts."""
    cell = (
        "@register_reward('test_cell')\n"
        "def right(prompts, completions, **_):\n"
        "    return [{value}] * len(completions)\n"
    )
    scope = {"register_reward": register_reward, "__name__": "__main__"}
    exec(cell.format(value=0.0), scope)
    exec(cell.format(value=1.0), scope)
    assert get_reward("test_cell")([""], ["a", "b"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="'test_cell' is already registered"):
        exec(cell.replace("def right", "def other").format(value=2.0), scope)
    assert get_reward("test_cell")([""], ["a"]) == [1.0]


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownRewardError) as info:
        get_reward("maht")
    message = str(info.value)
    assert "did you mean 'math'" in message
    assert "countdown" in message and "format" in message  # the valid names are listed
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownRewardError, match="'format'"):
        compose_rewards([("fromat", 1.0)])


def test_import_path_reward() -> None:
    fn = get_reward(f"{__name__}:length_reward")
    assert fn is length_reward
    out = compose_rewards([(f"{__name__}:length_reward", 2.0)])(["p", "q"], ["ab", "abcd"], {})
    assert out.total == [4.0, 8.0]
    with pytest.raises(UnknownRewardError, match="no attribute"):
        get_reward(f"{__name__}:missing")
    with pytest.raises(UnknownRewardError, match="cannot import"):
        get_reward("no_such_package_xyz.rewards:fn")


VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = solution_str.strip().endswith(str(ground_truth))
    return {"score": float(right), "from_toy": data_source == "toy", "index": extra_info["i"]}


def gsm8k_style(solution_str, ground_truth, method="strict"):
    return float(solution_str == ground_truth)


def no_score(solution_str, **kwargs):
    return {"acc": 1.0}
"""


def test_a_verl_reward_file_is_called_per_completion_as_verl_calls_it(tmp_path) -> None:
    """verl's `custom_reward_function` (a file and a `compute_score(data_source, solution_str,
    ground_truth, extra_info)`): its dict's score is the reward, its other keys are logged."""
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_FILE)
    name = f"{path}:compute_score"
    columns = {
        "answer": ["4", "5", "6"],
        "data_source": ["toy", "toy", "other"],
        "extra_info": [{"i": 0}, {"i": 1}, {"i": 5}],
    }
    out = compose_rewards([(name, 2.0)], max_workers=1)(["q"] * 3, ["so 4", "so 4", "6"], columns)
    assert (out.total, out.errors) == ([2.0, 0.0, 2.0], 0)
    assert out.extra == {"from_toy": [True, True, False], "index": [0, 1, 5]}
    assert out.metrics == {f"reward/{name}/index": [2.0]}  # the numbers' mean; bools are not
    gsm8k = compose_rewards([(f"{path}:gsm8k_style", 1.0)])(
        ["q"] * 2, ["4", "x"], {"answer": ["4", "5"]}
    )
    assert gsm8k.total == [1.0, 0.0]  # given only the keywords it takes
    broken = compose_rewards([(f"{path}:no_score", 1.0)], max_workers=1)(["q"], ["4"], {})
    assert broken.errors == 1 and "returned a dict without 'score' (keys ['acc'])" in str(broken)
    assert get_reward(name) is get_reward(name)  # the file is loaded once


OPENRLHF_FILE = """
import torch


def reward_func(queries, prompts, labels):
    right = [q[len(p):].strip() == label for q, p, label in zip(queries, prompts, labels)]
    rewards = torch.tensor(right, dtype=torch.float32)
    logs = {"query_len": [len(q) for q in queries]}
    return {"rewards": rewards, "scores": rewards, "extra_logs": logs}


def tensor_only(queries, **kwargs):
    return torch.tensor([float(len(q)) for q in queries])


def too_few(queries, prompts, labels):
    return [1.0]


def no_rewards(queries):
    return {"scores": [1.0] * len(queries)}
"""


def test_an_openrlhf_reward_file_is_called_as_openrlhf_calls_it(tmp_path) -> None:
    """OpenRLHF's `reward_func(queries, prompts, labels)`: the queries are each prompt with
    its response appended, the labels the answers; a dict's "rewards" are the rewards and its
    "extra_logs" are logged."""
    path = tmp_path / "reward_func.py"
    path.write_text(OPENRLHF_FILE)
    name = f"{path}:reward_func"
    columns = {"answer": ["4", "5", "6"]}
    composer = compose_rewards([(name, 2.0)], max_workers=1)
    out = composer(["Q1: ", "Q22: ", "Q3: "], ["4", "4", "6"], columns)
    assert (out.total, out.errors) == ([2.0, 0.0, 2.0], 0)
    assert out.extra == {"query_len": [5, 6, 5]}
    assert out.metrics == {f"reward/{name}/query_len": [16 / 3]}
    lengths = compose_rewards([(f"{path}:tensor_only", 1.0)])(["ab", "c"], ["x", "yz"], {})
    assert lengths.total == [3.0, 3.0]  # a tensor of rewards; given only what it takes
    few = compose_rewards([(f"{path}:too_few", 1.0)], max_workers=1)(["a", "b"], ["1", "2"], {})
    assert few.errors == 1 and "rewards: expected 2 values, one per completion" in str(few)
    broken = compose_rewards([(f"{path}:no_rewards", 1.0)], max_workers=1)(["q"], ["4"], {})
    assert broken.errors == 1 and "returned a dict without 'rewards' (keys ['scores'])" in str(
        broken
    )


@pytest.mark.parametrize(
    ("content", "function"), [(VERL_FILE, "compute_score"), (OPENRLHF_FILE, "reward_func")]
)
def test_a_verl_or_openrlhf_reward_marked_conversational_is_refused(tmp_path, content, function):
    """Such a reward reads texts, as its framework passes them; `conversational: true` would
    hand it message lists and fail every call, so the run is refused before it starts."""
    from rlvr.config import ConfigError, resolve_config
    from rlvr.training.rl import check_choices

    path = tmp_path / "theirs.py"
    path.write_text(content)
    spec = f"{{name: '{path}:{function}', conversational: true}}"
    cfg = resolve_config(
        overrides=[f"reward.functions=[{spec}, {{name: brpo, options: {{judge: policy}}}}]"]
    )
    with pytest.raises(
        ConfigError, match=r"reward\.functions\[0\]: '.*theirs\.py:.*' is a verl or OpenRLHF"
    ):
        check_choices(cfg)
    plain = resolve_config(overrides=[f"reward.functions=[{{name: '{path}:{function}'}}]"])
    check_choices(plain)


def test_a_reward_file_that_is_missing_or_fails_is_named(tmp_path) -> None:
    with pytest.raises(UnknownRewardError, match=r"no Python file '.*nope\.py'"):
        get_reward(f"{tmp_path / 'nope.py'}:compute_score")
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_xyz\n")
    with pytest.raises(
        UnknownRewardError, match=r"loading '.*bad\.py' failed: ModuleNotFoundError"
    ):
        get_reward(f"{bad}:compute_score")
    bad.write_text("x = 1\n")
    with pytest.raises(UnknownRewardError, match="no attribute 'compute_score'"):
        get_reward(f"{bad}:compute_score")


# ------------------------------------------------------------------------------- composition

R1 = "<think>easy</think><answer>{}</answer>"


def test_weighted_composition_by_hand() -> None:
    completions = [R1.format(4), "4", R1.format(5), "nothing"]
    columns = {"answer": ["4", "4", "4", "4"]}
    composer = compose_rewards(
        [("math", 1.0), ("format", 0.5), (f"{__name__}:length_reward", -0.01)]
    )
    out = composer(["p"] * 4, completions, columns)
    assert out.per_reward["math"] == [1.0, 1.0, 0.0, 0.0]
    assert out.per_reward["format"] == [1.0, 0.0, 1.0, 0.0]
    lengths = [37.0, 1.0, 37.0, 7.0]  # len("<think>easy</think><answer>4</answer>") == 37
    assert out.per_reward[f"{__name__}:length_reward"] == lengths
    # total = 1.0*math + 0.5*format - 0.01*length
    expected = [1.0 + 0.5 - 0.37, 1.0 + 0.0 - 0.01, 0.0 + 0.5 - 0.37, 0.0 + 0.0 - 0.07]
    assert out.total == pytest.approx(expected, abs=1e-12)
    assert (out.errors, out.timeouts, out.error_examples) == (0, 0, [])


def test_a_raising_reward_scores_zero_and_is_counted(scratch_registry: None) -> None:
    @register_reward("test_broken")
    def broken(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        raise RuntimeError("judge unavailable")

    @register_reward("test_short")
    def short(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [1.0]  # wrong length: also an error

    composer = compose_rewards([("math", 1.0), ("test_broken", 1.0), ("test_short", 1.0)], 2)
    out = composer(
        ["p"] * 4, ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "x"], {"answer": ["1"] * 4}
    )
    assert isinstance(out, RewardOutput)
    assert out.per_reward["math"] == [1.0, 0.0, 0.0, 0.0]
    assert out.per_reward["test_broken"] == [0.0] * 4
    assert out.per_reward["test_short"] == [0.0] * 4
    assert out.total == [1.0, 0.0, 0.0, 0.0]
    assert out.errors == 4  # 2 rewards × 2 chunks (max_workers=2)
    assert any("judge unavailable" in m for m in out.error_examples)
    # The composer's own check names the count (not zip's complaint further on).
    assert "test_short: ValueError: returned 1 scores for 2 completions" in out.error_examples


def test_missing_column_is_an_error_not_a_crash() -> None:
    out = compose_rewards([("math", 1.0)], max_workers=1)(["p"], ["\\boxed{1}"], {})
    assert out.total == [0.0] and out.errors == 1
    assert "answer" in out.error_examples[0]


def test_nan_is_a_timeout_and_none_is_zero(scratch_registry: None) -> None:
    @register_reward("test_odd")
    def odd(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
        return [float("nan"), None, 0.5]

    completions = ["x" * 100, "b", "c"]
    out = compose_rewards([("test_odd", 2.0)], max_workers=1)(["p"] * 3, completions, {})
    assert out.total == [0.0, 0.0, 1.0]
    assert (out.timeouts, out.errors) == (1, 0)
    # The message quotes the completion's first 80 characters.
    assert out.error_examples == [f"test_odd: timeout: NaN (verifier timed out) for '{'x' * 80}'"]


def test_where_a_reward_does_not_apply_is_kept_across_chunks_and_steps(
    scratch_registry: None,
) -> None:
    """`None` for the odd completions, scored by 3 chunks of 3, 2 and 2: the indices are the
    batch's, not a chunk's; a second output's are shifted by the first's length."""

    @register_reward("test_even_only")
    def even_only(prompts: list[str], completions: list[str], **_: object) -> list:
        return [None if int(c) % 2 else 1.0 for c in completions]

    @register_reward("test_half")
    def half(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [0.5] * len(completions)

    composer = compose_rewards([("test_even_only", 1.0), ("test_half", 1.0)], max_workers=3)
    completions = [str(i) for i in range(7)]
    out = composer(["p"] * 7, completions, {})
    assert out.not_applied == {"test_even_only": [1, 3, 5]}
    assert out.applied("test_even_only") == [True, False, True, False, True, False, True]
    assert out.applied("test_half") == [True] * 7
    assert out.total == [1.5, 0.5, 1.5, 0.5, 1.5, 0.5, 1.5]
    merged = concat_outputs([out, composer(["p"] * 2, ["1", "2"], {})])
    assert merged.not_applied == {"test_even_only": [1, 3, 5, 7]}


def test_parallel_scoring_is_deterministic_and_ordered() -> None:
    completions = [f"{'x' * i} the answer is {i % 7}" for i in range(37)]
    columns = {"answer": [str(i % 5) for i in range(37)]}
    specs = [("math", 1.0), (f"{__name__}:length_reward", 0.001)]
    serial = compose_rewards(specs, max_workers=1)([""] * 37, completions, columns)
    parallel = compose_rewards(specs, max_workers=4)([""] * 37, completions, columns)
    assert parallel == serial
    assert serial.per_reward["math"] == [float(i % 7 == i % 5) for i in range(37)]


def test_rewards_are_called_by_keyword_as_trl_calls_them(scratch_registry: None) -> None:
    """TRL passes `prompts=` and `completions=` by name; a TRL reward may take `completions`
    first (trl.rewards' do), which a positional call would hand the prompts."""

    @register_reward("test_completions_first")
    def completions_first(completions: list[str], prompts: list[str], **_: object) -> list[float]:
        return [float(len(c) - len(p)) for c, p in zip(completions, prompts, strict=True)]

    out = compose_rewards([("test_completions_first", 1.0)])(["p", "pp"], ["abcd", "ab"], {})
    assert out.total == [3.0, 0.0] and out.errors == 0


def test_a_conversational_reward_gets_trl_s_shapes() -> None:
    think = "trl.rewards:think_format_reward"  # TRL's own: completion[0]["content"]
    completions = ["<think>a</think> 4", "4", "<think>b</think><think>c</think> 4"]
    conversations = [[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]] * 3
    as_text = compose_rewards([(think, 1.0)], max_workers=1)(["q"] * 3, completions, {})
    assert as_text.total == [0.0] * 3 and as_text.errors == 1  # texts are not its shape
    composer = compose_rewards(
        [(think, 1.0), ("math", 1.0)], max_workers=2, conversational=frozenset({think})
    )
    out = composer(["q"] * 3, completions, {"answer": ["4"] * 3}, conversations)
    assert out.per_reward[think] == [1.0, 0.0, 0.0]  # the regex by hand: one think block first
    assert out.per_reward["math"] == [1.0, 1.0, 1.0]  # the others still get texts
    assert out.errors == 0
    with pytest.raises(ValueError, match="not among"):
        compose_rewards([("math", 1.0)], conversational=frozenset({think}))


def test_a_conversational_reward_sees_the_messages_or_the_question_as_one_turn(
    scratch_registry: None,
) -> None:
    seen: list = []

    @register_reward("test_seen")
    def record(prompts: list, completions: list, **_: object) -> list[float]:
        seen.append((prompts, completions))
        return [0.0] * len(completions)

    composer = compose_rewards([("test_seen", 1.0)], 1, conversational=frozenset({"test_seen"}))
    chat = [{"role": "user", "content": "q?"}]
    composer(["rendered q?"], ["a"], {}, [chat])
    composer(["q?"], ["a"], {})
    assert seen == [
        ([chat], [[{"role": "assistant", "content": "a"}]]),
        ([[{"role": "user", "content": "q?"}]], [[{"role": "assistant", "content": "a"}]]),
    ]


def test_an_async_reward_is_awaited(scratch_registry: None) -> None:
    """TRL awaits `async def` rewards (ones that call a service, say); so does the composer,
    each chunk's call in its own thread and event loop, its errors counted as any other's."""

    @register_reward("test_async")
    async def slow_length(completions, **_) -> list[float]:
        await asyncio.sleep(0.01)
        if "boom" in completions:
            raise RuntimeError("service down")
        return [float(len(c)) for c in completions]

    out = compose_rewards([("test_async", 1.0)], max_workers=4)(
        ["q"] * 5, ["a", "bb", "", "c", "dd"]
    )
    assert (out.total, out.errors) == ([1.0, 2.0, 0.0, 1.0, 2.0], 0)
    failed = compose_rewards([("test_async", 1.0)], max_workers=2)(["q"] * 2, ["a", "boom"])
    assert failed.total == [1.0, 0.0] and failed.errors == 1
    assert failed.error_examples == ["test_async: RuntimeError: service down"]


def test_trl_s_trainer_state_log_metric_and_log_extra(scratch_registry: None) -> None:
    """TRL passes `trainer_state`, `log_metric` and `log_extra` to every reward; what the
    parallel chunks log comes back in the completions' order."""

    @register_reward("test_logs")
    def logs(completions, trainer_state, log_extra, log_metric, **_) -> list[float]:
        log_metric("chars", sum(len(c) for c in completions))
        log_extra("chars", [len(c) for c in completions])
        log_extra("first_letter", [c[:1] for c in completions])
        return [trainer_state.global_step / trainer_state.max_steps] * len(completions)

    completions = ["a" * i + "xyz"[i % 3] for i in range(11)]
    state = TrainerState(global_step=3, max_steps=12)
    outs = [
        compose_rewards([("test_logs", 1.0)], max_workers=w)(
            ["q"] * 11, completions, {}, None, state
        )
        for w in (1, 4)
    ]
    for out, calls in zip(outs, (1, 4), strict=True):
        assert out.total == [0.25] * 11 and out.errors == 0
        assert out.extra == {
            "chars": [i + 1 for i in range(11)],
            "first_letter": ["x"] + ["a"] * 10,
        }
        chunk_sums = out.metrics["reward/test_logs/chars"]
        assert len(chunk_sums) == calls and sum(chunk_sums) == sum(range(1, 12))
    assert outs[0].metrics == {"reward/test_logs/chars": [66.0]}


@pytest.mark.parametrize(
    ("log", "message"),
    [
        (lambda extra, metric: extra("n", [1]), "log_extra('n', ...) got 1 values for 2"),
        (lambda extra, metric: extra("reward", [1, 2]), "other than ['answer', 'completion'"),
        (lambda extra, metric: extra("n", [object(), 1]), "cannot log object as JSON (key 'n[0]')"),
        (lambda extra, metric: metric("m", "high"), "log_metric('m', ...) needs a number, got str"),
        (lambda extra, metric: metric("", 1.0), "log_metric needs a metric name, got ''"),
    ],
)
def test_a_bad_log_call_is_the_reward_s_error(scratch_registry: None, log, message) -> None:
    """The call is counted as an error and what it logged before is dropped with its scores."""

    @register_reward("test_bad_log")
    def bad(completions, log_extra, log_metric, **_) -> list[float]:
        log_metric("before", 1.0)
        log(log_extra, log_metric)
        return [1.0] * len(completions)

    out = compose_rewards([("test_bad_log", 1.0)], max_workers=1)(["q", "q"], ["a", "b"], {})
    assert (out.total, out.errors, out.metrics, out.extra) == ([0.0, 0.0], 1, {}, {})
    assert message in out.error_examples[0]


def test_a_lone_output_concatenates_to_itself() -> None:
    # A step with one sampling round on one rank concatenates a single output.
    only = RewardOutput([2.0], {"r": [1.0]}, 1, 0, ["e"], {"m": [3.0]}, {"a": ["x"]})
    assert concat_outputs([only]) == RewardOutput(
        [2.0], {"r": [1.0]}, 1, 0, ["e"], {"m": [3.0]}, {"a": ["x"]}
    )


def test_concat_outputs_puts_steps_end_to_end() -> None:
    first = RewardOutput([1.0], {"r": [1.0]}, 1, 0, ["e1"], {"m": [2.0]}, {"a": ["x"]})
    second = RewardOutput([0.0, 3.0], {"r": [0.0, 3.0]}, 0, 2, [], {"m": [4.0]}, {"b": [1, 2]})
    merged = concat_outputs([first, second])
    assert merged == RewardOutput(
        total=[1.0, 0.0, 3.0],
        per_reward={"r": [1.0, 0.0, 3.0]},
        errors=1,
        timeouts=2,
        error_examples=["e1"],
        metrics={"m": [2.0, 4.0]},
        extra={"a": ["x", None, None], "b": [None, 1, 2]},
    )


def test_the_defaults_four_chunks_five_second_verifier_and_step_zero(
    scratch_registry: None,
) -> None:
    seen: list[tuple[int, int, int]] = []

    @register_reward("test_sizes")
    def sizes(completions: list[str], trainer_state: TrainerState, **_: object) -> list[float]:
        seen.append((len(completions), trainer_state.global_step, trainer_state.max_steps))
        return [0.0] * len(completions)

    for composer in (compose_rewards([("test_sizes", 1.0)]), RewardComposer([("test_sizes", 1.0)])):
        seen.clear()
        composer(["p"] * 10, ["c"] * 10)
        # 10 completions in max_workers=4 chunks; no `state` given: step 0 of 0
        assert sorted(seen) == [(2, 0, 0), (2, 0, 0), (3, 0, 0), (3, 0, 0)]
        assert composer.deadline("test_sizes", 3) == 5.0 * (2 * 3 + 2)


def test_every_late_call_waits_for_the_same_deadline(scratch_registry: None) -> None:
    # Four calls that all hang: each is abandoned at the one deadline counted from the start,
    # not one after the other.
    release = threading.Event()

    @register_reward("test_stuck")
    def stuck(completions: list[str], **_: object) -> list[float]:
        release.wait(60)
        return [1.0] * len(completions)

    composer = compose_rewards([("test_stuck", 1.0)], max_workers=4, call_timeout_s=0.2)
    start = time.monotonic()
    try:
        out = composer(["p"] * 4, ["a", "b", "c", "d"])
    finally:
        release.set()
    assert time.monotonic() - start < 1.5
    assert (out.total, out.timeouts) == ([0.0] * 4, 4)


def test_composer_rejects_misaligned_input() -> None:
    composer = compose_rewards([("format", 1.0)])
    with pytest.raises(ValueError, match="prompts"):
        composer(["p"], ["a", "b"], {})
    with pytest.raises(ValueError, match="answer"):
        composer(["p", "q"], ["a", "b"], {"answer": ["1"]})
    with pytest.raises(ValueError, match="twice"):
        compose_rewards([("math", 1.0), ("math", 0.5)])
    assert composer([], [], {}).total == []


# ------------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>reason</think><answer>4</answer>", 1.0),
        ("  <think>\nreason\n</think>\n<answer> 4 </answer>\n", 1.0),
        ("reasoning, the template opened the tag</think><answer>4</answer>", 1.0),
        ("<think></think><answer>4</answer>", 1.0),
        ("<think>reason</think><answer>4</answer> trailing text", 0.0),
        ("preamble <think>reason</think><answer>4</answer>", 0.0),
        ("<think>reason</think><answer></answer>", 0.0),
        ("<think>reason</think>", 0.0),
        ("<answer>4</answer>", 0.0),
        ("<think>a</think><answer>1</answer><answer>2</answer>", 0.0),
        ("<think>a</think><think>b</think><answer>1</answer>", 0.0),
        ("<think>a</think><answer>1</think><answer>2</answer>", 0.0),
    ],
)
def test_format_score(completion: str, expected: float) -> None:
    assert format_score(completion) == expected


# ------------------------------------------------------------------------------- countdown


@pytest.mark.parametrize(
    ("answer", "numbers", "target", "expected"),
    [
        ("(3 + 5) * 3", [3, 5, 3], 24, 1.0),  # a number given twice may be used twice
        ("(6 + 4) * 2 = 20", [6, 4, 2], 20, 1.0),  # "= target" is accepted
        ("6 × 4", [6, 4, 2], 24, 1.0),
        ("100 - 2", [2, 100, 7], 98, 1.0),  # not every number has to be used
        ("(7 - 1) / 3 * 9", [1, 3, 7, 9], 18, 1.0),  # exact fractions: 6/3*9
        ("9 / 6 * 4", [4, 6, 9], 6, 1.0),  # 3/2 * 4, the fraction is exact
        ("-(2 - 8)", [2, 8], 6, 1.0),
        ("24 / 1", [24, 1], 24, 1.0),  # only a divisor of 0 is refused
        ("(3 + 5) * 3", [3, 5], 24, 0.0),  # reuses 3
        ("4 * 6 + 1", [4, 6], 25, 0.0),  # 1 is not given
        ("4 * 6", [4, 6], 25, 0.0),  # wrong value
        ("(6 + 4) * 2 = 21", [6, 4, 2], 20, 0.0),
        ("24", [24], 24, 1.0),
        ("4 * 6 = 24 = 24", [4, 6], 24, 0.0),
        ("2 ** 3 * 3", [2, 3], 24, 0.0),  # only + - * /
        ("8 // 2", [8, 2], 4, 0.0),
        ("1 / (2 - 2)", [1, 2, 2], 0, 0.0),
        ("4.0 * 6", [4, 6], 24, 0.0),
        ("__import__('os').system('echo hi')", [1], 1, 0.0),
        ("[1, 2]", [1, 2], 3, 0.0),
        ("(" * 300 + "1" + ")" * 300, [1], 1, 0.0),
        (None, [1], 1, 0.0),
    ],
)
def test_countdown_score(answer: str | None, numbers: list[int], target: int, expected: float):
    assert countdown_score(answer, numbers, target) == expected


def test_evaluate_countdown_is_exact() -> None:
    from fractions import Fraction

    assert evaluate_countdown("1 / 3 + 1 / 3 + 1 / 3", [1, 3, 1, 3, 1, 3]) == 1
    assert evaluate_countdown("2 / 3", [2, 3]) == Fraction(2, 3)
    assert evaluate_countdown("2 / 3", [2]) is None
    assert evaluate_countdown("-24", [24]) == -24
    assert evaluate_countdown("+24", [24]) is None  # unary minus only, not unary plus


def test_countdown_reward_through_the_composer() -> None:
    completions = [
        "<think>try</think><answer>(3 + 5) * 3</answer>",
        "<think>try</think><answer>3 * 5 + 3 + 3</answer>",
        "<think>try</think><answer>__import__('os')</answer>",
    ]
    columns = {"numbers": [[3, 5, 3]] * 3, "target": [24] * 3}
    out = compose_rewards([("countdown", 1.0), ("format", 0.1)])(["p"] * 3, completions, columns)
    assert out.per_reward["countdown"] == [1.0, 0.0, 0.0]
    assert out.total == pytest.approx([1.1, 0.1, 0.1])
    assert out.errors == 0


def test_a_countdown_expression_over_256_characters_is_refused() -> None:
    ok = "+".join(["1"] * 128)  # 255 characters
    too_long = "+".join(["1"] * 129)  # 257 characters
    assert evaluate_countdown(ok, [1] * 200) == 128
    assert evaluate_countdown(ok + " ", [1] * 200) == 128  # 256 characters: the limit itself
    assert evaluate_countdown(too_long, [1] * 200) is None
    assert countdown_score(too_long, [1] * 200, 129) == 0.0


def test_countdown_needs_both_columns() -> None:
    with pytest.raises(ValueError, match="needs 'numbers' and 'target' columns"):
        countdown_reward(["p"], ["<answer>24</answer>"], numbers=[[24]])
    with pytest.raises(ValueError, match="needs 'numbers' and 'target' columns"):
        countdown_reward(["p"], ["<answer>24</answer>"], target=[24])


def test_tool_error_is_minus_one_for_any_failed_call() -> None:
    failed_calls = [0, 1, 3]
    assert tool_error_reward(["p"] * 3, ["a", "b", "c"], failed_calls) == [0.0, -1.0, -1.0]


def test_an_infinite_score_is_zero_and_an_error(scratch_registry: None) -> None:
    @register_reward("test_inf")
    def inf(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [float("inf"), -float("inf"), 0.5]

    out = compose_rewards([("test_inf", 2.0)], max_workers=1)(["p"] * 3, ["a", "b", "c"], {})
    assert out.total == [0.0, 0.0, 1.0]
    assert (out.timeouts, out.errors) == (0, 2)
    assert out.error_examples == [
        "test_inf: ValueError: non-finite score inf",
        "test_inf: ValueError: non-finite score -inf",
    ]


def test_a_reward_calling_sys_exit_is_an_error(scratch_registry: None) -> None:
    import sys

    @register_reward("test_exit")
    def leaves(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        sys.exit(3)

    composer = compose_rewards([("test_exit", 1.0), ("format", 1.0)], max_workers=1)
    out = composer(["p"], ["<think>a</think><answer>1</answer>"], {})
    assert out.per_reward["test_exit"] == [0.0] and out.total == [1.0]
    assert out.errors == 1 and out.error_examples == ["test_exit: SystemExit: 3"]


def test_error_examples_are_capped_at_five_over_all_calls(scratch_registry: None) -> None:
    @register_reward("test_all_nan")
    def all_nan(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [float("nan")] * len(completions)

    out = compose_rewards([("test_all_nan", 1.0)], max_workers=3)(["p"] * 12, ["x"] * 12, {})
    assert out.timeouts == 12 and len(out.error_examples) == 5


def test_a_signature_no_call_can_reach_is_told_apart() -> None:
    """Without **kwargs a reward must name every keyword a call passes; with it, or with
    verl's or OpenRLHF's signature (called their own way), or with no signature to read, it
    is accepted."""

    def verl(data_source, solution_str, ground_truth, extra_info=None):
        return 0.0

    def openrlhf(queries, prompts, labels):
        return [0.0] * len(queries)

    def lacks_two(prompts, completions, answer, completion_ids, trainer_state):
        return [0.0] * len(completions)

    rewards = (length_reward, verl, openrlhf, max, *(get_reward(n) for n in list_rewards()))
    for fn in rewards:
        assert signature_mismatch(fn) is None, fn
    assert signature_mismatch(lacks_two) == (
        "it takes (prompts, completions, answer, completion_ids, trainer_state) and no "
        "**kwargs, but a reward is called by keyword with prompts=, completions=, answer=, "
        "completion_ids=, trainer_state=, log_extra=, log_metric= and the problem's other "
        "columns, so every call would fail (no log_extra, log_metric); take **kwargs, as TRL's "
        "rewards do (def f(prompts, completions, answer, **kwargs)), or write verl's "
        "compute_score(data_source, solution_str, ground_truth, extra_info)"
    )
