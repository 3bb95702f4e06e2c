"""Reference-likelihood rewards: how much a reasoning trace helps a model predict the reference.

No verifier is needed, only a reference continuation y* (the gold answer, or the next chapter
of a story): a reasoning trace z is good when the scoring model π finds y* more likely after
it. With the mean per-token log-likelihood

    ℓ(y* | c) = (1/|y*|) Σ_t log π(y*_t | c, y*_<t)        (= -log PPL(y* | c))

the modes of `reference_likelihood_rewards` are

- ``logprob`` (default):  r = ℓ(y* | x, z) - ℓ(y* | x) = log PPL(y* | x) - log PPL(y* | x, z),
  the improvement in log-perplexity. This is the log-probability reward that "Beyond Verifiable
  Rewards" (Tang et al. 2025, JEPO, whose reward is log π(y* | x, z)) and "Likelihood-Based
  Reward Designs for General LLM Reasoning" (Kwiatkowski et al. 2026) find the most reliable,
  with the no-reasoning term as a baseline;
- ``perplexity``: VR-CLI (Gurung & Lapata 2025, "Learning to Reason for Long-Form Story
  Generation", Verifiable Rewards via Completion Likelihood Improvement), the percentage
  improvement I = 100 · (1 - PPL(y* | x, z) / PPL(y* | x)) = 100 · (1 - exp(-r_logprob));
- ``probability``: RLPR (Yu et al. 2025), the mean per-token probability
  p̄(y* | c) = (1/|y*|) Σ_t π(y*_t | c, y*_<t), debiased and clipped:
  r = clip(p̄(y* | x, z) - p̄(y* | x), 0, 1).

The no-reasoning term depends only on the prompt, so with group-relative advantages it cancels
in ``logprob`` mode; it sets the zero of the logged reward, and VR-CLI / RLPR need it.

How this departs from the papers:
- VR-CLI discretises I into a few reward levels (0 / 0.5 / 0.9 / 1 above thresholds); we return
  the continuous I and leave thresholds to the user (the published values differ by source);
- JEPO uses the summed log-likelihood and no baseline; we use the per-token mean (a length-free
  scale, the perplexity form) and subtract the no-reasoning term;
- RLPR also filters prompts by reward std; that is dynamic sampling here, not this reward;
- the scoring model sees the plain text ``prompt + reasoning + answer_prefix`` then
  ``reference + answer_suffix`` (optionally the completion cut at `reasoning_stop`, so the
  policy's own answer is replaced by the reference, as RLPR and VeriFree do); log-probs use
  temperature 1 (the model's own distribution, not the sampling temperature).

Everything runs under `torch.no_grad` in token-budget micro-batches, in eval mode (the module's
mode is restored), with the no-reasoning context scored once per distinct prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.training.batching import completion_token_stats, score_completion_tokens

LIKELIHOOD_MODES = ("logprob", "perplexity", "probability")
"""The reward forms of `reference_likelihood_rewards`."""


def target_logprobs(
    model: nn.Module,
    contexts: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    pad_id: int,
    micro_batch_tokens: int = 4096,
) -> list[torch.Tensor]:
    """Per-token log π(target_t | context, target_<t) of each (context, target) pair.

    Returns one float32 CPU tensor of length ``len(targets[i])`` per pair. Contexts are
    left-padded and targets right-padded (the trainer's layout, `rlvr.training.batching`); the
    log-probs come from `completion_token_stats`, which makes the target positions' logits a
    chunk at a time (DESIGN rule 7) and runs each distinct context once.
    """
    if len(contexts) != len(targets):
        raise ValueError(f"{len(contexts)} contexts for {len(targets)} targets")
    for i, (context, target) in enumerate(zip(contexts, targets)):
        if not context or not target:
            raise ValueError(f"pair {i}: the context and the target must both be non-empty")
    return score_completion_tokens(
        model,
        [list(c) for c in contexts],
        [list(t) for t in targets],
        pad_id,
        lambda m, sb: completion_token_stats(m, sb, 1.0, with_entropy=False)[0],
        micro_batch_tokens,
    )


def likelihood_improvement(
    with_reasoning: torch.Tensor, without_reasoning: torch.Tensor, mode: str = "logprob"
) -> float:
    """The reward of one trace from the per-token log-probs of the reference with and without it.

    ``logprob``: mean(with) - mean(without) (log-perplexity improvement);
    ``perplexity``: 100 · (1 - PPL_with / PPL_without) (VR-CLI's I);
    ``probability``: clip(mean(exp(with)) - mean(exp(without)), 0, 1) (RLPR).
    """
    if mode not in LIKELIHOOD_MODES:
        raise ValueError(f"unknown likelihood mode {mode!r}; choose from {LIKELIHOOD_MODES}")
    gain = float(with_reasoning.double().mean() - without_reasoning.double().mean())
    if mode == "logprob":
        return gain
    if mode == "perplexity":
        return 100.0 * -math.expm1(-gain)
    p_with = float(with_reasoning.double().exp().mean())
    p_without = float(without_reasoning.double().exp().mean())
    return min(max(p_with - p_without, 0.0), 1.0)


def reasoning_part(completion: str, reasoning_stop: str | None) -> str:
    """The completion up to (not including) the first `reasoning_stop`, or all of it."""
    return completion.split(reasoning_stop, 1)[0] if reasoning_stop else completion


def reference_likelihood_rewards(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    references: Sequence[str],
    *,
    mode: str = "logprob",
    answer_prefix: str = "",
    answer_suffix: str = "",
    reasoning_stop: str | None = None,
    micro_batch_tokens: int = 4096,
) -> list[float]:
    """Reward each completion by how much it raises the likelihood of its reference answer.

    r_i = f(log π(y*_i | x_i, z_i, prefix), log π(y*_i | x_i, prefix)) with f by `mode` (see the
    module docstring), where x_i is `prompts[i]` (the text the policy saw), z_i the completion
    (cut at `reasoning_stop` when given) and y*_i = ``references[i] + answer_suffix``. `model`
    is the policy or a frozen model sharing `tokenizer`.
    """
    n = len(completions)
    if not len(prompts) == n == len(references):
        raise ValueError(f"{len(prompts)} prompts, {n} completions, {len(references)} references")
    if mode not in LIKELIHOOD_MODES:
        raise ValueError(f"unknown likelihood mode {mode!r}; choose from {LIKELIHOOD_MODES}")
    for i, reference in enumerate(references):
        if not isinstance(reference, str) or not reference:
            raise ValueError(f"sample {i}: the reference must be a non-empty string")

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    targets = [encode(reference + answer_suffix) for reference in references]
    with_texts = [
        p + reasoning_part(c, reasoning_stop) + answer_prefix for p, c in zip(prompts, completions)
    ]
    # The no-reasoning pair is the same for every sample of a group: score each distinct one once.
    baseline_keys = [(p + answer_prefix, r) for p, r in zip(prompts, references)]
    distinct = list(dict.fromkeys(baseline_keys))
    contexts = [encode(t) for t in with_texts] + [encode(text) for text, _ in distinct]
    all_targets = targets + [encode(r + answer_suffix) for _, r in distinct]
    scored = target_logprobs(
        model, contexts, all_targets, tokenizer.pad_token_id, micro_batch_tokens
    )
    baseline = dict(zip(distinct, scored[n:]))
    return [likelihood_improvement(scored[i], baseline[baseline_keys[i]], mode) for i in range(n)]
