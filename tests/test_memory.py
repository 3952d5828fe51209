"""seq2seq.training.memory: with glibc's malloc told to keep freed blocks, a step's large
tensors are reused instead of being mapped (and page-faulted) anew, on glibc before 2.35 too
(which caps the mmap threshold at 32 MiB; the probe sets that cap: checked by hand on Debian 11's
glibc 2.31, where a 1 GiB threshold is refused)."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys

import pytest

PROBE = """
import ctypes, resource, torch
from seq2seq.training.memory import keep_freed_memory

ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, as counted below

def step():
    logits = torch.ones(1 << 24)  # 64 MiB, above glibc's largest default mmap threshold
    grad = logits * 2  # and another, while the first is alive, as in a training step
    return float(grad[-1])

def faults(rounds=8):
    for _ in range(rounds):  # the heap grows to what a step holds at once
        step()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

before = faults()
assert keep_freed_memory() and keep_freed_memory()  # once, then cached
# What glibc before 2.35 leaves at most, refusing a higher one: a 32 MiB mmap threshold. The
# 64 MiB blocks must stay in the heap all the same, on every glibc the project supports.
assert ctypes.CDLL(None).mallopt(-3, 32 << 20) == 1  # M_MMAP_THRESHOLD
print(before, faults())
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_freed_large_blocks_are_reused_without_page_faults() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    before, after = map(int, out.split())
    pages = 8 * 2 * (64 << 20) // resource.getpagesize()  # eight steps of two 64 MiB blocks
    assert before > pages // 2, out  # each block mapped and faulted in anew
    assert after <= pages // 4, out  # reused: the heap may still grow once or twice
