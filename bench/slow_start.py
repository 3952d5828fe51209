"""A slow start, as a shared machine or a laptop gives one: for the first `seconds` of training,
every training step takes `factor` times as long (the callback sleeps after each step for the
time the step itself took, times factor - 1). Given to train.py by bench/recipe.py's
`--slow-start SECONDS` as `+callbacks.slow_start._target_=slow_start.SlowStart`, with bench/ on
PYTHONPATH; the run's clock sees the slower pace as it would see a busy machine's."""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import Callback


class SlowStart(Callback):
    def __init__(self, seconds: float, factor: float = 2.0) -> None:
        if seconds <= 0 or factor < 1:
            raise ValueError(
                f"SlowStart(seconds={seconds}, factor={factor}): give seconds > 0 and factor >= 1"
            )
        self.seconds, self.factor = seconds, factor
        self.began: float | None = None  # the first training step's start
        self.step_began = 0.0

    def on_train_batch_start(self, *args) -> None:
        self.step_began = time.perf_counter()
        if self.began is None:
            self.began = self.step_began

    def on_train_batch_end(self, *args) -> None:
        now = time.perf_counter()
        if now - self.began < self.seconds:
            time.sleep((now - self.step_began) * (self.factor - 1))
