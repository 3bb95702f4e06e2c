#!/usr/bin/env bash
# Uniform (epoch) vs prioritised (Kimi k1.5) prompt sampling, GRPO without KL, from the demo's
# cold-start SFT model (runs/demo/sft); held-out pass@1 every 25 steps.
set -euo pipefail
COMMON=(
  data.task=arithmetic data.max_digits=1 data.min_terms=3 data.max_terms=4 data.operators=+
  data.shortcut_frac=0.5 data.train_size=5000
  model.name_or_path=runs/demo/sft
  rollout.prompts_per_step=32 rollout.samples_per_prompt=8 rollout.max_new_tokens=48
  train.lr=1e-4 train.warmup_steps=5 train.steps=100 algorithm.kl.coef=0
  eval.every_steps=25 eval.samples=500 eval.k=4
)
for sampler in epoch prioritized; do
  .venv/bin/rlvr train --preset grpo "${COMMON[@]}" data.sampler=$sampler \
    train.output_dir=runs/ablation/sampler_$sampler
done
.venv/bin/rlvr report runs/ablation/sampler_epoch runs/ablation/sampler_prioritized \
  --metric eval/pass@1 --metric accuracy --metric zero_std_frac --metric sampler/solved \
  --smoothing 0.6 --output docs/img/prioritized_sampling.png
