"""Fixtures shared by the test modules."""

import pytest
import torch

from rlvr.models import fused


@pytest.fixture
def recomputed_regions(monkeypatch):
    """Records each region the fused forward runs under activation checkpointing, as (region
    name, {input storage address: bytes}); the regions still run and recompute as usual."""
    calls = []
    recomputed = fused._recomputed

    def recording(function, *args):
        inputs = {
            a.untyped_storage().data_ptr(): a.untyped_storage().nbytes()
            for a in args
            if isinstance(a, torch.Tensor)
        }
        calls.append((function.__name__, inputs))
        return recomputed(function, *args)

    monkeypatch.setattr(fused, "_recomputed", recording)
    return calls
