"""Host-memory settings of a training process.

PyTorch's CPU tensors come straight from ``malloc``. glibc serves a block above its mmap
threshold (128 KiB at first, rising with the blocks freed, at most 32 MiB) as a fresh
mapping and returns it to the kernel on ``free``, and it gives back the top of its heap when
more than its trim threshold is free there. An update's activations are a few MiB each and
are freed every micro-batch, so each one came back as new pages that the kernel zero-fills
on first touch: tens of thousands of page faults and up to a third of a CPU update's time
on the 2-core VM (`docs/benchmarks.md`, lever 17). Raising both thresholds keeps the freed
blocks in the heap, where the next micro-batch reuses them.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``)."""
TRIM_THRESHOLD_BYTES = 1 << 30
"""Free heap kept at its top before glibc returns it to the kernel."""


def keep_freed_memory() -> bool:
    """Raise glibc malloc's mmap threshold to 32 MiB and its trim threshold to 1 GiB for this
    process, so that freed blocks below 32 MiB are reused instead of unmapped and faulted in
    again. Returns False, and changes nothing, where the C library is not glibc.

    Process-wide, like `torch.set_num_threads`; it turns off glibc's own adjustment of the
    two thresholds. Peak RSS barely moves (the heap keeps what the process already used: within
    4 % in the learning benchmark), but up to 1 GiB of freed memory may stay resident until
    the process ends.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    trim_ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return bool(mmap_ok and trim_ok)
