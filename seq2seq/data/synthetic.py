"""Synthetic tasks made from a seed: copy, reverse and sort sequences of symbols.

Each example is a pair of texts of whitespace-separated symbols, e.g. for `reverse`
``{"src": "3 9 4", "tgt": "4 9 3"}``. One config always yields the same data: the random
generator is seeded per split, and the validation and test sequences (drawn first, all
distinct) are kept out of the training set.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator

TASKS: dict[str, Callable[[list[int]], list[int]]] = {
    "copy": lambda seq: list(seq),
    "reverse": lambda seq: seq[::-1],
    "sort": sorted,
}
SPLITS = ("train", "validation", "test")


def check_task(task: str, num_symbols: int, min_len: int, max_len: int) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASKS)}")
    if num_symbols < 2:
        raise ValueError(f"num_symbols must be at least 2, got {num_symbols}")
    if not 1 <= min_len <= max_len:
        raise ValueError(
            f"need 1 <= min_len <= max_len, got min_len={min_len} and max_len={max_len}"
        )


def check_held_out(num_symbols: int, min_len: int, max_len: int, size: int) -> None:
    """At most half of the distinct sequences of each length may be held out."""
    capacity = sum(num_symbols**length // 2 for length in range(min_len, max_len + 1))
    if size > capacity:
        raise ValueError(
            f"data.val_size + data.test_size = {size} exceeds the {capacity} distinct sequences "
            f"that can be held out with num_symbols={num_symbols} and lengths "
            f"{min_len}..{max_len}; lower the sizes or raise num_symbols or max_len"
        )


def _draw(rng: random.Random, num_symbols: int, min_len: int, max_len: int) -> tuple[int, ...]:
    length = rng.randint(min_len, max_len)
    return tuple(rng.randrange(num_symbols) for _ in range(length))


def _held_out(
    num_symbols: int, min_len: int, max_len: int, size: int, seed: int
) -> list[tuple[int, ...]]:
    """`size` distinct sequences for validation and test.

    No more than half of the sequences of any one length are taken, so training still sees
    every length (with 10 symbols there are only 10 sequences of length 1).
    """
    check_held_out(num_symbols, min_len, max_len, size)
    rng = random.Random(f"held-out-{seed}")
    seen: set[tuple[int, ...]] = set()
    per_length: Counter[int] = Counter()
    out = []
    while len(out) < size:
        seq = _draw(rng, num_symbols, min_len, max_len)
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
    min_len: int,
    max_len: int,
    train_size: int,
    val_size: int,
    test_size: int,
    seed: int,
) -> Iterator[dict[str, str]]:
    """Yield the examples of one split as {"src": text, "tgt": text}.

    A generator of plain values, as `datasets.Dataset.from_generator` wants: its fingerprint
    (and so the cache under data/) follows from these arguments alone.
    """
    check_task(task, num_symbols, min_len, max_len)
    fn = TASKS[task]
    held_out = _held_out(num_symbols, min_len, max_len, val_size + test_size, seed)
    if split == "validation":
        sequences = iter(held_out[:val_size])
    elif split == "test":
        sequences = iter(held_out[val_size:])
    elif split == "train":
        sequences = _train_sequences(set(held_out), num_symbols, min_len, max_len, train_size, seed)
    else:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    for seq in sequences:
        yield {"src": " ".join(map(str, seq)), "tgt": " ".join(map(str, fn(list(seq))))}


def _train_sequences(
    held_out: set[tuple[int, ...]],
    num_symbols: int,
    min_len: int,
    max_len: int,
    size: int,
    seed: int,
) -> Iterator[tuple[int, ...]]:
    rng = random.Random(f"train-{seed}")
    made = 0
    while made < size:
        seq = _draw(rng, num_symbols, min_len, max_len)
        if seq not in held_out:
            made += 1
            yield seq
