"""The optimizer's memory and time under torchrun, its state replicated or sharded over the
ranks (`train.shard_optimizer`: ZeRO stage 1).

    python benchmarks/sharded_optimizer.py [--ranks 2] [--rounds 2] [--steps 6]
        [--hidden 768] [--layers 12] [--intermediate 2048]

Each round launches `torchrun --standalone --nproc_per_node=RANKS` of this script once per arm,
`replicated` then `sharded`. Every rank builds the tiny Llama at the given shape (random
initialisation, fp32; about 85M parameters at the defaults) and runs STEPS optimizer steps
the way `rlvr train` ends one: gradients (random, the same on every rank) summed over the
ranks, clipped to norm 1, then `build_optimizer`'s AdamW steps. Reported per arm: the
optimizer-state bytes each rank keeps, each rank's peak RSS (VmHWM, the whole process: weights,
gradients, state and the interpreter), the median over steps 2.. of the optimizer step alone
and of the gradient sum + clip + step, and whether the ranks' weights agree at the end.
Results go to benchmarks/results/sharded_optimizer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.training.distributed import data_parallel
from rlvr.training.optim import build_optimizer

RESULTS = Path(__file__).parent / "results" / "sharded_optimizer.json"
ARMS = ("replicated", "sharded")


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def shaped_model(args: argparse.Namespace) -> torch.nn.Module:
    """The tiny Llama at the arguments' shape (64-wide heads), seeded 0, fp32."""
    torch.manual_seed(0)
    return build_tiny_model(
        build_tiny_tokenizer(),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        intermediate_size=args.intermediate,
    )


def rank_main(args: argparse.Namespace) -> None:
    """One rank of one arm: the steps, then rank 0 prints every rank's figures as JSON."""
    with data_parallel(torch.device("cpu")) as ranks:
        model = shaped_model(args)
        params = list(model.parameters())
        optimizer = build_optimizer(model, 1e-4, shard=args.arm == "sharded")
        step_s, update_s = [], []
        for step in range(args.steps):
            generator = torch.Generator().manual_seed(step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=generator)
            t0 = time.perf_counter()
            ranks.sum_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            t1 = time.perf_counter()
            optimizer.step()
            t2 = time.perf_counter()
            step_s.append(t2 - t1)
            update_s.append(t2 - t0)
        kept = getattr(optimizer, "optim", optimizer)  # a sharded optimizer's own part
        state_bytes = sum(
            v.numel() * v.element_size()
            for s in kept.state.values()
            for v in s.values()
            if torch.is_tensor(v)
        )
        weights = torch.cat([p.detach().flatten() for p in params])
        mine = {
            "state_mib": state_bytes / 2**20,
            "peak_rss_mib": peak_rss_mib(),
            "step_s": statistics.median(step_s[1:]),
            "update_s": statistics.median(update_s[1:]),
            "weights": weights,
        }
        everyone = ranks.gather(mine)
        if ranks.main:
            in_sync = all(torch.equal(r.pop("weights"), weights) for r in everyone)
            result = {"parameters": weights.numel(), "in_sync": in_sync, "ranks": everyone}
            print(json.dumps(result))


def launch(
    script: str, arm: str, args: argparse.Namespace, keys: tuple[str, ...], env: dict[str, str]
) -> dict:
    """One `torchrun --nproc_per_node=args.ranks` of `script`'s `arm`, passing on `args`'
    `keys`, one thread a rank, `env` added to the environment; rank 0's JSON line."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={args.ranks}", script, "--arm", arm]
    for key in keys:
        command += [f"--{key}", str(getattr(args, key))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_rounds(
    script: str,
    arms: tuple[str, ...],
    args: argparse.Namespace,
    keys: tuple[str, ...],
    line: Callable[[dict, dict], str],
    results: Path,
    env: dict[str, str] | None = None,
) -> None:
    """`args.rounds` rounds of every arm in turn (`launch`); print `line(arm's result, rank's
    figures)` for each rank and write every round's results to `results`."""
    rounds = []
    for round_ in range(args.rounds):
        rounds.append({arm: launch(script, arm, args, keys, env or {}) for arm in arms})
        for arm, result in rounds[-1].items():
            for rank, r in enumerate(result["ranks"]):
                print(f"round {round_} {arm:10s} rank {rank}: {line(result, r)}", flush=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1) + "\n")
    print(f"wrote {results}")


def arms_parser(doc: str, arms: tuple[str, ...], steps: int) -> argparse.ArgumentParser:
    """The arguments of a benchmark of torchrun arms at a tiny-Llama shape (85M parameters
    by default); `--arm` is the one a rank runs."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--arm", choices=arms, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = arms_parser(__doc__, ARMS, steps=6).parse_args()
    if args.arm:
        rank_main(args)
        return

    def line(result: dict, r: dict) -> str:
        return (
            f"state {r['state_mib']:7.1f} MiB, peak RSS {r['peak_rss_mib']:7.1f} MiB, optimizer "
            f"step {r['step_s']:.3f} s, sum + clip + step {r['update_s']:.3f} s, in sync "
            f"{result['in_sync']}"
        )

    keys = ("steps", "hidden", "layers", "intermediate")
    run_rounds(__file__, ARMS, args, keys, line, RESULTS)


if __name__ == "__main__":
    main()
