"""The rollout contract: what every engine (in-process HF, vLLM) takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled."""

    n: int = 1
    """Completions per prompt (the group size)."""
    temperature: float = 1.0
    """Logits are divided by this; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus threshold (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    max_new_tokens: int = 64
    """Generation budget per completion."""
    min_new_tokens: int = 0
    """EOS cannot be sampled before this many tokens (benchmarks force equal lengths with it)."""
    min_p: float = 0.0
    """Keep the tokens at least this fraction as likely as the most likely one (0.0 = off)."""
    repetition_penalty: float = 1.0
    """Divide the positive logits of tokens already in the prompt or the completion by this,
    multiply the negative ones (CTRL's penalty; 1.0 = off)."""
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    """Token-id sequences that end a completion as EOS does, the sequence kept at its end
    (the end of a tool call: `rlvr.rollout.tools`); finish reason `stop`."""


@dataclass
class Rollout:
    """Completions for a list of prompts, `n` per prompt, in prompt-major order."""

    prompt_index: list[int]
    """For each completion, the index of its prompt in the input list (the group id)."""
    completion_ids: list[list[int]]
    """Sampled token ids, including the EOS token when one was sampled."""
    logprobs: list[list[float]]
    """Log-probability of each sampled token under the temperature-scaled policy."""
    finish_reason: list[str]
    """`stop` (an EOS or a stop sequence was sampled) or `length` (the budget ran out:
    truncated)."""
    tool_mask: list[list[bool]] | None = None
    """For each completion token, True where a tool wrote it rather than the policy (its
    result, not trained on: `rlvr.rollout.tools`); None: no tool ran."""
    tool_calls: list[int] | None = None
    """For each completion, how many tool calls it made; None: no tool ran."""
    failed_calls: list[int] | None = None
    """For each completion, how many of its tool calls failed (an output beginning `error:`:
    bad input, a timeout, a crash); None: no tool ran."""
    attempts: list[int] | None = None
    """For each completion, how many attempts it made (`rlvr.rollout.attempts`); None: one."""


class RolloutEngine(Protocol):
    """Anything that samples completions for token-id prompts."""

    model: nn.Module
    """The policy it samples from."""
    generator: torch.Generator
    """Where its random draws come from (an evaluation swaps in a seeded one)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions for each prompt."""
        ...

    def sync_weights(self, model: nn.Module) -> None:
        """Make the engine sample from the current weights of `model`."""
        ...
