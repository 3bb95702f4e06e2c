#!/usr/bin/env bash
# GRPO vs Dr. GRPO on the tiny task, from the demo's cold-start SFT model (runs/demo/sft).
set -euo pipefail
COMMON=(
  data.task=arithmetic data.max_digits=1 data.min_terms=3 data.max_terms=4 data.operators=+
  data.shortcut_frac=0.5 data.train_size=5000
  model.name_or_path=runs/demo/sft
  rollout.prompts_per_step=32 rollout.samples_per_prompt=8 rollout.max_new_tokens=48
  train.lr=1e-4 train.warmup_steps=5 train.steps=100
)
.venv/bin/rlvr train --preset grpo "${COMMON[@]}" algorithm.kl.coef=0 train.output_dir=runs/ablation/grpo
.venv/bin/rlvr train --preset dr_grpo "${COMMON[@]}" train.output_dir=runs/ablation/dr_grpo
.venv/bin/rlvr report runs/ablation/grpo runs/ablation/dr_grpo \
  --metric response_length/incorrect --metric response_length/correct \
  --metric accuracy --metric zero_std_frac --smoothing 0.6 \
  --output docs/img/grpo_vs_dr_grpo.png
