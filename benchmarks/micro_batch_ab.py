"""A/B of rlvr's training token budget per micro-batch (`train.micro_batch_tokens`), rlvr
alone, runs alternating in fresh processes (vs_trl.py's worker, 2 threads).

Two cases with the dense reward (every sample is trained, equal lengths forced): the
systems-mode batch (16 prompts × 8 samples, 64 tokens) and the scaling mode's longest point
(4 prompts × 8 samples, 512 tokens). Reported per run: the medians of steps 2..N of the
train and step seconds, and the peak RSS.

    python benchmarks/micro_batch_ab.py
    python benchmarks/micro_batch_ab.py --quick   # a smoke version (< 1 minute)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from vs_trl import RESULTS_DIR, ModeSettings, launch, make_spec, prepare_model, quiet, summarize

BUDGETS = (16384, 4096, 2048)
CASES = {
    "16 x 8, 64 tokens": ModeSettings(
        steps=8, prompts_per_step=16, samples_per_prompt=8, max_new_tokens=64, lr=1e-4
    ),
    "4 x 8, 512 tokens": ModeSettings(
        steps=8, prompts_per_step=4, samples_per_prompt=8, max_new_tokens=512, lr=1e-4
    ),
}
QUICK = {
    "2 x 4, 16 tokens": ModeSettings(
        steps=2, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=16, lr=1e-4
    )
}


def settings_ab(
    cases: dict[str, ModeSettings], settings: dict[str, list[str]], repeats: int, prefix: str
) -> dict[str, dict[str, list[dict]]]:
    """rlvr alone under each named list of config overrides, dense reward, `repeats` rounds
    alternating over the settings in fresh processes: per case and setting, each run's medians
    of the train and step seconds and its peak RSS (printed as they come)."""
    report: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as tmp:
        workdir = Path(tmp)
        model_dir = prepare_model(workdir, 0)
        for case_index, (case, mode) in enumerate(cases.items()):
            mode.reward = "dense"
            runs: dict[str, list[dict]] = {name: [] for name in settings}
            for rep in range(repeats):
                for index, (name, overrides) in enumerate(settings.items()):
                    run_name = f"{prefix}{index}-{case_index}-{rep}"
                    spec = make_spec(
                        "rlvr", run_name, workdir, model_dir, mode, rlvr_overrides=overrides
                    )
                    s = summarize(launch(spec, workdir))
                    runs[name].append(
                        {k: s[k] for k in ("train_s", "step_s", "rollout_s", "peak_rss_mb")}
                    )
            report[case] = runs
            for name, r in runs.items():
                cells = ", ".join(
                    f"train {x['train_s']:.3f} s, step {x['step_s']:.3f} s, "
                    f"RSS {x['peak_rss_mb']:.0f} MiB"
                    for x in r
                )
                print(f"{case}, {name}: {cells}", flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke version")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per budget")
    args = parser.parse_args()
    quiet()
    cases, budgets = (QUICK, (16384, 64)) if args.quick else (CASES, BUDGETS)
    settings = {str(b): [f"train.micro_batch_tokens={b}"] for b in budgets}
    report = settings_ab(cases, settings, args.repeats, "mb")
    name = "micro_batch_ab-quick.json" if args.quick else "micro_batch_ab.json"
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / name).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
