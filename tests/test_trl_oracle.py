"""Independent oracle: rlvr's policy loss, aggregation and k3 KL equal TRL's ``GRPOTrainer`` loss.

For the loss types both libraries have, on identical random float64 tensors, the loss and its
gradient with respect to the per-token log-probs agree within 1e-6 (in practice to rounding):

=========  ===========================================================================
TRL        rlvr
=========  ===========================================================================
grpo       ``ppo_clip`` + ``seq_mean_token_mean`` (``num_seqs`` = sequences of the step)
dr_grpo    ``ppo_clip`` + ``seq_mean_token_sum`` (``max_len`` = ``max_completion_length``)
dapo       ``ppo_clip`` + ``token_mean`` over the tokens of the whole optimizer step
bnpo       ``ppo_clip`` + ``token_mean`` over each micro-batch's own tokens, averaged over
           the micro-batches (TRL's per-device normalisation; rlvr's loop never does this)
=========  ===========================================================================

plus β · the same aggregation of ``kl_k3(logprobs, ref_logprobs)``, with ε_low ≠ ε_high.

How TRL is called: the oracle is TRL's own code, not a re-typing of it. The loss is the method
``GRPOTrainer._compute_loss(self, model, inputs)``; building a whole ``GRPOTrainer`` would need
a dataset, reward functions and an accelerate state, none of which the loss reads. So the real,
unbound methods ``_compute_loss`` and ``_get_per_token_logps_and_entropies`` (which it calls)
run on :class:`TrlLossHarness`, an object with only the attributes they read, set from a real
``GRPOConfig`` as ``GRPOTrainer.__init__`` sets them, a single-process accelerator and a stub
model. TRL patches its policy with a fused LM head that returns per-token log-probs instead of
logits; the stub model is that forward: it returns fixed log-probs (the tensor the gradients are
taken with respect to), so TRL's slicing, ratio, clipping, KL and normalisation all run as in
training. Each micro-batch of a gradient-accumulation window is one ``_compute_loss`` call, as in
``Trainer.training_step``; their losses are summed, so the gradient is the accumulated one.

A second, end-to-end oracle builds a real ``GRPOTrainer`` around rlvr's tiny model and compares
its ``compute_loss`` (the transformers forward on TRL's padded layout) with rlvr's
``minibatch_backward`` (its own padding-free forward and token scoring) on one identical batch:
the same loss and the same gradient of every parameter, for the ``grpo``, ``dr_grpo`` and
``dapo`` presets.

TRL 1.16 defaults to ``use_bias_correction_kl=True`` (its KL term is k3 · ρ, with the ratio ρ
differentiable, which changes the KL gradient even on-policy); rlvr's k3 has no such factor, so
the oracle sets it to False.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from batches import token_batch
from rlvr.algorithms import KL_ESTIMATORS, POLICY_LOSSES, aggregate
from rlvr.config import resolve_config
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.update import LossSettings, minibatch_backward

GRPOConfig = pytest.importorskip("trl").GRPOConfig
GRPOTrainer = pytest.importorskip("trl.trainer.grpo_trainer").GRPOTrainer
# GRPOConfig passes a TrainingArguments field that transformers 5 has renamed
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated")

B, PROMPT_LEN, T = 8, 3, 6
"""Sequences in the optimizer step, prompt width, completion width."""
MAX_COMPLETION_LENGTH = T + 3
"""Generation budget (Dr. GRPO's constant normaliser), deliberately wider than the batch."""
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
AGGREGATION = {
    "grpo": "seq_mean_token_mean",
    "dr_grpo": "seq_mean_token_sum",
    "dapo": "token_mean",
    "bnpo": "token_mean",
}


class SingleProcessAccelerator:
    """The accelerate calls ``_compute_loss`` makes, for one process with no autocast."""

    num_processes = 1
    is_main_process = True
    sync_gradients = True

    @staticmethod
    def autocast() -> nullcontext:
        return nullcontext()

    @staticmethod
    def gather(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def gather_for_metrics(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def reduce(tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


class FixedLogprobModel:
    """Stands in for TRL's fused-LM-head forward: per-token log-probs of the shifted labels."""

    def __init__(self, completion_logprobs: torch.Tensor) -> None:
        self.completion_logprobs = completion_logprobs

    def __call__(
        self, *, input_ids: torch.Tensor, labels: torch.Tensor, fused_lm_head: bool, **kwargs
    ) -> SimpleNamespace:
        assert fused_lm_head, "TRL is expected to ask for the fused LM head"
        rows, width = input_ids.shape
        assert labels.shape == input_ids.shape
        lp = self.completion_logprobs
        assert lp.shape[0] == rows
        # position t of the output scores label t + 1: [rows, width - 1]
        prompt_part = lp.new_zeros(rows, width - 1 - lp.shape[1])
        log_probs = torch.cat([prompt_part, lp], dim=1)
        return SimpleNamespace(log_probs=log_probs, entropy=torch.zeros_like(log_probs.detach()))


class TrlLossHarness:
    """Just enough of a ``GRPOTrainer`` for its own loss methods to run unchanged."""

    _compute_loss = GRPOTrainer._compute_loss
    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies

    def __init__(self, args: GRPOConfig) -> None:
        # the same assignments as GRPOTrainer.__init__
        self.args = args
        self.loss_type = args.loss_type
        self.beta = args.beta
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.max_completion_length = args.max_completion_length
        self.importance_sampling_level = args.importance_sampling_level
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.top_entropy_quantile = args.top_entropy_quantile
        self.entropy_coef = args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self.use_vllm = args.use_vllm
        self.aux_loss_enabled = False  # a dense model without router logits
        self.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        self.accelerator = SingleProcessAccelerator()
        self.model = torch.nn.Module()  # only `.training` (True) is read
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}


def grpo_config(out_dir: Path, **settings) -> GRPOConfig:
    """A CPU GRPOConfig writing nowhere but `out_dir`, with `settings`."""
    return GRPOConfig(output_dir=str(out_dir), report_to="none", use_cpu=True, **settings)


def random_step(seed: int) -> dict[str, torch.Tensor]:
    """One optimizer step's tensors: ratios spread across both clip edges, ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    logprobs = -3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logprobs + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logprobs + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    return {"mask": mask, "logprobs": logprobs, "old": old, "ref": ref, "advantages": advantages}


def trl_loss_and_grad(
    data: dict[str, torch.Tensor],
    loss_type: str,
    beta: float,
    accumulation: int,
    out_dir: Path,
    delta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's loss of the optimizer step (summed over its micro-batches) and d loss / d logprobs
    (`delta`: TRL's two-sided clipping)."""
    args = grpo_config(
        out_dir,
        loss_type=loss_type,
        beta=beta,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        max_completion_length=MAX_COMPLETION_LENGTH,
        per_device_train_batch_size=B // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=4,
        use_bias_correction_kl=False,
        delta=delta,
    )
    harness = TrlLossHarness(args)
    logprobs = data["logprobs"].clone().requires_grad_(True)
    mask = data["mask"]
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(B).chunk(accumulation):
        inputs = {
            "prompt_ids": torch.ones(len(rows), PROMPT_LEN, dtype=torch.long),
            "prompt_mask": torch.ones(len(rows), PROMPT_LEN, dtype=torch.long),
            "completion_ids": torch.ones(len(rows), T, dtype=torch.long),
            "completion_mask": mask[rows],
            "advantages": data["advantages"][rows],
            "old_per_token_logps": data["old"][rows],
            "ref_per_token_logps": data["ref"][rows],
            # TRL counts the completion tokens of the whole generation batch
            "num_items_in_batch": mask.sum(),
        }
        total = total + harness._compute_loss(FixedLogprobModel(logprobs[rows]), inputs)
    total.backward()
    return total.detach(), logprobs.grad


def rlvr_loss_and_grad(
    data: dict[str, torch.Tensor],
    loss_type: str,
    beta: float,
    accumulation: int,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rlvr's ppo_clip (with `dual_clip`) + aggregation (+ β k3) over the same micro-batches,
    and its gradient."""
    logprobs = data["logprobs"].clone().requires_grad_(True)
    mask = data["mask"].double()
    advantages = data["advantages"][:, None] * mask
    mode = AGGREGATION[loss_type]
    policy_loss, k3 = POLICY_LOSSES.get("ppo_clip"), KL_ESTIMATORS.get("k3")
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(B).chunk(accumulation):
        m = mask[rows]
        # bnpo: TRL normalises each micro-batch by its own tokens and averages the micro-batches;
        # the others count over the whole optimizer step (DESIGN rule 4)
        local = loss_type == "bnpo"
        num_tokens = float(m.sum() if local else mask.sum())
        norm = {"num_tokens": num_tokens, "num_seqs": float(B), "max_len": MAX_COMPLETION_LENGTH}
        scale = 1.0 / accumulation if local else 1.0
        out = policy_loss(
            logprobs[rows],
            data["old"][rows],
            advantages[rows],
            m,
            clip_low=CLIP_LOW,
            clip_high=CLIP_HIGH,
            dual_clip=dual_clip,
        )
        loss = aggregate(mode, out.token_loss, m, **norm)
        if beta:
            kl = k3(logprobs[rows], data["ref"][rows])
            loss = loss + beta * aggregate(mode, kl, m, **norm)
        total = total + scale * loss
    total.backward()
    return total.detach(), logprobs.grad


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rlvr_loss_and_gradient_equal_trl(seed, loss_type, beta, accumulation, tmp_path):
    data = random_step(seed)
    trl_loss, trl_grad = trl_loss_and_grad(data, loss_type, beta, accumulation, tmp_path)
    rlvr_loss, rlvr_grad = rlvr_loss_and_grad(data, loss_type, beta, accumulation)

    torch.testing.assert_close(rlvr_loss, trl_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(rlvr_grad, trl_grad, atol=1e-6, rtol=0)
    # the comparison is not vacuous: gradients reach the response tokens and only them
    assert trl_grad[data["mask"].bool()].abs().sum() > 0
    assert (trl_grad[~data["mask"].bool()] == 0).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_trl_delta_is_rlvr_dual_clip(seed, tmp_path):
    """TRL's `delta` (two-sided clipping) is `algorithm.clip.dual`: the same loss and gradient,
    on a step where negative-advantage tokens have ratios above delta (so the cap bites)."""
    data, delta = random_step(seed), 1.5
    trl_loss, trl_grad = trl_loss_and_grad(data, "dapo", 0.0, 1, tmp_path, delta=delta)
    rlvr_loss, rlvr_grad = rlvr_loss_and_grad(data, "dapo", 0.0, 1, dual_clip=delta)
    torch.testing.assert_close(rlvr_loss, trl_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(rlvr_grad, trl_grad, atol=1e-6, rtol=0)
    ratio = (data["logprobs"] - data["old"]).exp()
    capped = (ratio > delta) & (data["advantages"][:, None] < 0) & data["mask"].bool()
    assert capped.any()
    plain_loss, _ = rlvr_loss_and_grad(data, "dapo", 0.0, 1)
    assert (plain_loss - rlvr_loss).abs() > 1e-3


def test_random_step_exercises_both_clip_edges():
    data = random_step(0)
    ratio = (data["logprobs"] - data["old"]).exp()[data["mask"].bool()]
    assert (ratio < 1 - CLIP_LOW).any() and (ratio > 1 + CLIP_HIGH).any()


def _same_batch(group: int = 4, prompts: int = 4, seed: int = 1) -> dict:
    """Token ids of ragged prompts and completions (`group` samples per prompt) and one
    advantage per sample, as a generation step would leave them."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = [
        torch.randint(10, 100, (int(torch.randint(4, 8, (1,), generator=g)),), generator=g).tolist()
        for _ in range(prompts)
    ]
    rows = prompts * group
    lengths = torch.randint(2, MAX_COMPLETION_LENGTH + 1, (rows,), generator=g).tolist()
    return {
        "prompts": [prompt_ids[r // group] for r in range(rows)],
        "completions": [torch.randint(10, 100, (k,), generator=g).tolist() for k in lengths],
        "advantages": torch.randn(rows, generator=g),
        "group": group,
    }


def _trl_inputs(data: dict, pad_id: int) -> dict[str, torch.Tensor]:
    """The batch in GRPOTrainer's layout: prompts left-padded, completions right-padded."""
    prompts, completions = data["prompts"], data["completions"]
    rows, pw, cw = len(prompts), max(map(len, prompts)), max(map(len, completions))
    out = {
        "prompt_ids": torch.full((rows, pw), pad_id),
        "prompt_mask": torch.zeros(rows, pw, dtype=torch.long),
        "completion_ids": torch.full((rows, cw), pad_id),
        "completion_mask": torch.zeros(rows, cw, dtype=torch.long),
    }
    for r, (p, c) in enumerate(zip(prompts, completions)):
        out["prompt_ids"][r, pw - len(p) :] = torch.tensor(p)
        out["prompt_mask"][r, pw - len(p) :] = 1
        out["completion_ids"][r, : len(c)] = torch.tensor(c)
        out["completion_mask"][r, : len(c)] = 1
    return out


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo"])
def test_rlvr_update_gradient_equals_grpo_trainer_on_the_same_batch(preset, tmp_path):
    """End to end at the parameters: rlvr's `minibatch_backward` (its own padding-free forward,
    shared prompts, token scoring without logits, the preset's loss) and GRPOTrainer's
    `compute_loss` (the transformers forward on TRL's padded layout) give the same loss and
    the same gradient of every parameter of one model, on one batch and its advantages."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, intermediate_size=128, num_layers=2)
    data = _same_batch()
    rows = len(data["prompts"])
    group_ids = torch.arange(rows) // data["group"]
    batch = token_batch(data["prompts"], data["completions"], group_ids, data["advantages"])
    algo = resolve_config(preset=preset, overrides=["algorithm.kl.coef=0.0"]).algorithm
    settings = LossSettings(algo, 1.0, MAX_COMPLETION_LENGTH, 4096, tok.pad_token_id)
    model.zero_grad()
    rlvr_loss = minibatch_backward(model, batch, list(range(rows)), settings)["loss"]
    rlvr_grads = {name: p.grad.clone() for name, p in model.named_parameters()}

    args = grpo_config(
        tmp_path,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=rows,
        num_generations=data["group"],
        max_completion_length=MAX_COMPLETION_LENGTH,
        beta=0.0,
        loss_type=preset,
        epsilon=algo.clip.low,
        epsilon_high=algo.clip.high,
        temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["unused"] * rows}),
        processing_class=tok,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    inputs = {
        **_trl_inputs(data, tok.pad_token_id),
        "advantages": data["advantages"],
        "old_per_token_logps": None,  # one update per batch: the ratio is 1
        "ref_per_token_logps": None,
    }
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    model.zero_grad()
    model.train()
    trl_loss = trainer.compute_loss(model, inputs)
    trl_loss.backward()

    assert rlvr_loss == pytest.approx(trl_loss.item(), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(rlvr_grads[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert sum(float(g.abs().sum()) for g in rlvr_grads.values()) > 0  # not a vacuous check
