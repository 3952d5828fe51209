"""A Lightning callback for tests/test_scale.py's DDP run: at each training epoch's end, every
process writes what its training loader gave out that epoch (the example numbers of its share,
and whether it gave out all of them) and how its data were prepared (the phases, a digest of
its tokenized training split), to $SHARD_RECORD_DIR/rank{R}-epoch{E}.json. Given to train.py as
`+callbacks.shard_record._target_=shard_record.ShardRecord`, with tests/ on PYTHONPATH."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import lightning as L


def split_digest(dataset) -> str:
    """A digest of a tokenized split's ids and lengths, in order."""
    table = dataset.with_format("arrow")[:]
    digest = hashlib.sha256()
    for name in ("src_ids", "tgt_ids", "length"):
        digest.update(json.dumps(table[name].to_pylist()).encode())
    return digest.hexdigest()


class ShardRecord(L.Callback):
    def on_train_epoch_end(self, trainer, module) -> None:
        sampler = trainer.train_dataloader.batch_sampler
        batches = sampler._epoch_items()
        datamodule = trainer.datamodule
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "examples": [i for batch in batches for i in batch.tolist()],
            "batches": len(batches),
            "gave_out_all": sampler.yielded == len(batches),
            "phases": list(datamodule.phases.timings),
            "train_size": len(datamodule.splits["train"]),
            "train_digest": split_digest(datamodule.splits["train"]),
        }
        out = Path(os.environ["SHARD_RECORD_DIR"])
        name = f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.json"
        (out / name).write_text(json.dumps(record))
