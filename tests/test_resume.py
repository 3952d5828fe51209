"""Resume: a run killed with SIGKILL mid-epoch, resumed from its last checkpoint with nothing
but `resume=RUN` on the command line, ends exactly where an uninterrupted run ends; a resume that
would change the run, or from a checkpoint that holds no training state, is refused and writes
nothing; a run made before a setting existed resumes with it off. (A budgeted run resumed, and
replay=RUN: tests/test_clock.py.)"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, compose_train, refused, run_train_cli

from train import train

# An experiment with overrides of its own, as users run them: 512 examples in batches of 32,
# 16 steps an epoch, 48 in all; last.ckpt every 5 steps.
RUN = [
    "experiment=reverse",
    "data.corpus.train_size=512",
    "data.corpus.val_size=64",
    "data.corpus.test_size=64",
    "data.batch_size=32",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
    "callbacks.step_checkpoint.every_n_train_steps=5",
    "model.net.dropout=0.1",  # random draws too must continue where they stopped
]
TOTAL_STEPS = 48
EPOCH_STEPS = 16
MID_EPOCH = 21  # epoch 1, batch 5: where the stopped-in-process runs stop


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict:
    """The run every interrupted-and-resumed run must equal, step by step."""
    return uninterrupted_run(tmp_path_factory, data_dir)


def uninterrupted_run(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, *extra: str
) -> dict:
    """RUN (with extra overrides) to its end: its summary, losses and epoch means."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    summary = train(compose_train(tmp_path, data_dir, [*RUN, *extra]))
    metrics_csv = Path(summary["run_dir"]) / "csv" / "version_0" / "metrics.csv"
    losses = logged_losses(metrics_csv)
    assert sorted(losses) == list(range(TOTAL_STEPS))
    return {"summary": summary, "losses": losses, "epoch_means": epoch_means(metrics_csv)}


def start(run_dir: Path, data_dir: Path, *extra: str, stdout: int = subprocess.DEVNULL):
    """`python train.py` with RUN, its run directory at run_dir."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *RUN, f"paths.data_dir={data_dir}",
         f"hydra.run.dir={run_dir}", *extra],
        cwd=run_dir.parent, stdout=stdout, stderr=subprocess.PIPE, text=True,
        # As from a terminal: a suite started in the background (nohup, `&` in a script)
        # passes SIGINT on ignored, and then Python, rightly, never sees a Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def saved_step(path: Path) -> int | None:
    try:
        return torch.load(path, weights_only=True, map_location="cpu")["global_step"]
    except Exception:  # not there yet
        return None


def wait_for_checkpoint(process: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Return once the run's last.ckpt is at `step` or later (training is under way)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        saved = saved_step(run_dir / "checkpoints" / "last.ckpt")
        if saved is not None and saved >= step:
            return
        time.sleep(0.02)
    process.kill()
    pytest.fail(f"the run ended or hung before its step-{step} checkpoint: {process.stderr.read()}")


def stopped_in_process(
    tmp_path: Path, data_dir: Path, overrides: list[str], monkeypatch, stop_at: int
) -> tuple[Path, int]:
    """A run with these overrides (its directory tmp_path/run), stopped by SIGTERM after step
    `stop_at` in this process, as train.py stops on one: its directory and the step its
    last.ckpt holds. (The signal's own path, exit code included, is the subprocess tests'.)"""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from seq2seq.training.callbacks import InterruptCheckpoint

    def signal_arrives(self, trainer, *args) -> None:
        if trainer.global_step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(InterruptCheckpoint, "on_train_batch_end", signal_arrives, raising=False)
    cfg = compose_train(tmp_path, data_dir, overrides)
    with pytest.raises(SIGTERMException):
        train(cfg)
    monkeypatch.undo()
    run_dir = Path(cfg.paths.output_dir)
    step = saved_step(run_dir / "checkpoints" / "last.ckpt")
    assert step is not None and step >= stop_at
    return run_dir, step


def stopped_in_process_resumes_exactly(
    tmp_path: Path, data_dir: Path, overrides: list[str], monkeypatch, stop_at: int, total: int
) -> None:
    """A run of `total` steps with these overrides, to its end; again, stopped by SIGTERM after
    step `stop_at` (in this process) and resumed with resume=RUN: every later step's loss and the
    final weights equal the uninterrupted run's."""
    whole = train(compose_train(tmp_path / "whole", data_dir, overrides))
    losses = logged_losses(Path(whole["run_dir"]) / "csv" / "version_0" / "metrics.csv")
    assert sorted(losses) == list(range(total))

    run_dir, step = stopped_in_process(tmp_path / "stopped", data_dir, overrides, monkeypatch,
                                       stop_at)  # fmt: skip
    assert step < total
    cfg = compose_train(tmp_path / "stopped", data_dir, [*overrides, f"resume={run_dir}"])
    cfg.paths.output_dir = str(run_dir)
    resumed = train(cfg)
    after = logged_losses(run_dir / "csv" / "version_1" / "metrics.csv")
    assert sorted(after) == list(range(step, total))
    for at, loss in after.items():
        assert loss == pytest.approx(losses[at], abs=1e-5), at
    ends = [
        torch.load(s["last_checkpoint"], weights_only=True)["state_dict"] for s in (whole, resumed)
    ]
    for name, value in ends[0].items():
        torch.testing.assert_close(ends[1][name], value, rtol=1e-5, atol=1e-6)


def logged_losses(metrics_csv: Path) -> dict[int, float]:
    """train/loss_step by step, as one start of a run logged it; a step logged twice fails."""
    losses: dict[int, float] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            if row.get("train/loss_step"):
                step = int(row["step"])
                assert step not in losses, f"step {step} logged twice in {metrics_csv}"
                losses[step] = float(row["train/loss_step"])
    return losses


def epoch_means(metrics_csv: Path) -> dict[int, dict[str, float]]:
    """The training epochs' means (train/loss, train/token_acc, train/padding) by epoch."""
    with open(metrics_csv) as f:
        return {
            int(row["epoch"]): {k: float(v) for k, v in row.items() if k.startswith("train/") and v}
            for row in csv.DictReader(f)
            if row.get("train/loss")
        }


def resume_in_process(run_dir: Path, data_dir: Path, *extra: str) -> dict:
    """`python train.py resume=RUN_DIR`, as train(cfg) in this process."""
    cfg = compose_train(run_dir.parent, data_dir, [*RUN, *extra, f"resume={run_dir}"])
    cfg.paths.output_dir = str(run_dir)
    return train(cfg)


def assert_resumed_exactly(run_dir: Path, loaded_step: int, uninterrupted: dict) -> None:
    """The resumed start (csv/version_1) began at the checkpoint's step, logged every later
    step once, with the uninterrupted run's losses, and tested as it did."""
    assert 0 < loaded_step < TOTAL_STEPS
    losses = logged_losses(run_dir / "csv" / "version_1" / "metrics.csv")
    # A resume that ignored the checkpoint would start again at step 0.
    assert min(losses) == loaded_step, f"resumed at step {min(losses)}, saved at {loaded_step}"
    assert sorted(losses) == list(range(loaded_step, TOTAL_STEPS))
    for step, loss in losses.items():
        assert loss == pytest.approx(uninterrupted["losses"][step], abs=1e-5), step
    # The epoch the resume falls in is whole in its means: the batches before the stop count.
    means = epoch_means(run_dir / "csv" / "version_1" / "metrics.csv")
    assert min(means) == loaded_step // EPOCH_STEPS  # not the epoch it resumed after
    for epoch, values in means.items():
        assert values == pytest.approx(uninterrupted["epoch_means"][epoch], abs=1e-6), epoch
    summary = json.loads((run_dir / "summary.json").read_text())
    final = torch.load(summary["last_checkpoint"], weights_only=True)["global_step"]
    assert final == TOTAL_STEPS  # every batch trained exactly once
    for name, value in uninterrupted["summary"]["test"].items():
        assert summary["test"][name] == pytest.approx(value, abs=1e-5), name


def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(
    tmp_path: Path, data_dir: Path, uninterrupted: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    process = start(run_dir, data_dir)
    after = 20  # epoch 2, batch 4 or later
    while True:
        wait_for_checkpoint(process, run_dir, after)
        # Frozen while its last checkpoint is read (a loaded machine can let the run reach an
        # epoch's end between a look and the kill): killed where that checkpoint is mid-epoch.
        process.send_signal(signal.SIGSTOP)
        step = saved_step(run_dir / "checkpoints" / "last.ckpt")
        if step % EPOCH_STEPS:
            break
        process.send_signal(signal.SIGCONT)
        after = step + 1
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert saved_step(run_dir / "checkpoints" / "last.ckpt") == step
    assert step % EPOCH_STEPS != 0 and step < TOTAL_STEPS  # really mid-epoch, really unfinished
    assert not (run_dir / "summary.json").exists()

    # What the log tells the user to type, and nothing else: the run's own overrides come back
    # (train.py's command line, run in this process: a second interpreter would only add the
    # seconds of its imports).
    assert run_train_cli([f"resume={run_dir}"], run_dir.parent, monkeypatch) == 0
    # The resume continued in the same directory and kept the first start's config.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (run_dir / ".hydra" / "config.yaml").exists()
    (resume_config,) = (run_dir / ".hydra").glob("resume-*/config.yaml")
    assert "task: reverse" in resume_config.read_text()  # the experiment's, not the default copy
    assert sorted(p.parent.name for p in run_dir.glob("csv/version_*/metrics.csv")) == [
        "version_0",
        "version_1",
    ]
    assert_resumed_exactly(run_dir, step, uninterrupted)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_saves_a_last_checkpoint_that_resumes_exactly(
    sig: signal.Signals, tmp_path: Path, data_dir: Path, uninterrupted: dict
) -> None:
    run_dir = tmp_path / "run"
    process = start(run_dir, data_dir, stdout=subprocess.PIPE)
    wait_for_checkpoint(process, run_dir, 5)  # training is under way
    process.send_signal(sig)
    out, err = process.communicate(timeout=120)
    output = out + err
    assert process.returncode == 128 + sig, output[-3000:]  # 143 or 130, as the tools exit
    step = saved_step(run_dir / "checkpoints" / "last.ckpt")
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert f"{name} at step {step}: saved" in output, output[-3000:]
    assert f"resume with: python train.py resume={run_dir}" in output
    assert not (run_dir / "summary.json").exists()
    # SIGTERM stops at a batch boundary and Ctrl-C mid-batch: either way the checkpoint holds
    # the last finished step, and the resume replays nothing and skips nothing.
    resume_in_process(run_dir, data_dir)
    assert_resumed_exactly(run_dir, step, uninterrupted)


def test_a_run_with_a_moving_average_of_its_weights_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, data_dir: Path, monkeypatch
) -> None:
    """callbacks=ema: stopped by SIGTERM mid-epoch and resumed, the run's losses, its average
    (which validation and the test score) and its weights end as an uninterrupted run's."""
    ema = ["callbacks=ema", "callbacks.ema.decay=0.99"]  # a memory longer than the run's 48 steps
    whole = uninterrupted_run(tmp_path_factory, data_dir, *ema)
    run_dir, step = stopped_in_process(tmp_path, data_dir, [*RUN, *ema], monkeypatch, MID_EPOCH)
    resume_in_process(run_dir, data_dir, *ema)
    assert_resumed_exactly(run_dir, step, whole)
    ends = [
        torch.load(path, weights_only=True, map_location="cpu")
        for path in (whole["summary"]["last_checkpoint"], run_dir / "checkpoints" / "last.ckpt")
    ]
    assert ends[0]["averaging_state"] == ends[1]["averaging_state"] == {"n_averaged": TOTAL_STEPS}
    for key in ("state_dict", "current_model_state"):  # the average, the weights
        assert ends[0][key].keys() == ends[1][key].keys(), key
        for name, value in ends[0][key].items():
            torch.testing.assert_close(ends[1][key][name], value, rtol=1e-4, atol=1e-5)


def test_a_run_with_muon_and_self_attention_qk_norm_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, data_dir: Path, monkeypatch
) -> None:
    """model.training.optimizer=muon with model.net.qk_norm=self (round three's pair): stopped
    by SIGTERM mid-epoch and resumed, the run's losses from the next step on (which Muon's
    momentum shapes) and its test end as an uninterrupted run's."""
    muon = ["model.training.optimizer=muon", "model.net.qk_norm=self"]
    whole = uninterrupted_run(tmp_path_factory, data_dir, *muon)
    run_dir, step = stopped_in_process(tmp_path, data_dir, [*RUN, *muon], monkeypatch, MID_EPOCH)
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert set(saved["optimizer_states"][0]) == {"muon", "adamw"}
    resume_in_process(run_dir, data_dir, *muon)
    assert_resumed_exactly(run_dir, step, whole)


def test_sigterm_in_an_epochs_last_batch_stops_after_the_epochs_end_and_resumes_exactly(
    tmp_path: Path, data_dir: Path, uninterrupted: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while an epoch's last batch trains: the epoch ends (validation, training means,
    its checkpoint) and the run stops after the next batch, mid-epoch, from where the resume
    is exact. Stopped before the epoch's end, Lightning's resume would end that epoch again:
    means of nothing (nan) and every later step logged one behind."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from seq2seq.training.callbacks import InterruptCheckpoint

    last = 2 * EPOCH_STEPS - 1  # the steps done when epoch 1's last batch starts
    own = InterruptCheckpoint.on_train_batch_start

    def signal_arrives(self, trainer, *args) -> None:
        if trainer.global_step == last:  # what Lightning's handler sets
            trainer._signal_connector.received_sigterm = True
        own(self, trainer, *args)

    monkeypatch.setattr(InterruptCheckpoint, "on_train_batch_start", signal_arrives)
    cfg = compose_train(tmp_path, data_dir, RUN)
    with pytest.raises(SIGTERMException):
        train(cfg)
    monkeypatch.undo()
    run_dir = Path(cfg.paths.output_dir)
    step = saved_step(run_dir / "checkpoints" / "last.ckpt")
    assert step == last + 2  # the next epoch's first step
    means = epoch_means(run_dir / "csv" / "version_0" / "metrics.csv")
    assert sorted(means) == [0, 1]  # the epoch it came in ended, its means logged
    for epoch, values in means.items():
        assert values == pytest.approx(uninterrupted["epoch_means"][epoch], abs=1e-6), epoch
    resume_in_process(run_dir, data_dir)
    assert_resumed_exactly(run_dir, step, uninterrupted)


def test_ctrl_c_in_an_epochs_last_batch_stops_after_the_epochs_end_and_resumes_exactly(
    tmp_path: Path, data_dir: Path, uninterrupted: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while an epoch's last batch trains, as SIGTERM above: the epoch ends, the run
    stops after the next batch (Lightning's KeyboardInterrupt, train.py's exit 130) with
    last.ckpt there, and the resume is exact."""
    from seq2seq.training.callbacks import InterruptCheckpoint

    last = 2 * EPOCH_STEPS - 1
    own = InterruptCheckpoint.on_train_batch_start

    def pressed(self, trainer, *args) -> None:
        if trainer.global_step == last:
            self._ctrl_c = True  # what its SIGINT handler sets at the first Ctrl-C
        own(self, trainer, *args)

    monkeypatch.setattr(InterruptCheckpoint, "on_train_batch_start", pressed)
    cfg = compose_train(tmp_path, data_dir, RUN)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        train(cfg)
    monkeypatch.undo()
    run_dir = Path(cfg.paths.output_dir)
    step = saved_step(run_dir / "checkpoints" / "last.ckpt")
    assert step == last + 2
    means = epoch_means(run_dir / "csv" / "version_0" / "metrics.csv")
    assert sorted(means) == [0, 1]
    resume_in_process(run_dir, data_dir)
    assert_resumed_exactly(run_dir, step, uninterrupted)


def test_sigterm_during_a_validation_stops_after_it_and_resumes_exactly(
    tmp_path: Path, data_dir: Path, tmp_path_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGTERM in a validation mid-epoch (every 8 batches here): the validation ends,
    its metrics logged, and the run stops after the next batch; the resume is exact. Stopped
    inside the validation, Lightning lost it and logged the later steps one off."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from seq2seq.training.callbacks import InterruptCheckpoint

    sent = []

    def signal_arrives(self, trainer, *args) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and not sent:
            sent.append(trainer.global_step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(
        InterruptCheckpoint, "on_validation_batch_start", signal_arrives, raising=False
    )
    cfg = compose_train(tmp_path, data_dir, [*RUN, "trainer.val_check_interval=8"])
    with pytest.raises(SIGTERMException):
        train(cfg)
    monkeypatch.undo()
    run_dir = Path(cfg.paths.output_dir)
    step = saved_step(run_dir / "checkpoints" / "last.ckpt")
    assert sent == [8] and step == 9  # the validation ended, then one more batch
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        assert [row["step"] for row in csv.DictReader(f) if row.get("val/loss")] == ["7"]
    resume_in_process(run_dir, data_dir, "trainer.val_check_interval=8")
    validating = uninterrupted_run(tmp_path_factory, data_dir, "trainer.val_check_interval=8")
    assert_resumed_exactly(run_dir, step, validating)


@pytest.fixture
def sigint_as_from_a_terminal():
    """Python's own Ctrl-C handler while the test runs, whatever the suite inherited: a suite
    started in the background (nohup, `&` in a script) has SIGINT ignored."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_ctrl_c_asks_to_stop_after_the_batch_and_a_second_stops_at_once(
    tmp_path: Path, sigint_as_from_a_terminal: None
) -> None:
    from types import SimpleNamespace

    from seq2seq.training.callbacks import InterruptCheckpoint

    callback = InterruptCheckpoint(str(tmp_path))
    trainer = SimpleNamespace(world_size=1, received_sigterm=False)
    callback.on_train_start(trainer, None)
    try:
        assert signal.getsignal(signal.SIGINT) == callback._on_ctrl_c
        signal.raise_signal(signal.SIGINT)  # the first Ctrl-C only asks
        assert callback._ctrl_c
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the second stops now
    finally:
        callback.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Under DDP the ranks would stop at different batches: Lightning's own handling stays.
    callback.on_train_start(SimpleNamespace(world_size=2, received_sigterm=False), None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Started with Ctrl-C ignored (nohup, a background job): it stays ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    callback.on_train_start(trainer, None)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    callback.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


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


# --- what a resume refuses, before anything is written ------------------------------------------

ENDED = ["experiment=reverse", "data.corpus.train_size=256", "data.corpus.val_size=32",
         "data.corpus.test_size=32", "trainer.max_epochs=1", "test=false"]  # fmt: skip


@pytest.fixture(scope="module")
def ended_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A run of 4 steps made by the command line (so with Hydra's .hydra/overrides.yaml)."""
    from _pytest.monkeypatch import MonkeyPatch

    tmp_path = tmp_path_factory.mktemp("ended")
    run_dir = tmp_path / "run"
    args = [*ENDED, f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}"]
    with MonkeyPatch.context() as monkeypatch:
        assert run_train_cli(args, tmp_path, monkeypatch) == 0
    assert saved_step(run_dir / "checkpoints" / "last.ckpt") == 4
    return run_dir


@pytest.fixture
def run_copy(ended_run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(ended_run, tmp_path / "run"))


CHANGES = [
    ("seed=12345", "seed=12345 differs from the run being resumed (seed=0 in"),
    ("data=copy", "data.corpus.task=copy differs from the run being resumed"),
    ("model.net.d_model=32", "model.net.d_model=32 differs"),
    (
        "model.training.lr=1e-4",
        "model.training.lr=0.0001 differs from the run being resumed (model.training.lr=0.003",
    ),
    ("model.training.schedule=constant", "model.training.schedule=constant differs"),
    ("data.batch_size=16", "data.batch_size=16 differs"),
    ("trainer.precision=bf16-mixed", "trainer.precision=bf16-mixed differs"),
]


@pytest.mark.parametrize(("change", "message"), CHANGES, ids=[c for c, _ in CHANGES])
def test_a_resume_that_would_change_the_run_is_refused(
    change: str, message: str, run_copy: Path, monkeypatch, capsys
) -> None:
    error = refused([f"resume={run_copy}", change], run_copy, monkeypatch, capsys)
    assert message in error
    assert "start a new run for other settings" in error


def test_a_resume_may_extend_the_run_and_keeps_its_config(
    run_copy: Path, monkeypatch, capsys
) -> None:
    args = [f"resume={run_copy}", "trainer.max_epochs=2", "logger=none"]
    assert run_train_cli(args, run_copy.parent, monkeypatch) == 0, capsys.readouterr().err
    assert saved_step(run_copy / "checkpoints" / "last.ckpt") == 8
    (overrides,) = (run_copy / ".hydra").glob("resume-*/overrides.yaml")
    assert "experiment=reverse" in overrides.read_text()  # the run's own, then the new limit


NEWER = ("norm", "activation", "num_kv_heads", "bias")  # model.net options added later


def as_written_before_the_options(run_dir: Path) -> None:
    """last.ckpt as a run made before the model options existed wrote it: its run config and
    hyperparameters without them."""
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    for net in (checkpoint["run_config"]["model"]["net"], checkpoint["hyper_parameters"]["net"]):
        for name in NEWER:
            del net[name]
    torch.save(checkpoint, path)


def test_a_run_made_before_the_model_options_resumes_and_refuses_one_set(
    run_copy: Path, monkeypatch, capsys
) -> None:
    as_written_before_the_options(run_copy)
    error = refused([f"resume={run_copy}", "model.net.norm=rms"], run_copy, monkeypatch, capsys)
    assert (
        "model.net.norm=rms differs from the run being resumed (model.net.norm=<not set>" in error
    )
    args = [f"resume={run_copy}", "trainer.max_epochs=2", "logger=none"]
    assert run_train_cli(args, run_copy.parent, monkeypatch) == 0, capsys.readouterr().err
    resumed = torch.load(run_copy / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 8
    # The options the run predates arrive at what the run meant: the network as it was built.
    meant = {"norm": "layer", "activation": "relu", "num_kv_heads": None, "bias": True}
    for net in (resumed["hyper_parameters"]["net"], resumed["run_config"]["model"]["net"]):
        assert {name: net[name] for name in NEWER} == meant


# The module's settings as the command line of a format-1 run gave them, flat.
FLAT = ["model.lr=2e-3", "model.max_len_b=7"]


def as_written_before_the_layers(run_dir: Path) -> list[str]:
    """last.ckpt as a run made before seq2seq/core and seq2seq/training wrote it: its config
    names the module and the callbacks at their old paths (seq2seq.module.Seq2SeqModule), and
    (format 1) its hyperparameters, its run config and its command line hold the module's
    settings flat (model.lr, not model.training.lr)."""
    import yaml

    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["seq2seq_format"] = 1
    for settings in (checkpoint["hyper_parameters"], checkpoint["run_config"]["model"]):
        settings |= {**settings.pop("training"), **settings.pop("decoding")}
        settings |= {"lr": 2e-3, "max_len_b": 7}  # as FLAT set them (the experiment: 3e-3, 5)
    overrides = run_dir / ".hydra" / "overrides.yaml"
    given = yaml.safe_load(overrides.read_text())
    overrides.write_text(yaml.safe_dump([*given, *FLAT]))
    old = []

    def rewrite(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "_target_" and value.startswith(("seq2seq.training.", "seq2seq.core.")):
                    node[key] = "seq2seq." + value.split(".", 2)[2]
                    old.append(node[key])
                rewrite(value)

    rewrite(checkpoint["run_config"])
    torch.save(checkpoint, path)
    return old


def test_a_run_made_before_the_layers_resumes(run_copy: Path, monkeypatch, capsys) -> None:
    old = as_written_before_the_layers(run_copy)
    assert "seq2seq.module.Seq2SeqModule" in old and "seq2seq.callbacks.TimeBudget" in old
    args = [f"resume={run_copy}", "trainer.max_epochs=2", "logger=none"]
    assert run_train_cli(args, run_copy.parent, monkeypatch) == 0, capsys.readouterr().err
    resumed = torch.load(run_copy / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 8
    # The flat settings arrived in their groups, with the run's values (not the experiment's),
    # in the module's hyperparameters and in the run config, and nowhere flat.
    for settings in (resumed["hyper_parameters"], resumed["run_config"]["model"]):
        assert settings["training"]["lr"] == 2e-3 and settings["decoding"]["max_len_b"] == 7
        assert not {"lr", "max_len_b"} & set(settings)
    # The classes at their old paths arrived at their new ones.
    config = resumed["run_config"]
    assert config["model"]["_target_"] == "seq2seq.training.module.Seq2SeqModule"
    assert config["callbacks"]["time_budget"]["_target_"] == (
        "seq2seq.training.callbacks.TimeBudget"
    )
    (overrides,) = (run_copy / ".hydra").glob("resume-*/overrides.yaml")
    assert "model.training.lr=2e-3" in overrides.read_text()  # the run's own, moved


def test_class_paths_from_before_the_layers_read_as_now() -> None:
    from seq2seq.training.preflight import current_target

    assert current_target("seq2seq.module.Seq2SeqModule") == (
        "seq2seq.training.module.Seq2SeqModule"
    )
    assert current_target("seq2seq.model.ModelConfig") == "seq2seq.core.model.ModelConfig"
    for unmoved in ("seq2seq.data.corpora.ParallelFiles", "lightning.pytorch.Trainer", None, 3):
        assert current_target(unmoved) == unmoved


def write_weights_only(run_dir: Path) -> Path:
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    path = run_dir / "checkpoints" / "weights.ckpt"
    torch.save({k: last[k] for k in ("state_dict", "hyper_parameters", "run_config")}, path)
    return path


def write_average(run_dir: Path) -> Path:
    from seq2seq.average import write_average

    last = run_dir / "checkpoints" / "last.ckpt"
    return write_average([last, last], run_dir / "checkpoints" / "average.ckpt")


def truncate_last(run_dir: Path) -> Path:
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return last


UNRESUMABLE = [
    (write_average, "ckpt_path", "cannot be resumed: it holds no optimizer state or training "
     "position (an average of checkpoints); resume from the run's last.ckpt, or test it with "
     "train=false ckpt_path="),
    (write_weights_only, "ckpt_path", "(weights only)"),
    (truncate_last, "resume", "truncated or not a file torch.save wrote: resume from another "
     "checkpoint with ckpt_path=PATH; the run's other checkpoints: epoch000-step000004.ckpt"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "how", "message"), UNRESUMABLE, ids=["average", "weights", "cut"])
def test_a_checkpoint_without_a_training_state_is_refused_before_anything_is_written(
    make, how: str, message: str, run_copy: Path, monkeypatch, capsys
) -> None:
    path = make(run_copy)
    target = f"ckpt_path={path}" if how == "ckpt_path" else f"resume={run_copy}"
    assert message in refused([target], run_copy, monkeypatch, capsys)


def test_a_run_with_early_stopping_made_before_its_check_setting_resumes(
    tmp_path: Path, data_dir: Path, monkeypatch, capsys
) -> None:
    """callbacks.early_stopping.check_on_train_epoch_end came later: a run whose config lacks
    it (its Trainer validated at epoch ends, where both checks follow the validation) resumes."""
    run_dir = tmp_path / "run"
    args = [*ENDED, "callbacks=early_stopping", "logger=none", f"paths.data_dir={data_dir}",
            f"hydra.run.dir={run_dir}"]  # fmt: skip
    assert run_train_cli(args, tmp_path, monkeypatch) == 0, capsys.readouterr().err
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["run_config"]["callbacks"]["early_stopping"]["check_on_train_epoch_end"]
    torch.save(checkpoint, path)
    resume = [f"resume={run_dir}", "trainer.max_epochs=2"]
    assert run_train_cli(resume, tmp_path, monkeypatch) == 0, capsys.readouterr().err
    assert saved_step(path) == 8


# --- runs of every earlier release ---------------------------------------------------------------

SAVED_AT_9855E30 = json.loads((Path(__file__).parent / "settings_of_9855e30.json").read_text())
# What a run could be made of: each experiment, each data option, callbacks=early_stopping.
VARIANTS = [
    "default",
    *(f"experiment={p.stem}" for p in sorted((ROOT / "configs" / "experiment").glob("*.yaml"))),
    *(f"data={p.stem}" for p in sorted((ROOT / "configs" / "data").glob("*.yaml"))),
    "callbacks=early_stopping",
]


def saved_at_9855e30(variant: str) -> set[str]:
    """The keys a run of this variant made at 9855e30 saved; for a variant that came later,
    any key some run of then saved."""
    every = set(SAVED_AT_9855E30["every run"])
    if variant in SAVED_AT_9855E30:
        return every | set(SAVED_AT_9855E30[variant])
    return every.union(*(set(v) for k, v in SAVED_AT_9855E30.items() if k[0] != "#"))


def without(config: dict, key: str) -> dict:
    """A copy of a nested config without one dotted key."""
    import copy

    lacking = copy.deepcopy(config)
    *parents, name = key.split(".")
    node = lacking
    for parent in parents:
        node = node[parent]
    del node[name]
    return lacking


def test_every_setting_a_run_lacks_reads_as_its_off_value(tmp_path: Path, data_dir: Path) -> None:
    """Each key of each variant's config, removed from the config a run saved: resume's checks
    (read_as_made, then first_difference) accept the run and set the key to its off value,
    unless it is a key every run of that variant saved since 9855e30
    (settings_of_9855e30.json), which a run cannot lack: then the refusal names it. A setting
    added without an off value fails here the day it is added."""
    import copy

    from omegaconf import OmegaConf

    from seq2seq import checks
    from seq2seq.training.preflight import (
        RESUME_MAY_CHANGE,
        _ignored,
        _off_value,
        first_difference,
        read_as_made,
    )

    def resumed(cfg, lacking: dict, key: str):
        again = copy.deepcopy(cfg)
        read_as_made(again, lacking, RESUME_MAY_CHANGE, set())
        return again, first_difference(again, lacking, RESUME_MAY_CHANGE)

    refused_once: set[str] = set()
    newer = 0
    for variant in VARIANTS:
        cfg = compose_train(tmp_path, data_dir, [] if variant == "default" else [variant])
        for missing in OmegaConf.missing_keys(cfg):  # data=hub's name: the user's to give
            OmegaConf.update(cfg, missing, "given")
        saved = OmegaConf.to_container(cfg, resolve=True)
        old = saved_at_9855e30(variant)
        for key in checks.flatten(saved):
            if _ignored(key, RESUME_MAY_CHANGE) or (key in old and key in refused_once):
                continue
            again, difference = resumed(cfg, without(saved, key), key)
            if key in old:
                assert difference is None or difference[0] == key, (variant, key, difference)
                refused_once.add(key)
                continue
            newer += 1
            assert difference is None, (
                f"{key} (with {variant}) has no off value: a run made before it cannot resume "
                f"({difference}); add it to ADDED_SETTINGS"
            )
            assert OmegaConf.select(again, key) == _off_value(key), (variant, key)
    assert newer > 100 and len(refused_once) > 100  # every variant composed and was read


def test_a_run_lacking_every_setting_added_since_9855e30_resumes(
    run_copy: Path, monkeypatch, capsys
) -> None:
    """The ended run's saved config without every setting newer than a run of its experiment
    at 9855e30 (among them data.bpe_dropout, which a run of 49ab0fb lacks), resumed with
    `resume=RUN` alone: it continues, with each of them off. (data.corpus.streaming, which
    the files corpus has, is the test above's.)"""
    from seq2seq import checks

    path = run_copy / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    old = saved_at_9855e30("experiment=reverse")
    removed = [
        key
        for key in checks.flatten(checkpoint["run_config"])
        if key not in old and not key.startswith(("paths.", "hydra."))
    ]
    for key in removed:
        checkpoint["run_config"] = without(checkpoint["run_config"], key)
    assert {"data.bpe_dropout", "model.training.optimizer", "model.net.qk_norm"} <= set(removed)
    torch.save(checkpoint, path)
    args = [f"resume={run_copy}", "trainer.max_epochs=2", "logger=none"]
    assert run_train_cli(args, run_copy.parent, monkeypatch) == 0, capsys.readouterr().err
    resumed = torch.load(path, weights_only=True)
    assert resumed["global_step"] == 8
    config = checks.flatten(resumed["run_config"])
    assert config["data.bpe_dropout"] == 0.0 and config["model.net.qk_norm"] is False
    assert config["model.training.optimizer"] == "adamw" and config["validations"] is None
