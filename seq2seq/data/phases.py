"""The data preparation's phases, timed: the log's one-line account of where a start's seconds
went, and what bench/scale.py reads for each phase (seconds, and the process's peak resident
memory when the phase ended)."""

from __future__ import annotations

import logging
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class Phases:
    """Named phases in the order they ran: {name: {"seconds", "peak_rss"}}; a phase that runs
    twice (tokenizing each split) adds up its seconds."""

    def __init__(self) -> None:
        self.timings: dict[str, dict[str, float]] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            entry = self.timings.setdefault(name, {"seconds": 0.0, "peak_rss": 0})
            entry["seconds"] += time.perf_counter() - start
            entry["peak_rss"] = peak_rss_bytes()

    def summary(self) -> str:
        total = sum(entry["seconds"] for entry in self.timings.values())
        parts = ", ".join(f"{name} {entry['seconds']:.1f}" for name, entry in self.timings.items())
        return f"{total:.1f} s ({parts})"
