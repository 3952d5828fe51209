"""Helpers the benchmarks share: timing by median of repeats, peak memory, table printing.

Benchmarks print figures; they never assert on time (this machine is shared and noisy).
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch

# The model options of the 2020s (docs/model.md), each alone: bench/recipe.py's rows and
# bench/mfu.py --options.
MODEL_OPTIONS: dict[str, list[str]] = {
    "rmsnorm": ["model.net.norm=rms"],
    "gelu": ["model.net.activation=gelu"],
    "swiglu": ["model.net.activation=swiglu"],
    "geglu": ["model.net.activation=geglu"],
    "rotary": ["model.net.positional=rotary"],
    "gqa2": ["model.net.num_kv_heads=2"],
    "mqa": ["model.net.num_kv_heads=1"],
    "nobias": ["model.net.bias=false"],
    "qknorm": ["model.net.qk_norm=true"],
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2
) -> float:
    """Median wall time of fn over repeats, after warmup calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Wall times of several callables, taken in turn within each repeat.

    Round-robin rather than all repeats of one, then all of the next: on a shared machine the
    speed drifts over seconds, and taking turns puts every callable under the same drift, so
    the per-repeat ratios between them are far steadier than ratios of separate medians.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(a: list[float], b: list[float]) -> float:
    """Median over repeats of a[i] / b[i] (times taken in the same round)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmRSS: resident now, VmHWM: its peak), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory fn adds above what was allocated before it ran.

    On CUDA: torch's own allocator statistics. On the CPU: the peak resident size (VmHWM, reset
    just before the call) minus the size before it. Freed memory the allocator keeps would hide
    allocations, so call this once per fresh process (see run_isolated). Not ru_maxrss: Linux
    carries that over from the parent process across exec.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = _status_bytes("VmRSS")
    fn()
    return max(_status_bytes("VmHWM") - before, 0)


def run_isolated(script: str, args: Sequence[str]) -> dict:
    """Run `python script args...` in a fresh process and parse the JSON line it prints."""
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A GitHub-flavoured Markdown table, ready to paste into docs/."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")


def environment() -> str:
    threads = torch.get_num_threads()
    return (
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}, {threads} threads"
    )
