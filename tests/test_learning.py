"""Integration: the demo pipeline (SFT -> eval -> GRPO -> eval) must learn, not merely run.

About four minutes on 2 CPU cores: the longest test of the suite, and the one that shows that
rewards, advantages, losses, the optimizer and the rollout engine fit together.
"""

import json

from rlvr.demo import run_demo
from rlvr.tracking.jsonl import read_jsonl


def test_grpo_raises_held_out_pass_at_1(tmp_path):
    summary = run_demo(tmp_path, sft_steps=600, rl_steps=60, eval_problems=200)
    gain = summary["after"]["pass@1"] - summary["before"]["pass@1"]
    assert gain >= 0.05, summary
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    stages = [row["stage"] for row in read_jsonl(tmp_path / "eval.jsonl")]
    assert stages == ["before_rl", "after_rl"]
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    metrics = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    first, last = metrics[:10], metrics[-10:]
    assert sum(m["accuracy"] for m in last) > sum(m["accuracy"] for m in first)
