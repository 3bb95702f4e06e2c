"""C kernels for the lean forward on a CPU (`cpu_kernels.c`).

A decode step feeds one token per row, so its tensors are small and PyTorch's per-operation
overhead, not arithmetic, sets the pace of RMSNorm, the rotary embedding, SiLU·up and the
attention (`DecodeOps`). In training and prefill the same operations are memory-bound chains
of passes, forward and backward, and the attention runs over a padded layout; `rms_norm`,
`rotary`, `swiglu` and `attention` are autograd functions over one kernel pass each way.
`cpu_kernels.c` does each in one pass. The matmuls stay with PyTorch's BLAS, except a decode
step's, which it leaves on one core at these sizes (`PanelStore`). It is
compiled on first use with the system C compiler (`$CC`, else `cc`; `-O3 -march=native
-ffast-math -fopenmp`) into `$RLVR_KERNEL_CACHE` (default `~/.cache/rlvr/kernels`), keyed by
the source, the flags, the compiler and the CPU, and loaded with `ctypes`; the library links
the OpenMP runtime PyTorch already loaded, so both share one thread team.

Where there is no compiler, the build fails, or `RLVR_CPU_KERNELS=0`, `load` returns None
(with one warning saying why) and the lean forward keeps its PyTorch operations, which compute
the same function (tested to fp32 rounding).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

from rlvr.models import lora

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC")
LIBRARIES = (("-lmvec",), ())
"""Tried in order: glibc's vector math library (vectorised `expf`), then none."""
DISABLE_ENV = "RLVR_CPU_KERNELS"
CACHE_ENV = "RLVR_KERNEL_CACHE"

_c_float, _c_long, _c_int, _ptr = ctypes.c_float, ctypes.c_long, ctypes.c_int, ctypes.c_void_p
SIGNATURES = {
    "rms_norm": [_ptr, _ptr, _ptr, _c_long, _c_long, _c_float, _c_int],
    "rms_norm_keep": [_ptr] * 4 + [_c_long, _c_long, _c_float, _c_int],
    "rms_norm_backward": [_ptr] * 6 + [_c_long, _c_long, _c_int],
    "rotary": [_ptr, _ptr, _ptr, _c_long, _c_long, _c_long, _c_int],
    "silu_mul": [_ptr, _ptr, _c_long, _c_int],
    "decode_attention": [_ptr] * 9 + [_c_long] * 10 + [_c_float, _c_int],
    "compact_rows": [_ptr, _ptr] + [_c_long] * 5,
    "swiglu": [_ptr, _ptr, _ptr, _c_long, _c_int],
    "swiglu_backward": [_ptr] * 5 + [_c_long, _c_int],
    "rotary_out": [_ptr] * 4 + [_c_long] * 3 + [_c_float, _c_int],
    "attention_forward": [_ptr] * 11 + [_c_long] * 9 + [_c_float, _c_int],
    "attention_backward": [_ptr] * 17 + [_c_long] * 9 + [_c_float, _c_int],
    "pack_panels": [_ptr, _ptr, _c_long, _c_long],
    "panel_linear": [_ptr, _ptr, _c_long, _c_long, _c_long, _ptr, _ptr, _ptr, _c_int],
    "panels_pay": [],
}


class KernelBuildError(RuntimeError):
    """The C compiler could not build `cpu_kernels.c`."""


def cache_dir() -> Path:
    """Where built libraries are kept."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlvr" / "kernels"


def _cpu_signature() -> str:
    """The CPU's model and feature flags (a `-march=native` build runs only where they match)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(wanted)))


def build(compiler: str, out_dir: Path, source_path: Path | None = None) -> Path:
    """Compile `source_path` (default `SOURCE`, `cpu_kernels.c`) into `out_dir` (once per
    source, flags, compiler and CPU); return the library's path. Raises KernelBuildError with
    the compiler's message."""
    source_path = source_path or SOURCE
    path = shutil.which(compiler)
    if path is None:
        raise KernelBuildError(f"C compiler {compiler!r} not found (set $CC)")
    source = source_path.read_bytes()
    errors = []
    for libraries in LIBRARIES:
        command = [path, *FLAGS, str(source_path), *libraries]
        recipe = repr([path, FLAGS, libraries, _cpu_signature()]).encode()
        key = hashlib.sha256(source + recipe).hexdigest()[:16]
        target = out_dir / f"cpu_kernels-{key}.so"
        if target.exists():
            return target
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
            built = Path(scratch) / target.name
            result = subprocess.run(
                [*command, "-o", str(built)], capture_output=True, text=True, check=False
            )
            if result.returncode == 0:
                built.replace(target)  # atomic: a concurrent build leaves one whole file
                return target
        errors.append(f"{' '.join(command)}: {result.stderr.strip()[-500:]}")
    raise KernelBuildError("building " + str(source_path) + " failed:\n" + "\n".join(errors))


RETURNS = {
    "compact_rows": _c_int,
    "attention_forward": _c_int,
    "attention_backward": _c_int,
    "panels_pay": _c_int,
}
"""Kernels that return a value (the others return nothing)."""


def open_library(path: Path) -> ctypes.CDLL:
    """The built library at `path`, with the C signatures of the kernels it has declared (a
    build of an older `cpu_kernels.c`, as `benchmarks/cpu_kernels_ab.py` makes, lacks the
    newer ones)."""
    library = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        if hasattr(library, name):
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, RETURNS.get(name)
    return library


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The built kernels, or None (warned once) where they cannot be built or loaded."""
    try:
        return open_library(build(os.environ.get("CC", "cc"), cache_dir()))
    except (KernelBuildError, OSError) as error:
        log.warning("rlvr CPU decode kernels unavailable, using PyTorch operations: %s", error)
        return None


def trainable(x: torch.Tensor) -> bool:
    """Whether the kernels with a backward (`rms_norm`, `rotary`, `swiglu`, `attention`) may
    compute on `x`: fp32 on the CPU, not turned off (`RLVR_CPU_KERNELS=0`), and built; with
    autograd on or off."""
    return (
        x.device.type == "cpu"
        and os.environ.get(DISABLE_ENV) != "0"
        and x.dtype == torch.float32
        and load() is not None
    )


def usable(x: torch.Tensor) -> bool:
    """Whether the decode kernels, which have no backward, may compute on `x`: `trainable`,
    and outside autograd."""
    return not torch.is_grad_enabled() and trainable(x)


def compact_rows(buffer: torch.Tensor, rows: torch.Tensor, length: int) -> bool:
    """Move rows `rows` (on the CPU) of a contiguous cache buffer [batch, heads, capacity,
    dim] to its leading rows, copying the first `length` positions of each, in place and once
    (finished sequences leaving the batch). Returns False, and does nothing, where the kernels
    are not `usable` on `buffer`, it is not contiguous, or `rows` is not strictly increasing
    (the in-place order needs rows[i] >= i)."""
    if not (usable(buffer) and buffer.is_contiguous()):
        return False
    index = rows.to(torch.long).contiguous()
    _, heads, capacity, dim = buffer.shape
    _check(0 <= length <= capacity, "compact_rows: length outside the buffer")
    moved = load().compact_rows(
        buffer.data_ptr(),
        index.data_ptr(),
        len(index),
        buffer.stride(0),
        buffer.stride(1),
        heads,
        length * dim,
    )
    return bool(moved)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up and its backward, each one pass of a kernel."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        _check(gate.shape == up.shape, "swiglu: gate and up differ in shape")
        out = torch.empty_like(gate)
        threads = torch.get_num_threads()
        load().swiglu(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), threads)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad = grad.contiguous()
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
        load().swiglu_backward(
            grad.data_ptr(),
            gate.data_ptr(),
            up.data_ptr(),
            d_gate.data_ptr(),
            d_up.data_ptr(),
            gate.numel(),
            torch.get_num_threads(),
        )
        return d_gate, d_up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    heads, dim = x.shape[-2], x.shape[-1]
    rows = x.numel() // (heads * dim)
    _check(cos.numel() == rows * dim == sin.numel(), "rotary: one angle row per token needed")
    out = torch.empty_like(x)
    load().rotary_out(
        x.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
        rows,
        heads,
        dim,
        sign,
        torch.get_num_threads(),
    )
    return out


class _Rotary(torch.autograd.Function):
    """The rotary embedding and its backward (the rotation by the negated angles)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return _rotate(x.contiguous(), cos, sin, 1.0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad.contiguous(), cos, sin, -1.0), None, None


class _RMSNorm(torch.autograd.Function):
    """RMSNorm and its backward, each one pass of a kernel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x, weight = x.contiguous(), weight.contiguous()
        dim = x.shape[-1]
        _check(weight.shape == (dim,), "rms_norm: one weight per feature needed")
        y, inverse = torch.empty_like(x), x.new_empty(x.numel() // dim)
        load().rms_norm_keep(
            x.data_ptr(), weight.data_ptr(), y.data_ptr(), inverse.data_ptr(), len(inverse),
            dim, eps, torch.get_num_threads(),
        )  # fmt: skip
        ctx.save_for_backward(x, weight, inverse)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, inverse = ctx.saved_tensors
        grad = grad.contiguous()
        threads = torch.get_num_threads()
        dx, parts = torch.empty_like(x), x.new_zeros(threads, x.shape[-1])
        load().rms_norm_backward(
            grad.data_ptr(), x.data_ptr(), weight.data_ptr(), inverse.data_ptr(), dx.data_ptr(),
            parts.data_ptr(), len(inverse), x.shape[-1], threads,
        )  # fmt: skip
        return dx, parts.sum(0), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last axis of x (Zhang & Sennrich 2019, eq. 4), times `weight`,
    differentiable, by the kernels."""
    return _RMSNorm.apply(x, weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up (Shazeer 2020, eq. 6), differentiable, by the kernels."""
    return _SwiGLU.apply(gate, up)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding (RoFormer eq. 34, half-split) of x [..., heads, dim] with cos, sin
    [..., 1, dim] (one row of angles per token), differentiable, by the kernels."""
    return _Rotary.apply(x, cos, sin)


class _Attention(torch.autograd.Function):
    """`attention`, forward and backward each one kernel call (`attention_forward`,
    `attention_backward` in cpu_kernels.c)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pk: torch.Tensor,
        pv: torch.Tensor,
        layout: AttentionLayout,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:2])
        status = load().attention_forward(
            *_pointers(q, k, v, layout.rows, layout.own_mask, pk, pv, layout.prefix_mask,
                       layout.starts, out, lse), *_attention_shape(q, pk, layout), scale,
            torch.get_num_threads(),
        )  # fmt: skip
        _allocated(status, pk)
        ctx.save_for_backward(q, k, v, pk, pv, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, pk, pv, out, lse = ctx.saved_tensors
        layout = ctx.layout
        grad = grad.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dpk, dpv = pk.new_zeros(pk.shape), pv.new_zeros(pv.shape)
        status = load().attention_backward(
            *_pointers(q, k, v, layout.rows, layout.own_mask, pk, pv, layout.prefix_mask,
                       layout.starts, out, lse, grad, dq, dk, dv, dpk, dpv),
            *_attention_shape(q, pk, layout), ctx.scale, torch.get_num_threads(),
        )  # fmt: skip
        _allocated(status, pk)
        return dq, dk, dv, dpk, dpv, None, None


def _allocated(status: int, prefix_k: torch.Tensor) -> None:
    """Raise MemoryError where an attention kernel (status -1) could not allocate the per-thread
    scratch for a row's prefix and own keys."""
    if status != 0:
        raise MemoryError(
            "cpu_kernels: attention could not allocate its per-thread scratch for "
            f"{prefix_k.shape[2]} prefix keys of size {prefix_k.shape[3]}"
        )


def _pointers(*tensors: torch.Tensor) -> list[int]:
    return [x.data_ptr() for x in tensors]


def _attention_shape(q: torch.Tensor, pk: torch.Tensor, layout: AttentionLayout) -> list[int]:
    """prefixes, t, sp, q_heads, kv_heads, dim and the prefix keys' strides, as the attention
    kernels take them."""
    prefixes, kv_heads, sp, dim = pk.shape
    return [prefixes, layout.rows.shape[1], sp, q.shape[1], kv_heads, dim, *pk.stride()[:3]]


class AttentionLayout:
    """Where the keys of each row of a batch are, for `attention`: row b has the sp keys of its
    prefix (shared by the rows starts[p] .. starts[p+1] - 1 of prefix p) and then its own t
    positions, of which those with rows[b, i] >= 0 are computed, at that row of the per-token
    tensors. A query sees its prefix's keys where prefix_mask [prefixes, sp] is 1, and its row's
    own earlier keys where own_mask [batch, t] is 1 (and always its own). On the device of the
    attention's tensors (the CPU here, a GPU for `gpu_kernels.attention`); checked once here,
    and its derived tensors made at their first use, not at each layer's call."""

    def __init__(
        self,
        rows: torch.Tensor,
        own_mask: torch.Tensor,
        prefix_mask: torch.Tensor,
        starts: torch.Tensor,
    ) -> None:
        self.rows = rows.to(torch.long).contiguous()
        self.own_mask = own_mask.to(torch.uint8).contiguous()
        self.prefix_mask = prefix_mask.to(torch.uint8).contiguous()
        self.starts = starts.to(torch.long).contiguous()
        batch, t = self.rows.shape
        _check(self.own_mask.shape == (batch, t), "attention: own_mask is not [batch, t]")
        _check(
            self.starts.dim() == 1
            and len(self.starts) == len(self.prefix_mask) + 1
            and int(self.starts[0]) == 0
            and int(self.starts[-1]) == batch
            and bool((self.starts[1:] >= self.starts[:-1]).all()),
            "attention: starts must run from 0 to batch, one more entry than prefixes",
        )
        self.queries = int(self.rows.max()) + 1 if self.rows.numel() else 0

    @cached_property
    def row_prefix(self) -> torch.Tensor:
        """[batch] the prefix of each row (made once, for `gpu_kernels.attention`)."""
        batch_rows = torch.arange(self.rows.shape[0], device=self.rows.device)
        return torch.searchsorted(self.starts, batch_rows, right=True) - 1

    @cached_property
    def varlen(self) -> Any:
        """`flash_varlen.plan` of this layout (made once, for `fused.gpu_attention`)."""
        from rlvr.models import flash_varlen

        return flash_varlen.plan(self)

    @cached_property
    def count(self) -> torch.Tensor:
        """[batch] one past each row's last computed position (made once)."""
        batch, t = self.rows.shape
        computed = torch.arange(1, t + 1, device=self.rows.device) * (self.rows >= 0)
        return computed.amax(1) if t else self.rows.new_zeros(batch)

    def sent(self, send: Callable[[torch.Tensor], torch.Tensor]) -> AttentionLayout:
        """This layout with its tensors, and the derived ones made so far (a `varlen` plan's
        among them), passed through `send`: a layout made and checked on the host, sent to a
        GPU without reading anything back there (`fused.KernelOps`, lever 54)."""

        def moved(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return send(value)
            if hasattr(value, "_fields"):  # a NamedTuple such as `flash_varlen.Plan`
                return type(value)(*(moved(x) for x in value))
            return value

        copy = object.__new__(AttentionLayout)
        copy.__dict__.update({name: moved(value) for name, value in vars(self).items()})
        return copy


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale over the visible keys)·v, differentiable, by the kernels: what
    `fused.attention` computes under `fused.mask_bias` over each row's concatenated prefix and
    own keys, computed only for the queries that have a row, only over the keys each sees, and
    reading a prefix shared by several rows in place.

    q [n, q_heads, dim], k, v [n, kv_heads, dim]: per computed position (`layout.rows`);
    prefix_k, prefix_v [prefixes, kv_heads, sp, dim] with the same strides, the last axis
    dense. Returns [n, q_heads, dim].
    """
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    check_attention(q, k, v, prefix_k, prefix_v, layout, "cpu_kernels")
    return _Attention.apply(q, k, v, prefix_k, prefix_v, layout, scale)


def check_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    layout: AttentionLayout,
    module: str,
) -> None:
    """Raise ValueError, naming `module` and what is wrong, unless the arguments fit
    `attention`'s (and `gpu_kernels.attention`'s) shapes and layout."""
    n, q_heads, dim = q.shape
    prefixes, kv_heads, sp, _ = prefix_k.shape
    problems = [
        (k.shape == v.shape == (n, kv_heads, dim), "q, k, v shapes differ"),
        (q_heads % kv_heads == 0, "query heads not a multiple of kv heads"),
        (prefix_v.shape == prefix_k.shape and prefix_k.shape[3] == dim, "prefix shape"),
        (
            prefix_k.stride() == prefix_v.stride() and prefix_k.stride(3) == 1,
            "prefix keys and values layout",
        ),
        (layout.prefix_mask.shape == (prefixes, sp), "prefix_mask is not [prefixes, sp]"),
        (layout.queries <= n, "rows point past q"),
    ]
    for fine, what in problems:
        if not fine:
            raise ValueError(f"{module}: attention: {what}")


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(f"cpu_kernels: {what}")


def linear(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """`module(x)`: without the module call for a plain `nn.Linear`; an adapter around one
    (LoRA) by its own forward."""
    if type(module) is not torch.nn.Linear:
        return module(x)
    return torch.nn.functional.linear(x, module.weight, module.bias)


PANEL = 16
"""Output columns per packed panel (`PANEL` in `cpu_kernels.c`)."""


class PanelGroup(NamedTuple):
    """Modules packed together (`PanelStore`): their weights one after another, a copy of
    their biases (held for `c_biases`, which points at them), their input size, output
    sizes, and the sizes and biases as C arrays."""

    modules: tuple[torch.nn.Linear, ...]
    panels: torch.Tensor
    biases: list[torch.Tensor | None]
    k: int
    widths: list[int]
    c_widths: Any
    c_biases: Any


class PanelStore:
    """The weights of a decode step's products packed for `panel_linear`, each group of
    modules once, at its first product: copies, so valid only while the weights do not
    change. The rollout engine's decoder (`fused.FusedForward`) lives for one rollout and
    keeps a store of its own; the packed copies (as large as the weights) go with it.

    `panel_linear` splits the output columns between the threads, where PyTorch's BLAS runs a
    decode step's products (128 rows × 192 hidden) on one of two cores (lever 53 of
    `docs/benchmarks.md`)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...], PanelGroup] = {}
        """By the modules' ids (the groups hold the modules, so no other module takes an id
        while the store lives)."""

    def _packed(self, modules: tuple[torch.nn.Linear, ...]) -> PanelGroup:
        key = tuple(id(m) for m in modules)
        if key not in self.groups:
            lib = load()
            k = modules[0].in_features
            _check(all(m.in_features == k for m in modules), "panel products: input sizes differ")
            sizes = [-(-m.out_features // PANEL) * PANEL * k for m in modules]
            panels = torch.empty(sum(sizes), dtype=torch.float32)
            for m, part in zip(modules, panels.split(sizes), strict=True):
                weight = m.weight.detach().contiguous()
                _check(weight.dtype == torch.float32, "panel products take fp32 weights")
                lib.pack_panels(weight.data_ptr(), part.data_ptr(), m.out_features, k)
            biases = [None if m.bias is None else m.bias.detach().float().clone() for m in modules]
            n = len(modules)
            self.groups[key] = PanelGroup(
                modules, panels, biases, k, [m.out_features for m in modules],
                (ctypes.c_long * n)(*(m.out_features for m in modules)),
                (ctypes.c_void_p * n)(*(None if b is None else b.data_ptr() for b in biases)),
            )  # fmt: skip
        return self.groups[key]

    def products(
        self, x: torch.Tensor, modules: tuple[torch.nn.Linear, ...]
    ) -> tuple[torch.Tensor, ...]:
        """x [..., k] (contiguous fp32) through each of `modules` (bias or none; one input
        size): contiguous [..., out_features] outputs, `F.linear`'s up to rounding, on
        PyTorch's intra-op threads."""
        group = self._packed(modules)
        k = group.k
        _check(
            x.is_contiguous() and x.dtype == torch.float32 and x.shape[-1] == k,
            "panel products take a contiguous fp32 x of the modules' input size",
        )
        ys = [x.new_empty(*x.shape[:-1], width) for width in group.widths]
        load().panel_linear(
            x.data_ptr(), group.panels.data_ptr(), x.numel() // k, k, len(ys),
            (ctypes.c_void_p * len(ys))(*(y.data_ptr() for y in ys)), group.c_widths,
            group.c_biases, torch.get_num_threads(),
        )  # fmt: skip
        return tuple(ys)


def panels_pay() -> bool:
    """Whether a decode step's products run faster by `PanelStore` than by PyTorch's BLAS,
    as measured: with two threads or more (on one the BLAS is the faster, about 100 against
    70 GFLOP/s for 128 rows × 192 hidden on the AMD EPYC VM), on a CPU with AVX2 and FMA and
    without AVX-512 (the library's `panels_pay`; on the AVX-512 Xeon VM the BLAS ran these
    products at 220–300 GFLOP/s, more than the kernel's 8-wide vectors reach), or on an AMD
    Zen 4 (`splits_512_bit_vectors`: there the BLAS's AVX-512 reached 83–121 GFLOP/s on these
    products, and the panels made the demo model's decode 1.22–1.26× faster)."""
    lib = load()
    if torch.get_num_threads() < 2 or lib is None:
        return False
    return bool(lib.panels_pay()) or splits_512_bit_vectors()


@functools.cache
def splits_512_bit_vectors(cpuinfo: str | None = None) -> bool:
    """Whether the CPU is an AMD Zen 4 (vendor AuthenticAMD, family 25, AVX-512), which runs
    each 512-bit operation as two 256-bit halves, so 16-wide vectors do no more work a cycle
    than 8-wide ones (`cpuinfo`: /proc/cpuinfo's text; read from there when None). Zen 3,
    the same family, has no AVX-512; Zen 5 (family 26) runs 512 bits at once."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return (
        fields.get("vendor_id") == "AuthenticAMD"
        and fields.get("cpu family") == "25"
        and "avx512f" in fields.get("flags", "").split()
    )


class Composites:
    """The fused forward's operations made of others, for a set of them that has `rms_norm`,
    `projections` and `silu_mul` (`fused.PackedOps` replaces both with kernels of their own)."""

    linear = staticmethod(linear)

    def add_rms_norm(
        self, h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after adding `delta` to h, and its `rms_norm`."""
        h = h + delta
        return h, self.rms_norm(h, weight, eps)

    def mlp_inner(
        self, x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear
    ) -> torch.Tensor:
        """The SwiGLU MLP's input to its down projection, silu(x·W_gate)·(x·W_up)."""
        return self.silu_mul(*self.projections(x, gate, up))


class DecodeOps(Composites):
    """The lean forward's decode-step operations computed by the C kernels.

    `visible` [batch, len] (bool) marks the keys each row's query attends to. Inputs must be
    contiguous where the kernels read them flat (checked).
    """

    def __init__(self, visible: torch.Tensor, panels: PanelStore | None = None) -> None:
        """`panels`: where the products' packed weights are kept (`PanelStore`); None, or where
        they do not pay (`panels_pay`), for PyTorch's products."""
        self.lib = load()
        self.visible = visible.to(torch.uint8).contiguous()
        self.threads = torch.get_num_threads()
        self.panels = panels if panels_pay() else None

    def projections(self, x: torch.Tensor, *modules: torch.nn.Linear) -> tuple[torch.Tensor, ...]:
        """x through each of `modules`: contiguous outputs, as the kernels below read them.
        A LoRA layer's base weight goes into the panels and its low-rank term is added
        (`lora.update_term`); other adapters run by their own forward."""
        if self.panels is not None and all(type(m) is torch.nn.Linear for m in modules):
            return self.panels.products(x, modules)
        bases = tuple(lora.base_layer(m) for m in modules)
        if self.panels is None or not all(type(b) is torch.nn.Linear for b in bases):
            return tuple(linear(x, m) for m in modules)
        ys = self.panels.products(x, bases)
        terms = (lora.update_term(m, x) for m in modules)
        return tuple(y if t is None else y.add_(t) for y, t in zip(ys, terms))

    def linear(self, x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
        """`module(x)`, by `projections`."""
        return self.projections(x, module)[0]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of the last axis of x, times `weight`."""
        _check(x.is_contiguous() and weight.is_contiguous(), "rms_norm needs contiguous input")
        dim = x.shape[-1]
        y = torch.empty_like(x)
        self.lib.rms_norm(
            x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // dim, dim, eps, self.threads
        )
        return y

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x [..., heads, dim] in place; cos, sin [..., 1, dim]."""
        _check(
            x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous(),
            "rotate needs contiguous input",
        )
        heads, dim = x.shape[-2:]
        rows = x.numel() // (heads * dim)
        _check(cos.numel() == rows * dim == sin.numel(), "rotate: one cos/sin row per token")
        self.lib.rotary(
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, heads, dim, self.threads
        )
        return x

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, written into `gate`."""
        _check(gate.is_contiguous() and up.is_contiguous(), "silu_mul needs contiguous input")
        _check(gate.shape == up.shape, "silu_mul: gate and up differ in shape")
        self.lib.silu_mul(gate.data_ptr(), up.data_ptr(), gate.numel(), self.threads)
        return gate

    @staticmethod
    def cached(cache: Any, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Add one position's k, v [b, 1, kv_heads, dim] to `cache` (a `kv_cache.KVStore`);
        return the layer's keys and values as `attention` takes them after q (a
        `kv_cache.SharedPromptKV` gives each row's own and its prompt's apart)."""
        return cache.update(layer, k.transpose(1, 2), v.transpose(1, 2))

    def attend(self, q: torch.Tensor, *kv: torch.Tensor, scale: float) -> torch.Tensor:
        """`attention` of the per-token queries q [b, 1, q_heads, dim] over what `cached`
        returned; returns [b, 1, q_heads·dim] (with one position, the per-token and per-head
        layouts coincide)."""
        b, _, heads, dim = q.shape
        return self.attention(q.view(b, heads, 1, dim), *kv, scale=scale).view(b, 1, heads * dim)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        prompt_k: torch.Tensor | None = None,
        prompt_v: torch.Tensor | None = None,
        prompt_of: torch.Tensor | None = None,
        *,
        scale: float,
    ) -> torch.Tensor:
        """One query per row: q [b, q_heads, 1, dim] against k, v [b, kv_heads, len, dim] (views
        of a cache with any batch and head strides), after, when given, the keys and values of
        row b's prompt, prompt_k[prompt_of[b]], prompt_v[prompt_of[b]] ([prompts, kv_heads,
        plen, dim], views of the same kind): the prompt's keys read once for all its rows, not
        copied into each. `visible` covers the plen prompt keys, then the len own ones.
        Returns [b, q_heads, 1, dim]."""
        b, nq, t, d = q.shape
        nkv, length = k.shape[1], k.shape[2]
        _check(t == 1 and q.is_contiguous(), "attention takes one contiguous query per row")
        plen, rows_prompt = 0, 0  # without prompts the kernel reads neither
        if prompt_k is not None:
            plen = prompt_k.shape[2]
            _check(
                prompt_k.stride() == prompt_v.stride()
                and prompt_k.stride()[2:] == (d, 1)
                and prompt_k.shape[1] == nkv
                and prompt_of is not None
                and prompt_of.dtype == torch.long
                and prompt_of.shape == (b,)
                and prompt_of.is_contiguous(),
                "attention: prompt keys, values or rows do not match",
            )
            low, high = (int(x) for x in torch.aminmax(prompt_of)) if b else (0, 0)
            _check(low >= 0 and high < len(prompt_k), "attention: a row's prompt is not given")
            rows_prompt = prompt_of.data_ptr()
        else:
            prompt_k, prompt_v = k, v
        _check(k.stride() == v.stride(), "attention: keys and values differ in layout")
        _check(k.stride(2) == d and k.stride(3) == 1, "attention: cache positions not dense")
        _check(self.visible.shape == (b, plen + length), "attention: mask does not match the keys")
        out = torch.empty_like(q)
        scores = q.new_empty(self.threads, nq // nkv * (plen + length))
        self.lib.decode_attention(
            q.data_ptr(), prompt_k.data_ptr(), prompt_v.data_ptr(), rows_prompt,
            k.data_ptr(), v.data_ptr(), self.visible.data_ptr(), out.data_ptr(),
            scores.data_ptr(), b, nq, nkv, plen, length, d, prompt_k.stride(0),
            prompt_k.stride(1), k.stride(0), k.stride(1), scale, self.threads,
        )  # fmt: skip
        return out
