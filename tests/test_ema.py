"""The exponential moving average of the weights (callbacks=ema, Lightning's EMAWeightAveraging):
a run's checkpoints hold the average that the formula gives from the weights of every step, and
the trained weights beside it; validation and the test score the average."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import lightning as L
import pytest
import torch
from helpers import compose_train

from train import train

DECAY = 0.9
RUN = [
    "experiment=reverse", "data.corpus.train_size=256", "data.corpus.val_size=32",
    "data.corpus.test_size=32", "data.batch_size=32", "trainer.max_epochs=2",
    "callbacks=ema", f"callbacks.ema.decay={DECAY}",
    "+callbacks.step_weights._target_=test_ema.StepWeights",
]  # fmt: skip


class StepWeights(L.Callback):
    """The module's weights after every optimizer step, in order."""

    seen: ClassVar[list[dict[str, torch.Tensor]]] = []

    def on_train_batch_end(self, trainer, module, *args) -> None:
        StepWeights.seen.append({k: v.detach().clone() for k, v in module.state_dict().items()})


def test_checkpoints_hold_the_moving_average_of_every_steps_weights_and_the_weights(
    tmp_path: Path, data_dir: Path
) -> None:
    StepWeights.seen = []
    summary = train(compose_train(tmp_path, data_dir, RUN))
    steps = StepWeights.seen
    assert len(steps) == 16  # 8 batches an epoch, 2 epochs
    average = dict(steps[0])  # the first update copies the weights
    for weights in steps[1:]:
        average = {k: DECAY * average[k] + (1 - DECAY) * w for k, w in weights.items()}
    last = torch.load(summary["last_checkpoint"], weights_only=True, map_location="cpu")
    assert last["global_step"] == 16 and int(last["averaging_state"]["n_averaged"]) == 16
    for name, expected in average.items():
        torch.testing.assert_close(last["state_dict"][name], expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(last["current_model_state"][name], steps[-1][name]), name
    # The average is not the weights: a decay of 0.9 over 16 steps lags them.
    moved = [n for n in average if not torch.allclose(average[n], steps[-1][n], atol=1e-4)]
    assert moved, "the average equals the last weights"


def test_a_decay_out_of_range_and_averaging_checkpoints_too_are_refused(
    tmp_path: Path, data_dir: Path
) -> None:
    cfg = compose_train(tmp_path, data_dir, [*RUN[:-1], "average_last=2"])
    with pytest.raises(ValueError, match=r"^average_last=2 would average the trained weights .* "
                       r"set average_last=0 with callbacks=ema$"):  # fmt: skip
        train(cfg)
    cfg = compose_train(tmp_path, data_dir, [*RUN[:-1], "callbacks.ema.decay=1.5"])
    with pytest.raises(
        ValueError, match=r"^callbacks.ema.decay must be a number in \(0, 1\), got 1.5$"
    ):
        train(cfg)
