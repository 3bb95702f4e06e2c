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

Pairs come from a local file (`data.task=file`) or, for a built-in task, from the starting
model's own samples, verified (`rlvr.data.preference`); sampled pairs are written to
`pairs.jsonl` in the file format, so a later run can read them back.

Under `torchrun` rank 0 reads or samples the pairs and hands them to the other ranks; each rank
then scores and trains its share of every batch and the gradients are summed
(`rlvr.training.distributed`). `dpo.fsdp` shards the weights as `train.fsdp` does
(`rlvr.training.sharding`): the reference pass runs before sharding, the held-out scoring on
the whole weights.
"""

from __future__ import annotations

import math
import os
import random
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

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
from rlvr.data.preference import PreferencePair, load_preference_file, pairs_from_groups
from rlvr.data.problem import Problem
from rlvr.data.tasks import Task, load_task
from rlvr.data.templates import encode_prompts
from rlvr.evaluation.evaluate import sample_and_verify
from rlvr.models.loading import load_model_and_tokenizer, resolve_device, save_pretrained
from rlvr.run_layout import CONFIG_FILE
from rlvr.tracking.jsonl import JsonlWriter
from rlvr.tracking.loggers import run_loggers
from rlvr.training import sharding
from rlvr.training.batching import (
    SharedPrefixBatch,
    collate_shared_prefix,
    completion_token_stats,
    forward_logits_shared_prefix,
    model_device,
    to_device,
    token_budget_micro_batches,
)
from rlvr.training.checkpoint import checkpoint_to_resume, keep_until_step
from rlvr.training.distributed import ONE_PROCESS, Ranks, data_parallel
from rlvr.training.memory import keep_freed_memory
from rlvr.training.optim import build_optimizer, build_scheduler, optimizer_steps
from rlvr.training.rl import NonFiniteError
from rlvr.training.stopping import StopOnSignal
from rlvr.training.supervised import ExampleOrder, LoopState, cut_to_length

MAX_NONFINITE_STEPS = 3
"""Consecutive steps with a non-finite loss or gradient (each skipped) before the run stops."""


@dataclass
class PairTokens:
    """Token ids of P pairs: prompt, chosen and rejected response (each ends with EOS unless
    it was a sample cut at the generation budget). A one-sided pair, a labelled response of an
    unpaired file, has an empty list for its missing side."""

    prompts: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, n: int) -> PairTokens:
        """The first `n` pairs."""
        return PairTokens(self.prompts[:n], self.chosen[:n], self.rejected[:n])

    def cut(self, max_length: int | None, key: str) -> PairTokens:
        """The pairs with each response cut to fit `max_length` with its prompt
        (`supervised.cut_to_length`: a pair whose prompt leaves no room is left out)."""
        kept, cut = cut_to_length(
            self.prompts, [[c, r] for c, r in zip(self.chosen, self.rejected)], max_length, key
        )
        if not kept:
            return PairTokens([], [], [])
        chosen, rejected = zip(*cut)
        return PairTokens([self.prompts[i] for i in kept], list(chosen), list(rejected))

    def mismatched(self) -> PairTokens:
        """Each prompt with the next pair's responses (the last with the first's): the
        prompt/response pairs of no preference whose log-ratios estimate KL(π_θ ‖ π_ref) for
        KTO's reference point, as TRL shifts its completions by one."""
        return PairTokens(
            self.prompts, self.chosen[1:] + self.chosen[:1], self.rejected[1:] + self.rejected[:1]
        )

    def lengths(self) -> tuple[Tensor, Tensor]:
        """Response lengths in tokens, [P] each (the |y| of the length-normalised losses; 0
        for a missing side)."""
        return (
            torch.tensor([len(c) for c in self.chosen], dtype=torch.float32),
            torch.tensor([len(r) for r in self.rejected], dtype=torch.float32),
        )

    @cached_property
    def longest(self) -> list[int]:
        """Prompt + longer response length of each pair, in tokens (computed once)."""
        return [
            len(p) + max(len(c), len(r))
            for p, c, r in zip(self.prompts, self.chosen, self.rejected)
        ]

    def micro_batches(self, rows: list[int], max_tokens: int) -> list[list[int]]:
        """Pairs `rows` grouped so that both responses of each pair, padded to the longest,
        fit `max_tokens` (a pair is two sequences)."""
        return token_budget_micro_batches(rows, self.longest, max(max_tokens // 2, 1))

    def share(self, rows: list[int], ranks: Ranks) -> list[int]:
        """This rank's part of pairs `rows` (`Ranks.share`, each pair weighed by `longest`)."""
        return ranks.share(rows, range(len(self)), self.longest)


def encode_pairs(
    pairs: list[PreferencePair],
    template: str,
    tokenizer,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> PairTokens:
    """Templated prompt ids and response ids + EOS (the way SFT encodes its targets)."""
    questions = [list(p.prompt) if isinstance(p.prompt, tuple) else p.prompt for p in pairs]
    _, prompts = encode_prompts(template, questions, tokenizer, chat_kwargs)

    def encode(text: str | None) -> list[int]:
        if text is None:  # the missing side of a one-sided pair
            return []
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    return PairTokens(
        prompts, [encode(p.chosen) for p in pairs], [encode(p.rejected) for p in pairs]
    )


def sample_pairs(
    model: torch.nn.Module,
    tokenizer,
    problems: list[Problem],
    reward: str,
    *,
    template: str,
    samples_per_prompt: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    chat_kwargs: Mapping[str, Any] | None = None,
) -> tuple[PairTokens, list[dict]]:
    """Pairs of the model's own verified samples (`pairs_from_groups`): their token ids, and one
    record per pair for pairs.jsonl (question, chosen and rejected text, their rewards)."""
    s = sample_and_verify(
        model,
        tokenizer,
        problems,
        reward,
        template,
        samples_per_prompt,
        temperature,
        1.0,
        max_new_tokens,
        seed,
        chat_kwargs=chat_kwargs,
    )
    out, scores, completions, prompt_ids = s.rollout, s.scored.total, s.completions, s.prompt_ids
    chosen_rejected = pairs_from_groups(scores, samples_per_prompt, random.Random(seed))
    tokens = PairTokens(
        [prompt_ids[out.prompt_index[c]] for c, _ in chosen_rejected],
        [out.completion_ids[c] for c, _ in chosen_rejected],
        [out.completion_ids[r] for _, r in chosen_rejected],
    )
    records = [
        {
            "prompt": problems[out.prompt_index[c]].question,
            "chosen": completions[c],
            "rejected": completions[r],
            "chosen_reward": scores[c],
            "rejected_reward": scores[r],
        }
        for c, r in chosen_rejected
    ]
    return tokens, records


def desensitized_weights(
    chosen: list[int], rejected: list[int], width: int, alpha: float
) -> Tensor:
    """``[2P, width]`` token weights of LD-DPO (Liu et al. 2024, *Length Desensitization in
    Direct Preference Optimization*, arXiv:2409.06411; TRL's ``ld_alpha``), rows alternating
    chosen and rejected: 1 on a response's first min(|y_w|, |y_l|) tokens, the length the two
    share, and α on the tokens past it, so the longer response's surplus counts α-fold."""
    lengths = torch.tensor([n for pair in zip(chosen, rejected) for n in pair])
    shared = torch.tensor([min(c, r) for c, r in zip(chosen, rejected) for _ in range(2)])
    position = torch.arange(width)[None, :]
    weights = torch.where(position < shared[:, None], 1.0, alpha)
    return torch.where(position < lengths[:, None], weights, 0.0)


def pair_batch(
    model: torch.nn.Module, pairs: PairTokens, rows: list[int], pad_id: int
) -> tuple[SharedPrefixBatch, Tensor]:
    """Pairs `rows` as one batch on the model's device: each prompt once, its chosen then its
    rejected response, a missing side left out; and each batch row's place in the
    [len(rows), 2] (chosen, rejected) layout, flattened (0, 1, 2, 3, ... for whole pairs)."""
    prompts, responses, places = [], [], []
    for i, r in enumerate(rows):
        for side, seq in enumerate((pairs.chosen[r], pairs.rejected[r])):
            if seq:
                prompts.append(pairs.prompts[r])
                responses.append(seq)
                places.append(2 * i + side)
    each = list(range(len(responses)))
    sb = collate_shared_prefix(prompts, responses, each, pad_id, sharding.min_width(model))
    device = model_device(model)
    return to_device(sb, device), torch.tensor(places, device=device)


def _by_place(values: Tensor, places: Tensor, rows: int, missing: float) -> Tensor:
    """``[rows, 2]``: `values` of the batch rows at their `places`, `missing` elsewhere."""
    full = values.new_full((2 * rows,), missing)
    return full.index_copy(0, places, values).view(rows, 2)


def pair_logps(
    model: torch.nn.Module,
    pairs: PairTokens,
    rows: list[int],
    pad_id: int,
    ld_alpha: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Σ_t log π(y_t | x, y_<t) of the chosen and of the rejected response of pairs `rows`,
    [len(rows)] each (differentiable), from one forward that computes each prompt once;
    `ld_alpha` weighs each token past the length the pair's responses share by α (LD-DPO,
    `desensitized_weights`). A missing side scores 0."""
    sb, places = pair_batch(model, pairs, rows, pad_id)
    logprobs, _ = completion_token_stats(model, sb, 1.0, with_entropy=False)
    if ld_alpha is not None:
        chosen = [len(pairs.chosen[r]) for r in rows]
        rejected = [len(pairs.rejected[r]) for r in rows]
        weights = desensitized_weights(chosen, rejected, logprobs.shape[1], ld_alpha)
        logprobs = logprobs * weights[places.cpu()].to(logprobs.device, logprobs.dtype)
    summed = _by_place(logprobs.sum(-1), places, len(rows), 0.0)
    return summed[:, 0], summed[:, 1]


@torch.no_grad()
def all_pair_logps(
    model: torch.nn.Module,
    pairs: PairTokens,
    max_tokens: int,
    pad_id: int,
    ranks: Ranks = ONE_PROCESS,
    ld_alpha: float | None = None,
) -> tuple[Tensor, Tensor]:
    """`pair_logps` of every pair, on the CPU, without gradients (the reference pass); each
    rank scores its share and every rank gets them all."""
    chosen, rejected = torch.zeros(len(pairs)), torch.zeros(len(pairs))
    for rows in pairs.micro_batches(pairs.share(list(range(len(pairs))), ranks), max_tokens):
        c, r = pair_logps(model, pairs, rows, pad_id, ld_alpha)
        chosen[rows], rejected[rows] = c.float().cpu(), r.float().cpu()
    return ranks.sum_(chosen), ranks.sum_(rejected)


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
            return _by_place(weights, places, len(mb), 1.0)

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
            f"{d.eval_pairs}; lower dpo.eval_pairs or give data.test_path"
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
    train, records = sample_pairs(
        model, tokenizer, task.train[: d.prompts], task.reward, **sampling
    )
    if not len(train):
        raise ConfigError(
            f"dpo.prompts: none of {min(d.prompts, len(task.train))} {task.name} problems had "
            f"samples that scored differently, so there is no pair; start from a model that "
            "solves some of them (`rlvr sft`) or raise dpo.samples_per_prompt"
        )
    held_out = None
    if d.eval_pairs:
        held_out = sample_pairs(model, tokenizer, task.test, task.reward, **sampling)[0]
        held_out = held_out.head(d.eval_pairs)
    return train, held_out if held_out else None, records


def check_one_sided(d: DPOTrainConfig, pairs: list[PreferencePair], path: DataPath) -> None:
    """Refuse unpaired rows (one-sided pairs) for a loss other than KTO, or with the settings
    that read a pair's two responses (the NLL term on the chosen one, LD-DPO's shared length);
    warn when the weighted desirable and undesirable counts are out of the range KTO's authors
    advise, λ_D n_D / (λ_U n_U) in [1, 4/3] (Ethayarajh et al. 2024, §4.2; TRL warns too)."""
    if not any(p.one_sided for p in pairs):
        return
    where = f"{path_label(path)}: unpaired rows (prompt, completion, label)"
    if [name for name, _ in d.losses] != ["kto"]:
        raise ConfigError(
            f"{where} train dpo.loss=kto alone (the kto preset), which values each response "
            f"by itself; dpo.loss is {d.loss_name}"
        )
    for key, value in (("nll_coef", d.nll_coef), ("ld_alpha", d.ld_alpha)):
        if value:
            raise ConfigError(f"{where}: dpo.{key} reads the two responses of a pair; unset it")
    desirable = sum(p.chosen is not None for p in pairs)
    weighted_desirable = d.kto_desirable_weight * desirable
    weighted_undesirable = d.kto_undesirable_weight * (len(pairs) - desirable)
    if not weighted_undesirable or not 1.0 <= weighted_desirable / weighted_undesirable <= 4 / 3:
        warnings.warn(
            f"{where}: {desirable} desirable and {len(pairs) - desirable} undesirable; KTO's "
            "authors advise dpo.kto_desirable_weight × desirable / (dpo.kto_undesirable_weight "
            "× undesirable) between 1 and 4/3",
            stacklevel=2,
        )


def check_loss_settings(d: DPOTrainConfig) -> None:
    """Refuse, before anything loads, a `dpo.loss` not registered, an ε no listed loss reads,
    an f-divergence a listed loss cannot take, and EXO without its ε."""
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
    if d.threads:
        torch.set_num_threads(d.threads)
    if d.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(d.seed)
    source: FilePairs | Task | None = None

    def read_source() -> None:  # rank 0, before the model: a bad file fails in a second
        nonlocal source
        source = _pair_source(cfg)

    ranks.on_main(read_source)
    out_dir = Path(d.output_dir)
    checkpoint = ranks.on_main(lambda: checkpoint_to_resume(out_dir, resume, "dpo.output_dir"))
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=d.seed)
    ranks.copy_from_main(model)
    pad_id = tokenizer.pad_token_id
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
                model.eval()
                with sharding.full_weights(model):
                    scores = eval_scorer.evaluate(model, pad_id, ranks)
                ev.write({"step": step, **scores})
                loggers.log({f"eval/{key}": value for key, value in scores.items()}, step)
                model.train()

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
            finite = math.isfinite(record["loss"]) and math.isfinite(grad_norm)
            loop.bad_steps = 0 if finite else loop.bad_steps + 1
            if finite:
                optimizer.step()
                scheduler.step()
            else:
                warnings.warn(
                    f"{d.loss_name} step {step}: non-finite loss or gradient, skipped", stacklevel=1
                )
            record.update(
                {
                    "skipped_updates": int(not finite),
                    "lr": scheduler.get_last_lr()[0],
                    "time/step": time.perf_counter() - start,
                }
            )
            log.write(record)
            loggers.log(record, step)
            if loop.bad_steps >= MAX_NONFINITE_STEPS:
                raise NonFiniteError(
                    f"{loop.bad_steps} consecutive steps had a non-finite loss or gradient; "
                    "stopping (lower dpo.lr or check the pairs)"
                )
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
