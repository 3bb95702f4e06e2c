"""The KV cache keyword across transformers versions (`rlvr.models.hf_cache`).

transformers 5.24 renamed `past_key_values` to `cache`; the old name warns there and is gone in
5.40. The `transformers` forward paths (training's shared prefix, the rollout's `HFDecoder`,
the critic's backbone) must pass the name the installed version takes, without its warning.
"""

import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from rlvr.models import fused
from rlvr.models.hf_cache import cache_kwarg, returned_cache
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.models.value import ValueModel
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFRolloutEngine
from rlvr.training.batching import collate_shared_prefix, forward_logits_shared_prefix


class NewStyle(nn.Module):
    def forward(self, input_ids, cache=None, use_cache=False):
        return input_ids


class OldStyle(nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return input_ids


@dataclass
class NewOutput:
    logits: torch.Tensor | None = None
    cache: object = None


@dataclass
class OldOutput:  # a plain dataclass: transformers >= 5.24 renames the field of a ModelOutput
    logits: torch.Tensor | None = None
    past_key_values: object = None


def test_the_keyword_is_the_one_the_forward_takes():
    marker = object()
    assert cache_kwarg(NewStyle(), marker) == {"cache": marker}
    assert cache_kwarg(OldStyle(), marker) == {"past_key_values": marker}


def test_the_returned_cache_is_read_from_either_field():
    marker = object()
    assert returned_cache(NewOutput(logits=torch.zeros(1), cache=marker)) is marker
    assert returned_cache(OldOutput(logits=torch.zeros(1), past_key_values=marker)) is marker


@pytest.fixture
def no_cache_deprecation():
    """Any FutureWarning about the cache's name is an error inside the test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        yield


def test_transformers_paths_pass_the_installed_keyword(no_cache_deprecation):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=0)
    setattr(model, fused.ENABLE_ATTR, False)  # model.fused_forward: false

    sb = collate_shared_prefix([[20, 21, 22]] * 2, [[30, 31], [32]], [0, 1], tok.pad_token_id)
    logits = forward_logits_shared_prefix(model, sb)
    assert logits.shape == (2, 2, len(tok))

    engine = HFRolloutEngine(
        model, [tok.eos_token_id], tok.pad_token_id, generator=torch.Generator().manual_seed(0)
    )
    out = engine.generate([[20, 21, 22]], SamplingParams(n=2, max_new_tokens=4))
    assert all(len(c) >= 1 for c in out.completion_ids)

    values, cache = ValueModel(model)(
        sb.prompt_ids, sb.prompt_mask, torch.arange(sb.prompt_ids.shape[1])[None]
    )
    assert values.shape == sb.prompt_ids.shape
    assert cache.get_seq_length() == sb.prompt_ids.shape[1]
