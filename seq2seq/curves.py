"""Training curves from a run's metrics.csv: loss, learning rate and validation metrics against
steps and against training time, as one PNG.

    python -m seq2seq.inspect RUN_DIR --curves          # RUN_DIR/curves.png

train.py draws it at the end of every run with the CSV logger; a sweep draws its jobs'
validation curves on one figure (sweep_curves.png).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seq2seq import metric_names as names
from seq2seq.files import written_whole
from seq2seq.run_dir import RunDir

TIME = names.TIME  # training time at each logged step (Seq2SeqModule.training_step)
VALIDATION = tuple(names.metric("val", m) for m in (names.CHRF, names.BLEU, names.EXACT_MATCH))


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """Every logged row of a run, each start's (csv/version_N) after the one before."""
    run_dir = Path(run_dir)
    files = RunDir(run_dir).metrics_files()
    if not files:
        raise ValueError(
            f"{run_dir} has no csv/version_*/metrics.csv: give a run directory trained with the "
            "CSV logger (logger=csv, the default)"
        )
    rows = []
    for index, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        if index == len(files) - 1 and len(lines) > 1 and not lines[-1].endswith("\n"):
            # A run that is still writing: its last row is not finished (Lightning's CSV
            # logger ends every row with a newline). Draw the rows before it.
            print(
                f"note: {path} line {len(lines)} is not complete (the run is still writing "
                "it): drawn without it",
                file=sys.stderr,
            )
            lines.pop()
        for number, row in enumerate(csv.DictReader(lines), 2):
            try:
                rows.append({k: float(v) for k, v in row.items() if v not in ("", None)})
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path} line {number} is not a row of numbers (the file is damaged): "
                    "delete the line, or the file"
                ) from None
    return rows


def kept_checkpoints(run_dir: str | Path) -> list[tuple[int, Path, float | None]]:
    """(step, checkpoint, validation BLEU 0-100 or None) of every checkpoint a run kept,
    oldest first (RunDir.history), or a one-line error for a directory that is not a run."""
    from seq2seq.run_dir import RunDir

    run = RunDir(run_dir)
    if not run.checkpoints.is_dir():
        raise ValueError(f"{run_dir} is not a run directory (it has no checkpoints/)")
    history = run.history()
    if not history:
        raise ValueError(f"{run.checkpoints} holds no checkpoint")
    bleus = validation_bleu_at(run.path, [step for step, _ in history])
    return [(step, path, bleu) for (step, path), bleu in zip(history, bleus, strict=True)]


def validation_bleu_at(run_dir: str | Path, steps: list[int]) -> list[float | None]:
    """The validation BLEU (0-100) the run logged last at or before each step (a
    checkpoint's: it follows its validation); None where it logged none (or no metrics at
    all: a run directory of copied checkpoints)."""
    try:
        rows = read_metrics(run_dir)
    except ValueError:
        rows = []
    logged = sorted((int(r["step"]), r["val/bleu"]) for r in rows if "val/bleu" in r)
    found = []
    for step in steps:
        before = [bleu for at, bleu in logged if at <= step]
        found.append(100 * before[-1] if before else None)
    return found


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric."""
    points = [(row["step"], row[key]) for row in rows if key in row and "step" in row]
    return [s for s, _ in points], [v for _, v in points]


def training_time_at(rows: list[dict[str, float]], steps: list[float]) -> list[float] | None:
    """The training time at each step, from the last logged time at or before it."""
    logged = sorted(zip(*series(rows, TIME), strict=True))
    if not logged:
        return None
    out, i = [], 0
    for step in steps:
        while i + 1 < len(logged) and logged[i + 1][0] <= step:
            i += 1
        out.append(logged[i][1])
    return out


def curves_figure(runs: Mapping[str, list[dict[str, float]]], title: str = "") -> Any:
    """Four panels: training and validation loss, the learning rate, and the validation
    metrics against steps and against training time; one colour per run."""
    import matplotlib

    matplotlib.use("Agg")  # files, not windows: works with no display
    import matplotlib.pyplot as plt

    # Fixed margins, not layout="constrained": the panels' layout never changes, and solving
    # it took 0.4 of the 0.9 s a run spent drawing its curves.
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.93, wspace=0.18, hspace=0.25)
    (loss_ax, lr_ax), (val_ax, time_ax) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = dict(zip(VALIDATION, ("-", "--", ":"), strict=True))
    for index, (name, rows) in enumerate(runs.items()):
        colour = colours[index % len(colours)]
        label = f"{name} " if len(runs) > 1 else ""
        steps, losses = series(rows, names.TRAIN_LOSS_STEP)
        loss_ax.plot(steps, losses, color=colour, alpha=0.35, lw=0.8, label=f"{label}train")
        steps, losses = series(rows, names.metric("val", names.LOSS))
        loss_ax.plot(steps, losses, "o-", color=colour, ms=3, label=f"{label}validation")
        rate = names.learning_rate(key for row in rows for key in row)
        lr_ax.plot(*series(rows, rate), color=colour, label=name if label else None)
        for key in VALIDATION:
            steps, values = series(rows, key)
            if not values:
                continue
            metric = key.split("/")[1]
            val_ax.plot(steps, values, styles[key], color=colour, marker="o", ms=3,
                        label=f"{label}{metric}")  # fmt: skip
            times = training_time_at(rows, steps)
            if times is not None:
                time_ax.plot(times, values, styles[key], color=colour, marker="o", ms=3,
                             label=f"{label}{metric}")  # fmt: skip
    for ax, ylabel, xlabel in (
        (loss_ax, "loss", "step"),
        (lr_ax, "learning rate", "step"),
        (val_ax, "validation metric", "step"),
        (time_ax, "validation metric", "training time (s)"),
    ):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def write_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """RUN_DIR/curves.png (or out) from the run's metrics."""
    run_dir = Path(run_dir)
    out = Path(out) if out else RunDir(run_dir).curves
    figure = curves_figure({run_dir.name: read_metrics(run_dir)}, title=str(run_dir))
    save_figure(figure, out)
    return out


def save_figure(figure: Any, out: str | Path, **options: Any) -> None:
    """Write a figure whole or not at all, then let it go (pyplot keeps every figure it made
    until closed: a sweep drawing one per job would hold them all)."""
    import matplotlib.pyplot as plt

    out = Path(out)
    try:
        with written_whole(out) as part:
            figure.savefig(part, dpi=100, format=out.suffix[1:] or "png", **options)
    finally:
        plt.close(figure)


def write_sweep_curves(job_dirs: list[Path], out: Path) -> Path | None:
    """One figure of every job's curves (jobs without metrics are left out)."""
    runs = {}
    for job in job_dirs:
        try:
            runs[f"job {job.name}"] = read_metrics(job)
        except ValueError:
            continue
    if not runs:
        return None
    save_figure(curves_figure(runs, title=str(out.parent)), out)
    return out
