"""Callbacks of our own, where Lightning's do not do what a run needs."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from seq2seq.checkpoint import write_run_config
from seq2seq.training.clock import (
    Clock,
    ClockRecord,
    LiveClock,
    Progress,
    RecordedClock,
    code_commit,
)
from seq2seq.training.lightning_fields import (
    LightningTimer,
    clock_interval,
    set_received_sigterm,
    set_validation_due,
)

log = logging.getLogger(__name__)


class InterruptCheckpoint(Checkpoint):
    """Writes last.ckpt when a run is stopped by SIGTERM (a scheduler's or `kill`'s) or Ctrl-C,
    so `python train.py resume=RUN_DIR` continues from that step, exactly.

    Not Lightning's OnExceptionCheckpoint, which saves on every exception and deletes its file
    when the run ends (after a NaN loss, say, the last good checkpoint must stay as it is), and
    whose mere presence makes `trainer.fit(ckpt_path=None)` resume from the newest last
    checkpoint it finds: a new run in a directory with an old last.ckpt would silently continue
    it. This one saves on interrupts only and keeps its file, the run's last.ckpt.

    Both signals stop at the end of the current training batch, where the periodic checkpoints
    save: saved mid-batch, the batch the loader has already fetched would be skipped on resume.
    This callback holds SIGTERM through training and hands it to Lightning at a batch's end, so
    a signal that comes at any moment stops there.
    Lightning does this for SIGTERM; for Ctrl-C this callback catches SIGINT during training
    (one process only; a second Ctrl-C stops at once, mid-batch, saving the last finished step).
    A signal in an epoch's last batch, or a SIGTERM during a validation in fit, stops after the
    next training batch instead, once the epoch's end or the validation is done: Lightning
    (2.6) resumes a checkpoint saved between a batch's end and the next batch (in an epoch's
    end, in a validation) by ending that epoch again with empty training means, by skipping
    the epochs left, or by losing the validation, with the later steps logged one off; a
    checkpoint saved at a batch's end it resumes exactly. One process only; under DDP
    Lightning's own stop applies.

    A Checkpoint, so Lightning calls it after the other callbacks at a batch's end, as it calls
    ModelCheckpoint: saved before them, it held a moving average of the weights (callbacks=ema)
    one step behind the weights, and the resumed run lost that step's update.
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.dirpath = dirpath
        self.ckpt_path = str(Path(dirpath) / f"{filename}.ckpt")
        self._saved = False
        self._ctrl_c = False
        self._sigterm_waits = False  # a SIGTERM in an epoch's last batch, for after its end
        self._sigterm_held = False  # a SIGTERM not yet handed to Lightning
        self._previous_handler: Any = None
        self._previous_sigterm: Any = None  # Lightning's SIGTERM handler, during a validation
        self._training_sigterm: Any = None  # Lightning's SIGTERM handler, during training

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._saved = self._ctrl_c = self._sigterm_waits = self._sigterm_held = False
        one_process = (
            trainer.world_size == 1  # under DDP the ranks would stop at different batches
            and threading.current_thread() is threading.main_thread()
        )
        if one_process and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous_handler = signal.signal(signal.SIGINT, self._on_ctrl_c)
        if one_process:
            # SIGTERM is held here and handed to Lightning at the next batch's end: Lightning's
            # own handler, reached after this callback's check at a batch's end but before
            # the batch's last hooks, stopped the run between two batches, where the saved
            # checkpoint resumed with every later step logged one off.
            self._training_sigterm = signal.signal(signal.SIGTERM, self._hold_sigterm)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        ours_to_take = (
            trainer.state.fn == "fit"
            and not trainer.sanity_checking
            and trainer.world_size == 1
            and threading.current_thread() is threading.main_thread()
        )
        if ours_to_take:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._hold_sigterm)

    def _hold_sigterm(self, signum: int, frame: Any) -> None:
        self._sigterm_held = True

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_sigterm()
        if self._sigterm_held:  # it stops after the next training batch
            self._sigterm_held, self._sigterm_waits = False, True

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            if signal.getsignal(signal.SIGTERM) == self._hold_sigterm:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        if self._ctrl_c:  # the second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._ctrl_c = True
        log.warning("Ctrl-C: stopping after this batch (press Ctrl-C again to stop at once)")

    def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if self._sigterm_waits:  # the epoch has ended: Lightning stops after this batch
            self._sigterm(trainer, True)

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if self._sigterm_held:  # it came during this batch (or after the last one's end)
            self._sigterm_held = False
            set_received_sigterm(trainer, True)  # as Lightning's handler sets it
        if last_batch(trainer) and trainer.world_size == 1 and not self._saved:
            if trainer.received_sigterm:  # Lightning would stop in the epoch's end
                self._sigterm(trainer, False)
            if self._sigterm_waits or self._ctrl_c:
                return  # both stop after the next batch (the class's docstring)
        # SIGTERM: Lightning stops once this batch is done. Ctrl-C: this raises the
        # KeyboardInterrupt that Lightning turns into a clean stop (train.py exits 130).
        if trainer.received_sigterm and not self._saved:
            self._save(trainer, "SIGTERM")
        if self._ctrl_c:
            if not self._saved:
                self._save(trainer, "Ctrl-C")
            raise KeyboardInterrupt

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_handler()
        self._restore_training_sigterm()
        if self._sigterm_held:  # it came after the last batch's end: as in the last batch
            self._sigterm_held, self._sigterm_waits = False, True
        if self._sigterm_waits:  # it came in the last batch: training is over, the test stops
            self._sigterm(trainer, True)
            self._save(trainer, "SIGTERM")
        if self._ctrl_c and not self._saved:  # pressed in the last validation: no test
            self._save(trainer, "Ctrl-C")
            raise KeyboardInterrupt

    def _sigterm(self, trainer: Any, received: bool) -> None:
        """Set whether Lightning has received SIGTERM (its signal connector's flag, which
        its handler sets and its loops read), and whether one waits here for the epoch's end."""
        set_received_sigterm(trainer, received)
        self._sigterm_waits = not received

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._restore_handler()
        self._restore_sigterm()
        self._restore_training_sigterm()
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

    def _restore_training_sigterm(self) -> None:
        if self._training_sigterm is not None:
            if signal.getsignal(signal.SIGTERM) == self._hold_sigterm:
                signal.signal(signal.SIGTERM, self._training_sigterm)
            self._training_sigterm = None

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._restore_handler()  # the file is the run's last.ckpt: keep it
        self._restore_sigterm()
        self._restore_training_sigterm()


class TimeBudget(Callback):
    """Makes `trainer.max_time` the budget of the whole run: the learning-rate schedule decays
    to its end at the moment training stops, and training stops early enough for a last
    validation, checkpoint and test to finish within the budget.

    Lightning's own Timer (which `max_time` creates) stops training when the time is up,
    whatever the schedule, with no validation after its last one and the test after the
    deadline. This callback stops first: once the training time reaches the budget less a
    reserve, it sets `trainer.should_stop`, on which Lightning validates (and the checkpoint
    callbacks save) before fit ends. The reserve is what the final validation and the test are
    expected to take, with a margin: the last validation's duration, plus the test split's share
    of it (its pairs over the pairs validation decodes, times sqrt(beam size)); before the first
    validation it is a tenth of the budget. The schedule reads `schedule()`: the training
    time since the warmup over the time from then to that stop, so the decay ends where
    training does. The elapsed time is
    Lightning's Timer's, which checkpoints save, so a resumed run keeps its budget.

    Where the Trainer validates by the clock (`clocked_validation`: validations=N, the budget
    over N), it also decides when: once the training time since the last validation (or the
    start) reaches the interval, unless the stop (which validates) is less than half that away,
    so a run validates about N times whatever a step costs on the machine and the corpus. A run
    that reaches trainer.max_steps or max_epochs before its budget (a fast machine) validates
    after its last step too, as it would at an epoch's end without the clock.

    At the first validation it knows the pace: it logs the steps and epochs the budget buys
    (and the step where trainer.max_steps or max_epochs ends training, if sooner), and where
    these are fewer epochs than model.training.dropout_min_epochs it turns the
    model's dropout off for the rest of the run (a model that sees its data a few times
    underfits rather than overfits). It decides once: checkpoints save the step of the
    decision and where dropout went off, so a resume keeps dropout as decided, on or off,
    whatever its own pace.

    With test=false (`test`: the run config's), no time is kept for a test. With `pick_search`
    (the run config's, seq2seq.training.pick) it keeps time for the pick too.

    It asks a clock (seq2seq.training.clock: LiveClock, this machine's time; RecordedClock,
    a run's record, given by `replay=RUN`, with which the run repeats RUN's steps whatever its
    pace) and records every answer (ClockRecord: the progress read once at each step, the
    steps validated at, where the warmup and the decay ended, dropout, the stop) in
    checkpoints and in dirpath/clock.json. Under DDP rank 0's answers are every process's.

    Inactive (progress() is None) without trainer.max_time.
    """

    def __init__(
        self, test: bool = True, dirpath: str | None = None, pick_search: Any = None
    ) -> None:
        from seq2seq.training.pick import SearchGrid

        self.test = test  # whether the run tests after fit (the reserve keeps time for it)
        self.pick = SearchGrid.from_config(pick_search)  # the search picked after fit, if any
        self.dirpath = dirpath  # the run directory, where clock.json goes (None: nowhere)
        self.record = ClockRecord()  # this run's decisions
        self.clock: Clock | None = None  # a RecordedClock given by replay(), else a LiveClock
        self._trainer: Any = None
        self._timer: LightningTimer | None = None
        self._budget: float | None = None
        self._interval: float | None = None  # training seconds between validations
        self._validation_seconds: float | None = None
        self._test_share = 1.0
        self._validation_started: float | None = None
        self._train_seconds: float | None = None
        self._warmup_end: float | None = None  # progress() when the warmup ended
        self._restored_budget: float | None = None  # a resumed checkpoint's budget

    @property
    def active(self) -> bool:
        return self._budget is not None

    def replay(self, record: ClockRecord) -> None:
        """Take the clock's decisions from `record` (a run's) in this fit."""
        self.clock = RecordedClock(record)

    def start(self, timer: LightningTimer | None, trainer: Any = None) -> None:
        """The clock started under timer's budget (none: inactive)."""
        self._trainer, self._timer = trainer, timer
        self._budget = timer.budget if timer is not None else None
        if self.clock is None:
            self.clock = LiveClock(self.reserve, self._agreed)
        self.clock.start(self._budget, timer)

    def _agreed(self, value: Any) -> Any:
        """Rank 0's value, for every process (each has its own clock)."""
        trainer = self._trainer
        if getattr(trainer, "world_size", 1) > 1:
            return trainer.strategy.broadcast(value)
        return value

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.start(LightningTimer.of(trainer), trainer)
        # A resume goes on past where an earlier start ended (a longer budget, say).
        self.record.budget, self.record.stopped_at, self.record.ended_at = self._budget, None, None
        if not self.active:
            return
        from seq2seq.training.pick import pick_share

        self.record.commit = code_commit()
        self._test_share = _test_share(trainer, pl_module) if self.test else 0.0
        self._test_share += pick_share(self.pick, pl_module.hparams.get("decoding"))
        log.info(
            "Time budget %.0f s: the schedule ends, and the last validation%s run, within "
            "it", self._budget, ", checkpoint and test" if self.test else " and checkpoint",
        )  # fmt: skip
        # Lightning's validation by the clock (lightning>=2.6), which this callback times.
        self._interval = clock_interval(trainer)
        if self._interval is not None:
            log.info("Time budget: validating every %.0f s of training", self._interval)

    def reserve(self) -> float:
        """Seconds kept for the final validation, the search's pick and the test."""
        assert self._budget is not None
        if self._validation_seconds is None:
            return 0.1 * self._budget
        # A quarter more than the estimate, and for saving checkpoints, loading the best one
        # and starting the test (about half a second on 2 CPU cores with the tiny model),
        # 1 s and 1% of the budget.
        estimate = self._validation_seconds * (1 + self._test_share)
        return 1.25 * estimate + 1.0 + 0.01 * self._budget

    def progress(self) -> float | None:
        """Training time so far over the time training may take (0 to 1, never decreasing),
        or None without a budget: the clock's reading, asked once at each optimizer step (the
        schedule and the stop both ask) and recorded."""
        if not self.active:
            return None
        step = getattr(self._trainer, "global_step", None)  # None: no Trainer (a test's)
        if step is None:
            return self.clock.progress(step)
        if step not in self.record.progress:
            self.record.progress[step] = self.clock.progress(step)
        return self.record.progress[step]

    def schedule(
        self, by_steps: Progress, warmup_steps: int, warmup_share: float | None
    ) -> Progress:
        """The learning-rate schedule's progress (optim.lr_lambda's) by steps and by this
        clock, whichever is further: the warmup ends at warmup_steps or, with a warmup_share,
        at that share of the training time; the decay then runs from the warmup's end to the
        stop, so the schedule ends where training does without a jump however long the
        warmup took. By steps alone without a budget."""

        def progress(step: int) -> tuple[bool, float]:
            warming, done = by_steps(step)
            clock = self.progress()
            if clock is None:
                return warming, done
            if warming and (warmup_share is None or clock < warmup_share):
                return True, max(done, min(1.0, clock / warmup_share) if warmup_share else 0.0)
            return False, max(0.0 if warming else done, self._decay(step, clock, warmup_steps))

        return progress

    def _decay(self, step: int, clock: float, warmup_steps: int) -> float:
        """The decay's progress by the clock: the time since the warmup ended over the time
        from then to the stop."""
        if self._warmup_end is None:  # the first step after the warmup
            self._warmup_end = clock
            self.record.warmup_ended_at = step
            if clock > 0.5:
                log.warning(
                    "the warmup (model.training.warmup_steps=%d) took %.0f%% of the time "
                    "budget, leaving the rest for the decay: lower model.training.warmup_steps "
                    "for this budget, or set model.training.warmup_share",
                    warmup_steps, 100 * clock,
                )  # fmt: skip
        done = 1.0
        if self._warmup_end < 1.0:
            done = min(1.0, (clock - self._warmup_end) / (1.0 - self._warmup_end))
        if done >= 1.0 and self.record.schedule_ended_at is None:
            self.record.schedule_ended_at = step
        return done

    def state_dict(self) -> dict[str, Any]:
        # Saved in checkpoints: a resume continues the decay and keeps dropout as decided,
        # and the record of the clock's decisions goes on (paced_at and dropout_off_at in it).
        return {"warmup_end": self._warmup_end, **self.record.state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._warmup_end = state_dict.get("warmup_end")
        self._restored_budget = state_dict.get("budget")  # on_fit_start sets the record's anew
        # Decided before the resume: at paced_at (checkpoints from before it was saved hold
        # only dropout_off_at, set where the decision turned dropout off).
        self.record = ClockRecord.from_state(state_dict)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        self._write_record(trainer)

    def _write_record(self, trainer: Any) -> None:
        if self.active and self.dirpath is not None and trainer.is_global_zero:
            self.record.write(self.dirpath)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self.active:
            return
        self.clock.validated()  # a resume counts the interval from here
        if self.record.progress and self._restored_budget == self._budget:  # a longer budget
            self.clock.resumed(max(self.record.progress.values()))  # puts the schedule back
        if self.record.dropout_off_at is not None:  # turned off before the checkpoint resumed
            pl_module.model.set_dropout(0.0)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._validation_started = time.monotonic()

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._validation_started is not None and not trainer.sanity_checking:
            self._validation_seconds = time.monotonic() - self._validation_started
            if self.active:
                self.clock.validated()
                self.record.validations.append(trainer.global_step)
                if self.record.paced_at is None:
                    self._fit_to_pace(trainer, pl_module)

    def _fit_to_pace(self, trainer: Any, pl_module: Any) -> None:
        """Once, at the first validation, from the pace so far: what the run will do in steps
        and epochs (logged), and dropout off for the rest of the run if the budget buys fewer
        epochs than model.training.dropout_min_epochs (rank 0's estimate, for every process)."""
        steps, elapsed = trainer.global_step, self._timer.elapsed()
        if steps < 1 or elapsed <= 0:
            return
        self.record.paced_at = steps
        usable = max(self._budget - self.reserve(), 0.0)
        by_time = int(steps / elapsed * usable)
        # Where trainer.max_steps or max_epochs ends fit first (a fast machine), the run makes
        # that many steps and the cosine ends there (Lightning's count; -1 or inf: no limit).
        limit = trainer.estimated_stepping_batches
        total = int(limit) if 0 <= limit < by_time else by_time
        # Optimizer steps an epoch (inf for a dataset of unknown length: epochs unknown).
        per_epoch = steps_per_epoch(trainer)
        known = 0 < per_epoch < math.inf
        epochs = total / per_epoch if known else None
        training = pl_module.hparams["training"]
        warmup, share = training["warmup_steps"], training["warmup_share"]
        ends = min(warmup, int(share * by_time)) if share is not None else warmup
        minimum = training.get("dropout_min_epochs")
        reason = None
        if minimum is not None and epochs is not None and epochs < minimum:
            reason = (f"{epochs:.1f} epochs are fewer than model.training.dropout_min_epochs="
                      f"{minimum:g}, too few to overfit")  # fmt: skip
        reason = self.clock.dropout_off(reason if pl_module.model.config.dropout > 0 else None)
        if trainer.strategy.broadcast(reason is not None):
            pl_module.model.set_dropout(0.0)
            self.record.dropout_off_at = steps
        if not trainer.is_global_zero:
            return
        log.info(
            "Time budget: %.3f s a training step so far, so about %d steps%s in the %.0f s of "
            "training the budget leaves; the warmup ends at step %s (%.0f%% of them)",
            elapsed / steps, by_time, f" ({by_time / per_epoch:.1f} epochs)" if known else "",
            usable, f"{ends:,}", 100 * ends / max(by_time, 1),
        )  # fmt: skip
        if total < by_time:
            limited = 0 <= trainer.max_steps <= total
            log.info(
                "Time budget: %s ends training first, at step %d%s, where the schedule ends; "
                "set it to -1 (no limit) to spend the whole budget",
                f"trainer.max_steps={trainer.max_steps}" if limited
                else f"trainer.max_epochs={trainer.max_epochs}",
                total, "" if epochs is None else f" ({epochs:.1f} epochs)",
            )  # fmt: skip
        if reason is not None:
            log.info(
                "Time budget: dropout %g is off from step %d: %s",
                pl_module.model.config.dropout, steps, reason,
            )  # fmt: skip

    def validation_due(self) -> bool:
        """Whether the clock says to validate after this step (never without a budget and
        validation by the clock): the training time since the last validation has reached the
        interval, with at least half an interval left before the stop, which validates anyway."""
        if self._interval is None:
            return False
        return self.clock.validation_due(self._trainer.global_step, self._interval)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any = None, outputs: Any = None, batch: Any = None,
        batch_idx: int = 0,
    ) -> None:  # fmt: skip
        if not self.active or self.record.stopped_at is not None:
            return
        # Rank 0's clock decides, for every process: each has its own, and a process that
        # validated while another trained a step would wait for it forever.
        stops = self.clock.stops(trainer.global_step, self.progress())
        stop, due = trainer.strategy.broadcast((stops, self.validation_due()))
        if self._interval is not None and not stop:
            # Lightning validates by the clock when the time since its last validation
            # reaches the interval, read from each process's own clock with nothing to make
            # them agree; set here so that its check, which follows, gives rank 0's decision.
            # By the clock it validates neither at an epoch's end nor at the step or epoch
            # limit: the last batch (the same on every process) validates here.
            set_validation_due(trainer, due or _fit_ends_after(trainer, batch_idx))
        if not stop:
            return
        trainer.should_stop = True  # Lightning validates, then fit ends
        self.record.stopped_at = trainer.global_step
        if trainer.is_global_zero:
            log.info(
                "Time budget: training stops at step %d after %.1f s, keeping %.1f s of %.0f s "
                "for the last validation, checkpoint and test",
                trainer.global_step, self._timer.elapsed(), self.reserve(), self._budget,
            )  # fmt: skip

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.record.ended_at = trainer.global_step
            # Lightning's Timer stopped it at the budget (a step or validation outran the
            # reserve): a stop by the clock too, which a replay repeats.
            if self.record.stopped_at is None and self.clock.timer_stopped():
                self.record.stopped_at = trainer.global_step
            self._write_record(trainer)
            self._train_seconds = self._timer.elapsed()
            if not self.test and trainer.is_global_zero:
                log.info("Time budget: used %.1f s of %.0f s", self._train_seconds, self._budget)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        # The training time as fit ended: testing a checkpoint restores the Timer's state
        # saved in it, so asking the Timer now would count the training up to that checkpoint.
        if self.active and self._train_seconds is not None and trainer.is_global_zero:
            used = self._train_seconds + self._timer.elapsed("test")
            log.info("Time budget: used %.1f s of %.0f s", used, self._budget)


def last_batch(trainer: Any) -> bool:
    """Whether the training batch that runs is its epoch's last."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def _fit_ends_after(trainer: Any, batch_idx: int) -> bool:
    """Whether fit ends after this batch by trainer.max_steps or max_epochs (-1: none)."""
    if 0 <= trainer.max_steps <= trainer.global_step:  # global_step counts this batch's step
        return True
    epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
    last_epoch = 0 <= epochs <= trainer.current_epoch + 1
    return last_epoch and batch_idx + 1 >= trainer.num_training_batches


def clocked_validation(max_time: str | None, validations: int | None) -> dict[str, Any]:
    """The Trainer's arguments for TimeBudget(validations): with a time budget
    (trainer.max_time, DD:HH:MM:SS) and a number of validations, validation by the clock
    (Lightning's val_check_interval as a duration, here the budget over the validations, which
    TimeBudget keeps to); otherwise none, and trainer.val_check_interval applies."""
    if max_time is None or validations is None:
        return {}
    days, hours, minutes, seconds = (int(part) for part in max_time.split(":"))
    budget = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return {"val_check_interval": budget / validations}  # a timedelta: Hydra passes it as is


def _test_share(trainer: Any, pl_module: Any) -> float:
    """The test's expected duration as a multiple of one validation's: the pairs it decodes
    over those validation decodes, times what a beam costs against greedy decoding.

    A beam of k decodes k hypotheses a pair, but in one batch: on 2 CPU cores beam 5 took 1.9x
    greedy's time a pair (1,000 test pairs of 19 tokens in 82 s, 500 greedy in 22 s with the
    validation loss) and about 2x on Tatoeba's 6-token pairs; sqrt(k), 2.24 for beam 5, covers
    both with a margin. Reckoned as k, the reserve kept 315 s of a 30-minute budget for 104 s
    of validation and test, 12% of the budget not trained.
    """
    splits = getattr(trainer.datamodule, "splits", None)
    if not splits:
        return 1.0
    limit = pl_module.hparams["training"]["val_decode_limit"]
    decoded_in_validation = len(splits["validation"])
    if limit is not None:
        decoded_in_validation = min(decoded_in_validation, limit)
    beam = max(1, pl_module.hparams["decoding"]["beam_size"])
    return len(splits["test"]) / max(decoded_in_validation, 1) * beam**0.5


class FinalCheckpoint(Callback):
    """Writes last.ckpt when training ends, where no checkpoint callback saved the final step:
    a run shorter than its first validation, or whose last steps came after its last periodic
    checkpoint, still ends with the weights it trained, and resume=RUN continues from them.

    A plain Callback, first in the list (train.py puts it there), so that its on_train_end
    runs before a moving average's (callbacks=ema), which copies the average over the trained
    weights: saved here, the checkpoint holds the average as its state_dict and the trained
    weights beside it, as every checkpoint of such a run does.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        from seq2seq.checkpoint import CheckpointError, load_checkpoint

        try:
            saved = load_checkpoint(self.path, mmap=True).get("global_step")
        except CheckpointError:
            saved = None
        if saved == trainer.global_step or trainer.global_step == 0:
            return  # saved at this step already, or nothing trained
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            log.info("Training ended at step %d: saved %s", trainer.global_step, self.path)


def without_weight_averaging(trainer: Any) -> None:
    """Take a moving average's callback (callbacks=ema) off the trainer once fit is over: a
    checkpoint's state_dict is its average, and testing that checkpoint must score it.
    Lightning's EMAWeightAveraging, still holding fit's averaged model, would load the trained
    weights (current_model_state) over it when the test restores the checkpoint (Lightning
    2.6's on_load_checkpoint)."""
    from lightning.pytorch.callbacks import WeightAveraging

    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, WeightAveraging)]


def best_checkpoint(trainer: Any) -> str | None:
    """The best checkpoint of the callback that ranks by a metric (the others keep last.ckpt,
    or the most recent by step)."""
    ranked = [
        c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None) not in (None, "step")
    ]
    return next((c.best_model_path for c in ranked if c.best_model_path), None)


class SaveRunConfig(Callback):
    """Writes the composed run config (train.py's) into every checkpoint the run saves, for
    inspect and a resume's checks (one of the keys seq2seq.checkpoint lists)."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        self.run_config = run_config

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        write_run_config(checkpoint, self.run_config)


def steps_per_epoch(trainer: Any) -> float:
    """Optimizer steps in an epoch: its batches over gradient accumulation's (inf for a corpus
    streamed endlessly, whose epochs have no length)."""
    return trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
