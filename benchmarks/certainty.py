"""Certainty rewards on the tiny default task: do they rank right answers above wrong ones,
and does training on them alone raise held-out pass@1?

From the learning tests' cold start (the demo's SFT model after 400 steps, pass@1 0.275):

1. ranking: 8 samples of each of 128 training prompts; for every measure of the `confidence`
   reward (self-certainty, negative entropy, log-likelihood; token mean and sum), the share
   of (right, wrong) pairs within a group in which the right completion scores higher (0.5:
   no better than chance), and each measure's token mean over the shortcut answers (no
   worked steps) and over the worked ones;
2. training (`--train`): GRPO with one `confidence` form as the only reward, 16 samples a
   prompt, lr 1e-5, `--steps` steps, then held-out pass@1 (k = 4, 200 problems).

    python benchmarks/certainty.py [--train] [--steps 40] [--seeds 0] [--out DIR]

The numbers are in docs/rewards.md (`confidence`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from cold_start import cold_start_evaluation, train_from

from rlvr.config import resolve_config
from rlvr.data.tasks import load_task
from rlvr.demo import DATA, RL
from rlvr.models.loading import eos_token_ids, load_pretrained
from rlvr.rewards.certainty import CERTAINTY_MEASURES, certainty_rewards
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.run_layout import latest_checkpoint
from rlvr.training.rewarding import RewardScorer
from rlvr.training.sampling import rollout_batch

FORMS = [(m, a) for m in CERTAINTY_MEASURES for a in ("mean", "sum")]


def right_above_wrong(scores: torch.Tensor, correct: torch.Tensor, groups: torch.Tensor) -> float:
    """The share of (right, wrong) pairs of a group whose right member scores higher."""
    wins = pairs = 0
    for group in groups.unique():
        members = groups == group
        right, wrong = scores[members & correct], scores[members & ~correct]
        wins += int((right[:, None] > wrong[None, :]).sum())
        pairs += right.numel() * wrong.numel()
    return wins / max(pairs, 1)


def ranking(sft_dir: Path, prompts: int = 128) -> dict[str, float]:
    data = [f"data.{k}={v}" for k, v in DATA.items()]
    cfg = resolve_config(preset="grpo", overrides=[*data, *RL, f"model.name_or_path={sft_dir}"])
    task = load_task(cfg.data)
    model, tokenizer = load_pretrained(str(sft_dir))
    engine = HFRolloutEngine(
        model, eos_token_ids(model, tokenizer), tokenizer.pad_token_id, 256,
        torch.Generator().manual_seed(0),
    )  # fmt: skip
    batch = rollout_batch(engine, tokenizer, task, list(range(prompts)), cfg)
    RewardScorer(cfg, task)(batch)
    shortcut = torch.tensor(["<think></think>" in c for c in batch.completion_texts])
    out = {
        "accuracy": round(float(batch.correct.float().mean()), 4),
        "shortcut_share": round(float(shortcut.float().mean()), 4),
        "accuracy/shortcut": round(float(batch.correct[shortcut].float().mean()), 4),
        "accuracy/worked": round(float(batch.correct[~shortcut].float().mean()), 4),
    }
    for measure, aggregate in FORMS:
        scores = torch.tensor(
            certainty_rewards(
                model, batch.prompt_ids, batch.completion_ids, tokenizer.pad_token_id,
                measure=measure, aggregate=aggregate,
            )
        )  # fmt: skip
        share = right_above_wrong(scores, batch.correct, batch.group_ids)
        out[f"{measure}/{aggregate}"] = round(share, 3)
        if aggregate == "mean":
            out[f"{measure}/mean/shortcut"] = round(float(scores[shortcut].mean()), 3)
            out[f"{measure}/mean/worked"] = round(float(scores[~shortcut].mean()), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_certainty"))
    args = parser.parse_args()

    sft_dir, evaluation = cold_start_evaluation(args.out, sft_steps=400)
    summary: dict = {"ranking": ranking(sft_dir)}
    print(json.dumps(summary["ranking"]), flush=True)
    if args.train:
        summary["cold_start"] = evaluation(sft_dir)["pass@1"]
        for seed in args.seeds:
            for measure, aggregate in FORMS:
                name = f"{measure}-{aggregate}-{seed}"
                options = f"{{measure: {measure}, aggregate: {aggregate}}}"
                reward = f"{{name: confidence, options: {options}}}"
                run_dir = train_from(
                    sft_dir, "grpo", args.out / name, args.steps, seed,
                    f"reward.functions=[{reward}]", "rollout.samples_per_prompt=16",
                    "train.lr=1e-5",
                )  # fmt: skip
                summary[name] = evaluation(latest_checkpoint(run_dir))["pass@1"]
                print(name, summary[name], flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
