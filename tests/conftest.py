"""Fixtures shared by the test modules, and the background run of the Triton interpreter's
checks."""

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from rlvr.models import fused


@pytest.fixture
def recomputed_regions(monkeypatch):
    """Records each region the fused forward runs under activation checkpointing, as (region
    name, {input storage address: bytes}); the regions still run and recompute as usual."""
    calls = []
    recomputed = fused._recomputed

    def recording(function, *args):
        inputs = {
            a.untyped_storage().data_ptr(): a.untyped_storage().nbytes()
            for a in args
            if isinstance(a, torch.Tensor)
        }
        calls.append((function.__name__, inputs))
        return recomputed(function, *args)

    monkeypatch.setattr(fused, "_recomputed", recording)
    return calls


def stats_through_logits(model, sb, temperature, with_entropy=True):
    """The reference for `completion_token_stats`: the full logits, then autograd through
    log_softmax; zero at padding."""
    from rlvr.training.batching import forward_logits_shared_prefix

    logp = (forward_logits_shared_prefix(model, sb) / temperature).log_softmax(-1)
    lp = logp.gather(-1, sb.completion_ids[..., None]).squeeze(-1)
    return lp * sb.response_mask, -(logp.exp() * logp).sum(-1) * sb.response_mask


@pytest.fixture
def logits_reference():
    """`stats_through_logits`, for the tests that check the update's token scoring."""
    return stats_through_logits


def padded_logits(model, prompts, completions, rows, pad_id):
    """The reference layout for the shared-prefix one: each row its own prompt, left-padded,
    then its completion, right-padded, through the model's own forward. Returns the logits
    [b, T, vocab] that score the completion tokens, the tokens [b, T] and the mask [b, T]."""
    p_width = max(len(prompts[r]) for r in rows)
    t_width = max(max(len(completions[r]) for r in rows), 1)
    input_ids = torch.full((len(rows), p_width + t_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(len(rows), t_width)
    for i, r in enumerate(rows):
        prompt, completion = prompts[r], completions[r]
        input_ids[i, p_width - len(prompt) : p_width] = torch.tensor(prompt)
        input_ids[i, p_width : p_width + len(completion)] = torch.tensor(completion).long()
        attention_mask[i, p_width - len(prompt) : p_width + len(completion)] = 1
        response_mask[i, : len(completion)] = 1
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=False,
    ).logits
    return logits[:, p_width - 1 : -1], input_ids[:, p_width:], response_mask


@pytest.fixture
def padded_reference():
    """`padded_logits`, for the tests that check the shared-prefix layout against it."""
    return padded_logits


INTERPRETED = "test_the_triton_kernels_under_the_interpreter"


class InterpretedChecks:
    """`interpreted_triton.py` under pytest in a child process with `TRITON_INTERPRET=1` (which
    Triton reads when it is imported), on one thread at the lowest CPU priority, its output in
    a temporary file."""

    def __init__(self) -> None:
        checks = Path(__file__).with_name("interpreted_triton.py")
        env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
        code = "import os, sys, pytest; os.nice(19); sys.exit(pytest.main(sys.argv[1:]))"
        fd, name = tempfile.mkstemp(prefix="interpreted-triton-", suffix=".log")
        self.log = Path(name)
        with os.fdopen(fd, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", str(checks)],
                env=env,
                cwd=checks.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def result(self) -> tuple[int, str]:
        """Waits for the run; its exit status and output."""
        return self.process.wait(), self.log.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.unlink(missing_ok=True)


RUNNING = pytest.StashKey[InterpretedChecks]()


@pytest.hookimpl(trylast=True)  # after `-k` and `-m` have deselected tests
def pytest_collection_modifyitems(config, items):
    """The interpreter's checks take about four minutes of one core, most of the suite's idle
    core time (its tests keep 1.4 of 2 cores busy on average): when their test is selected,
    they start in the background once the suite is collected, and the test that reads their
    result moves to the end."""
    waiting = [item for item in items if item.name == INTERPRETED]
    if not waiting or torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    items[:] = [item for item in items if item.name != INTERPRETED] + waiting
    config.stash[RUNNING] = InterpretedChecks()


def pytest_unconfigure(config):
    """A run stopped early (`-x`, Ctrl-C) leaves no child behind."""
    checks = config.stash.get(RUNNING, None)
    if checks is not None:
        checks.stop()


@pytest.fixture
def interpreted_checks(request) -> InterpretedChecks:
    """The background run started at collection; none without Triton (the test is skipped)."""
    checks = request.config.stash.get(RUNNING, None)
    if checks is None:
        pytest.skip("Triton is not installed")
    return checks
