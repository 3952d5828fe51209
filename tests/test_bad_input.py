"""Bad input, one table per kind: each row is what a user does, the exit code (or error) it must
give, and a fragment of the one-line message. And faults: a non-finite loss, an unwritable output
directory, a full disk, a directory holding another run. (Broken checkpoints: test_cli.py;
SIGKILL, SIGTERM and Ctrl-C, and a crash during a checkpoint write: test_resume.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, compose_train, run_train_cli, small_data

from seq2seq import translate as translate_cli
from seq2seq.training.launch import root_cause
from train import train

SMALL = [
    "data.corpus.train_size=256",
    "data.corpus.val_size=32",
    "data.corpus.test_size=32",
    "logger=none",
]


# --- the command line: one line, exit code 1, nothing written -------------------------------

CLI_ROWS = [
    (["model=hueg"], "model=hueg is not an option of model; choose one of: base, small, tiny"),
    (["experiment=nope"], "experiment=nope is not an option of experiment; choose one of:"),
    (["model.lrr=1"], "model.lrr is not a setting"),
    (
        ["data.max_len=5"],
        "data.max_len is now data.corpus.max_length: write data.corpus.max_length=... instead",
    ),  # a command line from before the symbol corpus
    (
        ["model.lr=1e-3"],
        "model.lr is now model.training.lr: write model.training.lr=... instead",
    ),  # a command line from before the groups
    (["model.training.lr=abc"], "model.training.lr must be a positive number, got 'abc'"),
    (["data.batch_size=0"], "data.batch_size must be a positive integer, got 0"),
    (["trainer.max_epochs=[1"], "cannot parse the override 'trainer.max_epochs=[1'"),
    (["hydra.run.dir=/dev/null/run"], "cannot write to the output directory /dev/null/run"),
]

# Every Trainer setting a user is likely to type: the key, the value, what is allowed.
TRAINER_ROWS = [
    (["trainer.max_epochs=abc"], "trainer.max_epochs must be a positive integer, or -1 for no "
     "limit, got 'abc'"),
    (["trainer.max_epochs=0"], "trainer.max_epochs must be a positive integer, or -1"),
    (["trainer.max_steps=1.5"], "trainer.max_steps must be a positive integer, or -1 for no "
     "limit, got 1.5"),
    (["trainer.max_time=30min"], "trainer.max_time must be a duration DD:HH:MM:SS longer than "
     "0 (e.g. 00:00:30:00 for 30 minutes; null for no time limit), got '30min'"),
    (["trainer.max_time=00:00:00:00"], "trainer.max_time must be a duration DD:HH:MM:SS longer "
     "than 0"),  # Lightning would train one step and exit 0
    (["trainer.devices=0"], "trainer.devices must be a positive integer, -1 (all), auto, or a "
     "list of device indices such as [0,1], got 0"),
    (["trainer.devices=[0,x]"], "trainer.devices must be a positive integer"),
    (["trainer.precision=bf17"], "trainer.precision must be one of 32-true, 16-mixed, "
     "bf16-mixed, 16-true, bf16-true, 64-true, got 'bf17'"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches must be a "
     "positive integer, got 0"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val must be a number in "
     "[0, inf], got -1"),
    (["trainer.val_check_interval=1.5"], "trainer.val_check_interval must be a fraction of an "
     "epoch in (0, 1] or a number of batches >= 1, got 1.5"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval must be a fraction"),
    (["trainer.limit_train_batches=abc"], "trainer.limit_train_batches must be a fraction of "
     "the batches in [0, 1] or a number of batches >= 0, got 'abc'"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches must be a fraction"),
    (["trainer.limit_test_batches=2.0"], "trainer.limit_test_batches must be a fraction"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps must be a positive integer, "
     "got 0"),
]  # fmt: skip


def test_a_bad_command_line_in_a_subprocess_exits_1_with_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """The contract end to end, in a real process; the tables below run in this one."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model.training.lr=abc"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr == "error: model.training.lr must be a positive number, got 'abc'\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("overrides", "message"), CLI_ROWS + TRAINER_ROWS)
def test_bad_command_lines_fail_with_one_line_and_write_nothing(
    overrides: list[str], message: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    assert run_train_cli(overrides, tmp_path, monkeypatch) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert message in lines[0]
    assert list(tmp_path.rglob("*")) == []  # no run directory, no log, no data cache


def test_hydra_full_error_shows_the_traceback(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match=r"model\.training\.lr must be a positive number"):
        run_train_cli(["model.training.lr=abc", "logger=none"], tmp_path, monkeypatch)


# --- config values: checked before any training ----------------------------------------------

CONFIG_ROWS = [
    (["model.training.lr=-1"], "model.training.lr must be a positive number, got -1"),
    (
        ["model.training.warmup_steps=abc"],
        "model.training.warmup_steps must be an integer >= 0, got 'abc'",
    ),
    (
        ["model.training.label_smoothing=1.5"],
        "model.training.label_smoothing must be a number in [0, 1), got 1.5",
    ),
    (
        ["model.training.weight_decay=x"],
        "model.training.weight_decay must be a number in [0, inf], got 'x'",
    ),
    (
        ["model.training.betas=[0.9]"],
        "model.training.betas must be two numbers in [0, 1), got [0.9]",
    ),
    (
        ["model.training.schedule=linear"],
        "model.training.schedule must be one of inverse_sqrt, cosine, wsd, constant",
    ),
    (["model.decoding.beam_size=0"], "model.decoding.beam_size must be a positive integer, got 0"),
    (["+model.lr_warmup=10"], "model.lr_warmup is not a setting of the module; its groups are"),
    (["+model.training.warm=1"], "model.training.warm is not a training setting; known: lr, betas"),
    (
        ["+model.net.n_layers=3"],
        "model.net.n_layers is not a net setting; did you mean num_encoder_layers, "
        "num_decoder_layers? (known: d_model,",
    ),
    (
        ["+data.corpus.train_siz=10"],
        "data.corpus.train_siz is not a setting of SymbolTask; did you mean train_size? (known:",
    ),
    (["+trainer.max_epoch=1"], "trainer.max_epoch is not a setting of Trainer; did you mean "),
    (
        ["+callbacks.model_checkpoint.monitr=x"],
        "callbacks.model_checkpoint.monitr is not a setting of ModelCheckpoint; did you mean",
    ),
    (["+model.beam_size=2"], "model.beam_size is now model.decoding.beam_size: write "),
    (
        ["model.training.compile=maybe"],
        "model.training.compile must be one of True, False, got 'maybe'",
    ),
    (["model.net.num_heads=0"], "num_heads must be a positive integer, got 0"),
    (["model.net.d_model=30"], "d_model must be divisible by num_heads"),
    (["model.net.dropout=high"], "dropout must be a number in [0, 1), got 'high'"),
    (["model.net.max_positions=8"], "model.net.max_positions=8 is below the 11 positions"),
    (["data.batch_size=abc"], "data.batch_size must be a positive integer, got 'abc'"),
    (["average_last=-1"], "average_last must be an integer >= 0, got -1"),
    (["validations=0"], "validations must be a positive integer, got 0"),
    (["data.num_workers=-1"], "data.num_workers must be an integer >= 0, got -1"),
    (["data.corpus.num_symbols=1"], "data.corpus.num_symbols must be at least 2, got 1"),
    (["data.corpus.task=hueg"], "unknown data.corpus.task 'hueg'"),
    (
        ["data.corpus._target_=collections.OrderedDict"],
        "data.corpus built OrderedDict, which is not a corpus (no load(data_dir) -> DatasetDict",
    ),
    (
        ["data.tokenizer={kind:bpe}"],
        "data.tokenizer does not apply to SymbolTask, whose "
        "tokenizers are fixed: set data.tokenizer=null",
    ),
    (
        ["data=numbers", "data.tokenizer=null"],
        "data.tokenizer is null, but NumberWords needs one fitted: give data.tokenizer.kind",
    ),
    (["data=numbers", "data.tokenizer.kind=chars"], "data.tokenizer.kind must be one of"),
    (["data=numbers", "data.corpus.src_lang=xx"], "src_lang='xx' is not a num2words language"),
    (["data=parallel_files"], "data.corpus.train needs files"),
    (["data=parallel_files", "data.corpus.train.file=/no/such.tsv"], "does not exist"),
    (["data=dates", "data.tokenizer.vocab_size=3"], "vocab_size must exceed the 4 special"),
]


@pytest.mark.parametrize(("overrides", "message"), CONFIG_ROWS)
def test_bad_config_values_fail_before_training(
    overrides: list[str], message: str, tmp_path: Path, data_dir: Path
) -> None:
    data = next((o.split("=")[1] for o in overrides if o.startswith("data=")), "copy")
    small = [*small_data(data, tmp_path), "logger=none"]
    if "data=parallel_files" in overrides:  # the rows give (or leave out) the files
        small = [o for o in small if "corpus.train" not in o]
    cfg = compose_train(tmp_path, data_dir, [*small, *overrides])
    with pytest.raises(Exception) as info:
        train(cfg)
    error = root_cause(info.value)
    assert isinstance(error, ValueError), repr(error)
    assert message in str(error)
    assert "\n" not in str(error)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(("overrides", "message"), CONFIG_ROWS)
def test_bad_config_values_on_the_command_line_write_nothing(
    overrides: list[str], message: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    assert run_train_cli(overrides, tmp_path, monkeypatch) == 1
    assert message in capsys.readouterr().err
    assert list(tmp_path.rglob("*")) == []


# --- checkpoints of another model or another task ----------------------------------------------


def test_resuming_with_another_model_config_fails_clearly(
    trained, tmp_path: Path, data_dir: Path
) -> None:
    """A checkpoint that recorded its run's config is compared key by key (test_resume.py);
    one saved without it (format 0) still has its model and vocabularies compared."""
    summary, _ = trained
    checkpoint = torch.load(summary["last_checkpoint"], weights_only=True)
    del checkpoint["run_config"]
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    old = tmp_path / "run" / "checkpoints" / "last.ckpt"
    torch.save(checkpoint, old)
    cfg = compose_train(tmp_path, data_dir, [*SMALL, "model=small", f"ckpt_path={old}"])
    with pytest.raises(ValueError, match=r"was trained with model\.net\.d_model=64.*256"):
        train(cfg)


def test_evaluating_with_another_task_fails_clearly(trained, tmp_path: Path, data_dir: Path):
    summary, _ = trained
    overrides = ["train=false", f"ckpt_path={summary['best_checkpoint']}", "data=numbers"]
    overrides += ["data.corpus.train_size=256", "data.corpus.val_size=32"]
    cfg = compose_train(tmp_path, data_dir, [*overrides, "data.corpus.test_size=32"])
    message = r"differs from the data's: evaluate it on the data it was trained on \(drop data="
    with pytest.raises(ValueError, match=message):
        train(cfg)


# --- translate's input -------------------------------------------------------------------------

TRANSLATE_ROWS = [
    # (stdin bytes, exit code, stdout lines, stderr fragment)
    (b"", 0, [], ""),
    (b"\n   \n", 0, ["", ""], ""),
    (b"1 2 zz 3\n", 0, None, "input line 1: 1 unknown token(s) mapped to <unk>"),
    (b"1 " * 100 + b"\n", 1, [], "input line 1 has 100 tokens, more than the model's 64"),
    (b"1 2\n\xff\xfe\x00junk\n", 1, [], "standard input line 2 is not valid UTF-8"),
    (b"\r\n\r\n", 0, ["", ""], ""),  # Windows line ends
    (b"1 2\r3\n4\n", 0, 2, ""),  # a bare carriage return ends no line, as in training files
]


@pytest.mark.parametrize(("stdin", "code", "lines", "message"), TRANSLATE_ROWS)
def test_translate_input_table(
    trained, stdin: bytes, code: int, lines, message: str, monkeypatch, capsys
) -> None:
    import io

    summary, _ = trained
    fake = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", fake)
    assert translate_cli.main(["--ckpt", summary["best_checkpoint"]]) == code
    out, err = capsys.readouterr()
    if isinstance(lines, int):
        assert len(out.split("\n")) - 1 == lines, out
    elif lines is not None:
        assert out.splitlines() == lines
    assert message in err
    if code:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_translate_input_file_with_bad_bytes_names_the_file(trained, tmp_path: Path, capsys):
    summary, _ = trained
    path = tmp_path / "in.txt"
    path.write_bytes(b"1 2\n3 \xe9\n")
    args = ["--ckpt", summary["best_checkpoint"], "--input", str(path)]
    assert translate_cli.main(args) == 1
    assert f"{path} line 2 is not valid UTF-8" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not valid UTF-8"):  # --debug: the traceback
        translate_cli.main([*args, "--debug"])


# --- faults: nothing is lost -------------------------------------------------------------------


def poison_loss_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """From optimizer step `step` on, the loss is NaN (as after an overflow)."""
    from seq2seq.training.module import Seq2SeqModule

    original = Seq2SeqModule.model_step

    def model_step(self, batch):
        loss, logits = original(self, batch)
        if self.training and self.global_step >= step:
            loss = loss * float("nan")
        return loss, logits

    monkeypatch.setattr(Seq2SeqModule, "model_step", model_step)


def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_loss_at(monkeypatch, 12)
    overrides = [*SMALL, "data.batch_size=16", "callbacks.step_checkpoint.every_n_train_steps=5"]
    cfg = compose_train(tmp_path, data_dir, overrides)
    with pytest.raises(ValueError, match=r"non-finite loss \(nan\) at step 12.* last good"):
        train(cfg)
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 10
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())


def test_non_finite_losses_can_be_skipped_by_config(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    poison_loss_at(monkeypatch, 12)
    overrides = [*SMALL, "data.batch_size=16", "trainer.max_epochs=1"]
    cfg = compose_train(tmp_path, data_dir, [*overrides, "model.training.on_nonfinite_loss=skip"])
    summary = train(cfg)
    assert "skipped 4 batches with a non-finite loss" in caplog.text
    state = torch.load(summary["last_checkpoint"], weights_only=True)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values())


def test_an_unwritable_output_directory_fails_before_training(tmp_path: Path, data_dir: Path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cfg = compose_train(tmp_path, data_dir, SMALL)
    cfg.paths.output_dir = str(blocker / "run")
    with pytest.raises(ValueError, match=r"cannot write to the output directory .*a_file/run"):
        train(cfg)


def test_a_new_run_in_a_directory_holding_checkpoints_is_refused(
    tmp_path: Path, data_dir: Path
) -> None:
    """Without resume=, a run never overwrites (or silently continues) another run's files."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"an earlier run's weights")
    with pytest.raises(ValueError, match=r"already holds checkpoints of a run \(last\.ckpt\): "
                       r"continue it with resume=.*/run, or start a new run"):  # fmt: skip
        train(compose_train(tmp_path, data_dir, SMALL))
    assert (checkpoints / "last.ckpt").read_bytes() == b"an earlier run's weights"
    assert [p.name for p in checkpoints.iterdir()] == ["last.ckpt"]


def test_a_command_line_into_a_run_directory_holding_checkpoints_writes_nothing(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """hydra.run.dir=<an earlier run>: refused before Hydra would write its config over the
    earlier run's .hydra/config.yaml."""
    run_dir = tmp_path / "earlier"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (run_dir / ".hydra" / "config.yaml").write_text("the earlier run's config")
    before = sorted(tmp_path.rglob("*"))
    assert run_train_cli([f"hydra.run.dir={run_dir}"], tmp_path, monkeypatch) == 1
    assert f"error: the output directory {run_dir} already holds checkpoints" in (
        capsys.readouterr().err
    )
    assert sorted(tmp_path.rglob("*")) == before
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "the earlier run's config"


def test_a_full_disk_fails_before_training(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(ValueError, match=r"only 0\.0 MiB free .* checkpoints need about"):
        train(compose_train(tmp_path, data_dir, SMALL))
    assert not (tmp_path / "run" / "checkpoints").exists()
