"""The `RolloutBatch`: one RL step's samples; each stage of the step adds fields to it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from rlvr.data.problem import Problem


@dataclass
class RolloutBatch:
    """N samples (prompts_per_step x samples_per_prompt, minus what filters drop).

    Per-token tensors are completion-aligned, [N, T] with T the longest completion.
    """

    problems: list[Problem]
    """The problem of each sample."""
    prompt_ids: list[list[int]]
    """Prompt token ids of each sample."""
    completion_ids: list[list[int]]
    """Sampled completion token ids (EOS included when sampled)."""
    prompt_texts: list[str]
    """Templated prompt text of each sample."""
    completion_texts: list[str]
    """Decoded completion (special tags kept, the final EOS dropped)."""
    group_ids: torch.Tensor
    """[N] long: samples of the same prompt share an id."""
    truncated: torch.Tensor
    """[N] bool: the generation budget ran out before an EOS."""
    response_mask: torch.Tensor
    """[N, T] 1 on completion tokens that are trained on."""
    rollout_logprobs: torch.Tensor
    """[N, T] sampling log-probs reported by the rollout engine."""
    tool_calls: torch.Tensor | None = None
    """[N] long: tool calls in each completion (`rollout.tools`); None without tools."""
    failed_calls: torch.Tensor | None = None
    """[N] long: the failed ones among them (an output beginning `error:`)."""
    attempts: torch.Tensor | None = None
    """[N] long: attempts in each completion (`rollout.attempts`); None: one each."""
    greedy_rewards: torch.Tensor | None = None
    """[N] the reward of the greedy completion of each sample's prompt (ReMax's baseline,
    `algorithm.advantage: remax`); None otherwise."""
    rewards: torch.Tensor | None = None
    """[N] total reward."""
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)
    """Unweighted reward of each reward function, by name."""
    reward_applied: dict[str, torch.Tensor] = field(default_factory=dict)
    """[N] bool by reward function: False where it returned None ("does not apply")."""
    correct: torch.Tensor | None = None
    """[N] bool: the task verifier accepted the answer."""
    judged: torch.Tensor | None = None
    """[N] bool: the task verifier could judge the answer (False: the row has no gold answer,
    `data.answer_column=null`); `accuracy` is over these. None: every sample."""
    advantages: torch.Tensor | None = None
    """[N, T] per-token advantages."""
    old_logprobs: torch.Tensor | None = None
    """[N, T] log-probs of the policy before this step's updates (when several updates)."""
    ref_logprobs: torch.Tensor | None = None
    """[N, T] log-probs of the frozen reference model (when KL is on)."""
    teacher_logprobs: torch.Tensor | None = None
    """[N, T] log-probs of the distillation teacher (`algorithm.distill.teacher`)."""
    values: torch.Tensor | None = None
    """[N, T] critic values before this step's updates (GAE presets)."""
    returns: torch.Tensor | None = None
    """[N, T] the critic's regression targets (GAE presets)."""
    process_rewards: torch.Tensor | None = None
    """[N, T] the implicit PRM's reward of each token (`algorithm.advantage: prime`)."""

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def lengths(self) -> list[int]:
        """Completion length of each sample in tokens."""
        return [len(c) for c in self.completion_ids]

    def select(self, keep: torch.Tensor) -> RolloutBatch:
        """The samples at indices `keep` (a filter's tool), every field kept aligned."""
        idx = keep.tolist()
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                values[f.name] = value[keep]
            elif isinstance(value, dict):
                values[f.name] = {k: v[keep] for k, v in value.items()}
            elif isinstance(value, list):
                values[f.name] = [value[i] for i in idx]
            else:
                values[f.name] = value
        return RolloutBatch(**values)


def concat_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch holding the samples of `batches` in order (per-token tensors padded with 0)."""
    if len(batches) == 1:
        return batches[0]
    width = max(b.response_mask.shape[1] for b in batches)
    values = {}
    for f in fields(RolloutBatch):
        parts = [getattr(b, f.name) for b in batches]
        if all(p is None for p in parts):
            values[f.name] = None
        elif isinstance(parts[0], torch.Tensor):
            if parts[0].dim() == 2:
                parts = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
            values[f.name] = torch.cat(parts)
        elif isinstance(parts[0], dict):
            values[f.name] = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        else:
            values[f.name] = [item for p in parts for item in p]
    return RolloutBatch(**values)
