"""`rlvr dpo`'s loop where the eighth mutation round found no test: each pair statistic by
hand, WPO's weight of a missing side, the ranks' collectives, the gradient-sync flag and
the zero-weighted pass, the non-finite count, the progress line and the KTO balance bounds.

Two survivors are equivalent: `_means`'s `ranks.world >= 1` for `> 1` (one process gathers
its own statistics, only moved to the CPU first) and the zero-weighted pass's `rows[:2]` for
`rows[:1]` (0 times either loss is a zero gradient; the pass is there to gather weights)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import warnings

import pytest
import torch

from rlvr.config import ConfigError
from rlvr.config_offline import DPOConfig, DPOTrainConfig
from rlvr.data.preference import PreferencePair
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import preference
from rlvr.training.distributed import Ranks
from rlvr.training.pairs import all_pair_logps
from rlvr.training.preference import PairScorer, accumulate_gradients, run_dpo
from test_dpo import ONE_SIDED, PAIRS, file_config, logp_alone


def tiny():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    return tok, model


def logistic_loss(margin: float) -> float:
    """DPO's −log σ(z) = log(1 + e^{−z})."""
    return math.log1p(math.exp(-margin))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def alone(model, pairs, row, side):
    response = getattr(pairs, side)[row]
    with torch.no_grad():
        return logp_alone(model, pairs.prompts[row], response).item() if response else 0.0


def shifted(model, pairs, shift_c, shift_r):
    """The policy's log-probs of each side scored alone (0 where missing), and a reference of
    them plus the shifts."""
    policy = {side: [alone(model, pairs, r, side) for r in range(3)] for side in SIDES}
    reference = tuple(
        torch.tensor([p + s for p, s in zip(policy[side], shift)])
        for side, shift in zip(SIDES, (shift_c, shift_r))
    )
    return policy, reference


SIDES = ("chosen", "rejected")


def test_pair_statistics_are_the_rewards_margins_and_accuracies_by_hand():
    """DPO at β = 0.5 against a reference shifted by hand from the policy's own log-probs:
    rewards are −β · shift, margins 0.3, 1.5 and −0.2 (one below 1, so a margin is compared
    with 0), and row 1's chosen and row 2's rejected response are a single token each."""
    tok, model = tiny()
    shift_c, shift_r = [-0.4, -2.0, 0.3], [0.2, 1.0, -0.1]
    policy, reference = shifted(model, PAIRS, shift_c, shift_r)
    cfg = DPOConfig.model_validate({"dpo": {"loss": "dpo", "beta": 0.5}})
    losses, stats = PairScorer(cfg, PAIRS, reference).loss(model, [0, 1, 2], tok.pad_token_id)
    chosen, rejected, margins = [0.2, 1.0, -0.15], [-0.1, -0.5, 0.05], [0.3, 1.5, -0.2]
    assert stats["rewards/chosen"].tolist() == pytest.approx(chosen, abs=1e-5)
    assert stats["rewards/rejected"].tolist() == pytest.approx(rejected, abs=1e-5)
    assert stats["rewards/margins"].tolist() == pytest.approx(margins, abs=1e-5)
    assert stats["rewards/accuracies"].tolist() == [1.0, 1.0, 0.0]
    assert stats["logps/chosen"].tolist() == pytest.approx(policy["chosen"], rel=1e-5)
    assert stats["logps/rejected"].tolist() == pytest.approx(policy["rejected"], rel=1e-5)
    want = [logistic_loss(m) for m in margins]
    assert losses.tolist() == pytest.approx(want, abs=1e-5)
    assert stats["loss"].tolist() == pytest.approx(want, abs=1e-5) and "kl" not in stats


def test_one_sided_statistics_take_each_present_side_alone():
    """KTO on unpaired rows (row 0 and 2 desirable, row 1 undesirable), each side's reference
    shifted by a different amount, so a missing side's would-be reward (β times minus its
    shift) differs from any present one's; z0 = 0.25 is set by hand."""
    tok, model = tiny()
    shift_c, shift_r = [-0.4, 0.6, -0.2], [0.8, 0.3, -0.5]
    policy, reference = shifted(model, ONE_SIDED, shift_c, shift_r)
    cfg = DPOConfig.model_validate({"dpo": {"loss": "kto", "beta": 0.5}})
    scorer = PairScorer(cfg, ONE_SIDED, reference, mismatched_reference=reference)
    scorer.z0 = 0.25
    losses, stats = scorer.loss(model, [0, 1, 2], tok.pad_token_id)
    assert stats["rewards/chosen"].tolist() == pytest.approx([0.2, 0.1], abs=1e-5)
    assert stats["rewards/rejected"].tolist() == pytest.approx([-0.15], abs=1e-5)
    assert stats["rewards/margins"].numel() == stats["rewards/accuracies"].numel() == 0
    assert stats["logps/chosen"].tolist() == pytest.approx(
        [policy["chosen"][0], policy["chosen"][2]], rel=1e-5
    )
    assert stats["logps/rejected"].tolist() == pytest.approx([policy["rejected"][1]], rel=1e-5)
    point = 0.5 * 0.25
    want = [1 - sigmoid(0.2 - point), 1 - sigmoid(point + 0.15), 1 - sigmoid(0.1 - point)]
    assert losses.tolist() == pytest.approx(want, abs=1e-5)
    assert stats["kl"].tolist() == [0.25] * 3
    assert preference._means([stats]) == pytest.approx(
        {
            "loss": sum(want) / 3,
            "rewards/chosen": 0.15,
            "rewards/rejected": -0.15,
            "logps/chosen": (policy["chosen"][0] + policy["chosen"][2]) / 2,
            "logps/rejected": policy["rejected"][1],
            "kl": 0.25,
        },
        abs=1e-5,
    )


def wpo_weight_alone(model, prompt, response):
    """WPO's w(y) from the response scored alone: exp of the mean over its tokens of
    log π(y_t) − log Σ_v π(v)²."""
    with torch.no_grad():
        ids = torch.tensor([prompt + response])
        logp = model(input_ids=ids).logits[0].log_softmax(-1)[len(prompt) - 1 : -1].double()
        token = logp.gather(-1, torch.tensor(response)[:, None])[:, 0]
        square_mass = torch.logsumexp(2 * logp, dim=-1)
        return math.exp(float((token - square_mass).mean()))


def test_wpo_weights_are_each_present_sides_weight_and_a_missing_side_weighs_1():
    """dpo.weighting: a pair weighs w(y_w) · w(y_l), a one-sided pair its present side's w."""
    tok, model = tiny()
    for pairs in (PAIRS, ONE_SIDED):
        reference = all_pair_logps(model, pairs, 4096, tok.pad_token_id)
        cfg = DPOConfig.model_validate({"dpo": {"loss": "kto", "beta": 0.5, "weighting": True}})
        scorer = PairScorer(cfg, pairs, reference, reference)
        scorer.set_weights(model, [0, 1, 2], tok.pad_token_id)
        want = [
            math.prod(
                wpo_weight_alone(model, pairs.prompts[r], response)
                for response in (pairs.chosen[r], pairs.rejected[r])
                if response
            )
            for r in range(3)
        ]
        assert scorer.weights.tolist() == pytest.approx(want, rel=1e-4)


@dataclasses.dataclass(frozen=True)
class TwoRanks(Ranks):
    """Rank `rank` of 2 without a process group: the other rank's gathered object, or the
    tensor it adds to a sum, is `theirs`; a broadcast is rank 0's own object."""

    theirs: object = None

    def gather(self, obj):
        return [obj, self.theirs] if self.rank == 0 else [self.theirs, obj]

    def sum_(self, tensor):
        return tensor.add_(self.theirs)

    def broadcast(self, obj):
        return obj


def test_means_are_over_every_ranks_statistics():
    """Under two ranks a statistic's mean is over both ranks' pairs: (1 + 2 + 6) / 3."""
    theirs = [{"loss": torch.tensor([6.0]), "rewards/margins": torch.tensor([])}]
    ranks = TwoRanks(rank=0, world=2, theirs=theirs)
    mine = [{"loss": torch.tensor([1.0, 2.0]), "rewards/margins": torch.tensor([])}]
    assert preference._means(mine, ranks) == {"loss": 3.0}
    assert preference._means(mine) == {"loss": 1.5}


def test_a_rank_without_a_share_of_the_step_takes_the_others_scores():
    """One pair, two ranks: rank 1 scores nothing and its WPO weights are the sum over the
    ranks of rank 0's [w(y_w), w(y_l)] = [0.5, 0.8], so 0.4."""
    tok, model = tiny()
    cfg = DPOConfig.model_validate({"dpo": {"weighting": True}})
    scorer = PairScorer(cfg, PAIRS, None)
    ranks = TwoRanks(rank=1, world=2, theirs=torch.tensor([[0.5, 0.8]], dtype=torch.float64))
    assert PAIRS.share([0], ranks) == []
    scorer.set_weights(model, [0], tok.pad_token_id, ranks)
    assert scorer.weights.tolist() == pytest.approx([0.4, 1.0, 1.0])


def test_only_the_last_pass_syncs_gradients_and_a_zero_weighted_pass_adds_nothing(monkeypatch):
    """Three micro-batches: `sync_gradients(last=...)` is True before the third alone. A
    filler pass (a sharded rank with fewer micro-batches, `sharding.passes`) syncs last in
    their place and leaves the gradient as it was."""
    tok, model = tiny()
    reference = all_pair_logps(model, PAIRS, 4096, tok.pad_token_id)
    reference = (reference[0] + torch.tensor([1.0, -2.0, 0.5]), reference[1])
    cfg = DPOConfig.model_validate({"dpo": {"beta": 0.5}})
    scorer = PairScorer(cfg, PAIRS, reference)
    flags = []
    monkeypatch.setattr(preference.sharding, "sync_gradients", lambda m, last: flags.append(last))
    grads = []
    for fillers in (0, 1):
        monkeypatch.setattr(
            preference.sharding, "passes", lambda m, parts, r, n=fillers: [*parts, *[None] * n]
        )
        flags.clear()
        model.zero_grad()
        parts = accumulate_gradients(model, scorer, [0, 1, 2], 8, tok.pad_token_id)
        assert len(parts) == 3
        assert flags == [False] * (2 + fillers) + [True]
        grads.append([p.grad.clone() for p in model.parameters()])
    for plain, filled in zip(*grads, strict=True):
        torch.testing.assert_close(plain, filled, atol=1e-7, rtol=1e-6)
    assert max(g.abs().max() for g in grads[0]) > 1e-4


def lines_of(function) -> range:
    source, first = inspect.getsourcelines(function)
    return range(first, first + len(source))


def test_a_finite_step_resets_the_count_and_a_non_finite_gradient_alone_skips(
    tmp_path, monkeypatch
):
    """The gradient norm is made infinite at steps 2 and 3 (the loss stays finite): both are
    skipped, but step 1 was finite, so two in a row do not stop the run. The clip reads
    dpo.max_grad_norm; time/step is within the run's wall time; the warning points at
    `_run_dpo`."""
    clip = torch.nn.utils.clip_grad_norm_
    max_norms = []

    def infinite_after_step_1(parameters, max_norm):
        max_norms.append(max_norm)
        norm = clip(parameters, max_norm)
        return norm if len(max_norms) == 1 else torch.tensor(float("inf"))

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", infinite_after_step_1)
    settings = ("dpo.steps=3", "dpo.batch_size=4", "dpo.eval_pairs=4", "dpo.max_grad_norm=0.5")
    cfg = file_config(tmp_path, "dpo", *settings)
    began = time.perf_counter()
    with pytest.warns(UserWarning, match="non-finite") as caught:
        run_dir = run_dpo(cfg, show_progress=False)
    wall = time.perf_counter() - began
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    assert [m["skipped_updates"] for m in metrics] == [0, 1, 1]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert max_norms == [0.5] * 3
    assert all(0 < m["time/step"] < wall for m in metrics)
    warned = [w for w in caught if "non-finite" in str(w.message)]
    assert [str(w.message) for w in warned] == [
        f"dpo step {s}: non-finite loss or gradient, skipped" for s in (2, 3)
    ]
    assert all(w.filename == preference.__file__ for w in warned)
    assert all(w.lineno in lines_of(preference._run_dpo) for w in warned)


def test_progress_lines_every_10_steps_and_the_last(tmp_path, capsys):
    settings = ("dpo.steps=12", "dpo.batch_size=2", "dpo.eval_pairs=2")
    run_dpo(file_config(tmp_path, "dpo", *settings), show_progress=True)
    printed = [line for line in capsys.readouterr().out.splitlines() if " step " in line]
    assert [line.split("  ")[0] for line in printed] == ["dpo step 10/12", "dpo step 12/12"]
    metrics = list(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    last = metrics[-1]
    assert printed[-1] == (
        f"dpo step 12/12  loss {last['loss']:.4f}  reward accuracy {last['rewards/accuracies']:.3f}"
    )


def test_progress_shows_the_accuracy_of_pairs_and_the_rewards_of_one_sided_ones():
    pairs = {
        "loss": 0.69314,
        "rewards/accuracies": 0.5,
        "rewards/chosen": 0.25,
        "rewards/rejected": -0.125,
    }
    assert preference._progress(pairs) == "loss 0.6931  reward accuracy 0.500"
    one_sided = {key: value for key, value in pairs.items() if key != "rewards/accuracies"}
    assert preference._progress(one_sided) == (
        "loss 0.6931  desirable reward +0.250  undesirable reward -0.125"
    )


def test_vllm_sampling_is_refused_under_several_ranks_only():
    """dpo.engine=vllm under two ranks is refused first; in one process, or with the hf
    engine under two, the run goes on to read its pairs (here: no data.path, refused next)."""
    needs_path = "data.task=file needs data.path"
    for engine, world, message in (
        ("vllm", 2, "dpo.engine=vllm: rank 0 alone samples the pairs"),
        ("vllm", 1, needs_path),
        ("hf", 2, needs_path),
    ):
        cfg = DPOConfig.model_validate(
            {"data": {"task": "file"}, "dpo": {"engine": engine, "keep_freed_memory": False}}
        )
        ranks = TwoRanks(rank=0, world=world)
        with pytest.raises(ConfigError, match=message):
            preference._run_dpo(cfg, ranks, False, False)


def kto_warns(desirable: int, undesirable: int, **weights) -> bool:
    d = DPOTrainConfig(loss="kto", **weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        preference.warn_kto_balance(d, desirable, desirable + undesirable, "here")
    return bool(caught)


def test_kto_balance_warns_outside_1_to_4_thirds_bounds_included():
    """λ_D n_D / (λ_U n_U): 1 and 4/3 are inside; 0.9, 1.4 and 1.5 are not, nor no
    undesirable example at all."""
    assert not kto_warns(5, 5) and not kto_warns(4, 3) and not kto_warns(6, 5)
    assert kto_warns(9, 10) and kto_warns(7, 5) and kto_warns(3, 2) and kto_warns(4, 0)
    assert not kto_warns(5, 2, kto_undesirable_weight=2.0)  # 5 / (2 · 2) = 1.25
    assert kto_warns(5, 2, kto_desirable_weight=2.0)  # 2 · 5 / 2 = 5


def test_the_kto_balance_warning_points_at_its_caller():
    """stacklevel=2: the line in `check_one_sided` that names the file, not
    `warn_kto_balance` itself nor the caller of `check_one_sided`."""
    rows = [PreferencePair("q", "a", None)] * 3 + [PreferencePair("q", None, "b")]
    d = DPOTrainConfig(loss="kto")
    with pytest.warns(UserWarning, match="3 desirable and 1 undesirable") as caught:
        preference.check_one_sided(d, rows, "rows.jsonl")
    (warning,) = caught
    assert warning.filename == preference.__file__
    assert warning.lineno in lines_of(preference.check_one_sided)
