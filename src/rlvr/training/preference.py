"""Offline preference optimisation (`rlvr dpo`): DPO and the other losses of
`rlvr.algorithms.preference` and `rlvr.algorithms.preference_step` (IPO, SimPO, CPO, ORPO,
KTO, AOT, ...), alone or as a weighted list.

The loop is SFT's with a pairwise loss: each step takes `dpo.batch_size` pairs, scores both
responses of each pair in one shared-prefix forward (the prompt is computed once for the
two), and averages the pair losses over the step, so the micro-batch split changes neither
the loss nor the gradient. What a loss reads from the step's other pairs (KTO's reference
point, AOT's rank matching) or from the current policy without gradient (WPO's weights)
`PairScorer.prepare` computes before the step's micro-batches. The reference is the starting
model; its log-probs are computed once before training (TRL's `precompute_ref_log_probs`), so
no second model stays in memory, and not at all for the reference-free SimPO, CPO and ORPO.

Pairs come from a local file (`data.task=file`; for KTO also unpaired labelled rows) or, for
a built-in task, from the starting model's own samples, verified (`rlvr.data.preference`);
sampled pairs are written to `pairs.jsonl` in the file format, so a later run can read them
back. Their tokens and log-probs are `rlvr.training.pairs`'.

Under `torchrun` rank 0 reads or samples the pairs and hands them to the other ranks; each rank
then scores and trains its share of every batch and the gradients are summed
(`rlvr.training.distributed`). `dpo.fsdp` shards the weights as `train.fsdp` does
(`rlvr.training.sharding`): the reference pass runs before sharding, the held-out scoring on
the whole weights.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from rlvr.algorithms.preference import REFERENCE_FREE, SMOOTHED, preference_loss
from rlvr.algorithms.preference_step import (
    F_DIVERGENCE_LOSSES,
    REFERENCE_POINT,
    SORTED_ACROSS_PAIRS,
    aot_matching,
    f_divergence_scores,
    wpo_weights,
)
from rlvr.algorithms.registry import PREFERENCE_LOSSES
from rlvr.config import ConfigError, make_output_dir, save_config
from rlvr.config_offline import DPOConfig, DPOTrainConfig
from rlvr.data.loaders import DataPath, path_label
from rlvr.data.preference import PreferencePair, load_preference_file
from rlvr.data.tasks import Task, holding_out, load_task
from rlvr.evaluation.engines import sampling_engine
from rlvr.models import fused
from rlvr.models.loading import load_model_and_tokenizer, resolve_device, save_pretrained
from rlvr.run_layout import CONFIG_FILE
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.loggers import run_loggers
from rlvr.training import sharding
from rlvr.training.batching import forward_logits_shared_prefix
from rlvr.training.checkpoint import checkpoint_to_resume, keep_until_step
from rlvr.training.distributed import ONE_PROCESS, Ranks, data_parallel
from rlvr.training.memory import keep_freed_memory
from rlvr.training.optim import build_optimizer, build_scheduler, optimizer_steps
from rlvr.training.pairs import (
    PairTokens,
    all_pair_logps,
    by_place,
    encode_pairs,
    pair_batch,
    pair_logps,
    sample_pairs,
)
from rlvr.training.stopping import StopOnSignal
from rlvr.training.supervised import ExampleOrder, LoopState


class PairScorer:
    """The configured loss on pairs of one set, with that set's reference log-probs (and, for
    KTO, those of its mismatched pairs). `prepare` sets what a step's losses read from all of
    its pairs: KTO's reference point `z0`, AOT's rank matching `matched`."""

    def __init__(
        self,
        cfg: DPOConfig,
        pairs: PairTokens,
        reference: tuple[Tensor, Tensor] | None,
        mismatched_reference: tuple[Tensor, Tensor] | None = None,
    ):
        self.cfg, self.pairs, self.reference = cfg, pairs, reference
        self.chosen_lengths, self.rejected_lengths = pairs.lengths()
        self.mismatched = pairs.mismatched()
        self.mismatched_reference = mismatched_reference
        self.z0: float | None = None
        self.matched = torch.zeros(len(pairs), 2)
        """AOT's `aot_matching` of the prepared step's pairs, by pair index."""
        self.weights = torch.ones(len(pairs))
        """WPO's w(y_w)·w(y_l) of the prepared step's pairs, by pair index."""

    def prepare(
        self, model: torch.nn.Module, rows: list[int], pad_id: int, ranks: Ranks = ONE_PROCESS
    ) -> None:
        """What the losses of pairs `rows` read from the whole set of them, computed before
        any micro-batch so that the split does not change it: KTO's `z0` (`set_z0`), AOT's
        `matched` (`set_matched`). Every rank calls this with the same rows."""
        self.set_z0(model, rows, pad_id, ranks)
        self.set_matched(model, rows, pad_id, ranks)
        self.set_weights(model, rows, pad_id, ranks)

    def _over_step(
        self,
        model: torch.nn.Module,
        pairs: PairTokens,
        rows: list[int],
        ranks: Ranks,
        score: Callable[[list[int]], Tensor],
    ) -> Tensor:
        """``[len(rows), k]``: `score(micro_batch_rows)` (``[len(micro_batch), k]``) of
        `pairs` `rows` without gradient, each rank its share on whole weights, summed over the
        ranks so every rank has them all: the step-wide passes of `prepare`."""
        values: Tensor | None = None
        position = {row: i for i, row in enumerate(rows)}
        with torch.no_grad(), sharding.full_weights(model):
            for mb in pairs.micro_batches(
                pairs.share(rows, ranks), self.cfg.dpo.micro_batch_tokens
            ):
                part = score(mb).double().cpu()
                if values is None:
                    values = torch.zeros(len(rows), part.shape[1], dtype=torch.float64)
                values[torch.tensor([position[row] for row in mb])] = part
        if values is None:  # a rank without a share this step: every score here has 2 columns
            values = torch.zeros(len(rows), 2, dtype=torch.float64)
        return ranks.sum_(values)

    def set_weights(
        self, model: torch.nn.Module, rows: list[int], pad_id: int, ranks: Ranks = ONE_PROCESS
    ) -> None:
        """WPO's weights of pairs `rows` under the current policy (`wpo_weights`, from the
        logits of a no-grad pass)."""
        if not self.cfg.dpo.weighting:
            return

        def score(mb: list[int]) -> Tensor:  # w(y_w), w(y_l) of each pair; 1 if missing
            sb, places = pair_batch(model, self.pairs, mb, pad_id)
            logits = forward_logits_shared_prefix(model, sb)
            weights = wpo_weights(logits, sb.completion_ids, sb.response_mask)
            return by_place(weights, places, len(mb), 1.0)

        weights = self._over_step(model, self.pairs, rows, ranks, score).prod(dim=1)
        self.weights[torch.tensor(rows)] = weights.float()

    def set_matched(
        self, model: torch.nn.Module, rows: list[int], pad_id: int, ranks: Ranks = ONE_PROCESS
    ) -> None:
        """AOT's rank matching of pairs `rows` under the current policy (`aot_matching`)."""
        names = {name for name, _ in self.cfg.dpo.losses} & SORTED_ACROSS_PAIRS
        if not names:
            return

        def score(mb: list[int]) -> Tensor:
            return torch.stack(pair_logps(model, self.pairs, mb, pad_id, self.cfg.dpo.ld_alpha), 1)

        logps = self._over_step(model, self.pairs, rows, ranks, score).float()
        index = torch.tensor(rows)
        ref_chosen, ref_rejected = (t[index] for t in self.reference)
        self.matched[index] = aot_matching(
            logps[:, 0], logps[:, 1], ref_chosen, ref_rejected, unpaired="aot_unpaired" in names
        )

    def set_z0(
        self, model: torch.nn.Module, rows: list[int], pad_id: int, ranks: Ranks = ONE_PROCESS
    ) -> None:
        """KTO's reference point for pairs `rows`: max(0, the mean log-ratio of their
        mismatched pairs' responses, 2·len(rows) of whole pairs, len(rows) of one-sided ones)
        under the current policy, detached (Ethayarajh et al. 2024, §4.2)."""
        if self.mismatched_reference is None:
            return
        pairs, reference = self.mismatched, self.mismatched_reference

        def score(mb: list[int]) -> Tensor:
            logps = pair_logps(model, pairs, mb, pad_id, self.cfg.dpo.ld_alpha)
            index = torch.tensor(mb)
            return torch.stack([p.cpu() - r[index] for p, r in zip(logps, reference)], 1)

        log_ratios = self._over_step(model, pairs, rows, ranks, score)  # 0 where missing
        responses = sum(bool(pairs.chosen[r]) + bool(pairs.rejected[r]) for r in rows)
        self.z0 = max(float(log_ratios.sum()) / responses, 0.0)

    def loss(self, model: torch.nn.Module, rows: list[int], pad_id: int) -> tuple[Tensor, dict]:
        """Per-pair losses [len(rows)] (differentiable) and their detached statistics."""
        chosen, rejected = pair_logps(model, self.pairs, rows, pad_id, self.cfg.dpo.ld_alpha)
        index = torch.tensor(rows)
        ref = [None, None] if self.reference is None else [t[index] for t in self.reference]
        d = self.cfg.dpo
        device = chosen.device
        ref = [None if t is None else t.to(device) for t in ref]
        lengths = self.chosen_lengths[index].to(device), self.rejected_lengths[index].to(device)
        policy = chosen, rejected
        if d.f_divergence != "reverse_kl":  # f-DPO: f'(π/π_ref) in place of log π/π_ref
            policy = tuple(
                f_divergence_scores(logp - r, d.f_divergence, d.f_alpha)
                for logp, r in zip(policy, ref)
            )
            ref = [torch.zeros_like(chosen), torch.zeros_like(chosen)]
        outs = []
        for name, _ in d.losses:
            settings = {"tau": d.discopop_tau} if name == "discopop" else {}
            if name in SORTED_ACROSS_PAIRS:
                settings = {"matched": self.matched[index].to(device)}
            if name in REFERENCE_POINT:
                if self.z0 is None:
                    raise RuntimeError("KTO's reference point is not set (PairScorer.set_z0)")
                settings = {
                    "z0": self.z0,
                    "desirable_weight": d.kto_desirable_weight,
                    "undesirable_weight": d.kto_undesirable_weight,
                }
            eps = d.label_smoothing if name in SMOOTHED else 0.0
            outs.append(
                preference_loss(
                    name,
                    *policy,
                    *ref,
                    *lengths,
                    beta=d.beta,
                    gamma=d.gamma,
                    label_smoothing=eps,
                    **settings,
                )
            )
        # MPO (Wang et al. 2024, arXiv:2411.10442): Σ_k w_k L_k; the first loss's rewards
        losses = sum(weight * o.losses for (_, weight), o in zip(d.losses, outs, strict=True))
        out = outs[0]
        stats = {}
        if d.nll_coef:
            # IRPO's DPO + NLL (Pang et al. 2024): + α · (−log π_θ(y_w|x) / |y_w|), the NLL
            # per token of the chosen response (TRL's rpo_alpha averages it over the batch's
            # chosen tokens instead: the same when the lengths are equal)
            nll = -chosen / self.chosen_lengths[index].to(device)
            losses = losses + d.nll_coef * nll
            stats["nll_loss"] = nll.detach()
        if d.weighting:  # WPO: the pair's whole loss, as TRL weighs each loss type's
            pair_weights = self.weights[index].to(device)
            losses = losses * pair_weights
            stats["wpo_weight"] = pair_weights
        has_chosen, has_rejected = lengths[0] > 0, lengths[1] > 0
        both = has_chosen & has_rejected  # all rows but a one-sided pair's
        margins = out.chosen_rewards - out.rejected_rewards
        stats |= {
            "loss": losses.detach(),
            "rewards/chosen": out.chosen_rewards[has_chosen],
            "rewards/rejected": out.rejected_rewards[has_rejected],
            "rewards/margins": margins[both],
            "rewards/accuracies": (margins[both] > 0).float(),
            "logps/chosen": chosen.detach()[has_chosen],
            "logps/rejected": rejected.detach()[has_rejected],
        }
        if self.mismatched_reference is not None:  # KTO's z0, as TRL logs it
            stats["kl"] = torch.full_like(stats["loss"], self.z0)
        return losses, stats

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, pad_id: int, ranks: Ranks = ONE_PROCESS
    ) -> dict[str, float]:
        """Mean pair statistics over the whole set (the held-out metrics); each rank scores its
        share."""
        self.prepare(model, list(range(len(self.pairs))), pad_id, ranks)
        rows = self.pairs.share(list(range(len(self.pairs))), ranks)
        parts = [
            self.loss(model, mb, pad_id)[1]
            for mb in self.pairs.micro_batches(rows, self.cfg.dpo.micro_batch_tokens)
        ]
        return {"pairs": len(self.pairs), **_means(parts, ranks)}


def accumulate_gradients(
    model: torch.nn.Module,
    scorer: PairScorer,
    rows: list[int],
    max_tokens: int,
    pad_id: int,
    ranks: Ranks = ONE_PROCESS,
) -> list[dict]:
    """Backpropagate the mean loss of pairs `rows`, a token-budget micro-batch at a time: each
    adds Σ losses / len(rows), so any split gives the same gradient. Returns each micro-batch's
    statistics. Each rank runs its share of `rows`; the gradients are summed over the ranks
    (under FSDP each rank runs as many passes, `sharding.passes`)."""
    scorer.prepare(model, rows, pad_id, ranks)
    parts = []
    mine = scorer.pairs.micro_batches(scorer.pairs.share(rows, ranks), max_tokens)
    every = sharding.passes(model, mine, ranks)
    for i, mb_rows in enumerate(every):
        sharding.sync_gradients(model, last=i == len(every) - 1)
        if mb_rows is None:  # a zero-weighted pass
            (scorer.loss(model, rows[:1], pad_id)[0].sum() * 0.0).backward()
            continue
        losses, stats = scorer.loss(model, mb_rows, pad_id)
        (losses.sum() / len(rows)).backward()
        parts.append(stats)
    sharding.sum_gradients(model, ranks)
    return parts


def _means(parts: list[dict], ranks: Ranks = ONE_PROCESS) -> dict[str, float]:
    """The mean of each per-pair statistic over the micro-batches `parts` of every rank; a
    statistic with no value (the margins of one-sided pairs) is left out."""
    if ranks.world > 1:
        mine = [{key: value.cpu() for key, value in part.items()} for part in parts]
        parts = [part for theirs in ranks.gather(mine) for part in theirs]
    values = {key: torch.cat([p[key].float() for p in parts]) for key in parts[0]}
    return {key: float(v.mean()) for key, v in values.items() if v.numel()}


def _progress(record: dict[str, float]) -> str:
    """A step's loss and its reward accuracy (of pairs) or mean rewards (one-sided pairs)."""
    shown = {
        "loss": "loss {:.4f}",
        "rewards/accuracies": "reward accuracy {:.3f}",
        "rewards/chosen": "desirable reward {:+.3f}",
        "rewards/rejected": "undesirable reward {:+.3f}",
    }
    if "rewards/accuracies" in record:
        shown = dict(list(shown.items())[:2])
    return "  ".join(form.format(record[key]) for key, form in shown.items() if key in record)


FilePairs = tuple[list[PreferencePair], list[PreferencePair]]
"""A pair file's training and held-out pairs, as read."""


def _pair_source(cfg: DPOConfig) -> FilePairs | Task:
    """The pairs of a pair file (training, held-out), or the task whose samples give them:
    what can be read before the model loads."""
    data, d = cfg.data, cfg.dpo
    if data.task != "file":
        return load_task(data)
    if d.sampled_as != "pairs":
        raise ConfigError(
            f"dpo.sampled_as={d.sampled_as} is for a built-in task's samples; a file's rows "
            "are read as they are (pairs, or unpaired labelled rows)"
        )
    if not data.path:
        raise ConfigError("data.task=file needs data.path (a JSONL/Parquet/JSON of pairs)")
    columns = {
        "prompt_column": data.prompt_column,
        "chosen_column": data.chosen_column,
        "rejected_column": data.rejected_column,
        "completion_column": data.completion_column,
        "label_column": data.label_column,
    }
    train = load_preference_file(data.path, **columns)
    check_one_sided(d, train, data.path)
    if data.test_path:
        held_out = load_preference_file(data.test_path, **columns)[: d.eval_pairs]
        check_one_sided(d, held_out, data.test_path)
        return train, held_out
    if not d.eval_pairs:
        return train, []
    if len(train) <= d.eval_pairs:
        raise ConfigError(
            f"{path_label(data.path)} has {len(train)} rows, not more than dpo.eval_pairs="
            f"{d.eval_pairs}; lower dpo.eval_pairs (0 holds none out) or give data.test_path"
        )
    return train[: -d.eval_pairs], train[-d.eval_pairs :]


def _training_pairs(
    cfg: DPOConfig, source: FilePairs | Task, model: torch.nn.Module, tokenizer
) -> tuple[PairTokens, PairTokens | None, list[dict]]:
    """(training pairs, held-out pairs or None, the sampled pairs' records for pairs.jsonl)
    from a file's pairs (no records) or sampled from the task."""
    data, d = cfg.data, cfg.dpo
    if not isinstance(source, Task):
        train, held_out = source
        chat = data.chat_template_kwargs
        pairs = encode_pairs(train, data.template, tokenizer, chat).cut(
            d.max_length, "dpo.max_length"
        )
        if not len(pairs):
            raise ConfigError(f"dpo.max_length={d.max_length} leaves no room for any response")
        encoded = encode_pairs(held_out, data.template, tokenizer, chat) if held_out else None
        if encoded is not None:
            encoded = encoded.cut(d.max_length, "dpo.max_length (held-out pairs)")
        return pairs, encoded if encoded else None, []
    task = source
    sampling = {
        "template": data.template,
        "chat_kwargs": data.chat_template_kwargs,
        "samples_per_prompt": d.samples_per_prompt,
        "temperature": d.temperature,
        "max_new_tokens": d.max_new_tokens,
        "seed": d.seed,
    }
    labelled = d.sampled_as == "labelled"
    problems = task.train[: d.prompts]
    engine = sampling_engine(
        d,
        model,
        tokenizer,
        [*problems, *(task.test if d.eval_pairs else [])],
        data.template,
        d.max_new_tokens,
        data.chat_template_kwargs,
        engine_named=f"dpo.engine={d.engine}",
    )
    try:
        train, records = sample_pairs(
            model, tokenizer, problems, task.reward, **sampling, labelled=labelled, engine=engine
        )
        if not len(train):  # before the held-out pairs are sampled
            raise ConfigError(
                f"dpo.prompts: none of {min(d.prompts, len(task.train))} {task.name} problems "
                "had samples that scored differently, so there is no pair; start from a model "
                "that solves some of them (`rlvr sft`) or raise dpo.samples_per_prompt"
            )
        held_out = None
        if d.eval_pairs:
            held_out = sample_pairs(
                model, tokenizer, task.test, task.reward, **sampling, engine=engine
            )[0].head(d.eval_pairs)
    finally:
        if engine is not None:  # its memory back for the training
            engine.close()
    if labelled:
        desirable = sum(record["label"] for record in records)
        warn_kto_balance(d, desirable, len(records), "dpo.sampled_as=labelled")
    return train, held_out if held_out else None, records


def check_one_sided(d: DPOTrainConfig, pairs: list[PreferencePair], path: DataPath) -> None:
    """Refuse unpaired rows (one-sided pairs) for a loss other than KTO, or with the settings
    that read a pair's two responses (the NLL term on the chosen one, LD-DPO's shared length);
    warn when the weighted desirable and undesirable counts are out of the range KTO's authors
    advise, λ_D n_D / (λ_U n_U) in [1, 4/3] (Ethayarajh et al. 2024, §4.2; TRL warns too)."""
    if not any(p.one_sided for p in pairs):
        return
    where = f"{path_label(path)}: unpaired rows (prompt, completion, label)"
    refuse_pairwise_settings(d, where)
    warn_kto_balance(d, sum(p.chosen is not None for p in pairs), len(pairs), where)


def refuse_pairwise_settings(d: DPOTrainConfig, where: str) -> None:
    """One-sided pairs (`where` names them) train KTO alone, without the settings that read
    both responses of a pair."""
    if [name for name, _ in d.losses] != ["kto"]:
        raise ConfigError(
            f"{where} train dpo.loss=kto alone (the kto preset), which values each response "
            f"by itself; dpo.loss is {d.loss_name}"
        )
    for key, value in (("nll_coef", d.nll_coef), ("ld_alpha", d.ld_alpha)):
        if value:
            raise ConfigError(f"{where}: dpo.{key} reads the two responses of a pair; unset it")


def warn_kto_balance(d: DPOTrainConfig, desirable: int, examples: int, where: str) -> None:
    """Warn when λ_D n_D / (λ_U n_U) is outside [1, 4/3], the range KTO's authors advise."""
    weighted_desirable = d.kto_desirable_weight * desirable
    weighted_undesirable = d.kto_undesirable_weight * (examples - desirable)
    if not weighted_undesirable or not 1.0 <= weighted_desirable / weighted_undesirable <= 4 / 3:
        warnings.warn(
            f"{where}: {desirable} desirable and {examples - desirable} undesirable; KTO's "
            "authors advise dpo.kto_desirable_weight × desirable / (dpo.kto_undesirable_weight "
            "× undesirable) between 1 and 4/3",
            stacklevel=2,
        )


def check_loss_settings(d: DPOTrainConfig) -> None:
    """Refuse, before anything loads, a `dpo.loss` not registered, an ε no listed loss reads,
    an f-divergence a listed loss cannot take, EXO without its ε, and labelled samples for a
    loss other than KTO."""
    names = [name for name, _ in d.losses]
    for name in names:
        try:
            PREFERENCE_LOSSES.get(name)
        except KeyError as exc:
            raise ConfigError(f"dpo.loss: {exc.args[0]}") from None
    if d.label_smoothing and not SMOOTHED.intersection(names):
        raise ConfigError(
            f"dpo.label_smoothing: loss {d.loss_name} has no label smoothing; set it to 0 "
            f"(read by {', '.join(sorted(SMOOTHED))})"
        )
    if d.f_divergence != "reverse_kl" and not F_DIVERGENCE_LOSSES.issuperset(names):
        raise ConfigError(
            f"dpo.f_divergence={d.f_divergence}: loss {d.loss_name} is not a function of the "
            f"chosen-minus-rejected log-ratio alone (f-DPO applies to "
            f"{', '.join(sorted(F_DIVERGENCE_LOSSES))})"
        )
    if SORTED_ACROSS_PAIRS.issubset(names):
        raise ConfigError("dpo.loss: aot and aot_unpaired are two matchings; list one of them")
    if d.sampled_as == "labelled":
        refuse_pairwise_settings(d, "dpo.sampled_as=labelled: its one-sided samples")
    if "exo_pair" in names and not d.label_smoothing:
        raise ConfigError(
            "dpo.label_smoothing: exo_pair needs EXO's ε > 0 (the paper's 1e-3; the exo preset)"
        )


def run_dpo(cfg: DPOConfig, show_progress: bool = True, resume: bool = False) -> Path:
    """Optimise the preference loss; save the model and logs to `cfg.dpo.output_dir`.
    `resume`: continue from its latest checkpoint (`dpo.save_every`), as the run went on.
    Under `torchrun` every process runs this as one data-parallel rank."""
    with data_parallel(resolve_device(cfg.model.device)) as ranks:
        return _run_dpo(cfg, ranks, show_progress, resume)


def _run_dpo(cfg: DPOConfig, ranks: Ranks, show_progress: bool, resume: bool) -> Path:
    """`run_dpo` on this rank (rank 0 alone reads or samples the pairs, `Ranks.on_main`, and
    writes the output folder)."""
    d = cfg.dpo
    check_loss_settings(d)
    if d.engine == "vllm" and ranks.world > 1:
        raise ConfigError(
            "dpo.engine=vllm: rank 0 alone samples the pairs, and vLLM under torchrun takes "
            "every rank; run rlvr dpo in one process or use dpo.engine=hf"
        )
    if d.threads:
        torch.set_num_threads(d.threads)
    if d.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(d.seed)
    source: FilePairs | Task | None = None

    def read_source() -> None:  # rank 0, before the model: a bad file fails in a second
        nonlocal source
        source = _pair_source(cfg)
        if show_progress and isinstance(source, tuple) and source[1] and not cfg.data.test_path:
            train, held = source
            note = holding_out(len(train), len(held), "pairs", f"dpo.eval_pairs={d.eval_pairs}")
            print(note, flush=True)

    ranks.on_main(read_source)
    out_dir = Path(d.output_dir)
    checkpoint = ranks.on_main(lambda: checkpoint_to_resume(out_dir, resume, "dpo.output_dir"))
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=d.seed)
    ranks.copy_from_main(model)
    pad_id = tokenizer.pad_token_id
    if d.gradient_checkpointing:
        try:
            fused.enable_activation_checkpointing(model)
        except ValueError as error:
            raise ConfigError(f"dpo.gradient_checkpointing: {error}") from None
    train_pairs, eval_pairs, records = ranks.on_main(
        lambda: _training_pairs(cfg, source, model, tokenizer)
    )

    def start() -> None:  # only once the model and the pairs have loaded
        make_output_dir(out_dir, "dpo.output_dir")
        (out_dir / "pairs.jsonl").unlink(missing_ok=True)  # sampled again, the same pairs
        save_config(cfg, out_dir / CONFIG_FILE)
        if records:
            with JsonlWriter(out_dir / "pairs.jsonl") as handle:
                for record in records:
                    handle.write(record)

    ranks.on_main(start)

    def scorer(pairs: PairTokens) -> PairScorer:
        if all(name in REFERENCE_FREE for name, _ in d.losses):
            return PairScorer(cfg, pairs, None)
        reference = all_pair_logps(model, pairs, d.micro_batch_tokens, pad_id, ranks, d.ld_alpha)
        mismatched = None
        if REFERENCE_POINT.intersection(name for name, _ in d.losses):
            mismatched = all_pair_logps(
                model, pairs.mismatched(), d.micro_batch_tokens, pad_id, ranks, d.ld_alpha
            )
        return PairScorer(cfg, pairs, reference, mismatched)

    train_scorer = scorer(train_pairs)
    eval_scorer = scorer(eval_pairs) if eval_pairs is not None else None
    if d.fsdp:
        sharding.shard(model, ranks, d.fsdp_reshard_after_forward, announce=show_progress)
    batch_size = min(d.batch_size, len(train_pairs))
    steps = optimizer_steps(d.steps, d.epochs, len(train_pairs), batch_size)
    optimizer = build_optimizer(model, d.lr, d.weight_decay, shard=d.shard_optimizer)
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=d.warmup_steps,
        total_steps=steps,
        schedule=d.schedule,
        min_lr_ratio=d.min_lr_ratio,
    )
    loop = LoopState(model, tokenizer, optimizer, scheduler, ExampleOrder(random.Random(d.seed)))
    start_step = loop.resume(checkpoint) if checkpoint is not None else 0  # after the reference
    metrics_log = out_dir / "metrics.jsonl" if ranks.main else os.devnull
    eval_log = out_dir / "eval.jsonl" if ranks.main else os.devnull
    if ranks.main:
        for name in ("metrics.jsonl", "eval.jsonl"):
            keep_until_step(out_dir / name, start_step)
    loggers = run_loggers(cfg, "dpo", out_dir, ranks.main)
    stop = StopOnSignal(announce=ranks.main)  # SIGINT/SIGTERM: end this step with a checkpoint
    with JsonlWriter(metrics_log) as log, JsonlWriter(eval_log) as ev, loggers, stop:

        def held_out(step: int) -> None:
            if eval_scorer is not None:
                score = partial(eval_scorer.evaluate, model, pad_id, ranks)
                loop.score_held_out(step, score, ev, loggers)

        if start_step == 0:
            held_out(0)
        model.train()
        for step in range(start_step + 1, steps + 1):
            start = time.perf_counter()
            rows = loop.examples.next_rows(batch_size, len(train_pairs))
            optimizer.zero_grad(set_to_none=True)
            parts = accumulate_gradients(
                model, train_scorer, rows, d.micro_batch_tokens, pad_id, ranks
            )
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(model.parameters(), d.max_grad_norm or float("inf"))
            )
            record = {"step": step, "epoch": step * batch_size / len(train_pairs)}
            record.update({**_means(parts, ranks), "grad_norm": grad_norm})
            stepped = loop.update(record["loss"], grad_norm, f"{d.loss_name} step {step}")
            record.update(
                {
                    "skipped_updates": int(not stepped),
                    "lr": scheduler.get_last_lr()[0],
                    "time/step": time.perf_counter() - start,
                }
            )
            log.write(record)
            loggers.log(record, step)
            loop.stop_if_failing("lower dpo.lr or check the pairs")
            if d.eval_every_steps and step % d.eval_every_steps == 0 and step < steps:
                held_out(step)
            if show_progress and ranks.main and (step % 10 == 0 or step == steps):
                print(f"{d.loss_name} step {step}/{steps}  {_progress(record)}", flush=True)
            loop.after_step(step, steps, out_dir, d.save_every, d.keep_checkpoints, stop, ranks)
        held_out(steps)
    sharding.check_in_sync(model, ranks, f"{d.loss_name} step {steps}")
    weights = sharding.whole_state(model)
    if ranks.main:
        save_pretrained(model, tokenizer, out_dir, weights)
    return out_dir
