"""Checkpoint averaging: the weights are the mean, the file loads wherever a checkpoint does,
and a run with average_last=N tests the average of its last N validations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import compose_train
from omegaconf import DictConfig

from seq2seq import inspect as inspect_cli
from seq2seq import translate as translate_cli
from seq2seq.average import average_checkpoints
from seq2seq.average import main as average_cli
from train import train

Trained = tuple[dict, DictConfig]


def shifted_copy(path: str, out: Path, shift: float, step: int) -> Path:
    """The checkpoint with every floating-point weight moved by shift (another 'step')."""
    checkpoint = torch.load(path, weights_only=True)
    for key, tensor in checkpoint["state_dict"].items():
        if tensor.is_floating_point():
            checkpoint["state_dict"][key] = tensor + shift
    checkpoint["global_step"] = step
    torch.save(checkpoint, out)
    return out


def test_the_average_of_two_checkpoints_is_the_mean_of_their_weights(
    trained: Trained, tmp_path: Path
) -> None:
    best = trained[0]["best_checkpoint"]
    a = shifted_copy(best, tmp_path / "a.ckpt", -0.5, 10)
    b = shifted_copy(best, tmp_path / "b.ckpt", 1.5, 20)
    averaged = average_checkpoints([a, b])
    original = torch.load(best, weights_only=True)["state_dict"]
    for key, tensor in original.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(averaged["state_dict"][key], tensor + 0.5)
        else:
            assert torch.equal(averaged["state_dict"][key], tensor)
    assert averaged["global_step"] == 20  # the newest checkpoint's counters and config
    assert averaged["averaged_from"] == [str(a.resolve()), str(b.resolve())]
    assert "optimizer_states" not in averaged


def test_an_averaged_checkpoint_loads_in_translate_inspect_and_evaluation(
    trained: Trained, tmp_path: Path, data_dir: Path, capsys
) -> None:
    summary, cfg = trained
    out = tmp_path / "avg.ckpt"
    last, best = summary["last_checkpoint"], summary["best_checkpoint"]
    assert average_cli([last, best, "--out", str(out)]) == 0
    assert f"averaged 2 checkpoints into {out}" in capsys.readouterr().out
    assert translate_cli.main(["--ckpt", str(out), "3 1 4", "2 7"]) == 0
    assert capsys.readouterr().out.splitlines() == ["3 1 4", "2 7"]  # both copy; so does the mean
    assert inspect_cli.main([str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["has_optimizer_state"] is False
    sizes = ("max_length", "train_size", "val_size", "test_size")
    data = [f"data.corpus.{k}={cfg.data.corpus[k]}" for k in sizes]
    evaluation = train(
        compose_train(tmp_path, data_dir, ["train=false", f"ckpt_path={out}", *data])
    )
    assert evaluation["test"]["test/exact_match"] >= 0.99


def test_a_run_with_average_last_tests_the_average_of_its_last_validations(
    tmp_path: Path, data_dir: Path
) -> None:
    overrides = [
        "data.corpus.train_size=512",
        "data.corpus.val_size=64",
        "data.corpus.test_size=64",
        "logger=none",
    ]
    overrides += ["trainer.max_epochs=4", "average_last=3"]
    summary = train(compose_train(tmp_path, data_dir, overrides))
    checkpoints = Path(summary["run_dir"]) / "checkpoints"
    recent = sorted(checkpoints.glob("recent-step*.ckpt"))
    assert [p.name for p in recent] == [f"recent-step{8 * e:06d}.ckpt" for e in (2, 3, 4)]
    assert summary["averaged_checkpoint"] == str(checkpoints / "average-last3.ckpt")
    averaged = torch.load(summary["averaged_checkpoint"], weights_only=True)
    assert averaged["averaged_from"] == [str(p.resolve()) for p in recent]
    # The test metrics are the average's: evaluating it alone gives the same numbers.
    alone = train(compose_train(tmp_path / "eval", data_dir, [
        "train=false", f"ckpt_path={summary['averaged_checkpoint']}", *overrides[:3],
    ]))["test"]  # fmt: skip
    for name, value in alone.items():
        assert summary["test"][name] == pytest.approx(value, abs=1e-6), name
    # And by hand, the same average from the run directory.
    assert average_cli(["--last", "3", summary["run_dir"], "--out", str(tmp_path / "x.ckpt")]) == 0
    by_hand = torch.load(tmp_path / "x.ckpt", weights_only=True)["state_dict"]
    for key, tensor in averaged["state_dict"].items():
        assert torch.equal(by_hand[key], tensor), key


def test_averaging_errors_are_one_line(trained: Trained, tmp_path: Path, capsys) -> None:
    best = trained[0]["best_checkpoint"]
    other = torch.load(best, weights_only=True)
    other["hyper_parameters"]["net"] = {**other["hyper_parameters"]["net"], "d_ff": 8}
    torch.save(other, tmp_path / "other.ckpt")
    rows = [
        ([best, str(tmp_path / "other.ckpt"), "--out", str(tmp_path / "o.ckpt")],
         "are of different models (their net differs): average checkpoints of one run"),
        (["--last", "5", trained[0]["run_dir"]], "has 0 checkpoint(s) of its last validations"),
        ([best, "--out", best], "is one of the checkpoints to average: choose a new file"),
        ([best], "give the file to write: --out FILE"),
        ([str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "n.ckpt")], "does not exist"),
    ]  # fmt: skip
    for args, message in rows:
        assert average_cli(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert message in err
    assert not (tmp_path / "o.ckpt").exists()
