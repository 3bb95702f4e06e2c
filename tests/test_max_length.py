"""`sft.max_length` and `dpo.max_length` (TRL's max_length, keep_start): responses are cut from
their end to fit with their prompt; an example whose prompt leaves no room is left out, with a
warning; nothing left is an error naming the key."""

import json
from pathlib import Path

import pytest

from rlvr.config import ConfigError
from rlvr.config_offline import SFTConfig
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import sft as sft_module
from rlvr.training.pairs import PairTokens
from rlvr.training.preference import run_dpo
from rlvr.training.sft import run_sft
from rlvr.training.supervised import cut_to_length, keep_start
from test_dpo import file_config


def test_keep_start_cuts_the_response_end_and_never_the_prompt():
    prompt = [1, 2, 3]
    assert keep_start(prompt, [[4, 5, 6, 7], [8]], 5) == [[4, 5], [8]]
    assert keep_start(prompt, [[4, 5, 6, 7]], None) == [[4, 5, 6, 7]]
    assert keep_start(prompt, [[4]], 4) == [[4]]
    assert keep_start(prompt, [[4]], 3) is None  # no room for one response token


def test_cut_to_length_leaves_out_prompts_with_no_room_and_warns():
    prompts = [[1, 2], [1, 2, 3, 4, 5], [1]]
    responses = [[[6, 7, 8]], [[9]], [[6]]]
    with pytest.warns(UserWarning, match=r"x\.max_length=4: 1 response\(s\) cut to fit; 1 of 3"):
        kept, cut = cut_to_length(prompts, responses, 4, "x.max_length")
    assert kept == [0, 2] and cut == [[[6, 7]], [[6]]]
    pairs = PairTokens([[1, 2], [1, 2, 3, 4]], [[5, 6, 7], [8]], [[9], [10, 11]])
    with pytest.warns(UserWarning, match="1 response"):
        short = pairs.cut(4, "dpo.max_length")
    assert (short.prompts, short.chosen, short.rejected) == ([[1, 2]], [[5, 6]], [[9]])
    assert pairs.cut(None, "dpo.max_length") == pairs


def solutions_file(path: Path) -> Path:
    rows = [{"prompt": f"Add {i} and {i}.", "solution": "x" * (10 + i)} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_config(tmp_path, **sft) -> SFTConfig:
    data = solutions_file(tmp_path / "sft.jsonl")
    return SFTConfig.model_validate(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
            "data": {"task": "file", "path": str(data), "test_size": 2, "template": "none",
                     "answer_column": None, "solution_column": "solution"},
            "sft": {"steps": 2, "batch_size": 4, "output_dir": str(tmp_path / "run"), **sft},
        }
    )  # fmt: skip


def test_sft_trains_on_the_solutions_cut_to_max_length(tmp_path, monkeypatch):
    seen = []
    backward = sft_module.sft_backward

    def recording(model, prompts, targets, *args, **kwargs):
        seen.append((prompts, targets))
        return backward(model, prompts, targets, *args, **kwargs)

    monkeypatch.setattr(sft_module, "sft_backward", recording)
    run_sft(sft_config(tmp_path), show_progress=False)
    full = [len(p) + len(t) for p, t in zip(*seen[0], strict=True)]
    seen.clear()
    with pytest.warns(UserWarning, match=r"sft\.max_length=24: \d+ response\(s\) cut"):
        run_sft(sft_config(tmp_path, max_length=24), show_progress=False)
    prompts, targets = seen[0]
    assert max(full) > 24 and len(prompts) == len(full)
    assert all(len(p) + len(t) <= 24 for p, t in zip(prompts, targets, strict=True))
    assert sum(len(p) + len(t) == 24 for p, t in zip(prompts, targets, strict=True)) > 0
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    with pytest.raises(ConfigError, match=r"sft\.max_length=4 leaves no room for any solution"):
        run_sft(sft_config(tmp_path, max_length=4), show_progress=False)


def test_dpo_max_length_cuts_the_file_pairs_or_names_the_key(tmp_path):
    cfg = file_config(tmp_path, "dpo", "dpo.max_length=40", "dpo.steps=2")
    with pytest.warns(UserWarning, match=r"dpo\.max_length=40: \d+ response\(s\) cut"):
        run_dir = run_dpo(cfg, show_progress=False)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    cfg = file_config(tmp_path, "dpo", "dpo.max_length=3")
    with pytest.raises(ConfigError, match=r"dpo\.max_length=3 leaves no room for any response"):
        run_dpo(cfg, show_progress=False)
