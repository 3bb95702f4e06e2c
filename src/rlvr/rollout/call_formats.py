"""How a completion calls a tool and how the tool's output goes back in (`rollout.tool_format`).

- `tags`: the policy writes `<calculator>6*7</calculator>`, the tool `<result>42</result>`.
- `code`: the policy writes ```` ```python\\nprint(6*7)\\n```\\n```output ````, the tool
  `\\n42\\n```\\n`.
- `hermes`: the policy writes one or more
  `<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>` and ends
  its turn (`<|im_end|>`); the tool writes the chat template's `tool` messages, `42` in the
  first, and the next assistant turn's opening.

`tags` works with any tokenizer (the default). `code` is ToRL's (Li et al. 2025, *ToRL: Scaling
Tool-Integrated RL*, arXiv:2503.23383) and Qwen2.5-Math-Instruct's tool-integrated format:
the model ends a fenced code block and writes the output fence itself, which stops generation;
the code of the last block whose language names a tool runs, and its output and the closing
fence follow. `hermes` is the JSON call of Qwen2.5, Qwen3 and Hermes models (vLLM's `hermes`
tool parser, verl's `multi_turn.format: hermes`): the tools' schemas go into the prompt through
the chat template's `tools` argument, every call of a turn runs when the assistant ends its
turn, and the outputs come back as the tokenizer's own chat template renders `tool` messages
after an assistant turn, so the model reads what it was trained on.

A format is the text the engine stops at (`stops`), how the calls are read from the policy's
turn (`parse`), and the text around an output (`before`, `after`, `result`); the SFT masks
find the tool's part of a written solution with the same texts (`result_spans`).
"""

from __future__ import annotations

import inspect
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.algorithms.registry import Registry
from rlvr.config_files import ConfigError


@dataclass(frozen=True)
class Call:
    """A tool call read from a completion: the tool and its input, or why it could not be read
    (`error`, which the model gets as the call's output)."""

    tool: str = ""
    arguments: str = ""
    error: str = ""


class CallFormat(ABC):
    """The texts of one call format (the module docstring). A format is built from the
    tokenizer and the chat template's arguments (`CALL_FORMATS`)."""

    schemas_in_prompt = False
    """Whether the tools' schemas go into the prompt (the chat template's `tools`)."""

    def __init__(self, before: str, after: str, anchor: str = "") -> None:
        self.before = before
        """What precedes a tool's output (the opening of its result)."""
        self.after = after
        """What follows a tool's output (the end of its result)."""
        self.anchor = anchor
        """What the policy writes right before `before` in every call ('' when the call's end
        varies): a written solution's results are found after it."""

    @abstractmethod
    def stops(self, tools: Sequence[str]) -> list[str]:
        """The texts that end a policy turn that may hold calls."""

    @abstractmethod
    def parse(self, turn: str, tools: Sequence[str]) -> list[Call]:
        """The calls of `turn` (the policy's text since the last result, ending in a stop)."""

    def result(self, outputs: list[str]) -> str:
        """The text the outputs of a turn's calls enter the completion as."""
        return "".join(f"{self.before}{output}{self.after}" for output in outputs)

    def result_spans(self, text: str) -> list[tuple[int, int]]:
        """The character spans of `text` a tool wrote: each `before`, preceded by `anchor`,
        to the end of the next `after` (or of the text)."""
        opening, spans, start = self.anchor + self.before, [], 0
        while (found := text.find(opening, start)) >= 0:
            begin = found + len(self.anchor)
            closed = text.find(self.after, begin + len(self.before))
            end = len(text) if closed < 0 else closed + len(self.after)
            spans.append((begin, end))
            start = end
        return spans


class Tags(CallFormat):
    """`<NAME>input</NAME>` → `<result>output</result>`."""

    def __init__(self, tokenizer=None, chat_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__("<result>", "</result>")

    def stops(self, tools: Sequence[str]) -> list[str]:
        return [f"</{name}>" for name in tools]

    def parse(self, turn: str, tools: Sequence[str]) -> list[Call]:
        name = next(name for name in tools if turn.endswith(f"</{name}>"))
        opening, closing = f"<{name}>", f"</{name}>"
        start = turn.rfind(opening)
        if start < 0:
            return [Call(name, error=f"error: no {opening} before {closing}")]
        return [Call(name, turn[start + len(opening) : len(turn) - len(closing)])]


CODE_BLOCK = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
"""A fenced code block: its language and its code."""


class Code(CallFormat):
    """ToRL's fences: a ```` ```NAME ```` block, then ```` ```output ```` written by the policy
    (the stop); the output follows as `\\nOUTPUT\\n```\\n`."""

    def __init__(self, tokenizer=None, chat_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__("\n", "\n```\n", anchor="```output")

    def stops(self, tools: Sequence[str]) -> list[str]:
        return [self.anchor]

    def parse(self, turn: str, tools: Sequence[str]) -> list[Call]:
        blocks = [b for b in CODE_BLOCK.finditer(turn[: -len(self.anchor)]) if b[1] in tools]
        if not blocks:
            fences = " or ".join(f"```{name}" for name in tools)
            return [Call(error=f"error: no {fences} block before ```output")]
        return [Call(blocks[-1][1], blocks[-1][2])]


def tool_parameter(fn) -> str:
    """The name of a tool function's input (its first parameter): `hermes` calls give the
    input as this JSON argument."""
    return next(iter(inspect.signature(fn).parameters))


def tool_schema(name: str) -> dict[str, Any]:
    """The OpenAI-style function schema of a registered tool, as chat templates take them:
    its name, its docstring's first paragraph and one string parameter (`tool_parameter`)."""
    from rlvr.rollout.tools import TOOLS

    fn = TOOLS.get(name)
    description = " ".join(inspect.getdoc(fn).split("\n\n")[0].split()) if fn.__doc__ else name
    parameter = tool_parameter(fn)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string"}},
                "required": [parameter],
            },
        },
    }


def turn_end(tokenizer, turn: str, setting: str, advice: str = "") -> tuple[int, str]:
    """(id, text) of the token that opens `turn`, what a chat template writes right after an
    assistant's message: the end of the assistant's turn, which the policy samples, so it
    must be a special token (else a `ConfigError` naming `setting`, then `advice`)."""
    first = tokenizer(turn, add_special_tokens=False)["input_ids"][:1]
    end = tokenizer.decode(first, skip_special_tokens=False)
    if not first or end not in {*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()}:
        raise ConfigError(
            f"{setting}: the tokenizer's chat template ends an assistant turn with {end!r}, "
            f"not a special token{advice}"
        )
    return first[0], end


CALL = "\x00CALL\x00"
"""A placeholder for the assistant's turn, rendered through a chat template."""


def _output(n: int) -> str:
    """A placeholder for the n-th tool output."""
    return f"\x00OUTPUT{n}\x00"


OUTPUT = re.compile("\x00OUTPUT([0-9]+)\x00")
"""Any `_output` placeholder, and its number."""


TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
"""A `hermes` call."""


class Hermes(CallFormat):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as many as the
    assistant writes before it ends its turn (with the template's end-of-turn token, the
    `anchor`), answered by the chat template's `tool` messages, one per call, and the opening
    of the next assistant turn: all read from the template rendered around placeholders
    (`chat_kwargs`: `data.chat_template_kwargs`)."""

    schemas_in_prompt = True

    def __init__(self, tokenizer, chat_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer, self.chat_kwargs = tokenizer, dict(chat_kwargs or {})
        self._rendered: dict[int, str] = {}
        turn = self._tool_turns(1)
        _, end = turn_end(tokenizer, turn, "tool_format=hermes", "; use tool_format=tags or code")
        before, after = turn[len(end) :].split(_output(1))
        super().__init__(before, after, anchor=end)

    def _tool_turns(self, n: int) -> str:
        """What the template writes after an assistant turn for `n` tool messages: the end of
        the turn, the tool messages (placeholders for their outputs) and the next assistant
        turn's opening (rendered once for each `n`)."""
        if n in self._rendered:
            return self._rendered[n]
        messages = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": CALL},
            *({"role": "tool", "content": _output(i + 1)} for i in range(n)),
        ]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **self.chat_kwargs
            )
        except Exception as exc:  # jinja's errors (a template that refuses the `tool` role)
            raise ConfigError(
                f"tool_format=hermes: the tokenizer's chat template cannot render a tool turn "
                f"({type(exc).__name__}: {exc}); use tool_format=tags or code"
            ) from None
        turn = text[text.find(CALL) + len(CALL) :]
        outputs = [turn.find(_output(i + 1)) for i in range(n)]
        if text.count(CALL) != 1 or min(outputs) < 0 or outputs != sorted(outputs):
            raise ConfigError(
                "tool_format=hermes: the tokenizer's chat template does not render tool "
                "messages after an assistant turn; use tool_format=tags or code"
            )
        self._rendered[n] = turn
        return turn

    def stops(self, tools: Sequence[str]) -> list[str]:
        return [self.anchor]

    def parse(self, turn: str, tools: Sequence[str]) -> list[Call]:
        return [self._read(body, tools) for body in TOOL_CALL.findall(turn)]

    @staticmethod
    def _read(body: str, tools: Sequence[str]) -> Call:
        """The call written as `body`, the JSON inside one `<tool_call>` block."""
        from rlvr.rollout.tools import TOOLS

        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            return Call(error=f"error: the call is not JSON ({exc.msg})")
        if not isinstance(call, dict) or call.get("name") not in tools:
            return Call(error=f'error: the call must be {{"name": one of {list(tools)}, ...}}')
        name, arguments = call["name"], call.get("arguments", {})
        if isinstance(arguments, str):
            return Call(name, arguments)
        parameter = tool_parameter(TOOLS.get(name))
        if not isinstance(arguments, dict) or not isinstance(arguments.get(parameter), str):
            return Call(name, error=f'error: {name} takes {{"{parameter}": <string>}}')
        return Call(name, arguments[parameter])

    def result(self, outputs: list[str]) -> str:
        text = self._tool_turns(len(outputs))[len(self.anchor) :]
        return OUTPUT.sub(lambda placeholder: outputs[int(placeholder[1]) - 1], text)


CALL_FORMATS: Registry = Registry("tool call format")
"""Format classes by name, each built as ``cls(tokenizer, chat_kwargs)``."""
CALL_FORMATS.register("tags")(Tags)
CALL_FORMATS.register("code")(Code)
CALL_FORMATS.register("hermes")(Hermes)


def call_format(name: str, tokenizer, chat_kwargs: Mapping[str, Any] | None = None) -> CallFormat:
    """The format `name` for `tokenizer` (its chat template, with `chat_kwargs`)."""
    return CALL_FORMATS.get(name)(tokenizer, chat_kwargs)
