"""Memory and time of a training step under torchrun: weights replicated (AdamW state too, or
sharded: ZeRO stage 1, `train.shard_optimizer`) or sharded with FSDP2 (`train.fsdp`), whose
update runs rlvr's fused forward, with the layers' weights freed after each pass or, in the
`fsdp_kept` arm, kept whole through the update (`train.fsdp_reshard_after_forward=false`), or,
in the `fsdp_transformers` arm, the `transformers` forward (as the sharded update did until the
twenty-first session).

    python benchmarks/fsdp.py [--ranks 2] [--rounds 2] [--steps 4] [--rows 4] [--tokens 128]
        [--shortest 0] [--hidden 768] [--layers 12] [--intermediate 2048]

Each round launches `torchrun --standalone --nproc_per_node=RANKS` of this script once per arm,
`replicated`, `zero1`, `fsdp`, `fsdp_kept`, `fsdp_transformers`. Every rank builds the tiny
Llama at the given shape (random initialisation, fp32; about 85M parameters at the defaults)
and runs STEPS steps the way `rlvr train` runs one on its share, on ROWS random samples of a
32-token prompt and a TOKENS - 32 token completion: their completion log-probs without
gradients on the whole weights (the rollout and scoring phase, `sharding.full_weights`), then
with gradients (`completion_token_stats`, the update's forward; loss: the mean NLL) and
backward, with `train.fsdp`'s gradient handling or the replicated gradient sum, clipping to
norm 1 and `build_optimizer`'s AdamW step. With `--shortest N` each completion's length is
drawn from N to TOKENS - 32 (padding, as in RL batches; results/fsdp_shortest<N>.json).

Reported per arm and rank: the bytes of weights, gradients and AdamW state the rank keeps
between steps, its peak RSS (VmHWM: the whole process, the interpreter and activations
included; glibc's mmap threshold is fixed, so that freed tensors leave the RSS), and the
median over steps 2.. of the no-gradient forward and of the update (forward, backward,
gradient sum, clip, step). Results go to benchmarks/results/fsdp.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from sharded_optimizer import arms_parser, peak_rss_mib, run_rounds, shaped_model
from torch.distributed.tensor import DTensor

from rlvr.models import fused
from rlvr.training import sharding
from rlvr.training.batching import collate_shared_prefix, completion_token_stats
from rlvr.training.distributed import data_parallel
from rlvr.training.optim import build_optimizer

RESULTS = Path(__file__).parent / "results" / "fsdp.json"
ARMS = ("replicated", "zero1", "fsdp", "fsdp_kept", "fsdp_transformers")
PROMPT_TOKENS = 32


def kept_mib(tensors: list[torch.Tensor]) -> float:
    """The bytes this rank holds of `tensors` (its shard of a sharded one), in MiB."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local) / 2**20


def rank_main(args: argparse.Namespace) -> None:
    """One rank of one arm: the steps, then rank 0 prints every rank's figures as JSON."""
    with data_parallel(torch.device("cpu")) as ranks:
        model = shaped_model(args)
        if args.arm.startswith("fsdp"):
            sharding.shard(model, ranks, reshard_after_forward=args.arm != "fsdp_kept")
        optimizer = build_optimizer(model, 1e-4, shard=args.arm == "zero1")
        vocab = model.config.vocab_size
        scoring_s, update_s = [], []
        for step in range(args.steps):
            generator = torch.Generator().manual_seed(1000 * step + ranks.rank)
            tokens = torch.randint(vocab, (args.rows, args.tokens), generator=generator)
            prompts = tokens[:, :PROMPT_TOKENS].tolist()
            longest = args.tokens - PROMPT_TOKENS
            lengths = torch.randint(
                args.shortest or longest, longest + 1, (args.rows,), generator=generator
            )
            completions = [
                row[PROMPT_TOKENS : PROMPT_TOKENS + n]
                for row, n in zip(tokens.tolist(), lengths.tolist())
            ]
            batch = collate_shared_prefix(prompts, completions, list(range(args.rows)), 0)
            t0 = time.perf_counter()
            with sharding.full_weights(model), torch.no_grad():
                completion_token_stats(model, batch, 1.0, with_entropy=False)
            t1 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            sharding.sync_gradients(model, last=True)
            setattr(model, fused.ENABLE_ATTR, args.arm != "fsdp_transformers")  # as before 11-28
            logprobs, _ = completion_token_stats(model, batch, 1.0, with_entropy=False)
            setattr(model, fused.ENABLE_ATTR, True)
            (-logprobs.sum() / batch.response_mask.sum()).backward()
            sharding.sum_gradients(model, ranks)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            t2 = time.perf_counter()
            scoring_s.append(t1 - t0)
            update_s.append(t2 - t1)
        kept = getattr(optimizer, "optim", optimizer)  # a ZeRO-1 optimizer's own part
        params = list(model.parameters())
        state = [v for s in kept.state.values() for v in s.values() if v.dim()]
        mine = {
            "weights_mib": kept_mib(params),
            "grads_mib": kept_mib([p.grad for p in params]),
            "state_mib": kept_mib(state),
            "peak_rss_mib": peak_rss_mib(),
            "scoring_s": statistics.median(scoring_s[1:]),
            "update_s": statistics.median(update_s[1:]),
        }
        everyone = ranks.gather(mine)
        if ranks.main:
            total = sum(p.numel() for p in params)  # a DTensor counts its whole tensor
            print(json.dumps({"parameters": total, "ranks": everyone}))


def main() -> None:
    parser = arms_parser(__doc__, ARMS, steps=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--shortest", type=int, default=0)
    args = parser.parse_args()
    if args.arm:
        rank_main(args)
        return

    def line(result: dict, r: dict) -> str:
        return (
            f"weights {r['weights_mib']:6.1f}, grads {r['grads_mib']:6.1f}, AdamW state "
            f"{r['state_mib']:6.1f} MiB; peak RSS {r['peak_rss_mib']:7.1f} MiB; no-grad forward "
            f"{r['scoring_s']:.3f} s, update {r['update_s']:.3f} s"
        )

    keys = ("steps", "rows", "tokens", "shortest", "hidden", "layers", "intermediate")
    results = RESULTS.with_stem(f"fsdp_shortest{args.shortest}") if args.shortest else RESULTS
    # glibc keeps freed blocks up to a threshold it raises as large tensors are freed, so RSS
    # would count memory no tensor holds; a fixed threshold returns every large block at once
    run_rounds(__file__, ARMS, args, keys, line, results, {"MALLOC_MMAP_THRESHOLD_": "131072"})


if __name__ == "__main__":
    main()
