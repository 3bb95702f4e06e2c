"""Cold-start supervised fine-tuning on worked solutions (DeepSeek-R1's cold start, in small).

The loss is the mean negative log-likelihood of the completion tokens (solution + EOS) over the
whole optimizer step; prompt tokens are context only. The forward is the RL update's
(`batching.completion_token_stats`): padding-free on the lean forward, and the LM head's
logits are made a chunk at a time, never for the whole micro-batch. Under `torchrun` each rank
trains its share of every batch and the gradients are summed (`rlvr.training.distributed`);
`sft.fsdp` shards the weights as `train.fsdp` does (`rlvr.training.sharding`).
"""

from __future__ import annotations

import os
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.config import ConfigError, make_output_dir, save_config
from rlvr.config_offline import SFTConfig
from rlvr.data.problem import Problem
from rlvr.data.tasks import held_out_note, load_task
from rlvr.data.templates import encode_prompts
from rlvr.models import fused
from rlvr.models.loading import load_model_and_tokenizer, resolve_device, save_pretrained
from rlvr.rollout.call_formats import CallFormat, call_format
from rlvr.rollout.tools import ToolUse, result_tokens
from rlvr.run_layout import CONFIG_FILE
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.loggers import run_loggers
from rlvr.training import sharding
from rlvr.training.batching import (
    collate_shared_prefix,
    completion_token_stats,
    model_device,
    to_device,
    token_budget_micro_batches,
)
from rlvr.training.checkpoint import checkpoint_to_resume, keep_until_step
from rlvr.training.distributed import ONE_PROCESS, Ranks, data_parallel
from rlvr.training.memory import keep_freed_memory
from rlvr.training.optim import build_optimizer, build_scheduler, optimizer_steps
from rlvr.training.stopping import StopOnSignal
from rlvr.training.supervised import ExampleOrder, LoopState, cut_to_length


def summed_nll(
    model: torch.nn.Module,
    prompts: list[list[int]],
    targets: list[list[int]],
    rows: list[int],
    pad_id: int,
    trained: list[list[bool]] | None = None,
) -> torch.Tensor:
    """-Σ log π(y_t | x, y_<t) over every target token of samples `rows` (differentiable):
    the summed negative log-likelihood of each target y given its prompt x; with `trained`,
    over the tokens it marks True only."""
    sb = collate_shared_prefix(prompts, targets, rows, pad_id, sharding.min_width(model))
    sb = to_device(sb, model_device(model))
    logprobs, _ = completion_token_stats(model, sb, 1.0, with_entropy=False)
    if trained is not None:
        keep = torch.zeros(logprobs.shape, dtype=torch.bool)
        for i, r in enumerate(rows):
            keep[i, : len(trained[r])] = torch.tensor(trained[r], dtype=torch.bool)
        logprobs = logprobs * keep.to(logprobs.device)
    return -logprobs.sum()


def sft_backward(
    model: torch.nn.Module,
    prompts: list[list[int]],
    targets: list[list[int]],
    seq_lengths: list[int],
    rows: list[int],
    budget: int,
    pad_id: int,
    ranks: Ranks = ONE_PROCESS,
    trained: list[list[bool]] | None = None,
) -> float:
    """Accumulate the gradient of the mean NLL of the target tokens of `rows` (one optimizer
    step) over token-budget micro-batches; return that loss. `seq_lengths` are the prompt +
    target lengths of every example. Each rank runs its share of the rows (`Ranks.share`) and
    the gradients and the loss are summed over the ranks (under FSDP each rank runs as many
    passes, `sharding.passes`). `trained`: which target tokens count (all when None)."""
    if trained is None:
        num_tokens = float(sum(len(targets[r]) for r in rows))
    else:
        num_tokens = float(max(sum(sum(trained[r]) for r in rows), 1))
    mine = ranks.share(rows, range(len(prompts)), seq_lengths)
    every = sharding.passes(model, token_budget_micro_batches(mine, seq_lengths, budget), ranks)
    total = torch.zeros(1, dtype=torch.float64)
    for i, mb_rows in enumerate(every):
        sharding.sync_gradients(model, last=i == len(every) - 1)
        if mb_rows is None:  # a zero-weighted pass
            (summed_nll(model, prompts, targets, rows[:1], pad_id) * 0.0).backward()
            continue
        loss = summed_nll(model, prompts, targets, mb_rows, pad_id, trained) / num_tokens
        loss.backward()
        total += float(loss.detach())
    sharding.sum_gradients(model, ranks)
    return float(ranks.sum_(total))


@dataclass(frozen=True)
class Encoded:
    """Examples as token ids: each prompt, its target (solution + EOS) and, where tool results
    are left out of the loss, which target tokens count (all when None)."""

    prompts: list[list[int]]
    targets: list[list[int]]
    trained: list[list[bool]] | None

    @staticmethod
    def of(
        prompts: list[list[int]],
        solutions: list[str],
        tokenizer: Any,
        masked: CallFormat | None,
        max_length: int | None,
        key: str,
    ) -> Encoded:
        """`solutions` tokenized after their `prompts` (the tool results in the call format
        `masked` marked out of the loss), each example cut to `max_length` (`cut_to_length`,
        its warning naming `key`)."""
        eos, trained = tokenizer.eos_token_id, None
        if masked is not None:
            encoded = [result_tokens(tokenizer, text, masked) for text in solutions]
            targets = [[*ids, eos] for ids, _ in encoded]
            trained = [[not mark for mark in marks] + [True] for _, marks in encoded]
        else:
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in solutions]
            targets = [[*i, eos] for i in ids]
        kept, cut = cut_to_length(prompts, [[t] for t in targets], max_length, key)
        targets = [t for (t,) in cut]
        if trained is not None:
            trained = [trained[i][: len(t)] for i, t in zip(kept, targets)]
        return Encoded([prompts[i] for i in kept], targets, trained)

    @property
    def seq_lengths(self) -> list[int]:
        return [len(p) + len(t) for p, t in zip(self.prompts, self.targets)]

    @property
    def target_tokens(self) -> int:
        """The target tokens that count in the loss."""
        if self.trained is None:
            return sum(map(len, self.targets))
        return sum(map(sum, self.trained))


def held_out_nll(model: torch.nn.Module, held_out: Encoded, budget: int, pad_id: int) -> float:
    """Mean negative log-likelihood per counted target token of `held_out` (TRL's SFT
    eval_loss), without gradient, in micro-batches of at most `budget` tokens."""
    rows = list(range(len(held_out.prompts)))
    total = 0.0
    with torch.no_grad():
        for mb in token_budget_micro_batches(rows, held_out.seq_lengths, budget):
            nll = summed_nll(
                model, held_out.prompts, held_out.targets, mb, pad_id, held_out.trained
            )
            total += float(nll)
    return total / max(held_out.target_tokens, 1)


def run_sft(cfg: SFTConfig, show_progress: bool = True, resume: bool = False) -> Path:
    """Fine-tune on the task's worked solutions; save the model to `cfg.sft.output_dir`.
    `resume`: continue from its latest checkpoint (`sft.save_every`), as the run went on.
    Under `torchrun` every process runs this as one data-parallel rank."""
    with data_parallel(resolve_device(cfg.model.device)) as ranks:
        return _run_sft(cfg, ranks, show_progress, resume)


def _run_sft(cfg: SFTConfig, ranks: Ranks, show_progress: bool, resume: bool) -> Path:
    """`run_sft` on this rank (rank 0 alone writes the output folder)."""
    s = cfg.sft
    if s.threads:
        torch.set_num_threads(s.threads)
    if s.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(s.seed)
    task = load_task(cfg.data)  # before the model: a bad file fails in a second
    if show_progress and ranks.main and (note := held_out_note(cfg.data, task)):
        print(note, flush=True)
    examples = [p for p in task.train if p.solution]
    if not examples:
        others = sorted(task.train[0].columns) if task.train else []
        listed = f"; the rows' other columns: {others}" if others else ""
        hint = f" (name their column with data.solution_column{listed})"
        hint = hint if task.name == "file" else ""
        raise ConfigError(f"task {task.name!r} has no worked solutions to fine-tune on{hint}")
    if len(examples) < len(task.train):
        warnings.warn(
            f"{len(task.train) - len(examples)} of {len(task.train)} training problems have no "
            "worked solution (a null data.solution_column, or a conversation that ends with the "
            "user's turn); SFT leaves them out",
            stacklevel=2,
        )
    out_dir = Path(s.output_dir)
    checkpoint = ranks.on_main(lambda: checkpoint_to_resume(out_dir, resume, "sft.output_dir"))
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=s.seed)
    ranks.copy_from_main(model)
    pad_id = tokenizer.pad_token_id
    if s.gradient_checkpointing:
        try:
            fused.enable_activation_checkpointing(model)
        except ValueError as error:
            raise ConfigError(f"sft.gradient_checkpointing: {error}") from None

    def start() -> None:  # written only once the model and the task have loaded
        make_output_dir(out_dir, "sft.output_dir")
        save_config(cfg, out_dir / CONFIG_FILE)

    ranks.on_main(start)
    chat_kwargs = ToolUse.of(s).chat_kwargs(cfg.data.chat_template_kwargs)  # hermes schemas
    form = call_format(s.tool_format, tokenizer, chat_kwargs)
    masked = s.mask_tool_results and any(form.result_spans(p.solution) for p in examples)
    if masked and not tokenizer.is_fast:
        raise ConfigError(
            f"sft.mask_tool_results: the solutions have tool results "
            f"(sft.tool_format={s.tool_format}), which only a fast tokenizer (its offsets) "
            "can leave out of the loss; set it to false to train on them"
        )

    def encode(problems: list[Problem], key: str) -> Encoded:
        _, prompts = encode_prompts(
            cfg.data.template, [p.prompt for p in problems], tokenizer, chat_kwargs
        )
        solutions = [p.solution for p in problems]
        return Encoded.of(
            prompts, solutions, tokenizer, form if masked else None, s.max_length, key
        )

    train = encode(examples, "sft.max_length")
    if not train.prompts:
        raise ConfigError(f"sft.max_length={s.max_length} leaves no room for any solution")
    held_out = [p for p in task.test if p.solution][: s.eval_examples]
    evaluation = encode(held_out, "sft.max_length (held-out)") if held_out else None
    if s.fsdp:
        sharding.shard(model, ranks, s.fsdp_reshard_after_forward, announce=show_progress)
    steps = optimizer_steps(s.steps, s.epochs, len(train.prompts), s.batch_size)
    optimizer = build_optimizer(model, s.lr, s.weight_decay, shard=s.shard_optimizer)
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=s.warmup_steps,
        total_steps=steps,
        schedule=s.schedule,
        min_lr_ratio=s.min_lr_ratio,
    )
    loop = LoopState(model, tokenizer, optimizer, scheduler, ExampleOrder(random.Random(s.seed)))
    start_step = loop.resume(checkpoint) if checkpoint is not None else 0
    if ranks.main:
        for name in ("metrics.jsonl", "eval.jsonl"):
            keep_until_step(out_dir / name, start_step)
    start = time.perf_counter()
    loggers = run_loggers(cfg, "sft", out_dir, ranks.main)
    stop = StopOnSignal(announce=ranks.main)  # SIGINT/SIGTERM: end this step with a checkpoint
    metrics_log = JsonlWriter(out_dir / "metrics.jsonl" if ranks.main else os.devnull)
    eval_log = JsonlWriter(out_dir / "eval.jsonl" if ranks.main and evaluation else os.devnull)
    with metrics_log as log, eval_log as ev, loggers, stop:

        def score_held_out(step: int) -> None:
            if evaluation is not None:
                loop.score_held_out(
                    step,
                    lambda: {
                        "loss": held_out_nll(model, evaluation, s.micro_batch_tokens, pad_id),
                        "tokens": evaluation.target_tokens,
                    },
                    ev,
                    loggers,
                )

        if start_step == 0:
            score_held_out(0)
        model.train()
        for step in range(start_step + 1, steps + 1):
            rows = loop.examples.next_rows(s.batch_size, len(train.prompts))
            optimizer.zero_grad(set_to_none=True)
            total = sft_backward(
                model,
                train.prompts,
                train.targets,
                train.seq_lengths,
                rows,
                s.micro_batch_tokens,
                pad_id,
                ranks,
                train.trained,
            )
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm or float("inf"))
            )
            stepped = loop.update(total, grad_norm, f"sft step {step}")
            record = {
                "step": step,
                "epoch": step * s.batch_size / len(train.prompts),
                "loss": total,
                "grad_norm": grad_norm,
                "skipped_updates": int(not stepped),
                "lr": scheduler.get_last_lr()[0],
                "time": time.perf_counter() - start,
            }
            log.write(record)
            loggers.log(record, step)
            loop.stop_if_failing("lower sft.lr or check the solutions")
            if s.eval_every_steps and step % s.eval_every_steps == 0 and step < steps:
                score_held_out(step)
            if show_progress and ranks.main and (step % 50 == 0 or step == steps):
                print(f"sft step {step}/{steps}  loss {total:.4f}", flush=True)
            loop.after_step(step, steps, out_dir, s.save_every, s.keep_checkpoints, stop, ranks)
        score_held_out(steps)
    sharding.check_in_sync(model, ranks, f"sft step {steps}")
    weights = sharding.whole_state(model)
    if ranks.main:
        save_pretrained(model, tokenizer, out_dir, weights)
    return out_dir
