"""The KV cache's keyword in a `transformers` forward, across the versions rlvr supports.

transformers 5.24 renamed the forward argument `past_key_values` to `cache` (and the output
field likewise); the old name still works there with a FutureWarning and is removed in 5.40.
rlvr supports `transformers>=4.56`, which knows only the old name, so it asks each model which
name its forward takes instead of pinning either.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from torch import nn
from transformers.cache_utils import Cache
from transformers.utils import ModelOutput

NEW, OLD = "cache", "past_key_values"


@functools.cache
def _keyword(module_type: type) -> str:
    parameters = inspect.signature(module_type.forward).parameters
    return NEW if NEW in parameters else OLD


def cache_kwarg(module: nn.Module, cache: Cache | None) -> dict[str, Cache | None]:
    """`{name: cache}` for `module(...)`: `cache` where its forward takes it, else
    `past_key_values`."""
    return {_keyword(type(module)): cache}


def returned_cache(out: ModelOutput) -> Cache | None:
    """The KV cache a forward returned: `out.cache` (transformers >= 5.24) or
    `out.past_key_values` (earlier)."""
    names = {field.name for field in dataclasses.fields(out)}
    return getattr(out, NEW if NEW in names else OLD)
