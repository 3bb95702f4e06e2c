"""glibc malloc keeps freed activations for reuse (`rlvr.training.memory`)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr.training.memory as memory
import rlvr.training.rl as rl
import rlvr.training.sft as sft
from rlvr.config import resolve_config
from rlvr.config_offline import SFTConfig
from tiny_run import TINY_RUN

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)

FAULTS_SCRIPT = """
import json, resource
import torch
from batches import token_batch
from rlvr.config import resolve_config
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.memory import keep_freed_memory
from rlvr.training.update import LossSettings, minibatch_backward

torch.set_num_threads(2)
model = build_tiny_model(build_tiny_tokenizer(), hidden_size=192, intermediate_size=576)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(10, 100, (22,), generator=g).tolist() for _ in range(32)]
completions = [torch.randint(10, 100, (int(k),), generator=g).tolist()
               for k in torch.randint(8, 40, (256,), generator=g)]
batch = token_batch([prompts[r // 8] for r in range(256)], completions,
                    torch.arange(256) // 8, torch.randn(256, generator=g))
settings = LossSettings(resolve_config(preset="grpo").algorithm, 1.0, 40, 4096, 0)

def faults():
    counts = []
    for _ in range(10):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        minibatch_backward(model, batch, list(range(256)), settings)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sum(counts[2:])

default = faults()
kept = keep_freed_memory()
print(json.dumps({"default": default, "kept": kept, "kept_faults": faults()}))
"""


def minor_faults() -> dict:
    """Page faults of eight GRPO updates (after two of warm-up) on a learning-mode-shaped batch
    of the demo-shaped tiny model (32 prompts × 8, completions of 8–39 tokens), in a fresh
    process: first with glibc's defaults, then with the thresholds raised (one process for
    both saves a second start-up of torch and transformers, 10 s on a 2-core VM)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@glibc
def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    counts = minor_faults()
    assert counts["kept"] is True
    # By default the update's freed activations come back as fresh pages: 130k-300k faults
    # over eight updates here, against 4k-14k with the thresholds raised (once, in a full
    # suite run, 59k by default: the machine's state moves the absolute counts, so the
    # default is compared with the kept run's, 12-42 times as many in six runs; with both in one
    # process, 12-08: 129k and 199k against 9k and 0.1k)
    assert counts["kept_faults"] < 30_000
    assert counts["default"] > 4 * counts["kept_faults"]


def test_without_glibc_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert memory.keep_freed_memory() is False


@pytest.mark.parametrize("keep", [True, False])
def test_training_entry_points_follow_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keep: bool
) -> None:
    """`train` and `run_sft` tune malloc only when their config asks; the setting is read
    before the model loads, so a failing load shows whether it ran."""
    calls: list[str] = []

    def stop(*args: object, **kwargs: object) -> None:
        raise RuntimeError("stop after set-up")

    for module in (rl, sft):
        monkeypatch.setattr(module, "keep_freed_memory", lambda m=module: calls.append(m.__name__))
        monkeypatch.setattr(module, "load_model_and_tokenizer", stop)
    overrides = [*TINY_RUN, f"train.keep_freed_memory={keep}", f"train.output_dir={tmp_path}"]
    cfg = resolve_config(overrides=overrides)
    with pytest.raises(RuntimeError, match="stop after set-up"):
        rl.train(cfg, show_progress=False)
    sft_cfg = SFTConfig.model_validate(
        {"sft": {"keep_freed_memory": keep, "output_dir": str(tmp_path / "sft")}}
    )
    with pytest.raises(RuntimeError, match="stop after set-up"):
        sft.run_sft(sft_cfg, show_progress=False)
    assert calls == (["rlvr.training.rl", "rlvr.training.sft"] if keep else [])
