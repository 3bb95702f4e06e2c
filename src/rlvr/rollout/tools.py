"""Tools the policy calls while it generates (tool-integrated reasoning: ToRL, ReTool).

A call is the tool's name as a tag around its input, `<calculator>12*(3+4)</calculator>`. The
closing tag is a stop sequence of the engine: when a completion ends with one, the tool runs on
the text after the last matching opening tag and its output is appended as
`<result>OUTPUT</result>`, then generation continues from the prompt, the completion so far
and the result, until an EOS, the generation budget (which the results count against) or
`max_calls` calls. The result's tokens are the tool's, not the policy's: `Rollout.tool_mask`
marks them, their rollout log-probs are 0, and the trainer leaves them out of the loss (their
response mask is 0) while the policy still reads them as context.

A tool is a function `f(arguments: str, *, timeout_s: float) -> str` registered in `TOOLS`;
it never raises for bad input (it returns `error: ...`, as the model should see it), and an
exception it does raise becomes such an output too, so a tool cannot stop a rollout.

The calls that end a turn run at once, on threads. How this departs from verl's and TRL's
multi-turn rollouts: the call format is a tag pair that any tokenizer can produce, not a chat
template's tool-call JSON, and each continuation prefills its prompt and completion afresh (no
KV cache is kept across a call).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rlvr.algorithms.registry import Registry
from rlvr.rewards.sandbox import SandboxError, run_python
from rlvr.rollout.base import (
    RESULT_CLOSE,
    RESULT_OPEN,
    Rollout,
    RolloutEngine,
    SamplingParams,
)

if TYPE_CHECKING:
    from rlvr.config import ToolSettings

TOOLS: Registry = Registry("tool")
"""Tools by name: ``fn(arguments: str, *, timeout_s: float) -> str`` (its output text)."""

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
def calculator(arguments: str, *, timeout_s: float = 5.0) -> str:
    """The value of an arithmetic expression: numbers, + − × / // % ** and parentheses
    (`12*(3+4)` → `84`, `7/2` → `3.5`); anything else, or a result above 1e30, is
    `error: ...`. An integral value is written without a decimal point."""
    text = arguments.strip()
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
def python(arguments: str, *, timeout_s: float = 5.0) -> str:
    """What a Python program prints, run in the code rewards' sandbox
    (`rlvr.rewards.sandbox.run_python`: no network, CPU, memory and process limits,
    `timeout_s` of wall clock); a failure is `error: ` and the last line of its stderr."""
    try:
        result = run_python(arguments, timeout_s=timeout_s, max_output_bytes=1 << 16)
    except SandboxError as exc:
        return f"error: the sandbox failed ({exc})"
    if result.timed_out:
        return f"error: timed out after {timeout_s:g} s"
    if not result.ok:
        lines = result.stderr.strip().splitlines()
        return f"error: {lines[-1] if lines else f'exit status {result.exit_code}'}"
    return result.stdout.strip()


def result_tokens(tokenizer, text: str) -> tuple[list[int], list[bool]]:
    """The token ids of `text` and, for each, whether it lies within a `<result>...</result>`
    span, tags included: what a tool wrote in a tool-calling solution (a token across a span's
    edge is the policy's). Needs a fast tokenizer (its offsets)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans, start = [], 0
    while (opened := text.find(RESULT_OPEN, start)) >= 0:
        closed = text.find(RESULT_CLOSE, opened)
        end = len(text) if closed < 0 else closed + len(RESULT_CLOSE)
        spans.append((opened, end))
        start = end
    marks = [any(a <= s and e <= b for a, b in spans) for s, e in encoded["offset_mapping"]]
    return encoded["input_ids"], marks


def count_calls(by_tool: Sequence[bool]) -> int:
    """The tool calls of a completion: its runs of tool-written tokens (`Rollout.tool_mask`)."""
    return sum(1 for i, mark in enumerate(by_tool) if mark and (i == 0 or not by_tool[i - 1]))


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


class ToolCaller:
    """A `RolloutEngine` whose completions may call `tools` (at most `max_calls` each): it
    samples from `engine` and runs the calls between turns (the module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        tools: Sequence[str],
        max_calls: int = 4,
        timeout_s: float = 5.0,
    ) -> None:
        for name in tools:
            TOOLS.get(name)  # an unknown name fails here, with the valid ones
        self.engine, self.tokenizer = engine, tokenizer
        self.tools, self.max_calls, self.timeout_s = list(tools), max_calls, timeout_s
        self.closing = {name: tuple(self._encode(f"</{name}>")) for name in self.tools}

    @property
    def model(self):
        """The policy module the wrapped engine samples from."""
        return self.engine.model

    def sync_weights(self, model) -> None:
        """Make the wrapped engine sample from the current weights of `model`."""
        self.engine.sync_weights(model)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _called(self, sample: _Sample) -> str | None:
        """The tool whose closing tag ends `sample`, if one does."""
        for name, closing in self.closing.items():
            if tuple(sample.tokens[-len(closing) :]) == closing:
                return name
        return None

    def _output(self, sample: _Sample, name: str) -> str:
        """What the call that ends `sample` returns: the tool on the text between the last
        opening tag of the policy's last turn and the closing tag."""
        text = self.tokenizer.decode(sample.last_turn())
        opening, closing = f"<{name}>", f"</{name}>"
        start = text.rfind(opening)
        if start < 0:
            return f"error: no {opening} before {closing}"
        return run_tool(name, text[start + len(opening) : text.rfind(closing)], self.timeout_s)

    def _outputs(self, calls: list[tuple[_Sample, str]]) -> list[str]:
        """The calls' outputs, run at once on threads (a `python` call waits on its sandbox
        process, and the processes run side by side)."""
        if len(calls) < 2:
            return [self._output(sample, name) for sample, name in calls]
        workers = min(len(calls), MAX_CONCURRENT_CALLS)
        with ThreadPoolExecutor(workers, thread_name_prefix="rlvr-tool") as pool:
            return list(pool.map(lambda call: self._output(*call), calls))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt, running their tool calls."""
        budget = params.max_new_tokens
        params = replace(params, stop_sequences=tuple(self.closing.values()))
        first = self.engine.generate(prompts, params)
        samples = [_Sample(prompts[i]) for i in first.prompt_index]
        pending = list(range(len(samples)))
        turn = first
        while pending:
            calls = []
            for row, tokens, logprobs, finish in zip(
                pending, turn.completion_ids, turn.logprobs, turn.finish_reason, strict=True
            ):
                sample = samples[row]
                room = budget - len(sample.tokens)
                sample.extend(tokens[:room], logprobs[:room], by_tool=False)
                sample.finish = "length" if len(tokens) > room else finish
                name = self._called(sample)
                if name is not None and sample.calls < self.max_calls and room > len(tokens):
                    calls.append((row, name))
            going = []
            outputs = self._outputs([(samples[row], name) for row, name in calls])
            for (row, _), output in zip(calls, outputs, strict=True):
                sample = samples[row]
                result = self._encode(f"{RESULT_OPEN}{output}{RESULT_CLOSE}")
                room = budget - len(sample.tokens)
                sample.extend(result[:room], [0.0] * min(room, len(result)), by_tool=True)
                sample.calls += 1
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
        )


@dataclass(frozen=True)
class ToolUse:
    """Which tools a rollout may call and how often (the `rollout.tools`, `max_tool_calls`
    and `tool_timeout` settings)."""

    names: tuple[str, ...] = ()
    max_calls: int = 4
    timeout_s: float = 5.0

    @classmethod
    def of(cls, settings: ToolSettings) -> ToolUse:
        """The settings of a config section (`rollout`, `curate`)."""
        return cls(tuple(settings.tools), settings.max_tool_calls, settings.tool_timeout)

    def around(self, engine: RolloutEngine, tokenizer) -> RolloutEngine:
        """`engine` itself when no tool is named, else a `ToolCaller` around it."""
        if not self.names:
            return engine
        return ToolCaller(engine, tokenizer, self.names, self.max_calls, self.timeout_s)
