#!/usr/bin/env bash
# GPG with and without its threshold β_th (algorithm.min_informative_fraction: 0.6, the gpg
# preset's, against 0), from the demo's cold-start SFT model (runs/demo/sft) on sums of four
# or five one-digit numbers (it was trained on three or four), where about half the groups
# are constant; held-out pass@1 every 25 steps.
set -euo pipefail
COMMON=(
  data.task=arithmetic data.max_digits=1 data.min_terms=4 data.max_terms=5 data.operators=+
  data.shortcut_frac=0.5 data.train_size=5000
  model.name_or_path=runs/demo/sft
  rollout.prompts_per_step=32 rollout.samples_per_prompt=8 rollout.max_new_tokens=48
  train.lr=1e-4 train.warmup_steps=5 train.steps=100
  eval.every_steps=25 eval.samples=500 eval.k=4
)
for seed in 0 1; do
  for beta in 0.6 0; do
    .venv/bin/rlvr train --preset gpg "${COMMON[@]}" algorithm.min_informative_fraction=$beta \
      train.seed=$seed train.output_dir=runs/ablation/gpg_beta_$beta-seed_$seed
  done
  # without the threshold for as many sampled completions as the threshold's 100 steps took
  .venv/bin/rlvr train --preset gpg "${COMMON[@]}" algorithm.min_informative_fraction=0 \
    train.steps=200 train.seed=$seed train.output_dir=runs/ablation/gpg_beta_0-200-seed_$seed
done
.venv/bin/rlvr report runs/ablation/gpg_beta_0.6-seed_0 runs/ablation/gpg_beta_0-seed_0 \
  runs/ablation/gpg_beta_0-200-seed_0 \
  --metric eval/pass@1 --metric accuracy --metric zero_std_frac --metric sampling_rounds \
  --smoothing 0.6 --output docs/img/gpg_threshold.png
