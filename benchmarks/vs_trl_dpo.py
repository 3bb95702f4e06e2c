"""rlvr dpo vs TRL's ``DPOTrainer``, side by side on the same CPU, model, pairs and settings.

    python benchmarks/vs_trl_dpo.py                 # 2 rounds of 20 steps, 32 pairs a step
    python benchmarks/vs_trl_dpo.py --quick         # a smoke version (about a minute)

Every run is a fresh subprocess (``--worker``), so peak RSS (the child's ``VmHWM``) is per run;
runs alternate rlvr / TRL / rlvr / TRL. Both load one saved random initialisation of the demo's
tiny Llama and its tokenizer and train on the same file of pairs (the demo's arithmetic task:
the worked solution chosen over a wrong bare answer, as ``tests/test_dpo.py`` builds them, so
the chosen responses are about twice as long as the rejected), plain-text prompts (no
template; TRL's non-conversational format), each response followed by EOS in both, with DPO's
sigmoid loss, β = 0.1, the reference log-probs computed once before training (TRL's
``precompute_ref_log_probs=True``; rlvr always does), fp32, AdamW at a constant learning rate
with no weight decay, gradient clipping at 1, dropout off, and ``torch.set_num_threads(2)``.
The pair order differs (each framework's own seeded shuffle); the pairs are alike in length.

Measured: ``step_s`` (median wall time of an optimizer step after the first), ``other_s``
(the run's wall time outside its optimizer steps: imports, loading, tokenizing, the reference
pass, rlvr's saving of the final model), the whole run's wall time, peak RSS, the training
forwards' token slots per pair (a forward pre-hook on the input embedding: TRL pads each batch
to its longest row and runs the prompt once per response, rlvr packs real tokens and runs each
prompt once), and the loss curve (both start at log 2, where the policy is its reference).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import vs_trl
from step_probes import peak_rss_mb

FRAMEWORKS = ("rlvr", "trl")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREADS = 2


@dataclass
class RunSpec:
    """Everything one worker run needs; written to JSON and read by the child process."""

    framework: str
    model_dir: str
    pairs_path: str
    output_dir: str
    result_path: str
    steps: int
    batch_size: int
    lr: float
    beta: float = 0.1
    seed: int = 0


class SlotCounter:
    """Token slots of the forwards that build a graph (the training ones), from a forward
    pre-hook on the input embedding (rlvr's lean forward does not call the model's forward)."""

    def __init__(self) -> None:
        self.train_slots = 0

    def __call__(self, module: Any, args: tuple) -> None:
        if torch.is_grad_enabled():
            self.train_slots += args[0].numel()


def write_pairs(path: Path, count: int) -> None:
    """The demo task's training problems as pairs: worked solution over a wrong bare answer."""
    from rlvr.data.synthetic import synthetic_splits

    problems, _ = synthetic_splits("arithmetic", train_size=count, test_size=1, seed=0)
    rows = [
        {"prompt": p.question, "chosen": p.solution, "rejected": f"It is {int(p.answer) + 1}."}
        for p in problems
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_rlvr(spec: RunSpec) -> dict:
    """`rlvr dpo` on the pairs file; per-step times from its metrics.jsonl."""
    import rlvr.training.preference as preference
    from rlvr.config import PREFERENCE_PRESETS, resolve_config
    from rlvr.config_offline import DPOConfig
    from rlvr.tracking.jsonl import read_jsonl

    counter = SlotCounter()
    load = preference.load_model_and_tokenizer

    def load_with_counter(*args: Any, **kwargs: Any) -> Any:
        model, tokenizer = load(*args, **kwargs)
        model.get_input_embeddings().register_forward_pre_hook(counter)
        return model, tokenizer

    preference.load_model_and_tokenizer = load_with_counter
    overrides = [
        f"model.name_or_path={spec.model_dir}",
        "data.task=file",
        f"data.path={spec.pairs_path}",
        "data.template=none",
        f"dpo.beta={spec.beta}",
        f"dpo.lr={spec.lr}",
        f"dpo.steps={spec.steps}",
        f"dpo.batch_size={spec.batch_size}",
        "dpo.eval_pairs=0",
        f"dpo.seed={spec.seed}",
        f"dpo.threads={THREADS}",
        f"dpo.output_dir={spec.output_dir}",
    ]
    cfg = resolve_config(None, "dpo", overrides, DPOConfig, preset_package=PREFERENCE_PRESETS)
    run_dir = preference.run_dpo(cfg, show_progress=False)
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    return {
        "step_s": [m["time/step"] for m in metrics],
        "loss": [m["loss"] for m in metrics],
        "train_slots": counter.train_slots,
    }


def run_trl(spec: RunSpec) -> dict:
    """TRL's DPOTrainer on the same pairs; per-step times from a callback."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from rlvr.models.loading import load_pretrained

    model, tokenizer = load_pretrained(spec.model_dir)
    counter = SlotCounter()
    model.get_input_embeddings().register_forward_pre_hook(counter)
    rows = [json.loads(line) for line in Path(spec.pairs_path).read_text().splitlines()]
    dataset = Dataset.from_list(rows)
    times: list[float] = []
    losses: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = DPOConfig(
        output_dir=spec.output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=spec.seed,
        max_steps=spec.steps,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=spec.batch_size,
        gradient_accumulation_steps=1,
        beta=spec.beta,
        loss_type=["sigmoid"],
        precompute_ref_log_probs=True,
        max_length=None,
        disable_dropout=True,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return {
        "step_s": times,
        "loss": losses,
        "train_slots": counter.train_slots,
    }


def worker(spec_path: Path) -> None:
    """Run one framework as the spec says; write the result JSON."""
    import datasets
    from transformers.utils import logging

    started = time.perf_counter()
    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    datasets.disable_progress_bars()
    torch.set_num_threads(THREADS)
    spec = RunSpec(**json.loads(spec_path.read_text()))
    out = (run_rlvr if spec.framework == "rlvr" else run_trl)(spec)
    out |= {"wall_s": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb()}
    Path(spec.result_path).write_text(json.dumps({"spec": asdict(spec), **out}, indent=1) + "\n")


def launch(spec: RunSpec, workdir: Path) -> dict:
    """`vs_trl.launch` of this script's worker: a fresh process per run."""
    return vs_trl.launch(spec, workdir, Path(__file__))


def summarize(result: dict, pairs_per_run: int) -> dict:
    """Medians over the steps after the first (warm-up) of one run."""
    steps = result["step_s"][1:] or result["step_s"]
    return {
        "other_s": result["wall_s"] - sum(result["step_s"]),
        "step_s": statistics.median(steps),
        "wall_s": result["wall_s"],
        "peak_rss_mb": result["peak_rss_mb"],
        "train_slots_per_pair": result["train_slots"] / pairs_per_run,
        "first_loss": result["loss"][0],
        "last_loss": result["loss"][-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1 round of 4 steps")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "vs_trl_dpo.json")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    rounds, steps = (1, 4) if args.quick else (args.rounds, args.steps)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vs_trl_dpo-"))
    workdir.mkdir(parents=True, exist_ok=True)

    from rlvr.demo import MODEL
    from rlvr.models.loading import save_pretrained
    from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    save_pretrained(
        build_tiny_model(tokenizer, **MODEL["tiny"], seed=0), tokenizer, workdir / "init"
    )
    pairs = workdir / "pairs.jsonl"
    write_pairs(pairs, steps * args.batch_size)
    runs: dict[str, list[dict]] = {name: [] for name in FRAMEWORKS}
    for r in range(rounds):
        for name in FRAMEWORKS:
            spec = RunSpec(
                framework=name,
                model_dir=str(workdir / "init"),
                pairs_path=str(pairs),
                output_dir=str(workdir / f"round{r}-{name}"),
                result_path=str(workdir / f"round{r}-{name}.json"),
                steps=steps,
                batch_size=args.batch_size,
                lr=args.lr,
            )
            runs[name].append(summarize(launch(spec, workdir), steps * args.batch_size))
    best = {name: min(runs[name], key=lambda s: s["step_s"]) for name in FRAMEWORKS}
    report = {
        "settings": {"rounds": rounds, "steps": steps, "batch_size": args.batch_size},
        "runs": runs,
        "ratios": {
            "steps_per_s": best["trl"]["step_s"] / best["rlvr"]["step_s"],
            "wall": best["trl"]["wall_s"] / best["rlvr"]["wall_s"],
            "other": best["trl"]["other_s"] / best["rlvr"]["other_s"],
            "peak_rss": best["rlvr"]["peak_rss_mb"] / best["trl"]["peak_rss_mb"],
            "train_slots": best["rlvr"]["train_slots_per_pair"]
            / best["trl"]["train_slots_per_pair"],
        },
    }
    print(f"\n{'':6}" + "".join(f"{k:>22}" for k in best["rlvr"]))
    for name in FRAMEWORKS:
        print(f"{name:6}" + "".join(f"{v:>22.4g}" for v in best[name].values()))
    print("rlvr vs TRL: " + ", ".join(f"{k} {v:.2f}" for k, v in report["ratios"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
