"""Callbacks of our own, where Lightning's do not do what a run needs."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class InterruptCheckpoint(Callback):
    """Writes last.ckpt when a run is stopped by SIGTERM (a scheduler's or `kill`'s) or Ctrl-C,
    so `python train.py resume=RUN_DIR` continues from that step, exactly.

    Not Lightning's OnExceptionCheckpoint, which saves on every exception and deletes its file
    when the run ends (after a NaN loss, say, the last good checkpoint must stay as it is), and
    whose mere presence makes `trainer.fit(ckpt_path=None)` resume from the newest last
    checkpoint it finds: a new run in a directory with an old last.ckpt would silently continue
    it. This one saves on interrupts only and keeps its file, the run's last.ckpt.

    Both signals stop at the end of the current training batch, where the periodic checkpoints
    save: saved mid-batch, the batch the loader has already fetched would be skipped on resume.
    Lightning does this for SIGTERM; for Ctrl-C this callback catches SIGINT during training
    (one process only; a second Ctrl-C stops at once, mid-batch, saving the last finished step).
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.dirpath = dirpath
        self.ckpt_path = str(Path(dirpath) / f"{filename}.ckpt")
        self._saved = False
        self._ctrl_c = False
        self._previous_handler: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._saved = self._ctrl_c = False
        ours_to_take = (
            trainer.world_size == 1  # under DDP the ranks would stop at different batches
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if ours_to_take:
            self._previous_handler = signal.signal(signal.SIGINT, self._on_ctrl_c)

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        if self._ctrl_c:  # the second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._ctrl_c = True
        log.warning("Ctrl-C: stopping after this batch (press Ctrl-C again to stop at once)")

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        # SIGTERM: Lightning stops once this batch is done. Ctrl-C: this raises the
        # KeyboardInterrupt that Lightning turns into a clean stop with exit code 1.
        if trainer.received_sigterm and not self._saved:
            self._save(trainer, "SIGTERM")
        if self._ctrl_c:
            if not self._saved:
                self._save(trainer, "Ctrl-C")
            raise KeyboardInterrupt

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_handler()
        if self._ctrl_c and not self._saved:  # pressed in the last validation: no test
            self._save(trainer, "Ctrl-C")
            raise KeyboardInterrupt

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._restore_handler()
        if self._saved:
            return
        if isinstance(exception, KeyboardInterrupt):  # mid-batch: the last finished step
            self._save(trainer, "Ctrl-C")
        elif isinstance(exception, SIGTERMException):
            self._save(trainer, "SIGTERM")  # it came outside a training batch

    def _restore_handler(self) -> None:
        # Only if ours is still in place: stopping, Lightning ignores further Ctrl-C itself.
        if (
            self._previous_handler is not None
            and signal.getsignal(signal.SIGINT) == self._on_ctrl_c
        ):
            signal.signal(signal.SIGINT, self._previous_handler)
        self._previous_handler = None

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
        self._restore_handler()  # the file is the run's last.ckpt: keep it
