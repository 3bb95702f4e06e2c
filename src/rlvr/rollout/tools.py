"""Tools the policy calls while it generates (tool-integrated reasoning: ToRL, ReTool).

A call is written in a call format (`rlvr.rollout.call_formats`; by default the tool's name as
a tag around its input, `<calculator>12*(3+4)</calculator>`). The end of a call is a stop
sequence of the engine: when a completion ends with one, the format reads the call from the
policy's turn, the tool runs, and its output is appended as the format writes it
(`<result>84</result>`); then generation continues from the prompt, the completion so far and
the result, until an EOS, the generation budget (which the results count against) or
`max_calls` calls (a turn whose calls would pass it ends the completion without results). The
result's tokens are the tool's, not the policy's: `Rollout.tool_mask`
marks them, their rollout log-probs are 0, and the trainer leaves them out of the loss (their
response mask is 0) while the policy still reads them as context.

A tool is a function `f(arguments: str, *, timeout_s: float) -> str` registered in `TOOLS`;
it never raises for bad input (it returns `error: ...`, as the model should see it), and an
exception it does raise becomes such an output too, so a tool cannot stop a rollout. An
output beginning `error:` is a failed call (`Rollout.failed_calls`).

The calls that end a turn run at once, on threads. How this departs from verl's and TRL's
multi-turn rollouts: each continuation prefills its prompt and completion afresh (no KV cache
is kept across a call), and decoding waits for a turn's calls.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rlvr.algorithms.registry import Registry
from rlvr.rewards.sandbox import SandboxError, run_python
from rlvr.rollout.base import Rollout, RolloutEngine, SamplingParams
from rlvr.rollout.call_formats import (
    CALL_FORMATS,
    Call,
    CallFormat,
    Tags,
    call_format,
    tool_schema,
)

if TYPE_CHECKING:
    from rlvr.config import ToolSettings

TOOLS: Registry = Registry("tool")
"""Tools by name: ``fn(arguments: str, *, timeout_s: float) -> str`` (its output text; the
first parameter's name is the JSON argument of a `hermes` call)."""

MAX_OUTPUT_CHARS = 200
"""A tool's output is cut to this many characters (the model reads it as context)."""

MAX_EXPRESSION_CHARS = 200
"""The calculator refuses longer expressions."""

MAX_CONCURRENT_CALLS = 16
"""Most tool calls run at once (on threads) between two turns."""

_OPERATORS: dict[type, Callable] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> int | float:
    """The value of an arithmetic expression tree; ValueError for anything else."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**12):
            raise ValueError("the power is too large")
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, complex) or abs(value) > 10**30:
            raise ValueError("the result is too large")
        return value
    raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")


@TOOLS.register("calculator")
def calculator(expression: str, *, timeout_s: float = 5.0) -> str:
    """Evaluates an arithmetic expression: numbers, + - * / // % ** and parentheses.

    `12*(3+4)` → `84`, `7/2` → `3.5`; anything else, or a result above 1e30, is
    `error: ...`. An integral value is written without a decimal point. (The first paragraph
    of a tool's docstring is its description in the `hermes` format's schema.)"""
    text = expression.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        return f"error: the expression is over {MAX_EXPRESSION_CHARS} characters"
    try:
        value = _evaluate(ast.parse(text, mode="eval"))
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, OverflowError, RecursionError) as exc:
        return f"error: {exc}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "error: the result is not finite"
        if value.is_integer():
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


@TOOLS.register("python")
def python(code: str, *, timeout_s: float = 5.0) -> str:
    """Runs a Python program and returns what it prints.

    It runs in the code rewards' sandbox (`rlvr.rewards.sandbox.run_python`: no network, CPU,
    memory and process limits, `timeout_s` of wall clock); a failure is `error: ` and the last
    line of its stderr."""
    try:
        result = run_python(code, timeout_s=timeout_s, max_output_bytes=1 << 16)
    except SandboxError as exc:
        return f"error: the sandbox failed ({exc})"
    if result.timed_out:
        return f"error: timed out after {timeout_s:g} s"
    if not result.ok:
        lines = result.stderr.strip().splitlines()
        return f"error: {lines[-1] if lines else f'exit status {result.exit_code}'}"
    return result.stdout.strip()


def result_tokens(tokenizer, text: str, form: CallFormat) -> tuple[list[int], list[bool]]:
    """The token ids of `text` and, for each, whether a tool wrote it in this tool-calling
    solution (within a result of format `form`, its texts included; a token across a result's
    edge is the policy's). Needs a fast tokenizer (its offsets)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = form.result_spans(text)
    marks = [any(a <= s and e <= b for a, b in spans) for s, e in encoded["offset_mapping"]]
    return encoded["input_ids"], marks


def run_tool(name: str, arguments: str, timeout_s: float) -> str:
    """`TOOLS[name]` on `arguments`, its output cut to `MAX_OUTPUT_CHARS`; an exception it
    raises is its output (`error: ...`), never the rollout's."""
    try:
        output = TOOLS.get(name)(arguments, timeout_s=timeout_s)
    except Exception as exc:  # a user's tool must not stop the rollout
        output = f"error: {type(exc).__name__}: {exc}"
    return output[:MAX_OUTPUT_CHARS]


@dataclass
class _Sample:
    """One completion being built across tool calls."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    by_tool: list[bool] = field(default_factory=list)
    finish: str = "length"
    calls: int = 0
    failed: int = 0

    def extend(self, tokens: list[int], logprobs: list[float], by_tool: bool) -> None:
        self.tokens += tokens
        self.logprobs += logprobs
        self.by_tool += [by_tool] * len(tokens)

    def last_turn(self) -> list[int]:
        """The policy's tokens since the last tool result."""
        start = len(self.by_tool)
        while start and not self.by_tool[start - 1]:
            start -= 1
        return self.tokens[start:]


def stop_variants(tokenizer, text: str) -> list[tuple[int, ...]]:
    """The token sequences a completion ending in `text` can end with: `text` alone, and as a
    BPE tokenizer writes it after a newline or a space when it merges them into its first
    token (`\\n```` is one token in some vocabularies)."""
    variants = [tuple(tokenizer(text, add_special_tokens=False)["input_ids"])]
    for lead in ("\n", " "):
        tokens = tuple(tokenizer(lead + text, add_special_tokens=False)["input_ids"])
        if tokenizer.decode(tokens[:1]) != lead and tokens not in variants:
            variants.append(tokens)
    return variants


def stop_token_sequences(
    form: CallFormat, tools: Sequence[str], tokenizer
) -> tuple[tuple[int, ...], ...]:
    """The token sequences a rollout stops at to read a call of `tools` in `form`: each
    tokenisation (`stop_variants`) of each of the format's stops."""
    return tuple(v for stop in form.stops(tools) for v in stop_variants(tokenizer, stop))


class ToolCaller:
    """A `RolloutEngine` whose completions may call `tools` (at most `max_calls` each) in
    `form` (default: tags): it samples from `engine` and runs the calls between turns (the
    module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        tools: Sequence[str],
        max_calls: int = 4,
        timeout_s: float = 5.0,
        form: CallFormat | None = None,
    ) -> None:
        for name in tools:
            TOOLS.get(name)  # an unknown name fails here, with the valid ones
        self.engine, self.tokenizer = engine, tokenizer
        self.tools, self.max_calls, self.timeout_s = list(tools), max_calls, timeout_s
        self.form = form or Tags()
        self.stops = self.form.stops(self.tools)
        self.stop_sequences = stop_token_sequences(self.form, self.tools, tokenizer)

    @property
    def model(self):
        """The policy module the wrapped engine samples from."""
        return self.engine.model

    def sync_weights(self, model) -> None:
        """Make the wrapped engine sample from the current weights of `model`."""
        self.engine.sync_weights(model)

    def _calls(self, sample: _Sample) -> list[Call]:
        """The calls of `sample`'s last turn, if it ended in a stop."""
        turn = self.tokenizer.decode(sample.last_turn(), skip_special_tokens=False)
        if not any(turn.endswith(stop) for stop in self.stops):
            return []
        return self.form.parse(turn, self.tools)

    def _output(self, call: Call) -> str:
        return call.error or run_tool(call.tool, call.arguments, self.timeout_s)

    def _outputs(self, calls: list[Call]) -> list[str]:
        """The calls' outputs, run at once on threads (a `python` call waits on its sandbox
        process, and the processes run side by side)."""
        if len(calls) < 2:
            return [self._output(call) for call in calls]
        workers = min(len(calls), MAX_CONCURRENT_CALLS)
        with ThreadPoolExecutor(workers, thread_name_prefix="rlvr-tool") as pool:
            return list(pool.map(self._output, calls))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt, running their tool calls."""
        budget = params.max_new_tokens
        params = replace(params, stop_sequences=self.stop_sequences)
        first = self.engine.generate(prompts, params)
        samples = [_Sample(prompts[i]) for i in first.prompt_index]
        pending = list(range(len(samples)))
        turn = first
        while pending:
            calling: list[tuple[int, list[Call]]] = []
            for row, tokens, logprobs, finish in zip(
                pending, turn.completion_ids, turn.logprobs, turn.finish_reason, strict=True
            ):
                sample = samples[row]
                room = budget - len(sample.tokens)
                sample.extend(tokens[:room], logprobs[:room], by_tool=False)
                sample.finish = "length" if len(tokens) > room else finish
                calls = self._calls(sample) if room > len(tokens) else []
                if calls and sample.calls + len(calls) <= self.max_calls:
                    calling.append((row, calls))
            going = []
            outputs = iter(self._outputs([call for _, calls in calling for call in calls]))
            for row, calls in calling:
                sample, ran = samples[row], [next(outputs) for _ in calls]
                result = self._encode(self.form.result(ran))
                room = budget - len(sample.tokens)
                sample.extend(result[:room], [0.0] * min(room, len(result)), by_tool=True)
                sample.calls += len(calls)
                sample.failed += sum(output.startswith("error:") for output in ran)
                if len(result) < room:
                    going.append(row)
                else:
                    sample.finish = "length"
            if not going:
                break
            room = budget - min(len(samples[row].tokens) for row in going)
            turn = self.engine.generate(
                [samples[row].prompt + samples[row].tokens for row in going],
                replace(params, n=1, min_new_tokens=0, max_new_tokens=room),
            )
            pending = going
        return Rollout(
            list(first.prompt_index),
            [s.tokens for s in samples],
            [s.logprobs for s in samples],
            [s.finish for s in samples],
            [s.by_tool for s in samples],
            [s.calls for s in samples],
            [s.failed for s in samples],
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class ToolUse:
    """Which tools a rollout may call, how often and in which format (the `rollout.tools`,
    `max_tool_calls`, `tool_timeout` and `tool_format` settings)."""

    names: tuple[str, ...] = ()
    max_calls: int = 4
    timeout_s: float = 5.0
    format: str = "tags"

    @classmethod
    def of(cls, settings: ToolSettings) -> ToolUse:
        """The settings of a config section (`rollout`, `curate`)."""
        return cls(
            tuple(settings.tools),
            settings.max_tool_calls,
            settings.tool_timeout,
            settings.tool_format,
        )

    def chat_kwargs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The chat template's arguments (`data.chat_template_kwargs`) with the tools' schemas
        added where the format puts them in the prompt (`hermes`) and the user gave none."""
        schemas = CALL_FORMATS.get(self.format).schemas_in_prompt
        if not self.names or not schemas or "tools" in given:
            return dict(given)
        return {**given, "tools": [tool_schema(name) for name in self.names]}

    def stop_sequences(
        self, tokenizer, chat_kwargs: Mapping[str, Any] | None = None
    ) -> tuple[tuple[int, ...], ...]:
        """The token sequences a rollout stops at to read a call (each tokenisation of each of
        the format's stops); none without tools."""
        if not self.names:
            return ()
        form = call_format(self.format, tokenizer, chat_kwargs)
        return stop_token_sequences(form, self.names, tokenizer)

    def around(
        self, engine: RolloutEngine, tokenizer, chat_kwargs: Mapping[str, Any] | None = None
    ) -> RolloutEngine:
        """`engine` itself when no tool is named, else a `ToolCaller` around it (a `hermes`
        format reads its tool turn from the chat template rendered with `chat_kwargs`)."""
        if not self.names:
            return engine
        form = call_format(self.format, tokenizer, chat_kwargs)
        return ToolCaller(engine, tokenizer, self.names, self.max_calls, self.timeout_s, form)
