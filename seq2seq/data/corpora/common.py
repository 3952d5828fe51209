"""What every corpus shares: what a corpus is (Corpus, CorpusWithTokenizers, StreamedCorpus), the
split names,
datasets built from a generator with our own errors passed through (generated corpora and files
are cached this way), and the population split of the generated corpora (held-out items drawn
first)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from datasets import Dataset, DatasetDict

from seq2seq import checks

if TYPE_CHECKING:
    from seq2seq.data.corpora.blocks import LineBlocks
    from seq2seq.data.tokenizer import Tokenizer

SPLITS = ("train", "validation", "test")


@runtime_checkable
class Corpus(Protocol):
    """What data.corpus builds: text pairs by split. load() returns a DatasetDict with a
    "train" split and, where the corpus has them, "validation" and "test", each with string
    columns "src" and "tgt"; the data module splits off the splits that are missing."""

    def load(self, data_dir: Path) -> DatasetDict: ...


@runtime_checkable
class CorpusWithTokenizers(Corpus, Protocol):
    """A corpus whose tokens are fixed by what it is (the symbol tasks): the data module uses
    its tokenizers instead of fitting any, and refuses a data.tokenizer setting."""

    def tokenizers(self) -> tuple[Tokenizer, Tokenizer]: ...


@runtime_checkable
class StreamedCorpus(Corpus, Protocol):
    """A corpus whose training split is read as it trains, a block of lines at a time, never
    cached whole (ParallelFiles with data.corpus.streaming=true): load() gives its held-out
    splits alone, and train_stream() its training split's files by block."""

    def train_stream(self, data_dir: Path) -> LineBlocks: ...


def from_generator(generator: Callable, cache_dir: Path, **gen_kwargs: Any) -> Dataset:
    """Dataset.from_generator, with our own ValueErrors passed through unwrapped.

    datasets wraps any error of the generator in DatasetGenerationError; a bad file should
    read as its one-line message. Lists in gen_kwargs are shards to datasets (the generator
    would run once per element), so callers pass tuples.
    """
    if any(isinstance(value, list) for value in gen_kwargs.values()):
        raise TypeError("pass tuples, not lists, in gen_kwargs: datasets shards lists")
    from datasets.exceptions import DatasetGenerationError

    try:
        return Dataset.from_generator(
            generator, gen_kwargs=gen_kwargs, cache_dir=str(cache_dir), split="train"
        )
    except DatasetGenerationError as error:
        cause = error.__cause__
        while cause is not None and not isinstance(cause, ValueError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


def check_sizes(population: int, train_size: int, val_size: int, test_size: int, what: str):
    sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
    for name, size in sizes.items():
        checks.integer(f"data.corpus.{name}", size, minimum=1)
    if val_size + test_size > population // 2:
        raise ValueError(
            f"data.corpus.val_size + test_size = {val_size + test_size} exceeds half of the "
            f"{population} distinct {what}; lower the sizes or widen the range"
        )


def population_split(
    population: int, split: str, train_size: int, val_size: int, test_size: int, seed: int
) -> Iterator[int]:
    """Item numbers of one split. Validation and test items are distinct and drawn first; the
    training items are drawn (with repeats) from the rest, so no test item is ever trained on.
    """
    held_out = random.Random(f"held-out-{seed}").sample(range(population), val_size + test_size)
    if split == "validation":
        yield from held_out[:val_size]
    elif split == "test":
        yield from held_out[val_size:]
    elif split == "train":
        excluded = set(held_out)
        rng = random.Random(f"train-{seed}")
        made = 0
        while made < train_size:
            item = rng.randrange(population)
            if item not in excluded:
                made += 1
                yield item
    else:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")


def generated_splits(generator: Callable, data_dir: Path, name: str, **kwargs: Any) -> DatasetDict:
    cache_dir = Path(data_dir) / name
    return DatasetDict(
        {split: from_generator(generator, cache_dir, split=split, **kwargs) for split in SPLITS}
    )
