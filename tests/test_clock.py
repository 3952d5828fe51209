"""The clock of a time budget (seq2seq/training/clock.py, callbacks.TimeBudget): where a
budgeted run validates, stops and turns dropout off, rank 0's decisions on every process, the
time kept for the test; a budgeted run resumed goes on as it would have; replay=RUN trains it
again to the same metrics and weights, and one that cannot is refused in one line."""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    ROOT,
    budgeted_run,
    clocked_budget,
    compose_train,
    metrics_without_time,
    refused,
    run_train_cli,
)
from hydra.utils import instantiate

from seq2seq.inspect import report as inspect_report
from train import train

SMALL_DATA = ["data.corpus.train_size=256", "data.corpus.val_size=32", "data.corpus.test_size=32"]

# --- a run with a time budget, stopped past its middle and resumed ------------------------------

BUDGET_SECONDS, VALIDATIONS = 12, 4


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


# --- late dropout: decided by the epochs trained, never by the clock ------------------------------

# budgeted_run's, with 300 training pairs in batches of 50 and late dropout instead.
LATE = [*budgeted_run(4, 2)[3:-1], "data.corpus.train_size=300", "data.corpus.val_size=50",
        "data.corpus.test_size=50", "data.batch_size=50",
        "model.training.dropout_from_epoch=1"]  # fmt: skip
LATE_ON_AT = 300 // 50  # optimizer steps in an epoch of 300 pairs, 50 a batch


def dropout_by_step(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/dropout")]
    return {int(r["step"]): float(r["train/dropout"]) for r in rows}


def test_late_dropout_turns_on_by_epochs_at_any_pace_from_any_start() -> None:
    """model.training.dropout_from_epoch: dropout off before that many epochs (optimizer steps
    over an epoch's, gradient accumulation counted) and on from there, at every batch; a module
    started at a later step (a resume, a replay) decides there as the run did; a corpus of
    unknown epoch length counts whole epochs. It cannot be set beside dropout_min_epochs, and
    a streamed corpus, which has no epochs, refuses it in one line."""
    from types import SimpleNamespace

    from seq2seq.core.dropout import Dropout
    from seq2seq.data.vocab import Vocabulary
    from seq2seq.hparams import TrainingConfig
    from seq2seq.training.module import Seq2SeqModule

    vocab = Vocabulary([str(i) for i in range(10)]).to_dict()
    net = {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 1,
           "num_decoder_layers": 1, "dropout": 0.2}  # fmt: skip

    def rates_from(start_step: int, steps: int, **trainer_fields) -> list[float]:
        module = Seq2SeqModule(net, vocab, vocab, training={"dropout_from_epoch": 1.5})
        fields = {"num_training_batches": 10, "accumulate_grad_batches": 2, "current_epoch": 0}
        trainer = SimpleNamespace(global_step=start_step, **{**fields, **trainer_fields})
        module.trainer = trainer  # type: ignore[assignment]
        out = []
        for step in range(start_step, start_step + steps):
            trainer.global_step = step
            module._late_dropout()
            out.append({m.p for m in module.model.modules() if isinstance(m, Dropout)}.pop())
        return out

    # 5 optimizer steps an epoch (10 batches, 2 accumulated): on from step 8 (1.6 epochs).
    assert rates_from(0, 10) == [0.0] * 8 + [0.2] * 2
    assert rates_from(9, 2) == [0.2, 0.2]  # a resume past the switch starts with dropout on
    assert rates_from(3, 2) == [0.0, 0.0]
    unknown = rates_from(0, 3, num_training_batches=math.inf, current_epoch=2)
    assert unknown == [0.2] * 3  # whole epochs: 2 >= 1.5
    with pytest.raises(ValueError, match=r"dropout_from_epoch=2 and dropout_min_epochs=6 both"):
        TrainingConfig(dropout_from_epoch=2, dropout_min_epochs=6)
    with pytest.raises(ValueError, match=r"model\.training\.dropout_from_epoch must be"):
        TrainingConfig(dropout_from_epoch=0)


def test_a_slowed_start_reaches_the_same_late_dropout_decisions_and_replay_repeats_them(
    data_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Late dropout against a slow start, as the issue that asked for it put it: a budgeted
    run whose first validation interval is slowed many times (every step sleeps until then, as
    other work on the machine would) turns dropout on at the same step as the run alone (where
    its first epoch ends), though its clock validated elsewhere; and replay=RUN of the slowed run
    trains it again to the same metrics, dropout included."""
    late_runs = {}
    slow = ["+callbacks.slow._target_=helpers.SlowFirstInterval", "+callbacks.slow.seconds=0.1"]
    for name, extra in [("plain", []), ("slowed", slow)]:
        late_runs[name] = tmp_path / name
        args = [*LATE, *extra, f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / name}"]
        assert run_train_cli(args, tmp_path, monkeypatch) == 0, capsys.readouterr().err
    plain, slowed = (dropout_by_step(late_runs[k]) for k in ("plain", "slowed"))
    for rates in (plain, slowed):
        assert max(rates) > LATE_ON_AT, "the run stopped before an epoch"
        assert {s for s, r in rates.items() if r > 0} == {s for s in rates if s >= LATE_ON_AT}
        assert {round(r, 6) for s, r in rates.items() if s >= LATE_ON_AT} == {0.1}
    first = [json.loads((late_runs[k] / "clock.json").read_text())["validations"][0]
             for k in ("plain", "slowed")]  # fmt: skip
    assert first[1] < first[0], f"the slowed run was not slower: validated first at {first}"
    replayed = tmp_path / "replayed"
    args = [f"replay={late_runs['slowed']}", f"hydra.run.dir={replayed}"]
    assert run_train_cli(args, tmp_path, monkeypatch) == 0, capsys.readouterr().err
    assert metrics_without_time(replayed) == metrics_without_time(late_runs["slowed"])


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


BUDGETED = [
    *budgeted_run(BUDGET_SECONDS, VALIDATIONS),
    "callbacks.step_checkpoint.every_n_train_steps=5",  # the test watches the budget's clock
]


def budget_state(path: Path) -> tuple[int, float, dict]:
    """(step, training seconds, TimeBudget's state) saved in a checkpoint."""
    checkpoint = torch.load(path, weights_only=True, map_location="cpu")
    callbacks = checkpoint["callbacks"]
    return (
        checkpoint["global_step"],
        callbacks["Timer"]["time_elapsed"]["train"],
        callbacks["TimeBudget"],
    )


def learning_rates(metrics_csv: Path) -> list[float]:
    with open(metrics_csv) as f:
        return [float(r["lr-AdamW/pg1"]) for r in csv.DictReader(f) if r.get("lr-AdamW/pg1")]


@pytest.fixture(scope="module")
def budgeted_resumed(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict:
    """A budgeted run (BUDGETED) stopped by SIGTERM once it has trained past the middle of
    its budget with dropout decided, then resumed with `resume=RUN` to its end: the run
    directory, the state at the stop, the resume's summary and its log."""
    tmp_path = tmp_path_factory.mktemp("budgeted")
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *BUDGETED, f"paths.data_dir={data_dir}",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        try:  # past the middle of the budget, and dropout decided
            _, seconds, state = budget_state(last)
            if seconds >= BUDGET_SECONDS / 2 and state["dropout_off_at"] is not None:
                break
        except Exception:  # not written yet
            pass
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + 15, err[-3000:]
    stopped = budget_state(last)

    cfg = compose_train(tmp_path, data_dir, [*BUDGETED, f"resume={run_dir}"])
    cfg.paths.output_dir = str(run_dir)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setLevel(logging.INFO)
    # The loggers whose lines the tests read, as a fresh process has them (an earlier test in
    # this worker may have left one quieter: seen once, the budget's lines all missing).
    names = ("seq2seq", "seq2seq.training", "seq2seq.training.callbacks", "train")
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg, lg.level, lg.disabled, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.NOTSET)
        lg.disabled, lg.propagate = False, True
    root = logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    try:
        summary = train(cfg)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        for lg, lg_level, disabled, propagate in saved:
            lg.setLevel(lg_level)
            lg.disabled, lg.propagate = disabled, propagate
    return {"run_dir": run_dir, "stopped": stopped, "summary": summary, "log": log.getvalue(),
            "cfg": cfg}  # fmt: skip


def test_a_budgeted_run_stopped_past_its_middle_resumes_as_it_would_have_gone_on(
    budgeted_resumed: dict,
) -> None:
    """The budget's decisions survive SIGTERM and `resume=RUN`: the cosine goes on down from
    where it was (not back up from the peak: the warmup's end is kept), dropout stays as the
    first validation decided (off, at its step), the validation clock counts from the resume
    (no validation at once), and the whole run, resume and test included, fits the budget."""
    from seq2seq.curves import read_metrics, training_time_at

    run_dir, summary, cfg = (budgeted_resumed[k] for k in ("run_dir", "summary", "cfg"))
    stopped_step, stopped_at, decided = budgeted_resumed["stopped"]
    assert stopped_at >= BUDGET_SECONDS / 2 and decided["dropout_off_at"] is not None, decided
    assert decided["warmup_end"] is not None  # the warmup (by the clock, 20%) was over

    before = learning_rates(run_dir / "csv" / "version_0" / "metrics.csv")
    after = learning_rates(run_dir / "csv" / "version_1" / "metrics.csv")
    # The decay goes on from where it stopped, down to its end at the new stop.
    assert after[0] <= before[-1] + 1e-12, (before[-3:], after[:3])
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(after))
    end = cfg.model.training.lr * 0.1
    assert end - 1e-12 <= after[-1] <= 2 * end, (after[-1], end)
    # Dropout stays as decided before the stop: not decided again after it.
    final_step, final_seconds, state = budget_state(Path(summary["last_checkpoint"]))
    assert (state["paced_at"], state["dropout_off_at"]) == (
        decided["paced_at"], decided["dropout_off_at"]
    )  # fmt: skip
    assert "is off from step" not in budgeted_resumed["log"]
    # The clock counts from the resume: the first validation after it comes an interval of
    # training later, or at the stop if that is nearer (which validates anyway).
    rows = read_metrics(run_dir)
    resumed = [r for r in rows if r["step"] >= stopped_step]
    validated = [r["step"] for r in resumed if "val/exact_match" in r]
    first = training_time_at(resumed, validated[:1])[0]
    interval = BUDGET_SECONDS / VALIDATIONS
    assert first - stopped_at >= 0.5 * min(interval, final_seconds - stopped_at), (
        first, stopped_at, final_seconds
    )  # fmt: skip
    assert final_step > stopped_step + 5
    # The whole run, the first start's training time included, and the test fit the budget.
    used = float(budgeted_resumed["log"].split("Time budget: used ")[1].split(" s")[0])
    assert used <= BUDGET_SECONDS, used


def test_replay_trains_a_budgeted_run_again_to_the_same_metrics_and_weights(
    budgeted_resumed: dict, tmp_path: Path, monkeypatch, capsys
) -> None:
    """`python train.py replay=RUN` on the budgeted run that was stopped and resumed: the
    clock's decisions come from RUN's record (every step's reading, the validations, dropout
    off, the stop), so every metric of every step and the final weights are RUN's, bit for bit,
    although this run's own clock (another pace: it runs alone, in this process) differs."""
    run_dir = budgeted_resumed["run_dir"]
    record = json.loads((run_dir / "clock.json").read_text())
    assert (
        record["ended_at"]
        == record["stopped_at"]
        == budget_state(run_dir / "checkpoints" / "last.ckpt")[0]
    )
    assert record["dropout_off_at"] == record["paced_at"] == record["validations"][0]
    assert record["warmup_ended_at"] < record["schedule_ended_at"] == record["stopped_at"]
    replayed = tmp_path / "replayed"
    args = [f"replay={run_dir}", f"hydra.run.dir={replayed}"]
    assert run_train_cli(args, tmp_path, monkeypatch) == 0, capsys.readouterr().err
    assert metrics_without_time(replayed) == metrics_without_time(run_dir)
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for run in (run_dir, replayed)
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    again = json.loads((replayed / "clock.json").read_text())
    assert {k: v for k, v in again.items() if k != "commit"} == {
        k: v for k, v in record.items() if k != "commit"
    }


def test_a_replay_that_cannot_repeat_its_run_is_refused_in_one_line(
    budgeted_resumed: dict, tmp_path: Path, monkeypatch, capsys
) -> None:
    """replay=RUN is refused before anything is written, in one line that says why and what to
    do: a run with no clock record (no budget, or made before), a run whose training did not
    end, a record of another version or not readable, a changed setting, train=false."""
    import shutil

    run = Path(shutil.copytree(budgeted_resumed["run_dir"], tmp_path / "budgeted"))
    clock = run / "clock.json"
    record = json.loads(clock.read_text())

    def refusal(*args: str) -> str:
        return refused([*args, f"hydra.run.dir={tmp_path / 'replayed'}"], run, monkeypatch, capsys)

    unclocked = Path(shutil.copytree(run, tmp_path / "unclocked"))
    (unclocked / "clock.json").unlink()  # as a run without a budget, or made before records
    assert "the run recorded no clock decisions" in refusal(f"replay={unclocked}")
    assert "is not a run directory" in refusal(f"replay={tmp_path / 'nowhere'}")
    changed = refusal(f"replay={run}", "model.training.lr=1e-2")
    assert "model.training.lr=0.01 differs from the replayed run (model.training.lr=" in changed
    assert "check out the commit the run was made at (" in changed  # the record names it
    assert "drop train=false" in refusal(f"replay={run}", "train=false")
    clock.write_text(json.dumps({**record, "ended_at": None}))
    assert f"did not end (its record stops at step {record['stopped_at']})" in refusal(
        f"replay={run}"
    )
    clock.write_text(json.dumps({**record, "version": 99}))
    assert "is version 99 of the record, this code reads version 1" in refusal(f"replay={run}")
    clock.write_text(json.dumps(record)[:100])
    assert "cannot be read" in refusal(f"replay={run}")


def test_a_run_its_budget_ended_resumes_with_a_longer_one_and_spends_it(
    budgeted_resumed: dict, tmp_path: Path, data_dir: Path
) -> None:
    """The budgeted run, ended by its 16 s budget, resumed with trainer.max_time of 22 s: it
    trains on (it is not over at once, nor started again) to within the new budget, and the
    schedule is the longer budget's: its cosine, from where 22 s put it, down to its end at the
    new stop."""
    import shutil

    run_dir = Path(shutil.copytree(budgeted_resumed["run_dir"], tmp_path / "run"))
    ended_step, ended_seconds, _ = budget_state(run_dir / "checkpoints" / "last.ckpt")
    longer = [*BUDGETED, "trainer.max_time=00:00:00:22", f"resume={run_dir}"]
    cfg = compose_train(tmp_path, data_dir, longer)
    cfg.paths.output_dir = str(run_dir)
    summary = train(cfg)
    step, seconds, _ = budget_state(Path(summary["last_checkpoint"]))
    assert step > ended_step + 5 and ended_seconds < seconds <= 22, (step, seconds)
    assert summary["test"]  # and it tested within the budget
    rates = learning_rates(sorted((run_dir / "csv").glob("version_*/metrics.csv"))[-1])
    floor = cfg.model.training.lr * 0.1  # min_lr_ratio
    assert max(rates) > 2 * floor  # back up the cosine to where the longer budget has it
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(rates[1:]))  # then down
    assert floor - 1e-12 <= rates[-1] <= 1.1 * floor, (rates[-1], floor)


def test_a_resume_never_reads_less_progress_than_its_checkpoint_recorded() -> None:
    """Resumed under the same budget the clock goes on from the progress the checkpoint had
    recorded, though the reserve (a tenth of the budget until the first validation) makes the
    same training time read as less: the learning rate never goes back up. Under a longer
    budget it reads the longer one's progress, which is less: the schedule is put back."""
    from types import SimpleNamespace

    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.lightning_fields import LightningTimer

    def resumed(budget: float) -> TimeBudget:
        callback = TimeBudget()
        callback.load_state_dict({"warmup_end": 0.2, "budget": 100.0, "progress": {10: 0.6}})
        timer = SimpleNamespace(time_elapsed=lambda stage: 45.0, _duration=budget)
        callback.start(LightningTimer(timer), SimpleNamespace(global_step=11))
        callback.on_train_start(None, SimpleNamespace(model=None))
        return callback

    assert resumed(100.0).progress() == 0.6  # 45 s of the 90 the reserve leaves: 0.5, not less
    assert resumed(120.0).progress() == pytest.approx(45 / 108)  # the longer budget's own
