"""translate and inspect on a checkpoint trained by the tests; evaluating a checkpoint; refusing
checkpoints that would run code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TRAINING_SHELL, compose_train, same_scores
from omegaconf import DictConfig

from seq2seq import inspect as inspect_cli
from seq2seq import translate as translate_cli
from seq2seq.checkpoint import FORMAT_VERSION, load_checkpoint
from seq2seq.core.decoding import beam_search
from seq2seq.plots import attention_figure
from train import train

Trained = tuple[dict, DictConfig]


def run_module(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def ckpt(trained: Trained) -> str:
    return trained[0]["best_checkpoint"]


# --- the tools stand apart from the training shell -------------------------------------------

USE_A_CHECKPOINT = """
import sys
from seq2seq import average, export, inspect, score, translate
from seq2seq.checkpoint import load_module
module = load_module(sys.argv[1])
assert translate.main(["--ckpt", sys.argv[1], "3 1 4"]) == 0
assert inspect.main([sys.argv[1]]) == 0
print(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[2:])))
"""


def test_the_tools_read_a_checkpoint_without_lightning_or_hydra(trained: Trained) -> None:
    """translate, inspect, export, average and score load a checkpoint, translate and report
    with plain PyTorch (checkpoint.TrainedModel): no seconds spent importing the training
    shell, which a LightningModule would pull in."""
    command = [sys.executable, "-c", USE_A_CHECKPOINT, ckpt(trained), *TRAINING_SHELL]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"


# --- translate --------------------------------------------------------------------------------


def test_translate_arguments_in_a_subprocess(trained: Trained) -> None:
    result = run_module("seq2seq.translate", "--ckpt", ckpt(trained), "3 1 4 1 5", "2 7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["3 1 4 1 5", "2 7"]  # the copy task


def test_translate_stdin(trained: Trained, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import io

    stdin = io.TextIOWrapper(io.BytesIO(b"5 5 2\n\n   \n0 1 2 3\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert translate_cli.main(["--ckpt", ckpt(trained), "--beam", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ["5 5 2", "", "", "0 1 2 3"]  # order, blanks


def test_translate_from_a_file_in_batches(trained: Trained, tmp_path: Path, capsys) -> None:
    # Batches of 4 from a file give what one batch of arguments gives, line for line.
    sources = [" ".join(str((i * 7 + j) % 10) for j in range(1 + i % 6)) for i in range(23)]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(sources) + "\n")
    assert translate_cli.main(["--ckpt", ckpt(trained), *sources]) == 0
    expected = capsys.readouterr().out.splitlines()
    args = ["--ckpt", ckpt(trained), "--input", str(path), "--batch-size", "4"]
    assert translate_cli.main(args) == 0
    assert capsys.readouterr().out.splitlines() == expected
    assert sum(e == s for e, s in zip(expected, sources, strict=True)) >= 20  # it copies


def test_translate_searches_as_the_checkpoint_says_unless_told(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """--beam, --length-penalty and the length rule default to the checkpoint's decoding
    settings (what its test split was decoded with); --n-best widens the beam to itself."""
    checkpoint = torch.load(ckpt(trained), weights_only=True)
    checkpoint["hyper_parameters"]["decoding"] |= {"beam_size": 4, "length_penalty": 0.6}
    torch.save(checkpoint, tmp_path / "beam4.ckpt")
    searched = []

    def spy(model, src, max_len, beam_size, length_penalty, n_best=1, *more):
        searched.append((beam_size, length_penalty, n_best))
        return beam_search(model, src, max_len, beam_size, length_penalty, n_best, *more)

    monkeypatch.setattr("seq2seq.inference.beam_search", spy)
    for options in ([], ["--beam", "2", "--length-penalty", "1.0"], ["--n-best", "5"]):
        assert translate_cli.main(["--ckpt", str(tmp_path / "beam4.ckpt"), *options, "3 1"]) == 0
    assert searched == [(4, 0.6, 1), (2, 1.0, 1), (5, 0.6, 5)]
    assert translate_cli.main(["--ckpt", ckpt(trained), "--n-best", "2", "3 1"]) == 0
    assert searched[-1] == (2, 1.0, 2)  # a greedy checkpoint: the beam widened to --n-best
    capsys.readouterr()


def test_translate_n_best_prints_scored_lines(trained: Trained, capsys) -> None:
    args = ["--ckpt", ckpt(trained), "--beam", "4", "1 2 3", "4 4 1"]
    assert translate_cli.main(args) == 0
    best = capsys.readouterr().out.splitlines()
    assert translate_cli.main([*args, "--n-best", "3"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [int(index) for index, _, _ in lines] == [0, 0, 0, 1, 1, 1]
    assert [lines[0][2], lines[3][2]] == best  # the first of the n best is the beam's output
    scores = [float(score) for _, score, _ in lines[:3]]
    assert scores == sorted(scores, reverse=True)


def test_translate_sampling_is_seeded(trained: Trained, capsys) -> None:
    def draw(seed: str) -> str:
        args = ["--ckpt", ckpt(trained), "--sample", "--temperature", "3", "--seed", seed]
        assert translate_cli.main([*args, "1 2 3 4 5 6", "6 5 4 3 2 1"]) == 0
        return capsys.readouterr().out

    assert draw("1") == draw("1")
    assert {draw(str(seed)) for seed in range(2, 6)} != {draw("1")}


def test_translate_warns_on_unknown_tokens(trained: Trained, capsys) -> None:
    assert translate_cli.main(["--ckpt", ckpt(trained), "1 x 2", "3"]) == 0
    captured = capsys.readouterr()
    assert "input line 1: 1 unknown token(s) mapped to <unk>" in captured.err
    assert len(captured.out.splitlines()) == 2


def test_translate_too_long_input_fails_or_is_cut(trained: Trained, capsys) -> None:
    max_positions = trained[1].model.net.max_positions
    long = " ".join(["1"] * (max_positions + 3))
    assert translate_cli.main(["--ckpt", ckpt(trained), "2", long]) == 1
    err = capsys.readouterr().err
    assert (
        f"input line 2 has {max_positions + 3} tokens, more than the model's {max_positions}" in err
    )
    assert translate_cli.main(["--ckpt", ckpt(trained), "--truncate", "2", long]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


# --- inspect ----------------------------------------------------------------------------------


def test_inspect_report_in_a_subprocess(trained: Trained) -> None:
    result = run_module("seq2seq.inspect", ckpt(trained))
    assert result.returncode == 0, result.stderr
    for part in (
        "parameters",
        "model config",
        "run config",
        "data.corpus.task = copy",
        "optimizer",
    ):
        assert part in result.stdout


def test_inspect_json_has_everything(trained: Trained, capsys) -> None:
    _, cfg = trained
    assert inspect_cli.main([ckpt(trained), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    module = torch.load(ckpt(trained), weights_only=True)
    assert info["global_step"] == module["global_step"] > 0
    assert info["has_optimizer_state"] is True
    assert info["dropout_off_at_step"] is None  # no time budget turned it off
    assert info["format"] == FORMAT_VERSION
    assert info["model_config"]["d_model"] == cfg.model.net.d_model
    assert info["parameters"]["total"] == sum(
        v.numel() for k, v in module["state_dict"].items() if k.startswith("model.")
    )
    assert info["tokenizer"] == {"kind": "symbol", "src_vocab_size": 14, "tgt_vocab_size": 14}
    assert info["best_metric"]["val/exact_match"] > 0.9
    assert "val/exact_match" in info["last_metrics"]
    assert info["run_config"]["data"]["corpus"]["task"] == "copy"
    assert info["file_size_bytes"] == Path(ckpt(trained)).stat().st_size


def test_inspect_attention_writes_a_heat_map(trained: Trained, tmp_path: Path, capsys) -> None:
    out = tmp_path / "attn.png"
    assert inspect_cli.main([ckpt(trained), "--attention", "3 1 4", "--out", str(out)]) == 0
    net = trained[1].model.net
    # encoder self-attention, cross-attention and decoder self-attention
    panels = (net.num_encoder_layers + 2 * net.num_decoder_layers) * net.num_heads
    assert f"{panels} heat maps" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_grid_draws_every_layer_and_head_of_one_kind(trained, tmp_path, capsys):
    from seq2seq.plots import model_view_figure

    out = tmp_path / "grid.png"
    args = [ckpt(trained), "--attention", "3 1 4", "--grid", "encoder", "--out", str(out)]
    assert inspect_cli.main(args) == 0
    net = trained[1].model.net
    heads = net.num_encoder_layers * net.num_heads
    assert f"{net.num_encoder_layers} layers, {heads} heads of encoder attention" in (
        capsys.readouterr().out
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    figure = model_view_figure([torch.rand(3, 4, 5).softmax(-1) for _ in range(2)], "t")
    panels = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 6 and [ax.get_title() for ax in panels[:3]] == [
        "head 0", "head 1", "head 2"
    ]  # fmt: skip


def test_attention_figure_has_a_labelled_panel_per_layer_and_head() -> None:
    encoder = [torch.rand(3, 5, 5).softmax(-1) for _ in range(3)]
    cross = [torch.rand(3, 4, 5).softmax(-1) for _ in range(2)]
    self_attn = [torch.rand(3, 4, 4).softmax(-1) for _ in range(2)]
    figure = attention_figure(
        cross, self_attn, list("abcde"), list("wxyz"), title="t", encoder=encoder
    )
    panels = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 21 and len(figure.axes) == 22  # plus one colour bar
    labels = lambda ticks: [t.get_text() for t in ticks]  # noqa: E731
    assert panels[0].get_title() == "encoder self-attention, layer 0, head 0"
    assert (
        labels(panels[0].get_xticklabels()) == labels(panels[0].get_yticklabels()) == list("abcde")
    )
    assert panels[9].get_title() == "cross-attention, layer 0, head 0"
    assert labels(panels[9].get_xticklabels()) == list("abcde")
    assert labels(panels[9].get_yticklabels()) == list("wxyz")
    assert panels[-1].get_title() == "self-attention, layer 1, head 2"
    assert labels(panels[-1].get_xticklabels()) == list("wxyz")


def test_inspect_diff_names_what_differs(trained: Trained, capsys) -> None:
    summary, _ = trained
    assert inspect_cli.main([summary["best_checkpoint"], summary["best_checkpoint"], "--diff"]) == 0
    assert capsys.readouterr().out.strip() == "no differences"
    first = torch.load(summary["best_checkpoint"], weights_only=True)
    first["hyper_parameters"]["training"]["lr"] = 0.5
    first["state_dict"]["model.generator.weight"] += 1.0
    changed = Path(summary["run_dir"]) / "changed.ckpt"
    torch.save(first, changed)
    assert inspect_cli.main([summary["best_checkpoint"], str(changed), "--diff"]) == 0
    out = capsys.readouterr().out
    assert "config  hparams.training.lr:" in out and "-> 0.5" in out
    assert "tensor  model.generator.weight: values differ" in out


# --- safety -----------------------------------------------------------------------------------


class Payload:
    """Unpickling this would create a marker file: the attack a checkpoint can carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_with_a_pickled_object_is_refused_and_never_runs(
    trained: Trained, tmp_path: Path, capsys
) -> None:
    marker = tmp_path / "payload_ran"
    evil = torch.load(ckpt(trained), weights_only=True)
    evil["hyper_parameters"]["extra"] = Payload(marker)
    path = tmp_path / "evil.ckpt"
    torch.save(evil, path)
    for main, args in (
        (inspect_cli.main, [str(path)]),
        (translate_cli.main, ["--ckpt", str(path), "1 2"]),
    ):
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "refusing to load" in err and "could run code" in err
        assert not marker.exists()


def test_older_checkpoint_formats_load_and_newer_are_refused(
    trained: Trained, tmp_path: Path, capsys
) -> None:
    checkpoint = torch.load(ckpt(trained), weights_only=True)
    assert checkpoint["seq2seq_format"] == FORMAT_VERSION  # what a run writes now
    assert translate_cli.main(["--ckpt", ckpt(trained), "3 1 4 1 5", "--beam", "1"]) == 0
    expected = capsys.readouterr().out
    unversioned = {key: value for key, value in checkpoint.items() if key != "seq2seq_format"}
    # As written before formats had numbers, before the model's options of the 2020s, and
    # before the settings were grouped (format 1 too): lr, beam_size, ... flat beside net.
    hparams = unversioned["hyper_parameters"]
    newer = ("norm", "activation", "num_kv_heads", "bias")
    hparams["net"] = {key: value for key, value in hparams["net"].items() if key not in newer}
    hparams |= {**hparams.pop("training"), **hparams.pop("decoding"), "beam_size": 3}
    model = unversioned["run_config"]["model"]
    model |= {**model.pop("training"), **model.pop("decoding")}
    torch.save(unversioned, tmp_path / "format0.ckpt")
    torch.save({**unversioned, "seq2seq_format": 1}, tmp_path / "format1.ckpt")
    for old in ("format0.ckpt", "format1.ckpt"):
        loaded = load_checkpoint(tmp_path / old)
        assert loaded["hyper_parameters"]["decoding"]["beam_size"] == 3  # read in its group
        assert "lr" in loaded["run_config"]["model"]["training"]
        assert translate_cli.main(["--ckpt", str(tmp_path / old), "3 1 4 1 5", "--beam", "1"]) == 0
        assert capsys.readouterr().out == expected
    torch.save({**checkpoint, "seq2seq_format": FORMAT_VERSION + 1}, tmp_path / "newer.ckpt")
    assert translate_cli.main(["--ckpt", str(tmp_path / "newer.ckpt"), "3 1 4 1 5"]) == 1
    err = capsys.readouterr().err
    assert f"is checkpoint format {FORMAT_VERSION + 1}; this seq2seq reads formats 0-2" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty"), (b"not a zip file at all", "cannot read"), (None, "does not exist")],
)
def test_broken_checkpoint_files_fail_clearly(
    tmp_path: Path, capsys, content: bytes | None, message: str
) -> None:
    path = tmp_path / "broken.ckpt"
    if content is not None:
        path.write_bytes(content)
    assert inspect_cli.main([str(path)]) == 1
    assert message in capsys.readouterr().err


# --- evaluating a checkpoint --------------------------------------------------------------------


def test_train_false_evaluates_a_checkpoint(
    trained: Trained, tmp_path: Path, data_dir: Path
) -> None:
    summary, cfg = trained
    sizes = ("max_length", "train_size", "val_size", "test_size")
    data = [f"data.corpus.{k}={cfg.data.corpus[k]}" for k in sizes]
    for beam in (1, 3):
        overrides = ["train=false", f"ckpt_path={summary['best_checkpoint']}", *data]
        evaluation = train(
            compose_train(tmp_path, data_dir, [*overrides, f"model.decoding.beam_size={beam}"])
        )
        exact = evaluation["test"]["test/exact_match"]
        if beam == 1:
            assert exact == pytest.approx(summary["test"]["test/exact_match"])
        else:
            assert exact >= 0.99


def test_a_checkpoint_alone_evaluates_on_its_runs_data_with_its_decoding(
    trained: Trained, tmp_path: Path, data_dir: Path
) -> None:
    """train=false ckpt_path=CKPT and nothing else: the run's own data (not the default copy
    task's sizes) and decoding, so the run's own test scores; a data key or a decoding key
    given on the command line still applies."""
    summary, _ = trained
    alone = ["train=false", f"ckpt_path={summary['best_checkpoint']}"]
    evaluation = train(compose_train(tmp_path / "alone", data_dir, alone))
    assert same_scores(evaluation["test"], summary["test"])
    fewer = train(compose_train(tmp_path / "fewer", data_dir, [*alone, "data.corpus.test_size=7"]))
    assert not same_scores(
        fewer["test"], summary["test"]
    )  # 7 test pairs (the run's other settings kept)
    two = ["model.decoding.max_len_a=0", "model.decoding.max_len_b=2"]  # at most 2 tokens
    cut = train(compose_train(tmp_path / "cut", data_dir, [*alone, *two]))
    assert cut["test"]["test/exact_match"] < summary["test"]["test/exact_match"] / 2


def test_train_false_without_a_checkpoint_fails_clearly(tmp_path: Path, data_dir: Path) -> None:
    with pytest.raises(ValueError, match="train=false needs a checkpoint to evaluate"):
        train(compose_train(tmp_path, data_dir, ["train=false"]))


def test_truncated_checkpoint_fails_clearly(trained: Trained, tmp_path: Path, capsys) -> None:
    data = Path(ckpt(trained)).read_bytes()
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(data[: len(data) // 2])
    assert translate_cli.main(["--ckpt", str(path), "1 2"]) == 1
    assert "truncated" in capsys.readouterr().err
