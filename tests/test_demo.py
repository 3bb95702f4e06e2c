"""`rlvr demo` end to end at a reduced size: every stage runs and writes its files.

That RL from the demo's cold start really learns is tested per preset, from the same SFT model,
in `test_learning_presets.py`; the full-size demo's numbers are in the README.
"""

import json

from rlvr.demo import run_demo
from rlvr.run_layout import STATE_FILE
from rlvr.tracking.jsonl import read_jsonl


def test_demo_pipeline_writes_summary_eval_and_report(tmp_path):
    earlier = tmp_path / "rl" / "checkpoints" / "step-5"  # an earlier, longer demo's last one
    earlier.mkdir(parents=True)
    (earlier / STATE_FILE).write_bytes(b"")
    summary = run_demo(tmp_path, sft_steps=20, rl_steps=2, eval_problems=10)
    assert set(summary["before"]) == set(summary["after"])
    assert {"pass@1", "pass@8", "maj@8"} <= set(summary["after"])
    assert 0.0 <= summary["after"]["pass@1"] <= 1.0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    rows = read_jsonl(tmp_path / "eval.jsonl")
    assert [row["stage"] for row in rows] == ["before_rl", "after_rl"]
    assert rows[1]["model"] == str(tmp_path / "rl" / "checkpoints" / "step-2")  # this run's
    assert not earlier.exists()  # a rerun starts over
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert [m["step"] for m in read_jsonl(tmp_path / "rl" / "metrics.jsonl")] == [1, 2]
