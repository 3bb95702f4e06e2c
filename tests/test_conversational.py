"""Conversational prompts (TRL's list-of-messages format) in data files: parsed, checked row by
row, rendered by the chat template, and trained on."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError, resolve_config
from rlvr.config_offline import SFTConfig
from rlvr.data.curation import curate_row, drop_duplicates
from rlvr.data.loaders import DatasetError, load_file
from rlvr.data.synthetic import synthetic_splits
from rlvr.data.tasks import load_task
from rlvr.data.templates import apply_template, encode_prompts
from rlvr.evaluation.evaluate import evaluate
from rlvr.models.loading import load_pretrained, save_pretrained
from rlvr.models.tiny import CHAT_TEMPLATE, build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from rlvr.training.sft import run_sft
from tiny_run import TINY_RUN

SYSTEM = {"role": "system", "content": "Answer in tags."}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_conversation_is_kept_and_its_last_user_turn_is_the_question(tmp_path):
    rows = [
        {"prompt": [SYSTEM, {"role": "user", "content": "What is 2+3?"}], "answer": 5, "id": 7},
        {"prompt": "What is 1+1?", "answer": "2"},
    ]
    conversation, plain = load_file(write_jsonl(tmp_path / "c.jsonl", rows))
    assert conversation.question == "What is 2+3?" and conversation.answer == "5"
    assert conversation.messages == (SYSTEM, {"role": "user", "content": "What is 2+3?"})
    assert conversation.prompt == [SYSTEM, {"role": "user", "content": "What is 2+3?"}]
    assert conversation.columns == {"id": 7}
    assert plain.messages is None and plain.prompt == "What is 1+1?"


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "must end with a non-empty user turn"),
        ([SYSTEM], "must end with a non-empty user turn"),
        ([{"role": "user", "content": "  "}], "must end with a non-empty user turn"),
        ([{"role": "user"}], "message 1: expected an object with 'role' and 'content'"),
        (["hi"], "message 1: expected an object"),
        ([SYSTEM, {"role": "robot", "content": "x"}], "message 2: role must be one of"),
        ([{"role": "user", "content": 3}], "message 1: role must be one of"),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}],
            "the closing assistant turn is empty",
        ),
        ([SYSTEM, {"role": "assistant", "content": "x"}], "must end with a non-empty user turn"),
        ([{"role": "assistant", "content": "x"}], "must end with a non-empty user turn"),
    ],
)
def test_bad_conversations_name_file_row_and_message(tmp_path, prompt, message):
    path = write_jsonl(
        tmp_path / "c.jsonl", [{"prompt": "ok?", "answer": 1}, {"prompt": prompt, "answer": 1}]
    )
    with pytest.raises(DatasetError, match=r"c\.jsonl, row 2 \(line 2\): column 'prompt'") as e:
        load_file(path)
    assert message in str(e.value)


def test_trl_s_sft_rows_give_their_reply_as_the_solution_and_need_no_answer(tmp_path):
    """TRL's conversational SFT rows (`messages` ending with the assistant's reply) and its
    prompt-completion rows load as problems whose solution is the reply, with
    data.answer_column=null for rows without a gold answer; `rlvr sft` fits them."""
    problems, _ = synthetic_splits("arithmetic", train_size=40, test_size=1, seed=0, max_digits=1)
    conversations = [
        {"messages": [SYSTEM, {"role": "user", "content": p.question},
                      {"role": "assistant", "content": p.solution}]}
        for p in problems
    ]  # fmt: skip
    completions = [{"prompt": p.question, "completion": p.solution} for p in problems]
    for rows, columns in (
        (conversations, {"prompt_column": "messages"}),
        (completions, {"solution_column": "completion"}),
    ):
        path = write_jsonl(tmp_path / "sft.jsonl", rows)
        loaded = load_file(path, answer_column=None, **columns)
        assert [p.solution for p in loaded] == [p.solution for p in problems]
        assert [p.question for p in loaded] == [p.question for p in problems]
        assert {p.answer for p in loaded} == {""} and all(not p.columns for p in loaded)
        if "prompt_column" in columns:
            assert loaded[0].messages == (SYSTEM, {"role": "user", "content": problems[0].question})
        overrides = [f"data.{key}={value}" for key, value in columns.items()]
        cfg = resolve_config(
            overrides=[
                "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
                "model.tiny.intermediate_size=64", "data.task=file", f"data.path={path}",
                "data.answer_column=null", "data.test_size=4", "sft.steps=30", "sft.lr=3e-3",
                "sft.batch_size=8", "sft.warmup_steps=0", f"sft.output_dir={tmp_path / 'run'}",
                *overrides,
            ],
            model=SFTConfig,
        )  # fmt: skip
        run_sft(cfg, show_progress=False)
        losses = [r["loss"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
        assert losses[-1] < 0.8 * losses[0], losses


def test_only_the_chat_template_renders_a_conversation():
    tok = build_tiny_tokenizer()
    messages = [SYSTEM, {"role": "user", "content": "What is 2+3?"}]
    text = apply_template("chat", messages, tok)
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "Answer in tags." in text and text != apply_template("chat", "What is 2+3?", tok)
    texts, ids = encode_prompts("chat", [messages, "What is 2+3?"], tok)
    assert texts[0] == text and len(ids[0]) > len(ids[1])
    with pytest.raises(ValueError, match=r"need data\.template=chat"):
        apply_template("r1", messages, tok)


def test_curation_writes_the_conversation_back_and_tells_system_prompts_apart(tmp_path):
    rows = [
        {"prompt": [SYSTEM, {"role": "user", "content": "What is 2+3?"}], "answer": 5},
        {"prompt": [{"role": "user", "content": "What is 2+3?"}], "answer": 5},
        {"prompt": [SYSTEM, {"role": "user", "content": "What is 2+3?"}], "answer": 5},
    ]
    problems = load_file(write_jsonl(tmp_path / "c.jsonl", rows))
    unique = drop_duplicates(problems)
    assert [p.messages for p in unique] == [problems[0].messages, problems[1].messages]
    assert curate_row(unique[0], 0.5) == {
        "prompt": rows[0]["prompt"],
        "answer": "5",
        "pass_rate": 0.5,
    }


def test_rl_trains_on_a_conversational_file(tmp_path):
    problems, _ = synthetic_splits("arithmetic", train_size=30, test_size=1, seed=0, max_digits=1)
    rows = [
        {"prompt": [SYSTEM, {"role": "user", "content": p.question}], "answer": p.answer}
        for p in problems
    ]
    data = write_jsonl(tmp_path / "conv.jsonl", rows)
    overrides = [*TINY_RUN, "data.task=file", f"data.path={data}", "data.test_size=4"]
    cfg = resolve_config(
        preset="grpo",
        overrides=[*overrides, "train.steps=2", f"train.output_dir={tmp_path / 'run'}"],
    )
    run_dir = train(cfg, show_progress=False)
    samples = [r for r in read_jsonl(run_dir / "samples.jsonl") if "prompt" in r]
    assert samples and all("Answer in tags." in s["prompt"] for s in samples)
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]


THINKING_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|assistant|>{% endif %}",
    "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}",
)  # Qwen3's switch, on the tiny template


def test_chat_template_kwargs_reach_the_chat_template_only():
    tok = build_tiny_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    assert apply_template("chat", "Q", tok) == "<|user|>Q<|im_end|><|assistant|>"
    off = apply_template("chat", "Q", tok, {"enable_thinking": False})
    assert off == "<|user|>Q<|im_end|><|assistant|><think></think>"
    with pytest.raises(
        ValueError, match=r"chat_template_kwargs are for data\.template=chat, not r1"
    ):
        apply_template("r1", "Q", tok, {"enable_thinking": False})
    with pytest.raises(ConfigError, match=r"data\.template=none has none"):
        resolve_config(overrides=["data.template=none", "data.chat_template_kwargs={a: 1}"])


def test_a_run_and_its_evaluation_render_prompts_with_the_chat_template_kwargs(tmp_path):
    """RL samples, and `rlvr eval` of its checkpoint (the run's data settings), both see the
    prompt the chat template writes with data.chat_template_kwargs."""
    tok = build_tiny_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    save_pretrained(model, tok, tmp_path / "base")
    run_dir = tmp_path / "run"
    cfg = resolve_config(
        overrides=[*TINY_RUN, f"model.name_or_path={tmp_path / 'base'}", "train.steps=1",
                   "data.chat_template_kwargs={enable_thinking: false}",
                   f"train.output_dir={run_dir}"]
    )  # fmt: skip
    train(cfg, show_progress=False)
    prompts = {s["prompt"] for s in read_jsonl(run_dir / "samples.jsonl")}
    assert prompts and all(p.endswith("<|assistant|><think></think>") for p in prompts)
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", str(run_dir), "--samples", "3", "--k", "2"]
    result = CliRunner().invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    assert got["chat_kwargs"] == {"enable_thinking": False}
    checkpoint, _ = load_pretrained(str(run_dir / "checkpoints" / "step-1"))
    want = evaluate(
        checkpoint, tok, load_task(cfg.data).test[:3], reward="math", k=2,
        max_new_tokens=cfg.rollout.max_new_tokens, chat_kwargs={"enable_thinking": False},
    )  # fmt: skip
    for key in ("pass@1", "pass@2", "response_length/mean", "truncated_frac"):
        assert got[key] == want[key], key
