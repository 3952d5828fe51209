"""Padding with and without length bucketing, on a translation task's training split.

    python bench/padding.py                          # numbers (en -> de), docs/data.md's figures
    python bench/padding.py data=dates
    python bench/padding.py data=parallel_files data.corpus.train.file=pairs.tsv

Takes the same Hydra overrides as train.py. For one epoch of training batches it prints the
fraction of padded positions (source and decoder input together), the batches per epoch and
the mean padded tokens per batch, with `data.bucket` true (length-bucketed batches under
`data.max_tokens`) and false (shuffled batches of `data.batch_size`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import environment, print_table  # noqa: E402


def epoch_padding(overrides: list[str]) -> tuple[float, int, float]:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    cfg.data.data_dir = str(ROOT / "data" / "cache")
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")
    pad = datamodule.tgt_vocab.pad_id
    padded = positions = batches = 0
    for batch in datamodule.train_dataloader():
        for name in ("src", "tgt_in"):
            positions += batch[name].numel()
            padded += int((batch[name] == pad).sum())
        batches += 1
    return padded / positions, batches, positions / batches


def main() -> None:
    overrides = sys.argv[1:] or ["data=numbers"]
    rows = []
    for bucket in ("true", "false"):
        fraction, batches, tokens = epoch_padding([*overrides, f"data.bucket={bucket}"])
        rows.append([bucket, f"{fraction:.1%}", batches, f"{tokens:.0f}"])
    print(environment())
    print("overrides:", " ".join(overrides))
    print_table(["data.bucket", "padding", "batches/epoch", "positions/batch"], rows)


if __name__ == "__main__":
    main()
