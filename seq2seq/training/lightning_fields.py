"""Lightning's private fields the project reads or writes, in one place, each with why and the
Lightning version it was read from (2.6): an upgrade that renames one breaks here, in one file
and by its name, rather than in a run's behaviour.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LightningTimer", "clock_interval", "set_received_sigterm", "set_validation_due"]


class LightningTimer:
    """Lightning's Timer (the callback `trainer.max_time` makes): its training time, and the
    budget it stops fit at."""

    def __init__(self, timer: Any) -> None:
        self.timer = timer

    @classmethod
    def of(cls, trainer: Any) -> LightningTimer | None:
        from lightning.pytorch.callbacks import Timer

        found = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        return cls(found) if found is not None else None

    @property
    def budget(self) -> float | None:
        # Timer keeps max_time in seconds as _duration (2.6: no public getter; time_remaining()
        # is None without a budget but reads the clock).
        return getattr(self.timer, "_duration", None)

    def elapsed(self, stage: str = "train") -> float:
        """Seconds spent in a stage (saved in checkpoints: a resume goes on counting)."""
        return self.timer.time_elapsed(stage)

    def release(self) -> None:
        """The Timer no longer stops fit (2.6: Timer.on_train_batch_end and on_train_epoch_end
        stop it once time_elapsed() reaches _duration, and do nothing while it is None)."""
        self.timer._duration = None


def clock_interval(trainer: Any) -> float | None:
    """Seconds between validations where the Trainer validates by the clock (2.6:
    val_check_interval as a duration sets _val_check_time_interval; None otherwise, and under
    fast_dev_run)."""
    return getattr(trainer, "_val_check_time_interval", None)


def set_validation_due(trainer: Any, due: bool) -> None:
    """Make Lightning's clock check after this batch say `due` (2.6: the training epoch loop
    validates once now - _last_val_time >= _val_check_time_interval, reading each process's
    own clock; -inf and inf make it yes and no on every process)."""
    trainer._last_val_time = -math.inf if due else math.inf


def set_received_sigterm(trainer: Any, received: bool) -> None:
    """Whether Lightning has received SIGTERM (2.6: its signal connector's flag, which its own
    handler sets and its loops read to stop after the batch)."""
    trainer._signal_connector.received_sigterm = received
