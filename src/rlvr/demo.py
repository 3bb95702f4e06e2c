"""`rlvr demo`: the embedded default, end to end on a CPU in a few minutes.

tiny model -> cold-start SFT on worked arithmetic -> eval -> GRPO -> eval -> table + report.
The SFT is deliberately short, so the model samples correct answers only part of the time
and RL has something to sharpen; the held-out pass@1 before and after RL is the headline.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlvr.config import RLConfig, make_output_dir, resolve_config
from rlvr.config_offline import SFTConfig
from rlvr.data.tasks import load_task
from rlvr.evaluation.evaluate import evaluate_as_configured
from rlvr.models.loading import load_pretrained
from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.report import plot_runs
from rlvr.training.rl import train
from rlvr.training.sft import run_sft

# Sums of three or four one-digit numbers (two-digit results). Half of the cold-start solutions
# skip the steps and state the answer at once, so the SFT model mixes two behaviours and samples
# both noisily; RL finds out from the verifier alone which answers to make more likely.
DATA = {
    "task": "arithmetic",
    "max_digits": 1,
    "min_terms": 3,
    "max_terms": 4,
    "operators": "+",
    "shortcut_frac": 0.5,
    "train_size": 5000,
    "template": "chat",
}
MODEL = {"tiny": {"hidden_size": 192, "intermediate_size": 576, "num_layers": 4}}
SFT = {"steps": 600, "lr": 3e-3, "batch_size": 32, "warmup_steps": 20}
RL = [
    "rollout.prompts_per_step=32",
    "rollout.samples_per_prompt=8",
    "rollout.temperature=1.0",
    "rollout.max_new_tokens=48",
    "train.lr=1e-4",
    "train.warmup_steps=5",
]
RL_STEPS = 120
EVAL_K, EVAL_PROBLEMS = 8, 500
HEADLINE = ("pass@1", f"pass@{EVAL_K}", f"maj@{EVAL_K}", "response_length/mean", "truncated_frac")


def demo_configs(output_dir: Path, sft_steps: int, rl_steps: int) -> tuple[SFTConfig, RLConfig]:
    """The SFT and RL configs of the demo (shared data settings, RL starts from the SFT model)."""
    sft_cfg = SFTConfig.model_validate(
        {
            "model": MODEL,
            "data": DATA,
            "sft": {**SFT, "steps": sft_steps, "output_dir": str(output_dir / "sft")},
        }
    )
    overrides = (
        [f"data.{k}={v}" for k, v in DATA.items()]
        + RL
        + [
            f"model.name_or_path={output_dir / 'sft'}",
            f"train.output_dir={output_dir / 'rl'}",
            f"train.steps={rl_steps}",
            f"eval.samples={EVAL_PROBLEMS}",
            f"eval.k={EVAL_K}",
        ]
    )
    return sft_cfg, resolve_config(preset="grpo", overrides=overrides)


def evaluate_model_dir(model_dir: Path, cfg: RLConfig, problems: list, reward: str) -> dict:
    """Evaluate the HF model in `model_dir` with the eval settings of `cfg`."""
    model, tokenizer = load_pretrained(str(model_dir))
    return evaluate_as_configured(model, tokenizer, problems, reward, cfg)


def run_demo(
    output_dir: Path,
    *,
    sft_steps: int = SFT["steps"],
    rl_steps: int = RL_STEPS,
    eval_problems: int = EVAL_PROBLEMS,
    console: Console | None = None,
) -> dict:
    """Run the whole demo; write `summary.json`, `eval.jsonl` and `report.png` under output_dir."""
    console = console or Console(markup=False, soft_wrap=True)
    start = time.perf_counter()
    make_output_dir(output_dir, "--output-dir")
    sft_cfg, rl_cfg = demo_configs(output_dir, sft_steps, rl_steps)
    task = load_task(rl_cfg.data)
    held_out = task.test[:eval_problems]

    console.rule("1/4 cold-start SFT on worked solutions")
    sft_dir = run_sft(sft_cfg)
    console.rule(f"2/4 evaluate the SFT model on {len(held_out)} held-out problems")
    before = evaluate_model_dir(sft_dir, rl_cfg, held_out, task.reward)
    console.rule("3/4 GRPO")
    shutil.rmtree(output_dir / "rl" / "checkpoints", ignore_errors=True)  # a rerun starts over
    run_dir = train(rl_cfg)
    console.rule("4/4 evaluate the RL model")
    after = evaluate_model_dir(latest_checkpoint(run_dir), rl_cfg, held_out, task.reward)

    with JsonlWriter(output_dir / "eval.jsonl") as log:
        log.write({"stage": "before_rl", "model": str(sft_dir), **before})
        log.write({"stage": "after_rl", "model": str(latest_checkpoint(run_dir)), **after})
    plot_runs([run_dir], output_dir / "report.png")
    summary = {
        "before": {key: before[key] for key in HEADLINE},
        "after": {key: after[key] for key in HEADLINE},
        "seconds": time.perf_counter() - start,
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    table = Table(title=f"held-out {task.name} ({len(held_out)} problems, k={EVAL_K})")
    table.add_column("metric")
    table.add_column("after SFT", justify="right")
    table.add_column("after GRPO", justify="right")
    for key in HEADLINE:
        table.add_row(key, f"{before[key]:.3f}", f"{after[key]:.3f}")
    console.print(table)
    console.print(f"done in {summary['seconds']:.0f} s; everything is under {output_dir}/")
    return summary
