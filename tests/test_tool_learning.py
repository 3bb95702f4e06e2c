"""`benchmarks/tool_learning.py`'s data: each tool-calling solution calls the calculator on the
question's own expression, and the calculator's output is the problem's answer."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import tool_learning

from rlvr.rollout.tools import calculator


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
