"""`benchmarks/tool_learning.py`'s data: each tool-calling solution calls the calculator on the
question's own expression, and the calculator's output is the problem's answer."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import pytest
import tool_learning

from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout.call_formats import call_format
from rlvr.rollout.tools import calculator, run_tool


def test_the_tool_solutions_call_the_calculator_on_the_question(tmp_path):
    worked, tool, test = tool_learning.write_files(tmp_path, 50, 10)
    rows = [json.loads(line) for line in tool.open()]
    plain = [json.loads(line) for line in worked.open()]
    assert len(rows) == len(plain) == 50 and sum(1 for _ in test.open()) == 10
    for row, same in zip(rows, plain, strict=True):
        expression = row["prompt"].removeprefix("What is ").removesuffix("?")
        assert row["solution"] == (
            f"<calculator>{expression}</calculator><result>{row['answer']}</result>"
            f"<answer>{row['answer']}</answer>"
        )
        assert calculator(expression) == row["answer"] == same["answer"]
        assert same["solution"].endswith(f"<answer>{row['answer']}</answer>")


@pytest.mark.parametrize("form", ["tags", "code", "hermes"])
def test_each_formats_solutions_call_the_tool_on_the_question(tmp_path, form):
    """Read back with the format, each solution's call runs the tool on the question's
    expression, and what follows it is the tool's output as the format writes it, then the
    answer."""
    _, tool, _ = tool_learning.write_files(tmp_path, 12, 2, form)
    written, name = call_format(form, build_tiny_tokenizer()), tool_learning.TOOL[form]
    (stop,) = written.stops([name])
    for row in map(json.loads, tool.open()):
        solution, answer = row["solution"], row["answer"]
        end = solution.index(stop) + len(stop)
        (call,) = written.parse(solution[:end], [name])
        assert call.tool == name and run_tool(name, call.arguments, 5.0) == answer
        assert solution[end:] == written.result([answer]) + f"<answer>{answer}</answer>"
