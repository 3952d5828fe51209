"""Resume: a run killed with SIGKILL mid-epoch, resumed from its last checkpoint, ends exactly
where an uninterrupted run ends."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, compose_train

from train import train

# 1024 examples in batches of 32: 32 steps an epoch, 96 in all; last.ckpt every 5 steps.
RUN = [
    "data.train_size=1024",
    "data.val_size=64",
    "data.test_size=64",
    "data.batch_size=32",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
    "callbacks.step_checkpoint.every_n_train_steps=5",
    "model.net.dropout=0.1",  # random draws too must continue where they stopped
]
TOTAL_STEPS = 96


def start(tmp_path: Path, data_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *RUN, f"paths.data_dir={data_dir}", *extra],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def saved_step(path: Path) -> int | None:
    try:
        return torch.load(path, weights_only=True, map_location="cpu")["global_step"]
    except Exception:  # not there yet
        return None


def kill_mid_epoch(process: subprocess.Popen, run_root: Path, timeout: float = 240) -> int:
    """SIGKILL the run once its last.ckpt is past step 40 (epoch 2, batch 8)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        for ckpt in run_root.glob("outputs/train/runs/*/checkpoints/last.ckpt"):
            step = saved_step(ckpt)
            if step is not None and step >= 40:
                process.send_signal(signal.SIGKILL)
                process.wait()
                return step
        time.sleep(0.02)
    process.kill()
    pytest.fail(f"the run ended or hung before a mid-epoch checkpoint: {process.stderr.read()}")


def rows_by_step(run_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    """Every logged row of every start (csv/version_N), keyed by (step, which metric)."""
    out = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(metrics) as f:
            for row in csv.DictReader(f):
                values = {k: v for k, v in row.items() if v}
                key = (values.get("step", ""), ",".join(sorted(values)))
                out[key] = values
    return out


def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(
    tmp_path: Path, data_dir: Path
) -> None:
    full = train(compose_train(tmp_path / "full", data_dir, RUN))

    process = start(tmp_path, data_dir)
    step = kill_mid_epoch(process, tmp_path)
    assert step % 32 != 0 and step < TOTAL_STEPS  # really mid-epoch, really unfinished
    (run_dir,) = (tmp_path / "outputs" / "train" / "runs").iterdir()
    assert not (run_dir / "summary.json").exists()

    resumed = start(tmp_path, data_dir, f"resume={run_dir}")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    # The resume continued in the same directory and kept the first start's config.
    assert list((tmp_path / "outputs" / "train" / "runs").iterdir()) == [run_dir]
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert len(list((run_dir / ".hydra").glob("resume-*/config.yaml"))) == 1
    assert sorted(p.parent.name for p in run_dir.glob("csv/version_*/metrics.csv")) == [
        "version_0",
        "version_1",
    ]

    summary = json.loads((run_dir / "summary.json").read_text())
    for name, value in full["test"].items():
        assert summary["test"][name] == pytest.approx(value, abs=1e-4), name
    # Step by step, the resumed run logged what the uninterrupted one did.
    expected = rows_by_step(Path(full["run_dir"]))
    got = rows_by_step(run_dir)
    resumed_steps = [k for k in got if k[0] and int(k[0]) > step + 1 and "train/loss_step" in k[1]]
    assert len(resumed_steps) > 20
    for key in resumed_steps:
        assert float(got[key]["train/loss_step"]) == pytest.approx(
            float(expected[key]["train/loss_step"]), abs=1e-4
        ), key


def test_resume_from_a_missing_checkpoint_fails_clearly(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_train(tmp_path, data_dir, [f"resume={tmp_path / 'nowhere'}"])
    with pytest.raises(ValueError, match=r"nowhere/checkpoints/last\.ckpt does not exist"):
        train(cfg)


def test_an_interrupted_checkpoint_write_leaves_the_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning writes checkpoints through _atomic_save: into a temporary file renamed over the
    old one when complete. A crash half-way through the write must leave the old file."""
    from fsspec.implementations.local import LocalFileOpener
    from lightning.fabric.utilities.cloud_io import _atomic_save

    path = tmp_path / "last.ckpt"
    _atomic_save({"state_dict": {"w": torch.ones(3)}, "hyper_parameters": {}}, path)
    before = path.read_bytes()

    def crash(self, data):  # write half, then die as a killed process would
        self.f.write(data[: len(data) // 2])
        raise OSError("simulated crash during the write")

    monkeypatch.setattr(LocalFileOpener, "write", crash, raising=False)
    with pytest.raises(OSError, match="simulated crash"):
        _atomic_save({"state_dict": {"w": torch.zeros(1000)}, "hyper_parameters": {}}, path)
    assert path.read_bytes() == before
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(3))
