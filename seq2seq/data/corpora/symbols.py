"""Symbol tasks made from a seed: copy, reverse and sort sequences of symbols.

Each pair is two texts of whitespace-separated symbols, e.g. for `reverse`
``{"src": "3 9 4", "tgt": "4 9 3"}``. One config always yields the same data: the random
generator is seeded per split, and the validation and test sequences (drawn first, all
distinct) are kept out of the training set. The symbols are known in advance, so the task
brings its own tokenizers (one symbol a token) instead of having them fitted.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from datasets import DatasetDict

from seq2seq import checks
from seq2seq.data.corpora.common import SPLITS, generated_splits
from seq2seq.data.vocab import Vocabulary

TASKS: dict[str, Callable[[list[int]], list[int]]] = {
    "copy": lambda seq: list(seq),
    "reverse": lambda seq: seq[::-1],
    "sort": sorted,
}


def check_task(task: str, num_symbols: int, min_length: int, max_length: int) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown data.corpus.task {task!r}; choose one of {sorted(TASKS)}")
    if num_symbols < 2:
        raise ValueError(f"data.corpus.num_symbols must be at least 2, got {num_symbols}")
    if not 1 <= min_length <= max_length:
        raise ValueError(
            f"need 1 <= data.corpus.min_length <= max_length, got min_length={min_length} and "
            f"max_length={max_length}"
        )


def check_held_out(num_symbols: int, min_length: int, max_length: int, size: int) -> None:
    """At most half of the distinct sequences of each length may be held out."""
    capacity = sum(num_symbols**length // 2 for length in range(min_length, max_length + 1))
    if size > capacity:
        raise ValueError(
            f"data.corpus.val_size + test_size = {size} exceeds the {capacity} distinct "
            f"sequences that can be held out with num_symbols={num_symbols} and lengths "
            f"{min_length}..{max_length}; lower the sizes or raise num_symbols or max_length"
        )


def _draw(rng: random.Random, num_symbols: int, min_length: int, max_length: int) -> tuple:
    length = rng.randint(min_length, max_length)
    return tuple(rng.randrange(num_symbols) for _ in range(length))


def _held_out(
    num_symbols: int, min_length: int, max_length: int, size: int, seed: int
) -> list[tuple[int, ...]]:
    """`size` distinct sequences for validation and test.

    No more than half of the sequences of any one length are taken, so training still sees
    every length (with 10 symbols there are only 10 sequences of length 1).
    """
    check_held_out(num_symbols, min_length, max_length, size)
    rng = random.Random(f"held-out-{seed}")
    seen: set[tuple[int, ...]] = set()
    per_length: Counter[int] = Counter()
    out = []
    while len(out) < size:
        seq = _draw(rng, num_symbols, min_length, max_length)
        if seq in seen or per_length[len(seq)] >= num_symbols ** len(seq) // 2:
            continue
        seen.add(seq)
        per_length[len(seq)] += 1
        out.append(seq)
    return out


def generate(
    task: str,
    split: str,
    num_symbols: int,
    min_length: int,
    max_length: int,
    train_size: int,
    val_size: int,
    test_size: int,
    seed: int,
) -> Iterator[dict[str, str]]:
    """Yield the pairs of one split as {"src": text, "tgt": text}.

    A generator of plain values, as `datasets.Dataset.from_generator` wants: its fingerprint
    (and so the cache under data/) follows from these arguments alone.
    """
    check_task(task, num_symbols, min_length, max_length)
    fn = TASKS[task]
    held_out = _held_out(num_symbols, min_length, max_length, val_size + test_size, seed)
    if split == "validation":
        sequences = iter(held_out[:val_size])
    elif split == "test":
        sequences = iter(held_out[val_size:])
    elif split == "train":
        sequences = _train_sequences(
            set(held_out), num_symbols, min_length, max_length, train_size, seed
        )
    else:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    for seq in sequences:
        yield {"src": " ".join(map(str, seq)), "tgt": " ".join(map(str, fn(list(seq))))}


def _train_sequences(
    held_out: set[tuple[int, ...]],
    num_symbols: int,
    min_length: int,
    max_length: int,
    size: int,
    seed: int,
) -> Iterator[tuple[int, ...]]:
    rng = random.Random(f"train-{seed}")
    made = 0
    while made < size:
        seq = _draw(rng, num_symbols, min_length, max_length)
        if seq not in held_out:
            made += 1
            yield seq


class SymbolTask:
    """Copy, reverse or sort sequences of the symbols 0..num_symbols-1.

    Args:
        task: "copy", "reverse" or "sort".
        num_symbols: size of the symbol alphabet (the vocabulary adds 4 special tokens).
        min_length, max_length: sequence lengths, drawn uniformly.
        train_size, val_size, test_size: pairs per split; validation and test sequences are
            distinct and never occur in training.
        seed: the same seed always gives the same pairs.
    """

    def __init__(
        self,
        task: str = "copy",
        num_symbols: int = 10,
        min_length: int = 1,
        max_length: int = 10,
        train_size: int = 13000,
        val_size: int = 500,
        test_size: int = 1000,
        seed: int = 0,
    ) -> None:
        sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
        sizes |= {"num_symbols": num_symbols, "min_length": min_length, "max_length": max_length}
        for name, size in sizes.items():
            checks.integer(f"data.corpus.{name}", size, minimum=1)
        check_task(task, num_symbols, min_length, max_length)
        check_held_out(num_symbols, min_length, max_length, val_size + test_size)
        self.task = task
        self.num_symbols = num_symbols
        self.kwargs = dict(
            task=task, num_symbols=num_symbols, min_length=min_length, max_length=max_length,
            train_size=train_size, val_size=val_size, test_size=test_size, seed=seed,
        )  # fmt: skip

    def load(self, data_dir: Path) -> DatasetDict:
        return generated_splits(generate, data_dir, "symbols", **self.kwargs)

    def tokenizers(self) -> tuple[Vocabulary, Vocabulary]:
        """One symbol a token, the same vocabulary for source and target."""
        vocab = Vocabulary(str(i) for i in range(self.num_symbols))
        return vocab, vocab
