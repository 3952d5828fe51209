"""Every reported score is the model's: the test after fit scores exactly the weights of the
checkpoint the summary names as tested, for every callbacks option (the default, a moving
average, an average of the last validations, the search picked on validation), which a fresh
evaluation of that checkpoint (train=false ckpt_path=...) shows. And every run that trained
ends with a checkpoint of its last step, validated or not, which resume=RUN continues."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import compose_train, same_scores

from train import train

RUN = [
    "experiment=reverse", "data.corpus.train_size=256", "data.corpus.val_size=32",
    "data.corpus.test_size=64", "data.batch_size=32", "trainer.max_epochs=2", "logger=none",
]  # fmt: skip

OPTIONS = {
    "default": [],
    "ema": ["callbacks=ema", "callbacks.ema.decay=0.9"],
    "average_last": ["average_last=2", "trainer.val_check_interval=4"],
    "pick_search": ["pick_search.beam_sizes=[1,2]"],
}


def checkpoint_tested(summary: dict) -> str:
    return summary["averaged_checkpoint"] or summary["best_checkpoint"]


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_summarys_test_scores_are_a_fresh_evaluation_of_the_checkpoint_tested(
    option: str, tmp_path: Path, data_dir: Path
) -> None:
    """With callbacks=ema the tested checkpoint holds the average and the trained weights:
    the test scores the average, which the same checkpoint with its trained weights put in
    place of the average does not (a decay of 0.9 over 16 steps lags them measurably)."""
    summary = train(compose_train(tmp_path / "run", data_dir, [*RUN, *OPTIONS[option]]))
    tested = checkpoint_tested(summary)
    assert tested and Path(tested).is_file()
    again = [*RUN, "train=false", f"ckpt_path={tested}"]
    fresh = train(compose_train(tmp_path / "eval", data_dir, again))
    assert summary["test"] and same_scores(fresh["test"], summary["test"]), option
    if option != "ema":
        return
    checkpoint = torch.load(tested, weights_only=True)
    checkpoint["state_dict"] = checkpoint.pop("current_model_state")
    checkpoint.pop("averaging_state")
    trained = tmp_path / "trained-weights.ckpt"
    torch.save(checkpoint, trained)
    again = [*RUN, "train=false", f"ckpt_path={trained}"]
    evaluated = train(compose_train(tmp_path / "trained", data_dir, again))
    loss, trained_loss = summary["test"]["test/loss"], evaluated["test"]["test/loss"]
    assert abs(trained_loss - loss) > 1e-3 * loss, (loss, trained_loss)


def test_a_run_shorter_than_its_first_validation_ends_with_its_last_checkpoint(
    tmp_path: Path, data_dir: Path, caplog
) -> None:
    """3 steps, no validation: last.ckpt holds step 3, the summary says no checkpoint was
    ranked best and tests last.ckpt; resume=RUN continues it to step 6. With callbacks=ema
    that checkpoint holds the average and the trained weights beside it, as the others do."""
    short = [*RUN, "trainer.max_steps=3", "callbacks=ema", "callbacks.ema.decay=0.5"]
    summary = train(compose_train(tmp_path, data_dir, short))
    last = Path(summary["run_dir"]) / "checkpoints" / "last.ckpt"
    assert summary["best_checkpoint"] is None and summary["last_checkpoint"] == str(last)
    assert "No validation ranked a checkpoint best" in caplog.text
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == 3 and int(saved["averaging_state"]["n_averaged"]) == 3
    differ = [k for k, v in saved["state_dict"].items()
              if not torch.equal(v, saved["current_model_state"][k])]  # fmt: skip
    assert differ, "the average is the trained weights"
    fresh = train(compose_train(tmp_path / "eval", data_dir,
                                [*RUN, "train=false", f"ckpt_path={last}"]))  # fmt: skip
    assert same_scores(fresh["test"], summary["test"])
    longer = [*short[:-3], "trainer.max_steps=6", "callbacks=ema", "callbacks.ema.decay=0.5",
              f"resume={summary['run_dir']}"]  # fmt: skip
    train(compose_train(tmp_path, data_dir, longer))
    assert torch.load(last, weights_only=True)["global_step"] == 6
