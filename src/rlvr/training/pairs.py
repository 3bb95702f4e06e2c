"""Preference pairs as tokens, and their log-probabilities under a model.

`PairTokens` holds a set's pairs (a one-sided pair, a labelled response of an unpaired file,
has an empty missing side); `encode_pairs` makes them from a file's pairs and `sample_pairs`
from the model's own verified samples. `pair_logps` scores both responses of each pair in one
shared-prefix forward, each prompt computed once for its responses, a missing side left out.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from rlvr.data.preference import PreferencePair, pairs_from_groups
from rlvr.data.problem import Problem
from rlvr.data.templates import encode_prompts
from rlvr.evaluation.evaluate import VerifiedSamples, sample_and_verify
from rlvr.rollout.base import RolloutEngine
from rlvr.training import sharding
from rlvr.training.batching import (
    SharedPrefixBatch,
    collate_shared_prefix,
    completion_token_stats,
    model_device,
    to_device,
    token_budget_micro_batches,
)
from rlvr.training.distributed import ONE_PROCESS, Ranks
from rlvr.training.supervised import cut_to_length


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
    labelled: bool = False,
    engine: RolloutEngine | None = None,
) -> tuple[PairTokens, list[dict]]:
    """Pairs of the model's own verified samples (`pairs_from_groups`): their token ids, and one
    record per pair for pairs.jsonl (question, chosen and rejected text, their rewards); with
    `labelled`, every sample as a one-sided pair instead (`labelled_samples`). `engine`: what
    samples (`sample_and_verify`'s; None: the in-process engine)."""
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
        engine=engine,
    )
    if labelled:
        return labelled_samples(problems, s)
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


def labelled_samples(problems: list[Problem], s: VerifiedSamples) -> tuple[PairTokens, list[dict]]:
    """Every verified sample as a one-sided pair, KTO's unpaired data from a verifiable task: a
    sample the verifier accepts is desirable (chosen), any other undesirable (rejected), so
    every sample counts, a group that all succeed or all fail included; and one record per
    sample for pairs.jsonl in TRL's unpaired format (prompt, completion, label, its reward)."""
    out = s.rollout
    good = [ok for per_problem in s.correct for ok in per_problem]
    tokens = PairTokens(
        [s.prompt_ids[i] for i in out.prompt_index],
        [ids if ok else [] for ids, ok in zip(out.completion_ids, good, strict=True)],
        [[] if ok else ids for ids, ok in zip(out.completion_ids, good, strict=True)],
    )
    records = [
        {
            "prompt": problems[i].question,
            "completion": text,
            "label": ok,
            "reward": score,
        }
        for i, text, ok, score in zip(
            out.prompt_index, s.completions, good, s.scored.total, strict=True
        )
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


def by_place(values: Tensor, places: Tensor, rows: int, missing: float) -> Tensor:
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
    summed = by_place(logprobs.sum(-1), places, len(rows), 0.0)
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
