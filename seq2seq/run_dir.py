"""A run directory's layout, named once: what `python train.py` writes there, and where the
tools (average, inspect --curves, a resume, a sweep's summary) look for it.

    outputs/train/runs/<time>_<pid>/
      checkpoints/       last.ckpt, the best by the monitored metric, the recent ones,
                         average-lastN.ckpt (seq2seq.average)
      csv/version_N/metrics.csv   the logged metrics, one version per start (a resume adds one)
      .hydra/            the composed config and the command line's overrides; a resume's
                         own under .hydra/resume-<time>/
      summary.json  curves.png  test_hypotheses.txt  test_references.txt
      clock.json         a time budget's decisions, for replay=RUN (seq2seq.training.clock)

The YAML that places these files (configs/callbacks/default.yaml's dirpath, configs/logger/
csv.yaml's name) spells two of the names again; tests/test_architecture.py checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir"]


@dataclass(frozen=True)
class RunDir:
    """The files of the run directory at `path`."""

    path: Path

    CHECKPOINTS = "checkpoints"
    CSV = "csv"
    HYDRA = ".hydra"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of_checkpoint(cls, ckpt: str | Path) -> RunDir | None:
        """The run a checkpoint belongs to (RUN/checkpoints/NAME.ckpt), or None if it lies
        elsewhere."""
        ckpt = Path(ckpt)
        return cls(ckpt.parent.parent) if ckpt.parent.name == cls.CHECKPOINTS else None

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def last(self) -> Path:
        """last.ckpt: the newest training state (saved each validation and on interrupts)."""
        return self.checkpoints / "last.ckpt"

    def average(self, n: int) -> Path:
        """Where seq2seq.average writes the average of the last n checkpoints."""
        return self.checkpoints / f"average-last{n}.ckpt"

    def overrides(self) -> list[Path]:
        """The command line's overrides of the first start, then of each resume (oldest first),
        those that exist."""
        hydra = self.path / self.HYDRA
        found = [hydra / "overrides.yaml", *sorted(hydra.glob("resume-*/overrides.yaml"))]
        return [path for path in found if path.is_file()]

    def metrics_files(self) -> list[Path]:
        """csv/version_N/metrics.csv of each start, in the order they were written."""
        found = self.path.glob(f"{self.CSV}/version_*/metrics.csv")
        return sorted(found, key=lambda p: int(p.parent.name.split("_")[1]))

    def history(self) -> list[tuple[int, Path]]:
        """(step, checkpoint) of every checkpoint the run keeps, oldest first: the best, the
        last, and the weights kept at each recent validation (recent-stepNNNNNN.ckpt; every
        validation's with callbacks.recent_checkpoints.save_top_k=-1). One a step: the best's
        file (epochNNN-stepNNNNNN, a whole checkpoint) over recent-step files, and either over
        last.ckpt."""
        from seq2seq.checkpoint import load_checkpoint

        found: dict[int, Path] = {}
        for path in sorted(self.checkpoints.glob("*.ckpt")):
            stem = path.stem
            if "step" in stem and stem.rsplit("step", 1)[1].isdigit():  # epoch... before recent...
                found.setdefault(int(stem.rsplit("step", 1)[1]), path)
        for path in sorted(self.checkpoints.glob("*.ckpt")):
            if path not in found.values():
                step = int(load_checkpoint(path, mmap=True).get("global_step", -1))
                found.setdefault(step, path)
        return sorted(found.items())

    @property
    def clock(self) -> Path:
        """clock.json: what a time budget's clock decided (seq2seq.training.clock)."""
        return self.path / "clock.json"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def curves(self) -> Path:
        return self.path / "curves.png"

    @property
    def test_hypotheses(self) -> Path:
        return self.path / "test_hypotheses.txt"

    @property
    def test_references(self) -> Path:
        return self.path / "test_references.txt"
