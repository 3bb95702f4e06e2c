"""PRIME's implicit PRM in the RL step: its update against a plain forward's gradient, its
rewards, that it learns the labels, the run's refusals, metrics and resume."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from batches import two_group_batch
from rlvr.config import ConfigError, PrimeConfig, TrainConfig, resolve_config
from rlvr.models.loading import load_model_and_tokenizer, save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.run_layout import latest_checkpoint
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training.implicit_prm import ImplicitPRM
from rlvr.training.rl import train
from tiny_run import TINY_RUN

LABELS = torch.tensor([True, False, False, True, False, True])


def tiny_policy():
    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def plain_logprobs(model, batch) -> list[torch.Tensor]:
    """log π(token) of each completion token, one padded-free forward per row."""
    out = []
    for prompt, completion in zip(batch.prompt_ids, batch.completion_ids):
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        out.append(F.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0])
    return out


def perturbed(prm: ImplicitPRM, seed: int = 1) -> ImplicitPRM:
    """`prm` with noise on its weights, so that it differs from its reference."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in prm.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return prm


def test_a_fresh_prm_scores_zero_and_its_loss_is_log_2():
    batch = two_group_batch()
    batch.correct = LABELS
    prm = ImplicitPRM(PrimeConfig(), tiny_policy(), TrainConfig(), 0)
    assert torch.equal(
        prm.process_rewards(batch, prm.reference_logprobs(batch)),
        torch.zeros_like(batch.response_mask),
    )
    prm.optimizer.step = lambda: None
    assert prm.update(batch, prm.reference_logprobs(batch))["prm/loss"] == pytest.approx(
        math.log(2), abs=1e-6
    )


def test_the_update_is_the_gradient_of_the_mean_cross_entropy():
    """Micro-batches of 16 tokens, against one plain forward per row of the whole loss:
    −mean[y log σ(β Σ log π_φ/π_ref) + (1 − y) log(1 − σ(…))]."""
    batch = two_group_batch()
    batch.correct = LABELS
    settings = PrimeConfig(beta=0.5, max_grad_norm=1e9)
    prm = perturbed(ImplicitPRM(settings, tiny_policy(), TrainConfig(micro_batch_tokens=16), 0))
    ref = plain_logprobs(prm.reference, batch)
    summed = torch.stack(
        [0.5 * (lp - r).sum() for lp, r in zip(plain_logprobs(prm.model, batch), ref)]
    )
    loss = F.binary_cross_entropy_with_logits(summed, LABELS.float())
    params = [p for p in prm.model.parameters() if p.requires_grad]
    expected = torch.autograd.grad(loss, params, allow_unused=True)
    prm.optimizer.step = lambda: None
    stats = prm.update(batch, prm.reference_logprobs(batch))
    assert stats["prm/loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for p, g in zip(params, expected, strict=True):
        if g is None:
            assert p.grad is None or not p.grad.any()
        else:
            assert torch.allclose(p.grad, g, atol=1e-6, rtol=1e-4)
    right = summed.detach().tolist()
    pairs = [(i, j) for i in range(6) for j in range(6) if i // 3 == j // 3]
    pairs = [(i, j) for i, j in pairs if LABELS[i] and not LABELS[j]]
    ranked = sum(right[i] > right[j] for i, j in pairs) / len(pairs)
    assert stats["prm/accuracy"] == pytest.approx(ranked)


def test_process_rewards_are_the_scaled_log_ratio_and_can_be_scaled_by_the_largest_return():
    batch = two_group_batch()
    raw = perturbed(
        ImplicitPRM(PrimeConfig(beta=0.2, scale_returns=False), tiny_policy(), TrainConfig(), 0)
    )
    rewards = raw.process_rewards(batch, raw.reference_logprobs(batch))
    ratios = zip(plain_logprobs(raw.model, batch), plain_logprobs(raw.reference, batch))
    for row, (lp, ref) in enumerate(ratios):
        n = len(lp)
        assert torch.allclose(rewards[row, :n], 0.2 * (lp - ref), atol=1e-6)
        assert not rewards[row, n:].any()
    raw.settings = PrimeConfig(beta=0.2, scale_returns=True)
    scaled = raw.process_rewards(batch, raw.reference_logprobs(batch))
    returns = scaled.flip(-1).cumsum(-1).flip(-1)
    assert float(returns.abs().max()) == pytest.approx(1.0, abs=1e-5)
    assert torch.allclose(scaled * rewards.flatten()[0] / scaled.flatten()[0], rewards, atol=1e-6)


def test_the_prm_learns_the_labels():
    """Twenty AdamW steps on one batch: the loss falls well below log 2 and the PRM ranks
    every right sample of a group above every wrong one."""
    batch = two_group_batch()
    batch.correct = LABELS
    prm = ImplicitPRM(PrimeConfig(beta=0.5, lr=1e-3), tiny_policy(), TrainConfig(), 0)
    ref = prm.reference_logprobs(batch)
    first = prm.update(batch, ref)
    for _ in range(19):
        last = prm.update(batch, ref)
    assert first["prm/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert last["prm/loss"] < 0.3 and last["prm/accuracy"] == 1.0


def prime_overrides(tmp_path, *more):
    return [*TINY_RUN, "train.steps=2", f"train.output_dir={tmp_path / 'run'}", *more]


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (
            ["algorithm.kl.coef=0.01", "algorithm.kl.in_reward=true"],
            "a KL penalty in the reward would be dropped",
        ),
        (["rollout.samples_per_prompt=1"], "algorithm.advantage='prime' compares each sample"),
    ],
)
def test_prime_refuses_what_it_cannot_use(tmp_path, more, message):
    with pytest.raises(ConfigError, match=message):
        train(resolve_config(preset="prime", overrides=prime_overrides(tmp_path, *more)))
    assert not (tmp_path / "run").exists()


def test_prime_refuses_rows_without_gold_answers(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(f'{{"prompt": "What is {a}+1?"}}\n' for a in range(8)))
    data = [f"data.path={path}", "data.task=file", "data.answer_column=null", "data.test_size=0"]
    data.append("reward.functions=[{name: format}]")  # else GRPO's refusal speaks first
    cfg = resolve_config(preset="prime", overrides=prime_overrides(tmp_path, *data))
    with pytest.raises(ConfigError, match="prime trains its implicit PRM on the verifier's"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_a_prime_run_logs_the_prm_and_resumes_with_it(tmp_path):
    """Three steps straight, and two then one resumed: the resumed third step's PRM loss is
    the straight run's, so the PRM's weights and optimizer came back from the checkpoint."""
    more = [
        "algorithm.dynamic_sampling=false",
        "algorithm.prime.lr=1e-3",
        "algorithm.prime.beta=0.5",
    ]
    straight = resolve_config(preset="prime", overrides=[*prime_overrides(tmp_path / "a", *more)])
    longer = straight.model_copy(update={"train": straight.train.model_copy(update={"steps": 3})})
    expected = read_jsonl(train(longer, show_progress=False) / "metrics.jsonl")
    assert expected[0]["prm/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert all(m["prm/loss"] > 0 and "prm/accuracy" in m for m in expected)
    cfg = resolve_config(preset="prime", overrides=prime_overrides(tmp_path / "b", *more))
    run_dir = train(cfg, show_progress=False)
    saved = torch.load(latest_checkpoint(run_dir) / "trainer_state.pt", weights_only=False)
    initial = load_model_and_tokenizer(cfg.model, seed=cfg.train.seed)[0].state_dict()
    assert any(not torch.equal(w, initial[k]) for k, w in saved["prm"]["model"].items())
    resumed_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 3})})
    train(resumed_cfg, resume=True, show_progress=False)
    resumed = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    assert resumed[2]["prm/loss"] == pytest.approx(expected[2]["prm/loss"], rel=1e-6)
    assert resumed[2]["prm/loss"] != pytest.approx(math.log(2), abs=1e-3)


def test_prime_copies_are_not_the_policy():
    policy = tiny_policy()
    prm = ImplicitPRM(PrimeConfig(), policy, TrainConfig(), 0)
    before = copy.deepcopy(policy.state_dict())
    batch = two_group_batch()
    batch.correct = LABELS
    prm.update(batch, prm.reference_logprobs(batch))
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert not any(p.requires_grad for p in prm.reference.parameters())


def test_the_prm_starts_from_prime_model_when_given(tmp_path):
    """`algorithm.prime.model`: the PRM and its reference are that model's weights, not the
    policy's."""
    tok = build_tiny_tokenizer()
    other = build_tiny_model(
        tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=7
    )
    save_pretrained(other, tok, tmp_path / "prm")
    policy = tiny_policy()
    prm = ImplicitPRM(PrimeConfig(model=str(tmp_path / "prm")), policy, TrainConfig(), 0)
    for module in (prm.model, prm.reference):
        weights = module.state_dict()
        assert all(torch.equal(weights[k], v) for k, v in other.state_dict().items())
        assert any(not torch.equal(weights[k], v) for k, v in policy.state_dict().items())
