"""The real update path: any token-budget micro-batch split gives the same loss and gradient."""

import pytest
import torch

from batches import two_group_batch
from rlvr.config import AlgorithmConfig, CriticConfig, TrainConfig
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training import update
from rlvr.training.batching import completion_token_stats
from rlvr.training.critic import Critic
from rlvr.training.update import LossSettings, batch_logprobs, minibatch_backward

CASES = {
    "token_mean": {"aggregation": "token_mean"},
    "seq_mean_token_mean": {"aggregation": "seq_mean_token_mean"},
    "seq_mean_token_sum": {"aggregation": "seq_mean_token_sum"},
    "dual_clip_and_positive_lm": {
        "aggregation": "token_mean",
        "clip": {"dual": 3.0},
        "positive_lm_coef": 0.1,
    },
    "kimi_omd": {"aggregation": "seq_mean_token_sum", "loss": "kimi_omd", "omd_tau": 0.5},
    "sapo": {"aggregation": "seq_mean_token_mean", "loss": "sapo", "sapo_tau_neg": 2.0},
    "gmpo": {"aggregation": "seq_mean_token_mean", "loss": "gmpo", "clip": {"low": 0.05}},
    "clip_cov": {"loss": "clip_cov", "covariance": {"fraction": 0.3, "low": -9.0, "high": 9.0}},
    "kl_cov": {"loss": "kl_cov", "covariance": {"fraction": 0.3, "kl_coef": 0.5}},
    "entropy_advantage": {"entropy": {"advantage_alpha": 0.4}},
}


@pytest.mark.parametrize("case", CASES)
def test_micro_batch_split_does_not_change_loss_or_gradient(case):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.correct = torch.tensor([True, False, True, True, False, False])
    algo = AlgorithmConfig.model_validate(CASES[case])
    batch.ref_logprobs = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id) - 0.05
    batch.old_logprobs = batch.ref_logprobs + 0.1
    results = []
    for budget in (10_000, 24, 1):  # one micro-batch, a few, one sample each
        model.zero_grad()
        settings = LossSettings(
            algo, 1.0, 12, budget, tok.pad_token_id, kl_coef=0.1, entropy_coef=0.01
        )
        stats = minibatch_backward(model, batch, list(range(len(batch))), settings)
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((stats["loss"], grads))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        assert torch.allclose(grads, results[0][1], atol=1e-6)


def test_critic_update_does_not_depend_on_the_micro_batch_split():
    tok = build_tiny_tokenizer()
    policy = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    results = []
    for budget in (10_000, 24, 1):
        torch.manual_seed(0)
        critic = Critic(
            CriticConfig(value_clip=0.1), policy, TrainConfig(micro_batch_tokens=budget), 0
        )
        torch.nn.init.normal_(critic.model.head.weight, std=0.1)
        batch.values = critic.predict(batch)
        batch.returns = batch.advantages + 0.5 * batch.response_mask
        critic.optimizer.step = lambda: None  # keep the weights: compare the gradients
        stats = critic.update(batch, list(range(len(batch))))
        grads = torch.cat([p.grad.flatten() for p in critic.model.parameters()])
        results.append((stats["value_loss"], grads))
    assert results[0][0] > 0
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        assert torch.allclose(grads, results[0][1], atol=1e-6)


def _grads_and_stats(model, batch, algo, tok, **settings_kw):
    model.zero_grad(set_to_none=True)
    settings = LossSettings(algo, 1.0, 12, 10_000, tok.pad_token_id, **settings_kw)
    stats = minibatch_backward(model, batch, list(range(len(batch))), settings)
    return [p.grad for p in model.parameters()], stats


def test_skipping_zero_advantage_samples_keeps_the_gradient_exactly():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.advantages[3:] = 0.0  # the second group carries no signal
    batch.old_logprobs = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id) + 0.1
    algo = AlgorithmConfig.model_validate({"aggregation": "token_mean"})
    full, full_stats = _grads_and_stats(model, batch, algo, tok, skip_zero_advantage=False)
    skipped, stats = _grads_and_stats(model, batch, algo, tok, skip_zero_advantage=True)
    assert full_stats["skipped_samples"] == 0 and stats["skipped_samples"] == 3
    assert stats["tokens"] == float(batch.response_mask[:3].sum())
    assert stats["loss"] == pytest.approx(full_stats["loss"], abs=1e-7)
    for a, b in zip(full, skipped):
        assert torch.allclose(a, b, atol=1e-7)
    assert max(float(g.abs().max()) for g in full) > 0


def test_an_all_zero_advantage_batch_gives_zero_gradients_not_none():
    """The optimizer must still step (AdamW momentum), as it would on the computed zeros."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.advantages.zero_()
    algo = AlgorithmConfig()
    grads, stats = _grads_and_stats(model, batch, algo, tok, skip_zero_advantage=True)
    assert stats["skipped_samples"] == len(batch) and stats["tokens"] == 0
    assert all(g is not None and not g.any() for g in grads)


@pytest.mark.parametrize(
    "change",
    [
        {"algo": {"loss": "kimi_omd"}},
        {"algo": {"positive_lm_coef": 0.1}},
        {"settings": {"entropy_coef": 0.01}},
        {"ref": True},
    ],
    ids=["kimi_omd", "positive_lm", "entropy_bonus", "kl_in_loss"],
)
def test_no_sample_is_skipped_when_another_term_has_a_gradient(change):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.advantages[3:] = 0.0
    batch.correct = torch.ones(len(batch), dtype=torch.bool)
    if change.get("ref"):
        batch.ref_logprobs = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id) - 0.05
    algo = AlgorithmConfig.model_validate(change.get("algo", {}))
    kw = {"skip_zero_advantage": True, "kl_coef": 0.1, **change.get("settings", {})}
    _, stats = _grads_and_stats(model, batch, algo, tok, **kw)
    assert stats["skipped_samples"] == 0


def test_the_update_without_logits_gives_the_gradient_through_logits(monkeypatch, logits_reference):
    """On the fused forward the update scores tokens from the hidden states
    (`completion_token_stats`); with KL, an entropy bonus and a temperature it gives the loss and
    gradient of the full-logits formula."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    algo = AlgorithmConfig.model_validate({"aggregation": "token_mean"})
    batch.ref_logprobs = batch_logprobs(model, batch, 0.7, 10_000, tok.pad_token_id) - 0.05
    results = []
    for stats_fn in (completion_token_stats, logits_reference):
        monkeypatch.setattr(update, "completion_token_stats", stats_fn)
        model.zero_grad(set_to_none=True)
        settings = LossSettings(algo, 0.7, 12, 24, tok.pad_token_id, kl_coef=0.1, entropy_coef=0.05)
        stats = minibatch_backward(model, batch, list(range(len(batch))), settings)
        results.append((stats, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (stats, grads), (ref_stats, ref_grads) = results
    for key in ("loss", "entropy_sum", "kl_sum"):
        assert stats[key] == pytest.approx(ref_stats[key], abs=1e-5)
    assert torch.allclose(grads, ref_grads, atol=1e-6) and grads.abs().max() > 1e-3


def test_the_entropy_advantage_trains_on_the_advantages_it_shapes():
    """With `algorithm.entropy.advantage_alpha`, the update's loss and gradient are those of the
    plain update on A + min(α·H, |A|/κ), H the policy's entropy at each token (Cheng et al.
    2025); its statistics sum that term and |A| over the response tokens."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.advantages = batch.advantages * 0.2  # small enough that α·H is the min on some tokens
    _, entropy = update.batch_token_stats(model, batch, 1.0, 10_000, tok.pad_token_id, True)
    mask = batch.response_mask
    alpha, kappa = 0.01, 3.0  # α·H ≈ 0.047 at the random model's entropy (≈ 4.66)
    bonus = torch.minimum(alpha * entropy, batch.advantages.abs() / kappa) * mask
    assert (alpha * entropy * mask < batch.advantages.abs() / kappa).any()  # both sides bind
    assert (alpha * entropy * mask > batch.advantages.abs() / kappa).any()
    shaped_algo = AlgorithmConfig.model_validate(
        {"entropy": {"advantage_alpha": alpha, "advantage_kappa": kappa}}
    )
    grads, stats = _grads_and_stats(model, batch, shaped_algo, tok)
    plain = two_group_batch()
    plain.advantages = batch.advantages + bonus
    expected, expected_stats = _grads_and_stats(model, plain, AlgorithmConfig(), tok)
    assert stats["loss"] == pytest.approx(expected_stats["loss"], abs=1e-6)
    for a, b in zip(grads, expected):
        assert torch.allclose(a, b, atol=1e-6)
    assert stats["entropy_bonus_sum"] == pytest.approx(float(bonus.sum()), rel=1e-5)
    assert stats["abs_advantage_sum"] == pytest.approx(float(batch.advantages.abs().sum()))
    unshaped, _ = _grads_and_stats(model, batch, AlgorithmConfig(), tok)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, unshaped)) > 1e-4


def test_skipping_zero_advantage_samples_keeps_the_sequence_normaliser():
    """With a per-sequence aggregation the loss divides by the mini-batch's sequence count,
    skipped samples included: skipping gives the same loss and gradient."""
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    batch.advantages[3:] = 0.0
    batch.old_logprobs = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id) + 0.1
    for aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        algo = AlgorithmConfig.model_validate({"aggregation": aggregation})
        results = []
        for skip in (False, True):
            model.zero_grad(set_to_none=True)
            settings = LossSettings(
                algo, 1.0, 12, 10_000, tok.pad_token_id, skip_zero_advantage=skip
            )
            stats = minibatch_backward(model, batch, list(range(len(batch))), settings)
            assert stats["skipped_samples"] == (3 if skip else 0)
            results.append((stats["loss"], [p.grad.clone() for p in model.parameters()]))
        (full_loss, full), (skip_loss, skipped) = results
        assert skip_loss == pytest.approx(full_loss, abs=1e-7) and full_loss != 0
        for a, b in zip(full, skipped, strict=True):
            assert torch.allclose(a, b, atol=1e-7)


def test_critic_starts_at_zero_predicts_on_response_tokens_only_and_averages_over_its_rows():
    """Fresh values are 0; predict is 0 off the mask; an update on rows [1, 3, 5] is
    ½Σ(V − R)² over their 9 + 6 + 8 = 23 response tokens / 23 (not the batch's 31)."""
    tok = build_tiny_tokenizer()
    policy = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    torch.manual_seed(0)
    critic = Critic(CriticConfig(value_clip=0.1), policy, TrainConfig(), 0)
    assert torch.equal(critic.predict(batch), torch.zeros_like(batch.response_mask))
    torch.nn.init.normal_(critic.model.head.weight, std=0.1)
    torch.nn.init.constant_(critic.model.head.bias, 0.3)
    values = critic.predict(batch)
    mask = batch.response_mask
    off = values[mask == 0]
    assert off.numel() > 0 and torch.equal(off, torch.zeros_like(off))
    assert (values[mask != 0] != 0).all()
    batch.values = values
    batch.returns = batch.advantages + 0.5 * mask
    rows = [1, 3, 5]
    assert float(mask[rows].sum()) == 23
    by_hand = float((0.5 * (values - batch.returns).square() * mask)[rows].sum() / 23)
    critic.optimizer.step = lambda: None
    stats = critic.update(batch, rows)
    assert stats["value_loss"] == pytest.approx(by_hand, rel=1e-4)


def test_critic_update_clips_the_gradient_norm():
    tok = build_tiny_tokenizer()
    policy = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    torch.manual_seed(0)
    critic = Critic(CriticConfig(), policy, TrainConfig(max_grad_norm=1e-3), 0)
    batch.values = critic.predict(batch)
    batch.returns = 5.0 * batch.response_mask
    critic.optimizer.step = lambda: None
    critic.update(batch, list(range(len(batch))))
    grads = [p.grad.flatten() for p in critic.model.parameters() if p.grad is not None]
    assert torch.cat(grads).norm() <= 1e-3 * (1 + 1e-4)
