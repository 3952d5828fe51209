"""The training application: configs compose and instantiate, train(cfg) runs and converges,
checkpoints reload, the command line works, bad config values fail early and clearly."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import (
    CONFIG_DIR,
    SYMBOL_TASKS,
    budgeted_run,
    clocked_budget,
    compose_train,
    experiment_data,
    run_train_cli,
    small_data,
)
from hydra.utils import instantiate
from omegaconf import DictConfig

from seq2seq import metric_names
from seq2seq.inspect import report as inspect_report
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


@pytest.mark.parametrize("qk_norm", [False, True])
def test_a_run_ends_with_the_commands_that_work_for_its_model(
    qk_norm: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The commands a run prints are ones that run: a model CTranslate2 cannot express (QK-norm)
    gets the reason in place of an export command that would only fail."""
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
    if qk_norm:
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


def test_learning_rate_schedules_are_continuous_and_lazy() -> None:
    from seq2seq.training.optim import by_steps, lr_lambda

    asked = []

    def total() -> int:
        asked.append(True)
        return 110

    cosine = lr_lambda("cosine", 10, 0.1, by_steps(10, total, decays=True))
    assert [cosine(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert not asked  # the warmup never needs the total (a resume restores the loader first)
    assert cosine(10) == pytest.approx(1.0) and cosine(60) == pytest.approx(0.55)
    assert cosine(110) == pytest.approx(0.1) and cosine(500) == pytest.approx(0.1)
    asked.clear()
    inverse = lr_lambda("inverse_sqrt", 4, 0.0, by_steps(4, total, decays=False))
    assert [inverse(s) for s in (3, 15)] == pytest.approx([1.0, 0.5])
    assert not asked  # a schedule with no end never asks for it
    assert lr_lambda("constant", 0, 0.0, by_steps(0, total, decays=False))(1000) == 1.0
    assert lr_lambda("cosine", 0, 0.0, by_steps(0, total, decays=True))(0) == 1.0


def test_the_warmup_stable_decay_schedule_is_its_definition_by_steps_and_by_the_clock() -> None:
    """schedule=wsd: the warmup, the peak until the last cooldown_share of the training after
    it, then a straight line to min_lr_ratio; against a plain reference at every step, and by
    the clock's progress where a budget gives one. Its settings are checked."""
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.optim import by_steps, lr_lambda

    warmup, total, cooldown, floor = 10, 110, 0.2, 0.1

    def reference(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / (total - warmup))
        if progress <= 1 - cooldown:
            return 1.0
        return floor + (1 - floor) * (1 - progress) / cooldown

    asked = []
    steps = by_steps(warmup, lambda: asked.append(1) or total, decays=True)
    wsd = lr_lambda("wsd", warmup, floor, steps, cooldown_share=0.2)
    assert [wsd(s) for s in range(warmup)] == pytest.approx([reference(s) for s in range(10)])
    assert not asked  # lazy, as the cosine: a resume restores the loader first
    assert [wsd(s) for s in range(200)] == pytest.approx([reference(s) for s in range(200)])
    assert wsd(50) == 1.0 and wsd(90) == pytest.approx(1.0) and wsd(100) == pytest.approx(0.55)
    assert wsd(110) == pytest.approx(0.1)
    by_clock = lr_lambda("wsd", warmup, 0.0, lambda step: (False, step / 100), 0.2)
    assert [by_clock(s) for s in (50, 80, 90, 100)] == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert TrainingConfig(schedule="wsd", cooldown_share=0.2, warmup_share=0.25)
    with pytest.raises(ValueError, match=r"^model.training.schedule=wsd needs model.training.co"):
        TrainingConfig(schedule="wsd")
    not_wsd = r"^model.training.cooldown_share=0.2 is the decay of schedule=wsd, not of cosine: "
    with pytest.raises(ValueError, match=not_wsd):
        TrainingConfig(schedule="cosine", cooldown_share=0.2)
    with pytest.raises(ValueError, match=r"^model.training.cooldown_share must be a number in "
                       r"\(0, 1\], got 0$"):  # fmt: skip
        TrainingConfig(schedule="wsd", cooldown_share=0)


def test_a_budgeted_run_with_the_warmup_stable_decay_schedule_holds_its_peak_then_ends_low(
    tmp_path: Path, data_dir: Path
) -> None:
    """schedule=wsd under a time budget, as a user runs it: the rate rises to its peak, holds
    it, and falls only in the last part of the run, to its floor at the stop."""
    run = [*budgeted_run(8, validations=2, share=0.1), "model.training.schedule=wsd",
           "model.training.cooldown_share=0.3"]  # fmt: skip
    cfg = compose_train(tmp_path, data_dir, run)
    train(cfg)
    with open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv") as f:
        lrs = [float(r["lr-AdamW/pg1"]) for r in csv.DictReader(f) if r.get("lr-AdamW/pg1")]
    peak = cfg.model.training.lr
    held = [i for i, lr in enumerate(lrs) if lr == pytest.approx(peak)]
    assert len(held) >= 0.3 * len(lrs), (len(held), len(lrs))  # the stable part
    after = lrs[held[-1] :]
    assert len(after) >= 0.1 * len(lrs)  # the decay: the last part of the run
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(after))
    assert peak * 0.1 - 1e-12 <= lrs[-1] <= 0.3 * peak, (lrs[-1], peak)


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


def test_optimizer_steps_exactly_like_torchs_plain_adamw() -> None:
    """The fused AdamW kernel is a speed choice only: one step moves every parameter as
    torch's for-loop AdamW does, with weight decay on matrices and none on biases or norms."""
    from seq2seq.data.vocab import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary([str(i) for i in range(10)]).to_dict()
    net = {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1,
           "num_decoder_layers": 1}  # fmt: skip
    training = {"lr": 1e-2, "weight_decay": 0.1, "warmup_steps": 0}
    module = Seq2SeqModule(net, vocab, vocab, training=training)
    fused = module.configure_optimizers()["optimizer"]
    assert all(group["fused"] for group in fused.param_groups)
    params = list(module.parameters())
    plain_params = [p.detach().clone().requires_grad_() for p in params]
    groups = [
        {"params": [q for q in plain_params if q.dim() >= 2], "weight_decay": 0.1},
        {"params": [q for q in plain_params if q.dim() < 2], "weight_decay": 0.0},
    ]
    plain = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98), foreach=False)
    for _ in range(3):
        for p, q in zip(params, plain_params, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        fused.step()
        plain.step()
    for p, q in zip(params, plain_params, strict=True):
        torch.testing.assert_close(p, q)


def test_muon_steps_the_layers_matrices_as_torchs_muon_and_the_rest_as_torchs_adamw() -> None:
    """model.training.optimizer=muon: the encoder's and decoder's weight matrices move as
    torch.optim.Muon moves them (AdamW-matched rate) and every other parameter as AdamW, under
    the schedule's changing rate; its state round-trips, and an AdamW state is refused."""
    from torch.optim.lr_scheduler import LambdaLR

    from seq2seq.data.vocab import Vocabulary
    from seq2seq.training.optim import MuonWithAdamW

    torch.manual_seed(0)
    vocab = Vocabulary([str(i) for i in range(10)]).to_dict()
    net = {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1,
           "num_decoder_layers": 1}  # fmt: skip
    training = {"optimizer": "muon", "lr": 1e-2, "weight_decay": 0.1, "warmup_steps": 2}
    module = Seq2SeqModule(net, vocab, vocab, training=training)
    answer = module.configure_optimizers()
    optimizer, scheduler = answer["optimizer"], answer["lr_scheduler"]["scheduler"]
    named = list(module.named_parameters())
    hidden = {name for name, p in named if p.dim() == 2 and ".layers." in name}
    # Every projection and feed-forward matrix of both stacks; no embedding, no output layer.
    assert len(hidden) == 4 + 2 + 8 + 2
    assert not any("embed" in name or "generator" in name for name in hidden)
    params = [p for _, p in named]
    copies = {name: p.detach().clone().requires_grad_() for name, p in named}
    muon = torch.optim.Muon(
        [copies[n] for n in copies if n in hidden], lr=1e-2, weight_decay=0.1,
        adjust_lr_fn="match_rms_adamw",
    )  # fmt: skip
    rest = [copies[n] for n in copies if n not in hidden]
    adamw = torch.optim.AdamW(
        [{"params": [q for q in rest if q.dim() >= 2], "weight_decay": 0.1},
         {"params": [q for q in rest if q.dim() < 2], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.98), foreach=False,
    )  # fmt: skip
    rates = [LambdaLR(o, scheduler.lr_lambdas[0]) for o in (muon, adamw)]

    def step(optimizers: list, scheduled: list) -> None:
        for p, q in zip(params, copies.values(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        for o in optimizers:
            o.step()
        for s in scheduled:
            s.step()

    for _ in range(3):  # the rate rises over the warmup's 2 steps, then falls
        step([optimizer, muon, adamw], [scheduler, *rates])
    for p, q in zip(params, copies.values(), strict=True):
        torch.testing.assert_close(p, q)
    # Its state holds both optimizers' and carries on in a new instance, as a resume loads it.
    again = Seq2SeqModule(net, vocab, vocab, training=training)
    again.load_state_dict(module.state_dict())
    loaded = again.configure_optimizers()["optimizer"]
    loaded.load_state_dict(optimizer.state_dict())
    params = list(again.parameters())
    step([loaded, muon, adamw], [])
    for p, q in zip(params, copies.values(), strict=True):
        torch.testing.assert_close(p, q)
    plain = torch.optim.AdamW(params).state_dict()
    assert isinstance(loaded, MuonWithAdamW)
    with pytest.raises(ValueError, match=r"saved with model\.training\.optimizer=adamw"):
        loaded.load_state_dict(plain)
    with pytest.raises(ValueError, match=r"model\.training\.optimizer must be one of"):
        Seq2SeqModule(net, vocab, vocab, training={"optimizer": "sgd"})


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


def test_the_cosine_ends_at_the_step_limit_or_the_time_budget_whichever_comes_first() -> None:
    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.optim import by_steps, lr_lambda

    clock = {"elapsed": 0.0}  # of 100 s, less the reserve before any validation (10 s): 90 s

    def cosine(total: float, budget: TimeBudget):
        progress = budget.schedule(by_steps(10, lambda: total, decays=True), 10, None)
        return lr_lambda("cosine", 10, 0.1, progress)

    by_clock = cosine(float("inf"), clocked_budget(100.0, clock))
    assert by_clock(500) == pytest.approx(1.0)  # no step limit, no time spent: the peak
    clock["elapsed"] = 45.0
    assert by_clock(20) == pytest.approx(0.55)  # half the time: half way down
    clock["elapsed"] = 90.0
    assert by_clock(20) == pytest.approx(0.1)  # the budget is spent: the end
    clock["elapsed"] = 0.0
    assert cosine(110.0, clocked_budget(100.0, clock))(110) == pytest.approx(0.1)  # steps first
    assert cosine(110.0, TimeBudget())(60) == pytest.approx(0.55)  # no budget: steps alone


def test_a_time_budget_ends_the_schedule_and_leaves_time_to_validate_and_test(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A warmup stated in steps that the budget cannot buy (100,000 steps, on any machine):
    warmup_share ends it by the clock, so the schedule still peaks early and decays over most
    of the budget, to its end at the stop. And validations=3: about three validations by the
    clock, where the trainer's val_check_interval would validate at every epoch's end. And
    dropout_min_epochs: the first validation finds the budget buys fewer epochs, and turns
    dropout off."""
    budget, share = 12, 0.2
    cfg = compose_train(tmp_path, data_dir, budgeted_run(budget, validations=3, share=share))
    with caplog.at_level("INFO"):
        summary = train(cfg)
    used = float(caplog.text.split("Time budget: used ")[1].split(" s")[0])  # Lightning's Timer
    assert used <= budget  # the last validation and the test ran within the budget
    # Once it knows its pace, the log says what the budget buys in steps.
    assert re.search(
        r"s a training step so far, so about \d+ steps \([\d.]+ epochs\) in the", caplog.text
    )
    with open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    lrs = [float(r["lr-AdamW/pg1"]) for r in rows if r.get("lr-AdamW/pg1")]
    peak = lrs.index(max(lrs))
    assert max(lrs) == pytest.approx(cfg.model.training.lr)  # the warmup ended at the full rate
    # It ended by the clock, at the share of the training time (the first validation and the
    # start-up slow the first steps, hence the margin), far before its 100,000 steps ...
    assert 0 < peak <= (share + 0.15) * len(lrs)
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(lrs[: peak + 1]))
    # ... and the cosine then fell over the rest of the run, to its end at the stop.
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(lrs[peak:]))
    # At its end (lr * min_lr_ratio) give or take the last step: its rate is set when it starts,
    # one step's share of the budget before the stop, and how long a step takes is the machine's.
    end = cfg.model.training.lr * 0.1
    assert end - 1e-12 <= lrs[-1] <= 2 * end, (lrs[-1], end)
    last_step = max(int(r["step"]) for r in rows if r.get("train/loss_step"))
    final = torch.load(summary["last_checkpoint"], weights_only=True)
    assert final["global_step"] == last_step + 1  # saved after the last step
    validated = [int(r["step"]) for r in rows if r.get("val/exact_match")]
    assert validated[-1] >= last_step  # a validation after the last step, mid-epoch too
    # The first validation measured the pace and turned dropout off, in the log and in the
    # checkpoints (a resume keeps it off), after the steps done (the CSV's step is an index).
    off_at = final["callbacks"]["TimeBudget"]["dropout_off_at"]
    assert off_at == validated[0] + 1 and f"is off from step {off_at}: " in caplog.text
    assert inspect_report(summary["last_checkpoint"])["dropout_off_at_step"] == off_at
    # One every 4 s of training (12 s / 3) unless the stop, which the reserve puts 1-3 s before
    # the end, is less than 2 s away, and one at the stop: two or three ...
    assert 2 <= len(validated) <= 3, validated
    # ... and not at every epoch's end, where the config's val_check_interval would put them.
    # (600 pairs: an epoch of 10 batches, dozens of epochs in the budget on any machine.)
    epochs = 1 + max(int(r["epoch"]) for r in rows if r.get("train/loss_step"))
    assert epochs > 2 * len(validated), (epochs, validated)
    # It learnt within the budget: copying is most of the way there, where chance (10 symbols
    # and <eos>) is 0.09 of the tokens (0.99 in 339 steps on 2 cores; 0.88 in 102 on a quarter
    # of one, the slowest seen).
    assert summary["test"]["test/token_acc"] >= 0.5, summary["test"]


@pytest.mark.parametrize(
    ("limit", "steps"), [("trainer.max_steps=12", 12), ("trainer.max_epochs=2", 20)]
)
def test_a_run_validating_by_the_clock_validates_at_its_step_or_epoch_limit(
    limit: str, steps: int, tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """validations=N where the step or epoch limit comes long before the budget (a fast
    machine): Lightning validates by the clock only, neither at an epoch's end nor at the limit,
    so without the callback the run would end with no validation after its last steps, and test
    an earlier checkpoint or none."""
    overrides = [
        "data.corpus.train_size=600", "data.corpus.val_size=200", "data.corpus.test_size=200",
        "trainer.max_time=00:01:00:00", "validations=2", limit,  # one every 30 minutes
        "trainer.val_check_interval=5",  # not used by the clock: the log says so
    ]  # fmt: skip
    cfg = compose_train(tmp_path, data_dir, overrides)
    with caplog.at_level("INFO"):
        summary = train(cfg)
    assert "trainer.val_check_interval is not used: validations=2 validates by the clock" in (
        caplog.text
    )
    assert f"{limit} ends training first, at step {steps} (" in caplog.text  # Lightning's count
    with open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv") as f:
        validated = [r for r in csv.DictReader(f) if r.get("val/exact_match")]
    assert len(validated) == 1  # 600 pairs: 10 batches an epoch
    best = torch.load(summary["best_checkpoint"], weights_only=True)["global_step"]
    assert best == steps  # the checkpoint tested is the one after the last step


def test_validations_without_a_budget_are_named_as_unused(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """validations=N spreads validations over trainer.max_time: typed without one, it would do
    nothing, so the log says so (a warning) and where the run validates instead."""
    overrides = [*SMALL_DATA, "validations=4", "trainer.max_steps=2", "test=false", "logger=none"]
    with caplog.at_level("INFO"):
        train(compose_train(tmp_path, data_dir, overrides))
    (record,) = [r for r in caplog.records if r.getMessage().startswith("validations=4")]
    assert record.levelname == "WARNING"
    assert record.getMessage() == (
        "validations=4 is not used: it spreads validations over a time budget, and "
        "trainer.max_time is not set; validating at every epoch's end instead (add "
        "trainer.max_time=DD:HH:MM:SS to validate by the clock)"
    )


def test_validations_by_the_clock_are_rank_0s_decision() -> None:
    """validations=N: a validation once the training time since the last one (or the start)
    reaches the budget over N, decided by rank 0's clock for every process (each process's
    own clock could disagree by a step, and one validating while another trains would hang
    both); the decision reaches Lightning through its clock-based check."""
    from datetime import timedelta
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    from seq2seq.training.callbacks import TimeBudget, clocked_validation

    assert clocked_validation("00:00:30:00", 10) == {"val_check_interval": timedelta(minutes=3)}
    assert clocked_validation(None, 10) == clocked_validation("00:00:30:00", None) == {}
    clock = {"elapsed": 0.0}

    class ClockedTimer(Timer):
        def time_elapsed(self, stage: str = "train") -> float:
            return clock["elapsed"]

    rank_0 = {"says": None}  # None: this process is rank 0; else the (stop, due) it broadcasts

    def broadcast(obj: tuple[bool, bool]) -> tuple[bool, bool]:
        return obj if rank_0["says"] is None else rank_0["says"]

    trainer = SimpleNamespace(
        callbacks=[ClockedTimer(duration=timedelta(seconds=100))], datamodule=None,
        strategy=SimpleNamespace(broadcast=broadcast), _val_check_time_interval=25.0,
        sanity_checking=False, should_stop=False, is_global_zero=True, global_step=0,
        _last_val_time=0.0, max_steps=-1, max_epochs=-1, current_epoch=0, num_training_batches=10,
    )  # fmt: skip
    module = SimpleNamespace(hparams={"training": {"warmup_steps": 10, "warmup_share": None}})
    budget = TimeBudget()  # every 25 s of the 100, as validations=4 sets it
    budget.on_fit_start(trainer, module)
    budget.on_train_start(trainer, module)

    def validates_after_batch(at: float) -> bool:
        clock["elapsed"] = at
        budget.on_train_batch_end(trainer)
        return trainer._last_val_time == float("-inf")  # Lightning's check then says yes

    assert not validates_after_batch(24.0)
    assert validates_after_batch(25.0)
    budget.on_validation_epoch_start(trainer, module)
    clock["elapsed"] = 27.0  # the validation took 2 s: the next is due 25 s after it ended
    budget.on_validation_epoch_end(trainer, module)
    assert not validates_after_batch(51.0)
    assert validates_after_batch(52.0)
    budget.on_validation_epoch_start(trainer, module)
    clock["elapsed"] = 70.0  # the stop is at 98 s (the reserve is now 2 s): the next would be
    budget.on_validation_epoch_end(trainer, module)  # due at 95 s, too close to it
    assert not validates_after_batch(95.0)
    clock["elapsed"] = 54.0  # as if the last one had ended at 54 s: due at 79 s
    budget.on_validation_epoch_end(trainer, module)
    assert validates_after_batch(79.0)
    rank_0["says"] = (False, False)  # rank 0 is not there yet: nor is this process
    assert not validates_after_batch(80.0)
    rank_0["says"] = (False, True)  # rank 0 is: this process validates with it, though its
    assert validates_after_batch(54.0)  # own clock says no
    assert not trainer.should_stop
    # A step or epoch limit reached before the budget: the last batch validates, on every
    # process (each counts the same steps and batches), as an epoch's end would without the clock.
    rank_0["says"] = (False, False)
    trainer.global_step, trainer.max_steps = 40, 41
    assert not validates_after_batch(80.0)
    trainer.global_step = 41
    assert validates_after_batch(80.0)
    trainer.max_steps, trainer.max_epochs, trainer.current_epoch = -1, 3, 2
    budget.on_train_batch_end(trainer, module, None, None, 8)
    assert trainer._last_val_time == float("inf")  # not the last epoch's last batch yet
    budget.on_train_batch_end(trainer, module, None, None, 9)
    assert trainer._last_val_time == float("-inf")
    trainer.current_epoch = 1  # the last batch of an earlier epoch: no validation
    budget.on_train_batch_end(trainer, module, None, None, 9)
    assert trainer._last_val_time == float("inf")
    rank_0["says"] = (True, False)  # rank 0's budget is spent: stop, and Lightning validates
    budget.on_train_batch_end(trainer)
    assert trainer.should_stop
    plain = TimeBudget()  # without validation by the clock Lightning's check is left alone
    trainer.should_stop, trainer._last_val_time, rank_0["says"] = False, 5.0, None
    trainer._val_check_time_interval = None
    plain.on_fit_start(trainer, module)
    plain.on_train_batch_end(trainer)
    assert trainer._last_val_time == 5.0


def test_a_stop_by_lightnings_timer_is_recorded_as_the_clocks() -> None:
    """Where Lightning's Timer ends fit at the budget (a step or a validation outran the
    reserve), the record says training stopped there, so a replay stops there too; a run that
    ended within its budget (a step or epoch limit, early stopping) has no stop recorded."""
    from types import SimpleNamespace

    clock = {"elapsed": 0.0}
    trainer = SimpleNamespace(global_step=40, is_global_zero=True)
    timed_out = clocked_budget(100.0, clock)
    clock["elapsed"] = 100.2
    timed_out.on_train_end(trainer, None)
    assert (timed_out.record.stopped_at, timed_out.record.ended_at) == (40, 40)
    within = clocked_budget(100.0, clock)
    clock["elapsed"] = 61.0
    within.on_train_end(trainer, None)
    assert (within.record.stopped_at, within.record.ended_at) == (None, 40)


def test_a_warmup_share_ends_the_warmup_by_the_clock() -> None:
    """model.training.warmup_share: with a time budget the warmup also ends at that share of the
    training time, rising by whichever of steps and clock is further, and the cosine starts
    from the peak there; without a budget the step count alone rules, as before."""
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.optim import by_steps, lr_lambda

    clock = {"elapsed": 0.0}
    budget = clocked_budget(100.0, clock)  # reserve before any validation: 10 s, so 90 s
    share, steps = 0.1, 1000
    plain = by_steps(steps, lambda: float("inf"), decays=True)
    factor = lr_lambda("cosine", steps, 0.0, budget.schedule(plain, steps, share))
    assert factor(0) == pytest.approx(1 / steps)
    clock["elapsed"] = 4.5  # 5% of the training time: half way up by the clock
    assert factor(5) == pytest.approx(0.5)
    clock["elapsed"] = 9.0  # 10%: the warmup is over at step 10, not 1000
    assert factor(10) == pytest.approx(1.0)
    clock["elapsed"] = 49.5  # half way from the warmup's end to the stop
    assert factor(60) == pytest.approx(0.5)
    clock["elapsed"] = 90.0
    assert factor(120) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("cosine", steps, 0.0, plain)(5) == pytest.approx(6 / steps)  # no budget
    needs = r"model\.training\.warmup_share=0\.1 needs model\.training\.schedule=cosine"
    with pytest.raises(ValueError, match=needs):
        TrainingConfig(warmup_share=0.1)  # the default schedule: inverse_sqrt
    with pytest.raises(ValueError, match=r"model\.training\.warmup_share must be"):
        TrainingConfig(schedule="cosine", warmup_share=1.5)


def test_the_decay_by_the_clock_starts_where_the_warmup_ends(caplog) -> None:
    """A warmup that ends late leaves the cosine its whole range over the time left, with no
    jump, and a resume (the callback's state in the checkpoint) continues it."""
    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.optim import by_steps

    clock = {"elapsed": 0.0}

    def budget_at(state=None) -> TimeBudget:
        budget = clocked_budget(100.0, clock)  # reserve before any validation: 10 s, so 90 s
        if state is not None:
            budget.load_state_dict(state)
        return budget

    def decay(budget: TimeBudget, step: int) -> float:
        return budget.schedule(by_steps(10, lambda: float("inf"), decays=True), 10, None)(step)[1]

    budget = budget_at()
    assert decay(budget, 5) == pytest.approx(0.6)  # warming up: 6 of 10 steps
    clock["elapsed"] = 54.0  # the warmup ends at 60% of the 90 s
    with caplog.at_level("WARNING"):
        assert decay(budget, 10) == 0.0
    assert "the warmup (model.training.warmup_steps=10) took 60% of the time budget" in caplog.text
    clock["elapsed"] = 72.0
    assert decay(budget, 11) == pytest.approx(0.5)
    resumed = budget_at(budget.state_dict())
    clock["elapsed"] = 90.0
    assert decay(resumed, 12) == pytest.approx(1.0)
    assert decay(TimeBudget(), 12) == pytest.approx(0.0)  # no budget, no step limit: at the peak


def test_a_budget_that_buys_few_epochs_turns_dropout_off_at_the_first_validation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """model.training.dropout_min_epochs: the first validation's pace says how many epochs the
    budget buys (optimizer steps an epoch: batches over gradient accumulation); fewer than the
    minimum turn dropout off for the rest of the run, by rank 0's decision on every process, and
    a resume keeps it off. More epochs, no minimum, or no budget: dropout stays."""
    from types import SimpleNamespace

    from seq2seq.core.dropout import Dropout
    from seq2seq.core.model import ModelConfig, Seq2SeqTransformer
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.callbacks import TimeBudget

    clock = {"elapsed": 0.0}

    def rates(model: Seq2SeqTransformer) -> set[float]:
        return {m.p for m in model.modules() if isinstance(m, Dropout)}

    def first_validation(
        minimum, accumulate=1, rank_0_says=None, budget=None, limit=-1, elapsed=9.9, **kw
    ):
        budget = budget or clocked_budget(100.0, clock)
        model = Seq2SeqTransformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20))
        training = {"warmup_steps": 10, "warmup_share": None, "dropout_min_epochs": minimum}
        module = SimpleNamespace(model=model, hparams={"training": training})

        def broadcast(off: bool) -> bool:  # rank 0's decision, or this process's as rank 0
            return off if rank_0_says is None else rank_0_says

        trainer = SimpleNamespace(
            sanity_checking=False, global_step=20, num_training_batches=10,
            accumulate_grad_batches=accumulate, is_global_zero=True,
            strategy=SimpleNamespace(broadcast=broadcast), max_steps=-1, max_epochs=-1,
            estimated_stepping_batches=limit,  # Lightning's: max_steps or max_epochs' steps
        )  # fmt: skip
        vars(trainer).update(kw)
        clock["elapsed"] = elapsed  # 20 steps in 9.9 s, of the ~98 s the reserve (~2 s) leaves
        budget.on_validation_epoch_start(trainer, module)
        budget.on_validation_epoch_end(trainer, module)
        return budget, model

    with caplog.at_level("INFO"):
        budget, model = first_validation(minimum=25)  # ~198 steps of 10 an epoch: 19.7 epochs
    assert rates(model) == {0.0} and budget.state_dict()["dropout_off_at"] == 20
    assert "about 197 steps (19.7 epochs)" in caplog.text
    assert "dropout 0.1 is off from step 20: 19.7 epochs are fewer than " in caplog.text
    assert "model.training.dropout_min_epochs=25" in caplog.text
    resumed = clocked_budget(100.0, clock)  # a resume from a checkpoint after the decision
    resumed.load_state_dict(budget.state_dict())
    fresh = Seq2SeqTransformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20))
    resumed.on_train_start(None, SimpleNamespace(model=fresh))
    assert rates(fresh) == {0.0}
    kept, model = first_validation(minimum=15)  # 19.7 epochs: enough
    assert rates(model) == {0.1}
    state = kept.state_dict()
    assert (state["warmup_end"], state["paced_at"], state["dropout_off_at"]) == (None, 20, None)
    # Decided once: a resume on a machine four times slower (20 steps in 40 s, 4.9 epochs in
    # the budget) keeps dropout on, as decided before it, in the state and in the model.
    resumed = clocked_budget(100.0, clock)
    resumed.load_state_dict(kept.state_dict())
    again, model = first_validation(minimum=15, budget=resumed, elapsed=40.0)
    assert rates(model) == {0.1} and again.state_dict()["dropout_off_at"] is None
    older = clocked_budget(100.0, clock)  # a checkpoint from before paced_at was saved
    older.load_state_dict({"warmup_end": None, "dropout_off_at": 20})
    assert older.state_dict()["paced_at"] == 20
    assert rates(first_validation(minimum=25, accumulate=2)[1]) == {0.1}  # 5 steps an epoch: 40
    assert rates(first_validation(minimum=None)[1]) == {0.1}
    assert rates(first_validation(minimum=None, rank_0_says=True)[1]) == {0.0}  # rank 0 decides
    assert rates(first_validation(minimum=25, rank_0_says=False)[1]) == {0.1}
    assert rates(first_validation(minimum=25, budget=TimeBudget())[1]) == {0.1}  # no budget
    caplog.clear()
    with caplog.at_level("INFO"):  # a fast machine: max_epochs ends the run before the budget
        assert rates(first_validation(minimum=15, limit=100, max_epochs=10)[1]) == {0.0}
    assert "about 197 steps (19.7 epochs)" in caplog.text  # what the budget alone would buy
    assert "trainer.max_epochs=10 ends training first, at step 100 (10.0 epochs)" in caplog.text
    assert "10.0 epochs are fewer than model.training.dropout_min_epochs=15" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        assert rates(first_validation(minimum=5, limit=150, max_steps=150)[1]) == {0.1}
    assert "trainer.max_steps=150 ends training first, at step 150 (15.0 epochs)" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):  # a stream of unknown length: no epochs, no limit (-1)
        assert rates(first_validation(minimum=25, num_training_batches=math.inf)[1]) == {0.1}
    assert "about 197 steps in the" in caplog.text and "ends training first" not in caplog.text
    with pytest.raises(ValueError, match=r"model\.training\.dropout_min_epochs must be"):
        TrainingConfig(dropout_min_epochs=0)


def test_the_time_budget_keeps_for_the_test_what_its_beam_costs() -> None:
    """The reserve reckons the test from the last validation: its pairs over the pairs that
    validation decodes, a beam of k at sqrt(k) the greedy time (measured: 1.9-2x for beam 5)."""
    from types import SimpleNamespace

    from seq2seq.training.callbacks import _test_share

    def share(beam: int, limit: int | None, validation: int = 1000, test: int = 1000) -> float:
        splits = {"validation": range(validation), "test": range(test)}
        trainer = SimpleNamespace(datamodule=SimpleNamespace(splits=splits))
        hparams = {"decoding": {"beam_size": beam}, "training": {"val_decode_limit": limit}}
        module = SimpleNamespace(hparams=hparams)
        return _test_share(trainer, module)

    assert share(1, None) == 1.0
    assert share(1, 500) == 2.0  # the test decodes all 1,000, validation its first 500
    assert share(4, 500) == pytest.approx(4.0)  # 2 x sqrt(4)
    assert share(5, 500) == pytest.approx(2 * 5**0.5)
    assert share(5, None, validation=2000) == pytest.approx(0.5 * 5**0.5)
    assert _test_share(SimpleNamespace(datamodule=None), None) == 1.0  # no splits: one more


def test_a_run_with_test_false_keeps_no_time_for_a_test(tmp_path: Path, data_dir: Path) -> None:
    """test=false: the reserve keeps time for the last validation and checkpoint alone."""
    from datetime import timedelta
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    splits = {"validation": range(1000), "test": range(1000)}
    trainer = SimpleNamespace(
        callbacks=[Timer(duration=timedelta(seconds=100))],
        datamodule=SimpleNamespace(splits=splits),
    )
    hparams = {"decoding": {"beam_size": 4}, "training": {"val_decode_limit": 500}}
    reserves = {}
    for test in (True, False):
        cfg = compose_train(tmp_path, data_dir, [f"test={str(test).lower()}"])
        budget = instantiate(cfg.callbacks.time_budget)
        assert budget.test is test  # the run config's test, through configs/callbacks
        budget.on_fit_start(trainer, SimpleNamespace(hparams=hparams))
        budget._validation_seconds = 2.0  # as the last validation measured it
        reserves[test] = budget.reserve()
    # 1.25 x (2 s + the test's 2 x sqrt(4) validations) + 1 s + 1% of the budget; no test: 2 s
    assert reserves == {True: pytest.approx(1.25 * 10 + 2), False: pytest.approx(1.25 * 2 + 2)}
