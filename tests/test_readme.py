"""The README's Python example runs as written (on the tests' tiny settings) and trains on
its own reward."""

import importlib
import json
import re
from pathlib import Path

import rlvr.config
from tiny_run import TINY_RUN

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> str:
    (block,) = re.findall(r"### From Python\n.*?```python\n(.*?)```", README.read_text(), re.S)
    return block


def test_the_python_example_trains_on_its_own_reward(tmp_path, monkeypatch):
    resolve = rlvr.config.resolve_config

    def on_tiny_settings(*args, overrides=(), **kwargs):
        return resolve(*args, overrides=[*overrides, *TINY_RUN, "train.steps=2"], **kwargs)

    monkeypatch.setattr(rlvr.config, "resolve_config", on_tiny_settings)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(python_example(), namespace)

    run_dir = tmp_path / "runs" / "python"
    assert namespace["run_dir"] == Path("runs/python")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["reward/mean"] == m["reward/right_and_short"] for m in steps)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for sample in samples:  # the README's formula, computed again here
        by_hand = float(sample["answer"] in sample["completion"])
        by_hand -= 0.01 * len(sample["completion"].split())
        assert abs(sample["reward"] - by_hand) < 1e-6, sample
    assert len({round(s["reward"], 6) for s in samples}) > 1  # lengths differ, so do rewards


def test_the_names_the_example_s_paragraph_places_are_where_it_says():
    """'`X` and `Y` are in `module`, `Z` in `other`' after the example: each name imports."""
    after = README.read_text().split("### From Python", 1)[1].split("###", 1)[0]
    placed = re.findall(r"((?:`\w+`(?: and |, )?)+) (?:are )?in `(rlvr[\w.]*)`", after)
    assert placed, "the paragraph names no module"
    for names, module in placed:
        imported = importlib.import_module(module)
        for name in re.findall(r"`(\w+)`", names):
            assert hasattr(imported, name), (name, module)
