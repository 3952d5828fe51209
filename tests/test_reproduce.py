"""Reproducibility and sweeps: the same command and seed give the same run; a sweep ends with a
summary of every job."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import compose_train, run_train_cli

from seq2seq.curves import TIME
from seq2seq.score import signatures
from train import train

QUICK = [
    "data.corpus.train_size=512",
    "data.corpus.val_size=64",
    "data.corpus.test_size=64",
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "model.net.dropout=0.1",  # dropout draws random numbers too: they must repeat
]


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    """Every logged row but the training time, which is the clock's, not the run's."""
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(TIME in row for row in rows)
    return [{k: v for k, v in row.items() if k != TIME} for row in rows]


def test_same_seed_gives_the_same_metrics_step_by_step(tmp_path: Path, data_dir: Path) -> None:
    runs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        cfg = compose_train(tmp_path / name, data_dir, [*QUICK, f"seed={seed}"])
        runs.append((train(cfg), metrics_rows(Path(cfg.paths.output_dir))))
    (summary_a, rows_a), (summary_b, rows_b), (_, rows_c) = runs
    assert len(rows_a) > 10
    assert rows_a == rows_b  # every logged value, every step, bit for bit
    assert summary_a["test"] == summary_b["test"]
    assert rows_a != rows_c  # and the seed does matter


def test_sweep_writes_a_summary_of_every_job(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    args = ["-m", "debug=fdr", "model.net.num_heads=1,2", "seed=0,1"]
    assert run_train_cli([*args, f"paths.data_dir={data_dir}", *QUICK[:3]], tmp_path,
                         monkeypatch) == 0  # fmt: skip
    (sweep_dir,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    common = f"paths.data_dir={data_dir} {' '.join(QUICK[:3])}"
    assert {r["overrides"] for r in rows} == {
        f"debug=fdr model.net.num_heads={h} seed={s} {common}" for h in (1, 2) for s in (0, 1)
    }
    for row in rows:  # each row reports its own job's test metrics
        tested = json.loads((sweep_dir / row["job"] / "summary.json").read_text())["test"]
        assert row["status"] == "done"
        for name, value in tested.items():
            assert float(row[name]) == pytest.approx(value, rel=1e-6), (row["job"], name)
    assert {r["bleu_signature"] for r in rows} == {signatures("13a")["bleu"]}
    assert {r["chrf_signature"] for r in rows} == {signatures("13a")["chrf"]}
    for job in range(4):  # each job has its own directory and summary
        assert json.loads((sweep_dir / str(job) / "summary.json").read_text())["test"]
    output = "".join(capfd.readouterr())
    assert "Sweep summary" in output
    assert f"bleu: sacreBLEU {signatures('13a')['bleu']}" in output


def test_rerun_from_a_run_directory_gives_the_same_metrics(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/runs.md's rerun command: the composed config in <run>/.hydra is the whole recipe."""

    def run(*args: str) -> None:
        assert run_train_cli(list(args), tmp_path, monkeypatch) == 0

    run(*QUICK, "trainer.max_epochs=1", f"paths.data_dir={data_dir}")
    (first,) = (tmp_path / "outputs" / "train" / "runs").iterdir()
    run("-cp", str(first / ".hydra"), "-cn", "config", f"hydra.run.dir={tmp_path / 'rerun'}")
    assert metrics_rows(tmp_path / "rerun") == metrics_rows(first)
    assert len(metrics_rows(first)) > 10
