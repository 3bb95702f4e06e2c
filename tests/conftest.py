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


def padded_logits(model, prompts, completions, rows, pad_id):
    """The reference layout for the shared-prefix one: each row its own prompt, left-padded,
    then its completion, right-padded, through the model's own forward. Returns the logits
    [b, T, vocab] that score the completion tokens, the tokens [b, T] and the mask [b, T]."""
    p_width = max(len(prompts[r]) for r in rows)
    t_width = max(max(len(completions[r]) for r in rows), 1)
    input_ids = torch.full((len(rows), p_width + t_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(len(rows), t_width)
    for i, r in enumerate(rows):
        prompt, completion = prompts[r], completions[r]
        input_ids[i, p_width - len(prompt) : p_width] = torch.tensor(prompt)
        input_ids[i, p_width : p_width + len(completion)] = torch.tensor(completion).long()
        attention_mask[i, p_width - len(prompt) : p_width + len(completion)] = 1
        response_mask[i, : len(completion)] = 1
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=False,
    ).logits
    return logits[:, p_width - 1 : -1], input_ids[:, p_width:], response_mask


@pytest.fixture
def padded_reference():
    """`padded_logits`, for the tests that check the shared-prefix layout against it."""
    return padded_logits
