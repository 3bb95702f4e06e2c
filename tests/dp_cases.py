"""The update's results on a fixed batch under any `Ranks`: tests/test_distributed.py computes
them in one process and under torchrun (tests/dp_rank.py), and compares."""

import torch
from torch.distributed.tensor import DTensor

from batches import token_batch
from rlvr.algorithms.controllers import ema_update_
from rlvr.config import AlgorithmConfig, CriticConfig, DataConfig, PrimeConfig, TrainConfig
from rlvr.config_offline import DPOConfig
from rlvr.data.tasks import load_task
from rlvr.evaluation.evaluate import evaluate
from rlvr.models import fused
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training import sharding
from rlvr.training.batching import collate_shared_prefix, completion_token_stats
from rlvr.training.critic import Critic
from rlvr.training.distributed import Ranks
from rlvr.training.implicit_prm import ImplicitPRM
from rlvr.training.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
    optimizer_state,
)
from rlvr.training.pairs import PairTokens, all_pair_logps
from rlvr.training.preference import PairScorer, _means, accumulate_gradients
from rlvr.training.sft import sft_backward
from rlvr.training.update import LossSettings, batch_token_stats, minibatch_backward

ROWS = [5, 0, 7, 3, 2, 6, 1]
"""The mini-batch: seven of the eight samples, shuffled (the loss is normalised over these).
Its four groups go whole to 3 ranks; the two left when groups 2 and 3 carry no advantage go
row by row."""


def small_model(tok):
    """The one-layer tiny model the rank-invariance cases train (seed it first)."""
    return build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def four_group_batch():
    """Eight samples of random token ids in four groups of two, lengths and advantages
    differing from row to row."""
    g = torch.Generator().manual_seed(0)
    lengths = [(3, 1), (5, 9), (4, 4), (7, 6), (2, 3), (6, 8), (3, 5), (5, 2)]
    prompts = [torch.randint(10, 90, (p,), generator=g).tolist() for p, _ in lengths]
    completions = [torch.randint(10, 90, (c,), generator=g).tolist() for _, c in lengths]
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.4, -0.7, 0.2])
    return token_batch(prompts, completions, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), advantages)


CASES = {
    "token_mean": ({"aggregation": "token_mean"}, {}),
    "seq_mean_token_sum_kl_entropy": (
        {"aggregation": "seq_mean_token_sum", "kl": {"estimator": "k2"}},
        {"kl_coef": 0.1, "entropy_coef": 0.01},
    ),
    "dual_clip_positive_lm": ({"clip": {"dual": 3.0}, "positive_lm_coef": 0.1}, {}),
    "skip_zero_advantage": ({"aggregation": "token_mean"}, {"skip_zero_advantage": True}),
}


def held_out_scores(model, tokenizer, ranks: Ranks, chunk: range = range(5), seed: int = 0):
    """`evaluate` on the held-out arithmetic problems `chunk` (k = 2, 8 new tokens, sc@2 too),
    without its wall-clock seconds."""
    task = load_task(DataConfig(max_digits=1, train_size=10, test_size=5))
    problems = task.test[chunk.start : chunk.stop]
    scores = evaluate(
        model,
        tokenizer,
        problems,
        reward=task.reward,
        k=2,
        max_new_tokens=8,
        seed=seed,
        ranks=ranks,
        self_certainty=True,
    )
    return {key: value for key, value in scores.items() if key != "seconds"}


def update_results(ranks: Ranks) -> dict[str, torch.Tensor]:
    """Scores, policy-update gradients and statistics of each case, a critic update's, an
    implicit PRM's (its gradient, statistics and process rewards), an SFT
    step's and a DPO step's (reference pass, gradient, pair statistics, held-out metrics), and
    the held-out evaluation's scores."""
    tok = build_tiny_tokenizer()
    pad = tok.pad_token_id
    torch.manual_seed(0)
    model = small_model(tok)
    out = {f"eval/{k}": torch.tensor(v) for k, v in held_out_scores(model, tok, ranks).items()}
    batch = four_group_batch()
    logprobs, entropy = batch_token_stats(model, batch, 0.7, 24, pad, True, ranks)
    out["logprobs"], out["entropy"] = logprobs, entropy
    for name, (algo, settings) in CASES.items():
        batch = four_group_batch()
        batch.correct = torch.tensor([True, False, True, True, False, False, True, False])
        if name == "skip_zero_advantage":
            batch.advantages[4:] = 0.0
        else:
            batch.ref_logprobs = logprobs - 0.05
        noise = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(2))
        batch.old_logprobs = logprobs + 0.3 * noise  # ratios far enough from 1 to clip
        config = AlgorithmConfig.model_validate(algo)
        model.zero_grad(set_to_none=True)
        stats = minibatch_backward(
            model, batch, ROWS, LossSettings(config, 0.7, 12, 24, pad, **settings), ranks
        )
        out[f"{name}/grad"] = torch.cat([p.grad.flatten() for p in model.parameters()])
        out.update({f"{name}/{key}": torch.tensor(value) for key, value in stats.items()})
    torch.manual_seed(1)
    critic = Critic(
        CriticConfig(value_clip=0.1), model, TrainConfig(micro_batch_tokens=24), 0, ranks
    )
    torch.nn.init.normal_(critic.model.head.weight, std=0.1)
    ranks.copy_from_main(critic.model)
    batch = four_group_batch()
    batch.values = critic.predict(batch)
    batch.returns = batch.advantages + 0.5 * batch.response_mask
    critic.optimizer.step = lambda: None  # keep the weights: compare the gradients
    out["critic/values"] = batch.values
    out["critic/value_loss"] = torch.tensor(critic.update(batch, ROWS)["value_loss"])
    out["critic/grad"] = torch.cat([p.grad.flatten() for p in critic.model.parameters()])
    prm = ImplicitPRM(PrimeConfig(beta=0.5), model, TrainConfig(micro_batch_tokens=24), 0, ranks)
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a PRM that differs from its reference
        for p in prm.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=noise))
    batch = four_group_batch()
    batch.correct = torch.tensor([True, False, True, True, False, False, True, False])
    prm.optimizer.step = lambda: None  # keep the weights: compare the gradients
    out["prm/rewards"], stats = prm.step(batch)
    out.update({k: torch.tensor(v) for k, v in stats.items()})
    out["prm/grad"] = torch.cat([p.grad.flatten() for p in prm.model.parameters()])
    model.zero_grad(set_to_none=True)
    prompts, targets = batch.prompt_ids, batch.completion_ids
    lengths = [len(p) + len(t) for p, t in zip(prompts, targets)]
    loss = sft_backward(model, prompts, targets, lengths, ROWS, 24, pad, ranks)
    out["sft/loss"] = torch.tensor(loss)
    out["sft/grad"] = torch.cat([p.grad.flatten() for p in model.parameters()])
    completions = batch.completion_ids
    pairs = PairTokens(batch.prompt_ids, completions, completions[1:] + completions[:1])
    reference = all_pair_logps(model, pairs, 24, pad, ranks)
    out["dpo/reference"] = torch.stack(reference)
    shift = torch.linspace(-0.5, 0.5, len(pairs))  # a reference the policy is not
    scorer = PairScorer(DPOConfig.model_validate({"dpo": {"micro_batch_tokens": 24}}), pairs, None)
    scorer.reference = (reference[0] + shift, reference[1] - shift)
    model.zero_grad(set_to_none=True)
    parts = accumulate_gradients(model, scorer, ROWS, 24, pad, ranks)
    out["dpo/grad"] = torch.cat([p.grad.flatten() for p in model.parameters()])
    out.update({f"dpo/{key}": torch.tensor(value) for key, value in _means(parts, ranks).items()})
    held_out = scorer.evaluate(model, pad, ranks)
    out.update({f"dpo/held_out/{key}": torch.tensor(value) for key, value in held_out.items()})
    return out


def sharded_adamw_steps(ranks: Ranks) -> tuple[dict[str, torch.Tensor], dict | None]:
    """Two steps of `build_optimizer(shard=True)` (weight decay, a scheduled learning rate)
    from the same fixed gradients on every rank: this rank's weights and the number of moment
    elements it keeps, and the checkpoint state `optimizer_state` gives it (None but on
    rank 0 when sharded)."""
    torch.manual_seed(0)
    model = small_model(build_tiny_tokenizer())
    optimizer = build_optimizer(model, 1e-2, weight_decay=0.1, shard=True)
    scheduler = build_scheduler(optimizer, warmup_steps=1, total_steps=3)
    for step in range(2):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
        optimizer.step()
        scheduler.step()
    kept = getattr(optimizer, "optim", optimizer)  # a ZeroRedundancyOptimizer's own part
    moments = sum(s[k].numel() for s in kept.state.values() for k in ("exp_avg", "exp_avg_sq"))
    results = {
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]),
        "kept_moments": torch.tensor(moments),
    }
    return results, optimizer_state(optimizer)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor whole: a sharded one (FSDP's DTensor) gathered on every rank."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (all of any other)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def two_layers(tok):
    """The two-layer tiny model of the FSDP case (seed it first)."""
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def checkpointed(model, optimizer) -> tuple[dict | None, dict | None]:
    """The weights and AdamW state a checkpoint holds (rank 0's; None on the others when
    sharded)."""
    weights = sharding.whole_state(model)
    if not sharding.is_sharded(model):
        weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    return weights, optimizer_state(optimizer, model)


def fsdp_sft_and_dpo(model, ranks: Ranks) -> dict[str, torch.Tensor]:
    """An SFT step's and a DPO step's loss and gradient on the FSDP-sharded `model`, and DPO's
    reference and held-out pass on the whole weights. On 3 ranks, SFT's shares make 1, 2 and 1
    micro-batches and DPO's two pairs 1, 1 and 0, so ranks run zero-weighted passes."""
    pad, batch, out = build_tiny_tokenizer().pad_token_id, four_group_batch(), {}
    prompts, targets = batch.prompt_ids, batch.completion_ids
    lengths = [len(p) + len(t) for p, t in zip(prompts, targets)]
    model.zero_grad(set_to_none=True)
    out["sft/loss"] = torch.tensor(
        sft_backward(model, prompts, targets, lengths, ROWS, 32, pad, ranks)
    )
    out["sft/grad"] = torch.cat([whole(p.grad).flatten() for p in model.parameters()])
    pairs = PairTokens(prompts, targets, targets[1:] + targets[:1])
    scorer = PairScorer(DPOConfig.model_validate({"dpo": {"micro_batch_tokens": 24}}), pairs, None)
    with sharding.full_weights(model):
        reference = all_pair_logps(model, pairs, 24, pad, ranks)
    shift = torch.linspace(-0.5, 0.5, len(pairs))  # a reference the policy is not
    scorer.reference = (reference[0] + shift, reference[1] - shift)
    model.zero_grad(set_to_none=True)
    parts = accumulate_gradients(model, scorer, ROWS[:2], 24, pad, ranks)
    out["dpo/grad"] = torch.cat([whole(p.grad).flatten() for p in model.parameters()])
    out.update({f"dpo/{key}": torch.tensor(value) for key, value in _means(parts, ranks).items()})
    with sharding.full_weights(model):
        held_out = scorer.evaluate(model, pad, ranks)
    out.update({f"dpo/held_out/{key}": torch.tensor(value) for key, value in held_out.items()})
    out["dpo/reference"] = torch.stack(reference)
    return out


def fsdp_results(ranks: Ranks) -> dict:
    """The two-layer tiny model sharded with FSDP2 (`sharding.shard`; whole in one process,
    which then runs the transformers forward the sharded update runs): held-out scores and
    token log-probs on the whole weights, each case's update gradient, then one AdamW step
    (weight decay), the checkpoint's weights and state, also after loading them into another
    model, and a replicated reference reset to the stepped weights."""
    tok = build_tiny_tokenizer()
    pad = tok.pad_token_id
    torch.manual_seed(0)
    model = two_layers(tok)
    sharding.shard(model, ranks)
    with sharding.full_weights(model):
        out = {f"eval/{k}": torch.tensor(v) for k, v in held_out_scores(model, tok, ranks).items()}
        logprobs, _ = batch_token_stats(model, four_group_batch(), 0.7, 24, pad, False, ranks)
    out["logprobs"] = logprobs
    out["kept"] = torch.tensor(sum(local(p).numel() for p in model.parameters()))
    out["sharded_after_forward"] = sharded_after_a_forward(model, ranks)
    out.update(fsdp_sft_and_dpo(model, ranks))
    fused.enable_activation_checkpointing(model)  # each layer recomputed in its backward
    batch = four_group_batch()
    batch.old_logprobs = logprobs + 0.1
    model.zero_grad(set_to_none=True)
    minibatch_backward(model, batch, ROWS, LossSettings(AlgorithmConfig(), 0.7, 12, 24, pad), ranks)
    out["checkpointed/grad"] = torch.cat([whole(p.grad).flatten() for p in model.parameters()])
    setattr(model, fused.CHECKPOINT_ATTR, False)
    for name, (algo, settings) in CASES.items():
        batch = four_group_batch()
        batch.correct = torch.tensor([True, False, True, True, False, False, True, False])
        if name == "skip_zero_advantage":
            batch.advantages[2:] = 0.0  # two rows to train: a rank without one runs a filler
        else:
            batch.ref_logprobs = logprobs - 0.05
        batch.old_logprobs = logprobs + 0.1
        config = AlgorithmConfig.model_validate(algo)
        model.zero_grad(set_to_none=True)
        stats = minibatch_backward(
            model, batch, ROWS, LossSettings(config, 0.7, 12, 24, pad, **settings), ranks
        )
        out[f"{name}/grad"] = torch.cat([whole(p.grad).flatten() for p in model.parameters()])
        out[f"{name}/loss"] = torch.tensor(stats["loss"])
    optimizer = build_optimizer(model, 1e-2, weight_decay=0.1)
    optimizer.step()
    out["saved"] = checkpointed(model, optimizer)
    torch.manual_seed(1)
    reference = two_layers(tok)
    with sharding.full_weights(model):
        ema_update_(reference, model, 0.0)  # a reference reset, reading the whole weights
    out["reference"] = {name: p.detach() for name, p in reference.named_parameters()}
    again = two_layers(tok)
    sharding.shard(again, ranks)
    reloaded = build_optimizer(again, 1e-2, weight_decay=0.1)
    weights, state = ranks.broadcast(out["saved"])
    tied = {"lm_head.weight": weights["model.embed_tokens.weight"]}  # as from_pretrained gives
    sharding.load_whole_state(again, {**weights, **tied})
    load_optimizer_state(reloaded, state, again)
    out["reloaded"] = checkpointed(again, reloaded)
    out["kept_whole"] = kept_whole_steps(ranks)
    return out


def sharded_after_a_forward(model, ranks: Ranks) -> torch.Tensor:
    """Whether a layer's weights are sharded again after a forward with gradients (never, in
    one process); then a zero-weighted backward and `sum_gradients`, as an update ends."""
    batch = four_group_batch()
    pad = build_tiny_tokenizer().pad_token_id
    mb = collate_shared_prefix(batch.prompt_ids, batch.completion_ids, [0, 1], pad, 2)
    sharding.sync_gradients(model, last=True)
    logprobs, _ = completion_token_stats(model, mb, 1.0, with_entropy=False)
    sharded = isinstance(model.model.layers[0].self_attn.q_proj.weight, DTensor)
    (logprobs.sum() * 0.0).backward()
    sharding.sum_gradients(model, ranks)
    model.zero_grad(set_to_none=True)
    return torch.tensor(sharded)


def kept_whole_steps(ranks: Ranks) -> dict[str, torch.Tensor]:
    """The two-layer model sharded with `reshard_after_forward=False` (its layers whole from
    the first forward of a step to its last backward): whether a forward leaves them sharded,
    then two AdamW steps (two micro-batches a rank on 3 ranks) and the token log-probs on the
    stepped weights."""
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = two_layers(tok)
    sharding.shard(model, ranks, reshard_after_forward=False)
    out = {"sharded_after_forward": sharded_after_a_forward(model, ranks)}
    optimizer = build_optimizer(model, 1e-2)
    settings = LossSettings(AlgorithmConfig(), 0.7, 12, 24, tok.pad_token_id)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        minibatch_backward(model, four_group_batch(), ROWS, settings, ranks)
        optimizer.step()
    with sharding.full_weights(model):
        batch = four_group_batch()
        out["logprobs"] = batch_token_stats(model, batch, 0.7, 24, tok.pad_token_id, False)[0]
    return out
