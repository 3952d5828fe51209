"""The real corpus that ships with the project (data/corpora/tatoeba-en-fr): the experiments
read it from the clone wherever train.py starts, with its licence beside it, and
`python train.py experiment=tatoeba_en_fr` trains on it and prints BLEU and chrF."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from helpers import ROOT, compose_train, run_train_cli, same_scores

CORPUS = ROOT / "data" / "corpora" / "tatoeba-en-fr"


def test_the_corpus_ships_with_its_licence_and_attribution() -> None:
    with gzip.open(CORPUS / "en-fr.tsv.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "en\tfr" and len(lines) == 1 + 76_037
    assert all(line.count("\t") == 1 for line in lines)
    assert max(len(line.split("\t")[0]) for line in lines[1:]) == 30  # as its README says
    assert "CC BY 2.0 FR" in (CORPUS / "LICENSE").read_text()
    assert "Tatoeba" in (CORPUS / "README.md").read_text()


@pytest.mark.parametrize(("experiment", "src", "tgt"), [("tatoeba_en_fr", "en", "fr"),
                                                        ("tatoeba_fr_en", "fr", "en")])  # fmt: skip
def test_the_tatoeba_experiments_read_the_clones_corpus(
    experiment: str, src: str, tgt: str, tmp_path: Path
) -> None:
    import train  # noqa: F401  (registers the configs' resolvers)

    cfg = compose_train(tmp_path, tmp_path / "data", [f"experiment={experiment}"])
    corpus = cfg.data.corpus
    # The clone's file, not one relative to where train.py starts (paths.root_dir is tmp_path).
    assert Path(corpus.train.file) == CORPUS / "en-fr.tsv.gz"
    assert (corpus.src_column, corpus.tgt_column) == (src, tgt)
    assert cfg.data.split_by == "source"  # no test sentence is seen in training
    assert cfg.trainer.max_time == "00:00:30:00"


def test_tatoeba_en_fr_trains_from_the_clone_and_prints_bleu_and_chrf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """The README's real-text command, briefly: a few steps, one validation, a small test."""
    brief = [
        "trainer.max_steps=6", "trainer.val_check_interval=6", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "data.max_tokens=400", "model.training.val_decode_limit=16",
        "model.training.warmup_steps=3", "logger=none",
    ]  # fmt: skip
    assert run_train_cli(["experiment=tatoeba_en_fr", *brief], tmp_path, monkeypatch) == 0
    printed = "".join(capfd.readouterr())
    # 76,037 pairs less 5 duplicates, less 1,001 and 1,000 held out.
    assert "split 1001 pairs off the training data (by source, seed 0)" in printed
    assert "train: 74031 pairs" in printed
    for metric in ("test/bleu", "test/chrf"):  # with sacreBLEU's signature
        assert re.search(rf"{metric}: +[0-9.]+ +\(nrefs:1\|", printed), metric
    (run,) = (tmp_path / "outputs" / "tatoeba_en_fr" / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert {"test/bleu", "test/chrf"} <= set(summary["test"])
    assert summary["best_checkpoint"]  # validated and saved within the six steps
    # The cache is made where train.py starts, apart from the shipped files.
    assert (tmp_path / "data" / "cache" / "tokenizers").is_dir()
    assert sorted(p.name for p in CORPUS.iterdir()) == ["LICENSE", "README.md", "en-fr.tsv.gz"]
    # The checkpoint alone evaluates: its run's data and decoding, nothing else given (but the
    # test's one batch, as above), to the run's own scores.
    alone = ["train=false", f"ckpt_path={summary['best_checkpoint']}",
             "trainer.limit_test_batches=1", "logger=none"]  # fmt: skip
    assert run_train_cli(alone, tmp_path, monkeypatch) == 0, "".join(capfd.readouterr())
    (evaluation,) = (tmp_path / "outputs" / "train" / "runs").iterdir()
    fresh = json.loads((evaluation / "summary.json").read_text())
    assert same_scores(fresh["test"], summary["test"])


# The shipped recipe's decisive settings, each with the measurement it stands on (a section of
# docs/results.md). A change to one of them is a change of the recipe: measure it, write the
# evidence there, then change it here too.
R3 = "Round three: late dropout and the batched Muon, in 30 minutes"
RECIPE = {
    "validations": (8, "Validations by the clock",
                     "8 by the clock on any machine and corpus, not twice an epoch (17 to 40)"),
    "model.training.warmup_share": (0.25, "A warmup fitted to the pace",
                                    "the warmup ends at 1,000 steps or a quarter of the time"),
    "model.training.warmup_steps": (1000, "A warmup fitted to the pace",
                                    "the steps of a machine that makes 4,000 in 30 minutes"),
    "model.training.dropout_min_epochs": (None, R3, "no dropout decision by the first "
                                          "validation's pace, which a slow start flips"),
    "model.training.dropout_from_epoch": (4, R3, "late dropout: from the fourth epoch"),
    "model.net.qk_norm": ("self", R3, "with 3e-3, Muon and late dropout: +2.32 BLEU on Tatoeba, "
                          "+1.46 joined, two seeds each at 2 threads; the export maps it"),
    "model.training.optimizer": ("muon", R3, "the pair learns more per step than its step costs"),
    "data.max_tokens": (1280, "A batch in tokens",
                        "a batch in tokens, not pairs: more steps on the joined regime"),
    "model.decoding.beam_size": (5, "The decoding choices",
                                 "beam 5: +1.1 BLEU over greedy for 1.5x the decoding time"),
    "model.training.lr": (3e-3, R3, "3e-3 with QK-norm, Muon and late dropout (2e-3 alone)"),
    "model.training.label_smoothing": (0.1, "Label smoothing, BPE 16,000 and depth for width, "
                                       "in 30 minutes", "without it -0.86 BLEU at the same pace"),
    "data.tokenizer.vocab_size": (8000, "Label smoothing, BPE 16,000 and depth for width, in 30 "
                                  "minutes", "16,000 buys 24% fewer steps; 4,000 lost 1 BLEU"),
}  # fmt: skip


@pytest.mark.parametrize("experiment", ["tatoeba_en_fr", "tatoeba_fr_en", "parallel_bpe"])
def test_the_recipes_decisive_settings_are_the_measured_ones(experiment: str, tmp_path) -> None:
    from omegaconf import OmegaConf

    import train  # noqa: F401  (registers the configs' resolvers)

    cfg = compose_train(tmp_path, tmp_path / "data", [f"experiment={experiment}"])
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for key, (value, section, why) in RECIPE.items():
        assert f"### {section}\n" in results, f"{key}: docs/results.md lost '{section}'"
        assert OmegaConf.select(cfg, key) == value, (
            f"{key} is {OmegaConf.select(cfg, key)}, the recipe's {value} because {why} "
            f"(docs/results.md, '{section}'): measure a change there first"
        )
    assert cfg.model._target_.endswith("Seq2SeqModule") and cfg.model.net.d_model == 256


def test_results_md_decision_table_gives_each_setting_its_value_and_section() -> None:
    """The table a reader looks a setting up in names the recipe's value and links to the
    section RECIPE cites for it (a link that leads nowhere, or an old value, fails)."""
    import re

    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    section = results.split("## The recipe, decision by decision\n")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        if found := re.fullmatch(r"\| `([^`]+)` \| ([^|]+) \| [^|]+ \| (.+) \|", line):
            rows[found[1]] = (found[2].strip(), re.findall(r"\]\(#([^)]+)\)", found[3]))

    def anchor(heading: str) -> str:  # as GitHub makes a heading's link
        return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")

    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", results, flags=re.MULTILINE)}
    for key, (value, cited, _) in RECIPE.items():
        shown, links = rows[key]
        if isinstance(value, str) or value is None:  # a name, or null (off)
            assert shown == ("null" if value is None else value), f"{key}: {shown}, not {value}"
        else:
            number = float(shown.replace(",", ""))
            assert number == value, f"{key}: the table says {shown}, not {value}"
        assert anchor(cited) in links, f"{key}: the table does not link to '{cited}'"
    for key, (_, links) in rows.items():
        assert links and set(links) <= headings, f"{key}: a link to no section: {links}"
