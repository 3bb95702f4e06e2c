"""`benchmarks/vs_trl.py`'s rlvr arm, run as the benchmark runs it (a fresh worker process
with the benchmark's hooks on rlvr's forward), on the quick systems-mode sizes: the hooks must
keep up with rlvr's signatures (lever 54 added an argument the hook did not pass on, and the
benchmark failed at its first step)."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
vs_trl = pytest.importorskip("vs_trl")


def test_the_rlvr_arm_trains_forced_lengths_and_counts_no_padding(tmp_path):
    """2 steps of 4 prompts × 4 samples forced to 16 tokens with the dense reward (no group
    skipped): 256 completion tokens a step; in training each prompt's slots once for its
    samples, the completions packed, so that only the prompts' own pass pads (to the longest
    prompt of a micro-batch: a few slots of the hundreds)."""
    settings = replace(vs_trl.QUICK["systems"], steps=2, reward="dense")
    model_dir = vs_trl.prepare_model(tmp_path, 0)
    spec = vs_trl.make_spec("rlvr", "quick", tmp_path, model_dir, settings)
    result = vs_trl.summarize(vs_trl.launch(spec, tmp_path))
    steps = result["per_step"]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["completion_tokens"] == pytest.approx(4 * 4 * 16) for s in steps)
    assert 0.0 <= result["train_padding_frac"] < 0.01
    assert 1.0 <= result["train_slots_per_token"] < 2.0
    assert all(s["skipped_frac"] == 0.0 for s in steps)
    assert all(s["step_s"] >= s["rollout_s"] + s["train_s"] for s in steps)
