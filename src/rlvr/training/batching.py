"""From variable-length samples to model inputs, and from those to the completion tokens'
log-probs (the log-prob functions themselves are in `rlvr.training.logprobs`).

Layout of a micro-batch (`collate_shared_prefix`): each distinct prompt of the micro-batch once,
left-padded to the longest, and each sample's completion right-padded to the longest
completion, with the index of its prompt. The prompts run through the model once and the G
completions of a group attend to their prompt's KV cache, so a group costs P + G·T tokens of
forward and backward instead of G·(P + T); the output at completion column t scores completion
token t (DESIGN rule 3). It gives the same log-probs and gradients as the padded layout, where
each row is its own prompt followed by its completion (tested). Per-token tensors of a whole
batch (`response_mask`, `old_logprobs`, `advantages`, ...) are completion-aligned, shape
[num_samples, max_completion_len].

The policy's update and log-prob passes, the critic, SFT and the likelihood and certainty
rewards (`score_completion_tokens`) all use it.
On the fused forward none of them builds the [tokens, vocab] logits (`completion_token_stats`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from torch import nn
from transformers.cache_utils import Cache

from rlvr.models import fused, kv_cache
from rlvr.models.hf_cache import cache_kwarg, returned_cache
from rlvr.rollout.hf import staged
from rlvr.training.logprobs import linear_token_stats, token_logprobs_and_entropy


def model_device(model: nn.Module) -> torch.device:
    """The device of `model`'s parameters (`model.device`), where its inputs must be."""
    return next(model.parameters()).device


def on_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x (on the CPU) on `device`; to a GPU through page-locked memory (`rollout.hf.staged`)
    without making the host wait for the work already queued there, so that it prepares the
    next micro-batch while the GPU runs the last one's backward."""
    return staged(x, device).to(device, non_blocking=True)


def to_device(mb: SharedPrefixBatch, device: torch.device) -> SharedPrefixBatch:
    """A copy of a collated micro-batch with every tensor on `device` and `host` the CPU batch
    it copies. Collation builds on the CPU; only the model's inputs travel."""
    moved = {f.name: on_device(getattr(mb, f.name), device) for f in fields(mb) if f.name != "host"}
    return replace(mb, **moved, host=mb.host or mb)


def rows_on(
    tensor: torch.Tensor, rows: list[int], width: int, device: torch.device
) -> torch.Tensor:
    """`tensor[rows, :width]` of a per-token batch tensor ([N, T], on the CPU) on `device`,
    zero-padded to `width` when T is less (a micro-batch collated with `min_width`)."""
    part = tensor[rows, :width]
    if part.shape[1] < width:
        part = torch.nn.functional.pad(part, (0, width - part.shape[1]))
    return on_device(part, device)


def response_mask_from_lengths(lengths: list[int], width: int | None = None) -> torch.Tensor:
    """[N, width] float mask with ones on the first `lengths[i]` positions of row i."""
    width = max(lengths, default=0) if width is None else width
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def token_budget_micro_batches(
    rows: list[int], seq_lengths: list[int], max_tokens: int
) -> list[list[int]]:
    """Group rows, sorted by length so the groups carry little padding, so that rows x longest
    length stays within `max_tokens` (the padded layout). A single sequence longer than the
    budget gets its own group.
    """
    order = sorted(rows, key=lambda r: seq_lengths[r])
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in order:
        longest_with = max(longest, seq_lengths[r])
        if current and (len(current) + 1) * longest_with > max_tokens:
            groups.append(current)
            current, longest_with = [], seq_lengths[r]
        current.append(r)
        longest = longest_with
    if current:
        groups.append(current)
    return groups


def packed_micro_batches(
    rows: list[int],
    groups: list[int],
    prompt_lengths: list[int],
    completion_lengths: list[int],
    max_tokens: int,
) -> list[list[int]]:
    """Cut `rows` (in order, a group's rows together) into micro-batches that each compute at
    most `max_tokens` tokens in the shared-prefix, padding-free forward: each distinct group's
    prompt once plus every completion token.

    Attention alone sees the padded [rows, longest completion] layout; it is kept within
    3 × `max_tokens` slots, so its tensors stay no larger than the MLP's (about 3 × hidden
    wide per real token). A single row over the budget gets its own micro-batch.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    seen: set[int] = set()
    cost = longest = 0
    for r in rows:
        add = completion_lengths[r] + (0 if groups[r] in seen else prompt_lengths[r])
        longest_with = max(longest, completion_lengths[r])
        over = cost + add > max_tokens or (len(current) + 1) * longest_with > 3 * max_tokens
        if current and over:
            batches.append(current)
            current, seen = [], set()
            add, longest_with = completion_lengths[r] + prompt_lengths[r], completion_lengths[r]
            cost = 0
        current.append(r)
        seen.add(groups[r])
        cost, longest = cost + add, longest_with
    if current:
        batches.append(current)
    return batches


@dataclass
class SharedPrefixBatch:
    """A micro-batch whose identical prompts are stored, and run through the model, once."""

    rows: torch.Tensor
    """Indices of these samples in the batch."""
    prompt_ids: torch.Tensor
    """[u, P] the distinct prompts, left-padded."""
    prompt_mask: torch.Tensor
    """[u, P] 1 on real prompt tokens."""
    prompt_index: torch.Tensor
    """[b] which distinct prompt each sample continues."""
    completion_ids: torch.Tensor
    """[b, T] completion tokens, right-padded."""
    response_mask: torch.Tensor
    """[b, T] 1 on completion tokens (from lengths, DESIGN rule 2)."""
    host: SharedPrefixBatch | None = None
    """The batch on the CPU that this one copies (`to_device`; None: this one is it), from which
    the forward derives its index tensors without reading the device back."""


def collate_shared_prefix(
    prompts: list[list[int]],
    completions: list[list[int]],
    rows: list[int],
    pad_id: int,
    min_width: int = 1,
) -> SharedPrefixBatch:
    """The micro-batch of samples `rows`, each distinct prompt once (the module docstring),
    completions padded to at least `min_width` tokens: 2 makes `shared_prefix_forward` run
    its two passes whatever the lengths, as FSDP needs (`sharding.min_width`)."""
    distinct: dict[tuple[int, ...], int] = {}
    prompt_index = [distinct.setdefault(tuple(prompts[r]), len(distinct)) for r in rows]
    unique = [list(p) for p in distinct]
    p_width = max(len(p) for p in unique)
    prompt_ids = torch.full((len(unique), p_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(unique), p_width), dtype=torch.long)
    for i, prompt in enumerate(unique):
        prompt_ids[i, p_width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[i, p_width - len(prompt) :] = 1
    lengths = [len(completions[r]) for r in rows]
    t_width = max(*lengths, min_width)
    completion_ids = torch.full((len(rows), t_width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        if completions[r]:
            completion_ids[i, : lengths[i]] = torch.tensor(completions[r], dtype=torch.long)
    return SharedPrefixBatch(
        rows=torch.tensor(rows, dtype=torch.long),
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        prompt_index=torch.tensor(prompt_index, dtype=torch.long),
        completion_ids=completion_ids,
        response_mask=response_mask_from_lengths(lengths, t_width),
    )


PrefixStep = Callable[..., tuple[torch.Tensor, Cache]]
"""`step(input_ids, attention_mask, position_ids, cache, keep_last, flat, host)` ->
(per-position outputs of the last `keep_last` positions (all when None), the KV cache).
`flat` (or None) holds the positions whose outputs are used, in the flattened [b·t] layout
(`fused.real_positions`); a step may skip the others (padding-free) and leave zeros there.
`host` (`fused.HostIndex`): the attention mask, `flat` and the rows' prompts on the CPU."""


def shared_prefix_forward(step: PrefixStep, sb: SharedPrefixBatch) -> torch.Tensor:
    """Outputs [b, T, ...] at the positions that score each completion token, prompts run once.

    The prompts' forward pass fills a KV cache; its rows are gathered for the samples (a
    differentiable index) and the completions attend to them. Gradients flow back through the
    shared prompt activations once per prompt instead of once per sample, which is what makes a
    group of G samples of one prompt cost P + G·T tokens instead of G·(P + T).

    The masks, positions and computed positions are made from the CPU batch (`sb.host`) and
    sent to the device, with the CPU copies for the step (lever 54): nothing here reads a
    GPU back.
    """
    host = sb.host or sb
    device = sb.prompt_ids.device

    def send(x: torch.Tensor) -> torch.Tensor:
        return on_device(x, device)

    prompt_positions = (host.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    prompts = fused.HostIndex(host.prompt_mask, None, None, send)
    first, cache = step(
        sb.prompt_ids, sb.prompt_mask, send(prompt_positions), None, 1, None, prompts
    )
    first = first[:, -1].index_select(0, sb.prompt_index).unsqueeze(1)
    width = sb.completion_ids.shape[1]
    if width == 1:
        return first
    cache.batch_select_indices(sb.prompt_index)
    prompt_mask = host.prompt_mask[host.prompt_index]
    inputs = sb.completion_ids[:, :-1]
    attention_mask = torch.cat([prompt_mask, torch.ones_like(host.completion_ids[:, :-1])], -1)
    positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(width - 1)[None, :]
    flat = fused.real_positions(host.response_mask[:, 1:].bool())
    completions = fused.HostIndex(attention_mask, flat, host.prompt_index, send)
    rest, _ = step(
        inputs, send(attention_mask), send(positions), cache, None, send(flat), completions
    )
    return torch.cat([first, rest], dim=1)


def fused_hidden_step(model: nn.Module) -> PrefixStep:
    """A `PrefixStep` whose outputs are the fused forward's final-norm hidden states."""
    forward = fused.FusedForward(model)

    def step(input_ids, attention_mask, position_ids, cache, keep_last, flat, host):
        cache = cache if cache is not None else kv_cache.ConcatKV(len(forward.layers))
        hidden = forward.hidden(input_ids, position_ids, attention_mask, cache, flat, host=host)
        if flat is None:
            return (hidden[:, -keep_last:] if keep_last else hidden), cache
        padded = hidden.new_zeros(input_ids.numel(), hidden.shape[-1]).index_copy(0, flat, hidden)
        return padded.view(*input_ids.shape, -1), cache

    return step


def forward_logits_shared_prefix(model: nn.Module, sb: SharedPrefixBatch) -> torch.Tensor:
    """Logits [b, T, vocab] scoring the completion tokens, each distinct prompt computed once.

    Supported Llama-family models run through `rlvr.models.fused` (same function, fewer
    operations); others through their own forward."""
    if fused.supports(model):
        return model.lm_head(shared_prefix_forward(fused_hidden_step(model), sb))

    def hf_step(input_ids, attention_mask, position_ids, cache, keep_last, flat, host):
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=keep_last or 0,
            **cache_kwarg(model, cache),
        )
        return out.logits, returned_cache(out)

    return shared_prefix_forward(hf_step, sb)


def completion_token_stats(
    model: nn.Module, sb: SharedPrefixBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T)[token] [b, T] of the completion tokens and (`with_entropy`) the
    entropies [b, T], both differentiable, zero at padding.

    Models on the fused forward never build the [tokens, vocab] logits: the hidden states of
    the real completion positions go through the LM head a chunk at a time
    (`logprobs.linear_token_stats`). Others score their logits (`token_logprobs_and_entropy`).
    """
    if not fused.supports(model):
        logits = forward_logits_shared_prefix(model, sb)
        logp, entropy = token_logprobs_and_entropy(
            logits, sb.completion_ids, temperature, with_entropy=with_entropy
        )
        mask = sb.response_mask.to(logp.dtype)
        return logp * mask, entropy * mask if with_entropy else entropy
    return fused.within(model, _fused_token_stats, model, sb, temperature, with_entropy)


def _fused_token_stats(
    model: nn.Module, sb: SharedPrefixBatch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_token_stats` by the fused forward (as a forward of the FSDP root, whose
    embeddings, final norm and LM head it reads)."""
    hidden = shared_prefix_forward(fused_hidden_step(model), sb)
    host = sb.host or sb
    host_flat = fused.real_positions(host.response_mask.bool())
    flat = on_device(host_flat, hidden.device)
    logp, entropy = linear_token_stats(
        hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat),
        model.lm_head,
        sb.completion_ids.reshape(-1)[flat],
        temperature,
        with_entropy,
        host_tokens=host.completion_ids.reshape(-1)[host_flat],
    )
    placed = placed_at(logp, flat, sb.response_mask)
    return placed, placed_at(entropy, flat, sb.response_mask) if with_entropy else entropy


def placed_at(values: torch.Tensor, flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-position values [N] of the N real positions `flat` (`fused.real_positions(mask)`)
    placed into mask's [b, T] shape, zero elsewhere (differentiable; a tensor of its own, not a
    view, as FSDP2 asks of a forward's outputs)."""
    placed = values.new_zeros(mask.shape)
    placed.view(-1).index_copy_(0, flat, values)
    return placed


TokenScores = Callable[[nn.Module, SharedPrefixBatch], torch.Tensor]
"""``scores(model, sb) -> [b, T]``: a value per completion token of a collated micro-batch."""


@torch.no_grad()
def score_completion_tokens(
    model: nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    scores: TokenScores,
    micro_batch_tokens: int = 4096,
) -> list[torch.Tensor]:
    """`scores` of every (prompt, completion) pair, in eval mode (the module's mode is
    restored), a token-budget micro-batch at a time, each distinct prompt run once: one
    float32 CPU tensor of ``len(completions[i])`` values per pair."""
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    device = model_device(model)
    out: list[torch.Tensor] = [torch.empty(0)] * len(completions)
    was_training = model.training
    model.eval()
    try:
        for rows in token_budget_micro_batches(
            list(range(len(completions))), lengths, micro_batch_tokens
        ):
            sb = to_device(collate_shared_prefix(prompts, completions, rows, pad_id), device)
            values = scores(model, sb).float().cpu()
            for k, row in enumerate(rows):
                out[row] = values[k, : len(completions[row])]
    finally:
        model.train(was_training)
    return out
