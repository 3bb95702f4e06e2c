"""The call formats (`rollout.tool_format`): how a call is read and how its result is written."""

import json
from pathlib import Path

import pytest

from rlvr.config import ConfigError
from rlvr.data.templates import encode_prompts
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.call_formats import Call, Code, Hermes, Tags, call_format, tool_schema
from rlvr.rollout.tools import ToolCaller, ToolUse, result_tokens, stop_variants
from scripted_engine import TOK, Scripted, ids

QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A chat template laid out as Qwen2.5's: the tools in the system turn, the tool messages
after an assistant turn in one user turn, each in <tool_response> tags."""


def qwen_like_tokenizer(template: str = QWEN_LIKE):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def test_code_calls_run_the_last_block_and_answer_in_an_output_fence():
    """ToRL's format: the policy's ```output stops the turn, the last ```python block runs, its
    output and the closing fence are the tool's tokens; an ```output with no block before it is
    a failed call the model reads about."""
    call = "Let me compute.\n```python\nx = 6\nprint(x * 7)\n```\n```output"
    engine = Scripted([call, "```output"], ["\nSo <answer>42</answer>", "?"])
    caller = ToolCaller(engine, TOK, ["python"], form=Code())
    out = caller.generate([ids("Q")], SamplingParams(n=2, max_new_tokens=200))
    result = "\n42\n```\n"
    assert TOK.decode(out.completion_ids[0]) == call + result + "\nSo <answer>42</answer>"
    n_call, n_result = len(ids(call)), len(ids(result))
    assert out.tool_mask[0][n_call - 1 : n_call + n_result + 1] == [
        False,
        *[True] * n_result,
        False,
    ]
    missing = "\nerror: no ```python block before ```output\n```\n"
    assert TOK.decode(out.completion_ids[1]) == "```output" + missing + "?"
    assert out.failed_calls == [0, 1] and out.tool_calls == [1, 1]
    assert engine.asked[0][1].stop_sequences == (tuple(ids("```output")),)


@pytest.mark.parametrize(
    ("turn", "call"),
    [
        ("```python\nprint(1)\n```\n```output", Call("python", "print(1)\n")),
        ("```calculator\n2+3\n```\n```output", Call("calculator", "2+3\n")),
        ("```python\na\n```\ntext\n```python\nb\n```\n```output", Call("python", "b\n")),
        ("```python\na\n```\n```bash\nls\n```\n```output", Call("python", "a\n")),
        ("```output", Call(error="error: no ```python or ```calculator block before ```output")),
    ],
)
def test_code_reads_the_last_block_in_a_tools_language(turn, call):
    assert Code().parse(turn, ["python", "calculator"]) == [call]


def test_hermes_reads_its_tool_turns_from_the_chat_template():
    """The policy ends its turn with the template's end-of-turn token (the anchor); the tool's
    part is the template's tool messages, one per output, and the next assistant turn's
    opening. With the tiny model's compact template, its own tool turn."""
    qwen = Hermes(qwen_like_tokenizer())
    assert qwen.anchor == "<|im_end|>"
    assert qwen.before == "\n<|im_start|>user\n<tool_response>\n"
    assert qwen.after == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert qwen.result(["A", "B"]) == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    tiny = call_format("hermes", TOK)
    assert (tiny.anchor, tiny.before, tiny.after) == (
        "<|im_end|>",
        "<|tool|>",
        "<|im_end|><|assistant|>",
    )
    assert tiny.result(["A", "B"]) == "<|tool|>A<|im_end|><|tool|>B<|im_end|><|assistant|>"
    # A tool's output is the model's untrusted text: one that prints the second output's
    # placeholder must come back as written, not with the second output put in its place.
    hostile = "\x00OUTPUT2\x00"
    assert (
        tiny.result([hostile, "B"])
        == f"<|tool|>{hostile}<|im_end|><|tool|>B<|im_end|><|assistant|>"
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
            "{% endif %}{{ m.content }}{% endfor %}",
            "cannot render a tool turn",
        ),
        (
            "{% for m in messages %}{% if m.role != 'tool' %}{{ m.content }}{% endif %}"
            "{% endfor %}",
            "does not render tool messages after an assistant turn",
        ),
        (
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}",
            "ends an assistant turn with '\\n', not a special token",
        ),
    ],
)
def test_hermes_refuses_a_template_without_a_tool_turn(template, message):
    with pytest.raises(ConfigError) as error:
        Hermes(qwen_like_tokenizer(template))
    assert str(error.value).startswith(
        f"tool_format=hermes: the tokenizer's chat template {message}"
    )


@pytest.mark.parametrize(
    ("body", "call"),
    [
        ('{"name": "calculator", "arguments": {"expression": "6*7"}}', Call("calculator", "6*7")),
        ('{"name": "python", "arguments": {"code": "print(1)"}}', Call("python", "print(1)")),
        ('{"name": "calculator", "arguments": "1+1"}', Call("calculator", "1+1")),
        (
            '{"name": "calculator", "arguments": {"x": "1"}}',
            Call("calculator", error='error: calculator takes {"expression": <string>}'),
        ),
        (
            '{"name": "search", "arguments": {}}',
            Call(error="error: the call must be {\"name\": one of ['calculator', 'python'], ...}"),
        ),
        (
            '{"name": "calculator",',
            Call(
                error="error: the call is not JSON (Expecting property name enclosed in "
                "double quotes)"
            ),
        ),
    ],
)
def test_hermes_reads_the_json_call(body, call):
    form, tools = Hermes(qwen_like_tokenizer()), ["calculator", "python"]
    turn = f"I will call.\n<tool_call>{body}</tool_call><|im_end|>"
    assert form.parse(turn, tools) == [call]
    twice = f"<tool_call>{body}</tool_call>\n<tool_call>{body}</tool_call><|im_end|>"
    assert form.parse(twice, tools) == [call, call]
    assert form.parse("No call.<|im_end|>", tools) == []


def test_a_hermes_rollout_lists_the_tools_in_the_prompt_and_answers_in_tool_turns():
    """The prompt carries the tools' schemas (unless data.chat_template_kwargs gives its own).
    A turn's calls all run when it ends: one sample calls once, one twice (the second call
    fails), one answers at once; the results are the template's tool messages, marked as the
    tool's, and the policy's own end-of-turn token stays the policy's. A turn whose calls
    would pass max_calls ends the completion."""
    tokenizer = qwen_like_tokenizer()
    use = ToolUse(("calculator",), format="hermes")
    kwargs = use.chat_kwargs({})
    assert kwargs == {"tools": [tool_schema("calculator")]}
    assert use.chat_kwargs({"tools": []}) == {"tools": []}
    assert ToolUse(("calculator",)).chat_kwargs({"x": 1}) == {"x": 1}  # tags: none
    schema = tool_schema("calculator")["function"]
    assert schema["description"].startswith("Evaluates an arithmetic expression")
    assert schema["parameters"]["required"] == ["expression"]
    (text,), _ = encode_prompts("chat", ["What is 6*7?"], tokenizer, kwargs)
    assert json.dumps(tool_schema("calculator")) in text
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*"}}</tool_call>'
    end, answer = "<|im_end|>", "<answer>42</answer><|im_end|>"
    turns = [call + end, call + bad + end, answer], [answer, answer]
    out = use.around(Scripted(*turns, tokenizer=tokenizer), tokenizer).generate(
        [ids("Q", tokenizer)], SamplingParams(n=3, max_new_tokens=400)
    )
    one = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    two = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\nerror: "
    texts = [tokenizer.decode(c) for c in out.completion_ids]
    assert texts[0] == call + end + one + "<|im_start|>assistant\n" + answer
    assert texts[1].startswith(call + bad + end + two) and texts[1].endswith(answer)
    assert texts[2] == answer
    assert out.tool_calls == [1, 2, 0] and out.failed_calls == [0, 1, 0]
    tool_part = one + "<|im_start|>assistant\n"
    assert sum(out.tool_mask[0]) == len(ids(tool_part, tokenizer))
    assert not out.tool_mask[0][len(ids(call + end, tokenizer)) - 1]  # the policy's <|im_end|>
    limited = ToolUse(("calculator",), max_calls=1, format="hermes")
    engine = Scripted([call + bad + end], tokenizer=tokenizer)
    out = limited.around(engine, tokenizer).generate(
        [ids("Q", tokenizer)], SamplingParams(n=1, max_new_tokens=400)
    )
    assert tokenizer.decode(out.completion_ids[0]) == call + bad + end and out.tool_calls == [0]
    assert engine.asked[0][1].stop_sequences == ((tokenizer.eos_token_id,),)


def test_each_format_marks_the_tools_part_of_a_written_solution():
    """What `rlvr sft` leaves out of the loss: for each format, exactly the result's text."""
    hermes = Hermes(qwen_like_tokenizer())
    cases = [
        (Tags(), "<calculator>1+2</calculator>", Tags().result(["3"]), "<answer>3</answer>"),
        (Code(), "```python\nprint(1+2)\n```\n```output", "\n3\n```\n", "<answer>3</answer>"),
        (hermes, "<tool_call>{}</tool_call><|im_end|>", hermes.result(["3"]), "<answer>3</answer>"),
    ]
    for form, call, result, answer in cases:
        text = f"So: {call}{result}then {call}{result}{answer}"
        tokens, marks = result_tokens(TOK, text, form)
        assert tokens == ids(text)
        assert TOK.decode([t for t, m in zip(tokens, marks) if m]) == result + result
        assert form.result_spans(call + answer) == []


class Greedy:
    """A tokenizer that takes the longest piece of its vocabulary at each position."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        tokens, i = [], 0
        while i < len(text):
            piece = max((v for v in self.vocab if text.startswith(v, i)), key=len)
            tokens.append(self.vocab.index(piece))
            i += len(piece)
        return {"input_ids": tokens}

    def decode(self, tokens, skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[t] for t in tokens)


def test_a_stop_is_also_matched_as_a_merging_tokenizer_writes_it_after_a_newline():
    """A BPE vocabulary with a `\\n```` token writes "```output" after a newline as
    [`\\n````, `output`], which the stop alone ([```` ``` ````, `output`]) would not match."""
    merging = Greedy(["\n", " ", "`", "```", "\n```", "output", "o", "u", "t", "p"])
    assert stop_variants(merging, "```output") == [(3, 5), (4, 5)]
    plain = Greedy(["\n", " ", "`", "output"])
    assert stop_variants(plain, "```output") == [(2, 2, 2, 3)]


@pytest.mark.parametrize(
    ("template", "chat_kwargs", "opening"),
    [
        ("qwen2_5.jinja", {}, "<|im_start|>assistant\n"),
        ("qwen3.jinja", {}, "<|im_start|>assistant\n"),
        (
            "qwen3.jinja",
            {"enable_thinking": False},
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
    ],
)
def test_hermes_with_qwens_own_templates(template, chat_kwargs, opening):
    """Qwen2.5's and Qwen3's chat templates as TRL ships them: the schemas land in the system
    turn as Qwen was trained to read them, and two outputs come back in one user turn of
    <tool_response> blocks, then the assistant's opening (Qwen3 without thinking: its empty
    think block)."""
    import trl

    tokenizer = qwen_like_tokenizer(
        (Path(trl.__file__).parent / "chat_templates" / template).read_text()
    )
    use = ToolUse(("calculator",), format="hermes")
    kwargs = use.chat_kwargs(chat_kwargs)
    (text,), _ = encode_prompts("chat", ["What is 6*7?"], tokenizer, kwargs)
    assert f"<tools>\n{json.dumps(tool_schema('calculator'))}\n</tools>" in text
    form = Hermes(tokenizer, kwargs)
    assert form.anchor == "<|im_end|>"
    assert form.result(["A", "B"]) == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n"
        "</tool_response><|im_end|>\n" + opening
    )


def test_tags_read_the_input_after_the_last_opening_tag():
    turn = "<calculator>oops <calculator>2+3</calculator>"
    assert Tags().parse(turn, ["calculator"]) == [Call("calculator", "2+3")]


def test_a_result_at_the_very_start_of_a_solution_is_the_tools():
    """`tags` has no anchor, so a written solution may begin with a result: its span starts at
    0 and ends at its own </result>, not at the end of the text."""
    assert Tags().result_spans("<result>3</result>then 4") == [(0, 18)]
    assert Tags().result_spans("<result>3") == [(0, 9)]  # unclosed: to the end of the text
