"""The training doctor on hand-made outputs: each degenerate case is detected, healthy output
raises nothing, and the metrics reach a real run's CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from omegaconf import DictConfig

from seq2seq.training.doctor import Doctor, output_metrics, repeats_itself

REFERENCES = [f"the cat number {i} sat on the mat ." for i in range(20)]
ENDED = [True] * 20


def diagnose(hypotheses, ended=ENDED, references=REFERENCES, **history):
    return Doctor().diagnose(hypotheses, references, ended, **history)


def test_healthy_outputs_raise_nothing() -> None:
    metrics, warnings = diagnose(REFERENCES)
    assert warnings == []
    assert metrics == {"distinct_rate": 1.0, "repeat_rate": 0.0, "no_eos_rate": 0.0,
                       "len_ratio": 1.0}  # fmt: skip


def test_the_same_output_for_every_input() -> None:
    metrics, warnings = diagnose(["je ne sais pas ."] * 15 + REFERENCES[:5])
    assert metrics["distinct_rate"] == pytest.approx(6 / 20)
    assert any("75% of the outputs are the same text ('je ne sais pas .')" in w for w in warnings)


def test_outputs_that_repeat_themselves() -> None:
    assert repeats_itself("in front of a white fence in front of a white fence")
    assert repeats_itself("in the snow with snow in the snow")
    assert repeats_itself("no no no")
    assert not repeats_itself("the cat sat on the mat .")  # "the" twice is not a loop
    looping = [f"{r} on the mat ." for r in REFERENCES[:4]] + REFERENCES[4:]
    metrics, warnings = diagnose(looping)
    assert metrics["repeat_rate"] == pytest.approx(0.2)
    assert any("20% of the outputs repeat themselves (the references: 0%)" in w for w in warnings)
    # References that repeat as much raise no warning: that is the data, not the model.
    _, warnings = diagnose(looping, references=looping)
    assert not any("repeat themselves" in w for w in warnings)


def test_outputs_that_never_end() -> None:
    ended = [True] * 17 + [False] * 3
    metrics, warnings = diagnose(REFERENCES, ended=ended)
    assert metrics["no_eos_rate"] == pytest.approx(0.15)
    assert any("15% of the outputs never end" in w for w in warnings)


@pytest.mark.parametrize(("cut", "side"), [(0.5, "shorter"), (1.6, "longer")])
def test_outputs_far_from_the_references_length(cut: float, side: str) -> None:
    outputs = [(r * 2)[: int(len(r) * cut)] for r in REFERENCES]
    metrics, warnings = diagnose(outputs)
    assert metrics["len_ratio"] == pytest.approx(cut, abs=0.05)
    assert any(f"x the references' length ({side})" in w for w in warnings)


def test_bleu_near_zero_while_the_loss_falls() -> None:
    doctor = Doctor()
    outputs = [f"words {i} that translate nothing" for i in range(20)]
    for loss in (5.0, 4.0):
        _, warnings = doctor.diagnose(outputs, REFERENCES, ENDED, loss=loss, bleu=0.001)
        assert not any("BLEU is near zero" in w for w in warnings)  # too early to tell
    _, warnings = doctor.diagnose(outputs, REFERENCES, ENDED, loss=3.0, bleu=0.001)
    assert any("BLEU is near zero (0.0010) while the validation loss fell from 5.000 to 3.000"
               in w for w in warnings)  # fmt: skip
    flat = Doctor()
    for _ in range(3):  # a loss that does not fall: no such warning
        _, warnings = flat.diagnose(outputs, REFERENCES, ENDED, loss=5.0, bleu=0.001)
    assert not any("BLEU is near zero" in w for w in warnings)


def test_no_outputs_no_metrics() -> None:
    assert output_metrics([], [], []) == {}


def test_the_doctors_metrics_are_in_the_runs_csv(trained: tuple[dict, DictConfig]) -> None:
    _, cfg = trained
    with open(Path(cfg.paths.output_dir) / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/len_ratio")]
    assert len(rows) == cfg.trainer.max_epochs  # one per validation
    last = rows[-1]
    assert float(last["val/distinct_rate"]) > 0.9 and float(last["val/repeat_rate"]) < 0.05
    assert float(last["val/no_eos_rate"]) == 0.0
    assert float(last["val/len_ratio"]) == pytest.approx(1.0, abs=0.02)
