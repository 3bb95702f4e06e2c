"""On-policy distillation: the teacher's per-token term, its gradient, and its settings."""

import itertools
import re
from types import SimpleNamespace

import pytest
import torch

from batches import token_batch
from rlvr.algorithms.distillation import reverse_kl_estimate, teacher_token_advantages
from rlvr.config import AlgorithmConfig, ConfigError, resolve_config
from rlvr.models.loading import save_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.estimation import batch_advantages
from rlvr.training.rl import train
from rlvr.training.teacher import check_same_vocabulary
from tiny_run import TINY_RUN


def test_per_token_and_discounted_terms_by_hand():
    """g = log π_T − log π_S on the kept tokens; A_t = Σ_{s≥t} γ^(s−t) g_s over the kept
    tokens only (the tool token at position 2 is skipped, not a step)."""
    student = torch.tensor([[-1.0, -0.5, -3.0, -2.0, 0.0]])
    teacher = torch.tensor([[-0.5, -1.5, -0.1, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
    # g = [0.5, -1.0, (tool), 1.0, (pad)]
    per_token = teacher_token_advantages(student, teacher, mask)
    torch.testing.assert_close(per_token, torch.tensor([[0.5, -1.0, 0.0, 1.0, 0.0]]))
    half = teacher_token_advantages(student, teacher, mask, discount=0.5)
    # A_3 = 1; A_1 = -1 + 0.5·1 = -0.5; A_0 = 0.5 + 0.5·(-0.5) = 0.25
    torch.testing.assert_close(half, torch.tensor([[0.25, -0.5, 0.0, 1.0, 0.0]]))
    whole = teacher_token_advantages(student, teacher, mask, discount=1.0)
    torch.testing.assert_close(whole, torch.tensor([[0.5, 0.0, 0.0, 1.0, 0.0]]))
    # the metric: mean of log π_S − log π_T over the 3 kept tokens = (-0.5 + 1 - 1) / 3
    assert reverse_kl_estimate(student, teacher, mask) == pytest.approx(-0.5 / 3)
    assert reverse_kl_estimate(student, teacher, torch.zeros_like(mask)) == 0.0
    with pytest.raises(ValueError, match=r"differ in shape: \(1, 5\) vs \(1, 4\)"):
        teacher_token_advantages(student, teacher[:, :4], mask)


def _tabular_policies(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two-token sequences over 3 symbols: student logits (first token, second given first,
    with a gradient) and a teacher's."""
    g = torch.Generator().manual_seed(seed)
    s1 = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    s2 = torch.randn(3, 3, generator=g, dtype=torch.float64).requires_grad_()
    t1 = torch.randn(3, generator=g, dtype=torch.float64)
    t2 = torch.randn(3, 3, generator=g, dtype=torch.float64)
    return s1, s2, t1, t2


def _expected_surrogate(s1, s2, t1, t2, discount: float) -> torch.Tensor:
    """E_{y~π_S}[Σ_t A_t log π_S(y_t | y_<t)] with A from `teacher_token_advantages` (no
    gradient) and the sequence probabilities detached: its gradient is E[Σ_t A_t ∇log π_S]."""
    ls1, ls2 = s1.log_softmax(-1), s2.log_softmax(-1)
    lt1, lt2 = t1.log_softmax(-1), t2.log_softmax(-1)
    total = torch.zeros((), dtype=torch.float64)
    for a, b in itertools.product(range(3), repeat=2):
        student = torch.stack([ls1[a], ls2[a, b]])
        teacher = torch.stack([lt1[a], lt2[a, b]])
        adv = teacher_token_advantages(
            student[None].detach(), teacher[None], torch.ones(1, 2), discount=discount
        )[0]
        prob = (ls1[a] + ls2[a, b]).exp().detach()
        total = total + prob * (adv * student).sum()
    return total


def test_discount_one_is_the_gradient_of_the_sequence_reverse_kl():
    """Enumerating every sequence: E[Σ_t A_t ∇log π_S(y_t)] = −∇ KL(π_S ‖ π_T) exactly for
    γ = 1, the reverse KL over whole sequences computed independently."""
    for seed in range(3):
        s1, s2, t1, t2 = _tabular_policies(seed)
        (grad_s1, grad_s2) = torch.autograd.grad(_expected_surrogate(s1, s2, t1, t2, 1.0), (s1, s2))
        p1, lp1, lp2 = s1.softmax(-1), s1.log_softmax(-1), s2.log_softmax(-1)
        q1, q2 = t1.log_softmax(-1), t2.log_softmax(-1)
        joint = p1[:, None] * lp2.exp()
        kl = (joint * (lp1[:, None] + lp2 - q1[:, None] - q2)).sum()
        (kl_s1, kl_s2) = torch.autograd.grad(kl, (s1, s2))
        torch.testing.assert_close(grad_s1, -kl_s1)
        torch.testing.assert_close(grad_s2, -kl_s2)


def test_discount_zero_is_the_gradient_of_each_positions_kl_with_the_prefixes_held():
    """γ = 0 (Thinking Machines' per-token reward): −Σ_t E_{y<t}[∇ KL(π_S(·|y<t) ‖
    π_T(·|y<t))], the prefixes' probabilities held fixed; it drops what the first token's
    choice does to the second position's KL, so it differs from the sequence gradient."""
    s1, s2, t1, t2 = _tabular_policies(0)
    grads = torch.autograd.grad(_expected_surrogate(s1, s2, t1, t2, 0.0), (s1, s2))

    def position_kl(logits, teacher_logits):
        p, lp, lq = logits.softmax(-1), logits.log_softmax(-1), teacher_logits.log_softmax(-1)
        return (p * (lp - lq)).sum(-1)

    prefix = s1.softmax(-1).detach()
    held = position_kl(s1, t1) + (prefix * position_kl(s2, t2)).sum()
    expected = torch.autograd.grad(held, (s1, s2))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, -want)
    whole = torch.autograd.grad(_expected_surrogate(s1, s2, t1, t2, 1.0), (s1,))[0]
    assert (whole - grads[0]).abs().max() > 1e-3


def test_the_loop_adds_the_teacher_term_to_the_weighted_outcome_advantages():
    """advantages = outcome_weight · (GRPO's) + coef · (log π_T − log π_S), token by token."""
    batch = token_batch([[5]] * 2, [[7, 8], [7, 9]], torch.tensor([0, 0]), torch.zeros(2))
    batch.rewards = torch.tensor([1.0, 0.0])
    batch.rollout_logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
    batch.teacher_logprobs = torch.tensor([[-0.5, -2.5], [-1.5, -1.0]])
    gap = torch.tensor([[0.5, -0.5], [-1.0, 0.0]])
    outcome = torch.tensor([[1.0], [-1.0]]) / (2**0.5 + 1e-6)  # z-scores, unbiased std √0.5
    mixed = {"teacher": "t", "coef": 2.0, "outcome_weight": 0.5}
    algo = AlgorithmConfig(distill=mixed)
    advantages, _ = batch_advantages(batch, algo, kl_coef=0.0)
    torch.testing.assert_close(advantages, 0.5 * outcome.expand(2, 2) + 2.0 * gap)
    alone = AlgorithmConfig(distill={"teacher": "t", "outcome_weight": 0.0})
    torch.testing.assert_close(batch_advantages(batch, alone, kl_coef=0.0)[0], gap)
    batch.teacher_logprobs = None  # no teacher: the outcome advantages alone
    torch.testing.assert_close(batch_advantages(batch, algo, kl_coef=0.0)[0], outcome.expand(2, 2))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny model of TINY_RUN's shape (another seed) saved as a Hugging Face directory."""
    directory = tmp_path_factory.mktemp("teacher")
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=7)
    save_pretrained(model, tok, directory)
    return directory


def _opd_config(tmp_path, teacher, *more):
    overrides = [*TINY_RUN, f"train.output_dir={tmp_path}", f"algorithm.distill.teacher={teacher}"]
    return resolve_config(preset="opd", overrides=[*overrides, *more])


def test_opd_run_scores_the_samples_with_the_teacher_and_logs_the_reverse_kl(tmp_path, teacher_dir):
    """The teacher's log-probs of the sampled tokens equal those of a plain transformers
    forward of the saved teacher; the advantages are their gap to the rollout's; the metric is
    its mean; every sample is trained."""
    from rlvr.models.loading import load_pretrained
    from rlvr.tracking.jsonl import read_jsonl

    seen = []

    def record(batch):
        seen.append(batch)  # prepare_update adds the teacher's log-probs to this object
        return batch

    cfg = _opd_config(tmp_path, teacher_dir, "train.steps=2", "rollout.temperature=0.7")
    run = train(cfg, filters=(record,), show_progress=False)
    metrics = read_jsonl(run / "metrics.jsonl")
    teacher, _ = load_pretrained(str(teacher_dir))
    for batch, logged in zip(seen, metrics, strict=True):
        assert logged["trained_samples"] == len(batch) == 12  # 3 prompts × 4, none skipped
        for row, (prompt, completion) in enumerate(
            zip(batch.prompt_ids, batch.completion_ids, strict=True)
        ):
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logits = teacher(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
            expected = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            torch.testing.assert_close(
                batch.teacher_logprobs[row, : len(completion)], expected, atol=1e-5, rtol=1e-5
            )
        gap = (batch.teacher_logprobs - batch.rollout_logprobs) * batch.response_mask
        torch.testing.assert_close(batch.advantages, gap)
        kl = reverse_kl_estimate(
            batch.rollout_logprobs, batch.teacher_logprobs, batch.response_mask
        )
        assert logged["distill/reverse_kl"] == pytest.approx(kl, rel=1e-6)
        assert logged["distill/reverse_kl"] != 0.0


def test_opd_settings_are_refused_with_the_key_named(tmp_path, teacher_dir):
    alone = resolve_config(preset="opd", overrides=[*TINY_RUN, f"train.output_dir={tmp_path}/c"])
    with pytest.raises(ConfigError, match=r"algorithm\.distill\.teacher is not set"):
        train(alone, show_progress=False)
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=re.escape(f"algorithm.distill.teacher {str(missing)!r}")):
        train(_opd_config(tmp_path / "a", missing), show_progress=False)
    other = tmp_path / "other_vocab"
    tok = build_tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    save_pretrained(model, tok, other)
    with pytest.raises(ConfigError, match=r"its tokenizer differs from the policy's \("):
        train(_opd_config(tmp_path / "b", other), show_progress=False)
    assert not (tmp_path / "b").exists()  # refused before the run directory is made


def test_a_vocabulary_difference_names_the_first_id_and_both_tokens_there():
    """The lowest id whose token differs, with the teacher's token and the policy's at it:
    the same message whatever the string hashes (it once named either side's at random)."""

    def vocab(tokens: dict[str, int]) -> SimpleNamespace:
        return SimpleNamespace(get_vocab=lambda: tokens)

    policy = vocab({"a": 0, "b": 1, "y": 2, "c": 3, "d": 4})
    renamed = vocab({"a": 0, "b": 1, "x": 2, "c": 3})
    with pytest.raises(ConfigError) as error:
        check_same_vocabulary(renamed, policy, "t")
    assert str(error.value) == (
        "algorithm.distill.teacher 't': its tokenizer differs from the policy's (4 vs 5 tokens; "
        "first difference at id 2: 'x' in the teacher's, 'y' in the policy's); the teacher "
        "scores the student's token ids, so both need the same vocabulary"
    )
    shorter = vocab({"a": 0, "b": 1, "y": 2, "c": 3})
    with pytest.raises(ConfigError, match=r"at id 4: no token in the teacher's, 'd' in the po"):
        check_same_vocabulary(shorter, policy, "t")
    check_same_vocabulary(vocab({"b": 1, "a": 0}), vocab({"a": 0, "b": 1}), "t")


def test_distillation_alone_needs_no_second_sample(tmp_path, teacher_dir):
    """Group baselines are refused with one sample per prompt, unless only the teacher's
    term trains."""
    one = ["rollout.samples_per_prompt=1", "train.steps=1"]
    train(_opd_config(tmp_path / "a", teacher_dir, *one), show_progress=False)
    with pytest.raises(ConfigError, match="samples_per_prompt=1 would train nothing"):
        train(
            _opd_config(tmp_path / "b", teacher_dir, *one, "algorithm.distill.outcome_weight=1"),
            show_progress=False,
        )
