"""LightningDataModules: text pairs -> token ids (cached by HuggingFace datasets) -> batches.

Seq2SeqDataModule holds what every task shares: tokenizing the splits, the shifted decoder
input, dynamic padding and the loaders. A task supplies its text splits and vocabularies.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets import Dataset, DatasetDict
from torch import Tensor
from torch.utils.data import Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from seq2seq.data.synthetic import SPLITS, check_held_out, check_task, generate
from seq2seq.data.vocab import Vocabulary

log = logging.getLogger(__name__)

Batch = dict[str, Tensor]


def collate(examples: list[dict[str, Any]], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Pad a list of tokenized examples to the longest in the batch.

    The decoder reads BOS + target and learns to predict target + EOS, one step ahead.
    With <pad>=0, <bos>=1, <eos>=2 and a target "4 9 3" tokenized as [8, 13, 7]:

        tgt_in = [1, 8, 13, 7]    # <bos> 4 9 3     (what the decoder sees)
        labels = [8, 13, 7, 2]    #  4  9 3 <eos>   (what it must predict at each position)

    Shorter rows are padded with pad_id, which the model masks and the loss ignores.

    Returns:
        src (B, S), tgt_in (B, T), labels (B, T), all int64.
    """
    src = [torch.tensor(e["src_ids"]) for e in examples]
    tgt = [torch.tensor(e["tgt_ids"]) for e in examples]
    bos, eos = torch.tensor([bos_id]), torch.tensor([eos_id])
    pad = partial(torch.nn.utils.rnn.pad_sequence, batch_first=True, padding_value=pad_id)
    return {
        "src": pad(src),
        "tgt_in": pad([torch.cat([bos, t]) for t in tgt]),
        "labels": pad([torch.cat([t, eos]) for t in tgt]),
    }


def encode_pair(
    example: dict[str, str], src_vocab: Vocabulary, tgt_vocab: Vocabulary
) -> dict[str, list[int]]:
    return {
        "src_ids": src_vocab.encode(example["src"]),
        "tgt_ids": tgt_vocab.encode(example["tgt"]),
    }


class EpochShuffle(Sampler[int]):
    """A new random order every epoch that depends only on (seed, epoch).

    Like DistributedSampler's shuffle, and unlike a generator carried from epoch to epoch, the
    order of any epoch can be rebuilt from two numbers; with the count of indices already
    given out, which the loader checkpoints with its state, a run resumed mid-epoch replays
    the rest of that epoch and every later one exactly. Lightning calls set_epoch before each
    epoch. The seed defaults to the run's (seed_everything); the shuffle never draws from the
    global generator that dropout uses.
    """

    def __init__(self, size: int, seed: int | None = None) -> None:
        self.size = size
        self.seed = torch.initial_seed() if seed is None else seed
        self.epoch = 0
        self.yielded = 0  # indices given out in the current epoch
        self._resume_at = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        self.yielded, self._resume_at = self._resume_at, 0
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index

    def __len__(self) -> int:
        return self.size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.seed, self._resume_at = state["epoch"], state["seed"], state["yielded"]


class Seq2SeqDataModule(L.LightningDataModule):
    """Shared machinery; subclasses implement `load_splits` and set the two vocabularies.

    Args:
        batch_size: examples per batch.
        num_workers: DataLoader worker processes (0 loads in the main process).
        data_dir: where HuggingFace datasets caches the generated and tokenized splits.
        pin_memory: pin host memory for faster copies to a GPU.
    """

    src_vocab: Vocabulary
    tgt_vocab: Vocabulary

    def __init__(
        self, batch_size: int, num_workers: int, data_dir: str, pin_memory: bool = False
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"data.batch_size must be a positive integer, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be 0 or more, got {num_workers}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.data_dir = Path(data_dir)
        self.pin_memory = pin_memory
        self.splits: DatasetDict | None = None

    def load_splits(self) -> DatasetDict:
        """The text splits train, validation, test, each with "src" and "tgt" columns."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        # Fills the cache under data_dir once per node; Lightning calls it again at each stage.
        if self.splits is None:
            self._tokenized()

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self._tokenized()

    def _tokenized(self) -> DatasetDict:
        # A module-level function with plain arguments: datasets fingerprints (hashes) what it
        # is given, and a closure over self would drag the whole trainer and model along.
        return self.load_splits().map(
            encode_pair,
            fn_kwargs={"src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab},
            remove_columns=["src", "tgt"],
            desc="tokenizing",
        )

    def _loader(self, split: str, shuffle: bool) -> StatefulDataLoader:
        """A DataLoader that can save where it is in an epoch (and its shuffle order), so
        Lightning resumes a run stopped mid-epoch at the very next batch."""
        if self.splits is None:
            self.setup()
        assert self.splits is not None
        v = self.tgt_vocab
        sampler = EpochShuffle(len(self.splits[split])) if shuffle else None
        with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch function
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            return StatefulDataLoader(
                self.splits[split],
                batch_size=self.batch_size,
                sampler=sampler,
                collate_fn=partial(collate, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id),
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                persistent_workers=self.num_workers > 0,
            )

    def train_dataloader(self) -> StatefulDataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> StatefulDataLoader:
        return self._loader("validation", shuffle=False)

    def test_dataloader(self) -> StatefulDataLoader:
        return self._loader("test", shuffle=False)


class SyntheticDataModule(Seq2SeqDataModule):
    """Copy, reverse or sort sequences of symbols 0..num_symbols-1 (see data/synthetic.py).

    Args:
        task: "copy", "reverse" or "sort".
        num_symbols: size of the symbol alphabet (the vocabulary adds 4 special tokens).
        min_len, max_len: sequence lengths, drawn uniformly.
        train_size, val_size, test_size: examples per split; validation and test sequences are
            distinct and never occur in training.
        seed: the data's seed; the same seed always gives the same data.
        batch_size, num_workers, data_dir, pin_memory: as in Seq2SeqDataModule.
    """

    def __init__(
        self,
        task: str,
        num_symbols: int,
        min_len: int,
        max_len: int,
        train_size: int,
        val_size: int,
        test_size: int,
        seed: int,
        batch_size: int,
        num_workers: int,
        data_dir: str,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, data_dir, pin_memory)
        check_task(task, num_symbols, min_len, max_len)
        sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
        for name, size in sizes.items():
            if size <= 0:
                raise ValueError(f"data.{name} must be a positive integer, got {size}")
        check_held_out(num_symbols, min_len, max_len, val_size + test_size)
        self.task = task
        self.generator_kwargs = dict(
            task=task, num_symbols=num_symbols, min_len=min_len, max_len=max_len,
            train_size=train_size, val_size=val_size, test_size=test_size, seed=seed,
        )  # fmt: skip
        self.max_len = max_len
        self.src_vocab = self.tgt_vocab = Vocabulary(str(i) for i in range(num_symbols))

    def load_splits(self) -> DatasetDict:
        cache_dir = str(self.data_dir / "synthetic")
        return DatasetDict(
            {
                split: Dataset.from_generator(
                    generate,
                    gen_kwargs={**self.generator_kwargs, "split": split},
                    cache_dir=cache_dir,
                    split=split,
                )
                for split in SPLITS
            }
        )
