"""Training curves: a run draws curves.png from its metrics; inspect draws it for a run
directory; a sweep draws its jobs on one figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig

from seq2seq import inspect as inspect_cli
from seq2seq.curves import TIME, curves_figure, read_metrics, training_time_at, write_sweep_curves
from seq2seq.metric_names import LR

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_run_ends_with_its_curves(trained: tuple[dict, DictConfig]) -> None:
    run_dir = Path(trained[0]["run_dir"])
    assert (run_dir / "curves.png").read_bytes()[:8] == PNG


def test_the_curves_hold_loss_lr_and_validation_metrics_by_step_and_time(
    trained: tuple[dict, DictConfig],
) -> None:
    summary, cfg = trained
    rows = read_metrics(summary["run_dir"])
    assert any(TIME in row for row in rows)  # the module logs its training time
    figure = curves_figure({"run": rows})
    loss, lr, by_step, by_time = figure.axes
    assert [line.get_label() for line in loss.get_lines()] == ["train", "validation"]
    assert len(loss.get_lines()[1].get_xdata()) == cfg.trainer.max_epochs  # one per validation
    (rate,) = lr.get_lines()
    assert len(rate.get_xdata()) == sum(LR in row for row in rows) > 0
    assert [line.get_label() for line in by_step.get_lines()] == ["chrf", "bleu", "exact_match"]
    assert [line.get_label() for line in by_time.get_lines()] == ["chrf", "bleu", "exact_match"]
    times = by_time.get_lines()[2].get_xdata()
    assert list(times) == sorted(times) and times[0] > 0  # later validations, later times
    assert by_time.get_xlabel() == "training time (s)"


def test_the_rate_of_a_muon_run_is_drawn() -> None:
    """LearningRateMonitor names the rate after the optimizer: Muon's runs draw theirs too."""
    rows = [{"step": s, "lr-MuonWithAdamW/pg1": 1e-3 * s, "lr-MuonWithAdamW/pg2": 0.0}
            for s in range(1, 4)]  # fmt: skip
    (rate,) = curves_figure({"run": rows}).axes[1].get_lines()
    assert list(rate.get_ydata()) == pytest.approx([1e-3, 2e-3, 3e-3])


def test_training_time_is_read_at_each_step() -> None:
    rows = [{"step": 0, TIME: 1.0}, {"step": 10, TIME: 2.0}, {"step": 20, TIME: 3.5}]
    assert training_time_at(rows, [0, 5, 10, 25]) == [1.0, 1.0, 2.0, 3.5]
    assert training_time_at([{"step": 3, "val/loss": 1.0}], [3]) is None


def test_inspect_draws_a_runs_curves(trained, tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.png"
    assert inspect_cli.main([trained[0]["run_dir"], "--curves", "--out", str(out)]) == 0
    assert f"training curves: {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == PNG
    assert inspect_cli.main([str(tmp_path), "--curves"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "has no csv/version_*/metrics.csv" in err


def test_a_sweep_draws_every_job_on_one_figure(trained, tmp_path: Path) -> None:
    import shutil

    for job in ("0", "1"):
        shutil.copytree(Path(trained[0]["run_dir"]) / "csv", tmp_path / job / "csv")
    (tmp_path / "2").mkdir()  # a job that failed before logging: left out
    out = write_sweep_curves([tmp_path / j for j in ("0", "1", "2")], tmp_path / "sweep.png")
    assert out is not None and out.read_bytes()[:8] == PNG
    assert write_sweep_curves([tmp_path / "2"], tmp_path / "none.png") is None


def test_reading_a_resumed_run_puts_its_starts_in_order(tmp_path: Path) -> None:
    for version, step in ((0, 1), (1, 2), (10, 3)):
        path = tmp_path / "csv" / f"version_{version}"
        path.mkdir(parents=True)
        (path / "metrics.csv").write_text(f"step,train/loss_step\n{step},{step}.5\n")
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2, 3]
    with pytest.raises(ValueError, match="has no csv/version_"):
        read_metrics(tmp_path / "nothing")
