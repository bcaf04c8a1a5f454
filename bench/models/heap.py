"""Keep a CPU generation's large activations on the heap (glibc), so they are reused, not page-faulted.

glibc serves every allocation above 32 MiB (the ceiling of its mmap threshold) with a fresh ``mmap``
and unmaps it on free. A var-d16 VQVAE decode at 256² allocates dozens of 40 MiB activations, so
each decode faults in about 1.3 GiB of fresh zeroed pages: a fifth of the decode's time on 2 CPU
threads, spent in the kernel. Inside ``reuse_heap()`` glibc may not ``mmap`` (``M_MMAP_MAX = 0``)
and keeps freed memory (``M_TRIM_THRESHOLD`` 1 GiB), so the second and later generations reuse
the same pages. On exit ``mmap`` is allowed again with the threshold fixed at its 32 MiB ceiling
(what glibc's own dynamic threshold reaches after the first large free), so code outside behaves
as under glibc's steady state.

Values are unchanged (only where the memory comes from). The cost: the process keeps the heap its
largest generation needed instead of returning it to the system. Off with ``VARBENCH_HEAP=0``; a no-op
where glibc's ``mallopt`` is not available (macOS, musl, Windows).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
MMAP_THRESHOLD_CEILING = 32 * 1024 * 1024   # glibc DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
KEEP_FREED = 1 << 30
MMAP_MAX_DEFAULT = 65536


def _mallopt():
    if os.environ.get("VARBENCH_HEAP", "1") == "0":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


_MALLOPT = _mallopt()


@contextlib.contextmanager
def reuse_heap(enabled: bool = True):
    """Large allocations inside come from the heap and stay there for reuse (see the module docstring)."""
    if not enabled or _MALLOPT is None:
        yield False
        return
    _MALLOPT(M_TRIM_THRESHOLD, KEEP_FREED)
    _MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD_CEILING)
    _MALLOPT(M_MMAP_MAX, 0)
    try:
        yield True
    finally:
        _MALLOPT(M_MMAP_MAX, MMAP_MAX_DEFAULT)
