"""The torch.compile check of tests/test_scale.py, as a script: a run with
model.training.compile=true and the same run eager, each a first training step; prints the two
losses and what dynamo captured, as JSON on its last line.

In one pytest process (`pytest -n 0`) conftest.py starts it in the background (niced, one
thread) as soon as the test is collected: cold, compiling the model's forward and backward with
inductor takes about 45 s on 2 cores, mostly one core of Python and g++, which one process of
tests leaves idle much of the time. With a worker per core (the default) no core is idle, and
the test's worker runs it when the test comes. Argument: a directory to work in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

OVERRIDES = [
    "data.corpus.train_size=256", "data.corpus.val_size=32", "data.corpus.test_size=32",
    "debug=fdr", "model.net.num_encoder_layers=1", "model.net.num_decoder_layers=1",
    "test=false", "trainer.limit_val_batches=0",
]  # fmt: skip


def main(work: Path) -> None:
    import torch
    from helpers import compose_train
    from torch._dynamo.utils import counters

    from seq2seq.training.module import Seq2SeqModule
    from train import train

    losses: list[float] = []
    original = Seq2SeqModule.model_step

    def model_step(self, batch):
        loss, logits = original(self, batch)
        if self.training:
            losses.append(loss.item())
        return loss, logits

    Seq2SeqModule.model_step = model_step
    train(compose_train(work / "eager", work / "data", OVERRIDES))
    torch._dynamo.reset()
    counters.clear()
    compiled = [*OVERRIDES, "model.training.compile=true"]
    train(compose_train(work / "compiled", work / "data", compiled))
    print(json.dumps({"losses": losses, "unique_graphs": counters["stats"]["unique_graphs"]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
