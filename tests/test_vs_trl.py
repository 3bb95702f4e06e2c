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
    assert result["train_padding_frac"] < 0.01
    assert 1.0 <= result["train_slots_per_token"] < 2.0
    assert all(s["skipped_frac"] == 0.0 for s in steps)
    assert all(s["step_s"] >= s["rollout_s"] + s["train_s"] for s in steps)


def test_series_growth_is_taken_within_each_round_then_its_median():
    """Lengths 64 and 512 over three rounds: rlvr 1 → 8, 2 → 10, 1 → 9 s, i.e. 8×, 5× and
    9× within the rounds (median 8×), although the medians of the points give 9×; TRL 2× in
    every round. A series of one point has no growth."""
    rows = [
        {"vary": "max_new_tokens", "value": 512, "rlvr": {"step_s_rounds": [8, 10, 9]},
         "trl": {"step_s_rounds": [2, 2, 2]}},
        {"vary": "max_new_tokens", "value": 64, "rlvr": {"step_s_rounds": [1, 2, 1]},
         "trl": {"step_s_rounds": [1, 1, 1]}},
        {"vary": "samples_per_prompt", "value": 8, "rlvr": {"step_s_rounds": [1, 1, 1]},
         "trl": {"step_s_rounds": [1, 1, 1]}},
    ]  # fmt: skip
    growth = vs_trl.series_growth(rows)
    assert set(growth) == {"max_new_tokens"}
    lengths = growth["max_new_tokens"]
    assert (lengths["from"], lengths["to"]) == (64, 512)
    assert lengths["rlvr"]["per_round"] == [8.0, 5.0, 9.0]
    assert lengths["rlvr"]["median"] == 8.0
    assert lengths["trl"]["median"] == 2.0
