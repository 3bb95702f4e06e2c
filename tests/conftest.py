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


def stats_through_logits(model, sb, temperature, with_entropy=True):
    """The reference for `completion_token_stats`: the full logits, then autograd through
    log_softmax; zero at padding."""
    from rlvr.training.batching import forward_logits_shared_prefix

    logp = (forward_logits_shared_prefix(model, sb) / temperature).log_softmax(-1)
    lp = logp.gather(-1, sb.completion_ids[..., None]).squeeze(-1)
    return lp * sb.response_mask, -(logp.exp() * logp).sum(-1) * sb.response_mask


@pytest.fixture
def logits_reference():
    """`stats_through_logits`, for the tests that check the update's token scoring."""
    return stats_through_logits
