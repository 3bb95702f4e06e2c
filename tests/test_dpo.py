"""`rlvr dpo`: pair scoring, micro-batch invariance, the run directory, learning, bad input."""

from __future__ import annotations

import json
import math
import shutil
import signal
import warnings

import pytest
import torch
import yaml
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import PREFERENCE_PRESETS, ConfigError, preset_names, resolve_config
from rlvr.config_offline import DPOConfig
from rlvr.data.preference import load_preference_file
from rlvr.data.synthetic import synthetic_splits
from rlvr.data.tasks import load_task
from rlvr.data.templates import encode_prompts
from rlvr.models import fused
from rlvr.models.loading import (
    decode_completions,
    eos_token_ids,
    load_model_and_tokenizer,
    load_pretrained,
)
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import preference
from rlvr.training.pairs import (
    PairTokens,
    all_pair_logps,
    desensitized_weights,
    encode_pairs,
    pair_logps,
    sample_pairs,
)
from rlvr.training.preference import PairScorer, accumulate_gradients, run_dpo
from rlvr.training.stopping import RunStopped
from rlvr.training.supervised import NonFiniteError

SMALL_MODEL = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=128",
]
PAIRS = PairTokens(
    prompts=[[20, 21, 22], [23, 24], [20, 21, 22]],
    chosen=[[30, 31, 32, 33], [34], [35, 36]],
    rejected=[[40, 41], [42, 43, 44, 45, 46], [47]],
)


def even_length_reward(prompts, completions, **columns):
    """A test reward that the untrained tiny model's samples split about evenly."""
    return [float(len(c) % 2 == 0) for c in completions]


def arithmetic_pairs(path, count, seed=0):
    """Pairs that prefer the worked solution in R1 format to a bare wrong answer."""
    problems, _ = synthetic_splits("arithmetic", train_size=count, test_size=1, seed=seed)
    rows = [
        {"prompt": p.question, "chosen": p.solution, "rejected": f"It is {int(p.answer) + 1}."}
        for p in problems
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def file_config(tmp_path, preset, *extra):
    data = arithmetic_pairs(tmp_path / "pairs.jsonl", 160)
    overrides = [
        *SMALL_MODEL,
        "data.task=file",
        f"data.path={data}",
        "dpo.eval_pairs=32",
        "dpo.batch_size=16",
        "dpo.steps=12",
        "dpo.eval_every_steps=5",
        "dpo.lr=1e-3",
        f"dpo.output_dir={tmp_path / 'run'}",
        *extra,
    ]
    return resolve_config(
        None, preset, overrides, model=DPOConfig, preset_package=PREFERENCE_PRESETS
    )


def token_logps_alone(model, prompt, response):
    ids = torch.tensor([prompt + response])
    logp = model(input_ids=ids).logits[0].log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def logp_alone(model, prompt, response):
    return token_logps_alone(model, prompt, response).sum()


@pytest.mark.parametrize("lean_forward", [True, False])
def test_pair_logps_equal_each_response_scored_alone(lean_forward):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    setattr(model, fused.ENABLE_ATTR, lean_forward)
    rows = [2, 0, 1]
    chosen, rejected = pair_logps(model, PAIRS, rows, tok.pad_token_id)
    for i, r in enumerate(rows):
        want_c = logp_alone(model, PAIRS.prompts[r], PAIRS.chosen[r])
        want_r = logp_alone(model, PAIRS.prompts[r], PAIRS.rejected[r])
        assert chosen[i].item() == pytest.approx(want_c.item(), rel=1e-5)
        assert rejected[i].item() == pytest.approx(want_r.item(), rel=1e-5)
    assert chosen.requires_grad and chosen.abs().min() > 3.0  # about log(vocab) per token


def test_ld_dpo_weighs_the_tokens_past_the_shared_length():
    """LD-DPO (TRL's ld_alpha): weights 1 on the first min(|y_w|, |y_l|) tokens of each
    response, α past them; pair_logps is the weighted sum of the tokens' log-probs scored
    alone, and α = 1 is plain DPO's sum."""
    weights = desensitized_weights([4, 1], [2, 3], 5, 0.5)
    assert weights.tolist() == [
        [1, 1, 0.5, 0.5, 0],  # chosen of pair 0: 4 tokens, 2 shared
        [1, 1, 0, 0, 0],  # its rejected: 2 tokens, all shared
        [1, 0, 0, 0, 0],  # chosen of pair 1: 1 token
        [1, 0.5, 0.5, 0, 0],  # its rejected: 3 tokens, 1 shared
    ]
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    rows = [0, 1, 2]
    chosen, rejected = pair_logps(model, PAIRS, rows, tok.pad_token_id, ld_alpha=0.25)
    for i, r in enumerate(rows):
        shared = min(len(PAIRS.chosen[r]), len(PAIRS.rejected[r]))
        for got, response in ((chosen[i], PAIRS.chosen[r]), (rejected[i], PAIRS.rejected[r])):
            each = token_logps_alone(model, PAIRS.prompts[r], response)
            want = each[:shared].sum() + 0.25 * each[shared:].sum()
            assert got.item() == pytest.approx(want.item(), rel=1e-5)
    plain = pair_logps(model, PAIRS, rows, tok.pad_token_id)
    whole = pair_logps(model, PAIRS, rows, tok.pad_token_id, ld_alpha=1.0)
    torch.testing.assert_close(plain, whole)


def test_wpo_weighs_each_pair_by_the_current_policy_and_learns(tmp_path):
    """dpo.weighting (TRL's use_weighting): at the start every pair's DPO loss is log 2, so
    the held-out loss is log 2 times the mean pair weight, logged as wpo_weight; it learns."""
    run_dir = run_dpo(file_config(tmp_path, "dpo", "dpo.weighting=true"), show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    first, last = evals[0], evals[-1]
    assert 0.0 < first["wpo_weight"] != pytest.approx(1.0, abs=1e-3)
    assert first["loss"] == pytest.approx(math.log(2) * first["wpo_weight"], rel=1e-5)
    assert last["rewards/accuracies"] >= 0.95 and last["rewards/margins"] > 0.1


def test_ld_dpo_starts_at_log_2_and_learns(tmp_path):
    """The reference log-probs are weighted as the policy's: the first held-out loss is log 2."""
    run_dir = run_dpo(file_config(tmp_path, "dpo", "dpo.ld_alpha=0.3"), show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert evals[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert evals[-1]["rewards/accuracies"] >= 0.95 and evals[-1]["rewards/margins"] > 0.1


@pytest.mark.parametrize(
    "preset, divergence",
    [
        ("dpo", "forward_kl"),
        ("dpo", "js_divergence"),
        ("dpo", "alpha_divergence"),
        ("ln_dpo", "forward_kl"),  # TRL's sigmoid_norm: the scores over the lengths
    ],
)
def test_f_dpo_starts_at_log_2_and_learns(tmp_path, preset, divergence):
    """f-DPO (TRL's f_divergence_type): every f'(π/π_ref) is 0 where the policy is its
    reference, so DPO's first held-out loss is log 2; each learns the held-out preference."""
    cfg = file_config(tmp_path, preset, f"dpo.f_divergence={divergence}")
    run_dir = run_dpo(cfg, show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert evals[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert evals[-1]["rewards/accuracies"] >= 0.95 and evals[-1]["loss"] < evals[0]["loss"] - 0.1


@pytest.mark.parametrize("loss", ["dpo", "simpo"])
def test_any_micro_batch_split_gives_the_same_gradient(loss):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    cfg = DPOConfig.model_validate({"dpo": {"loss": loss, "beta": 0.5}})
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    reference = (reference[0] + torch.tensor([1.0, -2.0, 0.5]), reference[1])  # nonzero ratios
    scorer = PairScorer(cfg, PAIRS, reference)
    grads, splits = [], []
    for budget in (4096, 8):
        model.zero_grad()
        parts = accumulate_gradients(model, scorer, [0, 1, 2], budget, tok.pad_token_id)
        splits.append(len(parts))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert splits == [1, 3]
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-6, rtol=1e-5)
    # and the whole-batch gradient is that of the mean pair loss, by the loss formula
    model.zero_grad()
    losses, _ = scorer.loss(model, [0, 1, 2], tok.pad_token_id)
    losses.mean().backward()
    for whole, direct in zip(grads[0], (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(whole, direct, atol=1e-6, rtol=1e-5)
    assert max(g.abs().max() for g in grads[0]) > 1e-4


def test_kto_reference_point_is_the_mismatched_pairs_clamped_mean_log_ratio():
    """z0 over rows [0, 2]: their prompts with the next pair's responses (pair 0 with pair 1's,
    pair 2 with pair 0's), the mean of those 4 log-ratios against a reference shifted by
    hand; clamped at 0 when negative. The loss's gradient does not depend on the micro-batch
    split, z0 being set once per step over all its pairs."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    cfg = DPOConfig.model_validate({"dpo": {"loss": "kto", "beta": 0.5}})
    mismatched = PAIRS.mismatched()
    assert mismatched.chosen == [PAIRS.chosen[1], PAIRS.chosen[2], PAIRS.chosen[0]]
    assert mismatched.rejected == [PAIRS.rejected[1], PAIRS.rejected[2], PAIRS.rejected[0]]
    exact = all_pair_logps(model, mismatched, 4096, tok.pad_token_id)
    shift = (torch.tensor([-0.4, 9.0, -0.2]), torch.tensor([0.1, 9.0, -0.3]))  # row 1 unused
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    scorer = PairScorer(cfg, PAIRS, reference, tuple(e + d for e, d in zip(exact, shift)))
    scorer.set_z0(model, [0, 2], tok.pad_token_id)
    assert scorer.z0 == pytest.approx((0.4 + 0.2 - 0.1 + 0.3) / 4, abs=1e-5)
    scorer.mismatched_reference = tuple(e + 1.0 for e in exact)
    scorer.set_z0(model, [0, 2], tok.pad_token_id)
    assert scorer.z0 == 0.0
    scorer = PairScorer(cfg, PAIRS, reference, tuple(e + d for e, d in zip(exact, shift)))
    grads = []
    for budget in (4096, 8):
        model.zero_grad()
        parts = accumulate_gradients(model, scorer, [0, 1, 2], budget, tok.pad_token_id)
        grads.append([q.grad.clone() for q in model.parameters()])
        assert parts[0]["kl"][0].item() == pytest.approx(scorer.z0)
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-6, rtol=1e-5)


ONE_SIDED = PairTokens(
    prompts=[[20, 21, 22], [23, 24], [25]],
    chosen=[[30, 31, 32, 33], [], [35, 36]],
    rejected=[[], [42, 43, 44, 45, 46], []],
)


def test_kto_on_one_sided_pairs_scores_the_present_side_alone():
    """Unpaired rows: pair_logps scores a present side as it scores it alone and a missing
    one 0; z0 over rows [0, 1] is the mean of their mismatched prompts' 2 responses (prompt 0
    with row 1's rejected, prompt 1 with row 2's chosen); the loss has no ½; WPO gives a
    missing side weight 1; any micro-batch split gives the same gradient."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    chosen, rejected = pair_logps(model, ONE_SIDED, [0, 1, 2], tok.pad_token_id)
    with torch.no_grad():
        alone = [logp_alone(model, ONE_SIDED.prompts[0], ONE_SIDED.chosen[0]),
                 logp_alone(model, ONE_SIDED.prompts[1], ONE_SIDED.rejected[1])]  # fmt: skip
    torch.testing.assert_close(chosen[0], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rejected[1], alone[1], atol=1e-5, rtol=1e-5)
    assert chosen[1] == 0 and rejected[0] == 0 and rejected[2] == 0
    cfg = DPOConfig.model_validate({"dpo": {"loss": "kto", "beta": 0.5, "weighting": True}})
    mismatched = ONE_SIDED.mismatched()
    exact = all_pair_logps(model, mismatched, 4096, tok.pad_token_id)
    shift = (torch.tensor([0.0, -0.6, 0.0]), torch.tensor([-0.2, 0.0, 0.0]))
    reference = all_pair_logps(model, ONE_SIDED, 4096, tok.pad_token_id)
    reference = (reference[0] - 0.3, reference[1] + 0.1)
    scorer = PairScorer(cfg, ONE_SIDED, reference, tuple(e + d for e, d in zip(exact, shift)))
    scorer.prepare(model, [0, 1], tok.pad_token_id)
    assert scorer.z0 == pytest.approx((0.2 + 0.6) / 2, abs=1e-5)
    assert scorer.weights[0] > 0 and scorer.weights[0] != 1.0  # w(y_w) · 1
    losses, stats = scorer.loss(model, [0, 1], tok.pad_token_id)
    s = torch.sigmoid(torch.tensor(0.5 * 0.3 - 0.5 * scorer.z0))
    torch.testing.assert_close(losses[0], scorer.weights[0] * (1 - s), atol=1e-5, rtol=1e-5)
    assert "rewards/margins" in stats and stats["rewards/margins"].numel() == 0
    assert stats["rewards/chosen"].tolist() == pytest.approx([0.15], abs=1e-5)
    scores = preference._means([stats])
    assert "rewards/accuracies" not in scores and scores["rewards/rejected"] == pytest.approx(
        -0.05, abs=1e-5
    )
    grads = []
    for budget in (4096, 6):
        model.zero_grad()
        accumulate_gradients(model, scorer, [0, 1, 2], budget, tok.pad_token_id)
        grads.append([q.grad.clone() for q in model.parameters()])
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-6, rtol=1e-5)
    assert max(g.abs().max() for g in grads[0]) > 1e-4


@pytest.mark.parametrize("loss", ["aot", "aot_unpaired"])
def test_aot_matches_over_the_whole_step_whatever_the_split(loss):
    """AOT's rank matching is made over all of a step's pairs before its micro-batches: one
    micro-batch or one pair each give the same gradient, and the mean loss is the sorted
    batch loss (`aot_matching` against the policy's log-probs scored alone)."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    cfg = DPOConfig.model_validate({"dpo": {"loss": loss, "beta": 0.5}})
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    reference = (reference[0] + torch.tensor([1.0, -2.0, 0.5]), reference[1] - 0.3)
    scorer = PairScorer(cfg, PAIRS, reference)
    grads, losses = [], []
    for budget in (4096, 8):
        model.zero_grad()
        parts = accumulate_gradients(model, scorer, [0, 1, 2], budget, tok.pad_token_id)
        grads.append([q.grad.clone() for q in model.parameters()])
        losses.append(torch.cat([part["loss"] for part in parts]).mean())
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-6, rtol=1e-5)
    chosen, rejected = pair_logps(model, PAIRS, [0, 1, 2], tok.pad_token_id)
    left, right = (chosen - rejected, reference[0] - reference[1])
    if loss == "aot_unpaired":
        left, right = chosen - reference[0], rejected - reference[1]
    z = 0.5 * (torch.sort(left.detach()).values - torch.sort(right).values)
    batch = -torch.nn.functional.logsigmoid(z).mean()
    assert losses[0].item() == pytest.approx(batch.item(), rel=1e-5)
    assert losses[1].item() == pytest.approx(batch.item(), rel=1e-5)


def test_the_nll_term_adds_the_chosen_per_token_nll():
    """dpo.nll_coef = α (IRPO, TRL's rpo_alpha): each pair's loss is DPO's plus α times the
    chosen response's summed log-prob over its length, negated; logged as nll_loss."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    plain, with_nll = (
        PairScorer(DPOConfig.model_validate({"dpo": {"nll_coef": a}}), PAIRS, reference)
        for a in (0.0, 0.5)
    )
    base, base_stats = plain.loss(model, [0, 1, 2], tok.pad_token_id)
    losses, stats = with_nll.loss(model, [0, 1, 2], tok.pad_token_id)
    lengths = torch.tensor([len(c) for c in PAIRS.chosen], dtype=torch.float32)
    nll = -base_stats["logps/chosen"] / lengths
    assert (nll > 0).all() and "nll_loss" not in base_stats
    torch.testing.assert_close(stats["nll_loss"], nll)
    torch.testing.assert_close(losses, base + 0.5 * nll)
    torch.testing.assert_close(stats["loss"], losses.detach())


def test_a_list_of_losses_sums_them_with_their_weights():
    """MPO (TRL's loss_type list with loss_weights): the pair loss is Σ w_k L_k of the losses
    each scored alone, the implicit rewards are the first loss's, and the NLL term adds on."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    reference = (reference[0] + torch.tensor([1.0, -2.0, 0.5]), reference[1])  # nonzero ratios

    def scored(**dpo):
        cfg = DPOConfig.model_validate({"dpo": dpo})
        return PairScorer(cfg, PAIRS, reference).loss(model, [0, 1, 2], tok.pad_token_id)

    dpo, dpo_stats = scored(loss="dpo", beta=0.5)
    bco, _ = scored(loss="bco_pair", beta=0.5)
    mixed, stats = scored(loss=["dpo", "bco_pair"], loss_weights=[0.8, 0.2], beta=0.5)
    torch.testing.assert_close(mixed, 0.8 * dpo + 0.2 * bco)
    assert not torch.allclose(dpo, bco)
    torch.testing.assert_close(stats["rewards/margins"], dpo_stats["rewards/margins"])
    mpo, mpo_stats = scored(
        loss=["dpo", "bco_pair"], loss_weights=[0.8, 0.2], beta=0.5, nll_coef=1.0
    )
    torch.testing.assert_close(mpo, mixed + mpo_stats["nll_loss"])
    unweighted, _ = scored(loss=["dpo", "bco_pair"], beta=0.5)
    torch.testing.assert_close(unweighted, dpo + bco)


@pytest.mark.parametrize(
    "preset", ["dpo", "ln_dpo", "ipo", "simpo", "hinge", "robust", "irpo", "exo", "mpo", "kto"]
)
def test_preset_learns_the_held_out_preference(tmp_path, preset):
    cfg = file_config(tmp_path, preset)
    run_dir = run_dpo(cfg, show_progress=False)
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "pairs.jsonl").exists()
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(1, 13))
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert [e["step"] for e in evals] == [0, 5, 10, 12] and evals[0]["pairs"] == 32
    first, last = evals[0], evals[-1]
    if preset in ("dpo", "ln_dpo", "robust"):  # the policy is its reference at step 0: z = 0
        assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
        assert first["rewards/margins"] == 0.0 and first["rewards/accuracies"] == 0.0
    if preset == "ipo":  # (0 - 1/(2·0.1))² = 25
        assert first["loss"] == pytest.approx(25.0, abs=1e-4)
    if preset == "hinge":  # max(0, 1 - 0)
        assert first["loss"] == pytest.approx(1.0, abs=1e-6)
    if preset == "exo":  # KL((½, ½) ‖ (1 - ε, ε)) = log ½ - ½ log(ε (1 - ε)), ε = 1e-3
        assert first["loss"] == pytest.approx(math.log(0.5) - 0.5 * math.log(1e-3 * 0.999))
    if preset == "kto":  # a = b = z0 = 0: ½ (1 - σ(0) + 1 - σ(0))
        assert first["loss"] == pytest.approx(0.5, abs=1e-6) and first["kl"] == 0.0
    if preset == "mpo":  # 0.8 log 2 + 0.2 · 2 log 2 + the chosen NLL
        assert first["loss"] == pytest.approx(1.2 * math.log(2) + first["nll_loss"], abs=1e-5)
    assert last["rewards/accuracies"] >= 0.95, (preset, first, last)
    assert last["rewards/margins"] > first["rewards/margins"] + 0.1
    assert last["loss"] < first["loss"] - 0.1


def unpaired_rows(count, seed=0):
    """TRL's unpaired format with no prompt on both sides: the first half of the problems
    with their worked solution (desirable), the second half with a bare wrong answer."""
    problems, _ = synthetic_splits("arithmetic", train_size=count, test_size=1, seed=seed)
    return [
        {"prompt": p.question, "completion": p.solution, "label": True}
        if i < count // 2
        else {"prompt": p.question, "completion": f"It is {int(p.answer) + 1}.", "label": False}
        for i, p in enumerate(problems)
    ]


def test_kto_learns_from_unpaired_rows_the_held_out_preference(tmp_path):
    """KTO on an unpaired file, no prompt labelled both ways, held out on pairs of other
    problems: it ranks their chosen response first. A step's metrics have no margins (no
    step has a pair); the held-out ones do."""
    train = tmp_path / "unpaired.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unpaired_rows(160)))
    held_out = arithmetic_pairs(tmp_path / "held_out.jsonl", 32, seed=7)
    cfg = file_config(tmp_path, "kto", f"data.path={train}", f"data.test_path={held_out}")
    run_dir = run_dpo(cfg, show_progress=False)
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    assert "rewards/margins" not in metrics[0] and "rewards/chosen" in metrics[0]
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    first, last = evals[0], evals[-1]
    assert first["loss"] == pytest.approx(0.5, abs=1e-6) and first["rewards/accuracies"] == 0.0
    assert last["rewards/accuracies"] >= 0.95, (first, last)
    assert last["rewards/margins"] > first["rewards/margins"] + 0.1


def test_unpaired_rows_train_kto_alone(tmp_path):
    """Unpaired rows for a pairwise loss, or with a setting that reads both responses of a
    pair, are refused before the model loads, naming the file; counts out of KTO's advised
    balance warn."""
    rows = unpaired_rows(40)
    data = tmp_path / "unpaired.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    where = f"{data}: unpaired rows (prompt, completion, label)"
    task = ["data.task=file", f"data.path={data}", "dpo.eval_pairs=4"]
    message = run_error(tmp_path, *task)
    assert f"{where} train dpo.loss=kto alone (the kto preset), which values each" in message
    assert "dpo.loss is dpo" in message
    for setting in ("nll_coef=1", "ld_alpha=0.5"):
        message = run_error(tmp_path, *task, "dpo.loss=kto", f"dpo.{setting}")
        key = setting.split("=")[0]
        assert f"{where}: dpo.{key} reads the two responses of a pair; unset it" in message
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:25]))  # 20 desirable, 5 not

    def source(*overrides):
        keys = ["dpo.loss=kto", "dpo.eval_pairs=4", "data.task=file", f"data.path={data}"]
        return preference._pair_source(resolve_config(None, None, [*keys, *overrides], DPOConfig))

    with pytest.warns(UserWarning, match="20 desirable and 5 undesirable; KTO's authors advise"):
        source()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        source("dpo.kto_undesirable_weight=3.5")  # 20 / (3.5 · 5) = 1.14


def test_cpo_and_orpo_presets_learn_the_held_out_preference(tmp_path):
    """CPO and ORPO score the policy alone, so their rewards do not start at 0. Here the chosen
    worked solution is about twice as long as the rejected answer: CPO's summed log-likelihood
    margin starts at -4.6 and must close by 2 within 12 steps (measured -1.7); ORPO's, per token,
    starts ranking 88 % right and must reach 95 % with a margin 5 × its start's (measured 15 ×).
    Both lower the chosen NLL that their presets add."""
    for preset in ("cpo", "orpo"):
        (tmp_path / preset).mkdir()
        run_dir = run_dpo(file_config(tmp_path / preset, preset), show_progress=False)
        evals = list(read_jsonl(run_dir / "eval.jsonl"))
        first, last = evals[0], evals[-1]
        assert last["nll_loss"] < first["nll_loss"] - 0.5, (preset, first, last)
        assert last["loss"] < first["loss"] - 0.5
        if preset == "cpo":
            assert first["rewards/margins"] < -4.0
            assert last["rewards/margins"] > first["rewards/margins"] + 2.0
        else:
            assert last["rewards/accuracies"] >= 0.95
            assert last["rewards/margins"] > 5 * first["rewards/margins"] > 0


@pytest.mark.parametrize(
    "loss, extra",
    [
        ("apo_zero", []),
        ("apo_down", []),
        ("nca_pair", []),
        ("sppo_hard", []),
        ("bco_pair", []),
        # τ above (1 - log 2)/3: at the paper's 0.05 the slope at ρ = 0 lowers ρ first
        # (test_algorithms_preference), and this run ends at 0.09 accuracy
        ("discopop", ["dpo.discopop_tau=0.5"]),
        ("aot", []),
        ("aot_unpaired", []),
    ],
)
def test_log_ratio_losses_learn_the_held_out_preference(tmp_path, loss, extra):
    """TRL's other losses, through the dpo preset with dpo.loss: the held-out pairs end up
    ranked right, by a margin the first evaluation did not have."""
    cfg = file_config(tmp_path, "dpo", f"dpo.loss={loss}", *extra)
    run_dir = run_dpo(cfg, show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    first, last = evals[0], evals[-1]
    assert first["rewards/margins"] == 0.0  # the policy is its reference at step 0
    assert last["rewards/accuracies"] >= 0.95, (loss, first, last)
    assert last["rewards/margins"] > 0.1


def test_dpo_epochs_set_the_steps_from_the_pairs(tmp_path):
    """Half a pass over the 128 training pairs, 16 a step, is 4 steps (dpo.steps=12 unused)."""
    cfg = file_config(tmp_path, "dpo", "dpo.epochs=0.5", "dpo.eval_every_steps=0")
    run_dir = run_dpo(cfg, show_progress=False)
    lines = list(read_jsonl(run_dir / "metrics.jsonl"))
    assert [(r["step"], r["epoch"]) for r in lines] == [(s, s * 16 / 128) for s in range(1, 5)]
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 4]


def test_last_held_out_line_is_the_saved_model_against_the_start(tmp_path):
    cfg = file_config(tmp_path, "dpo", "dpo.steps=4", "dpo.eval_every_steps=0")
    run_dir = run_dpo(cfg, show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert [e["step"] for e in evals] == [0, 4]
    start, tok = load_model_and_tokenizer(cfg.model, seed=cfg.dpo.seed)
    saved, _ = load_pretrained(str(run_dir))
    rows = load_preference_file(cfg.data.path)[-32:]
    pairs = encode_pairs(rows, cfg.data.template, tok)
    reference = all_pair_logps(start, pairs, 4096, tok.pad_token_id)
    scored = PairScorer(cfg, pairs, reference).evaluate(saved, tok.pad_token_id)
    for key, value in scored.items():
        assert evals[-1][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert evals[-1]["rewards/margins"] > 0.01


def test_dpo_with_lora_learns_against_the_base_model_and_saves_it_merged(tmp_path):
    """The reference log-probs are the starting policy's, which with adapters (B = 0) is the
    base model; the saved model is the merged one (measured at 1e-2: loss 0.69 -> 0.21)."""
    cfg = file_config(tmp_path, "dpo", "model.lora.rank=8", "dpo.lr=1e-2")
    run_dir = run_dpo(cfg, show_progress=False)
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert evals[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert evals[-1]["rewards/accuracies"] >= 0.95 and evals[-1]["loss"] < 0.4
    base_cfg = cfg.model.model_copy(update={"lora": cfg.model.lora.model_copy(update={"rank": 0})})
    base, _ = load_model_and_tokenizer(base_cfg, seed=cfg.dpo.seed)
    saved, _ = load_pretrained(str(run_dir))
    assert torch.equal(saved.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert not torch.equal(
        saved.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight
    )
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_simpo_needs_no_reference_pass(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the reference-free loss ran a reference pass")

    monkeypatch.setattr(preference, "all_pair_logps", refuse)
    run_dpo(file_config(tmp_path, "simpo", "dpo.steps=2"), show_progress=False)
    with pytest.raises(AssertionError, match="reference pass"):
        run_dpo(file_config(tmp_path, "dpo", "dpo.steps=2"), show_progress=False)


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
    def nan_reference(model, pairs, *args):
        return torch.full((len(pairs),), float("nan")), torch.zeros(len(pairs))

    monkeypatch.setattr(preference, "all_pair_logps", nan_reference)
    cfg = file_config(tmp_path, "dpo", "dpo.steps=5")
    with (
        pytest.warns(UserWarning, match="non-finite"),
        pytest.raises(NonFiniteError, match="3 consecutive steps"),
    ):
        run_dpo(cfg, show_progress=False)
    metrics = list(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    assert [(m["step"], m["skipped_updates"]) for m in metrics] == [(1, 1), (2, 1), (3, 1)]
    assert not (tmp_path / "run" / "model.safetensors").exists()
    # resumed from the checkpoint of step 2, the count goes on: step 3 is the third in a row
    (tmp_path / "saved").mkdir()
    cfg = file_config(tmp_path / "saved", "dpo", "dpo.steps=5", "dpo.save_every=2")
    with pytest.warns(UserWarning), pytest.raises(NonFiniteError):
        run_dpo(cfg, show_progress=False)
    with (
        pytest.warns(UserWarning, match="step 3: non-finite"),
        pytest.raises(NonFiniteError, match="3 consecutive steps"),
    ):
        run_dpo(cfg, show_progress=False, resume=True)
    metrics = list(read_jsonl(tmp_path / "saved" / "run" / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [1, 2, 3]


def sampled_from_tiny(count: int, labelled: bool = False):
    """`sample_pairs` of a random one-layer tiny model on `count` arithmetic problems, 4
    samples each, scored by their length's parity: (tokenizer, model, problems, pairs,
    records)."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    problems, _ = synthetic_splits("arithmetic", train_size=count, test_size=1, seed=0)
    pairs, records = sample_pairs(
        model,
        tok,
        problems,
        "test_dpo:even_length_reward",
        template="chat",
        samples_per_prompt=4,
        temperature=1.0,
        max_new_tokens=9,
        seed=0,
        labelled=labelled,
    )
    return tok, model, problems, pairs, records


def test_sampled_pairs_are_verified_best_against_worst():
    tok, model, problems, pairs, records = sampled_from_tiny(24)
    assert 12 <= len(pairs) == len(records) <= 24  # most groups of 4 mix odd and even
    questions = [p.question for p in problems]
    eos = eos_token_ids(model, tok)
    for i, record in enumerate(records):
        assert (record["chosen_reward"], record["rejected_reward"]) == (1.0, 0.0)
        assert len(record["chosen"]) % 2 == 0 and len(record["rejected"]) % 2 == 1
        texts = decode_completions(tok, [pairs.chosen[i], pairs.rejected[i]], eos)
        assert texts == [record["chosen"], record["rejected"]]
        assert record["prompt"] in questions
        assert pairs.prompts[i] == encode_prompts("chat", [record["prompt"]], tok)[1][0]


def test_labelled_samples_are_every_sample_one_sided_by_its_verdict(tmp_path):
    """dpo.sampled_as=labelled: all 4 samples of each of 8 problems, a sample the reward
    accepts (even length) desirable, any other undesirable; the records are TRL's unpaired
    rows, which load_preference_file reads back as the same one-sided pairs."""
    tok, model, _, pairs, records = sampled_from_tiny(8, labelled=True)
    assert len(pairs) == len(records) == 32
    eos = eos_token_ids(model, tok)
    for i, record in enumerate(records):
        good = bool(pairs.chosen[i])
        assert good != bool(pairs.rejected[i]) and record["label"] == good
        (text,) = decode_completions(tok, [pairs.chosen[i] or pairs.rejected[i]], eos)
        assert record["completion"] == text and record["reward"] == float(len(text) % 2 == 0)
        assert pairs.prompts[i] == encode_prompts("chat", [record["prompt"]], tok)[1][0]
    assert 8 <= sum(r["label"] for r in records) <= 24
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read = encode_pairs(load_preference_file(path), "chat", tok)
    ended = [
        c if not c or c[-1] == tok.eos_token_id else [*c, tok.eos_token_id] for c in pairs.chosen
    ]
    assert read.chosen == ended  # a sample cut at the budget gets its EOS back, as SFT's targets


@pytest.mark.parametrize(("preset", "extra"), [("simpo", []), ("kto", ["dpo.sampled_as=labelled"])])
def test_sampled_run_writes_pairs_a_later_run_can_read(tmp_path, monkeypatch, preset, extra):
    overrides = [
        *extra,
        *SMALL_MODEL,
        "data.max_digits=1",
        "data.train_size=40",
        "data.test_size=16",
        "dpo.prompts=40",
        "dpo.max_new_tokens=9",
        "dpo.steps=2",
        f"dpo.output_dir={tmp_path / 'sampled'}",
    ]
    cfg = resolve_config(None, preset, overrides, DPOConfig, preset_package=PREFERENCE_PRESETS)
    task = load_task(cfg.data)
    task.reward = "test_dpo:even_length_reward"
    monkeypatch.setattr(preference, "load_task", lambda data: task)
    run_dir = run_dpo(cfg, show_progress=False)
    written = load_preference_file(run_dir / "pairs.jsonl")
    assert len(written) == sum(1 for _ in (run_dir / "pairs.jsonl").open())
    assert len(written) >= 10
    assert all(p.one_sided for p in written) == (preset == "kto")  # labelled: 40 × 4 samples
    evals = list(read_jsonl(run_dir / "eval.jsonl"))
    assert 4 <= evals[0]["pairs"] <= 16
    # a second run into the same directory replaces the logs instead of appending to them
    run_dpo(cfg, show_progress=False)
    assert load_preference_file(run_dir / "pairs.jsonl") == written
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 2]


def run_error(tmp_path, *overrides):
    cfg = resolve_config(
        None,
        None,
        [*SMALL_MODEL, f"dpo.output_dir={tmp_path / 'bad'}", *overrides],
        model=DPOConfig,
    )
    with pytest.raises(ConfigError) as caught:
        run_dpo(cfg, show_progress=False)
    return str(caught.value)


def test_bad_settings_name_their_key(tmp_path):
    assert "dpo.loss: unknown preference loss 'dpoo'; did you mean 'dpo'" in run_error(
        tmp_path, "dpo.loss=dpoo"
    )
    assert "data.task=file needs data.path" in run_error(tmp_path, "data.task=file")
    data = arithmetic_pairs(tmp_path / "few.jsonl", 8)
    message = run_error(tmp_path, "data.task=file", f"data.path={data}", "dpo.eval_pairs=8")
    assert (
        "few.jsonl has 8 rows, not more than dpo.eval_pairs=8; lower dpo.eval_pairs (0 holds "
        "none out) or give data.test_path" in message
    )
    # one new token cannot be a right answer: every sample scores 0, no pair
    message = run_error(tmp_path, "data.train_size=50", "dpo.prompts=8", "dpo.max_new_tokens=1")
    assert "dpo.prompts: none of 8 arithmetic problems" in message
    assert "dpo.loss: unknown preference loss 'bco_par'; did you mean 'bco_pair'" in run_error(
        tmp_path, "dpo.loss=[dpo,bco_par]"
    )
    for overrides, message in (
        (["dpo.loss=ipo", "dpo.label_smoothing=0.1"], "loss ipo has no label smoothing"),
        (["dpo.loss=[hinge,nca_pair]", "dpo.label_smoothing=0.1"], "loss hinge+nca_pair has no"),
        (["dpo.loss=exo_pair"], "exo_pair needs EXO's ε > 0"),
    ):
        assert f"dpo.label_smoothing: {message}" in run_error(tmp_path, *overrides)
    message = run_error(tmp_path, "dpo.sampled_as=labelled")
    assert "dpo.sampled_as=labelled: its one-sided samples train dpo.loss=kto alone" in message
    message = run_error(tmp_path, "dpo.loss=kto", "dpo.sampled_as=labelled", "data.task=file",
                        f"data.path={data}")  # fmt: skip
    assert "dpo.sampled_as=labelled is for a built-in task's samples" in message
    message = run_error(tmp_path, "dpo.loss=[aot,aot_unpaired]")
    assert "dpo.loss: aot and aot_unpaired are two matchings; list one of them" in message
    message = run_error(tmp_path, "dpo.loss=[dpo,apo_zero]", "dpo.f_divergence=forward_kl")
    assert "dpo.f_divergence=forward_kl: loss dpo+apo_zero is not a function of" in message
    for overrides, key in (
        (["dpo.gamma=0.5"], "dpo.gamma is read by simpo only; loss 'ipo'"),
        (["dpo.discopop_tau=0.1"], "dpo.discopop_tau is read by discopop only; loss 'ipo'"),
        (["dpo.kto_undesirable_weight=2"], "dpo.kto_undesirable_weight is read by kto only"),
        (["dpo.loss=[ipo,hinge]", "dpo.loss_weights=[1]"], "1 weights for 2 losses"),
        (["dpo.loss=[ipo,ipo]"], r"a loss is listed twice in \['ipo', 'ipo'\]"),
        (["dpo.loss=[]"], "an empty list"),
    ):
        with pytest.raises(ConfigError, match=key):
            resolve_config(None, "ipo", overrides, DPOConfig, preset_package=PREFERENCE_PRESETS)


runner = CliRunner()


def test_cli_dpo_runs_a_preset_and_lists_it(tmp_path):
    data = arithmetic_pairs(tmp_path / "pairs.jsonl", 40)
    out = tmp_path / "cli"
    args = ["dpo", "--preset", "simpo", *SMALL_MODEL, "data.task=file", f"data.path={data}"]
    args += ["dpo.eval_pairs=8", "dpo.steps=2", f"dpo.output_dir={out}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file()
    assert yaml_loss(out / "config.yaml") == ("simpo", 2.0, 1.0)
    listed = runner.invoke(app, ["presets"]).output
    for name in preset_names(PREFERENCE_PRESETS):
        assert name in listed
    assert "arXiv:2405.14734" in listed and "dpo" in listed
    bad = runner.invoke(app, ["dpo", "--preset", "simpoo"])
    assert bad.exit_code == 2 and "did you mean 'simpo'" in bad.output
    bad = runner.invoke(app, ["dpo", "data.task=file", f"data.path={tmp_path / 'no.jsonl'}"])
    said = " ".join(bad.output.split())  # the console wraps long paths at any width
    assert bad.exit_code == 2 and "no.jsonl: no such file" in said


def yaml_loss(path):
    d = yaml.safe_load(path.read_text())["dpo"]
    return d["loss"], d["beta"], d["gamma"]


def test_dpo_resume_continues_the_same_trajectory(tmp_path, monkeypatch):
    """Checkpoints every 2 steps; resumed from step 4 after a crash, or from step 3 where a
    SIGTERM stopped it, the run logs and saves what the straight run did, evaluations too
    (the reference log-probs come from the initial model, not the checkpoint)."""
    settings = ("dpo.steps=6", "dpo.eval_every_steps=3", "dpo.save_every=2")
    for name in "abc":
        (tmp_path / name).mkdir()
    straight = run_dpo(file_config(tmp_path / "a", "dpo", *settings), show_progress=False)

    def same_as_straight(run_dir):
        for name, drop in (("metrics.jsonl", "time/step"), ("eval.jsonl", "seconds")):
            logs = [
                [{k: v for k, v in r.items() if k != drop} for r in read_jsonl(d / name)]
                for d in (straight, run_dir)
            ]
            assert logs[0] == logs[1], name
        assert [r["step"] for r in read_jsonl(run_dir / "eval.jsonl")] == [0, 3, 6]
        saved = [load_pretrained(str(d))[0].state_dict() for d in (straight, run_dir)]
        assert all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])

    crashed = tmp_path / "b" / "run"
    shutil.copytree(straight, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step-4")  # as if it died in step 4
    with pytest.raises(ConfigError, match=r"dpo\.output_dir=.* holds an earlier run"):
        run_dpo(file_config(tmp_path / "b", "dpo", *settings), show_progress=False)
    run_dpo(file_config(tmp_path / "b", "dpo", *settings), show_progress=False, resume=True)
    same_as_straight(crashed)

    class TermAfterStep3(preference.StopOnSignal):
        def agreed(self, ranks):
            lines = read_jsonl(tmp_path / "c" / "run" / "metrics.jsonl")
            return signal.SIGTERM if len(lines) == 3 else None

    monkeypatch.setattr(preference, "StopOnSignal", TermAfterStep3)
    with pytest.raises(RunStopped, match="after step 3"):
        run_dpo(file_config(tmp_path / "c", "dpo", *settings), show_progress=False)
    monkeypatch.undo()
    run_dpo(file_config(tmp_path / "c", "dpo", *settings), show_progress=False, resume=True)
    same_as_straight(tmp_path / "c" / "run")


def test_pair_micro_batches_count_both_responses_against_the_budget():
    """The longest side is 2 + 3 = 5 tokens for each pair; a pair is 2 rows, so a budget of 20
    holds 2 pairs (2 · 2 · 5 = 20), not 3."""
    pairs = PairTokens([[1, 2]] * 3, [[3, 4, 5], [6], [7, 8, 9]], [[3], [6, 7, 8], [9, 9]])
    assert pairs.longest == [5, 5, 5]
    assert pairs.micro_batches([0, 1, 2], 20) == [[0, 1], [2]]


def test_dpo_gradient_checkpointing_follows_the_same_trajectory(tmp_path, recomputed_regions):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = run_dpo(file_config(tmp_path / "a", "dpo", "dpo.steps=3"), show_progress=False)
    assert not recomputed_regions
    cfg = file_config(tmp_path / "b", "dpo", "dpo.steps=3", "dpo.gradient_checkpointing=true")
    checkpointed = run_dpo(cfg, show_progress=False)
    assert recomputed_regions  # the layers really were recomputed
    for name in ("metrics.jsonl", "eval.jsonl"):
        left, right = read_jsonl(plain / name), read_jsonl(checkpointed / name)
        assert len(left) == len(right) > 1
        for x, y in zip(left, right, strict=True):
            assert {k: v for k, v in x.items() if k != "time/step"} == {
                k: v for k, v in y.items() if k != "time/step"
            }


def test_dpo_gradient_checkpointing_without_the_fused_forward_is_a_config_error(tmp_path):
    extra = ("dpo.gradient_checkpointing=true", "model.fused_forward=false")
    with pytest.raises(ConfigError, match=r"dpo\.gradient_checkpointing: .*fused forward"):
        run_dpo(file_config(tmp_path, "dpo", *extra), show_progress=False)
    assert not (tmp_path / "run").exists()  # nothing written


def test_pairs_held_out_of_the_training_file_are_announced(tmp_path, capsys):
    run_dpo(file_config(tmp_path, "dpo", "dpo.steps=1", "dpo.eval_pairs=8"), show_progress=True)
    assert (
        "data.path: training on 152 pairs; the last 8 are held out for evaluation "
        "(dpo.eval_pairs=8; 0 trains on every pair)"
    ) in capsys.readouterr().out
    every = ["dpo.steps=1", "dpo.eval_pairs=0", f"dpo.output_dir={tmp_path / 'all'}"]
    run_dpo(file_config(tmp_path, "dpo", *every), show_progress=True)
    assert "held out" not in capsys.readouterr().out
