"""The clock a time budget asks, live or recorded, and what it decided in a run.

Under `trainer.max_time` the clock, not the config, decides where a run validates, how far its
learning-rate schedule has come at each step (and so where the warmup ends), whether dropout
goes off and where training stops (callbacks.TimeBudget). Two runs of one command therefore
differ, on one machine and more so on two. TimeBudget writes each decision into a ClockRecord:
into every checkpoint (its callback state) and into the run directory's clock.json (at each
checkpoint and when training ends). `python train.py replay=RUN` trains RUN's config again
with the clock replaced by RUN's record, so the same steps see the same rates, validations,
dropout and stop (docs/runs.md says how exact that is across machines).

The two clocks answer the same questions (`progress(step)`, `validation_due(step)`,
`stops(step)`, `dropout_off(reason)`): LiveClock from this machine's time (Lightning's Timer),
RecordedClock from a ClockRecord. TimeBudget asks whichever it was given and records the
answers; it never asks which one it has.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from seq2seq.files import written_whole
from seq2seq.run_dir import RunDir

__all__ = [
    "VERSION", "Clock", "ClockRecord", "LiveClock", "Progress", "RecordedClock", "read_record",
]  # fmt: skip

# A learning-rate schedule's progress at an optimizer step: (warming up, how far: the warmup's
# factor while warming up, else the decay's progress, 0 to 1). optim.lr_lambda reads one.
Progress = Callable[[int], tuple[bool, float]]

log = logging.getLogger(__name__)

VERSION = 1  # of clock.json's layout: a replay refuses another


@dataclass
class ClockRecord:
    """A run's clock decisions, by optimizer step (Lightning's global_step)."""

    budget: float | None = None  # trainer.max_time, in seconds
    commit: str | None = None  # the code's git commit ("-dirty": with changes), if a checkout
    # The budget's progress (training time over the time training may take, 0 to 1) as read
    # once at each step: the warmup by the clock and the decay by the clock follow from it.
    progress: dict[int, float] = field(default_factory=dict)
    validations: list[int] = field(default_factory=list)  # the steps validated at
    warmup_ended_at: int | None = None  # the first step after the warmup
    paced_at: int | None = None  # the step of the first validation, which judged the pace
    dropout_off_at: int | None = None  # the step at which dropout went off (None: never)
    schedule_ended_at: int | None = None  # the first step at the end of the decay
    stopped_at: int | None = None  # where the budget stopped training (None: something else)
    ended_at: int | None = None  # the step fit ended at (None: not ended, e.g. interrupted)

    def state(self) -> dict[str, Any]:
        """For a checkpoint (torch.save keeps the integer steps)."""
        return {**asdict(self), "progress": dict(self.progress)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ClockRecord:
        """From a checkpoint's or clock.json's fields; fields it lacks (a checkpoint from before
        a field was recorded) keep their defaults, and dropout_off_at stands in for paced_at."""
        known = {f.name for f in fields(cls)} - {"progress"}
        record = cls(**{k: v for k, v in state.items() if k in known})
        record.progress = {int(step): float(p) for step, p in state.get("progress", {}).items()}
        if "paced_at" not in state:
            record.paced_at = record.dropout_off_at
        return record

    def write(self, run_dir: str | Path) -> None:
        """RUN/clock.json, replaced whole (a kill during the write leaves the previous one)."""
        path = RunDir(run_dir).clock
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": VERSION, **self.state()})  # steps as keys: strings
        with written_whole(path) as partial:
            partial.write_text(text, encoding="utf-8")


def code_commit() -> str | None:
    """The git commit of the code that runs (with "-dirty" if its tracked files are changed),
    or None outside a git checkout (an installed package)."""
    project = Path(__file__).resolve().parents[2]
    if not (project / ".git").exists():  # installed, perhaps inside another repository
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(project), "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def read_record(run_dir: str | Path) -> ClockRecord:
    """The clock record of a run that trained to its end, or a ValueError that says why not."""
    path = RunDir(run_dir).clock
    if not Path(run_dir).is_dir():
        raise ValueError(f"replay={run_dir} is not a run directory: give the directory of a run")
    if not path.is_file():
        raise ValueError(
            f"replay={run_dir}: the run recorded no clock decisions ({path} does not exist): "
            "it ran without trainer.max_time (rerun its command: without a budget two runs are "
            "the same), or before runs recorded them"
        )
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"replay={run_dir}: {path} cannot be read ({error})") from None
    if not isinstance(saved, dict) or saved.get("version") != VERSION:
        version = saved.get("version") if isinstance(saved, dict) else None
        raise ValueError(
            f"replay={run_dir}: {path} is version {version} of the record, this code reads "
            f"version {VERSION}: check out the commit the run was made at to replay it"
        )
    record = ClockRecord.from_state(saved)
    if record.ended_at is None:
        last = max(record.progress, default=0)
        raise ValueError(
            f"replay={run_dir}: the run's training did not end (its record stops at step "
            f"{last}): finish it with resume={run_dir}, then replay it"
        )
    return record


class Clock(Protocol):
    """What a time budget asks of time, at optimizer step `step` (Lightning's global_step)."""

    def start(self, budget: float | None, timer: Any) -> None:
        """Fit starts under `budget` seconds (None: no trainer.max_time), timed by `timer`
        (lightning_fields.LightningTimer)."""

    def progress(self, step: int | None) -> float:
        """The budget's progress at step: training time over the time training may take."""

    def validation_due(self, step: int, interval: float) -> bool:
        """Whether to validate after step, validating every `interval` seconds of training."""

    def stops(self, step: int, progress: float) -> bool:
        """Whether training stops after step (at `progress`)."""

    def dropout_off(self, reason: str | None) -> str | None:
        """Why dropout goes off at the first validation (None: it stays); `reason` is what
        the pace so far says."""

    def validated(self) -> None:
        """A validation (or the start of training) ended now."""

    def resumed(self, progress: float) -> None:
        """Training goes on from a checkpoint whose clock had read `progress`."""

    def timer_stopped(self) -> bool:
        """Whether Lightning's Timer ended fit at the budget (a step outran the reserve)."""


class LiveClock:
    """This machine's clock: the training time Lightning's Timer counts, over the budget less
    what the final validation and test will take (`reserve()`, TimeBudget's). Under DDP rank
    0's reading is every process's, so all step with the same learning rate."""

    def __init__(self, reserve: Callable[[], float], broadcast: Callable[[Any], Any]) -> None:
        self.reserve, self.broadcast = reserve, broadcast
        self.budget: float = 0.0
        self.timer: Any = None
        self._progress = 0.0  # never decreases
        self._last_validation = 0.0  # the training time at which the last one ended

    def start(self, budget: float | None, timer: Any) -> None:
        self.budget, self.timer, self._progress = budget or 0.0, timer, 0.0

    def progress(self, step: int | None) -> float:
        usable = max(self.budget - self.reserve(), 1e-9)
        value = max(self._progress, min(1.0, self.timer.elapsed() / usable))
        self._progress = self.broadcast(value)
        return self._progress

    def validation_due(self, step: int, interval: float) -> bool:
        elapsed = self.timer.elapsed()
        to_stop = self.budget - self.reserve() - elapsed
        return elapsed - self._last_validation >= interval and to_stop >= interval / 2

    def stops(self, step: int, progress: float) -> bool:
        return progress >= 1.0

    def dropout_off(self, reason: str | None) -> str | None:
        return reason

    def validated(self) -> None:
        self._last_validation = self.timer.elapsed()

    def resumed(self, progress: float) -> None:
        # Never back: the reserve is reckoned anew after a resume (a tenth of the budget until
        # the first validation), which could read the same training time as less progress and
        # send the learning rate back up.
        self._progress = max(self._progress, progress)

    def timer_stopped(self) -> bool:
        return self.timer.elapsed() >= self.budget


class RecordedClock:
    """A recorded run's clock (`python train.py replay=RUN`): each decision as the record has
    it, whatever this machine's pace; Lightning's Timer no longer stops the run."""

    def __init__(self, record: ClockRecord) -> None:
        self.record = record

    def start(self, budget: float | None, timer: Any) -> None:
        if budget is None:
            raise ValueError(
                "replay needs trainer.max_time, the budget the replayed run had: a run without "
                "one has no clock to replay"
            )
        timer.release()  # the record stops the run, not this machine's clock
        record = self.record
        log.info(
            "Replay: the clock's decisions are the recorded run's: %d validations (at steps "
            "%s), the warmup's end at step %s, dropout off at step %s, the stop at step %s",
            len(record.validations), ", ".join(map(str, record.validations)),
            record.warmup_ended_at, record.dropout_off_at, record.stopped_at,
        )  # fmt: skip

    def progress(self, step: int | None) -> float:
        if step not in self.record.progress:
            raise ValueError(
                f"replay: the replayed run recorded no clock reading at step {step}: this "
                "run went past its steps, which a replay of the same config does not do"
            )
        return self.record.progress[step]

    def validation_due(self, step: int, interval: float) -> bool:
        return step in self.record.validations

    def stops(self, step: int, progress: float) -> bool:
        return self.record.stopped_at is not None and step >= self.record.stopped_at

    def dropout_off(self, reason: str | None) -> str | None:
        return "as the replayed run recorded" if self.record.dropout_off_at is not None else None

    def validated(self) -> None:
        pass

    def resumed(self, progress: float) -> None:
        pass  # the record's readings are the run's

    def timer_stopped(self) -> bool:
        return False  # released: the record's stop is the stop
