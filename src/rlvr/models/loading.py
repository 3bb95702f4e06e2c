"""Loading and saving policies: the built-in tiny model or any Hugging Face causal LM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase as Tokenizer,
)
from transformers.utils import logging as transformers_logging

from rlvr.config import ModelConfig
from rlvr.models import fused, lora
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.run_layout import latest_checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ADAPTER_CONFIG = "adapter_config.json"
QUIET_LOAD_BYTES = 256 * 2**20  # local weights this small load in well under a second


class ModelLoadError(ValueError):
    """A model path or name that cannot be loaded."""


def resolve_device(name: str) -> torch.device:
    """The torch device of `model.device` (`auto`: CUDA when available, else the CPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"model.device {name!r} is not a device (use auto, cpu, cuda or cuda:N)"
        ) from exc
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"model.device {name!r}: only cpu and cuda devices are supported")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"model.device {name!r}: no CUDA GPU is available here")
        if device.index is not None and device.index >= count:
            raise ModelLoadError(f"model.device {name!r}: this machine has {count} CUDA GPU(s)")
    return device


def load_model_and_tokenizer(cfg: ModelConfig, seed: int = 0) -> tuple[PreTrainedModel, Tokenizer]:
    """Build the tiny model (`name_or_path: tiny`) or load a local directory / hub name, in
    `cfg.dtype` on `cfg.device`, with LoRA adapters when `cfg.lora.rank` > 0."""
    device = resolve_device(cfg.device)
    if cfg.name_or_path == "tiny":
        tokenizer = build_tiny_tokenizer()
        t = cfg.tiny
        model = build_tiny_model(
            tokenizer,
            hidden_size=t.hidden_size,
            num_layers=t.num_layers,
            num_heads=t.num_heads,
            intermediate_size=t.intermediate_size,
            seed=seed,
        )
    else:
        model, tokenizer = load_pretrained(cfg.name_or_path, cfg.dtype)
    if cfg.disable_dropout:
        disable_dropout_(model)
    setattr(model, fused.ENABLE_ATTR, cfg.fused_forward)
    model = model.to(device=device, dtype=DTYPES[cfg.dtype])
    if cfg.lora.rank:
        base_name = None if cfg.name_or_path == "tiny" else cfg.name_or_path
        model = lora.add_lora(model, cfg.lora, base_name)
    return model, tokenizer


def disable_dropout_(model: torch.nn.Module) -> None:
    """Set every dropout probability of `model` to 0, in place: its `nn.Dropout` modules (as
    TRL's `disable_dropout_in_model` does) and the `attention_dropout` that transformers'
    attention layers pass to the attention function in training mode. The config keeps its
    values, so a saved model is the model as it was given."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def load_pretrained(
    name_or_path: str,
    dtype: str = "float32",
    auto_class: type = AutoModelForCausalLM,
    key: str = "model.name_or_path",
) -> tuple[PreTrainedModel, Tokenizer]:
    """Load a causal LM (or another `auto_class` of transformers) and its tokenizer from a
    local HF directory, a PEFT adapter folder (merged into its base model) or a hub name; a
    `ModelLoadError` names the setting `key`."""
    path = Path(name_or_path)
    looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or path.exists()
    if looks_local and (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file():
        return _load_adapter(path, dtype, auto_class, key)
    if looks_local and not (path / "config.json").is_file():
        latest = latest_checkpoint(path)
        hint = f"; a run directory: give one of its checkpoints, e.g. {latest}" if latest else ""
        if path.is_dir():
            why = "missing config.json"
        elif path.exists():
            why = "a file, not a model folder"
        else:
            why = "path does not exist"
        raise ModelLoadError(f"{key} {name_or_path!r}: no Hugging Face model there ({why}){hint}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        with loading_bar(path) if looks_local else nullcontext():
            model = auto_class.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    except OSError as exc:
        hub = "; give a local model directory, or `tiny` for the built-in model, when the hub "
        hub += "is unreachable"
        raise ModelLoadError(
            f"{key} {name_or_path!r} could not be loaded ({exc}){'' if looks_local else hub}"
        ) from exc
    except SafetensorError as exc:
        raise ModelLoadError(
            f"{key} {name_or_path!r}: a weights file cannot be read ({exc}); it "
            "is damaged or cut short"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _load_adapter(
    folder: Path, dtype: str, auto_class: type, key: str
) -> tuple[PreTrainedModel, Tokenizer]:
    """A PEFT LoRA adapter folder (what TRL's and peft's `save_pretrained` write for a LoRA
    run, and rlvr's `checkpoints/step-N/adapter`): the base model its adapter_config.json
    names, loaded as `load_pretrained` loads any model, with the adapter merged into its
    weights; the folder's tokenizer where it holds one, else the base model's."""
    from peft import PeftModel

    try:
        settings = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{key} {str(folder)!r}: cannot read {ADAPTER_CONFIG} ({exc})"
        ) from None
    base = settings.get("base_model_name_or_path") if isinstance(settings, dict) else None
    if not isinstance(base, str) or not base:
        raise ModelLoadError(
            f"{key} {str(folder)!r}: a PEFT adapter whose {ADAPTER_CONFIG} names no "
            "base_model_name_or_path; give the base model and the adapter merged into it"
        )
    where = f"{key} {str(folder)!r}: its base model ({ADAPTER_CONFIG}'s base_model_name_or_path)"
    model, tokenizer = load_pretrained(base, dtype, auto_class, key=where)
    try:
        model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise ModelLoadError(
            f"{key} {str(folder)!r}: the adapter does not load onto its base model {base!r} ({exc})"
        ) from None
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def loading_bar(folder: Path) -> AbstractContextManager[None]:
    """Around a `from_pretrained` of the local `folder`: transformers' per-tensor loading bar
    off where its weights are under `QUIET_LOAD_BYTES` (loaded in milliseconds, the bar is
    only noise), left as it is for a model large enough to take a while."""
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return _without_transformers_progress_bars() if weights < QUIET_LOAD_BYTES else nullcontext()


def eos_token_ids(model: PreTrainedModel, tokenizer: Tokenizer) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = model.generation_config.eos_token_id
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


def decode_completions(
    tokenizer: Tokenizer, completion_ids: list[list[int]], eos_ids: list[int]
) -> list[str]:
    """Completion texts for rewards: special tags kept (answer tags are special tokens in some
    tokenizers), the final EOS token dropped."""
    eos = set(eos_ids)
    return [
        tokenizer.decode(c[:-1] if c and c[-1] in eos else c, skip_special_tokens=False)
        for c in completion_ids
    ]


def save_pretrained(
    model: PreTrainedModel,
    tokenizer: Tokenizer,
    directory: Path,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """Save model (safetensors) and tokenizer in Hugging Face format; a LoRA model as its merged
    weights, plus the adapter alone in `directory/adapter` (`lora.save_adapter`).

    `weights`: the whole weights of a model sharded over several ranks
    (`training.sharding.whole_state`), saved under the class the model had before sharding.
    Quiet: transformers' "Writing model shards" bar would interleave with rlvr's progress on
    every checkpoint."""
    with _without_transformers_progress_bars():
        _save_model(model, directory, weights)
    tokenizer.save_pretrained(directory)


@contextmanager
def _without_transformers_progress_bars() -> Iterator[None]:
    """transformers' own tqdm bars off inside, as they were after."""
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def _save_model(
    model: PreTrainedModel, directory: Path, weights: dict[str, torch.Tensor] | None
) -> None:
    if lora.has_lora(model):
        model.save_pretrained(directory, state_dict=lora.merged_state_dict(model))
        lora.save_adapter(model, directory)
    elif weights is not None:
        model.save_pretrained(directory, state_dict=weights, safe_serialization=True)
        model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
        model.config.save_pretrained(directory)
    else:
        model.save_pretrained(directory, safe_serialization=True)
