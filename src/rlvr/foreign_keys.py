"""The names TRL's `GRPOConfig`, verl's trainer config and OpenRLHF's arguments give to
rlvr's settings.

A key rlvr does not know is an error (`config_files._explain`); when it is one of these, the
error names the command's own key for it instead of a spelling neighbour. `docs/migrating.md`
is the same table for readers. Values keep rlvr's spelling: `algorithm.aggregation=
seq_mean_token_mean`, not verl's `seq-mean-token-mean`; `--help-config` lists them.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def _each_command(name: str) -> tuple[str, ...]:
    """`train.NAME`, `sft.NAME`, `dpo.NAME`: a training argument every command has."""
    return tuple(f"{section}.{name}" for section in ("train", "sft", "dpo"))


TRL: dict[str, tuple[str, ...]] = {
    "model_name_or_path": ("model.name_or_path",),
    "num_generations": ("rollout.samples_per_prompt",),
    "max_completion_length": ("rollout.max_new_tokens", "dpo.max_new_tokens"),
    "temperature": ("rollout.temperature", "dpo.temperature"),
    "top_p": ("rollout.top_p",),
    "top_k": ("rollout.top_k",),
    "min_p": ("rollout.min_p",),
    "repetition_penalty": ("rollout.repetition_penalty",),
    "learning_rate": _each_command("lr"),
    "lr_scheduler_type": _each_command("schedule"),
    "warmup_steps": _each_command("warmup_steps"),
    "weight_decay": _each_command("weight_decay"),
    "max_grad_norm": _each_command("max_grad_norm"),
    "adam_beta1": ("train.betas",),
    "adam_beta2": ("train.betas",),
    "max_steps": _each_command("steps"),
    "num_train_epochs": ("sft.epochs", "dpo.epochs"),
    "seed": _each_command("seed"),
    "output_dir": _each_command("output_dir"),
    "per_device_train_batch_size": ("sft.batch_size", "dpo.batch_size"),
    "num_iterations": ("train.epochs",),
    "steps_per_generation": ("train.mini_batches",),
    "gradient_accumulation_steps": _each_command("micro_batch_tokens"),
    "gradient_checkpointing": _each_command("gradient_checkpointing"),
    "disable_dropout": ("model.disable_dropout",),
    "save_steps": _each_command("save_every"),
    "save_total_limit": _each_command("keep_checkpoints"),
    "report_to": _each_command("log_to"),
    "num_completions_to_print": ("train.log_samples",),
    "chat_template_kwargs": ("data.chat_template_kwargs",),
    "beta": ("algorithm.kl.coef", "dpo.beta"),
    "epsilon": ("algorithm.clip.low",),
    "epsilon_high": ("algorithm.clip.high",),
    "delta": ("algorithm.clip.dual",),
    "sync_ref_model": ("algorithm.kl.reference_reset_every",),
    "ref_model_sync_steps": ("algorithm.kl.reference_reset_every",),
    "ref_model_mixup_alpha": ("algorithm.kl.reference_reset_mix",),
    "scale_rewards": ("algorithm.std_normalization",),
    "multi_objective_aggregation": ("algorithm.reward_aggregation",),
    "loss_type": ("algorithm.aggregation", "dpo.loss"),
    "mask_truncated_completions": ("algorithm.overlong.filter",),
    "label_smoothing": ("dpo.label_smoothing",),
    "rpo_alpha": ("dpo.nll_coef",),
    "cpo_alpha": ("dpo.nll_coef",),
    "desirable_weight": ("dpo.kto_desirable_weight",),
    "undesirable_weight": ("dpo.kto_undesirable_weight",),
    "loss_weights": ("dpo.loss_weights",),
    "discopop_tau": ("dpo.discopop_tau",),
    "ld_alpha": ("dpo.ld_alpha",),
    "use_weighting": ("dpo.weighting",),
    "f_divergence_type": ("dpo.f_divergence",),
    "f_alpha_divergence_coef": ("dpo.f_alpha",),
    "simpo_gamma": ("dpo.gamma",),
    "reward_weights": ("reward.functions",),
    "use_cpu": ("model.device",),
    "data_seed": _each_command("seed"),
    "lr_scheduler_kwargs": _each_command("min_lr_ratio"),
    "per_device_eval_batch_size": ("sft.micro_batch_tokens", "dpo.micro_batch_tokens"),
    "tools": ("rollout.tools",),
    "top_entropy_quantile": ("algorithm.entropy.top_frac",),
    "importance_sampling_level": ("algorithm.loss",),
    "sapo_temperature_pos": ("algorithm.sapo_tau_pos",),
    "sapo_temperature_neg": ("algorithm.sapo_tau_neg",),
    "vespo_k_pos": ("algorithm.vespo.k_pos",),
    "vespo_lambda_pos": ("algorithm.vespo.lambda_pos",),
    "vespo_k_neg": ("algorithm.vespo.k_neg",),
    "vespo_lambda_neg": ("algorithm.vespo.lambda_neg",),
    "vllm_importance_sampling_cap": ("algorithm.rollout_is.max_ratio",),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask",),
    "vllm_importance_sampling_mode": ("algorithm.rollout_is.mode",),
    "vllm_importance_sampling_correction": ("algorithm.rollout_is.mode",),
    "max_tool_calling_iterations": ("rollout.max_tool_calls",),
    "eval_steps": ("eval.every_steps", "sft.eval_every_steps", "dpo.eval_every_steps"),
    "vllm_importance_sampling_clip_max": ("algorithm.rollout_is.max_ratio",),
    "vllm_importance_sampling_clip_min": ("algorithm.rollout_is.min_ratio",),
    "entropy_coef": ("algorithm.entropy.coef",),
    "use_adaptive_entropy": ("algorithm.entropy.target",),
    "entropy_target": ("algorithm.entropy.target",),
    "entropy_coef_delta": ("algorithm.entropy.delta",),
    "entropy_coef_max": ("algorithm.entropy.max_coef",),
    "log_completions": ("train.log_samples",),
    "num_generations_eval": ("eval.k",),
    "max_prompt_length": ("rollout.max_prompt_tokens",),
    "max_length": ("sft.max_length", "dpo.max_length"),
    "max_seq_length": ("sft.max_length",),
    "shuffle_dataset": ("data.sampler",),
    "teacher_model_name_or_path": ("algorithm.distill.teacher",),
    "num_remains_in_group": ("algorithm.group_filter.keep",),
    "use_vllm": ("rollout.engine",),
    "vllm_gpu_memory_utilization": ("rollout.vllm_memory",),
    "vllm_max_model_length": ("rollout.vllm_max_model_len",),
}
"""TRL `GRPOConfig` / `DPOConfig` / `SFTConfig` field -> rlvr's key, the first that the
command has (`reward_weights`: each reward's `weight` in `reward.functions`;
`importance_sampling_level=sequence`: `algorithm.loss=gspo`). TRL's GRPO
`loss_type` also picks the normaliser: its `dr_grpo` is rlvr's `dr_grpo` preset, its `dapo`
the aggregation `token_mean`."""

VERL: dict[str, tuple[str, ...]] = {
    "actor_rollout_ref.model.path": ("model.name_or_path",),
    "data.train_files": ("data.path",),
    "data.val_files": ("data.test_path",),
    "data.prompt_key": ("data.prompt_column",),
    "data.apply_chat_template_kwargs": ("data.chat_template_kwargs",),
    "data.train_batch_size": ("rollout.prompts_per_step",),
    "data.max_response_length": ("rollout.max_new_tokens",),
    "data.max_prompt_length": ("rollout.max_prompt_tokens",),
    "actor_rollout_ref.rollout.n": ("rollout.samples_per_prompt",),
    "actor_rollout_ref.rollout.temperature": ("rollout.temperature",),
    "actor_rollout_ref.rollout.top_p": ("rollout.top_p",),
    "actor_rollout_ref.rollout.top_k": ("rollout.top_k",),
    "actor_rollout_ref.rollout.val_kwargs.n": ("eval.k",),
    "actor_rollout_ref.rollout.val_kwargs.temperature": ("eval.temperature",),
    "actor_rollout_ref.rollout.val_kwargs.top_p": ("eval.top_p",),
    "actor_rollout_ref.rollout.response_length": ("rollout.max_new_tokens",),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": ("rollout.tools",),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": ("rollout.max_tool_calls",),
    "actor_rollout_ref.rollout.multi_turn.format": ("rollout.tool_format",),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("rollout.vllm_memory",),
    "actor_rollout_ref.rollout.max_model_len": ("rollout.vllm_max_model_len",),
    "algorithm.adv_estimator": ("algorithm.advantage",),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.std_normalization",),
    "algorithm.use_kl_in_reward": ("algorithm.kl.in_reward",),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.kl.coef",),
    "algorithm.gamma": ("algorithm.critic.gamma",),
    "algorithm.lam": ("algorithm.critic.lam",),
    "actor_rollout_ref.actor.optim.lr": ("train.lr",),
    "actor_rollout_ref.actor.optim.weight_decay": ("train.weight_decay",),
    "actor_rollout_ref.actor.grad_clip": ("train.max_grad_norm",),
    "actor_rollout_ref.actor.ppo_epochs": ("train.epochs",),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("train.mini_batches",),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("train.micro_batch_tokens",),
    "actor_rollout_ref.actor.use_kl_loss": ("algorithm.kl.coef",),
    "actor_rollout_ref.actor.kl_loss_coef": ("algorithm.kl.coef",),
    "actor_rollout_ref.actor.kl_loss_type": ("algorithm.kl.estimator",),
    "actor_rollout_ref.actor.clip_ratio_low": ("algorithm.clip.low",),
    "actor_rollout_ref.actor.clip_ratio_high": ("algorithm.clip.high",),
    "actor_rollout_ref.actor.clip_ratio_c": ("algorithm.clip.dual",),
    "actor_rollout_ref.actor.entropy_coeff": ("algorithm.entropy.coef",),
    "actor_rollout_ref.actor.loss_agg_mode": ("algorithm.aggregation",),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("train.gradient_checkpointing",),
    "trainer.total_training_steps": ("train.steps",),
    "trainer.default_local_dir": ("train.output_dir",),
    "trainer.save_freq": ("train.save_every",),
    "trainer.max_actor_ckpt_to_keep": ("train.keep_checkpoints",),
    "trainer.test_freq": ("eval.every_steps",),
    "trainer.logger": ("train.log_to",),
    "trainer.project_name": ("train.wandb_project",),
    "critic.optim.lr": ("algorithm.critic.lr",),
    "actor_rollout_ref.model.lora_rank": ("model.lora.rank",),
    "actor_rollout_ref.model.lora_alpha": ("model.lora.alpha",),
    "actor_rollout_ref.model.target_modules": ("model.lora.target_modules",),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": ("train.warmup_steps",),
    "actor_rollout_ref.rollout.name": ("rollout.engine",),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("train.micro_batch_tokens",),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("train.micro_batch_tokens",),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("train.micro_batch_tokens",),
    "trainer.critic_warmup": ("algorithm.critic.warmup_steps",),
    "trainer.device": ("model.device",),
    "actor_rollout_ref.actor.optim.warmup_style": ("train.schedule",),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("train.schedule",),
    "actor_rollout_ref.actor.optim.min_lr_ratio": ("train.min_lr_ratio",),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("algorithm.loss",),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": ("algorithm.covariance.fraction",),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": ("algorithm.covariance.low",),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": ("algorithm.covariance.high",),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": ("algorithm.covariance.fraction",),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": ("algorithm.covariance.kl_coef",),
    "actor_rollout_ref.actor.use_dynamic_bsz": ("train.micro_batch_tokens",),
    "actor_rollout_ref.actor.strategy": ("train.fsdp",),
    "algorithm.kl_ctrl.target_kl": ("algorithm.kl.adaptive_target",),
    "algorithm.kl_ctrl.horizon": ("algorithm.kl.horizon",),
    "algorithm.filter_groups.enable": ("algorithm.dynamic_sampling",),
    "algorithm.filter_groups.max_num_gen_batches": ("algorithm.max_sampling_rounds",),
    "reward_model.overlong_buffer.enable": ("algorithm.overlong.buffer",),
    "reward_model.overlong_buffer.len": ("algorithm.overlong.buffer",),
    "reward_model.overlong_buffer.penalty_factor": ("algorithm.overlong.penalty",),
    "data.filter_overlong_prompts": ("rollout.max_prompt_tokens",),
    "data.shuffle": ("data.sampler",),
    "critic.model.path": ("algorithm.critic.model",),
    "critic.cliprange_value": ("algorithm.critic.value_clip",),
    "reward_model.model.beta_train": ("algorithm.prime.beta",),
    "reward_model.model.optim.lr": ("algorithm.prime.lr",),
    "reward_model.model.optim.grad_clip": ("algorithm.prime.max_grad_norm",),
    "reward_model.prime_norm": ("algorithm.prime.scale_returns",),
    "algorithm.reward_dpo_coef": ("algorithm.prime.process_coef",),
    "algorithm.reward_gt_coef": ("algorithm.prime.outcome_coef",),
    "reward_model.enable": ("reward.functions",),
    "reward_model.model.path": ("reward.functions",),
    "custom_reward_function.path": ("reward.functions",),
    "custom_reward_function.name": ("reward.functions",),
}
"""verl trainer-config key (its Hydra override path) -> rlvr key (a reward model is an entry
of `reward.functions`: `{name: reward_model, options: {model: PATH}}`, and a custom reward
function `{name: 'path/to/file.py:compute_score'}`). verl's KL loss is on
when `use_kl_loss` is; rlvr's when `algorithm.kl.coef` > 0."""


OPENRLHF: dict[str, tuple[str, ...]] = {
    "pretrain": ("model.name_or_path",),
    "prompt_data": ("data.path",),
    "eval_dataset": ("data.test_path",),
    "input_key": ("data.prompt_column",),
    "label_key": ("data.answer_column",),
    "apply_chat_template": ("data.template",),
    "input_template": ("data.template",),
    "n_samples_per_prompt": ("rollout.samples_per_prompt",),
    "rollout_batch_size": ("rollout.prompts_per_step",),
    "prompt_max_len": ("rollout.max_prompt_tokens",),
    "generate_max_len": ("rollout.max_new_tokens",),
    "eval_temperature": ("eval.temperature",),
    "eval_n_samples_per_prompt": ("eval.k",),
    "advantage_estimator": ("algorithm.advantage",),
    "no_advantage_std_norm": ("algorithm.std_normalization",),
    "init_kl_coef": ("algorithm.kl.coef",),
    "kl_estimator": ("algorithm.kl.estimator",),
    "kl_target": ("algorithm.kl.adaptive_target",),
    "kl_horizon": ("algorithm.kl.horizon",),
    "eps_clip": ("algorithm.clip.low",),
    "dual_clip": ("algorithm.clip.dual",),
    "policy_loss_type": ("algorithm.loss",),
    "entropy_loss_coef": ("algorithm.entropy.coef",),
    "dynamic_filtering": ("algorithm.dynamic_sampling",),
    "overlong_buffer_len": ("algorithm.overlong.buffer",),
    "overlong_penalty_factor": ("algorithm.overlong.penalty",),
    "critic_pretrain": ("algorithm.critic.model",),
    "critic_learning_rate": ("algorithm.critic.lr",),
    "value_clip": ("algorithm.critic.value_clip",),
    "gamma": ("algorithm.critic.gamma",),
    "lambd": ("algorithm.critic.lam",),
    "freezing_actor_steps": ("algorithm.critic.warmup_steps",),
    "reward_pretrain": ("reward.functions",),
    "remote_rm_url": ("reward.functions",),
    "actor_learning_rate": ("train.lr",),
    "lr_scheduler": ("train.schedule",),
    "adam_betas": ("train.betas",),
    "l2": ("train.weight_decay",),
    "max_norm": ("train.max_grad_norm",),
    "max_epochs": ("train.epochs",),
    "train_batch_size": ("train.mini_batches",),
    "micro_train_batch_size": ("train.micro_batch_tokens",),
    "micro_rollout_batch_size": ("train.micro_batch_tokens",),
    "train_max_tokens_per_gpu": ("train.micro_batch_tokens",),
    "use_dynamic_batch": ("train.micro_batch_tokens",),
    "save_path": ("train.output_dir",),
    "ckpt_path": ("train.output_dir",),
    "max_ckpt_num": ("train.keep_checkpoints",),
    "use_wandb": ("train.log_to",),
    "use_tensorboard": ("train.log_to",),
    "lora_rank": ("model.lora.rank",),
    "lora_alpha": ("model.lora.alpha",),
    "lora_dropout": ("model.lora.dropout",),
    "target_modules": ("model.lora.target_modules",),
}
"""OpenRLHF `train_ppo_ray` argument (without its ``--``) -> rlvr key. OpenRLHF counts
samples where rlvr counts prompts: its `rollout_batch_size` prompts a step are
`rollout.prompts_per_step`, and its `train_batch_size` (samples per optimizer step) is
`train.mini_batches` = rollout_batch_size × n_samples_per_prompt / train_batch_size. Its KL as
a loss (`use_kl_loss`) is `algorithm.kl.in_reward=false` with `algorithm.kl.coef` > 0; its
`eps_clip` sets both `algorithm.clip.low` and `algorithm.clip.high`."""


_PACKED = (
    "rlvr batches by tokens (micro_batch_tokens), and its RL and SFT updates of Llama-family "
    "models run on the real tokens only, with no padding"
)

_EPOCHS = "rlvr counts steps: train.steps = epochs × problems / rollout.prompts_per_step"
_RESUME = "rlvr train --resume continues from train.output_dir's latest checkpoint"
_RUN_NAME = "rlvr names a run after its directory, train.output_dir (in W&B too)"
_SERVER = (
    "rlvr's vLLM runs in the trainer's process (rollout.engine=vllm, TRL's colocate mode), "
    "never as a server"
)
_NO_TP = "rlvr has no tensor parallelism: each rank samples with the whole model"
_EVALUATES = (
    "rlvr evaluates when eval.every_steps=N is set: before the first step, every N steps and "
    "after the last"
)

_FIXED_REFERENCE = (
    "rlvr dpo's reference stays the starting model (a moving reference is rlvr train's "
    "algorithm.kl.reference_reset_every)"
)

_CHUNKED_HEAD = "rlvr's loss makes the LM head's logits a chunk at a time, never whole"
_OWN_DATA = "rlvr reads the data itself (data.path and the data.*_column keys), in one process"
_EVERY_STEP = "rlvr logs every step, one line of metrics.jsonl each"
_OWN_TOKENS = "rlvr uses the tokenizer's own tokens, as saved with the model"
_PADDING = "rlvr pads with the tokenizer's pad token and masks padding out of every loss"
_STARTING_REFERENCE = (
    "rlvr dpo's reference is the starting model, scored once before the first step (with "
    "model.lora.rank, the base model: the adapters start at zero)"
)

_NO_OFFLOAD = (
    "rlvr never offloads to the CPU: train.fsdp=true shards the weights, gradients and AdamW "
    "state over the ranks instead"
)

ANSWERS: dict[str, str] = {
    "bf16": "rlvr's model.dtype=bfloat16 (the weights themselves in bf16, no fp32 copy)",
    "fp16": "rlvr's model.dtype=float16 (the weights themselves in fp16, no fp32 copy)",
    "logging_steps": _EVERY_STEP,
    "packing": _PACKED,
    "padding_free": _PACKED,
    "completion_only_loss": "rlvr's SFT loss is on the completion tokens only, always",
    "assistant_only_loss": "rlvr's SFT loss is on the closing assistant turn only, always",
    "dataset_text_field": "rlvr trains on prompts (with worked solutions for SFT), not on text",
    "warmup_ratio": "rlvr counts the warm-up in steps: warmup_steps = ratio × steps",
    "per_device_train_batch_size": "TRL's GRPO counts completions, rlvr counts prompts: "
    "rollout.prompts_per_step, each sampled rollout.samples_per_prompt times",
    "vllm_mode": _SERVER,
    "vllm_server_base_url": _SERVER,
    "vllm_server_host": _SERVER,
    "vllm_tensor_parallel_size": _NO_TP,
    "num_train_epochs": _EPOCHS,
    "resume_from_checkpoint": _RESUME,
    "run_name": _RUN_NAME,
    "eval_strategy": _EVALUATES,
    "do_eval": _EVALUATES,
    "save_strategy": "rlvr saves every train.save_every steps (0: only at the end) and when "
    "SIGINT/SIGTERM stops the run",
    "optim": "rlvr trains with AdamW (train.shard_optimizer=true partitions its state)",
    "remove_unused_columns": "rlvr passes every column of the data to the rewards, always",
    "ds3_gather_for_generation": "under train.fsdp=true rlvr gathers the whole weights once a "
    "step for the rollout, always",
    "max_prompt_length": "rlvr dpo cuts no prompt: dpo.max_length cuts the responses, and "
    "leaves out a pair whose prompt alone is as long",
    "truncation_mode": "rlvr dpo keeps each sequence's start (TRL's keep_start), cutting the "
    "responses to dpo.max_length",
    "precompute_ref_log_probs": "rlvr dpo scores every pair with the reference once, before "
    "the first step, always",
    "reference_free": "rlvr's reference-free losses are dpo.loss=simpo, cpo and orpo (the "
    "presets of those names)",
    "sync_ref_model": _FIXED_REFERENCE,
    "ref_model_sync_steps": _FIXED_REFERENCE,
    "ref_model_mixup_alpha": _FIXED_REFERENCE,
    "packing_strategy": _PACKED,
    "activation_offloading": "rlvr never offloads to the CPU: gradient_checkpointing=true (of "
    "train, sft or dpo) trades compute for activation memory instead",
    "push_to_hub": "rlvr saves Hugging Face folders (checkpoints/step-N): huggingface-cli "
    "upload sends one to the hub",
    "use_liger_loss": _CHUNKED_HEAD,
    "use_liger_kernel": _CHUNKED_HEAD,
    "deepspeed": "rlvr shards with FSDP2: train.fsdp=true (as ZeRO-3), or the optimizer state "
    "alone with train.shard_optimizer=true (ZeRO-1)",
    "trainer.n_gpus_per_node": "torchrun sets the ranks: torchrun --nproc_per_node=N -m rlvr train",
    "trainer.nnodes": "torchrun sets the ranks: torchrun --nnodes=N ... -m rlvr train",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": _NO_TP,
    "actor_rollout_ref.model.use_remove_padding": _PACKED,
    "actor_rollout_ref.actor.fsdp_config.param_offload": _NO_OFFLOAD,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": _NO_OFFLOAD,
    "trainer.experiment_name": _RUN_NAME,
    "trainer.val_before_train": "with eval.every_steps=N rlvr evaluates before the first step "
    "too, always",
    "trainer.total_epochs": _EPOCHS,
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "rlvr counts the warm-up in steps: "
    "train.warmup_steps = ratio × train.steps",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "rlvr never offloads to the CPU: the KL "
    "reference is held whole on each rank (a LoRA policy's is its base, no copy)",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "rlvr has no sequence "
    "parallelism: each rank trains whole sequences, packed by train.micro_batch_tokens",
    "actor_rollout_ref.rollout.val_kwargs.do_sample": "rlvr's evaluation is greedy at "
    "eval.temperature=0 and samples above it",
    "data.truncation": "rlvr never cuts a prompt: rollout.max_prompt_tokens leaves the longer "
    "ones out of training",
    "trainer.resume_mode": _RESUME,
    "trainer.val_only": "rlvr eval --model RUN_DIR evaluates a run's latest checkpoint",
    "reward_model.reward_manager": "rlvr calls the reward.functions in parallel chunks, "
    "always (verl's dapo manager's overlong penalty is algorithm.overlong.buffer, in the dapo "
    "preset)",
    "generation_batch_size": "rlvr samples a step's rollout.prompts_per_step × "
    "rollout.samples_per_prompt completions in one rollout (rollout.batch_size caps the "
    "sequences decoded at once)",
    "cast_lm_head_to_fp32": "rlvr makes each chunk's logits in model.dtype and takes their "
    "log-softmax in fp32",
    "model_init_kwargs": "rlvr loads model.name_or_path in model.dtype on model.device, with "
    "no other from_pretrained arguments",
    "cache_implementation": "rlvr's own engine decodes with its own preallocated KV cache, always",
    "generation_kwargs": "rlvr's sampling settings are rollout.temperature, top_p, top_k, "
    "min_p, repetition_penalty, min_new_tokens and max_new_tokens",
    "vllm_enable_sleep_mode": "rlvr's vLLM keeps its rollout.vllm_memory share of the GPU "
    "between rollouts; it has no sleep mode",
    "torch_empty_cache_steps": "rlvr never empties PyTorch's CUDA cache between steps",
    "dataloader_num_workers": _OWN_DATA,
    "logging_first_step": _EVERY_STEP,
    "ddp_find_unused_parameters": "rlvr sums the ranks' gradients itself after backward, "
    "not through DDP",
    "loss_type": "rlvr sft's loss is the mean NLL of the solution tokens (TRL's nll); rlvr "
    "train's aggregation is algorithm.aggregation, rlvr dpo's loss dpo.loss",
    "gradient_checkpointing_kwargs": "rlvr's activation checkpointing is non-reentrant, "
    "always (the command's gradient_checkpointing=true turns it on)",
    "eval_accumulation_steps": "rlvr adds up each held-out micro-batch's scores as it goes",
    "chat_template_path": "rlvr renders with the tokenizer's own chat template "
    "(data.template=chat): save the tokenizer with yours to change it",
    "eos_token": _OWN_TOKENS,
    "pad_token": _OWN_TOKENS,
    "dataset_kwargs": _OWN_DATA,
    "dataset_num_proc": _OWN_DATA,
    "neftune_noise_alpha": "rlvr adds no noise to the embeddings (NEFTune is not built)",
    "label_smoothing_factor": "rlvr sft's loss is the plain NLL, with no label smoothing",
    "group_by_length": _PACKED,
    "tf32": "rlvr leaves PyTorch's fp32 matmul precision as it is",
    "ref_adapter_name": _STARTING_REFERENCE,
    "model_adapter_name": _STARTING_REFERENCE,
    "force_use_ref_model": _STARTING_REFERENCE,
    "generate_during_eval": "rlvr dpo scores the held-out pairs (eval.jsonl) without sampling; "
    "rlvr eval samples a saved model",
    "padding_value": _PADDING,
    "label_pad_token_id": _PADDING,
    "use_logits_to_keep": _CHUNKED_HEAD,
}
"""TRL and verl settings that name no rlvr key, with what rlvr does instead (a name that has
a key in the command, as `per_device_train_batch_size` has in `rlvr sft`, is answered with
the key)."""

OPENRLHF_ANSWERS: dict[str, str] = {
    "eps_clip_low_high": "rlvr's algorithm.clip.low and algorithm.clip.high, one key each",
    "num_episodes": _EPOCHS,
    "lr_warmup_ratio": "rlvr counts the warm-up in steps: train.warmup_steps = ratio × train.steps",
    "load_checkpoint": _RESUME,
    "packing_samples": _PACKED,
    "zero_stage": "rlvr shards with FSDP2: train.fsdp=true (as ZeRO-3), or the optimizer "
    "state alone with train.shard_optimizer=true (ZeRO-1)",
    "adam_offload": _NO_OFFLOAD,
    "vllm_num_engines": _SERVER,
    "colocate_all_models": _SERVER,
    "dynamic_filtering_reward_range": "rlvr's dynamic sampling (algorithm.dynamic_sampling) "
    "drops the groups whose rewards are all equal, whatever their value",
    "wandb_run_name": _RUN_NAME,
    "save_hf_ckpt": "rlvr's checkpoints are Hugging Face folders (checkpoints/step-N), always",
}
"""OpenRLHF arguments that name no rlvr key, with what rlvr does instead."""


def _leaves(key: str, value: Any) -> list[str]:
    """Every dotted key under `key` of a nested mapping (the key itself for a scalar)."""
    if not isinstance(value, dict) or not value:
        return [key]
    return [leaf for name, inner in value.items() for leaf in _leaves(f"{key}.{name}", inner)]


class ForeignName(NamedTuple):
    """A TRL, verl or OpenRLHF setting and rlvr's key for it."""

    framework: str
    name: str
    """The framework's whole name: the one given, or the verl path whose tail was given."""
    ours: str


def rlvr_key(name: str, valid: list[str]) -> ForeignName | None:
    """The TRL or verl setting `name` and rlvr's key for it among `valid`, or None. `name` may
    also be the tail of verl's path (`rollout.n` for `actor_rollout_ref.rollout.n`,
    `clip_ratio_high`) where every path it ends points at the same key."""
    for framework, names in (("TRL", TRL), ("verl", VERL), ("OpenRLHF", OPENRLHF)):
        ours = [k for k in names.get(name, ()) if k in valid]
        if ours:
            return ForeignName(framework, name, ours[0])
    tails = {
        full: ours[0]
        for full, keys in VERL.items()
        if full.endswith("." + name) and (ours := [k for k in keys if k in valid])
    }
    if len(set(tails.values())) != 1:
        return None
    full, ours = next(iter(tails.items()))
    return ForeignName("verl", full, ours)


def foreign_key_hint(key: str, value: Any, valid: list[str]) -> str | None:
    """For an unknown `key` (with its `value`, a nested mapping when a whole unknown section
    was given): which framework's name it is and the key among `valid` that rlvr gives it;
    for a section, that of every setting in it that has one, so one error names them all."""
    hints = []
    for leaf in _leaves(key, value):
        found = rlvr_key(leaf, valid)
        answered = ANSWERS.get(leaf) or OPENRLHF_ANSWERS.get(leaf)
        if not found and answered:
            framework = "verl" if "." in leaf else "TRL" if leaf in ANSWERS else "OpenRLHF"
            named = "" if leaf == key else f"{leaf!r} is "
            hints.append(f"{named}{framework}'s setting, not rlvr's: {answered}")
        elif found:
            named = "" if leaf == key else f"{leaf!r} is "
            if found.name != leaf:
                hints.append(f"{named}the end of verl's {found.name!r}, rlvr's {found.ours!r}")
            else:
                hints.append(f"{named}{found.framework}'s name for rlvr's {found.ours!r}")
    return "; ".join(hints) or None
