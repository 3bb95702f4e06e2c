"""Checkpoint helpers alone: the RNG states, the write through a temporary folder, pruning."""

import random

import numpy as np
import pytest
import torch

from rlvr.run_layout import STATE_FILE
from rlvr.training import checkpoint as ckpt


def test_restore_rng_state_restores_every_generator():
    state = ckpt.rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_a_checkpoint_that_fails_midway_leaves_no_step_folder(tmp_path, monkeypatch):
    seen = []

    def failing_save(model, tokenizer, folder, weights):
        seen.append(folder.name)
        (folder / "model.safetensors").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_pretrained", failing_save)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, 3, None, None, {})
    assert seen == [".step-3.tmp"]
    assert not (tmp_path / "checkpoints" / "step-3").exists()


def test_prune_ignores_incomplete_folders(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        (folder / f"step-{step}").mkdir(parents=True)
        if step != 4:  # step-4 has no trainer state: not a checkpoint, neither kept nor counted
            (folder / f"step-{step}" / STATE_FILE).write_bytes(b"x")
    assert [p.name for p in ckpt.prune_checkpoints(tmp_path, 2)] == ["step-1"]
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-3", "step-4"]
