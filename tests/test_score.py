"""Score provenance: every BLEU and chrF is sacreBLEU's and carries its signature; a run writes
its test hypotheses, and `python -m seq2seq.score` re-scores them under other conventions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from seq2seq import inspect as inspect_cli
from seq2seq.score import corpus_scores, rescore, signatures
from seq2seq.score import main as score_cli

Trained = tuple[dict, DictConfig]


def test_known_scores_and_their_signatures() -> None:
    same = corpus_scores(["the cat sat on the mat ."], ["the cat sat on the mat ."])
    assert same["bleu"]["score"] == pytest.approx(1.0) and same["chrf"]["score"] == 1.0
    assert same["bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
    assert same["chrf"]["signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
    assert "tok:char" in signatures("char")["bleu"]
    rows = {
        r["name"]: r for r in rescore(["The Cat sat on the mat ."], ["the cat sat on the mat ."])
    }
    assert rows["bleu"]["score"] < rows["bleu-lc"]["score"] == 100.0  # casing counts, or not
    assert (
        "case:lc" in rows["bleu-lc"]["signature"] and "tok:intl" in rows["bleu-intl"]["signature"]
    )
    assert "nw:2" in rows["chrf++"]["signature"]


def test_a_run_writes_its_test_texts_and_reports_the_sacrebleu_of_them(
    trained: Trained, tmp_path: Path, capsys
) -> None:
    summary, cfg = trained
    run_dir = Path(summary["run_dir"])
    hypotheses = (run_dir / "test_hypotheses.txt").read_text().splitlines()
    references = (run_dir / "test_references.txt").read_text().splitlines()
    sources = (run_dir / "test_sources.txt").read_text().splitlines()
    assert len(hypotheses) == len(references) == len(sources) == cfg.data.corpus.test_size
    assert references == sources  # the copy task, in the test split's order
    exact = sum(map(str.__eq__, hypotheses, references)) / len(references)
    assert summary["test"]["test/exact_match"] == pytest.approx(exact)
    scores = corpus_scores(hypotheses, references)
    assert summary["test"]["test/bleu"] == pytest.approx(scores["bleu"]["score"], abs=1e-6)
    assert summary["test"]["test/chrf"] == pytest.approx(scores["chrf"]["score"], abs=1e-6)
    assert summary["signatures"] == signatures("13a")
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["signatures"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|")
    checkpoint = torch.load(summary["best_checkpoint"], weights_only=True)
    assert checkpoint["metric_signatures"] == signatures("13a")
    assert inspect_cli.main([summary["best_checkpoint"]]) == 0
    assert f"({signatures('13a')['chrf']})" in capsys.readouterr().out
    # Re-scored from the files, by the command the run prints.
    assert (
        score_cli([str(run_dir / "test_hypotheses.txt"), str(run_dir / "test_references.txt")]) == 0
    )
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("bleu "))
    assert float(line.split()[1]) == pytest.approx(100 * summary["test"]["test/bleu"], abs=0.01)
    for name in ("bleu-lc", "bleu-intl", "bleu-intl-lc", "bleu-char", "chrf", "chrf++"):
        assert any(row.startswith(name + " ") and "nrefs:1|" in row for row in out.splitlines())


def test_score_errors_are_one_line(tmp_path: Path, capsys) -> None:
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a\nb\n")
    ref.write_text("a\n")
    rows = [
        ([str(hyp), str(ref)], "2 hypotheses against 1 references"),
        ([str(hyp), str(tmp_path / "none.txt")], "none.txt is not a file"),
        ([str(hyp), str(tmp_path)], "is not a file"),  # a directory
    ]
    for args, message in rows:
        assert score_cli(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err
    ref.write_bytes(b"a\n\xff\n")
    hyp.write_text("a\nb\n")
    assert score_cli([str(hyp), str(ref)]) == 1
    assert "ref.txt line 2 is not valid UTF-8" in capsys.readouterr().err


def test_empty_files_have_nothing_to_score(tmp_path: Path, capsys) -> None:
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("")
    ref.write_text("")
    assert score_cli([str(hyp), str(ref)]) == 1
    assert capsys.readouterr().err == f"error: {ref} has no lines: there is nothing to score\n"


def test_a_bare_carriage_return_stays_inside_its_line_as_in_training_files(
    tmp_path: Path, capsys
) -> None:
    """Lines end at "\\n" alone (and "\\r\\n"), in score, translate and the corpora alike, so a
    stray "\\r" never splits one line into two and shifts every later pair."""
    from seq2seq.data.tokenizer import text_lines

    assert text_lines(b"a\rb\nc\r\nd", "x") == ["a\rb", "c", "d"]
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_bytes(b"one two\rthree\nfour\r\n")
    ref.write_bytes(b"one two three\nfour\n")
    assert score_cli([str(hyp), str(ref), "--json"]) == 0  # 2 lines against 2, not 3 against 2
