"""rlvr vs TRL's ``GRPOTrainer``, side by side on the same CPU, model, task and settings.

    python benchmarks/vs_trl.py --mode systems            # equal work: completion lengths forced
    python benchmarks/vs_trl.py --mode learning           # normal sampling: time to a target
    python benchmarks/vs_trl.py --mode learning --cold-start DIR   # from a saved model
    python benchmarks/vs_trl.py --mode scaling            # step time vs length and group size
    python benchmarks/vs_trl.py --mode systems --quick    # a smoke version (< 3 minutes)

Every run is a fresh subprocess (``--worker``), so peak RSS (the child's ``VmHWM``) is per
run and neither framework inherits the other's caches; runs alternate rlvr / TRL / rlvr / TRL.
Both load one saved initialisation of rlvr's tiny Llama (random for systems and scaling, the
demo's cold-start SFT model for learning) and its tokenizer, train on the demo's arithmetic
task with the same prompts in the same order, the same samples per prompt, max new tokens,
temperature 1, learning rate, fp32, β = 0, GRPO's loss (``loss_type="grpo"`` ↔ rlvr's ``grpo``
preset: group-normalised advantages with ε = 1e-4, clip 0.2, per-sequence token mean), one
optimizer update per batch, constant learning rate, gradient clipping at 1, and
``torch.set_num_threads(2)``. Rewards are rlvr's composed ``math`` verifier in both, on
completions decoded the same way (TRL's own decoding drops the answer tags).

What is measured per step (the first step is reported but left out of the medians: warm-up):
``rollout`` (prompt encoding, sampling, decoding), ``reward`` (scoring, and for rlvr the batch
assembly), ``train`` (the rest: advantages, forward/backward, optimizer); completion tokens per
second; token slots of the training forwards and of the rollout forwards per generated token
(both counted by a forward pre-hook on the policy) and the share of them wasted on padding or on
rows that had already finished (`ForwardCounter`); the reward curve.

Equal completion lengths: TRL gets ``generation_kwargs={"min_new_tokens": L}`` and rlvr
``rollout.min_new_tokens=L`` (EOS is masked in both), so every completion is L tokens long.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from step_probes import ForwardCounter, digit_share, peak_rss_mb

FRAMEWORKS = ("rlvr", "trl")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREADS = 2
ADVANTAGE_EPSILON = 1e-4
"""TRL divides by (std + 1e-4); rlvr's `algorithm.epsilon` is set to the same."""


@dataclass
class RunSpec:
    """Everything one worker run needs; written to JSON and read by the child process."""

    framework: str
    model_dir: str
    output_dir: str
    result_path: str
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    force_length: bool
    lr: float
    seed: int = 0
    temperature: float = 1.0
    eval_every: int = 0
    """Checkpoint every N steps and evaluate the checkpoints after training (0 = no eval)."""
    eval_problems: int = 0
    eval_k: int = 1
    reward: str = "task"
    """`task`: the task's verifier; `dense`: `digit_share` (every group has a nonzero advantage)."""
    data: dict[str, Any] = field(default_factory=dict)
    rlvr_overrides: list[str] = field(default_factory=list)
    """Extra rlvr config overrides (A/B scripts of one rlvr setting; empty in this script)."""


@dataclass
class ModeSettings:
    """Sizes of one mode; `--quick` swaps in the small ones."""

    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    lr: float
    repeats: int = 1
    seeds: tuple[int, ...] = (0,)
    sft_steps: int = 0
    eval_every: int = 0
    eval_problems: int = 0
    eval_k: int = 1
    lengths: tuple[int, ...] = ()
    group_sizes: tuple[int, ...] = ()
    reward: str = "task"


FULL = {
    "systems": ModeSettings(
        steps=12, prompts_per_step=16, samples_per_prompt=8, max_new_tokens=64, lr=1e-4, repeats=2
    ),
    "learning": ModeSettings(
        steps=80,
        prompts_per_step=32,
        samples_per_prompt=8,
        max_new_tokens=48,
        lr=1e-4,
        seeds=(0, 1, 2),
        sft_steps=600,
        eval_every=5,
        eval_problems=200,
        eval_k=4,
    ),
    "scaling": ModeSettings(
        steps=4,
        prompts_per_step=4,
        samples_per_prompt=8,
        max_new_tokens=64,
        lr=1e-4,
        lengths=(64, 128, 256, 512),
        group_sizes=(4, 8, 16, 32),
    ),
}
QUICK = {
    "systems": ModeSettings(
        steps=3, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=16, lr=1e-4
    ),
    "learning": ModeSettings(
        steps=4,
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=24,
        lr=1e-4,
        sft_steps=20,
        eval_every=2,
        eval_problems=16,
        eval_k=2,
    ),
    "scaling": ModeSettings(
        steps=2,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=16,
        lr=1e-4,
        lengths=(16, 32),
        group_sizes=(8,),
    ),
}


# --------------------------------------------------------------------------- worker side


def evaluate_checkpoints(spec: RunSpec, checkpoints: dict[int, Path]) -> list[dict]:
    """Held-out pass@1 of each checkpoint, with the same evaluator for both frameworks."""
    from rlvr.config import DataConfig
    from rlvr.data.tasks import load_task
    from rlvr.evaluation.evaluate import evaluate
    from rlvr.models.loading import load_pretrained

    task = load_task(DataConfig.model_validate(spec.data))
    curve = []
    for step, path in sorted(checkpoints.items()):
        model, tokenizer = load_pretrained(str(path))
        scores = evaluate(
            model,
            tokenizer,
            task.test[: spec.eval_problems],
            reward=task.reward,
            template=spec.data["template"],
            k=spec.eval_k,
            temperature=spec.temperature,
            max_new_tokens=spec.max_new_tokens,
            seed=0,
        )
        curve.append({"step": step, "pass@1": scores["pass@1"]})
    return curve


def run_rlvr(spec: RunSpec) -> dict:
    """Train with `rlvr.training.rl.train`; read its metrics.jsonl."""
    import rlvr.training.rl as rl
    from rlvr.config import resolve_config
    from rlvr.models import fused
    from rlvr.models.loading import eos_token_ids
    from rlvr.run_layout import checkpoint_step
    from rlvr.tracking.jsonl import read_jsonl

    torch.set_num_threads(THREADS)
    counter: ForwardCounter | None = None
    load = rl.load_model_and_tokenizer
    hidden = fused.FusedForward.hidden

    def load_with_counter(*args: Any, **kwargs: Any) -> Any:
        nonlocal counter
        model, tokenizer = load(*args, **kwargs)
        counter = ForwardCounter(eos_token_ids(model, tokenizer))
        model.get_input_embeddings().register_forward_pre_hook(counter)
        model.register_forward_pre_hook(counter.model_pre_hook, with_kwargs=True)
        return model, tokenizer

    def hidden_with_mask(self, input_ids, positions, key_mask, cache, flat=None, **kwargs):
        counter.expect_mask(key_mask if flat is None else None)
        return hidden(self, input_ids, positions, key_mask, cache, flat, **kwargs)

    rl.load_model_and_tokenizer = load_with_counter
    fused.FusedForward.hidden = hidden_with_mask
    forced = [f"rollout.min_new_tokens={spec.max_new_tokens}"] if spec.force_length else []
    if spec.reward == "dense":
        forced.append('reward.functions=[{name: "step_probes:digit_share"}]')
    overrides = [f"data.{key}={value}" for key, value in spec.data.items()] + [
        f"model.name_or_path={spec.model_dir}",
        f"rollout.prompts_per_step={spec.prompts_per_step}",
        f"rollout.samples_per_prompt={spec.samples_per_prompt}",
        f"rollout.max_new_tokens={spec.max_new_tokens}",
        f"rollout.temperature={spec.temperature}",
        "algorithm.kl.coef=0.0",
        f"algorithm.epsilon={ADVANTAGE_EPSILON}",
        f"train.lr={spec.lr}",
        "train.warmup_steps=0",
        "train.schedule=constant",
        f"train.steps={spec.steps}",
        f"train.seed={spec.seed}",
        f"train.threads={THREADS}",
        f"train.save_every={spec.eval_every}",
        "train.log_samples=0",
        f"train.output_dir={spec.output_dir}",
        *forced,
        *spec.rlvr_overrides,
    ]
    cfg = resolve_config(preset="grpo", overrides=overrides)
    run_dir = rl.train(cfg, show_progress=False)
    rss = peak_rss_mb()
    n = spec.prompts_per_step * spec.samples_per_prompt
    steps = [
        {
            "step": m["step"],
            "rollout_s": m["time/rollout"],
            "reward_s": m["time/reward"],
            "train_s": m["time/train"],
            "step_s": m["time/step"],
            "completion_tokens": m["response_length/mean"] * n,
            "reward": m["reward/mean"],
            "skipped_frac": m["skipped_samples"] / n,
        }
        for m in read_jsonl(run_dir / "metrics.jsonl")
    ]
    checkpoints = {}
    if spec.eval_every:
        for path in (run_dir / "checkpoints").iterdir():
            checkpoints[checkpoint_step(path)] = path
    return {"steps": steps, "counter": counter, "peak_rss_mb": rss, "checkpoints": checkpoints}


def run_trl(spec: RunSpec) -> dict:
    """Train with TRL's GRPOTrainer on the same prompts, in the same order as rlvr draws them."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.config import DataConfig
    from rlvr.data.sampler import EpochSampler
    from rlvr.data.tasks import load_task
    from rlvr.data.templates import encode_prompts
    from rlvr.models.loading import decode_completions, eos_token_ids, load_pretrained
    from rlvr.rewards import compose_rewards

    torch.set_num_threads(THREADS)
    model, tokenizer = load_pretrained(spec.model_dir)
    counter = ForwardCounter(eos_token_ids(model, tokenizer))
    model.get_input_embeddings().register_forward_pre_hook(counter)
    model.register_forward_pre_hook(counter.model_pre_hook, with_kwargs=True)

    task = load_task(DataConfig.model_validate(spec.data))
    sampler = EpochSampler(len(task.train), spec.seed)
    order = [i for _ in range(spec.steps) for i in sampler.next(spec.prompts_per_step)]
    problems = [task.train[i] for i in order]
    questions = [p.question for p in problems]
    texts, prompt_ids = encode_prompts(spec.data["template"], questions, tokenizer)
    if tokenizer(texts[0])["input_ids"] != prompt_ids[0]:
        raise RuntimeError("TRL would tokenize the prompts differently from rlvr")
    dataset = Dataset.from_dict({"prompt": texts, "answer": [p.answer for p in problems]})

    eos = eos_token_ids(model, tokenizer)
    scorer = compose_rewards([(task.reward, 1.0)])

    def math(prompts: list[str], completions: list[str], completion_ids: list, **columns: Any):
        texts = decode_completions(tokenizer, completion_ids, eos)
        if spec.reward == "dense":
            return digit_share(prompts, texts)
        return scorer(prompts, texts, {"answer": columns["answer"]}).total

    seconds = {"rollout": 0.0, "reward": 0.0}

    def timed(fn: Callable, key: str) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start

        return wrapper

    GRPOTrainer._generate = timed(GRPOTrainer._generate, "rollout")
    GRPOTrainer._calculate_rewards = timed(GRPOTrainer._calculate_rewards, "reward")

    records: dict[int, dict] = {}

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (generation included) and its logged metrics."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds.update(rollout=0.0, reward=0.0)
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_s = time.perf_counter() - self.start
            records.setdefault(state.global_step, {}).update(
                step=state.global_step,
                rollout_s=seconds["rollout"],
                reward_s=seconds["reward"],
                train_s=step_s - seconds["rollout"] - seconds["reward"],
                step_s=step_s,
            )

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                n = spec.prompts_per_step * spec.samples_per_prompt
                records.setdefault(state.global_step, {}).update(
                    reward=logs["reward"],
                    completion_tokens=logs["completions/mean_length"] * n,
                    trl_step_time=logs.get("step_time"),
                )

    generation_kwargs = {"min_new_tokens": spec.max_new_tokens} if spec.force_length else None
    args = GRPOConfig(
        output_dir=spec.output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=spec.seed,
        max_steps=spec.steps,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=spec.prompts_per_step * spec.samples_per_prompt,
        gradient_accumulation_steps=1,
        num_generations=spec.samples_per_prompt,
        num_iterations=1,
        max_completion_length=spec.max_new_tokens,
        temperature=spec.temperature,
        top_p=1.0,
        top_k=0,
        generation_kwargs=generation_kwargs,
        beta=0.0,
        loss_type="grpo",
        epsilon=0.2,
        scale_rewards="group",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="steps" if spec.eval_every else "no",
        save_steps=spec.eval_every or 500,
        save_only_model=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[math],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    rss = peak_rss_mb()
    checkpoints = {}
    if spec.eval_every:
        for path in Path(spec.output_dir).glob("checkpoint-*"):
            checkpoints[int(path.name.removeprefix("checkpoint-"))] = path
    steps = [records[s] for s in sorted(records)]
    return {"steps": steps, "counter": counter, "peak_rss_mb": rss, "checkpoints": checkpoints}


def quiet() -> None:
    """No warnings, log lines or progress bars from the libraries (the tables are the output)."""
    from transformers.utils import logging

    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def worker(spec_path: Path) -> None:
    """Run one framework as the spec says; write the result JSON."""
    quiet()
    spec = RunSpec(**json.loads(spec_path.read_text()))
    run = run_rlvr if spec.framework == "rlvr" else run_trl
    start = time.perf_counter()
    out = run(spec)
    wall = time.perf_counter() - start
    counter: ForwardCounter = out["counter"]
    tokens = sum(s["completion_tokens"] for s in out["steps"])
    result = {
        "spec": asdict(spec),
        "steps": out["steps"],
        "peak_rss_mb": out["peak_rss_mb"],
        "wall_s": wall,
        **counter.report(tokens),
    }
    if spec.eval_every:
        result["eval"] = evaluate_checkpoints(spec, out["checkpoints"])
    Path(spec.result_path).write_text(json.dumps(result, indent=1) + "\n")


# --------------------------------------------------------------------------- orchestration


def launch(spec: Any, workdir: Path, script: Path = Path(__file__)) -> dict:
    """Run dataclass `spec` (with `framework`, `output_dir`, `result_path`) in a fresh Python
    process, `script --worker SPEC`, into an empty output directory (a rerun into the same
    --workdir starts over); return its result."""
    shutil.rmtree(spec.output_dir, ignore_errors=True)
    spec_path = workdir / f"spec-{Path(spec.output_dir).name}.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(script.resolve()), "--worker", str(spec_path)]
    print(f"  {spec.framework}: {Path(spec.output_dir).name}", flush=True)
    subprocess.run(cmd, check=True, env=env)
    return json.loads(Path(spec.result_path).read_text())


def summarize(result: dict) -> dict:
    """Medians over the steps after the first (warm-up) of one run."""
    steps = result["steps"][1:] or result["steps"]

    def median(key: str) -> float:
        return statistics.median(s[key] for s in steps)

    step_s = median("step_s")
    return {
        "step_s": step_s,
        "steps_per_s": 1 / step_s,
        "rollout_s": median("rollout_s"),
        "reward_s": median("reward_s"),
        "train_s": median("train_s"),
        "tokens_per_s": statistics.median(s["completion_tokens"] / s["step_s"] for s in steps),
        "train_slots_per_token": result["train_slots_per_token"],
        "rollout_slots_per_token": result["rollout_slots_per_token"],
        "train_padding_frac": result["train_padding_frac"],
        "rollout_padding_frac": result["rollout_padding_frac"],
        "peak_rss_mb": result["peak_rss_mb"],
        "skipped_frac": statistics.mean(s.get("skipped_frac", 0.0) for s in steps),
        "reward_curve": [s["reward"] for s in result["steps"]],
        "per_step": result["steps"],
    }


def prepare_model(workdir: Path, sft_steps: int) -> Path:
    """Save the shared initialisation: the random tiny model, or the demo's SFT model."""
    from rlvr.demo import DATA, MODEL, demo_configs
    from rlvr.models.loading import save_pretrained
    from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
    from rlvr.training.sft import run_sft

    torch.set_num_threads(THREADS)
    if sft_steps:
        sft_cfg, _ = demo_configs(workdir, sft_steps, rl_steps=1)
        sft_cfg.sft.threads = THREADS
        print(f"cold-start SFT of the tiny model ({sft_steps} steps, {DATA['task']})", flush=True)
        return run_sft(sft_cfg, show_progress=False)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, **MODEL["tiny"], seed=0)
    save_pretrained(model, tokenizer, workdir / "init")
    return workdir / "init"


def make_spec(
    framework: str, name: str, workdir: Path, model_dir: Path, s: ModeSettings, **changes: Any
) -> RunSpec:
    from rlvr.demo import DATA

    spec = RunSpec(
        framework=framework,
        model_dir=str(model_dir),
        output_dir=str(workdir / f"{name}-{framework}"),
        result_path=str(workdir / f"{name}-{framework}.json"),
        steps=s.steps,
        prompts_per_step=s.prompts_per_step,
        samples_per_prompt=s.samples_per_prompt,
        max_new_tokens=s.max_new_tokens,
        force_length=True,
        lr=s.lr,
        eval_every=s.eval_every,
        eval_problems=s.eval_problems,
        eval_k=s.eval_k,
        reward=s.reward,
        data=dict(DATA),
    )
    for key, value in changes.items():
        setattr(spec, key, value)
    return spec


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def systems_mode(s: ModeSettings, workdir: Path) -> dict:
    model_dir = prepare_model(workdir, 0)
    runs: dict[str, list[dict]] = {fw: [] for fw in FRAMEWORKS}
    for rep in range(s.repeats):
        for fw in FRAMEWORKS:
            result = launch(make_spec(fw, f"systems{rep}", workdir, model_dir, s), workdir)
            runs[fw].append(summarize(result))
    summary = {fw: best_of(runs[fw]) for fw in FRAMEWORKS}
    return {
        "runs": runs,
        "summary": summary,
        "speedup": ratio(summary["rlvr"]["steps_per_s"], summary["trl"]["steps_per_s"]),
        "pooled_speedup": ratio(pooled_step_s(runs["trl"]), pooled_step_s(runs["rlvr"])),
        "rss_ratio": ratio(summary["rlvr"]["peak_rss_mb"], summary["trl"]["peak_rss_mb"]),
    }


def best_of(runs: list[dict]) -> dict:
    """The repeat with the fastest median step (the least disturbed by the machine)."""
    return min(runs, key=lambda r: r["step_s"])


def pooled_step_s(runs: list[dict]) -> float:
    """The median step over the steps after the first of every repeat: one fast or slow
    repeat moves it less than it moves `best_of`."""
    return statistics.median(s["step_s"] for run in runs for s in run["per_step"][1:])


def checkpoint_times(result: dict) -> list[tuple[float, float]]:
    """(training seconds up to the checkpoint, its held-out pass@1) for each checkpoint."""
    elapsed = {s["step"]: s["step_s"] for s in result["steps"]}
    return [
        (sum(t for step, t in elapsed.items() if step <= point["step"]), point["pass@1"])
        for point in result["eval"]
    ]


def time_to_target(result: dict, target: float) -> float | None:
    """Training seconds until the first evaluated checkpoint at or above `target`."""
    for seconds, score in checkpoint_times(result):
        if score >= target:
            return seconds
    return None


def interpolated_time_to_target(result: dict, target: float, initial: float) -> float | None:
    """Training seconds at which held-out pass@1, drawn as straight lines between the initial
    model (0 s) and the checkpoints, first reaches `target`. Unlike `time_to_target` it does
    not round a crossing up to the next checkpoint, so it moves less with the checkpoint
    spacing."""
    before = (0.0, initial)
    for seconds, score in checkpoint_times(result):
        if score >= target:
            (t0, s0), (t1, s1) = before, (seconds, score)
            return t0 + (t1 - t0) * (target - s0) / (s1 - s0) if s1 > s0 else t1
        before = (seconds, score)
    return None


def learning_mode(
    s: ModeSettings, workdir: Path, target: float | None, cold_start: Path | None = None
) -> dict:
    from rlvr.demo import DATA

    model_dir = cold_start or prepare_model(workdir, s.sft_steps)
    init = evaluate_checkpoints(
        make_spec("rlvr", "init", workdir, model_dir, s, force_length=False), {0: model_dir}
    )[0]["pass@1"]
    target = init + 0.15 if target is None else target
    print(f"held-out pass@1 of the initial model: {init:.3f}; target {target:.3f}", flush=True)
    runs: dict[str, list[dict]] = {fw: [] for fw in FRAMEWORKS}
    for seed in s.seeds:
        for fw in FRAMEWORKS:
            spec = make_spec(
                fw, f"learn{seed}", workdir, model_dir, s, force_length=False, seed=seed
            )
            result = launch(spec, workdir)
            runs[fw].append(
                {
                    **summarize(result),
                    "seed": seed,
                    "eval": result["eval"],
                    "time_to_target_s": time_to_target(result, target),
                    "interpolated_time_to_target_s": interpolated_time_to_target(
                        result, target, init
                    ),
                    "train_s_total": sum(st["step_s"] for st in result["steps"]),
                }
            )
    summary = {}
    for fw in FRAMEWORKS:
        reached = [r["time_to_target_s"] for r in runs[fw] if r["time_to_target_s"] is not None]
        curves = [r["reward_curve"] for r in runs[fw]]
        summary[fw] = {
            "step_s": statistics.mean(r["step_s"] for r in runs[fw]),
            "mean_reward": statistics.mean(v for c in curves for v in c),
            "reward_curve": [statistics.mean(c[i] for c in curves) for i in range(len(curves[0]))],
            "final_pass@1": statistics.mean(r["eval"][-1]["pass@1"] for r in runs[fw]),
            "seeds_reaching_target": len(reached),
            "mean_time_to_target_s": statistics.mean(reached) if reached else None,
            "mean_interpolated_time_to_target_s": mean_or_none(
                [r["interpolated_time_to_target_s"] for r in runs[fw]]
            ),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[fw]),
        }
    a, b = summary["rlvr"]["mean_time_to_target_s"], summary["trl"]["mean_time_to_target_s"]
    ia = summary["rlvr"]["mean_interpolated_time_to_target_s"]
    ib = summary["trl"]["mean_interpolated_time_to_target_s"]
    return {
        "task": DATA,
        "initial_pass@1": init,
        "target_pass@1": target,
        "runs": runs,
        "summary": summary,
        "time_to_target_ratio": ratio(b, a) if a and b else None,
        "interpolated_time_to_target_ratio": ratio(ib, ia) if ia and ib else None,
    }


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values that are not None (a seed that never reached the target has
    none); None when none is left."""
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


TIMINGS = ("step_s", "rollout_s", "reward_s", "train_s")


def scaling_mode(s: ModeSettings, workdir: Path) -> dict:
    """Each grid point run by both frameworks, the whole grid `s.repeats` times in rounds (so
    that a slow minute of the machine falls on every point of a round alike). A point's
    timings are the medians over the rounds; its other figures are the first round's. The
    growth of each series (largest over smallest value) is taken within each round, then its
    median over the rounds."""
    model_dir = prepare_model(workdir, 0)
    grid = [("max_new_tokens", v) for v in s.lengths] + [
        ("samples_per_prompt", v) for v in s.group_sizes
    ]
    runs: dict[tuple[str, int], dict[str, list[dict]]] = {
        point: {fw: [] for fw in FRAMEWORKS} for point in grid
    }
    for round_ in range(s.repeats):
        for key, value in grid:
            for fw in FRAMEWORKS:
                name = f"scale-{key}-{value}" + (f"-round-{round_}" if s.repeats > 1 else "")
                spec = make_spec(fw, name, workdir, model_dir, s, **{key: value})
                runs[key, value][fw].append(summarize(launch(spec, workdir)))
    rows = []
    for (key, value), by_fw in runs.items():
        row: dict[str, Any] = {"vary": key, "value": value}
        for fw, summaries in by_fw.items():
            row[fw] = {
                **summaries[0],
                **{t: statistics.median(x[t] for x in summaries) for t in TIMINGS},
                "step_s_rounds": [x["step_s"] for x in summaries],
            }
            row[fw]["steps_per_s"] = 1 / row[fw]["step_s"]
        row["speedup"] = ratio(row["rlvr"]["steps_per_s"], row["trl"]["steps_per_s"])
        rows.append(row)
    return {"rows": rows, "growth": series_growth(rows)}


def series_growth(rows: list[dict]) -> dict:
    """For each varied setting with two points or more: per framework, the step time at its
    largest value over that at its smallest, in each round, and their median."""
    growth: dict[str, dict] = {}
    for key in dict.fromkeys(row["vary"] for row in rows):
        series = sorted((row for row in rows if row["vary"] == key), key=lambda r: r["value"])
        if len(series) < 2:
            continue
        low, high = series[0], series[-1]
        growth[key] = {"from": low["value"], "to": high["value"]}
        for fw in FRAMEWORKS:
            per_round = [b / a for a, b in zip(low[fw]["step_s_rounds"], high[fw]["step_s_rounds"])]
            growth[key][fw] = {"per_round": per_round, "median": statistics.median(per_round)}
    return growth


def print_report(mode: str, report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()

    def fmt(value: Any, spec: str = ".3f") -> str:
        return "—" if value is None else format(value, spec)

    if mode in ("systems", "learning"):
        table = Table(title=f"{mode} mode (medians over steps 2..N)")
        table.add_column("metric")
        for fw in FRAMEWORKS:
            table.add_column(fw, justify="right")
        best = {
            fw: best_of(report["runs"][fw]) if mode == "systems" else report["runs"][fw][0]
            for fw in FRAMEWORKS
        }
        for key in (
            "step_s",
            "steps_per_s",
            "rollout_s",
            "reward_s",
            "train_s",
            "tokens_per_s",
            "train_slots_per_token",
            "rollout_slots_per_token",
            "train_padding_frac",
            "rollout_padding_frac",
            "peak_rss_mb",
            "skipped_frac",
        ):
            table.add_row(key, *(fmt(best[fw][key]) for fw in FRAMEWORKS))
        table.add_row(
            "reward curve",
            *(" ".join(f"{v:.2f}" for v in best[fw]["reward_curve"]) for fw in FRAMEWORKS),
        )
        console.print(table)
    if mode == "systems":
        console.print(
            f"rlvr / TRL steps per second: {fmt(report['speedup'], '.2f')}× (better runs), "
            f"{fmt(report['pooled_speedup'], '.2f')}× (pooled medians); "
            f"peak RSS rlvr / TRL: {fmt(report['rss_ratio'], '.2f')}"
        )
    if mode == "learning":
        console.print(
            f"initial pass@1 {report['initial_pass@1']:.3f}, target {report['target_pass@1']:.3f}"
        )
        for fw in FRAMEWORKS:
            sm = report["summary"][fw]
            console.print(
                f"{fw}: mean reward {sm['mean_reward']:.3f}, final pass@1 "
                f"{sm['final_pass@1']:.3f}, seeds at target {sm['seeds_reaching_target']}, "
                f"mean time to target {fmt(sm['mean_time_to_target_s'], '.1f')} s"
            )
        console.print(
            f"TRL / rlvr wall-clock to target: {fmt(report['time_to_target_ratio'], '.2f')}× "
            f"(interpolated between checkpoints: "
            f"{fmt(report['interpolated_time_to_target_ratio'], '.2f')}×)"
        )
    if mode == "scaling":
        table = Table(title="scaling mode: median seconds per step")
        for column in ("vary", "value", "rlvr s/step", "TRL s/step", "rlvr speedup"):
            table.add_column(column, justify="right")
        for row in report["rows"]:
            table.add_row(
                row["vary"],
                str(row["value"]),
                fmt(row["rlvr"]["step_s"]),
                fmt(row["trl"]["step_s"]),
                fmt(row["speedup"], ".2f"),
            )
        console.print(table)
        for key, g in report["growth"].items():
            console.print(
                f"{key} {g['from']} → {g['to']}: step time grows "
                + ", ".join(
                    f"{fw} {g[fw]['median']:.2f}× (rounds: "
                    + " ".join(f"{x:.2f}" for x in g[fw]["per_round"])
                    + ")"
                    for fw in FRAMEWORKS
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("systems", "learning", "scaling"), default="systems")
    parser.add_argument("--steps", type=int, help="RL steps per run (default: per mode)")
    parser.add_argument("--quick", action="store_true", help="a smoke version (< 3 minutes)")
    parser.add_argument("--target", type=float, help="learning: held-out pass@1 to reach")
    parser.add_argument(
        "--eval-every", type=int, help="learning: steps between evaluated checkpoints (5)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="learning: the seeds (0 1 2)")
    parser.add_argument(
        "--reward",
        choices=("task", "dense"),
        default="task",
        help="task: the task's verifier; dense: digit share (no zero-advantage group to skip)",
    )
    parser.add_argument(
        "--cold-start",
        type=Path,
        help="learning: start both from this saved model instead of training the cold-start "
        "SFT (its rounding follows rlvr's code, so revisions can start from different models)",
    )
    parser.add_argument(
        "--lengths", type=int, nargs="*", help="scaling: the max_new_tokens series (64 128 256 512)"
    )
    parser.add_argument(
        "--group-sizes",
        type=int,
        nargs="*",
        help="scaling: the samples_per_prompt series (4 8 16 32)",
    )
    parser.add_argument(
        "--repeats", type=int, help="scaling: rounds of the whole grid (1); systems: runs (2)"
    )
    parser.add_argument("--workdir", type=Path, help="keep models and runs here (default: temp)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return

    quiet()
    settings = (QUICK if args.quick else FULL)[args.mode]
    if args.steps:
        settings.steps = args.steps
    if args.eval_every:
        settings.eval_every = args.eval_every
    if args.seeds:
        settings.seeds = tuple(args.seeds)
    if args.lengths is not None:
        settings.lengths = tuple(args.lengths)
    if args.group_sizes is not None:
        settings.group_sizes = tuple(args.group_sizes)
    if args.repeats:
        settings.repeats = args.repeats
    settings.reward = args.reward
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.mode == "systems":
            report = systems_mode(settings, workdir)
        elif args.mode == "learning":
            report = learning_mode(settings, workdir, args.target, args.cold_start)
        else:
            report = scaling_mode(settings, workdir)
    report = {
        "mode": args.mode,
        "quick": args.quick,
        "settings": asdict(settings),
        "command": " ".join(["python", "benchmarks/vs_trl.py", *sys.argv[1:]]),
        "threads": THREADS,
        "cpu_count": os.cpu_count(),
        "wall_s": time.perf_counter() - start,
        **report,
    }
    print_report(args.mode, report)
    RESULTS_DIR.mkdir(exist_ok=True)
    dense = "-dense" if args.reward == "dense" else ""
    seeds = "-seeds-" + "-".join(map(str, args.seeds)) if args.seeds else ""
    start_from = f"-from-{args.cold_start.name}" if args.cold_start else ""
    grid = ""
    if args.mode == "scaling" and (args.lengths, args.group_sizes, args.repeats) != (None,) * 3:
        for label, values in (("lengths", settings.lengths), ("groups", settings.group_sizes)):
            grid += f"-{label}-{'-'.join(map(str, values))}" if values else ""
        grid += f"-rounds-{settings.repeats}"
    name = f"{args.mode}{dense}{seeds}{start_from}{grid}{'-quick' if args.quick else ''}.json"
    path = RESULTS_DIR / name
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {path} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
