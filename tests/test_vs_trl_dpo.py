"""`benchmarks/vs_trl_dpo.py`'s rlvr arm, run as the benchmark runs it (a fresh worker process
with its slot counter on rlvr's embedding): it must keep up with `rlvr dpo`'s signatures."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
vs_trl_dpo = pytest.importorskip("vs_trl_dpo")


def test_the_rlvr_arm_trains_and_counts_each_prompt_once(tmp_path):
    """2 steps of 8 pairs from a random tiny model: the first loss is log 2 (the policy is its
    reference), and the training forwards hold each pair's prompt once and its two responses
    with their EOS, packed: within a few percent of that count (the prompts' own pass pads to
    the longest prompt of a micro-batch)."""
    from rlvr.models.loading import load_pretrained, save_pretrained
    from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, intermediate_size=64)
    save_pretrained(model, tokenizer, tmp_path / "init")
    pairs = tmp_path / "pairs.jsonl"
    vs_trl_dpo.write_pairs(pairs, 16)
    spec = vs_trl_dpo.RunSpec(
        framework="rlvr",
        model_dir=str(tmp_path / "init"),
        pairs_path=str(pairs),
        output_dir=str(tmp_path / "run"),
        result_path=str(tmp_path / "result.json"),
        steps=2,
        batch_size=8,
        lr=1e-3,
    )
    result = vs_trl_dpo.launch(spec, tmp_path)
    assert len(result["step_s"]) == 2 and result["loss"][0] == pytest.approx(math.log(2))
    _, tok = load_pretrained(str(tmp_path / "init"))
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    tokens = sum(
        len(tok(r["prompt"])["input_ids"])
        + len(tok(r["chosen"], add_special_tokens=False)["input_ids"])
        + len(tok(r["rejected"], add_special_tokens=False)["input_ids"])
        + 2
        for r in rows
    )
    assert tokens <= result["train_slots"] < 1.05 * tokens
    summary = vs_trl_dpo.summarize(result, 16)
    assert summary["other_s"] > 0 and summary["step_s"] > 0
