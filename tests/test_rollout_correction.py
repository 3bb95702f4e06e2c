"""Rollout importance sampling (DESIGN rule 8): the weights by hand, their effect on the
gradient, the mismatch metrics, and the config."""

import math

import pytest
import torch

from batches import token_batch, two_group_batch
from rlvr.algorithms.rollout_correction import (
    off_policy_sequence_mask,
    rollout_is_ratio,
    rollout_is_weights,
)
from rlvr.config import AlgorithmConfig, ConfigError, resolve_config
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.rl import train
from rlvr.training.update import LossSettings, batch_logprobs, minibatch_backward
from tiny_run import TINY_RUN

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -0.1]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.3, -0.1]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
E_HALF, E_MINUS_ONE = math.exp(0.5), math.exp(-1.0)  # row 0's token ratios: 1.649, 0.368


def weights(mode: str, low: float = 0.0, high: float = 2.0) -> torch.Tensor:
    ratio = rollout_is_ratio(OLD, ROLLOUT, MASK, sequence=mode.startswith("sequence"))
    return rollout_is_weights(ratio, MASK, mode=mode, min_ratio=low, max_ratio=high)


@pytest.mark.parametrize(
    ("mode", "low", "high", "row0"),
    [
        ("token_truncate", 0.0, 1.5, [1.5, E_MINUS_ONE, 0.0]),  # TIS: min(ratio, C)
        ("token_truncate", 0.5, 2.0, [E_HALF, 0.5, 0.0]),
        ("token_mask", 0.5, 1.5, [0.0, 0.0, 0.0]),  # both ratios outside [0.5, 1.5]
        ("token_mask", 0.0, 2.0, [E_HALF, E_MINUS_ONE, 0.0]),
        # one ratio per row: exp(0.5 - 1.0) = 0.607 on each of row 0's tokens
        ("sequence_truncate", 0.7, 2.0, [0.7, 0.7, 0.0]),
        ("sequence_mask", 0.0, 2.0, [math.exp(-0.5)] * 2 + [0.0]),
        ("sequence_mask", 0.7, 2.0, [0.0, 0.0, 0.0]),
    ],
)
def test_weights_by_hand(mode, low, high, row0):
    w = weights(mode, low, high)
    torch.testing.assert_close(w[0], torch.tensor(row0))
    torch.testing.assert_close(w[1], MASK[1])  # the engines agree on row 1: weight 1


def test_the_ratio_per_token_and_per_sequence():
    torch.testing.assert_close(
        rollout_is_ratio(OLD, ROLLOUT, MASK),
        torch.tensor([[E_HALF, E_MINUS_ONE, 1.0], [1.0, 1.0, 1.0]]),
    )
    sequence = rollout_is_ratio(OLD, ROLLOUT, MASK, sequence=True)
    torch.testing.assert_close(sequence, torch.tensor([[math.exp(-0.5)], [1.0]]))


def test_weights_carry_no_gradient_and_never_overflow():
    old = torch.tensor([[0.0, -1.0]], requires_grad=True)
    rollout = torch.tensor([[-100.0, -1.0]])  # the trainer finds token 0 e^100 times likelier
    mask = torch.ones(1, 2)
    ratio = rollout_is_ratio(old, rollout, mask)
    truncated = rollout_is_weights(ratio, mask, mode="token_truncate", max_ratio=3.0)
    assert not truncated.requires_grad
    torch.testing.assert_close(truncated, torch.tensor([[3.0, 1.0]]))
    masked = rollout_is_weights(ratio, mask, mode="token_mask", max_ratio=3.0)
    torch.testing.assert_close(masked, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="unknown rollout correction mode 'tis'"):
        rollout_is_weights(ratio, mask, mode="tis")


def test_truncated_weights_scale_each_tokens_policy_gradient():
    """On the first update (π_θ = π_old, ratio 1, no clipping) the PPO loss's token gradient is
    −A·∇log π, so TIS's weighted loss has the gradient of advantages multiplied by the weights."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (3, 5, 4, 6)]
    completions = [torch.randint(10, 90, (k,), generator=g).tolist() for k in (4, 2, 5, 3)]
    batch = token_batch(
        prompts, completions, torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, -1.0, 0.5, -0.5])
    )
    current = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id)
    shift = torch.rand(batch.response_mask.shape, generator=g) * 2 - 1  # log-ratios in [-1, 1]
    batch.rollout_logprobs = (current - shift) * batch.response_mask
    by_hand = torch.exp(shift).clamp(max=1.5) * batch.response_mask

    def gradient(mode: str, advantages: torch.Tensor) -> torch.Tensor:
        batch.advantages = advantages
        algo = AlgorithmConfig.model_validate({"rollout_is": {"mode": mode, "max_ratio": 1.5}})
        model.zero_grad()
        minibatch_backward(model, batch, [0, 1, 2, 3], LossSettings(algo, 1.0, 8, 64, 0))
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    advantages = batch.advantages.clone()
    corrected = gradient("token_truncate", advantages)
    reweighted = gradient("none", advantages * by_hand)
    torch.testing.assert_close(corrected, reweighted, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(corrected, gradient("none", advantages), atol=1e-4)


def shift_rollout_logprobs(batch):
    """A filter that makes the rollout engine three times less likely than the trainer to
    have drawn every token: log π_old − log π_rollout = log 3."""
    batch.rollout_logprobs = batch.rollout_logprobs - math.log(3.0) * batch.response_mask
    return batch


def run(tmp_path, *extra, filters=()):
    overrides = [
        *TINY_RUN,
        "train.steps=2",
        "rollout.temperature=0.7",
        f"train.output_dir={tmp_path}",
    ]
    cfg = resolve_config(preset="grpo", overrides=[*overrides, *extra])
    return read_jsonl(train(cfg, filters=filters, show_progress=False) / "metrics.jsonl")


def test_the_engine_and_the_trainer_agree_and_the_metrics_show_a_mismatch(tmp_path):
    # at T = 0.7 both sides divide the logits by the temperature (rule 1) and agree to fp32
    for record in run(tmp_path / "same"):
        assert record["rollout/logprob_diff"] < 1e-5 and abs(record["rollout/kl"]) < 1e-6
        assert "rollout/is_weight" not in record
    shifted = run(
        tmp_path / "shifted",
        "algorithm.rollout_is.mode=token_truncate",
        filters=(shift_rollout_logprobs,),
    )
    for record in shifted:
        assert record["rollout/logprob_diff"] == pytest.approx(math.log(3.0), abs=1e-4)
        assert record["rollout/kl"] == pytest.approx(3 - math.log(3.0) - 1, abs=1e-3)  # k3
        assert record["rollout/is_weight"] == pytest.approx(2.0, abs=1e-4)  # capped at 2
        assert record["rollout/is_capped_frac"] == pytest.approx(1.0)


def test_bad_settings_are_config_errors_naming_the_keys():
    with pytest.raises(ConfigError, match=r"rollout_is\.min_ratio.*rollout_is\.max_ratio"):
        resolve_config(preset="grpo", overrides=["algorithm.rollout_is.min_ratio=3"])
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_is\.mode"):
        resolve_config(preset="grpo", overrides=["algorithm.rollout_is.mode=tis"])


def test_off_policy_sequence_mask_drops_negative_samples_the_policy_left():
    """Mean log π_sampling − log π_θ over each sample's tokens: [0.3, 0.3, 0.05, 0.3]; with
    δ = 0.1, the samples above it with A < 0 are dropped, the positive one kept."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    logprobs = torch.full((4, 3), -1.0)
    sampling = logprobs + torch.tensor(
        [[0.2, 0.4, 9.0], [0.3, 0.3, 0.3], [0.1, 0.0, 0.05], [0.3, -9.0, -9.0]]
    )  # the masked positions carry garbage
    advantages = torch.tensor([[-1.0] * 3, [0.5] * 3, [-2.0] * 3, [-0.1] * 3]) * mask
    keep = off_policy_sequence_mask(advantages, logprobs, sampling, mask, 0.1)
    assert keep.tolist() == [[0.0], [1.0], [1.0], [0.0]]
    assert off_policy_sequence_mask(advantages, logprobs, sampling, mask, 0.5).all()


def test_off_policy_masking_in_the_update_is_zeroing_those_samples_advantages():
    """Through the real update: the gradient with rows 1 and 3 (A < 0) masked is the gradient
    with their advantages set to 0, and the masked tokens are counted."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    batch = two_group_batch()
    current = batch_logprobs(model, batch, 1.0, 10_000, tok.pad_token_id)
    gap = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.5, 0.0])[:, None]  # rows 1, 3 negative; 4 positive
    batch.rollout_logprobs = (current + gap) * batch.response_mask
    rows = list(range(len(batch)))

    def gradient(algo: dict, advantages: torch.Tensor) -> tuple[torch.Tensor, dict]:
        batch.advantages = advantages
        model.zero_grad()
        settings = LossSettings(AlgorithmConfig.model_validate(algo), 1.0, 12, 24, 0)
        stats = minibatch_backward(model, batch, rows, settings)
        return torch.cat([q.grad.flatten() for q in model.parameters()]), stats

    advantages = batch.advantages.clone()
    masked, stats = gradient({"off_policy_mask": 0.2}, advantages)
    zeroed = advantages.clone()
    zeroed[[1, 3]] = 0.0
    by_hand, plain_stats = gradient({}, zeroed)
    torch.testing.assert_close(masked, by_hand, atol=1e-6, rtol=1e-5)
    assert stats["off_policy_masked_tokens"] == 9 + 6  # rows 1 and 3's completion tokens
    assert plain_stats["off_policy_masked_tokens"] == 0
    unmasked, _ = gradient({}, advantages)
    assert not torch.allclose(masked, unmasked, atol=1e-6)


def raise_rollout_logprobs(batch):
    """log π_rollout − log π_trainer = log 3 on every token: every sample looks off-policy."""
    batch.rollout_logprobs = batch.rollout_logprobs + math.log(3.0) * batch.response_mask
    return batch


def test_off_policy_masking_in_a_run_drops_the_negative_samples_only(tmp_path):
    """Every sample's gap is log 3 > δ = 0.5: the negative ones are masked and only they, a
    share of the trained tokens below 1 (a step whose groups all scored alike has none; the
    update-level test above checks which samples)."""
    records = run(tmp_path, "algorithm.off_policy_mask=0.5", filters=(raise_rollout_logprobs,))
    shares = [record["rollout/off_policy_masked_frac"] for record in records]
    assert max(shares) > 0.0 and all(share < 1.0 for share in shares), shares
    assert "rollout/off_policy_masked_frac" not in run(tmp_path / "off")[0]


def test_mask_mode_keeps_ratios_on_the_bounds():
    # MIS keeps a ratio inside the closed interval [min_ratio, max_ratio]
    ratio = torch.tensor([[0.5, 1.0, 2.0]])
    w = rollout_is_weights(ratio, torch.ones(1, 3), mode="token_mask", min_ratio=0.5, max_ratio=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 2.0]]))


def test_ratio_ignores_values_outside_the_mask():
    old = torch.tensor([[-1.0, -2.0, 7.0]])
    rollout = torch.tensor([[-1.5, -1.0, -3.0]])  # the padded position carries garbage
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # token: e^0.5, e^-1, and 1 outside the mask (not e^10)
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0]])
    torch.testing.assert_close(rollout_is_ratio(old, rollout, mask), expected)
    # sequence: e^(0.5 − 1.0) = e^-0.5, not e^9.5
    sequence = rollout_is_ratio(old, rollout, mask, sequence=True)
    torch.testing.assert_close(sequence, torch.tensor([[math.exp(-0.5)]]))


def test_off_policy_mask_threshold_is_strict():
    # gap = −1.0 − (−1.5) = 0.5 on both tokens, mean 0.5 = δ: not "> δ", so kept
    logprobs, sampling = torch.full((1, 2), -1.5), torch.full((1, 2), -1.0)
    kept = off_policy_sequence_mask(
        torch.full((1, 2), -1.0), logprobs, sampling, torch.ones(1, 2), 0.5
    )
    assert kept.tolist() == [[1.0]]


def test_off_policy_mask_ignores_advantages_outside_the_mask():
    # mean gap (0.5 + 0.5) / 2 = 0.5 > δ = 0.1 (far), but the response's advantage is +0.5;
    # the −3.0 on the padding must not make the sample a negative one
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    logprobs, sampling = torch.full((1, 3), -1.0), torch.tensor([[-0.5, -0.5, -1.0]])
    adv = torch.tensor([[0.5, 0.5, -3.0]])
    assert off_policy_sequence_mask(adv, logprobs, sampling, mask, 0.1).tolist() == [[1.0]]


def test_the_log_ratio_is_clamped_at_exactly_20():
    # log-ratios of +30 and −30 become e^20 and e^−20 (LOG_RATIO_CLAMP), not e^±30
    old, rollout = torch.tensor([[0.0, -30.0]]), torch.tensor([[-30.0, 0.0]])
    ratio = rollout_is_ratio(old, rollout, torch.ones(1, 2))
    torch.testing.assert_close(ratio, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]))


def test_off_policy_mask_of_a_one_token_response_divides_by_one():
    # one token with gap 0.3 > δ = 0.2 and a negative advantage: dropped (its mean gap is 0.3)
    kept = off_policy_sequence_mask(
        torch.tensor([[-1.0, 0.0]]),
        torch.full((1, 2), -1.0),
        torch.tensor([[-0.7, -1.0]]),
        torch.tensor([[1.0, 0.0]]),
        0.2,
    )
    assert kept.tolist() == [[0.0]]
