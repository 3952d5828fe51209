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
    Lightning stops at the end of the current batch, and the checkpoint is written there.
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        super().__init__(dirpath, filename)
        self._saved = False

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        # SIGTERM: Lightning stops once this batch is done. Saving here, where the periodic
        # checkpoints save, makes the resume exact (saved later, the batch the loader has
        # already fetched would be skipped).
        if trainer.received_sigterm and not self._saved:
            self._save(trainer, "SIGTERM")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):  # mid-batch: the last finished step
            self._save(trainer, "Ctrl-C")
        elif isinstance(exception, SIGTERMException) and not self._saved:
            self._save(trainer, "SIGTERM")  # it came outside a training batch

    def _save(self, trainer: Any, what: str) -> None:
        trainer.save_checkpoint(self.ckpt_path)
        self._saved = True
        if trainer.is_global_zero:
            run_dir = Path(self.dirpath).parent
            log.warning(
                "%s at step %d: saved %s; resume with: python train.py resume=%s",
                what, trainer.global_step, self.ckpt_path, run_dir,
            )  # fmt: skip

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        pass  # the file is the run's last.ckpt: keep it
