"""Scaling switches on the CPU: two DDP processes, bf16 mixed precision, torch.compile, and an
Optuna search."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, compose_train

from train import train

SMALL = ["data.train_size=256", "data.val_size=32", "data.test_size=32"]
# Enough training that both runs learn most of the task: ~10 s each on 2 cores.
LEARN = ["data.max_len=5", "data.train_size=2000", "data.val_size=100", "data.test_size=200"]
LEARN += ["trainer.max_epochs=4", "logger=none"]


def run_cli(tmp_path: Path, data_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"paths.data_dir={data_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_ddp_on_two_cpu_processes_matches_one_process(tmp_path: Path, data_dir: Path) -> None:
    single = run_cli(tmp_path / "single", data_dir, *LEARN, "data.batch_size=64")
    # Two processes of 32 make the same 64 examples a step, and the gradients are averaged.
    ddp = run_cli(tmp_path / "ddp", data_dir, *LEARN, "data.batch_size=32", "trainer=ddp_cpu")
    assert single.returncode == 0, single.stderr[-2000:]
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    (single_dir,) = (tmp_path / "single" / "outputs" / "train" / "runs").iterdir()
    runs = list((tmp_path / "ddp" / "outputs" / "train" / "runs").iterdir())
    assert len(runs) == 1  # one run directory, not one per process
    single_test = json.loads((single_dir / "summary.json").read_text())["test"]
    ddp_test = json.loads((runs[0] / "summary.json").read_text())["test"]
    assert single_test["test/exact_match"] > 0.5  # it learned something to compare
    assert ddp_test["test/exact_match"] == pytest.approx(single_test["test/exact_match"], abs=0.1)
    assert ddp_test["test/loss"] == pytest.approx(single_test["test/loss"], rel=0.35)
    # Only rank 0 reports: the summary lines appear once.
    assert (ddp.stdout + ddp.stderr).count("Best checkpoint:") == 1


def test_bf16_mixed_precision_trains_on_the_cpu(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_train(tmp_path, data_dir, [*SMALL, "debug=fdr", "trainer.precision=bf16-mixed"])
    summary = train(cfg)
    assert all(math.isfinite(v) for v in summary["test"].values())


@pytest.mark.slow
def test_compiled_model_trains_on_the_cpu(tmp_path: Path, data_dir: Path) -> None:
    overrides = [*SMALL, "debug=fdr", "model.compile=true", "model.net.num_encoder_layers=1"]
    overrides += ["model.net.num_decoder_layers=1"]
    summary = train(compose_train(tmp_path, data_dir, overrides))  # about a minute: compiling
    assert all(math.isfinite(v) for v in summary["test"].values())


def test_optuna_search_runs_trials_and_reports_the_best(tmp_path: Path, data_dir: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = run_cli(
        tmp_path, data_dir, "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
        "debug=fdr", *SMALL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "Best parameters: {'model.lr':" in output
    (sweep_dir,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    assert (sweep_dir / "optimization_results.yaml").exists()
    assert len((sweep_dir / "sweep_summary.csv").read_text().splitlines()) == 3
