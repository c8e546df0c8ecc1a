"""glibc's ``malloc`` made to keep the memory a process frees, for timings that do not depend on
what the previous call left mapped (``bench_trace.py --steady-allocator``). Imports no torch."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Optional

#: glibc's ``mallopt`` parameters (``malloc.h``): ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD``.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def steady_allocator() -> Optional[str]:
    """Have glibc's ``malloc`` keep the memory a process frees, for the rest of the process: every
    block up to 1 GiB from the heap (``M_MMAP_THRESHOLD``; by default a block above an adaptive
    threshold of 128 KiB to 32 MiB gets a fresh mapping, page-faulted in again on every use) and no
    trimming of the heap's top (``M_TRIM_THRESHOLD`` 1 GiB). After the warm-up round no timed call
    page-faults, so a call's time no longer depends on which call ran before it and what that one
    left mapped (measured on GPT-2, one thread: 1,500 to 6,500 minor faults a call otherwise, 3 to
    14 ms of system time, in an order the rotation only averages out). jemalloc and tcmalloc, which
    serving stacks preload, keep freed memory in the same way. Returns None, or why it cannot (not
    glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return f"no glibc mallopt ({exc})"
    if not (mallopt(_M_MMAP_THRESHOLD, 1 << 30) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)):
        return "glibc's mallopt refused the thresholds"
    return None
