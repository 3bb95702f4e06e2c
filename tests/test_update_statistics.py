"""The policy update's loss, gradient and summed statistics against formulas written out here
(each row scored by the model's own forward), its rollout-mismatch statistics, its covariance
token picks, and the micro-batch and rank deals of its rows."""

import math

import pytest
import torch
from torch import nn

from batches import token_batch, two_group_batch
from rlvr.config import AlgorithmConfig
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.distributed import Ranks
from rlvr.training.update import (
    LossSettings,
    covariance_pick,
    micro_batches,
    minibatch_backward,
    rank_share,
    rollout_mismatch,
    zero_weighted_backward,
)

CORRECT = torch.tensor([True, False, True, True, False, False])


def tiny():
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return tok, model


def per_row_stats(model, batch, temperature):
    """[N, T] log-probs and entropies of the completion tokens, each row's prompt + completion
    through the model's own forward alone (no padding, no shared prefix), with gradient."""
    n, width = batch.response_mask.shape
    logprobs, entropy = torch.zeros(n, width), torch.zeros(n, width)
    for r, (prompt, completion) in enumerate(zip(batch.prompt_ids, batch.completion_ids)):
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        logp = torch.log_softmax(logits.float(), -1)
        logprobs[r, : len(completion)] = logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        entropy[r, : len(completion)] = -(logp.exp() * logp).sum(-1)
    return logprobs, entropy


def k3(logprobs, ref):
    y = ref - logprobs
    return y.exp() - y - 1


def skewed_batch(current):
    """`two_group_batch` with π_old, π_ref and π_rollout each off the current policy by its
    own noise (ratios beyond PPO's clip range on some tokens)."""
    batch = two_group_batch()
    batch.correct = CORRECT
    mask = batch.response_mask
    g = torch.Generator().manual_seed(3)
    noise = [torch.randn(mask.shape, generator=g) for _ in range(3)]
    batch.old_logprobs = (current + 0.3 * noise[0]) * mask
    batch.ref_logprobs = (current - 0.2 + 0.1 * noise[1]) * mask
    batch.rollout_logprobs = (batch.old_logprobs - 0.4 * noise[2]) * mask
    return batch


@pytest.mark.parametrize("mode", ["none", "token_truncate"])
def test_the_loss_gradient_and_statistics_are_the_full_batch_formula(mode):
    """PPO-clip over three micro-batches with the positive-example NLL, KL to the reference in
    the loss, an entropy bonus and (token_truncate) rollout IS weights capped at 1.2: the loss,
    its gradient and every summed statistic are those of the whole mini-batch written out."""
    tok, model = tiny()
    temperature, pos_coef, kl_coef, ent_coef = 0.7, 0.1, 0.1, 0.01
    with torch.no_grad():
        current, _ = per_row_stats(model, two_group_batch(), temperature)
    batch = skewed_batch(current)
    mask, adv = batch.response_mask, batch.advantages
    old, ref, rollout = batch.old_logprobs, batch.ref_logprobs, batch.rollout_logprobs
    algo = AlgorithmConfig.model_validate(
        {"positive_lm_coef": pos_coef, "rollout_is": {"mode": mode, "max_ratio": 1.2}}
    )
    settings = LossSettings(
        algo, temperature, 12, 20, tok.pad_token_id, kl_coef=kl_coef, entropy_coef=ent_coef
    )
    rows = list(range(len(batch)))
    assert micro_batches(batch, rows, 20, model) == [[0, 1, 2], [3, 4], [5]]
    model.zero_grad(set_to_none=True)
    stats = minibatch_backward(model, batch, rows, settings)
    grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad(set_to_none=True)
    logprobs, entropy = per_row_stats(model, batch, temperature)
    ratio = (logprobs - old).exp()
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(0.8, 1.2)
    rollout_ratio = (old - rollout).exp()
    weights = mask if mode == "none" else rollout_ratio.clamp(max=1.2) * mask
    tokens = mask.sum()
    correct = mask * CORRECT[:, None]
    loss = (
        (torch.maximum(unclipped, clipped) * weights * mask).sum() / tokens
        + pos_coef * (-logprobs * correct).sum() / correct.sum()
        + kl_coef * (k3(logprobs, ref) * mask).sum() / tokens
        - ent_coef * (entropy * mask).sum() / tokens
    )
    loss.backward()
    assert stats["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    detached = {
        "clip_tokens": ((clipped > unclipped) * mask).sum(),
        "entropy_sum": (entropy * mask).sum(),
        "kl_sum": (k3(logprobs, ref) * mask).sum(),
        "tokens": tokens,
        "rollout_diff_sum": ((old - rollout).abs() * mask).sum(),
        "rollout_kl_sum": (k3(rollout, old) * mask).sum(),
        "rollout_weight_sum": weights.sum(),
        "rollout_capped_tokens": ((rollout_ratio > 1.2) * mask).sum() * (mode != "none"),
    }
    for key, value in detached.items():
        assert stats[key] == pytest.approx(float(value.detach()), rel=1e-4, abs=1e-5), key
    assert 0 < stats["clip_tokens"] < stats["tokens"] == 31
    if mode == "none":
        assert stats["rollout_capped_tokens"] == 0 and stats["rollout_weight_sum"] == 31
    else:
        assert 0 < stats["rollout_capped_tokens"] < 31
    assert stats["off_policy_masked_tokens"] == stats["entropy_bonus_sum"] == 0
    assert stats["abs_advantage_sum"] == stats["skipped_samples"] == 0


def test_without_coefficients_the_reference_is_measured_but_not_trained():
    """LossSettings' kl_coef and entropy_coef default to 0: with a reference model the loss is
    the plain policy loss, and kl_sum still reports Σ k3."""
    tok, model = tiny()
    with torch.no_grad():
        current, _ = per_row_stats(model, two_group_batch(), 1.0)
    batch = skewed_batch(current)
    settings = LossSettings(AlgorithmConfig(), 1.0, 12, 24, tok.pad_token_id)
    with_ref = minibatch_backward(model, batch, list(range(6)), settings)
    batch.ref_logprobs = None
    without = minibatch_backward(model, batch, list(range(6)), settings)
    assert with_ref["loss"] == pytest.approx(without["loss"], abs=1e-7)
    assert with_ref["kl_sum"] > 0.1 and without["kl_sum"] == 0


def test_a_one_token_mini_batch_divides_by_one_token():
    """Row 0 has one completion token (A = 1); on the first update (π_θ = π_old) the
    token-mean PPO loss is −A / 1. Rows [0, 2] (A = 1 and 0.3 on 1 + 4 tokens): −2.2 / 5."""
    tok, model = tiny()
    batch = two_group_batch()
    settings = LossSettings(AlgorithmConfig(), 1.0, 12, 24, tok.pad_token_id)
    assert minibatch_backward(model, batch, [0], settings)["loss"] == pytest.approx(-1.0)
    assert minibatch_backward(model, batch, [0, 2], settings)["loss"] == pytest.approx(-0.44)


def test_rollout_mismatch_by_hand():
    """|log π_old − log π_rollout|, k3 of KL(π_rollout ‖ π_old), the weights and the tokens
    whose weight is not their ratio, on the mask only (its third column is padding)."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -0.1]])
    rollout = torch.tensor([[-1.5, -1.0, -7.0], [-0.2, -0.5, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    diff = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.2, 0.0]])
    kl = torch.tensor([[math.exp(0.5) - 1.5, math.exp(-1.0), 0.0], [0.0, math.exp(0.2) - 1.2, 0]])

    off = rollout_mismatch(old, rollout, mask, AlgorithmConfig())
    torch.testing.assert_close(off.weights, mask)
    for got, want in zip(off.sums, (diff, kl, mask, torch.zeros_like(mask)), strict=True):
        torch.testing.assert_close(got, want)

    algo = AlgorithmConfig.model_validate(
        {"rollout_is": {"mode": "token_truncate", "max_ratio": 1.2}}
    )
    truncated = rollout_mismatch(old, rollout, mask, algo)
    weights = torch.tensor([[1.2, math.exp(-1.0), 0.0], [1.0, 1.2, 1.0]])
    changed = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(truncated.weights, weights)
    for got, want in zip(truncated.sums, (diff, kl, weights, changed), strict=True):
        torch.testing.assert_close(got, want)

    algo = AlgorithmConfig.model_validate({"rollout_is": {"mode": "sequence_mask"}})
    masked = rollout_mismatch(old, rollout, mask, algo)
    row0 = math.exp(-0.5)  # row 1's ratio e^0.2 is kept too: both inside [0, 2]
    weights = torch.tensor([[row0, row0, 0.0], [math.exp(0.2)] * 3])
    torch.testing.assert_close(masked.weights, weights)
    torch.testing.assert_close(masked.sums[3], torch.zeros_like(mask))


def covariance_batch():
    batch = two_group_batch()
    g = torch.Generator().manual_seed(5)
    batch.old_logprobs = -torch.rand(batch.response_mask.shape, generator=g) * 3
    return batch


def covariances(batch, rows):
    """(A − Ā)(log π − mean log π) of the masked tokens of `rows`, the means over them."""
    mask = batch.response_mask[rows].bool()
    adv, logp = batch.advantages[rows].double(), batch.old_logprobs[rows].double()
    centred = (adv - adv[mask].mean()) * (logp - logp[mask].mean())
    return centred, mask


def test_kl_cov_penalises_the_largest_covariances_of_the_mini_batch():
    """A fraction 0.3 of rows [1, 2, 4, 5]'s 24 tokens: the 7 with the largest covariance, the
    means taken over those rows alone; nothing outside them."""
    batch = covariance_batch()
    rows = [1, 2, 4, 5]
    algo = AlgorithmConfig.model_validate({"loss": "kl_cov", "covariance": {"fraction": 0.3}})
    picked = covariance_pick(batch, rows, LossSettings(algo, 1.0, 12, 24, 0))
    centred, mask = covariances(batch, rows)
    assert not picked[[0, 3]].any()
    mine = picked[rows]
    assert int(mine.sum()) == 7 and not (mine & ~mask).any()
    assert centred[mine].min() > centred[mask & ~mine].max()


def test_clip_cov_draws_from_the_covariance_window_only():
    """Clip-Cov leaves out tokens whose covariance lies in (low, high), not the largest."""
    batch = covariance_batch()
    rows = list(range(6))
    centred, mask = covariances(batch, rows)
    low, high = (float(centred[mask].quantile(q)) for q in (0.1, 0.7))
    cov = {"fraction": 0.3, "low": low, "high": high}
    algo = AlgorithmConfig.model_validate({"loss": "clip_cov", "covariance": cov})
    window = (centred > low) & (centred < high) & mask
    assert int(window.sum()) > 9  # more candidates than the 9 (0.3 of 31) to draw
    assert int((centred >= high).sum()) >= 9  # and the 9 largest are none of them
    picked = covariance_pick(batch, rows, LossSettings(algo, 1.0, 12, 24, 0, step=1))
    assert int(picked.sum()) == 9 and not (picked & ~window).any()


def test_clip_cov_draws_anew_at_each_step_and_seed():
    """The draw is seeded by the run's seed, the step and the rows: 100 steps give 100
    different draws of 9 of the 31 tokens (a seed that kept few bits would repeat them)."""
    batch = covariance_batch()
    cov = {"fraction": 0.3, "low": -100.0, "high": 100.0}  # every token a candidate
    algo = AlgorithmConfig.model_validate({"loss": "clip_cov", "covariance": cov})
    rows = list(range(6))

    def draw(seed, step):
        picked = covariance_pick(
            batch, rows, LossSettings(algo, 1.0, 12, 24, 0, seed=seed, step=step)
        )
        assert int(picked.sum()) == 9
        return tuple(picked.flatten().tolist())

    draws = {draw(0, step) for step in range(1, 101)}
    assert len(draws) == 100
    assert draw(0, 7) == draw(0, 7) != draw(1, 7)
    assert sum(draw(1, step) in draws for step in range(1, 101)) < 5


def test_a_filler_pass_adds_no_gradient():
    """`zero_weighted_backward` (FSDP's filler pass) leaves every gradient at exactly 0."""
    tok, model = tiny()
    settings = LossSettings(AlgorithmConfig(), 1.0, 12, 24, tok.pad_token_id)
    zero_weighted_backward(model, two_group_batch(), [1, 3], settings, torch.device("cpu"))
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads) and not any(g.any() for g in grads)


def test_padded_micro_batches_count_prompt_and_completion_tokens():
    """Off the fused forward, rows sorted by prompt + completion length (4, 14, 8, 13, 5, 14)
    are grouped so that rows × the longest stays within the budget of 16."""
    batch = two_group_batch()
    parts = micro_batches(batch, list(range(6)), 16, nn.Linear(1, 1))
    assert parts == [[0, 4], [2], [3], [1], [5]]


def test_ranks_share_whole_groups_weighed_by_prompt_and_completion_tokens():
    """Group 2's rows cost (3 + 3) × 2 = 12 tokens, more than group 0's 10 + 1 (the longest
    prompt) or group 1's 1 + 8 (the longest completion): it alone goes to rank 0."""
    batch = token_batch(
        [[5] * 10, [6], [7] * 3, [7] * 3],
        [[8], [9] * 8, [4] * 3, [4] * 3],
        torch.tensor([0, 1, 2, 2]),
        torch.ones(4),
    )
    shares = [rank_share(batch, [0, 1, 2, 3], Ranks(r, 2)) for r in range(2)]
    assert shares == [[2, 3], [0, 1]]
