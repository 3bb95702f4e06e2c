"""SFT's loss (`rlvr.training.sft.summed_nll`) is the summed NLL of the targets given prompts.

It runs through the update's token scoring (shared prefix, padding-free, no full logits on the
lean forward); checked against each pair scored alone through the model's own forward.
"""

import json
import shutil
import signal

import pytest
import torch

from rlvr.config import ConfigError, DataConfig
from rlvr.config_offline import SFTConfig
from rlvr.data.synthetic import synthetic_splits
from rlvr.data.tasks import load_task
from rlvr.data.templates import encode_prompts
from rlvr.models import fused
from rlvr.models.loading import load_pretrained
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import sft as sft_module
from rlvr.training.sft import Encoded, held_out_nll, run_sft, sft_backward, summed_nll
from rlvr.training.stopping import RunStopped, StopOnSignal
from rlvr.training.supervised import NonFiniteError

PROMPTS = [[20, 21, 22], [23, 24], [20, 21, 22], [25]]
TARGETS = [[30, 31, 32, 33], [34], [35, 36], [37, 38, 39]]
ROWS = [3, 0, 1, 2]


def nll_one_pair_at_a_time(model, rows):
    total = torch.zeros(())
    for r in rows:
        ids = torch.tensor([PROMPTS[r] + TARGETS[r]])
        logp = model(input_ids=ids).logits[0].log_softmax(-1)
        scoring = logp[len(PROMPTS[r]) - 1 : -1]  # position i scores token i + 1
        total = total - scoring.gather(-1, torch.tensor(TARGETS[r])[:, None]).sum()
    return total


@pytest.mark.parametrize("lean_forward", [True, False])
def test_summed_nll_equals_each_pair_scored_alone(lean_forward):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    setattr(model, fused.ENABLE_ATTR, lean_forward)
    assert fused.supports(model) is lean_forward

    loss = summed_nll(model, PROMPTS, TARGETS, ROWS, tok.pad_token_id)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    reference = nll_one_pair_at_a_time(model, ROWS)
    expected = torch.autograd.grad(reference, list(model.parameters()))

    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert loss.item() > 10 * 3.0  # ten target tokens at about log(vocab) each, not zero
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert max(g.abs().max() for g in expected) > 1e-3


def test_held_out_nll_is_the_mean_nll_per_target_token_of_each_pair_scored_alone():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)
    every = [0, 1, 2, 3]
    alone = nll_one_pair_at_a_time(model, every).item() / sum(map(len, TARGETS))  # 13 tokens
    held_out = Encoded(PROMPTS, TARGETS, None)
    for budget in (4, 7, 100):  # one example a micro-batch (over budget), some, all at once
        assert held_out_nll(model, held_out, budget, tok.pad_token_id) == pytest.approx(alone)
    # with marks only the marked tokens count: the mean over those 3 tokens of example 0
    marks = [[True, False, True, True], [False], [False, False], [False, False, False]]
    ids = torch.tensor([PROMPTS[0] + TARGETS[0]])
    logp = model(input_ids=ids).logits[0].log_softmax(-1)[len(PROMPTS[0]) - 1 : -1]
    token_nll = -logp.gather(-1, torch.tensor(TARGETS[0])[:, None])[:, 0]
    marked = float(token_nll[[0, 2, 3]].mean().detach())
    assert held_out_nll(model, Encoded(PROMPTS, TARGETS, marks), 100, 0) == pytest.approx(marked)


def test_sft_reports_the_held_out_nll_which_falls_as_it_learns(tmp_path):
    out = run_sft(sft_config(tmp_path / "run", eval_every_steps=2), show_progress=False)
    rows = read_jsonl(out / "eval.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 4, 6]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5  # nats per token: it learned the format
    # the last line is the saved model's NLL on the first 2 held-out solutions, recomputed
    cfg = sft_config(tmp_path / "run")
    model, tok = load_pretrained(str(out))
    problems = load_task(cfg.data).test[: cfg.sft.eval_examples]
    _, prompts = encode_prompts(cfg.data.template, [p.prompt for p in problems], tok)
    targets = [tok(p.solution, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for p in problems]  # fmt: skip
    nll = 0.0
    with torch.no_grad():
        for p, t in zip(prompts, targets, strict=True):
            logits = model(input_ids=torch.tensor([p + t])).logits[0]
            logp = logits.log_softmax(-1)[len(p) - 1 : -1]
            nll -= float(logp.gather(-1, torch.tensor(t)[:, None]).sum())
    assert rows[-1]["tokens"] == sum(map(len, targets))
    assert rows[-1]["loss"] == pytest.approx(nll / rows[-1]["tokens"], rel=1e-5)
    quiet = run_sft(sft_config(tmp_path / "none", eval_examples=0), show_progress=False)
    assert not (quiet / "eval.jsonl").exists()


def test_a_second_run_into_the_same_directory_replaces_its_log(tmp_path):
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"train_size": 20, "test_size": 2, "max_digits": 1},
            "sft": {"steps": 2, "batch_size": 4, "warmup_steps": 0, "output_dir": str(tmp_path)},
        }
    )
    for _ in range(2):
        run_sft(cfg, show_progress=False)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_sft_epochs_set_the_steps_from_the_solutions(tmp_path):
    """TRL's num_train_epochs: 1.5 passes over 20 solutions, 4 a step, is ceil(7.5) = 8
    steps whatever sft.steps says; each line logs the passes done."""
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"train_size": 20, "test_size": 2, "max_digits": 1},
            "sft": {
                "steps": 2,
                "epochs": 1.5,
                "batch_size": 4,
                "warmup_steps": 0,
                "output_dir": str(tmp_path),
            },
        }
    )
    assert len([p for p in load_task(cfg.data).train if p.solution]) == 20
    run_sft(cfg, show_progress=False)
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == list(range(1, 9))
    assert [r["epoch"] for r in lines] == pytest.approx([4 * s / 20 for s in range(1, 9)])
    assert lines[-1]["lr"] == pytest.approx(0.1 * 1e-3)  # the cosine ends on the 8th step


def test_sft_on_a_data_file_uses_its_solution_column(tmp_path):
    problems, _ = synthetic_splits("arithmetic", train_size=40, test_size=1, seed=0, max_digits=1)
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": p.question, "answer": p.answer, "worked": p.solution} for p in problems]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"task": "file", "path": str(path), "test_size": 4}
    task = load_task(DataConfig(**data, solution_column="worked"))
    assert [p.solution for p in task.train] == [p.solution for p in problems[:36]]
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {**data, "solution_column": "worked"},
            "sft": {
                "steps": 30,
                "lr": 3e-3,
                "batch_size": 8,
                "warmup_steps": 0,
                "output_dir": str(tmp_path),
            },
        }
    )
    run_sft(cfg, show_progress=False)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert losses[-1] < 0.8 * losses[0], losses  # it fits the file's worked solutions
    cfg.data.solution_column = None
    with pytest.raises(
        ValueError, match=r"with data\.solution_column; the rows' other columns: \['worked'\]\)"
    ):
        run_sft(cfg, show_progress=False)


def test_sft_says_how_many_problems_it_leaves_out_for_want_of_a_solution(tmp_path):
    """A null solution is allowed (the same file may serve RL), but SFT says what it skips."""
    path = tmp_path / "data.jsonl"
    worked = ["1 + 1 = 2\n#### 2", None, "2 + 2 = 4\n#### 4", None, None]
    rows = [{"prompt": f"q{i}", "answer": "2", "worked": w} for i, w in enumerate(worked)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {
                "task": "file",
                "path": str(path),
                "test_size": 0,
                "solution_column": "worked",
            },
            "sft": {"steps": 1, "batch_size": 2, "output_dir": str(tmp_path / "out")},
        }
    )
    with pytest.warns(UserWarning, match=r"^3 of 5 training problems have no worked solution"):
        run_sft(cfg, show_progress=False)
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl")[0]["epoch"] == 1.0  # 2 a step, of 2


def sft_config(output_dir, **sft) -> SFTConfig:
    return SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"train_size": 30, "test_size": 2, "max_digits": 1},
            "sft": {"steps": 6, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2,
                    "output_dir": str(output_dir), **sft},
        }
    )  # fmt: skip


def same_run(a, b) -> None:
    """Two SFT folders logged the same steps with the same values and saved the same model."""
    left, right = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert [r["step"] for r in left] == [r["step"] for r in right] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(left, right, strict=True):
        assert {k: v for k, v in x.items() if k != "time"} == {
            k: v for k, v in y.items() if k != "time"
        }
    assert read_jsonl(a / "eval.jsonl") == read_jsonl(b / "eval.jsonl")
    saved = [load_pretrained(str(folder))[0].state_dict() for folder in (a, b)]
    assert all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])


def test_sft_resume_continues_the_same_trajectory(tmp_path, monkeypatch):
    """Checkpoints every 2 steps (the newest 2 kept); resumed from step 4 after a crash in
    step 5, or from step 3 where a SIGTERM stopped it, the run ends as the straight one."""
    straight = run_sft(sft_config(tmp_path / "a", save_every=2), show_progress=False)
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["step-2", "step-4"]

    crashed = tmp_path / "b"
    shutil.copytree(straight, crashed)  # as if the run died in step 5 or 6
    with pytest.raises(ConfigError, match=r"holds an earlier run .* continue it with --resume"):
        run_sft(sft_config(crashed, save_every=2), show_progress=False)
    run_sft(sft_config(crashed, save_every=1, keep_checkpoints=1), show_progress=False, resume=True)
    same_run(straight, crashed)
    assert [p.name for p in (crashed / "checkpoints").iterdir()] == ["step-5"]

    class TermAfterStep3(StopOnSignal):
        def agreed(self, ranks):
            return (
                signal.SIGTERM if len(read_jsonl(tmp_path / "c" / "metrics.jsonl")) == 3 else None
            )

    monkeypatch.setattr(sft_module, "StopOnSignal", TermAfterStep3)
    with pytest.raises(RunStopped) as stopped:
        run_sft(sft_config(tmp_path / "c"), show_progress=False)
    assert stopped.value.step == 3 and stopped.value.checkpoint.name == "step-3"
    monkeypatch.undo()
    run_sft(sft_config(tmp_path / "c"), show_progress=False, resume=True)
    same_run(straight, tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        run_sft(sft_config(tmp_path / "d"), show_progress=False, resume=True)


def test_sft_gradient_checkpointing_follows_the_same_trajectory(tmp_path, recomputed_regions):
    plain = run_sft(sft_config(tmp_path / "plain"), show_progress=False)
    assert not recomputed_regions
    checkpointed = run_sft(
        sft_config(tmp_path / "ck", gradient_checkpointing=True), show_progress=False
    )
    assert recomputed_regions  # the layers really were recomputed
    same_run(plain, checkpointed)


def test_sft_gradient_checkpointing_without_the_fused_forward_is_a_config_error(tmp_path):
    cfg = sft_config(tmp_path / "hf", gradient_checkpointing=True)
    cfg.model.fused_forward = False
    with pytest.raises(ConfigError, match=r"sft\.gradient_checkpointing: .*fused forward"):
        run_sft(cfg, show_progress=False)
    assert not (tmp_path / "hf").exists()  # nothing written


def poison_steps(monkeypatch, poisoned: set[int]) -> None:
    """Make the loss (and so the gradient) of the SFT steps in `poisoned` NaN."""
    calls = []
    nll, backward = sft_module.summed_nll, sft_module.sft_backward

    def counted(*args, **kwargs):
        calls.append(None)
        return backward(*args, **kwargs)

    def poisoned_nll(*args, **kwargs):
        loss = nll(*args, **kwargs)
        return loss * float("nan") if len(calls) in poisoned else loss

    monkeypatch.setattr(sft_module, "sft_backward", counted)
    monkeypatch.setattr(sft_module, "summed_nll", poisoned_nll)


def test_a_non_finite_sft_step_is_skipped_and_the_run_goes_on(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {2})
    with pytest.warns(UserWarning, match="sft step 2: non-finite loss or gradient, skipped"):
        out = run_sft(sft_config(tmp_path / "run"), show_progress=False)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["skipped_updates"] for r in rows] == [0, 1, 0, 0, 0, 0]
    assert rows[1]["lr"] == rows[0]["lr"]  # the skipped step did not advance the schedule
    weights = load_pretrained(str(out))[0].state_dict().values()
    assert all(torch.isfinite(w).all() for w in weights)


def test_three_non_finite_sft_steps_in_a_row_stop_the_run(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {1, 2, 3, 4, 5, 6})
    with (
        pytest.warns(UserWarning, match="non-finite"),
        pytest.raises(NonFiniteError, match=r"3 consecutive steps .* \(lower sft\.lr"),
    ):
        run_sft(sft_config(tmp_path / "run"), show_progress=False)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [(r["step"], r["skipped_updates"]) for r in rows] == [(1, 1), (2, 1), (3, 1)]
    assert not (tmp_path / "run" / "model.safetensors").exists()


SFT_LENGTHS = [len(p) + len(t) for p, t in zip(PROMPTS, TARGETS, strict=True)]  # [7, 3, 5, 4]


def _sft_model():
    tok = build_tiny_tokenizer()
    return tok, build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=4)


@pytest.mark.parametrize("budget", [4096, 4])  # one micro-batch; 4 tokens: one row each
def test_sft_backward_is_the_mean_nll_over_the_steps_target_tokens(budget):
    """Σ NLL / (4 + 1 + 2 + 3 = 10 target tokens), whatever the split into micro-batches."""
    tok, model = _sft_model()
    params = list(model.parameters())
    by_hand = summed_nll(model, PROMPTS, TARGETS, ROWS, tok.pad_token_id) / 10
    want = torch.autograd.grad(by_hand, params)
    model.zero_grad()
    loss = sft_backward(model, PROMPTS, TARGETS, SFT_LENGTHS, ROWS, budget, tok.pad_token_id)
    assert loss == pytest.approx(by_hand.item(), rel=1e-5)
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, w, atol=1e-6, rtol=1e-4)


def test_sft_backward_with_marks_normalises_by_the_trained_tokens_only():
    """Marked tokens: 3 + 1 + 1 + 2 = 7, not the 10 target tokens."""
    tok, model = _sft_model()
    trained = [[True, False, True, True], [True], [False, True], [True, False, True]]
    with torch.no_grad():
        by_hand = summed_nll(model, PROMPTS, TARGETS, ROWS, tok.pad_token_id, trained) / 7
    loss = sft_backward(
        model, PROMPTS, TARGETS, SFT_LENGTHS, ROWS, 4096, tok.pad_token_id, trained=trained
    )
    assert loss == pytest.approx(by_hand.item(), rel=1e-5)


def test_sft_targets_are_the_solution_tokens_then_eos(tmp_path, monkeypatch):
    cfg = SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"train_size": 6, "test_size": 2, "max_digits": 1},
            "sft": {"steps": 1, "batch_size": 2, "warmup_steps": 0, "output_dir": str(tmp_path)},
        }
    )
    seen = []

    def recording(*args, **kwargs):
        seen.append(args[2])
        return sft_backward(*args, **kwargs)

    monkeypatch.setattr(sft_module, "sft_backward", recording)
    run_sft(cfg, show_progress=False)
    tok = build_tiny_tokenizer()
    solutions = [p.solution for p in load_task(cfg.data).train if p.solution]
    want = [tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for s in solutions]
    assert seen and seen[0] == want


def test_example_order_draws_seeded_permutations_back_to_back():
    """Batches of 4 from 10: p1[:4], p1[4:8], then (2 left < 4) p1[8:] + p2[:2]."""
    import random

    from rlvr.training.supervised import ExampleOrder

    rng = random.Random(7)
    p1, p2 = list(range(10)), list(range(10))
    rng.shuffle(p1)
    rng.shuffle(p2)
    assert p1 != list(range(10))
    order = ExampleOrder(random.Random(7))
    rows = [order.next_rows(4, 10) for _ in range(3)]
    assert rows == [p1[:4], p1[4:8], p1[8:] + p2[:2]]
    assert order.order == p2[2:]
