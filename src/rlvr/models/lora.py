"""LoRA adapters on the policy (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models"), by `peft`.

Each target linear layer computes W x + (alpha / r) · B A x (eq. 3 of the paper), with W
frozen, A [r, in] random and B [out, r] zero at the start, so the adapted model starts as the
base model and only A and B train.

How rlvr uses them:
- the adapters are injected into the model itself (`peft.inject_adapter_in_model`), so it stays
  a `transformers` causal LM for the rollout engine, the losses and the evaluation; the fused
  forward runs each adapted projection by its own forward, and a CPU decode step by its base
  weight's panel product plus `update_term` (`rlvr.models.fused.supports`);
- a fixed KL reference is the policy with its adapters off (`adapters_disabled`), as TRL does,
  not a second copy of the model;
- `peft` (2 s to import) is imported by `add_lora` and the adapter files' readers and
  writers only; until it is, no model can hold a LoRA layer (`_lora_layer_type`);
- a saved model is the merged one (W + (alpha / r) · B A, loadable by `from_pretrained` and
  `rlvr eval`), with the adapter alone in its `adapter/` folder in peft's format (for
  `PeftModel.from_pretrained` and for resuming).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from rlvr.config import ConfigError, LoraConfig
from rlvr.run_layout import ADAPTER_DIR

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

"""Folder, inside a saved model, of the adapter alone."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""peft's file name for an adapter's weights."""
ADAPTER_NAME = "default"
"""peft's name of the one adapter rlvr trains."""
PEFT_PREFIX = "base_model.model."
"""Where a `PeftModel` keeps the model it wraps: the prefix of the keys in peft's files."""


def _lora_layer_type() -> type | None:
    """peft's `LoraLayer` class, or None while peft is not imported (so no LoRA layer exists)."""
    module = sys.modules.get("peft.tuners.lora")
    return None if module is None else module.LoraLayer


def _is_lora_layer(module: nn.Module) -> bool:
    layer_type = _lora_layer_type()
    return layer_type is not None and isinstance(module, layer_type)


def add_lora(model: nn.Module, cfg: LoraConfig, base_name: str | None = None) -> nn.Module:
    """Inject trainable rank-`cfg.rank` adapters into `model` (in place) and freeze the rest.

    `base_name` is recorded in the adapter's config as the model it adapts."""
    from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model

    config = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        base_model_name_or_path=base_name,
    )
    key = f"model.lora.target_modules={cfg.target_modules!r}"
    try:
        model = inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
    if isinstance(cfg.target_modules, list):  # peft refuses only a list that matches nothing
        adapted = lora_layers(model)
        missing = [
            t for t in cfg.target_modules if not any(n == t or n.endswith(f".{t}") for n in adapted)
        ]
        if missing:
            inside = tuple(f"{name}." for name in adapted)  # an adapter's own A, B and base
            linear = {
                n.split(".")[-1]
                for n, m in model.named_modules()
                if _is_linear(m) and not n.startswith(inside)
            }
            raise ConfigError(
                f"{key}: this model has no module named {', '.join(missing)} (its linear "
                f"layers: {', '.join(sorted(linear))})"
            )
    tied = getattr(model.config, "tie_word_embeddings", False)
    ends = (model.get_input_embeddings(), model.get_output_embeddings())
    if tied and any(_is_lora_layer(m) for m in ends):
        raise ConfigError(
            f"{key}: this model ties its LM head to its embeddings, so an adapter on either "
            "would change both or be lost when saved; adapt other modules"
        )
    return model


def _is_linear(module: nn.Module) -> bool:
    """A linear layer, or an adapted one (whose base layer is)."""
    return isinstance(base_layer(module), nn.Linear)


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """The model's LoRA-adapted modules by qualified name."""
    if _lora_layer_type() is None:
        return {}
    return {name: m for name, m in model.named_modules() if _is_lora_layer(m)}


def has_lora(model: nn.Module) -> bool:
    """Whether `model` carries LoRA adapters."""
    return bool(lora_layers(model))


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """`model` computing its base function (every adapter off) inside the block."""
    layers = lora_layers(model).values()
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def base_layer(module: nn.Module) -> nn.Module:
    """A LoRA layer's base layer; any other module itself."""
    return module.get_base_layer() if _is_lora_layer(module) else module


def update_term(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """What a LoRA layer adds to its base layer's output in eval mode, (alpha / r) · B A x
    summed over its active adapters (eq. 3 of the paper; dropout is off outside training);
    None when `module` is no LoRA layer or its adapters add nothing (disabled, or merged into
    the base weight). `module(x)` = base(x) + this term."""
    if not _is_lora_layer(module) or module.disable_adapters or module.merged:
        return None
    term = None
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        a, b = module.lora_A[name].weight, module.lora_B[name].weight
        part = F.linear(F.linear(x.to(a.dtype), a), b) * module.scaling[name]
        term = part if term is None else term + part
    return term


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with each adapted weight replaced by W + (alpha / r) · B A,
    on the CPU: the weights of the plain model that computes what `model` computes."""
    layers = lora_layers(model)
    adapter_parts = tuple(f".{part}." for part in _lora_layer_type().adapter_layer_names)
    merged = {}
    for key, tensor in model.state_dict().items():
        if any(part in key for part in adapter_parts):
            continue
        merged[key.replace(".base_layer.", ".")] = tensor.detach().cpu()
    with torch.no_grad():
        for name, layer in layers.items():
            weight = layer.get_base_layer().weight
            delta = layer.get_delta_weight(ADAPTER_NAME).to(weight.dtype)
            merged[f"{name}.weight"] = (weight + delta).cpu()
    return merged


def save_adapter(model: nn.Module, directory: Path) -> None:
    """Write the adapter alone (weights and config) to `directory/adapter`, in peft's format."""
    from peft import get_peft_model_state_dict

    folder = directory / ADAPTER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    weights = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)
    weights = {PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in weights.items()}
    save_file(weights, folder / ADAPTER_WEIGHTS)
    model.peft_config[ADAPTER_NAME].save_pretrained(folder)


def load_adapter(model: nn.Module, directory: Path) -> None:
    """Load the adapter weights saved by `save_adapter` under `directory` into `model`."""
    from peft import set_peft_model_state_dict

    path = directory / ADAPTER_DIR / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no LoRA adapter saved there (was model.lora.rank 0?)")
    weights = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(path).items()}
    misfit = f"{path}: the adapter does not fit this model's model.lora settings"
    try:
        result = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER_NAME)
    except RuntimeError as error:  # a shape mismatch: another rank
        raise ValueError(f"{misfit} ({str(error).splitlines()[1].strip()})") from None
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{misfit} (unexpected: {result.unexpected_keys[:2]}, missing: {missing[:2]})"
        )
