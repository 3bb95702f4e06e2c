"""A/B of rlvr's code at a git revision against the working tree, on one piece of a step, in
fresh processes alternating (2 threads), on the demo-shaped tiny model.

Each run imports rlvr from one of the two trees (`REV`'s `src/`, exported with `git archive`,
or this checkout's), times the case, and prints its seconds; the runs alternate
revision / working tree. Cases:

- `update`: one GRPO mini-batch of the dense systems-mode batch (16 prompts × 8 samples,
  18-token prompts, 64-token completions, one advantage per sample, none zero), i.e.
  `minibatch_backward` on 4,096-token micro-batches, gradient clipping and an AdamW step;
- `update-ragged`: the same on a learning-mode-shaped batch (32 prompts × 8 samples,
  22-token prompts, completions of 8–39 tokens);
- `update-long`: the same on the scaling benchmark's longest batch (4 prompts × 8 samples,
  18-token prompts, 512-token completions), where attention is a third of the update;
- `rollout`: sampling 8 completions of 64 forced tokens for each of 16 prompts;
- `rollout-ragged`: the same with two frequent tokens ending completions, so that rows
  finish at many steps (`fused_ab.decode_cases`);
- `rollout-long`: 8 completions of 512 forced tokens for each of 4 prompts (the scaling
  benchmark's longest rollout, whose decode cache no longer fits the L3 cache);
- `host-turn`: the engine's own work between decode steps (reading the tokens, dropping
  finished rows, drawing the uniforms), with a decoder that computes nothing: 64 prompts × 8
  samples, up to 256 tokens, each row ending with probability 1/64 per step. On a GPU this
  is time the GPU waits unless the steps overlap it.

Reported per run: the median of `--passes` passes after two warm-up passes; then each side's
median over the runs and the median of the paired speed-ups (revision / working tree), also
written to `results/revision_ab-<case>-vs-<commit>.json` (`revision_ab-<case>.json` before
lever 18).

    python benchmarks/revision_ab.py --against HEAD --case update
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_DIR = HERE / "results"


def update_case(ragged: bool = False, long: bool = False):
    """A function running one GRPO mini-batch update of the dense systems-mode batch, or with
    `ragged`, of a learning-mode-shaped one (32 prompts × 8, 22-token prompts, 8–39 tokens),
    or with `long`, of the scaling benchmark's L = 512 one (4 prompts × 8, 512 tokens)."""
    import torch
    from gpu import token_batch

    from rlvr.config import resolve_config
    from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
    from rlvr.training.optim import build_optimizer
    from rlvr.training.update import LossSettings, minibatch_backward

    model = build_tiny_model(
        build_tiny_tokenizer(), hidden_size=192, intermediate_size=576, num_layers=4
    )
    g = torch.Generator().manual_seed(1)
    prompts, group, length, prompt_length = (
        (32, 8, 40, 22) if ragged else (4, 8, 512, 18) if long else (16, 8, 64, 18)
    )
    prompt_ids = [
        torch.randint(10, 100, (prompt_length,), generator=g).tolist() for _ in range(prompts)
    ]
    lengths = [
        int(torch.randint(8, length, (1,), generator=g)) if ragged else length
        for _ in range(prompts * group)
    ]
    completions = [torch.randint(10, 100, (k,), generator=g).tolist() for k in lengths]
    advantages = torch.randn(prompts * group, generator=g)
    rows = list(range(prompts * group))
    batch = token_batch([prompt_ids[r // group] for r in rows], completions, group, advantages)
    settings = LossSettings(resolve_config(preset="grpo").algorithm, 1.0, length, 4096, 0)
    optimizer = build_optimizer(model, 1e-4, 0.0, (0.9, 0.999))

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        minibatch_backward(model, batch, rows, settings)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return run


def rollout_case(ragged: bool = False, long: bool = False):
    """A function sampling the systems-mode rollout (16 prompts × 8, 64 forced tokens), or with
    `ragged`, the same with two frequent tokens ending completions (rows finish at many
    steps), or with `long`, 4 prompts × 8 with 512 forced tokens."""
    import torch
    from fused_ab import decode_cases, demo_setup

    from rlvr.rollout.base import SamplingParams
    from rlvr.rollout.hf import HFRolloutEngine

    tok, model, prompts = demo_setup()
    eos, params = decode_cases(tok)["rows finish at many steps" if ragged else "64 forced tokens"]
    if long:
        prompts, params = prompts[:4], SamplingParams(n=8, max_new_tokens=512, min_new_tokens=512)
    engine = HFRolloutEngine(model, eos, tok.pad_token_id, generator=torch.Generator())
    return lambda: engine.generate(prompts, params)


class IdleDecoder:
    """A decoder that computes nothing: token 7, or EOS (id 1) with probability 1/64, per row
    and step, from its own generator; log-probs zero."""

    def __init__(self, *args) -> None:
        import torch

        self.generator = torch.Generator().manual_seed(0)

    def prefill(self, input_ids, attention_mask, position_ids):
        import torch

        return torch.zeros(input_ids.shape[0], 8)

    def select(self, rows) -> None:
        """Nothing to keep."""

    def next_tokens(self, token, attention_mask, position, draw):
        import torch

        ends = torch.rand(token.shape[0], generator=self.generator) < 1 / 64
        return torch.where(ends, 1, 7), torch.zeros(token.shape[0])


def host_turn_case():
    """A function running a rollout of 512 rows and up to 256 tokens through `IdleDecoder`."""
    import torch

    from rlvr.rollout import hf
    from rlvr.rollout.base import SamplingParams

    hf.HFDecoder = IdleDecoder  # the decoder the engine picks for a model that is not a Llama
    engine = hf.HFRolloutEngine(torch.nn.Linear(1, 1), [1], 0, generator=torch.Generator())
    prompts = [[5, 6, 7]] * 64
    params = SamplingParams(n=8, max_new_tokens=256)
    return lambda: engine.generate(prompts, params)


CASES = {
    "update": update_case,
    "update-ragged": lambda: update_case(ragged=True),
    "update-long": lambda: update_case(long=True),
    "rollout": rollout_case,
    "rollout-ragged": lambda: rollout_case(ragged=True),
    "rollout-long": lambda: rollout_case(long=True),
    "host-turn": host_turn_case,
}


def worker(case: str, passes: int) -> None:
    """Time `case` in this process and print {"seconds": ..., "rlvr": path} as JSON."""
    import torch

    import rlvr

    torch.set_num_threads(2)
    torch.manual_seed(0)
    run = CASES[case]()
    for _ in range(2):
        run()
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "rlvr": rlvr.__file__}))


def timed_run(src: Path, case: str, passes: int) -> float:
    """Seconds of one fresh worker process importing rlvr from `src`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    env["OMP_NUM_THREADS"] = "2"
    command = [sys.executable, __file__, "--worker", "--case", case, "--passes", str(passes)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not result["rlvr"].startswith(str(src)):
        raise SystemExit(f"the worker imported {result['rlvr']}, not rlvr from {src}")
    return result["seconds"]


def export_src(revision: str, into: Path) -> Path:
    """`revision`'s `src/` tree, exported with `git archive` under `into`."""
    archive = subprocess.run(
        ["git", "archive", revision, "src"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def short_commit(revision: str) -> str:
    """The abbreviated commit hash of `revision`."""
    return subprocess.run(
        ["git", "rev-parse", "--short", revision],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def alternate(against: str, run: Callable[[Path], float], rounds: int) -> dict:
    """`run(src)` (seconds of one fresh process importing rlvr from `src`) for `against`'s
    `src/` and the working tree's, alternating, `rounds` times each, printing every round;
    returns the seconds, each side's median and the median of the paired speed-ups."""
    with tempfile.TemporaryDirectory(prefix="revision-ab-") as tmp:
        trees = {against: export_src(against, Path(tmp)), "working tree": REPO / "src"}
        seconds: dict[str, list[float]] = {name: [] for name in trees}
        for round_ in range(rounds):
            for name, src in trees.items():
                seconds[name].append(run(src))
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{name} {s[-1]:.3f} s" for name, s in seconds.items()),
                flush=True,
            )
    base, new = seconds.values()
    return {
        "against": against,
        "against_commit": short_commit(against),
        "seconds": seconds,
        "medians": {name: statistics.median(s) for name, s in seconds.items()},
        "speedup (paired median)": statistics.median(b / n for b, n in zip(base, new)),
    }


def publish(label: str, report: dict, name: str) -> None:
    """Print an `alternate` report's medians and speed-up under `label`; write it to
    `results/<name>`."""
    against = report["against"]
    print(
        f"{label}: {against} {report['medians'][against]:.3f} s, working tree "
        f"{report['medians']['working tree']:.3f} s, paired speed-up "
        f"{report['speedup (paired median)']:.3f}x"
    )
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / name).write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", metavar="REV", help="the baseline revision")
    parser.add_argument("--case", choices=sorted(CASES), default="update")
    parser.add_argument("--rounds", type=int, default=6, help="alternating runs per side")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.case, args.passes)
        return
    report = {
        "case": args.case,
        "command": " ".join(["python benchmarks/revision_ab.py", *sys.argv[1:]]),
        **alternate(args.against, lambda src: timed_run(src, args.case, args.passes), args.rounds),
    }
    publish(args.case, report, f"revision_ab-{args.case}-vs-{report['against_commit']}.json")


if __name__ == "__main__":
    main()
