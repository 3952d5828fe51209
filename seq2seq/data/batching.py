"""The order of training examples, and how they are grouped into batches.

Both samplers draw a new order every epoch from (seed, epoch) alone, like DistributedSampler's
shuffle and unlike a generator carried from epoch to epoch: the order of any epoch can be
rebuilt from two numbers. With the count of items already given out, which the loader saves
in checkpoints through state_dict, a run resumed mid-epoch replays the rest of that epoch and
every later one exactly. Lightning calls set_epoch before each epoch. The seed defaults to the
run's (seed_everything); neither sampler draws from the global generator that dropout uses.

Under data parallelism each process takes every num_replicas-th item of the same epoch order,
and every process must get as many as the others (each step's gradients are averaged over all
of them). Length buckets even the count of batches out by halving the largest batches, so each
training pair is seen once an epoch, on one process; an order of single examples (EpochShuffle,
InOrder) is padded by repeating its first items, as DistributedSampler does. The samplers
shard themselves because Lightning cannot inject its DistributedSampler into a batch sampler;
the trainer configs set use_distributed_sampler=false.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from seq2seq import checks

INT32_MAX = 2**31 - 1


class _EpochOrder(Sampler):
    """What the samplers share: an epoch's items from (seed, epoch), this process's share of
    them, resumable mid-epoch."""

    def __init__(self, seed: int | None, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got {rank} and {num_replicas}")
        self.num_replicas, self.rank = num_replicas, rank
        self.seed = torch.initial_seed() if seed is None else seed
        self.epoch = 0
        self.yielded = 0  # items given out in the current epoch
        self._resume_at = 0

    def _items(self, generator: torch.Generator) -> Any:
        """The epoch's items: an array of example numbers, or a list of batches (arrays).
        Arrays, not Python lists: an epoch of 10 million examples as a list of ints held
        hundreds of MB for the whole epoch (bench/scale.py)."""
        raise NotImplementedError

    def _epoch_items(self) -> Any:
        items = self._items(torch.Generator().manual_seed(self.seed + self.epoch))
        if self.num_replicas == 1:
            return items
        short = -len(items) % self.num_replicas
        if isinstance(items, np.ndarray):
            items = np.concatenate([items, np.resize(items, short)])
        else:
            items = repeated_to(items, self.num_replicas)
        return items[self.rank :: self.num_replicas]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        items = self._epoch_items()
        self.yielded, self._resume_at = self._resume_at, 0
        for item in items[self.yielded :]:
            self.yielded += 1
            yield item.tolist()  # a plain int, or a batch's list of ints

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.seed, self._resume_at = state["epoch"], state["seed"], state["yielded"]


class EpochShuffle(_EpochOrder):
    """A random permutation of range(size), new every epoch; the loader batches it."""

    def __init__(
        self, size: int, seed: int | None = None, num_replicas: int = 1, rank: int = 0
    ) -> None:
        super().__init__(seed, num_replicas, rank)
        self.size = size

    def _items(self, generator: torch.Generator) -> np.ndarray:
        # int32 where it holds every number (the same permutation as int64's): an epoch's order
        # of 10^7 examples is 40 MB rather than 80 for the whole epoch.
        dtype = torch.int32 if self.size <= INT32_MAX else torch.int64
        return torch.randperm(self.size, generator=generator, dtype=dtype).numpy()

    def __len__(self) -> int:
        return -(-self.size // self.num_replicas)


class InOrder(EpochShuffle):
    """range(size) in order (validation and test), this process's share of it."""

    def _items(self, generator: torch.Generator) -> np.ndarray:
        return np.arange(self.size, dtype=np.int32 if self.size <= INT32_MAX else np.int64)


class BucketBatchSampler(_EpochOrder):
    """Batches of examples of similar length, under a budget of padded tokens.

    Each epoch: shuffle all examples, cut the order into pools of pool_batches * batch_size
    examples, sort each pool by length, fill batches greedily while the batch holds at most
    batch_size examples and its padded size (examples x longest) stays within max_tokens,
    then shuffle the batches. Sorting within large shuffled pools (fairseq's and tensor2tensor's
    recipe) keeps padding low on real text while every batch stays a random draw of its
    length range. An example longer than max_tokens alone gets a batch of its own.

    Args:
        lengths: per example, the padded length it needs (its longer side).
        batch_size: most examples in a batch.
        max_tokens: most padded tokens in a batch (None: batch_size alone decides).
        pool_batches: batches' worth of examples sorted together.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        max_tokens: int | None = None,
        pool_batches: int = 50,
        seed: int | None = None,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        # Lightning sets the epoch through batch_sampler.sampler.set_epoch and never calls a
        # batch sampler's own; this sampler holds the epoch (and is the unsharded order).
        self.sampler = EpochShuffle(len(lengths), seed)
        super().__init__(self.sampler.seed, num_replicas, rank)
        if max_tokens is not None:
            checks.integer("data.max_tokens", max_tokens, minimum=1)
        checks.integer("data.pool_batches", pool_batches, minimum=1)
        self.lengths = np.asarray(lengths)  # as given: the tokenized column's int32
        if self.lengths.dtype.kind not in "iu":
            raise ValueError(
                f"lengths must be integers (each pair's padded tokens), got {self.lengths.dtype}"
            )
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.pool_batches = pool_batches
        self._cache: tuple[tuple[int, int], list[np.ndarray]] | None = None

    @property  # type: ignore[override]
    def epoch(self) -> int:
        return self.sampler.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.sampler.epoch = epoch

    def _items(self, generator: torch.Generator) -> list[np.ndarray]:
        key = (self.seed, self.epoch)
        if self._cache is None or self._cache[0] != key:  # __len__ and __iter__ share it
            self._cache = (key, self._batches(generator))
        return self._cache[1]

    def _batches(self, generator: torch.Generator) -> list[np.ndarray]:
        order = self.sampler._items(generator)
        pool = self.pool_batches * self.batch_size
        batches: list[np.ndarray] = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            # A stable sort: equal lengths keep their shuffled order.
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += np.split(
                chunk,
                batch_starts(self.lengths[chunk].tolist(), self.batch_size, self.max_tokens)[1:],
            )
        shuffle = torch.randperm(len(batches), generator=generator).tolist()
        return evened([batches[i] for i in shuffle], self.num_replicas)

    def __len__(self) -> int:
        return len(self._epoch_items())


def repeated_to(items: list, num_replicas: int) -> list:
    """items, its first ones repeated until they are a multiple of num_replicas in number (as
    DistributedSampler pads), so every process gets as many."""
    short = -len(items) % num_replicas
    return items + (items * (short // max(len(items), 1) + 1))[:short]


def evened(batches: list, num_replicas: int) -> list:
    """Batches a multiple of num_replicas in number: the largest (the first of equal sizes)
    halved in place, as many as are short, so no example is given out twice and none is left
    out. (Too few examples to halve: the batches as they are.)"""
    short = -len(batches) % num_replicas
    sizes = np.array([len(b) for b in batches])
    if short == 0 or (sizes > 1).sum() < short:
        return batches
    halve = set(np.argsort(-sizes, kind="stable")[:short].tolist())
    out: list = []
    for index, batch in enumerate(batches):
        out += np.array_split(batch, 2) if index in halve else [batch]
    return out


def batch_starts(ascending: list[int], batch_size: int, max_tokens: int | None) -> list[int]:
    """Where each batch starts in lengths sorted ascending, filled greedily: a batch takes the
    next example while it holds fewer than batch_size and (examples + 1) x that example's
    length (its padded size with it) stays within max_tokens, and always takes its first.
    Sorted ascending, both limits only tighten as a batch grows, so a batch's size is found by
    bisection: a few steps a batch, not one an example (10 million examples: 2.9 s an epoch,
    not 8.0)."""
    budget = max_tokens or float("inf")
    starts, at = [], 0
    while at < len(ascending):
        starts.append(at)
        fits, most = 1, min(batch_size, len(ascending) - at)
        while fits < most:
            middle = (fits + most + 1) // 2
            if ascending[at + middle - 1] * middle <= budget:
                fits = middle
            else:
                most = middle - 1
        at += fits
    return starts
