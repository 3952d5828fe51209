"""Bad input and faults for the tools besides train.py (translate, export, translate --model,
average, score, inspect), one table each, as docs/guarantees.md's tables list them: every row exits
non-zero with one line, and leaves either the complete result or nothing. (train.py's own
rows: test_bad_input.py; score's: test_score.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from seq2seq import average as average_cli
from seq2seq import export as export_cli
from seq2seq import inspect as inspect_cli
from seq2seq import translate as translate_cli


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    return lines[0]


def leftovers(directory: Path) -> list[str]:
    """Hidden files a write in progress leaves (.NAME.part-PID), which a finished or failed
    tool must have removed."""
    return sorted(p.name for p in directory.rglob(".*") if ".part-" in p.name or ".old-" in p.name)


# --- translate's options: refused before any model is read (exit 2) -----------------------------

OPTION_ROWS = [
    (["--beam", "0"], "--beam must be at least 1, got 0"),
    (["--beam", "-1"], "--beam must be at least 1, got -1"),
    (["--beam", "abc"], "argument --beam: invalid int value: 'abc'"),
    (["--beam", "2", "--n-best", "3"], "--n-best 3 needs a beam at least as wide: add --beam 3"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--max-len", "0"], "--max-len must be at least 1, got 0"),
    (["--beam", "2", "--length-penalty", "nan"], "--length-penalty must be a finite number"),
    (["--sample", "--temperature", "0"], "--temperature must be a positive number, got 0.0"),
    (["--sample", "--top-k", "-1"], "--top-k must be 0 (all tokens) or more, got -1"),
    (["--sample", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--sample", "--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--sample", "--seed", "-1"], "--seed must be in 0-4294967295 (both backends take 32 bits)"),
    (["--sample", "--seed", str(2**32)], "--seed must be in 0-4294967295"),
    (["--sample", "--temperature", "1e-9"], "--temperature must be at least 0.0001, got 1e-09"),
    (["--sample", "--beam", "4"], "--sample draws one output per input"),
]


@pytest.mark.parametrize("backend", ["--ckpt", "--model"])
@pytest.mark.parametrize(
    ("options", "message"), OPTION_ROWS, ids=[" ".join(r[0]) for r in OPTION_ROWS]
)
def test_bad_translate_options_fail_with_one_line_before_the_model_loads(
    backend: str, options: list[str], message: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as stop:  # the model path is never read
        translate_cli.main([backend, str(tmp_path / "absent"), *options, "1 2"])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert message in line and line.endswith("(see python -m seq2seq.translate --help)")


def test_translate_names_a_bad_input_file_or_device(trained, tmp_path: Path, capsys) -> None:
    ckpt = trained[0]["best_checkpoint"]
    rows = [
        (
            ["--input", str(tmp_path / "none.txt")],
            "none.txt is not a file: give a file with one input a line",
        ),
        (["--input", str(tmp_path)], "is not a file"),
        (["--device", "tpu9", "1 2"], "--device must be cpu, cuda, cuda:N or mps, got 'tpu9'"),
    ]
    if not torch.cuda.is_available():
        rows.append((["--device", "cuda:3", "1 2"], "--device cuda:3: no such device on this"))
    for args, message in rows:
        assert translate_cli.main(["--ckpt", ckpt, *args]) == 1
        assert message in one_line(capsys.readouterr().err)


def test_translate_into_a_closed_pipe_stops_quietly(trained, monkeypatch, capsys) -> None:
    """`translate ... | head -1`: the reader goes away; exit 141 as for SIGPIPE, no traceback."""

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert translate_cli.main(["--ckpt", trained[0]["best_checkpoint"], "1 2", "3"]) == 141
    assert capsys.readouterr().err == ""


# --- export and translate --model: whole or nothing, and damaged exports named ------------------


@pytest.fixture(scope="module")
def export_dir(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("export") / "ct2"
    assert export_cli.main([trained[0]["best_checkpoint"], "--out", str(out)]) == 0
    return out


def test_export_refuses_a_file_as_out_and_replaces_a_directory_only_with_force(
    trained, export_dir: Path, tmp_path: Path, capsys
) -> None:
    ckpt = trained[0]["best_checkpoint"]
    (tmp_path / "file").write_text("mine")
    assert export_cli.main([ckpt, "--out", str(tmp_path / "file")]) == 1
    assert "is a file, not a directory" in one_line(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "mine"
    taken = Path(shutil.copytree(export_dir, tmp_path / "taken"))
    (taken / "notes.txt").write_text("an old file")
    assert export_cli.main([ckpt, "--out", str(taken), "--force"]) == 0
    assert sorted(p.name for p in taken.iterdir()) == sorted(p.name for p in export_dir.iterdir())
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C", "error"])
def test_an_export_stopped_half_way_leaves_nothing(
    stop: str, trained, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Stopped while writing its files (after model.bin, before the tokenizers): a real
    SIGTERM, a Ctrl-C, a failed write. --out must not exist afterwards, so translate never
    meets half an export and a new export needs no --force."""

    def stop_here(*args, **kwargs):
        if stop == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
        if stop == "Ctrl-C":
            raise KeyboardInterrupt
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_cli, "save_tokenizer", stop_here)
    out = tmp_path / "ct2"
    code = export_cli.main([trained[0]["best_checkpoint"], "--out", str(out)])
    assert code == {"SIGTERM": 143, "Ctrl-C": 130, "error": 1}[stop]
    line = one_line(capsys.readouterr().err)
    assert {"SIGTERM": "stopped by SIGTERM", "Ctrl-C": "interrupted by Ctrl-C",
            "error": f"cannot write {out} (No space left on device); nothing was written"}[stop] \
        in line  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def damage(export_dir: Path, tmp_path: Path, name: str, content: str | None) -> Path:
    copy = Path(shutil.copytree(export_dir, tmp_path / "damaged"))
    if content is None:
        (copy / name).unlink()
    else:
        (copy / name).write_text(content)
    return copy


DAMAGED_EXPORTS = [
    ("seq2seq.json", '{"format": 1}', "seq2seq.json lacks model.max_positions"),
    ("seq2seq.json", "{not json", "seq2seq.json is not valid JSON"),
    ("src_tokenizer.json", "{not json", "src_tokenizer.json is not a readable tokenizer"),
    ("tgt_tokenizer.json", '{"kind": "bpe"}', "tgt_tokenizer.json is not a readable tokenizer"),
    ("src_tokenizer.json", None, "src_tokenizer.json is missing: export the checkpoint again"),
    ("model.bin", "not a model", "CTranslate2 cannot load"),
]


@pytest.mark.parametrize(("name", "content", "message"), DAMAGED_EXPORTS)
def test_a_damaged_export_is_named_in_one_line(
    name: str, content: str | None, message: str, export_dir: Path, tmp_path: Path, capsys
) -> None:
    damaged = damage(export_dir, tmp_path, name, content)
    assert translate_cli.main(["--model", str(damaged), "1 2"]) == 1
    assert message in one_line(capsys.readouterr().err)


def test_a_damaged_decoding_setting_in_an_export_is_named(export_dir, tmp_path, capsys) -> None:
    about = json.loads((export_dir / "seq2seq.json").read_text())
    about["decoding"]["beam_size"] = 0
    damaged = damage(export_dir, tmp_path, "seq2seq.json", json.dumps(about))
    assert translate_cli.main(["--model", str(damaged), "1 2"]) == 1
    assert "seq2seq.json has bad decoding settings" in one_line(capsys.readouterr().err)


# --- average and inspect: whole or nothing ------------------------------------------------------


def test_average_stopped_by_sigterm_leaves_nothing(trained, tmp_path, monkeypatch, capsys):
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(average_cli.torch, "save", killed)
    ckpt = trained[0]["best_checkpoint"]
    assert average_cli.main([ckpt, ckpt, "--out", str(tmp_path / "avg.ckpt")]) == 143
    assert one_line(capsys.readouterr().err) == "error: stopped by SIGTERM"
    assert list(tmp_path.iterdir()) == []


def test_average_refuses_a_directory_as_out(trained, tmp_path: Path, capsys) -> None:
    ckpt = trained[0]["best_checkpoint"]
    assert average_cli.main([ckpt, ckpt, "--out", str(tmp_path)]) == 1
    assert f"--out {tmp_path} is a directory" in one_line(capsys.readouterr().err)


def test_inspect_names_a_damaged_metrics_file(trained, tmp_path: Path, capsys) -> None:
    run = Path(shutil.copytree(trained[0]["run_dir"], tmp_path / "run"))
    metrics = run / "csv" / "version_0" / "metrics.csv"
    metrics.write_text(metrics.read_text() + "garbage,here\n")
    assert inspect_cli.main([str(run), "--curves", "--out", str(tmp_path / "c.png")]) == 1
    assert "metrics.csv line" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "c.png").exists()


def test_inspect_draws_a_live_run_without_its_half_written_last_row(
    trained, tmp_path: Path, capsys
) -> None:
    """A run still writing metrics.csv: its last row is cut short (no newline yet). The curves
    come from the complete rows, and one line says the last was left out."""
    from seq2seq.curves import read_metrics

    run = Path(shutil.copytree(trained[0]["run_dir"], tmp_path / "run"))
    metrics = run / "csv" / "version_0" / "metrics.csv"
    whole = read_metrics(run)
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines) + lines[-1][: len(lines[-1]) // 2])  # e.g. "0.12,3.4"
    assert inspect_cli.main([str(run), "--curves", "--out", str(tmp_path / "c.png")]) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"note: {metrics} line {len(lines) + 1} is not complete (the run is still writing it): "
        "drawn without it"
    ]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert read_metrics(run) == whole  # the complete rows, every one


# --- a full disk and a read-only disk, for real (tmpfs in a private mount namespace) ------------


def run_on_small_disks(rows: list[tuple[str, list[str]]], full: Path, read_only: Path) -> list:
    """Each row's main(argv) in one process that sees `full` as a 32 KiB tmpfs and
    `read_only` as a read-only one; skipped where mount namespaces are not allowed."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs in a private namespace")
    full.mkdir()
    read_only.mkdir()
    script = (
        f"mount -t tmpfs -o size=32k tmpfs {full} && mount -t tmpfs -o ro tmpfs {read_only} && "
        f'exec "{sys.executable}" {ROOT / "tests" / "disk_faults.py"} "$0"'
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, json.dumps(rows)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot make a private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_full_or_read_only_disk_gives_one_line_and_leaves_nothing(
    trained, export_dir: Path, tmp_path: Path
) -> None:
    ckpt, run_dir = trained[0]["best_checkpoint"], trained[0]["run_dir"]
    full, read_only = tmp_path / "full", tmp_path / "ro"
    rows, expected = [], []
    for disk, reason in ((full, "No space left on device"), (read_only, "Read-only file system")):
        rows += [
            ("seq2seq.export", [ckpt, "--out", str(disk / "ct2")]),
            ("seq2seq.average", [ckpt, ckpt, "--out", str(disk / "avg.ckpt")]),
            ("seq2seq.inspect", [run_dir, "--curves", "--out", str(disk / "curves.png")]),
            ("seq2seq.inspect", [ckpt, "--attention", "1 2 3", "--out", str(disk / "a.png")]),
        ]
        for name in ("ct2", "avg.ckpt", "curves.png", "a.png"):
            expected.append(f"error: cannot write {disk / name} ({reason}); nothing was written")
    results = run_on_small_disks(rows, full, read_only)
    for (module, argv), result, message in zip(rows, results, expected, strict=True):
        assert result["code"] == 1, (module, argv, result)
        assert one_line(result["stderr"]).startswith(message), (module, result["stderr"])
    # The mounts are gone with the namespace: what the tools left is in the real directories,
    # which must be as empty as the tmpfs was.
    assert list(full.iterdir()) == [] and list(read_only.iterdir()) == []
