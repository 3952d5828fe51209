"""Scaling switches on the CPU: two DDP processes, bf16 mixed precision, torch.compile, and an
Optuna search."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, compose_train, run_train_cli, small_data
from hydra.utils import instantiate

from train import train

SMALL = ["data.corpus.train_size=256", "data.corpus.val_size=32", "data.corpus.test_size=32"]
# Enough training that both runs learn most of the task: ~10 s each on 2 cores.
LEARN = [
    "data.corpus.max_length=5",
    "data.corpus.train_size=2000",
    "data.corpus.val_size=100",
    "data.corpus.test_size=200",
]
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


def rank_batches(cfg, world_size: int, rank: int, split: str, epoch: int) -> list[list[int]]:
    """The example indices of every batch that process `rank` of `world_size` loads."""
    datamodule = instantiate(cfg.data)
    datamodule.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
    datamodule.setup("fit")
    loader = getattr(datamodule, {"train": "train", "validation": "val", "test": "test"}[split]
                     + "_dataloader")()  # fmt: skip
    loader.batch_sampler.sampler.set_epoch(epoch)  # what Lightning does before each epoch
    return [list(batch) for batch in loader.batch_sampler]


@pytest.mark.parametrize("data", ["copy", "numbers"])  # epoch shuffle; length buckets
def test_under_ddp_the_ranks_load_disjoint_shares_of_each_epoch(
    data: str, tmp_path: Path, data_dir: Path
) -> None:
    cfg = compose_train(tmp_path, data_dir, [f"data={data}", *small_data(data, tmp_path)])
    size = {"train": 256, "test": 32}
    for split, epoch in (("train", 0), ("train", 1), ("test", 0)):
        alone = rank_batches(cfg, 1, 0, split, epoch)
        shares = [rank_batches(cfg, 2, rank, split, epoch) for rank in (0, 1)]
        seen = [{i for batch in share for i in batch} for share in shares]
        assert sorted(seen[0] | seen[1]) == list(range(size[split])), (split, epoch)
        assert len(shares[0]) == len(shares[1])  # as many steps on each rank
        # Disjoint, but for the padding that evens out the shares: the first items of the
        # epoch's order repeated (as DistributedSampler does), at most one batch of them.
        # Length buckets (numbers' training) halve batches instead: no example twice.
        overlap = seen[0] & seen[1]
        assert overlap <= set(alone[0]), f"both ranks load the same {split} examples"
        if split == "test" or data == "copy" or split == "train":  # copy: 256 in 64s
            assert not overlap
    # A new epoch is a new order on both ranks.
    assert rank_batches(cfg, 2, 0, "train", 0) != rank_batches(cfg, 2, 0, "train", 1)


def test_under_ddp_rank_zero_prepares_a_large_corpus_and_each_rank_trains_on_its_own_shard(
    tmp_path: Path, data_dir: Path
) -> None:
    """trainer=ddp_cpu (2 processes) on 30,000 pairs, a real run of one epoch: the other rank
    reads rank 0's text splits and tokenizers from the cache instead of making them, both hold
    the same tokenized training split as one process does, and between them they train on
    every pair exactly once, as many steps each."""
    corpus = tmp_path / "pairs.tsv"
    rows = (f"w{i % 997} v{i // 997}\tW{i % 991} V{i // 991}" for i in range(30_000))
    corpus.write_text("src\ttgt\n" + "\n".join(rows) + "\n", encoding="utf-8")
    data = [f"data.corpus.train.file={corpus}", "data.tokenizer.vocab_size=300",
            "data.tokenizer.sample=5000", "data.batch_size=2048",
            "data.max_tokens=16384"]  # fmt: skip
    records = tmp_path / "records"
    records.mkdir()
    run = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "experiment=parallel_bpe", "model=tiny", *data,
         "trainer=ddp_cpu", "trainer.max_epochs=1", "validations=null",
         "trainer.limit_val_batches=0", "callbacks.model_checkpoint.monitor=null", "test=false",
         "logger=none", "+callbacks.shard_record._target_=shard_record.ShardRecord",
         f"paths.data_dir={data_dir / 'ddp-large'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests"), "SHARD_RECORD_DIR": str(records)},
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    ranks = [json.loads((records / f"rank{r}-epoch0.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    # Rank 0 prepared (Lightning's prepare_data); rank 1 read what it left.
    assert {"split", "fit tokenizers"} <= set(ranks[0]["phases"])
    assert {"split, cached", "tokenizers, cached"} <= set(ranks[1]["phases"])
    assert not {"clean", "split", "fit tokenizers"} & set(ranks[1]["phases"])
    # The same training split as one process prepares from the same cache.
    alone = instantiate(compose_train(tmp_path, data_dir / "ddp-large", [
        "experiment=parallel_bpe", *data]).data)  # fmt: skip
    alone.setup("fit")
    from shard_record import split_digest

    assert (
        ranks[0]["train_digest"] == ranks[1]["train_digest"] == split_digest(alone.splits["train"])
    )
    size = ranks[0]["train_size"]
    assert size == len(alone.splits["train"]) > 27_000
    # Each rank gave out its whole share, as many batches each; none twice, none missed.
    assert all(r["gave_out_all"] for r in ranks)
    assert ranks[0]["batches"] == ranks[1]["batches"] > 1
    seen = ranks[0]["examples"] + ranks[1]["examples"]
    assert sorted(seen) == list(range(size))


def test_ddp_on_two_cpu_processes_matches_one_process(tmp_path: Path, data_dir: Path) -> None:
    # Two processes of 32 make the same 64 examples a step, and the gradients are averaged.
    ddp = run_cli(tmp_path / "ddp", data_dir, *LEARN, "data.batch_size=32", "trainer=ddp_cpu")
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    runs = list((tmp_path / "ddp" / "outputs" / "train" / "runs").iterdir())
    assert len(runs) == 1  # one run directory, not one per process
    summary = json.loads((runs[0] / "summary.json").read_text())
    ddp_test = summary["test"]
    # Only rank 0 reports: the summary lines appear once.
    assert (ddp.stdout + ddp.stderr).count("Best checkpoint:") == 1

    # The test metrics are over the whole test split, not one rank's half: one process
    # evaluating the same checkpoint on the same split gets the same numbers.
    data = [o for o in LEARN if o.startswith("data.")]
    evaluate = ["train=false", f"ckpt_path={summary['best_checkpoint']}", "logger=none", *data]
    evaluation = train(compose_train(tmp_path / "eval", data_dir, evaluate))
    alone = evaluation["test"]
    assert alone["test/exact_match"] < 1.0  # so the halves differ, and the check means something
    for name, value in alone.items():
        assert ddp_test[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    # The test texts the run wrote are the whole split, in order, as one process writes them.
    for name in ("hypotheses", "references", "sources"):
        written = (runs[0] / f"test_{name}.txt").read_text()
        assert written == (Path(evaluation["run_dir"]) / f"test_{name}.txt").read_text(), name

    # And training on two processes learns what one process learns.
    single = train(compose_train(tmp_path / "single", data_dir, [*LEARN, "data.batch_size=64"]))
    assert single["test"]["test/exact_match"] > 0.5  # it learned something to compare
    exact = single["test"]["test/exact_match"]
    assert ddp_test["test/exact_match"] == pytest.approx(exact, abs=0.1)
    assert ddp_test["test/loss"] == pytest.approx(single["test"]["test/loss"], rel=0.35)


def record_training_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.dtype, float]]:
    """(logits dtype, loss) of every training step of the runs that follow."""
    from seq2seq.training.module import Seq2SeqModule

    seen: list[tuple[torch.dtype, float]] = []
    original = Seq2SeqModule.model_step

    def model_step(self, batch):
        loss, logits = original(self, batch)
        if self.training:
            seen.append((logits.dtype, loss.item()))
        return loss, logits

    monkeypatch.setattr(Seq2SeqModule, "model_step", model_step)
    return seen


def test_bf16_mixed_precision_runs_the_forward_in_bf16_on_the_cpu(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_training_steps(monkeypatch)
    overrides = [*SMALL, "debug=fdr"]
    summary = train(compose_train(tmp_path, data_dir, [*overrides, "trainer.precision=bf16-mixed"]))
    assert all(math.isfinite(v) for v in summary["test"].values())
    assert [dtype for dtype, _ in seen] == [torch.bfloat16]  # autocast was on in the forward
    train(compose_train(tmp_path / "fp32", data_dir, overrides))
    assert seen[1][0] == torch.float32  # and is off by default
    assert seen[0][1] == pytest.approx(seen[1][1], rel=0.02)  # the same step, in bf16


@pytest.mark.slow
def test_compiled_model_trains_on_the_cpu(compile_check: dict) -> None:
    """model.training.compile=true compiles the model (dynamo captures its graphs, inductor
    generates and compiles the forward's and backward's kernels) and changes no result: the first
    training step's loss equals the eager model's. Run by tests/compile_check.py in a process
    of its own, started when the suite starts (conftest.py), as it takes ~45 s cold."""
    assert compile_check["unique_graphs"] >= 1, compile_check
    eager, compiled = compile_check["losses"]
    assert compiled == pytest.approx(eager, abs=1e-4)


def test_optuna_search_runs_trials_and_reports_the_best(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    args = ["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2", "debug=fdr", *SMALL]
    assert run_train_cli([*args, f"paths.data_dir={data_dir}"], tmp_path, monkeypatch) == 0
    output = "".join(capfd.readouterr())
    assert "Best parameters: {'model.training.lr':" in output
    (sweep_dir,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    assert (sweep_dir / "optimization_results.yaml").exists()
    assert len((sweep_dir / "sweep_summary.csv").read_text().splitlines()) == 3


def test_a_search_optimises_the_metric_checkpoints_are_ranked_by(tmp_path: Path) -> None:
    """Optuna maximises what train.py returns: the test value of the checkpoint monitor's
    metric, exact match on the symbol tasks and chrF on real text."""
    from train import optimized_value

    summary = {"test": {"test/exact_match": 0.25, "test/chrf": 0.5}}
    copy = compose_train(tmp_path, tmp_path / "data", [])
    real = compose_train(tmp_path, tmp_path / "data", ["experiment=tatoeba_en_fr"])
    assert optimized_value(copy, summary) == 0.25
    assert optimized_value(real, summary) == 0.5
