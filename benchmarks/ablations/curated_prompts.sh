#!/usr/bin/env bash
# GRPO on all 5,000 training problems vs on those `rlvr curate` keeps (pass rate 0.1-0.9 under
# the demo's cold-start SFT model, runs/demo/sft); both evaluated on the same 500 held-out
# problems. Run prioritized_sampling.sh first: its epoch arm is the uncurated arm.
set -euo pipefail
DATA=(
  data.task=arithmetic data.max_digits=1 data.min_terms=3 data.max_terms=4 data.operators=+
  data.shortcut_frac=0.5 data.train_size=5000
)
.venv/bin/rlvr curate "${DATA[@]}" model.name_or_path=runs/demo/sft curate.max_new_tokens=48 \
  curate.output=runs/ablation/curated.jsonl
.venv/bin/python - <<'PY'
import json

from rlvr.config import DataConfig
from rlvr.data.tasks import load_task

data = DataConfig(task="arithmetic", max_digits=1, min_terms=3, max_terms=4, operators="+",
                  shortcut_frac=0.5, train_size=5000)
with open("runs/ablation/held_out.jsonl", "w") as f:
    for p in load_task(data).test:
        f.write(json.dumps({"prompt": p.question, "answer": p.answer}) + "\n")
PY
.venv/bin/rlvr train --preset grpo data.task=file data.path=runs/ablation/curated.jsonl \
  data.test_path=runs/ablation/held_out.jsonl model.name_or_path=runs/demo/sft \
  rollout.prompts_per_step=32 rollout.samples_per_prompt=8 rollout.max_new_tokens=48 \
  train.lr=1e-4 train.warmup_steps=5 train.steps=100 algorithm.kl.coef=0 \
  eval.every_steps=25 eval.samples=500 eval.k=4 train.output_dir=runs/ablation/curated
.venv/bin/rlvr report runs/ablation/sampler_epoch runs/ablation/curated \
  --metric eval/pass@1 --metric accuracy --metric zero_std_frac \
  --smoothing 0.6 --output docs/img/curated_prompts.png
