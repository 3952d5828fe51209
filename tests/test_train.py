"""The training application: configs compose and instantiate, train(cfg) runs and converges,
checkpoints reload, the command line works, bad config values fail early and clearly."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from helpers import (
    CONFIG_DIR,
    SYMBOL_TASKS,
    compose_train,
    experiment_data,
    run_train_cli,
    small_data,
)
from hydra.utils import instantiate
from omegaconf import DictConfig

from seq2seq import metric_names
from seq2seq.training.metrics import exact_match
from seq2seq.training.module import Seq2SeqModule
from train import train

GROUPS = {
    group: sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
    for group in ("data", "model", "trainer", "callbacks", "logger", "experiment", "debug")
}
SMALL_DATA = ["data.corpus.train_size=256", "data.corpus.val_size=32", "data.corpus.test_size=32"]


def test_config_groups_are_complete() -> None:
    assert GROUPS["data"] == [
        "copy", "dates", "hub", "numbers", "parallel_files", "reverse", "sort"
    ]  # fmt: skip
    assert GROUPS["model"] == ["base", "small", "tiny"]
    assert GROUPS["trainer"] == ["auto", "cpu", "ddp", "ddp_cpu", "default", "fsdp", "gpu", "mps"]
    assert GROUPS["logger"] == ["csv", "none", "tensorboard"]
    assert {"copy", "reverse", "sort"} <= set(GROUPS["experiment"])
    assert GROUPS["debug"] == ["fdr", "limit", "overfit"]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_config_group_composes_and_instantiates(
    group: str, tmp_path: Path, data_dir: Path
) -> None:
    for option in GROUPS[group]:
        data = SMALL_DATA
        if group in ("data", "experiment"):
            data = small_data(option if group == "data" else experiment_data(option), tmp_path)
        cfg = compose_train(tmp_path, data_dir, [f"{group}={option}", *data])
        datamodule = instantiate(cfg.data)
        if option == "hub":  # offline in tests: it must say so at once
            with pytest.raises(ValueError, match="offline"):
                datamodule.setup("fit")
            continue
        datamodule.setup("fit")
        vocab = datamodule.tgt_vocab.to_dict()
        module = instantiate(cfg.model, src_vocab=vocab, tgt_vocab=vocab)
        assert isinstance(module, Seq2SeqModule)
        for conf in {**(cfg.get("callbacks") or {}), **(cfg.get("logger") or {})}.values():
            instantiate(conf)
        if cfg.trainer.accelerator in ("cpu", "auto"):  # this machine has no GPU or MPS
            trainer = instantiate(cfg.trainer)
            assert trainer.num_devices == (2 if option == "ddp_cpu" else 1)
        else:
            assert cfg.trainer.accelerator in ("gpu", "mps")


# Each option of the groups a user adds to a run, in four command lines: every option of
# callbacks, logger and debug, and the trainers this CPU runs in one process (trainer=ddp_cpu:
# tests/test_scale.py; ddp, fsdp, gpu, mps need devices this machine lacks).
OPTION_RUNS = [
    ["callbacks=early_stopping", "logger=tensorboard", "trainer=cpu"],
    ["callbacks=default", "logger=none", "trainer=auto", "debug=limit"],
    ["callbacks=ema", "logger=csv", "trainer=default", "debug=overfit"],
    ["callbacks=early_stopping", "debug=fdr"],
]
BUDGET = ["trainer.max_time=00:00:01:00", "trainer.max_steps=3"]  # ends at the step limit


def test_the_option_runs_hold_every_option() -> None:
    given = {o.split("=")[0]: set() for run in OPTION_RUNS for o in run}
    for option in (o for run in OPTION_RUNS for o in run):
        given[option.split("=")[0]].add(option.split("=")[1])
    for group in ("callbacks", "logger", "debug"):
        assert given[group] == set(GROUPS[group]), group
    assert given["trainer"] | {"ddp_cpu", "ddp", "fsdp", "gpu", "mps"} == set(GROUPS["trainer"])


@pytest.mark.parametrize("base", ["copy", "parallel_bpe"])
@pytest.mark.parametrize("options", OPTION_RUNS, ids=lambda run: ",".join(run))
def test_every_option_runs_with_the_default_run_and_the_recipe_under_a_budget(
    base: str, options: list[str], tmp_path: Path, data_dir: Path, monkeypatch, capsys
) -> None:
    """`python train.py` as users type it: each option of each group with the copy task and
    with experiment=parallel_bpe (the real-text recipe: validations by the clock), under a time
    budget. Each runs and tests, or is refused in one line (debug=limit on a split too small
    for its share to hold a batch)."""
    if base == "copy":  # 16 batches to train, 5 to validate and test: debug=limit's shares fit
        data = ["data.corpus.train_size=256", "data.corpus.val_size=80",
                "data.corpus.test_size=80", "data.batch_size=16", "validations=2"]  # fmt: skip
    else:
        data = ["experiment=parallel_bpe", *small_data("parallel_files", tmp_path)]
    run_dir = tmp_path / "run"
    args = [*data, *BUDGET, *options, f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}"]
    code = run_train_cli(args, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    if base == "parallel_bpe" and "debug=limit" in options:  # 2 batches: 0.1 of them is none
        errors = [line for line in err.splitlines() if "error" in line.lower()]
        assert code == 1 and errors == [
            "error: You requested to check 0.1 of the `train_dataloader` but 0.1 * 2 < 1. Please "
            "increase the `limit_train_batches` argument. Try at least `limit_train_batches=0.5`"
        ]
        return
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["test"]) == set(metric_names.logged("test"))


# Every task on the tiny model and every size on the copy task: a task is data and a size is a
# model, which meet only through the vocabulary size (the full grid repeated the base model's
# 12 s twice more).
@pytest.mark.parametrize(
    ("data", "model"),
    [("copy", model) for model in GROUPS["model"]]
    + [(data, "tiny") for data in (*SYMBOL_TASKS[1:], "numbers", "dates", "parallel_files")],
)
def test_fast_dev_run_for_every_task_and_size(
    data: str, model: str, tmp_path: Path, data_dir: Path
) -> None:
    overrides = [f"data={data}", f"model={model}", "debug=fdr", *small_data(data, tmp_path)]
    overrides.append("data.batch_size=8")  # one batch of each stage: its size is no matter here
    summary = train(compose_train(tmp_path, data_dir, overrides))
    metrics = {"loss", "token_acc", "exact_match", "bleu", "chrf", "cer"}
    assert set(summary["test"]) == {f"test/{name}" for name in metrics}
    assert set(metric_names.logged("test")) == set(summary["test"])  # the names defined once
    assert all(0 <= v < float("inf") for v in summary["test"].values())


def test_tiny_model_learns_the_copy_task(trained: tuple[dict, DictConfig]) -> None:
    summary, _ = trained
    assert summary["test"]["test/exact_match"] >= 0.99


def test_run_writes_checkpoints_metrics_and_summary(trained: tuple[dict, DictConfig]) -> None:
    summary, cfg = trained
    run_dir = Path(cfg.paths.output_dir)
    assert Path(summary["best_checkpoint"]).is_file()
    assert Path(summary["last_checkpoint"]) == run_dir / "checkpoints" / "last.ckpt"
    # last.ckpt holds the final state (6 epochs of 63 batches), not the last multiple of 200.
    assert torch.load(summary["last_checkpoint"], weights_only=True)["global_step"] == 6 * 63
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val = [float(r["val/exact_match"]) for r in rows if r.get("val/exact_match")]
    assert len(val) == 6 and val[-1] > val[0]  # one validation per epoch, improving
    assert any(r.get("lr-AdamW/pg1") for r in rows)


@pytest.mark.parametrize("qk_norm", [False, True, "self"])
def test_a_run_ends_with_the_commands_that_work_for_its_model(
    qk_norm: bool | str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The commands a run prints are ones that run: a model CTranslate2 cannot express (QK-norm
    in cross-attention) gets the reason in place of an export command that would only fail."""
    from types import SimpleNamespace

    from seq2seq.core.model import ModelConfig
    from seq2seq.training.report import report

    vocab = SimpleNamespace(decode=lambda ids: "a b")
    datamodule = SimpleNamespace(src_vocab=vocab, splits={"test": [{"src_ids": [4, 5]}]})
    ckpt = str(tmp_path / "best.ckpt")
    summary = {"run_dir": str(tmp_path), "best_checkpoint": ckpt, "last_checkpoint": None,
               "test": {}, "signatures": {}}  # fmt: skip
    config = ModelConfig(src_vocab_size=8, tgt_vocab_size=8, qk_norm=qk_norm)
    with caplog.at_level("INFO"):
        report(summary, datamodule, config)
    assert f"python -m seq2seq.serve {ckpt}" in caplog.text
    exported = f"python -m seq2seq.export {ckpt} --out {tmp_path / 'ct2'}"
    if qk_norm is True:
        assert exported not in caplog.text
        assert "No export:       cannot export model.net.qk_norm=True: CTranslate2" in caplog.text
    else:
        assert exported in caplog.text and "No export" not in caplog.text


def test_checkpoint_alone_reproduces_the_test_exact_match(
    trained: tuple[dict, DictConfig],
) -> None:
    summary, cfg = trained
    module = Seq2SeqModule.load_from_checkpoint(summary["best_checkpoint"]).eval()
    datamodule = instantiate(cfg.data)
    datamodule.setup("test")
    # The vocabulary came from the checkpoint, not from the data module.
    assert module.tgt_vocab == datamodule.tgt_vocab
    v = module.tgt_vocab
    matches = [
        exact_match(module.greedy(b["src"]), b["labels"], v.pad_id, v.eos_id)
        for b in datamodule.test_dataloader()
    ]
    assert torch.cat(matches).mean().item() == pytest.approx(summary["test"]["test/exact_match"])


def test_each_validation_decodes_its_first_val_decode_limit_examples(
    trained: tuple[dict, DictConfig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lightning as L

    summary, cfg = trained
    module = Seq2SeqModule.load_from_checkpoint(summary["best_checkpoint"])
    # Batches of 64: the first batch alone is decoded.
    module.hparams["training"]["val_decode_limit"] = 40
    decoded: list[int] = []
    generate = module.generate
    monkeypatch.setattr(
        module, "generate", lambda src, b=1: decoded.append(len(src)) or generate(src, b)
    )
    # default_root_dir: what validation writes goes there, not into the checkout
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=3, enable_model_summary=False,
                        default_root_dir=tmp_path)  # fmt: skip
    datamodule = instantiate(cfg.data)
    for _ in range(2):  # the limit counts from each validation's start
        trainer.validate(module, datamodule=datamodule, verbose=False)
    assert decoded == [64, 64]
    assert (tmp_path / "validation_sources.txt").is_file()  # the pairs, written once


def test_learning_rate_warms_up_then_decays(trained: tuple[dict, DictConfig]) -> None:
    _, cfg = trained
    with open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv") as f:
        lrs = [float(r["lr-AdamW/pg1"]) for r in csv.DictReader(f) if r.get("lr-AdamW/pg1")]
    peak = max(lrs)
    # Logged every 25 steps: the first value is 25/100 of the way through the warmup.
    assert lrs[0] == pytest.approx(cfg.model.training.lr * 25 / cfg.model.training.warmup_steps)
    assert peak == pytest.approx(cfg.model.training.lr, rel=0.05)
    assert lrs[-1] < peak / 10  # cosine decays towards min_lr_ratio * lr


def test_command_line_overrides_select_task_model_and_device(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["trainer=cpu", "model=tiny", "data=reverse", "trainer.max_epochs=1", "logger=none"]
    assert run_train_cli([*args, f"paths.data_dir={data_dir}", *SMALL_DATA], tmp_path,
                         monkeypatch) == 0  # fmt: skip
    (summary_file,) = (tmp_path / "outputs" / "train" / "runs").glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert Path(summary["best_checkpoint"]).is_file()
    module = Seq2SeqModule.load_from_checkpoint(summary["best_checkpoint"])
    assert module.hparams.net["d_model"] == 64  # model=tiny
    config = (summary_file.parent / ".hydra" / "config.yaml").read_text()
    assert "task: reverse" in config


def test_module_hyperparameters_are_checked_completed_and_saved_in_groups() -> None:
    """Every TrainingConfig and DecodingConfig field is in its group of hparams (a
    checkpoint's hyper_parameters), given or at its default; a bad or unknown one, or a
    setting of the flat layout before the groups, fails in one line."""
    from seq2seq.core.decoding import DECODING_KEYS, DecodingConfig
    from seq2seq.data.vocab import Vocabulary
    from seq2seq.hparams import TRAINING_KEYS, TrainingConfig

    vocab = Vocabulary(["a", "b"]).to_dict()
    net = {"d_model": 16, "num_heads": 2, "d_ff": 32}
    module = Seq2SeqModule(net, vocab, vocab, training={"lr": 1e-2}, decoding={"beam_size": 3})
    assert set(module.hparams) == {"net", "training", "decoding", "src_vocab", "tgt_vocab"}
    assert set(module.hparams.training) == set(TRAINING_KEYS)
    assert set(module.hparams.decoding) == set(DECODING_KEYS)
    assert (module.settings.lr, module.decoding.beam_size) == (1e-2, 3)
    assert module.settings.warmup_steps == TrainingConfig().warmup_steps
    assert module.decoding.max_len_b == DecodingConfig().max_len_b
    again = Seq2SeqModule(**module.hparams)  # what loading a checkpoint does
    assert dict(again.hparams) == dict(module.hparams)
    for given, message in [
        ({"training": {"lr": 0}}, "model.training.lr must be a positive number, got 0"),
        (
            {"decoding": {"beam_size": 0}},
            "model.decoding.beam_size must be a positive integer, got 0",
        ),
        (
            {"training": {"warmup": 10}},
            "model.training.warmup is not a training setting; did you mean warmup_steps, "
            "warmup_share? (known: lr, betas",
        ),
        (
            {"decoding": {"lr": 1e-3}},
            "model.decoding.lr is not a decoding setting; it is model.training.lr",
        ),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            Seq2SeqModule(net, vocab, vocab, **given)
    with pytest.raises(ValueError, match=r"^model\.net must be a mapping of settings"):
        Seq2SeqModule([16], vocab, vocab)


def test_the_flat_settings_of_older_files_read_in_their_groups() -> None:
    """Checkpoint formats 0 and 1 (and their run configs) held lr, beam_size, ... beside net."""
    from seq2seq.hparams import grouped

    flat = {"net": {"d_model": 16}, "lr": 0.1, "beam_size": 4, "src_vocab": [], "_target_": "M"}
    assert grouped(flat) == {
        "net": {"d_model": 16}, "src_vocab": [], "_target_": "M",
        "training": {"lr": 0.1}, "decoding": {"beam_size": 4},
    }  # fmt: skip
    assert grouped(grouped(flat)) == grouped(flat)  # files already grouped stay as they are
    with pytest.raises(ValueError, match=r"^model\.lr is set both flat and as model\.training\.lr"):
        grouped({"lr": 0.1, "training": {"lr": 0.2}})


def test_a_briefly_trained_model_translates_numbers_from_their_source(
    tmp_path: Path, data_dir: Path
) -> None:
    """Exact match, against what any model that ignores its source can reach: such a model
    writes one output for every input, so its exact match is at most the share of the test
    split's most frequent reference. And chrF and CER, against the trained model itself with
    its source hidden (all padding), which is what a source-blind model writes."""
    from collections import Counter

    from torchmetrics.text import CharErrorRate, CHRFScore

    overrides = [
        "experiment=numbers_en_de",
        "data.corpus.high=999",  # numbers below 1,000: shorter words, faster steps
        "data.corpus.train_size=2500",
        "data.corpus.val_size=50",
        "data.corpus.test_size=200",
        "model.net.d_model=64",
        "model.net.d_ff=256",
        "model.net.num_encoder_layers=2",
        "model.net.num_decoder_layers=2",
        "model.training.lr=3e-3",
        "model.training.warmup_steps=50",
        # 160 steps, ~30 s on one thread of a 2-core AMD EPYC: 78-87% exact match over seeds
        # 0-3 (which also redraw the split), against the 50% asked below.
        "trainer.max_epochs=4",
        "data.batch_size=64",
        "logger=none",
    ]
    cfg = compose_train(tmp_path, data_dir, overrides)
    summary = train(cfg)
    module = Seq2SeqModule.load_from_checkpoint(summary["best_checkpoint"]).eval()
    datamodule = instantiate(cfg.data)
    datamodule.setup("test")
    v = module.tgt_vocab
    texts = lambda rows: [v.decode(row) for row in rows.tolist()]  # noqa: E731
    hypotheses, blind, references = [], [], []
    for batch in datamodule.test_dataloader():
        hypotheses += texts(module.greedy(batch["src"]))
        blind += texts(module.greedy(torch.full_like(batch["src"], v.pad_id)))
        references += texts(batch["labels"])
    assert len(set(blind)) == 1  # hidden source, one output: the bound below holds for it

    exact = summary["test"]["test/exact_match"]
    assert exact == pytest.approx(sum(map(str.__eq__, hypotheses, references)) / len(references))
    ceiling = Counter(references).most_common(1)[0][1] / len(references)
    assert exact >= 0.5 and exact > ceiling + 0.4, (exact, ceiling)

    targets = [[r] for r in references]
    assert (
        CHRFScore(n_word_order=0)(hypotheses, targets)
        > CHRFScore(n_word_order=0)(blind, targets) + 0.3
    )
    assert CharErrorRate()(hypotheses, references) < CharErrorRate()(blind, references) - 0.3
