"""`build_optimizer`: which AdamW implementation runs where, which parameters it decays;
`reset_optimizer_state`; a one-group checkpoint loaded into the decay groups."""

import copy

import pytest
import torch

from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
    lr_multiplier,
    optimizer_steps,
    reset_optimizer_state,
)


def test_the_cpu_keeps_pytorchs_default_adamw():
    """On a CPU the fused kernel would round differently from the default loop, which the
    demo's cold-start SFT amplifies (docs/benchmarks.md, "Fused AdamW"): the default stays,
    and only the trainable parameters are optimised."""
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=1)
    model.lm_head.weight.requires_grad_(False)  # tied to the embedding: both frozen
    optimizer = build_optimizer(model, 1e-3)
    assert not optimizer.defaults["fused"]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimised = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(optimised) == sorted(map(id, trainable)) and len(optimised) == len(trainable)
    assert id(model.lm_head.weight) not in optimised


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_uses_the_fused_adamw_and_it_steps_like_the_default():
    """On a GPU one fused kernel steps every parameter; after 10 steps the parameters are the
    default implementation's to rounding."""
    tok = build_tiny_tokenizer()
    models = [build_tiny_model(tok, hidden_size=32, num_layers=1).cuda() for _ in range(2)]
    fused = build_optimizer(models[0], 1e-3)
    default = torch.optim.AdamW(models[1].parameters(), lr=1e-3, weight_decay=0.0)
    assert fused.defaults["fused"] is True
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
            p.grad = torch.randn(p.shape, generator=g).cuda()
            q.grad = p.grad.clone()
        fused.step()
        default.step()
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("epochs", "rows", "batch_size", "steps"),
    [(None, 10, 4, 300), (2, 10, 4, 5), (1, 10, 4, 3), (0.1, 10, 4, 1), (0.3, 100, 10, 3)],
)
def test_optimizer_steps_from_epochs(epochs, rows, batch_size, steps):
    """ceil(epochs × rows / batch_size), counted by hand; without epochs, the steps given."""
    assert optimizer_steps(300, epochs, rows, batch_size) == steps


def test_a_reset_optimizer_steps_as_a_fresh_one():
    """ProRL's hard reset: after three steps and a reset, the next step moves each weight as a
    fresh AdamW's first step does (by lr · g / (|g| + eps) ≈ lr · sign(g)), not by the moments
    of the three steps before."""
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(5))
    optimizer = build_optimizer(torch.nn.ParameterList([weights]), 0.1)
    for _ in range(3):
        weights.grad = torch.randn(5)
        optimizer.step()
    assert optimizer.state[weights]["step"] == 3
    reset_optimizer_state(optimizer)
    assert not optimizer.state
    fresh_weights = torch.nn.Parameter(weights.detach().clone())
    fresh = build_optimizer(torch.nn.ParameterList([fresh_weights]), 0.1)
    grad = torch.tensor([1.0, -2.0, 0.5, 3.0, -0.25])
    before = weights.detach().clone()
    weights.grad, fresh_weights.grad = grad.clone(), grad.clone()
    optimizer.step()
    fresh.step()
    assert torch.equal(weights, fresh_weights)
    assert torch.allclose(weights - before, -0.1 * torch.sign(grad), atol=1e-6)
    assert optimizer.param_groups[0]["lr"] == 0.1  # the schedule's rate is kept


def test_warmup_then_cosine_to_the_floor_by_hand():
    """warmup 2, 6 steps, floor 0.1: (s+1)/2 for s < 2, then 0.1 + 0.9·½(1 + cos(πp)) with
    p = (s-2)/4: s=3 → 0.1 + 0.45(1 + 0.7071068) = 0.8681981, s=4 → 0.55, s=5 → 0.2318019,
    s ≥ 6 → 0.1; the constant schedule only warms up."""
    weights = torch.nn.Parameter(torch.zeros(2))
    optimizer = build_optimizer(torch.nn.ParameterList([weights]), 2.0)
    scheduler = build_scheduler(optimizer, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    lrs = []
    for _ in range(8):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    want = [0.5, 1.0, 1.0, 0.8681981, 0.55, 0.2318019, 0.1, 0.1]
    assert lrs == pytest.approx([2.0 * m for m in want], rel=1e-6)
    optimizer = build_optimizer(torch.nn.ParameterList([weights]), 2.0)
    constant = build_scheduler(optimizer, warmup_steps=2, total_steps=6, schedule="constant")
    got = []
    for _ in range(4):
        got.append(constant.get_last_lr()[0])
        optimizer.step()
        constant.step()
    assert got == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_build_optimizer_applies_the_weight_decay_and_betas():
    """g = 0, lr 0.1, decay 0.5: w ← 1 − 0.1·0.5·1 = 0.95 (AdamW's decoupled decay)."""
    w = torch.nn.Parameter(torch.ones(1, 3))
    optimizer = build_optimizer(
        torch.nn.ParameterList([w]), 0.1, weight_decay=0.5, betas=(0.8, 0.95)
    )
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    assert len(optimizer.param_groups) == 1  # no vectors: their empty group is left out
    w.grad = torch.zeros(1, 3)
    optimizer.step()
    torch.testing.assert_close(w.detach(), torch.full((1, 3), 0.95))


def norm_and_bias_model() -> torch.nn.Module:
    """An embedding, a linear layer with a bias, a norm and a second linear layer: matrices
    and vectors in the model's order, interleaved, all ones (seeded gradients move them
    apart)."""
    model = torch.nn.Sequential(
        torch.nn.Embedding(4, 3),
        torch.nn.Linear(3, 3),
        torch.nn.LayerNorm(3),
        torch.nn.Linear(3, 2),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    return model


def test_weight_decay_shrinks_the_matrices_and_leaves_norms_and_biases():
    """lr 0.1, decay 0.5, g = 0: every matrix (the embedding, both linear weights) goes from
    1 to 1 − 0.1·0.5 = 0.95; the biases and the norm's gain and bias stay 1, as Hugging Face's
    Trainer leaves them; a frozen matrix is in no group."""
    model = norm_and_bias_model()
    model[3].weight.requires_grad_(False)
    optimizer = build_optimizer(model, 0.1, weight_decay=0.5)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.5, 0.0]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    after = {name: float(p.detach().unique()) for name, p in model.named_parameters()}
    assert after == pytest.approx(
        {
            "0.weight": 0.95,
            "1.weight": 0.95,
            "1.bias": 1.0,
            "2.weight": 1.0,
            "2.bias": 1.0,
            "3.weight": 1.0,
            "3.bias": 1.0,
        }
    )


def test_a_one_group_checkpoint_loads_into_the_decay_groups():
    """A state saved before 12-06 (every parameter in one AdamW group, the model's order)
    resumes with each moment on its own parameter, and each group with its own decay. The
    next step from equal gradients then moves each matrix as the old optimizer does, and
    leaves each vector lr · λ · w above the old optimizer's (which decayed it)."""
    g = torch.Generator().manual_seed(0)
    old_model, model = norm_and_bias_model(), norm_and_bias_model()
    old = torch.optim.AdamW(old_model.parameters(), lr=0.1, weight_decay=0.5)
    for _ in range(2):
        for p in old_model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        old.step()
    model.load_state_dict(old_model.state_dict())
    optimizer = build_optimizer(model, 0.1, weight_decay=0.5)
    load_optimizer_state(optimizer, copy.deepcopy(old.state_dict()), model)  # as if read back
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.5, 0.0]
    pairs = list(zip(old_model.parameters(), model.parameters(), strict=True))
    for p, q in pairs:
        assert optimizer.state[q]["step"] == 2
        assert torch.equal(optimizer.state[q]["exp_avg"], old.state[p]["exp_avg"])
        assert torch.equal(optimizer.state[q]["exp_avg_sq"], old.state[p]["exp_avg_sq"])
    before = [q.detach().clone() for _, q in pairs]
    for p, q in pairs:
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    old.step()
    optimizer.step()
    for (p, q), w in zip(pairs, before, strict=True):
        kept = 0.1 * 0.5 * w if q.dim() == 1 else torch.zeros_like(w)
        torch.testing.assert_close(q.detach() - p.detach(), kept, rtol=1e-5, atol=1e-7)


def small_qwen2() -> torch.nn.Module:
    """A two-layer Qwen2 (biases on q, k and v), random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("architecture", ["tiny_llama", "qwen2"])
def test_the_decayed_parameters_are_those_hugging_faces_trainer_decays(architecture):
    """On rlvr's tiny model (a Llama: RMSNorm gains, a tied head) and on a Qwen2 (q/k/v
    biases too), the decayed group is exactly the parameters
    `Trainer.get_decay_parameter_names` names (so TRL's optimizer decays them), and the
    undecayed group the rest."""
    from transformers import Trainer

    if architecture == "qwen2":
        model = small_qwen2()
    else:
        model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed, kept = (
        {names[id(p)] for p in group["params"]}
        for group in build_optimizer(model, 1e-3, weight_decay=0.1).param_groups
    )
    trainers = set(Trainer.get_decay_parameter_names(None, model)) & set(names.values())
    assert decayed == trainers
    assert kept == set(names.values()) - trainers
    assert any(name.endswith("norm.weight") for name in kept)
    assert any(name.endswith("q_proj.bias") for name in kept) == (architecture == "qwen2")


def test_defaults_no_weight_decay_and_a_cosine_down_to_zero():
    """`build_optimizer` decays nothing unless asked; `build_scheduler`'s cosine ends at 0:
    no warm-up, 2 steps: 1, ½(1 + cos(π/2)) = 0.5, then 0."""
    weights = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = build_optimizer(torch.nn.ParameterList([weights]), 1.0)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.0]
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=2)
    lrs = []
    for _ in range(3):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1.0, 0.5, 0.0], abs=1e-12)


def test_one_step_after_the_warmup_reaches_the_floor():
    """warmup 2 of 3 steps: the cosine spans the one step left, so step 2 is at the peak and
    step 3 at the floor 0.25; warm-up as long as the run leaves the peak (no division by 0)."""
    cosine = {"schedule": "cosine", "min_lr_ratio": 0.25}
    assert lr_multiplier(2, warmup_steps=2, total_steps=3, **cosine) == 1.0
    assert lr_multiplier(3, warmup_steps=2, total_steps=3, **cosine) == pytest.approx(0.25)
    assert lr_multiplier(2, warmup_steps=2, total_steps=2, **cosine) == 1.0
