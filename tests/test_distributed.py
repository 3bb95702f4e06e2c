"""Data parallelism: the ranks' split of the work (by hand); the update's rank invariance
(DESIGN's invariance tests: the same loss, gradient and scores under torchrun with 3 ranks as
in one process); `rlvr train` under torchrun end to end (one run directory, replicas in sync,
resume on the same trajectory); and `rlvr sft` and `rlvr dpo` on 2 ranks, which end with the
one-process model."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dp_cases import (
    CASES,
    fsdp_results,
    held_out_scores,
    sharded_adamw_steps,
    small_model,
    two_layers,
    update_results,
)
from rlvr.cli import app
from rlvr.config import PREFERENCE_PRESETS, ConfigError, resolve_config
from rlvr.config_offline import DPOConfig, SFTConfig
from rlvr.models.loading import load_pretrained
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import rl
from rlvr.training.checkpoint import load_trainer_state
from rlvr.training.distributed import ONE_PROCESS, Ranks, _buckets, data_parallel, rank_state
from rlvr.training.preference import run_dpo
from rlvr.training.sft import run_sft
from tiny_run import TINY_RUN

TESTS = Path(__file__).parent


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=nproc *args` on the CPU, one thread a rank."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, f"--nproc_per_node={nproc}", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=TESTS,
    )


def test_chunks_split_the_prompts_in_order_and_differ_by_at_most_one():
    assert [Ranks(r, 4).chunk(10) for r in range(4)] == [
        range(0, 3),
        range(3, 6),
        range(6, 8),
        range(8, 10),
    ]
    assert ONE_PROCESS.chunk(5) == range(0, 5)


def test_share_deals_whole_groups_largest_first_to_the_least_loaded_rank():
    # group 0: rows 0-2 (5 tokens each, 15); group 1: rows 3-4 (20); group 2: row 5 (4);
    # group 3: rows 6-7 (6). LPT: g1 -> rank 0 (20), g0 -> rank 1 (15), g3 -> rank 1 (21),
    # g2 -> rank 0 (24).
    groups = [0, 0, 0, 1, 1, 2, 3, 3]
    costs = [5, 5, 5, 10, 10, 4, 3, 3]
    rows = [7, 3, 0, 5, 1, 4, 2, 6]
    shares = [Ranks(r, 2).share(rows, groups, costs) for r in range(2)]
    assert shares == [[3, 5, 4], [7, 0, 1, 2, 6]]
    assert ONE_PROCESS.share(rows, groups, costs) == rows


def test_share_deals_single_rows_when_there_are_fewer_groups_than_ranks():
    groups, costs = [0, 0, 0, 1, 1], [9, 2, 4, 7, 3]
    # rows by cost: 0 (9) -> r0, 3 (7) -> r1, 2 (4) -> r2, 4 (3) -> r2 (7), 1 (2) -> r1 (9).
    shares = [Ranks(r, 3).share(range(5), groups, costs) for r in range(3)]
    assert shares == [[0], [1, 3], [2, 4]]


def test_gradient_buckets_keep_one_dtype_and_a_size_limit():
    tensors = [torch.zeros(3), torch.zeros(4), torch.zeros(9), torch.zeros(2, dtype=torch.float64)]
    sizes = [[t.numel() for t in bucket] for bucket in _buckets(tensors, 8)]
    assert sizes == [[3, 4], [9], [2]]


def test_a_checkpoint_resumes_only_with_its_number_of_ranks(tmp_path):
    state = {"generator": "g", "rng": "r", "ranks": None}
    assert rank_state(state, ONE_PROCESS, tmp_path) == {"generator": "g", "rng": "r"}
    two = {"ranks": [{"generator": 0}, {"generator": 1}]}
    assert rank_state(two, Ranks(1, 2), tmp_path) == {"generator": 1}
    with pytest.raises(ConfigError, match="written by a run of 2 rank"):
        rank_state(two, ONE_PROCESS, tmp_path / "step-2")


def test_more_ranks_than_prompts_is_a_config_error(tmp_path):
    cfg = resolve_config(preset="grpo", overrides=[*TINY_RUN, f"train.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"rollout\.prompts_per_step=3 is less than the 4"):
        rl._train(cfg, Ranks(0, 4), False, (), False)
    assert not tmp_path.joinpath("config.yaml").exists()


@pytest.mark.parametrize("command", ["train", "sft", "dpo"])
def test_fsdp_with_lora_is_a_config_error(command):
    def resolve(*settings: str):
        if command == "train":
            return resolve_config(preset="grpo", overrides=[*TINY_RUN, *settings])
        if command == "sft":
            return resolve_config(overrides=settings, model=SFTConfig)
        return resolve_config(
            None, "dpo", settings, model=DPOConfig, preset_package=PREFERENCE_PRESETS
        )

    message = rf"{command}\.fsdp with model\.lora\.rank > 0: LoRA trains small adapters"
    with pytest.raises(ConfigError, match=message):
        resolve(f"{command}.fsdp=true", "model.lora.rank=4")
    assert getattr(resolve(f"{command}.fsdp=true"), command).fsdp is True
    assert resolve("model.lora.rank=4").model.lora.rank == 4  # each alone is fine


def test_a_numbered_gpu_under_torchrun_is_a_config_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with (
        pytest.raises(ConfigError, match=r"model\.device=cuda:1: under torchrun each rank"),
        data_parallel(torch.device("cuda", 1)),
    ):
        pass


def test_commands_other_than_train_refuse_to_run_under_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = CliRunner().invoke(app, ["eval", "--model", "tiny", "--task", "arithmetic"])
    assert result.exit_code == 2
    assert "rlvr eval runs in one process: under torchrun, only" in " ".join(result.output.split())


def same_scores_as_chunks(results: dict, model, tok, world: int) -> None:
    """`results`' evaluation is the chunks': rank r samples its chunk of the 5 problems
    (2, 2, 1 on 3 ranks) with seed r."""
    chunks = [Ranks(r, world).chunk(5) for r in range(world)]
    parts = [held_out_scores(model, tok, ONE_PROCESS, c, seed=r) for r, c in enumerate(chunks)]
    samples = [len(c) * 2 for c in chunks]
    for key in ("pass@1", "response_length/mean", "truncated_frac"):
        expected = sum(p[key] * n for p, n in zip(parts, samples, strict=True)) / sum(samples)
        assert float(results[f"eval/{key}"]) == pytest.approx(expected, rel=1e-6), key
    sc = sum(p["sc@2"] * len(c) for p, c in zip(parts, chunks, strict=True)) / 5
    assert float(results["eval/sc@2"]) == pytest.approx(sc, rel=1e-6)
    assert results["eval/problems"] == 5


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> list[dict]:
    """Every rank's results from `dp_rank.py` under torchrun with 3 ranks."""
    out = tmp_path_factory.mktemp("three_ranks") / "out.pt"
    done = torchrun(3, "dp_rank.py", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_the_update_is_the_same_on_three_ranks_as_in_one_process(three_ranks):
    """Each rank scores and trains its share of the rows; summed, the gradients, statistics
    and scores are those of one process, and every rank holds the same. (Three ranks: uneven
    shares, groups dealt whole and row by row; the SFT and DPO runs below check two ranks end
    to end.)"""
    world, everyone = 3, three_ranks
    single = update_results(ONE_PROCESS)
    assert len(everyone) == world
    for name, expected in single.items():
        for rank, results in enumerate(everyone):
            assert torch.equal(results[name], everyone[0][name]), (rank, name)
        if not name.startswith("eval/"):
            assert torch.allclose(everyone[0][name], expected, atol=1e-6, rtol=1e-6), name
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    same_scores_as_chunks(everyone[0], small_model(tok), tok, world)
    assert 0 < everyone[0]["eval/truncated_frac"] < 1  # lengths differ, so the weights matter
    grads = (
        "token_mean/grad",
        "critic/grad",
        "prm/grad",
        "skip_zero_advantage/grad",
        "sft/grad",
        "dpo/grad",
    )
    for name in grads:
        assert single[name].abs().max() > 1e-3  # a gradient that is really there
    assert (
        single["token_mean/clip_tokens"] > 0 and single["skip_zero_advantage/skipped_samples"] == 3
    )
    assert everyone[1]["check_in_sync"] == (
        "test: rank 1's parameter bias differs from rank 0's; the replicas have drifted apart"
    )


def test_what_rank_0_alone_makes_or_raises_reaches_every_rank(three_ranks):
    """`Ranks.on_main`: rank 0's result on every rank, and its error raised on every rank
    (rlvr dpo reads or samples its pairs so: a bad file stops every rank with its message)."""
    assert [results["on_main"] for results in three_ranks] == [7, 7, 7]
    errors = [results["on_main_error"] for results in three_ranks]
    assert errors == ["rank 0 could not read the file"] * 3


def test_sharded_adamw_keeps_a_part_of_the_state_on_each_rank_and_steps_as_adamw(three_ranks):
    """`shard_optimizer` (ZeRO-1): every rank ends with the weights AdamW gives in one
    process, bit for bit, while keeping the moments of its own parameters only; rank 0
    gathers the whole state, equal to one process's, for the checkpoint."""
    single, state = sharded_adamw_steps(ONE_PROCESS)
    kept = [results["sharded"]["kept_moments"] for results in three_ranks]
    assert sum(kept) == single["kept_moments"] == 2 * single["weights"].numel()
    assert max(kept) < 0.5 * single["kept_moments"]  # about a third each
    for results in three_ranks:
        assert torch.equal(results["sharded"]["weights"], single["weights"])
    gathered = three_ranks[0]["sharded_state"]
    assert [results["sharded_state"] for results in three_ranks[1:]] == [None, None]
    assert gathered["param_groups"][0]["lr"] == state["param_groups"][0]["lr"] != 1e-2
    assert gathered["state"].keys() == state["state"].keys()
    for index, moments in state["state"].items():
        for key, value in moments.items():
            assert torch.equal(gathered["state"][index][key], value), (index, key)


def same_tensors(left, right, atol: float | None = None) -> None:
    """Nested dicts and sequences of tensors equal: bit for bit, or to `atol` and a relative
    1e-5."""
    if isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            same_tensors(left[key], right[key], atol)
    elif isinstance(left, list | tuple):
        assert len(left) == len(right)
        for a, b in zip(left, right):
            same_tensors(a, b, atol)
    elif isinstance(left, torch.Tensor) and atol is None:
        assert torch.equal(left, right)
    elif isinstance(left, torch.Tensor):
        assert torch.allclose(left, right, rtol=1e-5, atol=atol), (left - right).abs().max()
    else:
        assert left == right


def test_fsdp_shards_the_weights_and_updates_as_one_process(three_ranks):
    """`train.fsdp` on 3 ranks: each rank keeps about a third of the parameters; the
    evaluation and log-probs on the whole weights are one process's (to fp32 rounding); the
    gradient of every case, summed by reduce-scatter over uneven shares (ranks without rows
    run zero-weighted passes), is one process's to fp32 rounding; the checkpoint's weights
    and AdamW state after a step are one process's, and load back into another sharded model
    unchanged; and a replicated reference reset on the whole weights holds them on every
    rank."""
    single = fsdp_results(ONE_PROCESS)
    everyone = [results["fsdp"] for results in three_ranks]
    kept = [int(results["kept"]) for results in everyone]
    assert sum(kept) == single["kept"] and max(kept) < 0.4 * single["kept"]
    # rank 0 scores its own rows: where the CPU's matmul kernels round by row count (AVX-512
    # EPYC, 11-29) the log-probs are one process's to fp32 rounding, elsewhere bit for bit
    same_tensors(everyone[0]["logprobs"], single["logprobs"], atol=1e-6)
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    same_scores_as_chunks(everyone[0], two_layers(tok), tok, 3)
    for case in [*CASES, "checkpointed"]:  # and one with activation checkpointing
        assert single[f"{case}/grad"].abs().max() > 1e-3
        for results in everyone:
            assert torch.allclose(results[f"{case}/grad"], single[f"{case}/grad"], 1e-5, 1e-7)
    for case in CASES:
        for results in everyone:
            assert results[f"{case}/loss"] == pytest.approx(float(single[f"{case}/loss"]), 1e-6)
    weights, state = everyone[0]["saved"]
    assert [results["saved"] for results in everyone[1:]] == [(None, None)] * 2
    # AdamW's first step is lr · g / (|g| + ε): gradients equal to fp32 rounding, weights to
    # 1e-4 (a hundredth of the step) where |g| is near ε = 1e-8 (a norm gain's 4e-9 moved it
    # by 4e-5), to 1e-5 elsewhere
    same_tensors(weights, single["saved"][0], atol=1e-4)
    grads = [p.numel() for p in two_layers(tok).parameters()]
    last = dict(zip(weights, single["skip_zero_advantage/grad"].split(grads), strict=True))
    for name, tensor in weights.items():
        clear = last[name].view_as(tensor).abs() > 1e-6
        assert torch.allclose(tensor[clear], single["saved"][0][name][clear], 1e-5, 1e-5), name
    same_tensors(state, single["saved"][1], atol=1e-7)
    assert len(state["state"]) == len(weights) == 20  # one tensor for the tied head
    same_tensors(everyone[0]["reloaded"], everyone[0]["saved"])
    # weights kept whole through each update, resharded before each step: the log-probs after
    # two steps are one process's (stale whole weights would score with the first step's)
    start, kept_whole = single["logprobs"], single["kept_whole"]["logprobs"]
    assert (kept_whole - start).abs().max() > 1e-2
    for results in everyone:
        assert torch.allclose(results["kept_whole"]["logprobs"], kept_whole, 1e-4, 1e-5)
        # a forward frees a layer's gathered weights by default, and keeps them when asked
        assert (
            results["sharded_after_forward"] and not results["kept_whole"]["sharded_after_forward"]
        )
    for results in everyone:
        same_tensors(results["reference"], weights)


def test_fsdp_sft_and_dpo_steps_are_one_process_steps(three_ranks):
    """`sft.fsdp` and `dpo.fsdp` on 3 ranks: an SFT step's and a DPO step's loss and gradient
    (with ranks that run zero-weighted passes to match the busiest) are one process's to fp32
    rounding, and so are DPO's reference and held-out scores on the whole weights."""
    single = fsdp_results(ONE_PROCESS)
    for results in (results["fsdp"] for results in three_ranks):
        for name in ("sft/grad", "dpo/grad"):
            assert single[name].abs().max() > 1e-3
            assert torch.allclose(results[name], single[name], 1e-5, 1e-7), name
        assert torch.allclose(results["dpo/reference"], single["dpo/reference"], 1e-6, 1e-6)
        for key in [k for k in single if k.startswith(("sft/", "dpo/")) and single[k].dim() == 0]:
            assert float(results[key]) == pytest.approx(float(single[key]), 1e-5, 1e-6), key
    assert abs(float(single["dpo/rewards/margins"])) > 1e-2  # the shifted reference shows


TIMING = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}
RUN = [
    "train",
    "--preset",
    "grpo",
    *TINY_RUN,
    "rollout.max_new_tokens=12",
    "train.mini_batches=2",
    "train.micro_batch_tokens=64",
    "algorithm.kl.coef=0.01",
    "algorithm.entropy.coef=0.05",
    "train.lr=1e-2",
    "train.save_every=2",
    "train.shard_optimizer=true",
    "eval.every_steps=2",
    "eval.samples=4",
    "eval.k=2",
    "eval.max_new_tokens=12",
]


def train_command(run_dir: Path, *more: str) -> list[str]:
    """`rlvr train`'s arguments: `RUN` for 4 steps into `run_dir`, then `more`."""
    return [*RUN, "train.steps=4", f"train.output_dir={run_dir}", *more]


def launch(run_dir: Path, *more: str) -> str:
    """`rlvr train` with `RUN` for 4 steps on two ranks into `run_dir`; its output."""
    done = torchrun(2, "-m", "rlvr", *train_command(run_dir, *more))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run directory:") == 1  # rank 0 alone reports
    return done.stdout


def launched(commands: list[tuple[str, list[str]]], root: Path) -> dict[str, str]:
    """Each (name, arguments) `rlvr` command on two ranks, all in one torchrun launch
    (`dp_commands.py`); each command's output by its name."""
    (root / "commands.json").write_text(json.dumps(commands))
    done = torchrun(2, "dp_commands.py", str(root / "commands.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    parts = re.split(r"^=== (\S+)$", done.stdout, flags=re.MULTILINE)[1:]
    outputs = dict(zip(parts[::2], parts[1::2], strict=True))
    assert list(outputs) == [name for name, _ in commands]
    return outputs


def sharded_in_halves(output: str) -> None:
    """The command's output says FSDP left rank 0 of 2 about half of the parameters."""
    found = re.search(r"FSDP: rank 0 of 2 keeps ([\d,]+) of the ([\d,]+) parameters", output)
    assert found, output[-2000:]
    kept, whole = (int(n.replace(",", "")) for n in found.groups())
    assert 0.4 * whole < kept < 0.6 * whole


def resumed_the_same(straight: Path, parted: Path) -> None:
    """`parted`, `straight`'s run resumed from its step-2 checkpoint, logged what `straight`
    logged, value for value."""
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(parted / "metrics.jsonl")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    assert a[-1]["kl"] > 1e-6  # the policy moved, so resuming covers the optimizer and RNGs
    for left, right in zip(a, b, strict=True):
        for key, value in left.items():
            if key not in TIMING and not (isinstance(value, float) and math.isnan(value)):
                assert right[key] == value, (left["step"], key)
    scores = [
        [{k: v for k, v in line.items() if k != "seconds"} for line in read_jsonl(path)]
        for path in (straight / "eval.jsonl", parted / "eval.jsonl")
    ]
    assert [line["step"] for line in scores[0]] == [0, 2, 4] and scores[1] == scores[0]


@pytest.fixture(scope="module")
def replicated_run(tmp_path_factory) -> Path:
    """The run directory of `RUN` on two ranks, weights replicated."""
    straight = tmp_path_factory.mktemp("replicated") / "straight"
    launch(straight)
    return straight


@pytest.fixture(scope="module")
def continued_runs(tmp_path_factory, replicated_run) -> tuple[Path, dict[str, str]]:
    """Three runs from the replicated run's, on two ranks in one launch, in one folder, and
    their outputs: `parted`, the replicated run resumed as a crash after step 3 leaves it
    (step 2 saved last); `sharded`, the same with `train.fsdp=true`; `distilled`, the run with
    the replicated run's step-2 checkpoint as a distillation teacher."""
    root = tmp_path_factory.mktemp("continued")
    for name in ("parted", "sharded"):
        shutil.copytree(replicated_run, root / name)
        shutil.rmtree(root / name / "checkpoints" / "step-4")
    # layers kept whole through each update (the SFT and DPO runs below free them per pass)
    fsdp = ("train.fsdp=true", "train.fsdp_reshard_after_forward=false")
    teacher = f"algorithm.distill.teacher={replicated_run / 'checkpoints' / 'step-2'}"
    commands = [
        ("parted", train_command(root / "parted", "--resume")),
        ("sharded", train_command(root / "sharded", "--resume", *fsdp)),
        ("distilled", train_command(root / "distilled", teacher)),
    ]
    outputs = launched(commands, root)
    for output in outputs.values():
        assert output.count("run directory:") == 1  # rank 0 alone reports
    return root, outputs


def test_train_under_torchrun_writes_one_run_and_resumes_on_the_same_trajectory(
    replicated_run, continued_runs
):
    """Two ranks with the optimizer state sharded: one run directory, and a resume from a
    checkpoint continues the run as it went on."""
    straight = replicated_run
    resumed_the_same(straight, continued_runs[0] / "parted")
    state = load_trainer_state(straight / "checkpoints" / "step-4")
    generators = [own["generator"] for own in state["ranks"]]
    assert len(generators) == 2 and not torch.equal(*generators)  # each rank samples its own
    # the sharded optimizer's whole state, gathered from both ranks (resumed from above)
    moments = state["optimizer"]["state"].values()
    assert len(moments) == len(
        list(load_pretrained(str(straight / "checkpoints" / "step-4"))[0].parameters())
    )
    cfg = resolve_config(
        preset="grpo", overrides=[*RUN[3:], "train.steps=6", f"train.output_dir={straight}"]
    )
    with pytest.raises(ConfigError, match=r"step-4: written by a run of 2 rank\(s\)"):
        rl.train(cfg, resume=True, show_progress=False)


def test_fsdp_train_resumes_the_replicated_run_and_continues_it(replicated_run, continued_runs):
    """`train.fsdp=true` on two ranks, resumed from the replicated run's step-2 checkpoint (its
    whole weights and AdamW state sharded on loading): steps 3 and 4 (rollout and evaluation on
    the whole weights, the update sharded) log what the replicated run logged, to fp32
    rounding, and the step-4 checkpoint holds the whole model, saved as its own class."""
    root, outputs = continued_runs
    sharded = root / "sharded"
    sharded_in_halves(outputs["sharded"])
    # 4 AdamW steps of lr 1e-2, each lr · m / (√v + ε): where a rare token's gradient is
    # tiny, rounding moves its embedding by up to 1e-4 (a few of 3424 values; the rest to 1e-5)
    same_run(replicated_run, sharded, ("metrics.jsonl",), "checkpoints/step-4", atol=2e-4)
    config = json.loads((sharded / "checkpoints" / "step-4" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_a_distillation_teacher_scores_every_row_on_two_ranks(replicated_run, continued_runs):
    """The replicated run again with its own step-2 checkpoint as a distillation teacher
    (GRPO plus the teacher's term): each rank scores its share with the teacher and every
    rank gets the whole batch's scores; step 1 samples what the run without a teacher sampled
    (the teacher changes the advantages, not the rollout), and trains on something else."""
    with_teacher = read_jsonl(continued_runs[0] / "distilled" / "metrics.jsonl")
    without = read_jsonl(replicated_run / "metrics.jsonl")
    # the k1 estimate is a sample mean and may fall below 0 once the student nears the teacher
    assert all(math.isfinite(m["distill/reverse_kl"]) for m in with_teacher)
    assert with_teacher[0]["distill/reverse_kl"] > 0.01  # the initial model against step 2
    assert with_teacher[0]["reward/mean"] == without[0]["reward/mean"]
    assert with_teacher[0]["response_length/mean"] == without[0]["response_length/mean"]
    assert with_teacher[0]["loss"] != pytest.approx(without[0]["loss"], rel=1e-3)


ONE_LAYER = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
]
"""The model of the SFT and DPO runs below."""


def same_run(
    one: Path, two: Path, logs: tuple[str, ...], checkpoint: str = "", atol: float = 1e-5
) -> None:
    """The two runs logged the same values (to rounding) and saved the same weights (in the
    run directory or its `checkpoint` folder) to `atol`."""
    for log in logs:
        a, b = read_jsonl(one / log), read_jsonl(two / log)
        assert [r["step"] for r in a] == [r["step"] for r in b]
        for left, right in zip(a, b, strict=True):
            for key, value in left.items():
                if key.startswith("time") or key in TIMING:
                    continue
                if isinstance(value, float):
                    assert right[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True)
                else:
                    assert right[key] == value, (log, key)
    (first, _), (second, _) = (load_pretrained(str(run / checkpoint)) for run in (one, two))
    for (name, p), q in zip(first.named_parameters(), second.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=atol, rtol=1e-4, msg=name)


def sft_settings(sharding: str) -> list[str]:
    """`rlvr sft`'s settings for the two-rank comparison: 6 steps of a one-layer model."""
    return [
        *ONE_LAYER,
        "data.train_size=40",
        "data.test_size=2",
        "data.max_digits=1",
        "sft.steps=6",
        "sft.batch_size=8",
        "sft.lr=3e-3",
        "sft.warmup_steps=0",
        "sft.micro_batch_tokens=64",
        f"sft.{sharding}=true",  # shards on two ranks, nothing in one
    ]


def dpo_settings(sharding: str, data: Path) -> list[str]:
    """`rlvr dpo`'s settings for the two-rank comparison: 4 steps on the pairs in `data`."""
    return [
        *ONE_LAYER,
        "data.task=file",
        f"data.path={data}",
        "dpo.eval_pairs=8",
        "dpo.batch_size=8",
        "dpo.steps=4",
        "dpo.eval_every_steps=2",
        "dpo.lr=1e-3",
        "dpo.micro_batch_tokens=64",
        f"dpo.{sharding}=true",  # shards on two ranks, nothing in one
    ]


SFT_SHARDINGS = ["shard_optimizer", "fsdp"]
DPO_CASES = [("shard_optimizer", "dpo"), ("fsdp", "kto")]


@pytest.fixture(scope="module")
def offline_on_two_ranks(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The SFT and DPO runs below on two ranks, in one torchrun launch (`dp_commands.py`): the
    folder holding each run's directory (named as the case) and the pairs file, and each
    command's output by case."""
    root = tmp_path_factory.mktemp("offline")
    rows = [
        {"prompt": f"{a} + {a}?", "chosen": f"It is {2 * a}.", "rejected": f"It is {2 * a + 1}."}
        for a in range(40)
    ]
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    commands = [
        *(
            (f"sft-{s}", ["sft", *sft_settings(s), f"sft.output_dir={root}/sft-{s}"])
            for s in SFT_SHARDINGS
        ),
        *(
            (
                f"{p}-{s}",
                ["dpo", "--preset", p, *dpo_settings(s, pairs), f"dpo.output_dir={root}/{p}-{s}"],
            )
            for s, p in DPO_CASES
        ),
    ]
    return root, launched(commands, root)


@pytest.mark.parametrize("sharding", SFT_SHARDINGS)
def test_sft_under_torchrun_trains_the_model_one_process_trains(
    tmp_path, sharding, offline_on_two_ranks
):
    """SFT samples nothing, so two ranks, each on its share of every batch, must end with the
    weights one process ends with (up to the order of the gradient sums), with AdamW's state
    partitioned (ZeRO-1) or the weights, gradients and state sharded (FSDP2)."""
    root, outputs = offline_on_two_ranks
    output = outputs[f"sft-{sharding}"]
    one = resolve_config(
        overrides=[*sft_settings(sharding), f"sft.output_dir={tmp_path / 'one'}"],
        model=SFTConfig,
    )
    run_sft(one, show_progress=False)
    assert output.count("model saved to") == 1
    if sharding == "fsdp":
        sharded_in_halves(output)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "one" / "metrics.jsonl")]
    assert len(losses) == 6 and losses[-1] < 0.9 * losses[0]  # it trained
    same_run(tmp_path / "one", root / f"sft-{sharding}", ("metrics.jsonl",))


@pytest.mark.parametrize("sharding, preset", DPO_CASES)
def test_dpo_under_torchrun_trains_the_model_one_process_trains(
    tmp_path, sharding, preset, offline_on_two_ranks
):
    """Pairs from a file: two ranks end with one process's weights and held-out metrics, with
    AdamW's state partitioned (ZeRO-1) or the weights, gradients and state sharded (FSDP2,
    with KTO: the update of DPO's path plus its per-step reference point, a no-grad pass on
    whole weights summed over the ranks, which comes out as one process's)."""
    root, outputs = offline_on_two_ranks
    output = outputs[f"{preset}-{sharding}"]
    one = resolve_config(
        None,
        preset,
        [*dpo_settings(sharding, root / "pairs.jsonl"), f"dpo.output_dir={tmp_path / 'one'}"],
        model=DPOConfig,
        preset_package=PREFERENCE_PRESETS,
    )
    run_dpo(one, show_progress=False)
    assert output.count("model and logs saved to") == 1
    if sharding == "fsdp":
        sharded_in_halves(output)
    metrics = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert metrics[-1]["loss"] < metrics[0]["loss"]  # it trained
    if preset == "kto":
        assert metrics[-1]["kl"] > 0.0  # the reference point moved off 0
    same_run(tmp_path / "one", root / f"{preset}-{sharding}", ("metrics.jsonl", "eval.jsonl"))
