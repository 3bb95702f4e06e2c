"""Online RL, top to bottom: sample -> reward -> filter -> advantages -> update -> log.

One function, `train`, is the whole loop; every formula it uses is a registered pure function
in `rlvr.algorithms`, selected by name from the config. Under `torchrun` every process runs
it as one data-parallel rank (`rlvr.training.distributed`).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from rlvr.algorithms import ADVANTAGES, POLICY_LOSSES
from rlvr.algorithms.advantages import GROUP_BASELINES
from rlvr.algorithms.filters import GROUP_FILTER_SCORES
from rlvr.config import (
    ConfigError,
    RLConfig,
    changed_settings,
    load_saved_config,
    make_output_dir,
    save_config,
)
from rlvr.data.sampler import build_sampler
from rlvr.data.tasks import Task, held_out_note, load_task, require_gold_answers
from rlvr.data.templates import short_prompts
from rlvr.evaluation.evaluate import evaluate_as_configured
from rlvr.models import fused
from rlvr.models.loading import eos_token_ids, load_model_and_tokenizer, resolve_device
from rlvr.rewards.compose import called_their_way, signature_mismatch
from rlvr.rewards.model_based import check_options, model_reward_builder
from rlvr.rewards.registry import TASK_VERIFIER, RewardFn, get_reward
from rlvr.rollout.base import RolloutEngine
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.rollout.tools import ToolUse
from rlvr.rollout.vllm import (
    VLLMRolloutEngine,
    context_length,
    require_vllm,
)
from rlvr.run_layout import CONFIG_FILE, RUN_LOGS, checkpoint_path
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.loggers import run_loggers
from rlvr.tracking.progress import StepProgress
from rlvr.training import sharding
from rlvr.training.batch import RolloutBatch
from rlvr.training.checkpoint import (
    checkpoint_to_resume,
    keep_until_step,
    load_model_weights,
    load_trainer_state,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from rlvr.training.critic import Critic
from rlvr.training.distributed import Ranks, data_parallel, rank_state
from rlvr.training.estimation import CRITIC_ADVANTAGE, PRIME_ADVANTAGE, prepare_update
from rlvr.training.implicit_prm import ImplicitPRM
from rlvr.training.memory import keep_freed_memory
from rlvr.training.metrics import step_metrics
from rlvr.training.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
    optimizer_state,
    reset_optimizer_state,
)
from rlvr.training.regularization import Regularization
from rlvr.training.rewarding import RewardScorer, check_gold_answers, named_rewards
from rlvr.training.sampling import (
    collect_step,
    config_filters,
    config_for_step,
    longest_sequence,
)
from rlvr.training.stopping import RunStopped, StopOnSignal
from rlvr.training.supervised import NonFiniteError
from rlvr.training.teacher import load_teacher
from rlvr.training.update import LossSettings, minibatch_backward

BatchFilter = Callable[[RolloutBatch], RolloutBatch]


def check_choices(cfg: RLConfig) -> None:
    """Look up every registered name the config chooses (advantage estimator, policy loss,
    rewards, GFPO's score) and check the model rewards' options, so that a misspelt one is a
    `ConfigError` naming its key before a model loads; refuse distillation alone without a
    teacher, group sizes the advantages cannot use (`_check_group_sizes`) and the vllm
    engine without vLLM (`_check_engine`)."""
    critic = (
        f"; or {CRITIC_ADVANTAGE!r}, a learned critic, or {PRIME_ADVANTAGE!r}, PRIME's implicit "
        "process reward model"
    )
    group_filter = cfg.algorithm.group_filter
    chosen = [("algorithm.loss", cfg.algorithm.loss, POLICY_LOSSES.get, "")]
    if group_filter.keep:
        chosen.append(("algorithm.group_filter.by", group_filter.by, GROUP_FILTER_SCORES.get, ""))
    if cfg.algorithm.advantage not in (CRITIC_ADVANTAGE, PRIME_ADVANTAGE):
        chosen.append(("algorithm.advantage", cfg.algorithm.advantage, ADVANTAGES.get, critic))
    for i, spec in enumerate(cfg.reward.functions or []):
        if model_reward_builder(spec.name) is None and spec.name != TASK_VERIFIER:
            chosen.append((f"reward.functions[{i}].name", spec.name, _callable_reward, ""))
    for key, name, look_up, alternative in chosen:
        try:
            look_up(name)
        except KeyError as error:
            raise ConfigError(f"{key}: {error.args[0]}{alternative}") from None
    check_options(cfg.reward.functions or [])
    for i, spec in enumerate(cfg.reward.functions or []):
        plain = model_reward_builder(spec.name) is None and spec.name != TASK_VERIFIER
        if plain and spec.conversational and called_their_way(get_reward(spec.name)):
            raise ConfigError(
                f"reward.functions[{i}]: {spec.name!r} is a verl or OpenRLHF reward, called "
                "with texts as its framework calls it; conversational is for TRL-signature "
                "rewards"
            )
    outcome = cfg.algorithm.distill.outcome_weight > 0  # else only the teacher's term trains
    if not outcome and cfg.algorithm.distill.teacher is None:
        raise ConfigError(
            "algorithm.distill.outcome_weight=0 leaves only the teacher's term, and "
            "algorithm.distill.teacher is not set: name the teacher model"
        )
    _check_group_sizes(cfg, outcome)
    _check_engine(cfg)


def _callable_reward(name: str) -> RewardFn:
    """The reward function `name` names, if a call with rlvr's keywords can reach it; a
    `KeyError` saying why not otherwise."""
    fn = get_reward(name)
    mismatch = signature_mismatch(fn)
    if mismatch:
        raise KeyError(f"reward {name!r}: {mismatch}")
    return fn


def _check_group_sizes(cfg: RLConfig, outcome: bool) -> None:
    """Refuse a group baseline with one sample per prompt (or kept by GFPO), PKPO's k at or
    above the group size, GFPO keeping every sample, and dynamic sampling of single samples;
    `outcome`: the outcome advantages train (not distillation alone)."""
    group_filter = cfg.algorithm.group_filter
    samples = cfg.rollout.samples_per_prompt
    if group_filter.keep >= samples:
        raise ConfigError(
            f"algorithm.group_filter.keep={group_filter.keep} keeps every one of "
            f"rollout.samples_per_prompt={samples}: GFPO samples more than it trains on, so keep "
            "must be below samples_per_prompt (or 0, off)"
        )
    group, size_key = (
        (group_filter.keep, "algorithm.group_filter.keep")
        if group_filter.keep
        else (samples, "rollout.samples_per_prompt")
    )
    if outcome and group < 2 and cfg.algorithm.advantage in GROUP_BASELINES:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage!r} compares each sample with the "
            f"others of its prompt, so {size_key}=1 would train nothing; "
            f"{'keep' if group_filter.keep else 'sample'} at least 2, or set "
            "algorithm.advantage=reinforce_pp (or gae)"
        )
    if cfg.algorithm.advantage == "pass_at_k" and cfg.algorithm.pass_k >= group:
        raise ConfigError(
            f"algorithm.pass_k={cfg.algorithm.pass_k}: pass_at_k compares each sample with the "
            f"pass@k of the other {size_key} - 1 = {group - 1}, so k must be below {size_key}"
        )
    if cfg.algorithm.dynamic_sampling and cfg.rollout.samples_per_prompt < 2:
        raise ConfigError(
            "algorithm.dynamic_sampling keeps the groups whose samples disagree, and with "
            "rollout.samples_per_prompt=1 none can; sample at least 2, or turn it off"
        )
    if cfg.algorithm.min_informative_fraction > 0:
        if cfg.algorithm.dynamic_sampling:
            raise ConfigError(
                "algorithm.min_informative_fraction tops the step up with constant groups, and "
                "algorithm.dynamic_sampling trains on informative groups alone; set one of them"
            )
        if cfg.rollout.samples_per_prompt < 2:
            raise ConfigError(
                "algorithm.min_informative_fraction counts the groups whose samples disagree, "
                "and with rollout.samples_per_prompt=1 none can; sample at least 2, or set it to 0"
            )


def _check_engine(cfg: RLConfig) -> None:
    """`rollout.engine=vllm` needs vLLM installed."""
    if cfg.rollout.engine == "vllm":
        require_vllm("rollout.engine=vllm")


def start_run_dir(cfg: RLConfig, run_dir: Path, resume: bool) -> None:
    """Make the run directory and write its config.yaml (on rank 0)."""
    make_output_dir(run_dir, "train.output_dir")
    saved = load_saved_config(run_dir / CONFIG_FILE) if resume else None
    if saved is not None:
        warn_of_changes(saved, cfg)
    save_config(cfg, run_dir / CONFIG_FILE)


def warn_of_changes(saved: dict, cfg: RLConfig) -> None:
    """A resumed run continues its trajectory only with the settings it started with (more
    `train.steps` aside): name every other setting that differs from the run's config.yaml."""
    changed = changed_settings(saved, cfg, ignore=("train.steps",))
    if changed:
        warnings.warn(
            "--resume with settings that differ from the run's config.yaml (now overwritten): "
            + "; ".join(changed),
            stacklevel=1,
        )


def train(
    cfg: RLConfig,
    *,
    resume: bool = False,
    filters: tuple[BatchFilter, ...] = (),
    show_progress: bool = True,
) -> Path:
    """Run online RL as configured; return the run directory."""
    with data_parallel(resolve_device(cfg.model.device)) as ranks:
        return _train(cfg, ranks, resume, filters, show_progress)


def run_line(cfg: RLConfig, resumed: bool) -> str:
    """What a run trains, in one line: preset, model, task, budget and folder (a config file
    given with another preset keeps only its changes to its own: this says which won)."""
    r, data = cfg.rollout, cfg.data
    task = data.task if data.task != "file" else f"{data.path}"
    return (
        f"{'resuming' if resumed else 'training'} {cfg.preset or 'with no preset'}: "
        f"{cfg.model.name_or_path} on {task}, {cfg.train.steps} steps of "
        f"{r.prompts_per_step} prompts × {r.samples_per_prompt} samples, into "
        f"{cfg.train.output_dir}"
    )


def without_long_prompts(task: Task, cfg: RLConfig, tokenizer, announce: bool) -> Task:
    """`task` with only the training prompts of at most `rollout.max_prompt_tokens` tokens;
    the held-out problems stay whole, so that evaluations match `rlvr eval`."""
    limit, total = cfg.rollout.max_prompt_tokens, len(task.train)
    chat_kwargs = ToolUse.of(cfg.rollout).chat_kwargs(cfg.data.chat_template_kwargs)
    kept = short_prompts(cfg.data.template, task.train, tokenizer, limit, chat_kwargs)
    if not kept:
        raise ConfigError(
            f"rollout.max_prompt_tokens={limit}: all {total} training prompts are longer "
            f"once templated with data.template={cfg.data.template}"
        )
    if announce and len(kept) < total:
        print(
            f"rollout.max_prompt_tokens={limit}: {total - len(kept)} of {total} training "
            "prompts are longer and left out",
            flush=True,
        )
    return replace(task, train=kept)


def _train(
    cfg: RLConfig,
    ranks: Ranks,
    resume: bool,
    filters: tuple[BatchFilter, ...],
    show_progress: bool,
) -> Path:
    """`train` on this rank (rank 0 alone writes the run directory)."""
    check_choices(cfg)
    if ranks.world > cfg.rollout.prompts_per_step:
        raise ConfigError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} is less than the "
            f"{ranks.world} data-parallel ranks; each rank samples at least one prompt"
        )
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(cfg.train.seed)
    algo, r = cfg.algorithm, cfg.rollout

    task = load_task(cfg.data)  # before the model: a bad file fails in a second
    if show_progress and ranks.main and (note := held_out_note(cfg.data, task)):
        print(note, flush=True)
    named_rewards(cfg.reward.functions or [], task.reward)
    check_gold_answers(cfg.reward.functions or [], task, cfg.data.path)
    run_dir = Path(cfg.train.output_dir)
    checkpoint = ranks.on_main(lambda: checkpoint_to_resume(run_dir, resume, "train.output_dir"))
    every = cfg.eval.every_steps
    held_out = task.test[: cfg.eval.samples] if every else []
    if every and not held_out:
        raise ConfigError(
            f"eval.every_steps={every}: no held-out problems to evaluate "
            f"(eval.samples={cfg.eval.samples}, the task holds out {len(task.test)})"
        )
    evaluated = (
        f"the held-out pass@k and maj@k of eval.every_steps={every} are measured against one"
    )
    way_out = "set data.answer_column to the column that holds it, or eval.every_steps=0"
    require_gold_answers(task, held_out, cfg.data.test_path or cfg.data.path, evaluated, way_out)
    if algo.advantage == PRIME_ADVANTAGE:
        learns = "algorithm.advantage=prime trains its implicit PRM on the verifier's verdicts"
        answers = "set data.answer_column to the column that holds it, or another advantage"
        require_gold_answers(task, task.train, cfg.data.path, learns, answers)
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.train.seed)
    ranks.copy_from_main(model)
    if r.max_prompt_tokens is not None:
        task = without_long_prompts(task, cfg, tokenizer, announce=show_progress and ranks.main)
    if cfg.train.gradient_checkpointing:
        try:
            fused.enable_activation_checkpointing(model)
        except ValueError as error:
            raise ConfigError(f"train.gradient_checkpointing: {error}") from None
    teacher = None
    if algo.distill.teacher is not None:
        teacher = load_teacher(algo.distill.teacher, cfg.model, model, tokenizer)
    ranks.on_main(lambda: start_run_dir(cfg, run_dir, resume))  # once the model and task fit
    if show_progress and ranks.main:
        print(run_line(cfg, checkpoint is not None), flush=True)
    regularization = Regularization(algo, model)
    reference = regularization.reference
    sampler = build_sampler(
        cfg.data.sampler, len(task.train), cfg.train.seed, cfg.data.min_priority
    )
    generator = torch.Generator().manual_seed(cfg.train.seed + ranks.rank)

    critic = None
    if algo.advantage == CRITIC_ADVANTAGE:
        critic = Critic(algo.critic, model, cfg.train, tokenizer.pad_token_id, ranks)
    prm = None
    if algo.advantage == PRIME_ADVANTAGE:
        prm = ImplicitPRM(algo.prime, model, cfg.train, tokenizer.pad_token_id, ranks)
    if cfg.train.fsdp:  # after the replicated reference, critic and PRM are copied
        sharding.shard(model, ranks, cfg.train.fsdp_reshard_after_forward, announce=show_progress)
    updates_per_step = cfg.train.epochs * cfg.train.mini_batches
    optimizer = build_optimizer(
        model, cfg.train.lr, cfg.train.weight_decay, cfg.train.betas, cfg.train.shard_optimizer
    )
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=cfg.train.warmup_steps,
        total_steps=cfg.train.steps * updates_per_step,
        schedule=cfg.train.schedule,
        min_lr_ratio=cfg.train.min_lr_ratio,
    )
    start_step, bad_steps = 0, 0
    reward_errors_shown = False
    if checkpoint is not None:
        load_model_weights(model, checkpoint)
        state = load_trainer_state(checkpoint)
        load_optimizer_state(optimizer, state["optimizer"], model)
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        own = rank_state(state, ranks, checkpoint)
        generator.set_state(own["generator"])
        restore_rng_state(own["rng"])
        regularization.load_state_dict(state["regularization"])
        if critic is not None:
            critic.load_state_dict(state["critic"])
        if prm is not None:
            prm.load_state_dict(state["prm"])
        start_step, bad_steps = state["step"], state["bad_steps"]
    for name in RUN_LOGS:
        if ranks.main:
            keep_until_step(run_dir / name, start_step)

    eos = eos_token_ids(model, tokenizer)
    engine: RolloutEngine
    if r.engine == "vllm":
        context = r.vllm_max_model_len or context_length(
            longest_sequence(cfg, task, held_out, tokenizer), model
        )
        with sharding.full_weights(model):  # FSDP: vLLM loads the whole weights
            engine = VLLMRolloutEngine(
                model, eos, generator, r.vllm_memory, r.vllm_cpu_kv_cache_gib, context
            )
    else:
        engine = HFRolloutEngine(
            model,
            eos,
            tokenizer.pad_token_id,
            r.batch_size,
            generator,
            cuda_graphs=r.cuda_graphs and not sharding.is_sharded(model),  # fixed addresses
        )
    rollout_engine = engine
    tool_use = ToolUse.of(r)
    engine = tool_use.around(engine, tokenizer, tool_use.chat_kwargs(cfg.data.chat_template_kwargs))
    rewarder = RewardScorer(cfg, task, policy=model, tokenizer=tokenizer, generator=generator)
    settings = LossSettings(
        algo, r.temperature, r.max_new_tokens, cfg.train.micro_batch_tokens, tokenizer.pad_token_id
    )
    # The adaptive entropy coefficient follows the measured entropy, so it needs every sample.
    settings.skip_zero_advantage = cfg.train.skip_zero_advantage and algo.entropy.target is None
    settings.reward_weights = rewarder.weights
    settings.seed = cfg.train.seed

    def checkpoint_state() -> dict:
        per_rank = None  # one process: its states are `generator` and the checkpoint's `rng`
        if ranks.world > 1:
            per_rank = ranks.gather({"generator": generator.get_state(), "rng": rng_state()})
        return {
            "ranks": per_rank,
            "optimizer": optimizer_state(optimizer, model),
            "scheduler": scheduler.state_dict(),
            "sampler": sampler.state_dict(),
            "generator": generator.get_state(),
            "bad_steps": bad_steps,
            "regularization": regularization.state_dict(),
            "critic": critic.state_dict() if critic is not None else None,
            "prm": prm.state_dict() if prm is not None else None,
        }

    def evaluate_after(step: int) -> None:
        """Held-out pass@1 / pass@k / maj@k before step 1, every `eval.every_steps` and at the
        end, into eval.jsonl (not counted in the step's time); with
        `algorithm.kl.reference_reset_patience`, a reset when pass@1 stalls."""
        if held_out and (step % every == 0 or step == cfg.train.steps):
            with sharding.full_weights(model):
                on_vllm = rollout_engine if r.engine == "vllm" else None
                if on_vllm is not None:  # it holds the weights this step sampled with
                    on_vllm.sync_weights(model)
                scores = evaluate_as_configured(
                    model, tokenizer, held_out, task.reward, cfg, ranks, on_vllm
                )
            if regularization.stalls is not None:  # ProRL's reset when pass@1 stalls
                with sharding.full_weights(model):
                    scores["reference_reset"] = regularization.after_eval(scores["pass@1"], model)
                if scores["reference_reset"] and algo.kl.reset_optimizer:
                    reset_optimizer_state(optimizer)
            if ranks.main:
                with JsonlWriter(run_dir / "eval.jsonl") as log:
                    log.write({"step": step, **scores})
            loggers.log({f"eval/{key}": value for key, value in scores.items()}, step)

    loggers = run_loggers(cfg, "train", run_dir, ranks.main)
    metrics_log = JsonlWriter(run_dir / "metrics.jsonl" if ranks.main else os.devnull)
    samples_log = JsonlWriter(run_dir / "samples.jsonl" if ranks.main else os.devnull)
    progress = StepProgress(cfg.train.steps, start_step, enabled=show_progress and ranks.main)
    stop = StopOnSignal(announce=ranks.main)  # SIGINT/SIGTERM: end this step with a checkpoint
    with metrics_log, samples_log, progress, loggers, stop:
        if start_step == 0:
            evaluate_after(0)
        for step in range(start_step + 1, cfg.train.steps + 1):
            t0 = time.perf_counter()
            step_cfg = config_for_step(cfg, step)
            settings.temperature = step_cfg.rollout.temperature
            settings.step = step
            settings.max_len = rewarder.max_len = step_cfg.rollout.max_new_tokens
            rewarder.step = step
            with sharding.full_weights(model):  # FSDP: the rollout and scoring on whole weights
                engine.sync_weights(model)
                data = collect_step(engine, tokenizer, task, sampler, step_cfg, rewarder, ranks)
                full_batch, batch = data.sampled, data.kept
                for keep in (*config_filters(cfg), *filters):
                    batch = keep(batch)
                t2 = time.perf_counter()

                model.train()
                settings.kl_coef = regularization.kl_coef
                settings.entropy_coef = regularization.entropy_coef
                several = updates_per_step > 1
                prm_stats = prepare_update(
                    batch, model, reference, critic, settings, several, ranks, teacher, prm
                )
            train_policy = critic is None or step > algo.critic.warmup_steps

            totals: dict[str, float] = {}
            grad_norms, skipped = [], 0
            for _epoch in range(cfg.train.epochs):
                # rank 0's order: a model with dropout draws from each rank's global RNG as
                # many times as that rank's rows ask, so the ranks' RNGs part ways
                order = ranks.broadcast(torch.randperm(len(batch)).tolist())
                for part in range(cfg.train.mini_batches):
                    rows = order[part :: cfg.train.mini_batches]
                    if critic is not None:
                        for key, value in critic.update(batch, rows).items():
                            totals[key] = totals.get(key, 0.0) + value
                    if not train_policy:
                        continue
                    optimizer.zero_grad(set_to_none=True)
                    stats = minibatch_backward(model, batch, rows, settings, ranks)
                    for key, value in stats.items():
                        totals[key] = totals.get(key, 0.0) + value
                    max_norm = cfg.train.max_grad_norm or float("inf")
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
                    if not (math.isfinite(stats["loss"]) and math.isfinite(grad_norm)):
                        skipped += 1
                        optimizer.zero_grad(set_to_none=True)
                        continue
                    grad_norms.append(grad_norm)
                    optimizer.step()
                    scheduler.step()
            bad_steps = bad_steps + 1 if skipped else 0
            if skipped:
                warnings.warn(
                    f"step {step}: non-finite loss or gradient, {skipped} update(s) skipped",
                    stacklevel=1,
                )
                if bad_steps >= cfg.train.max_nonfinite_steps:
                    raise NonFiniteError(
                        f"{bad_steps} consecutive steps had a non-finite loss or gradient; "
                        "stopping (lower train.lr or check the reward)"
                    )
            t3 = time.perf_counter()

            metrics = step_metrics(full_batch, batch, totals, grad_norms, cfg)
            metrics.update(
                {
                    "step": step,
                    "lr": scheduler.get_last_lr()[0],
                    "skipped_updates": skipped,
                    "reward/errors": data.rewards.errors,
                    "reward/timeouts": data.rewards.timeouts,
                    "sampling_rounds": data.rounds,
                    "time/rollout": data.rollout_seconds,
                    "time/reward": t2 - t0 - data.rollout_seconds,
                    "time/train": t3 - t2,
                    "time/step": t3 - t0,
                    "tokens_per_s": sum(full_batch.lengths) / max(t3 - t0, 1e-9),
                }
            )
            metrics["kl_coef"], metrics["entropy_coef"] = settings.kl_coef, settings.entropy_coef
            metrics.update(prm_stats)
            metrics.update({k: sum(v) / len(v) for k, v in data.rewards.metrics.items() if v})
            metrics.update(sampler.stats())
            metrics_log.write(metrics)
            loggers.log(metrics, step)
            with sharding.full_weights(model) if regularization.follows_policy else nullcontext():
                reset = regularization.after_step(step, model, metrics["kl"], metrics["entropy"])
            if reset and algo.kl.reset_optimizer:
                reset_optimizer_state(optimizer)
            for i in range(min(cfg.train.log_samples, len(full_batch))):
                samples_log.write(
                    {
                        "step": step,
                        "prompt": full_batch.prompt_texts[i],
                        "completion": full_batch.completion_texts[i],
                        "answer": full_batch.problems[i].answer,
                        "reward": float(full_batch.rewards[i]),
                        **{column: values[i] for column, values in data.rewards.extra.items()},
                    }
                )
            failed = data.rewards
            for message in failed.error_examples[:2]:
                samples_log.write({"step": step, "reward_error": message})
            if failed.error_examples and ranks.main and not reward_errors_shown:
                reward_errors_shown = True
                warnings.warn(
                    f"step {step}: rewards failed ({failed.errors} error(s), {failed.timeouts} "
                    f"timeout(s), each scored 0; the first: {failed.error_examples[0]}); later "
                    "ones are counted in reward/errors and reward/timeouts and shown in "
                    "samples.jsonl only",
                    stacklevel=1,
                )
            progress.update(step, metrics)
            evaluate_after(step)
            received = stop.agreed(ranks) if step < cfg.train.steps else None
            if (
                (cfg.train.save_every and step % cfg.train.save_every == 0)
                or step == cfg.train.steps
                or received is not None
            ):
                sharding.check_in_sync(model, ranks, f"step {step}")
                state, weights = checkpoint_state(), sharding.whole_state(model)
                if ranks.main:
                    keep = cfg.train.keep_checkpoints
                    save_checkpoint(run_dir, step, model, tokenizer, state, weights, keep)
            if received is not None:
                raise RunStopped(received, step, checkpoint_path(run_dir, step))
    if isinstance(rollout_engine, VLLMRolloutEngine):
        ranks.barrier()  # every rank is past its last collective before vLLM takes the group down
        rollout_engine.close()
    return run_dir
