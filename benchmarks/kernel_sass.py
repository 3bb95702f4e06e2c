"""Instructions per loop iteration of the update's attention kernels, compiled for an H100/H200
(sm_90) on any machine: a proxy for their speed when no GPU is at hand (lever 38 of
`docs/benchmarks.md`).

Each kernel of `rlvr/models/_gpu_kernels.py` (or that file at another revision, `--against`)
is compiled for sm_90 with bf16 tensors at the 0.5B shape (head size 64, 7 query heads per
key/value head, 64 × 64 blocks), with the 16-byte alignment Triton assumes at run time for
pointers and strides divisible by 16. The SASS (from `nvdisasm`, which ships with Triton) is
cut into loops at each branch back to an earlier label, and each loop's instructions and
matrix-multiply instructions (`HGMMA`/`HMMA`) are counted. Results go to
`benchmarks/results/kernel_sass.json`.

    python benchmarks/kernel_sass.py --against 95d1818
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
KERNELS = HERE.parent / "src" / "rlvr" / "models" / "_gpu_kernels.py"
POINTERS = {
    **dict.fromkeys(["rows", "row_prefix", "count"], "*i64"),
    **dict.fromkeys(["own_mask", "prefix_mask"], "*u8"),
    **dict.fromkeys(["lse", "delta", "part_dpk", "part_dpv"], "*fp32"),
    "scale": "fp32",
    **dict.fromkeys(["t", "sp", "PREFIX_BLOCKS"], "i32"),
}
INTEGERS = ("row", "head", "prefix", "pos")
ALIGNED = {"q_row", "q_head", "k_row", "k_head", "pk_prefix", "pk_head", "pk_pos", "mask_row"}
"""The strides that are multiples of 16 at the 0.5B shape (Triton specialises on that)."""
SHAPE = {"GROUP": 7, "DIM": 64, "BLOCK_D": 64, "PRECISION": "tf32", "BLOCK_M": 64, "BLOCK_N": 64}


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("kernels_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sass(kernel, constexprs: dict, warps: int = 4, stages: int = 3) -> str:
    """`kernel` compiled for sm_90 and disassembled."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = POINTERS[name]
        else:
            signature[name] = "i32" if name.endswith(INTEGERS) else "*bf16"
    attrs = {
        (n,): [["tt.divisibility", 16]]
        for n, name in enumerate(kernel.arg_names)
        if signature[name].startswith("*") or name in ALIGNED
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    nvdisasm = Path(triton.__path__[0]) / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run(
            [str(nvdisasm), "-c", cubin.name], capture_output=True, text=True, check=True
        ).stdout


def loops(text: str) -> list[dict[str, int]]:
    """Each loop of the disassembly (a branch back to an earlier label): its instructions and
    its matrix-multiply instructions."""
    at, label, instructions = {}, None, []
    for line in text.splitlines():
        if m := re.match(r"\s*\.L_x_(\d+):", line):
            label = int(m.group(1))
        elif m := re.search(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", line):
            address = int(m.group(1), 16)
            instructions.append((address, m.group(2)))
            if label is not None:
                at[label], label = address, None
    found = []
    for address, text_ in instructions:
        m = re.search(r"BRA.*\.L_x_(\d+)", text_)
        if m and at.get(int(m.group(1)), address) < address:
            body = [i for a, i in instructions if at[int(m.group(1))] <= a <= address]
            mma = sum(bool(re.search(r"\bH(G)?MMA", i)) for i in body)
            found.append({"instructions": len(body), "mma": mma})
    return found


def count(path: Path) -> dict[str, list[dict[str, int]]]:
    kernels = load(path)
    return {
        "forward": loops(sass(kernels.attention_queries_kernel, {**SHAPE, "BACKWARD": False})),
        "dq": loops(sass(kernels.attention_queries_kernel, {**SHAPE, "BACKWARD": True})),
        "dk, dv": loops(sass(kernels.attention_dkv_kernel, SHAPE)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision whose kernels to count as well")
    args = parser.parse_args()
    report = {
        "command": " ".join(["python", "benchmarks/kernel_sass.py", *sys.argv[1:]]),
        "shape": SHAPE,
        "results": {"working tree": count(KERNELS)},
    }
    if args.against:
        relative = KERNELS.relative_to(HERE.parent).as_posix()
        old = subprocess.run(
            ["git", "show", f"{args.against}:{relative}"],
            capture_output=True, text=True, check=True, cwd=HERE.parent,
        ).stdout  # fmt: skip
        with tempfile.NamedTemporaryFile("w", suffix=".py") as file:
            file.write(old)
            file.flush()
            report["results"][args.against] = count(Path(file.name))
    for revision, kernels in report["results"].items():
        for name, found in kernels.items():
            shown = ", ".join(f"{x['instructions']} ({x['mma']} MMA)" for x in found)
            print(f"{revision}, {name}: loops of {shown}")
    path = HERE / "results" / "kernel_sass.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
