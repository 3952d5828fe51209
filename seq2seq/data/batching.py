"""The order of training examples, and how they are grouped into batches.

Both samplers draw a new order every epoch from (seed, epoch) alone, like DistributedSampler's
shuffle and unlike a generator carried from epoch to epoch: the order of any epoch can be
rebuilt from two numbers. With the count of items already given out, which the loader saves
in checkpoints through state_dict, a run resumed mid-epoch replays the rest of that epoch and
every later one exactly. Lightning calls set_epoch before each epoch. The seed defaults to the
run's (seed_everything); neither sampler draws from the global generator that dropout uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler


class _EpochOrder(Sampler):
    """What both samplers share: an epoch's items from (seed, epoch), resumable mid-epoch."""

    def __init__(self, seed: int | None) -> None:
        self.seed = torch.initial_seed() if seed is None else seed
        self.epoch = 0
        self.yielded = 0  # items given out in the current epoch
        self._resume_at = 0

    def _items(self, generator: torch.Generator) -> list[Any]:
        raise NotImplementedError

    def _epoch_items(self) -> list[Any]:
        return self._items(torch.Generator().manual_seed(self.seed + self.epoch))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        items = self._epoch_items()
        self.yielded, self._resume_at = self._resume_at, 0
        for item in items[self.yielded :]:
            self.yielded += 1
            yield item

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.seed, self._resume_at = state["epoch"], state["seed"], state["yielded"]


class EpochShuffle(_EpochOrder):
    """A random permutation of range(size), new every epoch; the loader batches it."""

    def __init__(self, size: int, seed: int | None = None) -> None:
        super().__init__(seed)
        self.size = size

    def _items(self, generator: torch.Generator) -> list[int]:
        return torch.randperm(self.size, generator=generator).tolist()

    def __len__(self) -> int:
        return self.size


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
    ) -> None:
        super().__init__(seed)
        if max_tokens is not None and max_tokens <= 0:
            raise ValueError(f"data.max_tokens must be positive (or null), got {max_tokens}")
        if pool_batches <= 0:
            raise ValueError(f"data.pool_batches must be positive, got {pool_batches}")
        self.lengths = torch.as_tensor(lengths, dtype=torch.long)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.pool_batches = pool_batches
        self._cache: tuple[tuple[int, int], list[list[int]]] | None = None

    def _items(self, generator: torch.Generator) -> list[list[int]]:
        key = (self.seed, self.epoch)
        if self._cache is None or self._cache[0] != key:  # __len__ and __iter__ share it
            self._cache = (key, self._batches(generator))
        return self._cache[1]

    def _batches(self, generator: torch.Generator) -> list[list[int]]:
        order = torch.randperm(len(self.lengths), generator=generator)
        pool = self.pool_batches * self.batch_size
        budget = self.max_tokens or float("inf")
        batches: list[list[int]] = []
        for chunk in order.split(pool):
            # A stable sort: equal lengths keep their shuffled order.
            chunk = chunk[torch.sort(self.lengths[chunk], stable=True).indices]
            batch: list[int] = []
            longest = 0
            for index, length in zip(chunk.tolist(), self.lengths[chunk].tolist(), strict=True):
                wider = max(longest, length)
                if batch and (len(batch) == self.batch_size or wider * (len(batch) + 1) > budget):
                    batches.append(batch)
                    batch, wider = [], length
                batch.append(index)
                longest = wider
            if batch:
                batches.append(batch)
        shuffle = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in shuffle]

    def __len__(self) -> int:
        return len(self._epoch_items())
