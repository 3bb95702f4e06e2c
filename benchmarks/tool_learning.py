"""What a calculator tool buys the tiny model, and whether RL with the tool raises it further.

Problems: chains of 2–3 additions and subtractions of up to two-digit numbers (harder than
the demo's one-digit sums). Three arms, from the same tiny model:

- `worked`: SFT on worked solutions (one line per operation), evaluated without tools;
- `tool`: SFT on solutions that call the calculator, `<calculator>EXPR</calculator>
  <result>VALUE</result><answer>VALUE</answer>`, the result left out of the loss
  (`sft.mask_tool_results`, the default), evaluated with the calculator and without it;
- `tool+rl`: GRPO (or `--preset`'s algorithm) from `tool` with `rollout.tools=[calculator]`,
  evaluated with it.

With `--format code` the tool solutions are ToRL's, the `python` tool printing the expression
(```` ```python\nprint(EXPR)\n```\n```output\nVALUE\n```\n<answer>VALUE</answer> ````); with
`--format hermes` they call the calculator in JSON, answered in the chat template's tool turn.

    python benchmarks/tool_learning.py [--sft-steps 600] [--rl-steps 30] [--format tags]
        [--engine hf] [--preset grpo] [--out DIR]

(`--engine vllm` samples the RL rollouts with vLLM, in any format; run it with
`.venv-vllm/bin/python`.)

prints pass@1 of each (k = 4, 200 held-out problems) and writes `summary.json` under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlvr.config import preset_names, resolve_config
from rlvr.config_offline import SFTConfig
from rlvr.data.synthetic import synthetic_splits
from rlvr.data.tasks import load_task
from rlvr.demo import MODEL, SFT
from rlvr.evaluation.evaluate import evaluate
from rlvr.models.loading import load_pretrained
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout.call_formats import call_format
from rlvr.rollout.tools import ToolUse
from rlvr.run_layout import latest_checkpoint
from rlvr.training.rl import train
from rlvr.training.sft import run_sft

TASK = {"max_digits": 2, "min_terms": 2, "max_terms": 3, "operators": "+-"}
BUDGET = {"tags": 96, "code": 96, "hermes": 160}
TOOL = {"tags": "calculator", "code": "python", "hermes": "calculator"}


def tool_solution(form: str, expression: str, answer: str) -> str:
    """A solution that calls the format's tool on `expression` and answers with its output."""
    written = call_format(form, build_tiny_tokenizer())
    result = written.result([answer])
    if form == "code":
        call = f"```python\nprint({expression})\n```\n```output"
    elif form == "hermes":
        arguments = json.dumps({"expression": expression})
        call = f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
        call += written.anchor  # the end of the assistant's turn
    else:
        call = f"<calculator>{expression}</calculator>"
    return f"{call}{result}<answer>{answer}</answer>"


def write_files(
    out: Path, train_size: int, test_size: int, form: str = "tags"
) -> tuple[Path, Path, Path]:
    """The training problems with worked and with tool-calling solutions (in call format
    `form`), and the test file."""
    train, test = synthetic_splits(
        "arithmetic", train_size=train_size, test_size=test_size, seed=0, **TASK
    )

    def rows(problems, style):
        for p in problems:
            expression = p.question.removeprefix("What is ").removesuffix("?")
            solution = p.solution
            if style == "tool":
                solution = tool_solution(form, expression, p.answer)
            yield {"prompt": p.question, "answer": p.answer, "solution": solution}

    paths = out / "worked.jsonl", out / "tool.jsonl", out / "test.jsonl"
    for path, problems, style in zip(paths, (train, train, test), ("worked", "tool", "worked")):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows(problems, style)))
    return paths


def data_settings(train_path: Path, test_path: Path) -> dict:
    return {
        "task": "file",
        "path": str(train_path),
        "test_path": str(test_path),
        "solution_column": "solution",
        "template": "chat",
    }


def pass_at_1(
    model_dir: Path, problems, reward: str, budget: int, tools: ToolUse = ToolUse()
) -> float:
    model, tokenizer = load_pretrained(str(model_dir))
    scores = evaluate(
        model, tokenizer, problems, reward=reward, template="chat", k=4, max_new_tokens=budget,
        tools=tools,
    )  # fmt: skip
    return scores["pass@1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=SFT["steps"])
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--format", choices=sorted(BUDGET), default="tags")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--preset", choices=preset_names(), default="grpo")
    parser.add_argument("--out", type=Path, default=Path("runs/tool_learning"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    budget, tools = BUDGET[args.format], ToolUse((TOOL[args.format],), format=args.format)
    worked, tool, test = write_files(args.out, 4000, 200, args.format)
    models = {}
    for name, path in (("worked", worked), ("tool", tool)):
        cfg = SFTConfig.model_validate(
            {
                "model": MODEL,
                "data": data_settings(path, test),
                "sft": {
                    **SFT,
                    "steps": args.sft_steps,
                    "tools": list(tools.names) if name == "tool" else [],
                    "tool_format": args.format,
                    "output_dir": str(args.out / name),
                },
            }
        )
        models[name] = run_sft(cfg, show_progress=False)
    data = data_settings(tool, test)
    rl_cfg = resolve_config(
        preset=args.preset,
        overrides=[
            *(f"data.{key}={value}" for key, value in data.items()),
            f"model.name_or_path={models['tool']}",
            f"train.output_dir={args.out / 'tool_rl'}",
            f"train.steps={args.rl_steps}",
            "train.lr=1e-4",
            "train.warmup_steps=5",
            "rollout.prompts_per_step=32",
            "rollout.samples_per_prompt=8",
            f"rollout.max_new_tokens={budget}",
            f"rollout.tools=[{TOOL[args.format]}]",
            f"rollout.tool_format={args.format}",
            f"rollout.engine={args.engine}",
            "eval.every_steps=0",
        ],
    )
    task = load_task(rl_cfg.data)
    held_out = task.test
    results = {
        "worked": pass_at_1(models["worked"], held_out, task.reward, budget),
        "tool, without the tool": pass_at_1(models["tool"], held_out, task.reward, budget),
        "tool": pass_at_1(models["tool"], held_out, task.reward, budget, tools),
    }
    run_dir = train(rl_cfg, show_progress=False)
    results["tool+rl"] = pass_at_1(latest_checkpoint(run_dir), held_out, task.reward, budget, tools)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    summary = {
        "format": args.format,
        "engine": args.engine,
        "preset": args.preset,
        "pass@1": results,
        "tool_calls/frac": [metrics[0]["tool_calls/frac"], metrics[-1]["tool_calls/frac"]],
        "rollout/logprob_diff": max(m["rollout/logprob_diff"] for m in metrics),
        "seconds": time.perf_counter() - start,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
