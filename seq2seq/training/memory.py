"""Keep the memory a training step frees inside the process, so the next step reuses it.

glibc's malloc serves every block above its mmap threshold (dynamic, at most 32 MiB) with a
fresh ``mmap`` and gives it back to the kernel when it is freed. A training step's largest
tensors are such blocks: the logits, their log-probabilities and their gradients are tokens x
vocabulary floats (2,048 tokens x 8,000 words = 65 MB each), so every step had the kernel map
and zero-fill them again, page by page: ~80,000 page faults a step of experiment=parallel_bpe,
a tenth of its time on a 2-core machine (bench/mfu.py; docs/performance.md). Serving no block
with mmap (M_MMAP_MAX 0) and switching trimming off keeps them in the heap, which the next step
reuses.

Not by raising the mmap threshold: glibc before 2.35 (Debian 11, Ubuntu 20.04, RHEL 8 and 9)
refuses a threshold above HEAP_MAX_SIZE / 2, 32 MiB on 64-bit (malloc.c's
do_set_mmap_threshold), so a 65 MB block would still be mapped every step there; M_MMAP_MAX
is taken by every release (checked on 2.31 and 2.36). A block too large for a thread's arena
is still mapped: glibc falls back to mmap for it whatever M_MMAP_MAX says.

Why this and not an allocator library: the usual fix on CPUs (jemalloc or tcmalloc loaded with
LD_PRELOAD, as Intel's launch script for PyTorch does) needs a system library and a wrapper
around ``python``; ``mallopt`` is glibc's own, set from inside the process. Elsewhere (macOS,
musl, Windows) this does nothing. The cost: the process keeps its peak memory until it exits.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform

__all__ = ["keep_freed_memory"]

log = logging.getLogger(__name__)

# mallopt's parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
MMAP_MAX = 0  # no block is served with mmap: every one comes from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # the largest int: never give the heap's top back


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed blocks for reuse (once a process); True if it did."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc's (no library search)
        done = libc.mallopt(M_MMAP_MAX, MMAP_MAX) == 1
        done = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    except (OSError, AttributeError):
        return False
    log.debug("glibc malloc keeps freed memory: %s", done)
    return done
