"""LightningDataModules: text pairs -> token ids (cached by HuggingFace datasets) -> batches.

Seq2SeqDataModule holds the batching: tokenizing the splits, the shifted decoder input,
dynamic padding and the loaders. TranslationDataModule (translation.py), the data module of
every task config, supplies the text splits and the tokenizers.
"""

from __future__ import annotations

import logging
import os
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import pyarrow as pa
import torch
from datasets import DatasetDict, Features, List, Value
from torch import Tensor
from torchdata.stateful_dataloader import StatefulDataLoader

from seq2seq import checks
from seq2seq.data.batching import BucketBatchSampler, EpochShuffle, InOrder
from seq2seq.data.phases import Phases
from seq2seq.data.text_splits import WRITER_BATCH
from seq2seq.data.tokenizer import Tokenizer

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
    # Padded as Python lists, then one tensor each: a tensor per example and pad_sequence took
    # 3.3 ms a batch of 64 (8% of a tiny model's training step), this takes 0.4 ms.

    def padded(rows: list[list[int]]) -> Tensor:
        width = max(map(len, rows), default=0)
        return torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], dtype=torch.long)

    return {
        "src": padded([list(e["src_ids"]) for e in examples]),
        "tgt_in": padded([[bos_id, *e["tgt_ids"]] for e in examples]),
        "labels": padded([[*e["tgt_ids"], eos_id] for e in examples]),
    }


# The tokenized splits' columns: ids as int32, half the cache of datasets' default int64 (10^6
# pairs: 151 rather than 286 MiB, as fast).
TOKENIZED = Features({
    "src_ids": List(Value("int32")), "tgt_ids": List(Value("int32")), "length": Value("int32"),
})  # fmt: skip
# Rows a tokenizing process is given at least. The tokenizers' own threads encode on every core,
# but converting rows to and from Python, half the time, runs on one: a process a core
# tokenizes 10^6 pairs in 25.4 s rather than 33.8 (bench/scale.py); a small split is not worth
# starting processes for.
PROCESS_ROWS = 100_000


def processes(rows: int) -> int | None:
    """How many processes tokenize a split of this many rows: one a core, each given at least
    PROCESS_ROWS; None (this process) for a small split."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = min(cores or 1, rows // PROCESS_ROWS)
    return count if count > 1 else None


def encode_texts(
    batch: dict[str, list[str]], src_vocab: Tokenizer, tgt_vocab: Tokenizer
) -> dict[str, list]:
    """Token ids of a batch of pairs, and each pair's padded length (its longer side, the
    target counting its <bos> or <eos>), which length bucketing sorts by."""
    src_ids = src_vocab.encode_batch(batch["src"])
    tgt_ids = tgt_vocab.encode_batch(batch["tgt"])
    lengths = [max(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)]
    return {"src_ids": src_ids, "tgt_ids": tgt_ids, "length": lengths}


class Seq2SeqDataModule(L.LightningDataModule):
    """Shared machinery; subclasses implement `load_splits` and set the two vocabularies.

    Args:
        batch_size: examples per batch (with bucketing: at most).
        num_workers: DataLoader worker processes (0 loads in the main process).
        data_dir: where HuggingFace datasets caches the generated and tokenized splits.
        pin_memory: pin host memory for faster copies to a GPU.
        bucket: batch training examples of similar length together (BucketBatchSampler).
        max_tokens: with bucket, the most padded tokens in a training batch (null: no limit).
        pool_batches: with bucket, how many batches' worth of examples are sorted together.
    """

    src_vocab: Tokenizer
    tgt_vocab: Tokenizer
    max_length: int  # the most tokens of a source or target, without <bos> and <eos>

    def __init__(
        self,
        batch_size: int,
        num_workers: int,
        data_dir: str,
        pin_memory: bool = False,
        bucket: bool = False,
        max_tokens: int | None = None,
        pool_batches: int = 50,
    ) -> None:
        super().__init__()
        checks.integer("data.batch_size", batch_size, minimum=1)
        checks.integer("data.num_workers", num_workers, minimum=0)
        if max_tokens is not None:
            checks.integer("data.max_tokens", max_tokens, minimum=1)
        checks.integer("data.pool_batches", pool_batches, minimum=1)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.data_dir = Path(data_dir)
        self.pin_memory = pin_memory
        self.bucket = bucket
        self.max_tokens = max_tokens
        self.pool_batches = pool_batches
        self.splits: DatasetDict | None = None
        # A streamed training split (data.corpus.streaming): its files by block; None: the
        # training split is in self.splits, cached whole.
        self.train_blocks: Any = None
        # The (source, target) tokenizers to use rather than fit (init_from: a checkpoint's).
        self.kept_tokenizers: tuple[Any, Any] | None = None
        self.phases = Phases()  # of the last preparation: bench/scale.py reads them

    @property
    def longest_sequence(self) -> int:
        """Positions the model needs: the longest source, or target with <bos> or <eos>."""
        return self.max_length + 1

    def load_splits(self) -> DatasetDict:
        """The text splits train, validation, test, each with "src" and "tgt" columns."""
        raise NotImplementedError

    def tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """The source and target tokenizers, which size the model: a symbol task's are
        fixed; the others' are fitted on the training split, so asking for them reads (or
        makes, once, into the cache) the data."""
        if self.splits is None:
            self.prepare_data()
        return self.src_vocab, self.tgt_vocab

    def prepare_data(self) -> None:
        # Fills the cache under data_dir once per node; Lightning calls it again at each stage.
        # Kept, so setup on this process does not read (and log) it all a second time.
        if self.splits is None:
            self.splits = self._prepared()

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self._prepared()

    def _prepared(self) -> DatasetDict:
        self.phases = Phases()
        splits = self._tokenized()
        # Arrow keeps what it freed for reuse (the text splits' row indices, 0.1 GiB at 10^7
        # pairs), which training never asks for again: given back, as bench/scale.py measures.
        pa.default_memory_pool().release_unused()
        log.info("Data ready in %s", self.phases.summary())
        return splits

    def _tokenized(self) -> DatasetDict:
        text = self.load_splits()
        with self.phases("tokenize"):
            # A module-level function with plain arguments: datasets fingerprints (hashes) what
            # it is given, and a closure over self would drag the whole trainer and model along.
            return DatasetDict({
                split: dataset.map(
                    encode_texts,
                    batched=True,
                    fn_kwargs={"src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab},
                    remove_columns=["src", "tgt"],
                    features=TOKENIZED,
                    batch_size=WRITER_BATCH,
                    writer_batch_size=WRITER_BATCH,
                    num_proc=processes(len(dataset)),
                    desc=f"tokenizing {split}",
                )
                for split, dataset in text.items()
            })  # fmt: skip

    def _loader(self, split: str, shuffle: bool, whole: bool = False) -> StatefulDataLoader:
        """A DataLoader that can save where it is in an epoch (and its shuffle order), so
        Lightning resumes a run stopped mid-epoch at the very next batch. Under DDP each
        process gets its share of the split, or with whole=True all of it."""
        if self.splits is None:
            self.setup()
        assert self.splits is not None
        v = self.tgt_vocab
        trainer = None if whole else self.trainer  # set once Lightning runs this module
        shard = {
            "num_replicas": trainer.world_size if trainer else 1,
            "rank": trainer.global_rank if trainer else 0,
        }
        pad = partial(collate, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id)
        if split == "train" and shuffle:
            pad = self._training_collate(pad)
        if split == "train" and self.train_blocks is not None:
            return self._stream_loader(pad, shard)
        dataset = self.splits[split]
        if shuffle and self.bucket:
            batch_sampler = BucketBatchSampler(
                dataset.with_format("arrow")["length"].to_numpy(),
                self.batch_size,
                self.max_tokens,
                self.pool_batches,
                **shard,
            )
            batching: dict[str, Any] = {"batch_sampler": batch_sampler}
        else:
            sampler = (EpochShuffle if shuffle else InOrder)(len(dataset), **shard)
            batching = {"batch_size": self.batch_size, "sampler": sampler}
        return self._stateful_loader(dataset, pad, **batching)

    def _training_collate(self, pad: Any) -> Any:
        """The training batches' collate: pad itself, unless a subclass regularises them."""
        return pad

    def _stream_loader(self, pad: Any, shard: dict[str, int]) -> StatefulDataLoader:
        """The streamed training batches (seq2seq/data/stream.py): the stream batches itself,
        so the loader takes its batches as they come (batch_size=None). Seeded as the
        samplers are, by the run's seed (seed_everything); one batch ahead, as Lightning
        fetches it (StreamBatches' `ahead`)."""
        from seq2seq.data.stream import StreamBatches

        def encode(src: list[str], tgt: list[str]) -> tuple[list, list]:
            return self.src_vocab.encode_batch(src), self.tgt_vocab.encode_batch(tgt)

        stream = StreamBatches(
            self.train_blocks, encode, pad, self.max_length, self.batch_size, self.max_tokens,
            self.pool_batches, self.bucket, seed=torch.initial_seed(), **shard, ahead=1,
        )  # fmt: skip
        return self._stateful_loader(stream, None, batch_size=None)

    def _stateful_loader(self, dataset: Any, pad: Any, **batching: Any) -> StatefulDataLoader:
        with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch function
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            return StatefulDataLoader(
                dataset,
                **batching,
                collate_fn=pad,
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

    def whole_loader(self, split: str) -> StatefulDataLoader:
        """The split in order, all of it in every process (the search's pick reads it)."""
        return self._loader(split, shuffle=False, whole=True)
