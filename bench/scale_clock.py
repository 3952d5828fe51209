"""A Lightning callback for bench/scale.py: when each training step ended, and the process's
memory then, appended as JSON lines to $SCALE_CLOCK_OUT; with $SCALE_CLOCK_SIGTERM_AT=N it sends
its own process SIGTERM after step N, as a cluster's scheduler would. Given to train.py as
`+callbacks.scale_clock._target_=scale_clock.StepClock`, with bench/ on PYTHONPATH; the
environment, not the config, says what to do, so a resume's config is its run's own."""

from __future__ import annotations

import json
import os
import resource
import signal
import time

import lightning as L


def _rss_bytes(kind: str = "VmRSS") -> int:
    """Resident memory now: all of it (VmRSS), or the anonymous part (RssAnon), which leaves
    out the pages of memory-mapped files (datasets' Arrow files), which the kernel can drop."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no {kind} in /proc/self/status")


class StepClock(L.Callback):
    def __init__(self) -> None:
        self.out = os.environ.get("SCALE_CLOCK_OUT")
        self.sigterm_at = int(os.environ.get("SCALE_CLOCK_SIGTERM_AT") or 0)

    def on_train_batch_end(self, trainer, *args) -> None:
        step = trainer.global_step
        if self.out:
            record = {
                "step": step,
                "time": time.time(),
                "rss": _rss_bytes(),
                "anon": _rss_bytes("RssAnon"),
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
            with open(self.out, "a") as f:
                f.write(json.dumps(record) + "\n")
        if step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
