"""The search picked on the validation split after training (pick_search): every candidate
scored on the validation pairs with the tested checkpoint's weights, as a model read back from
that file scores it; the best is what the test decodes with and what the checkpoint keeps."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from seq2seq.checkpoint import load_checkpoint, load_module
from seq2seq.core.decoding import DecodingConfig, generate
from seq2seq.score import corpus_scores
from seq2seq.training.pick import SearchGrid, best_of, pick_search, pick_share
from train import build_module, train

RUN = [
    "experiment=reverse", "data.corpus.train_size=256", "data.corpus.val_size=32",
    "data.corpus.test_size=32", "data.batch_size=32", "trainer.max_epochs=3",
]  # fmt: skip
GRID = ["pick_search.beam_sizes=[1,3]", "pick_search.length_penalties=[0.6,1.4]"]


def scores_of(model, loader, decoding: DecodingConfig) -> dict[str, float]:
    """BLEU and chrF of a model's search over a loader's pairs: the reference the pick's rows
    are checked against."""
    hypotheses, references = [], []
    for batch in loader:
        output = generate(model.model, batch["src"], decoding)
        hypotheses += [model.tgt_vocab.decode(row) for row in output.tolist()]
        references += [model.tgt_vocab.decode(row) for row in batch["labels"].tolist()]
    scores = corpus_scores(hypotheses, references, model.hparams["training"]["bleu_tokenize"])
    return {name: round(score["score"], 6) for name, score in scores.items()}


@pytest.fixture(scope="module")
def picked_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path):
    tmp_path = tmp_path_factory.mktemp("pick")
    cfg = compose_train(tmp_path, data_dir, [*RUN, *GRID])
    return train(cfg), cfg


def test_the_pick_is_the_best_candidate_as_the_checkpoint_file_scores_it(picked_run) -> None:
    summary, cfg = picked_run
    record = summary["picked_search"]
    assert record["metric"] == "bleu"  # the symbol tasks' checkpoints rank by exact match
    assert [(r["beam_size"], r["length_penalty"]) for r in record["rows"]] == [
        (1, 0.6), (1, 1.4), (3, 0.6), (3, 1.4)
    ]  # fmt: skip
    assert record["picked"]["bleu"] == max(r["bleu"] for r in record["rows"])
    # Each row is what the tested checkpoint, read back by the tools, scores on the pairs.
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    model = load_module(summary["best_checkpoint"])
    for row in record["rows"]:
        decoding = replace(model.decoding, beam_size=row["beam_size"],
                           length_penalty=row["length_penalty"])  # fmt: skip
        expected = scores_of(model, datamodule.whole_loader("validation"), decoding)
        assert {k: row[k] for k in expected} == expected, row


def test_the_test_decodes_with_the_pick_and_the_checkpoint_keeps_it(picked_run, capsys) -> None:
    from seq2seq import inspect

    summary, cfg = picked_run
    picked = summary["picked_search"]["picked"]
    checkpoint = load_checkpoint(summary["best_checkpoint"])
    decoding = checkpoint["hyper_parameters"]["decoding"]
    assert (decoding["beam_size"], decoding["length_penalty"]) == (
        picked["beam_size"], picked["length_penalty"],
    )  # fmt: skip
    assert checkpoint["picked_search"] == summary["picked_search"]
    # The test's outputs are the checkpoint's search with its (picked) defaults.
    model = load_module(summary["best_checkpoint"])
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    outputs = []
    for batch in datamodule.test_dataloader():
        output = generate(model.model, batch["src"], model.decoding)  # the file's defaults
        outputs += [model.tgt_vocab.decode(row) for row in output.tolist()]
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "test_hypotheses.txt").read_text().splitlines() == outputs
    inspect.main([summary["best_checkpoint"]])
    shown = capsys.readouterr().out
    assert "search picked by validation bleu on 32 pairs:" in shown
    assert shown.count("<- picked") == 1


def test_the_pick_reads_the_weights_it_is_given_not_the_modules(picked_run) -> None:
    """The module holds the last step's weights after fit; the pick scores the tested file's."""
    summary, cfg = picked_run
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    module = build_module(cfg, *datamodule.tokenizers())  # freshly initialised weights
    strategy = SimpleNamespace(root_device=torch.device("cpu"), broadcast=lambda x, src: x)
    trainer = SimpleNamespace(strategy=strategy, is_global_zero=True)
    grid = SearchGrid.from_config({"beam_sizes": [1, 3], "length_penalties": [0.6, 1.4]})
    record = pick_search(trainer, module, datamodule, grid, None, summary["best_checkpoint"])
    scores = [{k: r[k] for k in ("bleu", "chrf")} for r in record["rows"]]
    recorded = [{k: r[k] for k in ("bleu", "chrf")} for r in summary["picked_search"]["rows"]]
    assert scores == recorded
    assert module.decoding.beam_size == record["picked"]["beam_size"]


def test_evaluating_a_checkpoint_picks_without_changing_the_file(
    picked_run, tmp_path: Path, data_dir: Path
) -> None:
    summary, _ = picked_run
    best = Path(summary["best_checkpoint"])
    before = hashlib.sha256(best.read_bytes()).hexdigest()
    overrides = [*RUN, "train=false", f"ckpt_path={best}", "pick_search.length_penalties=[1.0]"]
    evaluated = train(compose_train(tmp_path, data_dir, overrides))
    assert hashlib.sha256(best.read_bytes()).hexdigest() == before
    (row,) = evaluated["picked_search"]["rows"]
    assert row["length_penalty"] == 1.0 and evaluated["picked_search"]["picked"] == row


def test_a_failed_write_leaves_the_checkpoint_whole(picked_run, tmp_path, monkeypatch) -> None:
    from seq2seq.training.pick import record_in_checkpoint

    summary, _ = picked_run
    copy = tmp_path / "best.ckpt"
    copy.write_bytes(Path(summary["best_checkpoint"]).read_bytes())
    before = copy.read_bytes()

    def disk_full(obj, path) -> None:
        Path(path).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        record_in_checkpoint(copy, summary["picked_search"])
    assert copy.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt"]  # no .part left behind


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pick_search.beam_sizes=[0]", "pick_search.beam_sizes must be a positive integer, got 0"),
        ("pick_search.beam_sizes=[]", "pick_search.beam_sizes must be a non-empty list such as "
         r"\[4,5,8\], got \[\]"),
        ("pick_search.length_penalties=[abc]", "pick_search.length_penalties must be a number "
         r"in \[-inf, inf\], got 'abc'"),
        ("pick_search.metric=ter", "pick_search.metric must be one of bleu, chrf, got 'ter'"),
        ("+pick_search.beams=[4]", "pick_search.beams is not a setting: give beam_sizes, "
         "length_penalties or metric"),
    ],
)  # fmt: skip
def test_bad_grid_values_fail_before_anything_runs(
    override: str, message: str, tmp_path: Path, data_dir: Path
) -> None:
    cfg = compose_train(tmp_path, data_dir, [*RUN, override])
    with pytest.raises(ValueError, match=f"^{message}$"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_candidates_ties_and_the_time_kept_for_them() -> None:
    default = DecodingConfig(beam_size=5, length_penalty=1.0)
    grid = SearchGrid.from_config({"length_penalties": [0.6, 1.0, 0.6]})
    assert [(p.beam_size, p.length_penalty) for p in grid.candidates(default)] == [
        (5, 0.6), (5, 1.0)
    ]  # fmt: skip
    assert SearchGrid.from_config({"beam_sizes": 4}).beam_sizes == (4,)
    assert not SearchGrid.from_config(None).active
    assert pick_share(SearchGrid.from_config(None), default.to_dict()) == 0.0
    both = SearchGrid.from_config({"beam_sizes": [1, 4], "length_penalties": [0.6, 1.0]})
    assert pick_share(both, default.to_dict()) == pytest.approx(2 * 1 + 2 * 2)
    assert grid.metric_for("val/chrf") == "chrf" and grid.metric_for("val/loss") == "bleu"
    assert SearchGrid.from_config({"metric": "bleu"}).metric_for("val/chrf") == "bleu"
    rows = [
        {"beam_size": 5, "length_penalty": 0.6, "bleu": 30.0},
        {"beam_size": 5, "length_penalty": 1.0, "bleu": 30.0},
        {"beam_size": 5, "length_penalty": 1.4, "bleu": 29.0},
    ]
    assert best_of(rows, "bleu", default) is rows[1]  # a tie keeps model.decoding's own
    assert best_of(rows, "bleu", DecodingConfig(beam_size=4)) is rows[0]  # else the first
    assert best_of(rows[1:], "bleu", default) is rows[1]


def test_the_time_budget_keeps_time_for_the_pick(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_train(tmp_path, data_dir, [*RUN, *GRID])
    budget = instantiate(cfg.callbacks.time_budget)
    assert budget.pick == SearchGrid(beam_sizes=(1, 3), length_penalties=(0.6, 1.4))


def test_a_resume_or_replay_may_change_the_grid(tmp_path: Path, data_dir: Path) -> None:
    from omegaconf import OmegaConf

    from seq2seq.training.preflight import REPLAY_MAY_CHANGE, RESUME_MAY_CHANGE, first_difference

    saved = OmegaConf.to_container(compose_train(tmp_path, data_dir, RUN), resolve=True)
    cfg = compose_train(tmp_path, data_dir, [*RUN, *GRID])
    assert first_difference(cfg, saved, RESUME_MAY_CHANGE) is None
    assert first_difference(cfg, saved, REPLAY_MAY_CHANGE) is None
    # A run saved before pick_search existed resumes with it, on or off.
    del saved["pick_search"], saved["callbacks"]["time_budget"]["pick_search"]
    assert first_difference(cfg, saved, RESUME_MAY_CHANGE) is None
    assert (
        first_difference(compose_train(tmp_path, data_dir, RUN), saved, RESUME_MAY_CHANGE) is None
    )
