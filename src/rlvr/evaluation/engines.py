"""The engine a command that samples once samples with: `rlvr eval --engine`, `rlvr curate`'s
`curate.engine` and `rlvr dpo`'s `dpo.engine` for the pairs it samples. `hf` is the in-process
engine `sample_and_verify` builds itself; `vllm` a vLLM engine on the model, whose context
holds the command's longest prompt and budget (`rlvr.rollout.vllm.context_length`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlvr.config import EngineSettings
from rlvr.data.problem import Problem
from rlvr.data.templates import longest_prompt
from rlvr.models.loading import eos_token_ids
from rlvr.rollout import vllm
from rlvr.rollout.tools import ToolUse


def sampling_engine(
    settings: EngineSettings,
    model: torch.nn.Module,
    tokenizer,
    problems: list[Problem],
    template: str,
    max_new_tokens: int,
    chat_kwargs: Mapping[str, Any] | None = None,
    tools: ToolUse = ToolUse(),
    *,
    engine_named: str,
) -> vllm.VLLMRolloutEngine | None:
    """None for `settings.engine` `hf`; for `vllm`, a vLLM engine on `model` for sampling
    `problems` (templated with `template`, `chat_kwargs` and the schemas of `tools`) up to
    `max_new_tokens` each.

    Raises:
        ConfigError: vLLM is not installed, naming the engine setting `engine_named`
            (`curate.engine=vllm`, `--engine vllm`)."""
    if settings.engine == "hf":
        return None
    vllm.require_vllm(engine_named)
    chat_kwargs = tools.chat_kwargs(chat_kwargs or {})
    longest = longest_prompt(template, problems, tokenizer, chat_kwargs) + max_new_tokens
    return vllm.VLLMRolloutEngine(
        model,
        eos_token_ids(model, tokenizer),
        torch.Generator(),
        settings.vllm_memory,
        settings.vllm_cpu_kv_cache_gib,
        settings.vllm_max_model_len or vllm.context_length(longest, model),
    )
