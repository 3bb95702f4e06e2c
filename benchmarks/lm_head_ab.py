"""A/B of how rlvr's policy update scores the completion tokens, rlvr alone, one GRPO mini-batch
(`update.minibatch_backward`) per fresh process, alternating, 2 threads.

Three ways, all on the fused forward and all giving the same loss and gradient (tested):

- **padded logits** (rlvr before this lever): the LM head on the real positions, the logits
  copied into the padded [rows, T, vocab] layout, then the chunked log-softmax;
- **real-row logits**: the LM head on the real positions, the chunked log-softmax on those
  [tokens, vocab] logits, the log-probs placed back;
- **no logits** (`batching.completion_token_stats`, now the default): the real positions'
  hidden states go through the head a chunk of at most 64M logits at a time, in forward and
  again in backward (`logprobs.linear_token_stats`).

Two models: the demo's tiny shape (a 100-token vocabulary) and the same layers with
Qwen2.5's 151,936-token vocabulary (tied embeddings). The mini-batch is 4 prompts × 8 samples,
48-token prompts and ragged completions of 16–`--max-len` tokens, in 4,096-token micro-batches
(the default). Reported per run: the median seconds of 3 passes after a warm-up, the peak RSS
above the RSS before the first pass, under glibc's default allocator and with its mmap
threshold at 64 KiB (`MALLOC_MMAP_THRESHOLD_`, so the peak follows the live tensors). Then,
for the tiny vocabulary, the three ways alternating in one process for 12 rounds.

    python benchmarks/lm_head_ab.py           # about 20 minutes
    python benchmarks/lm_head_ab.py --quick   # a smoke version (about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from gpu import token_batch
from step_probes import peak_rss_mb, proc_status_mb
from transformers import Qwen2Config, Qwen2ForCausalLM
from vs_trl import RESULTS_DIR

from rlvr.config import AlgorithmConfig
from rlvr.models import fused, kv_cache
from rlvr.training import batching, update
from rlvr.training.batch import RolloutBatch
from rlvr.training.batching import placed_at, shared_prefix_forward
from rlvr.training.logprobs import token_logprobs_and_entropy


def padded_logits(model, sb, temperature, with_entropy=True):
    """The token scoring of rlvr before the lever (its code, kept here for the A/B)."""
    forward = fused.FusedForward(model)

    def step(input_ids, attention_mask, position_ids, cache, keep_last, real):
        cache = cache if cache is not None else kv_cache.ConcatKV(len(forward.layers))
        if real is None:
            hidden = forward.hidden(input_ids, position_ids, attention_mask, cache)
            return forward.logits(hidden[:, -keep_last:] if keep_last else hidden), cache
        flat = fused.real_positions(real)
        hidden = forward.hidden(input_ids, position_ids, attention_mask, cache, flat)
        logits = forward.logits(hidden)
        padded = logits.new_zeros(real.numel(), logits.shape[-1]).index_copy(0, flat, logits)
        return padded.view(*real.shape, -1), cache

    logits = shared_prefix_forward(step, sb)
    lp, entropy = token_logprobs_and_entropy(
        logits, sb.completion_ids, temperature, with_entropy=with_entropy
    )
    return lp * sb.response_mask, entropy * sb.response_mask if with_entropy else entropy


def real_row_logits(model, sb, temperature, with_entropy=True):
    """The LM head and the chunked log-softmax on the real positions only."""
    hidden = shared_prefix_forward(batching.fused_hidden_step(model), sb)
    flat = fused.real_positions(sb.response_mask.bool())
    logits = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[flat])
    tokens = sb.completion_ids.reshape(-1)[flat]
    lp, entropy = token_logprobs_and_entropy(logits, tokens, temperature, with_entropy=with_entropy)
    mask = sb.response_mask
    return placed_at(lp, flat, mask), placed_at(entropy, flat, mask) if with_entropy else entropy


WAYS = {
    "padded logits": padded_logits,
    "real-row logits": real_row_logits,
    "no logits": batching.completion_token_stats,
}
VOCABS = {"tiny vocabulary": 100, "Qwen2.5 vocabulary": 151_936}
QUICK_VOCABS = {"tiny vocabulary": 100, "16k vocabulary": 16_384}


def build_model(vocab: int, quick: bool) -> torch.nn.Module:
    """The demo's layer shape (hidden 192, 4 layers) with `vocab` tokens, random init."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64 if quick else 192,
        intermediate_size=128 if quick else 576,
        num_hidden_layers=2 if quick else 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).float()


def build_batch(vocab: int, max_len: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for _ in range(4):
        prompt = torch.randint(3, vocab, (48,), generator=g).tolist()
        for _ in range(8):
            length = int(torch.randint(16, max_len + 1, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(3, vocab, (length,), generator=g).tolist())
    return token_batch(prompts, completions, 8, torch.randn(len(prompts), 1, generator=g)[:, 0])


def worker(way: str, vocab: int, max_len: int, quick: bool) -> None:
    """Time one way on one mini-batch; print a JSON line."""
    torch.set_num_threads(2)
    model = build_model(vocab, quick)
    batch = build_batch(vocab, max_len)
    settings = update.LossSettings(AlgorithmConfig(), 1.0, max_len, 4096, 0)
    update.completion_token_stats = WAYS[way]
    before = proc_status_mb("VmRSS") or 0.0
    seconds = []
    for _ in range(1 if quick else 4):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        update.minibatch_backward(model, batch, list(range(len(batch))), settings)
        seconds.append(time.perf_counter() - start)
    timed = seconds[1:] or seconds
    print(
        json.dumps({"s": statistics.median(timed), "peak_above_start_mb": peak_rss_mb() - before})
    )


def alternating(vocab: int, max_len: int, rounds: int) -> dict[str, list[float]]:
    """Seconds of each way, `rounds` rounds alternating in this process (a precise A/B where
    the differences are small: fresh processes vary by more than the tiny vocabulary's head)."""
    torch.set_num_threads(2)
    model = build_model(vocab, False)
    batch = build_batch(vocab, max_len)
    settings = update.LossSettings(AlgorithmConfig(), 1.0, max_len, 4096, 0)
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    default_way = update.completion_token_stats
    for _ in range(rounds + 1):  # the first round warms up
        for way, stats in WAYS.items():
            update.completion_token_stats = stats
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            update.minibatch_backward(model, batch, list(range(len(batch))), settings)
            seconds[way].append(time.perf_counter() - start)
    update.completion_token_stats = default_way
    return {way: s[1:] for way, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke version")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per way")
    parser.add_argument("--max-len", type=int, default=128, help="longest completion")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        way, vocab, max_len = args.worker
        worker(way, int(vocab), int(max_len), args.quick)
        return
    report: dict = {"command": " ".join(["python", "benchmarks/lm_head_ab.py", *sys.argv[1:]])}
    allocators = {"glibc default": {}, "mmap threshold 64 KiB": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
    if args.quick:
        allocators.pop("mmap threshold 64 KiB")
    for case, vocab in (QUICK_VOCABS if args.quick else VOCABS).items():
        for allocator, env in allocators.items():
            runs: dict[str, list[dict]] = {way: [] for way in WAYS}
            for _ in range(1 if args.quick else args.repeats):
                for way in WAYS:
                    command = [sys.executable, __file__, "--worker", way, str(vocab)]
                    command += [str(args.max_len)] + (["--quick"] if args.quick else [])
                    out = subprocess.run(
                        command, env={**os.environ, **env}, capture_output=True, text=True
                    )
                    if out.returncode:
                        sys.exit(out.stderr)
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    runs[way].append(row)
                    print(
                        f"{case}, {allocator}, {way}: {row['s']:.3f} s, "
                        f"peak RSS +{row['peak_above_start_mb']:.0f} MiB",
                        flush=True,
                    )
            report[f"{case}, {allocator}"] = runs
    rounds = alternating(VOCABS["tiny vocabulary"], args.max_len, 2 if args.quick else 12)
    report["tiny vocabulary, one process, alternating"] = rounds
    for way, seconds in rounds.items():
        print(f"tiny vocabulary, one process: {way}: median {statistics.median(seconds):.3f} s")
    path = RESULTS_DIR / ("lm_head_ab-quick.json" if args.quick else "lm_head_ab.json")
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
