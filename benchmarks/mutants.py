"""Operator mutation of one source file: which of its one-point changes its tests miss.

    python benchmarks/mutants.py src/rlvr/algorithms/shaping.py tests/test_algorithms_shaping.py
    python benchmarks/mutants.py src/rlvr/rewards/verify.py tests/test_rewards_verify.py \\
        --lines 189,190 -- -k fast_path

Every mutant changes one place of the file's syntax tree: ``+``↔``-``, ``*``↔``/``, ``**``→``*``;
``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``; ``and``↔``or``; a ``-x`` or ``not x`` loses its
operator; a number ``n`` becomes ``n + 1`` (an int), ``2n`` (a float) or 1 (a 0.0). Each is run
in a clone of the repository's HEAD (``git clone``, tests run with ``PYTHONPATH=src``), so the
working tree is never touched, and its tests are run with ``pytest -x``; a mutant whose tests
all pass "survives". A survivor is either a case no test checks or an equivalent mutant (``dim=-1``
for ``dim=1`` on a 2-D tensor, a bound no input reaches); docs/decisions.md ("The unit tests are
checked by mutation") records the rounds and what they found. Minutes per file, not for CI.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

SWAP_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
               ast.Pow: ast.Mult}  # fmt: skip
SWAP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}  # fmt: skip


def mutation_sites(tree: ast.AST) -> list[ast.AST]:
    """The nodes a mutant may change, in `ast.walk` order (the same for every parse)."""
    sites = []
    for node in ast.walk(tree):
        number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
        if (
            (isinstance(node, ast.BinOp) and type(node.op) in SWAP_BINARY)
            or (isinstance(node, ast.Compare) and type(node.ops[0]) in SWAP_COMPARE)
            or isinstance(node, ast.BoolOp)
            or (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)))
            or number
        ):
            sites.append(node)
    return sites


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST) -> None:
        self.target, self.replacement = target, replacement

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        return self.replacement if node is self.target else node


def mutant(source: str, index: int) -> tuple[int, str]:
    """(line, source) of the mutant that changes site `index` of `source`."""
    tree = ast.parse(source)
    node = mutation_sites(tree)[index]
    if isinstance(node, ast.BinOp):
        node.op = SWAP_BINARY[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[0] = SWAP_COMPARE[type(node.ops[0])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        tree = _Replace(node, node.operand).visit(tree)
    else:
        value = node.value
        node.value = value + 1 if isinstance(value, int) else (value * 2 if value else 1.0)
    return node.lineno, ast.unparse(ast.fix_missing_locations(tree))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", help="the file to mutate, relative to the repository root")
    parser.add_argument("tests", nargs="+", help="test files; pytest options go after --")
    parser.add_argument("--lines", default="", help="only these lines, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    options = argv[cut + 1 :]
    root = Path(__file__).resolve().parents[1]
    lines = {int(n) for n in args.lines.split(",") if n}
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        command += [*args.tests, *options]

        def tests_pass() -> bool:
            env = {"PYTHONPATH": "src", "PATH": "/usr/bin:/bin", "HOME": tmp}
            try:
                run = subprocess.run(
                    command, cwd=clone, env=env, capture_output=True, timeout=args.timeout
                )
            except subprocess.TimeoutExpired:
                return False
            return run.returncode == 0

        if not tests_pass():  # no tests selected (exit 5) or failing ones: every mutant "dies"
            sys.exit(f"the tests do not pass on HEAD itself: {' '.join(command[2:])}")
        target = clone / args.source
        original = target.read_text()
        total = survived = 0
        for index in range(len(mutation_sites(ast.parse(original)))):
            line, changed = mutant(original, index)
            if lines and line not in lines:
                continue
            target.write_text(changed)
            try:
                killed = not tests_pass()
            finally:
                target.write_text(original)
            total, survived = total + 1, survived + (not killed)
            text = original.splitlines()[line - 1].strip()
            print(f"{'killed  ' if killed else 'SURVIVED'} line {line}: {text}", flush=True)
        print(f"{total} mutants, {survived} survived", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
