"""The end of a sweep (`python train.py -m ...`): one table of every job's overrides and metrics.

Hydra calls `SweepSummary.on_multirun_end` once all jobs have finished (it is registered in
configs/hydra/default.yaml). It reads what each job left in its directory (the overrides
Hydra saved and train.py's summary.json), writes `sweep_summary.csv` in the sweep directory and
prints the same as a table. Like train.py, this is part of the Hydra entry point: nothing else
in the package imports it.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from seq2seq.curves import write_sweep_curves
from seq2seq.run_dir import RunDir

log = logging.getLogger(__name__)


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory: job number, its overrides, status and test metrics."""
    rows = []
    jobs = [d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    for job in sorted(jobs, key=lambda d: int(d.name)):
        first_start = RunDir(job).overrides()[:1]
        overrides = yaml.safe_load(first_start[0].read_text()) if first_start else []
        row: dict[str, Any] = {"job": int(job.name), "overrides": " ".join(overrides or [])}
        summary_file = RunDir(job).summary
        if summary_file.exists():
            summary = json.loads(summary_file.read_text())
            row["status"] = "done"
            row.update(summary.get("test", {}))
            for name, signature in summary.get("signatures", {}).items():
                row[f"{name}_signature"] = signature  # how BLEU and chrF were computed
            row["best_checkpoint"] = summary.get("best_checkpoint")
        else:
            row["status"] = "failed"  # no summary: the job raised or was stopped
        rows.append(row)
    return rows


SIGNATURES = ("bleu_signature", "chrf_signature")


def write_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = collect(sweep_dir)
    columns = ["job", "overrides", "status"]
    columns += sorted({k for r in rows for k in r} - {*columns, *SIGNATURES, "best_checkpoint"})
    columns += [*SIGNATURES, "best_checkpoint"]
    with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    metrics = sorted(
        {k for r in rows for k in r}
        - {"job", "overrides", "status", "best_checkpoint", *SIGNATURES}
    )
    header = ["job", "overrides", "status", *metrics]
    cells = [
        [str(r["job"]), r["overrides"], r["status"]]
        + [f"{r[m]:.4f}" if isinstance(r.get(m), float) else "" for m in metrics]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    for column in SIGNATURES:
        for signature in sorted({r[column] for r in rows if r.get(column)}):
            lines.append(f"{column.split('_')[0]}: sacreBLEU {signature}")
    return "\n".join(lines)


class SweepSummary(Callback):
    """A Hydra callback: summarise the sweep when every job has finished."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = write_summary(sweep_dir)
        if rows:
            log.info("Sweep summary (%s):\n%s", sweep_dir / "sweep_summary.csv", format_table(rows))
        jobs = sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                      key=lambda d: int(d.name))  # fmt: skip
        curves = write_sweep_curves(jobs, sweep_dir / "sweep_curves.png")
        if curves:
            log.info("Every job's curves: %s", curves)
