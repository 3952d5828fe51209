"""Callbacks of our own, where Lightning's do not do what a run needs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Writes last.ckpt when a run is stopped by SIGTERM (a scheduler's or `kill`'s) or Ctrl-C,
    so `python train.py resume=RUN_DIR` continues from that step.

    Lightning's OnExceptionCheckpoint saves on every exception and deletes its file when the
    run ends; this one saves on interrupts only (after a NaN loss, say, the last good
    checkpoint must stay as it is) and keeps the file, which is the run's last.ckpt. On SIGTERM
    Lightning stops at the end of the current batch, so the checkpoint is at a step boundary.
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        super().__init__(dirpath, filename)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            return
        what = "Ctrl-C" if isinstance(exception, KeyboardInterrupt) else "SIGTERM"
        trainer.save_checkpoint(self.ckpt_path)
        if trainer.is_global_zero:
            run_dir = Path(self.dirpath).parent
            log.warning(
                "%s at step %d: saved %s; resume with: python train.py resume=%s",
                what, trainer.global_step, self.ckpt_path, run_dir,
            )  # fmt: skip

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        pass  # the file is the run's last.ckpt: keep it
