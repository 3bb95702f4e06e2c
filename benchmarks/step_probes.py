"""What `vs_trl.py`'s workers measure besides time, for either framework: token slots and the
share of them spent on padding (`ForwardCounter`), peak memory (`peak_rss_mb`), and the dense
reward of `--reward dense` (`digit_share`, named `step_probes:digit_share` in rlvr's config).
Also imported by the A/B scripts that run one piece alone (`lm_head_ab.py`)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import torch


def digit_share(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """The dense reward (`--reward dense`): the share of digits in the completion. It differs
    between the samples of a group, so no group has all-zero advantages and both frameworks
    train on every sample (with the task's verifier a random model scores 0 almost everywhere,
    and rlvr skips those samples)."""
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]


class ForwardCounter:
    """Token slots of the rollout and training forwards, and how many of them were wasted.

    A forward pre-hook on the input embedding counts slots (rlvr's lean forward does not call
    the model's own `forward`, but both frameworks embed the tokens). Before the embedding
    runs, the caller's mask over the positions is handed over with `expect_mask`: a forward
    pre-hook on the model does it for TRL (its `attention_mask`), a wrapper around
    `FusedForward.hidden` for rlvr (its key mask; a padding-free call embeds real tokens only).
    A slot is wasted when it holds padding (mask 0 at an input position) or, in a decode step,
    a row that has already produced EOS (TRL keeps finished rows in the batch and feeds them
    padding; rlvr drops them). Wasted / all slots is the padding-waste fraction.
    """

    def __init__(self, eos_ids: list[int]) -> None:
        self.eos_ids = torch.tensor(eos_ids)
        self.slots = {"rollout": 0, "train": 0}
        self.wasted = {"rollout": 0, "train": 0}
        self.mask: torch.Tensor | None = None
        self.finished: torch.Tensor | None = None

    def expect_mask(self, mask: torch.Tensor | None) -> None:
        """The [b, s] mask (1 = real token) whose last positions the next embedding call gets."""
        self.mask = mask

    def model_pre_hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        """`register_forward_pre_hook(..., with_kwargs=True)` on a `transformers` model."""
        self.expect_mask(kwargs.get("attention_mask"))

    def __call__(self, module: Any, args: tuple) -> None:
        ids, mask = args[0], self.mask
        self.mask = None
        phase = "train" if torch.is_grad_enabled() else "rollout"
        self.slots[phase] += ids.numel()
        if ids.dim() != 2:  # padding-free: only real tokens
            return
        rows, width = ids.shape
        if mask is not None:
            self.wasted[phase] += int((mask[:, -width:] == 0).sum())
        if phase == "train":
            return
        if width > 1 or self.finished is None or len(self.finished) != rows:
            self.finished = torch.zeros(rows, dtype=torch.bool)  # a new rollout (or fewer rows)
            if width > 1:
                return
        self.finished |= torch.isin(ids[:, 0].cpu(), self.eos_ids)
        self.wasted[phase] += int(self.finished.sum())

    def report(self, completion_tokens: float) -> dict[str, float]:
        """Slots per generated completion token, and the padding-waste fractions."""
        out = {}
        for phase in ("train", "rollout"):
            out[f"{phase}_slots_per_token"] = self.slots[phase] / max(completion_tokens, 1)
            out[f"{phase}_padding_frac"] = self.wasted[phase] / max(self.slots[phase], 1)
        return out


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB.

    Linux: ``VmHWM``, the high-water mark of this program's own memory. ``ru_maxrss`` is not
    used there because it also keeps the parent's resident size at fork time (the kernel carries
    it over ``execve``), so a light child of a heavy parent would report the parent's peak.
    """
    peak = proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, else KiB


def proc_status_mb(key: str) -> float | None:
    """A memory line of Linux's /proc/self/status (``VmRSS``, ``VmHWM``, ...) in MiB; None
    elsewhere."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    return None
