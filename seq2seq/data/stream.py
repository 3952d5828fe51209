"""The training batches of a streamed corpus (data.corpus.streaming=true): read from the files
a pool at a time, tokenized as they are read, never cached whole.

Each epoch, the blocks of the files (corpora/blocks.py) are shuffled with (seed, epoch), and cut
into pools of as many blocks as hold pool_batches * batch_size pairs. A pool's pairs are read,
tokenized, shuffled, sorted by length (stable) and cut into batches under max_tokens as the
cached path's BucketBatchSampler cuts its pools, and its batches shuffled; each draw is seeded
by (seed, epoch, pool) alone. So the state (epoch, pool, batches given from it) rebuilds any
point of the stream exactly: a run resumed mid-epoch goes on with the very next batch.

Not HuggingFace datasets' IterableDataset with a shuffle buffer: its state_dict holds no buffer,
so a resumed run refills the buffer and the pairs that were in it are never trained on that
epoch ("Loading a state dict of a shuffle buffer of a dataset without the buffer content",
huggingface/datasets#7444); this project's resume is exact.

The stream has no end: epochs follow one another, and trainer.max_steps or max_time ends the
run (Lightning sees one endless epoch; the stream's own epoch is in its state and the log).
Under data parallelism every process reads the same pool and takes every num_replicas-th of
its batches, the pool's batches evened out as BucketBatchSampler evens an epoch's.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from seq2seq.data.batching import batch_starts, evened, repeated_to
from seq2seq.data.corpora.blocks import BLOCK_LINES, LineBlocks

log = logging.getLogger(__name__)


class StreamBatches(IterableDataset):
    """Padded batches of a streamed training split, endlessly, resumable.

    Args:
        blocks: the split's files, by block.
        encode: texts -> (source ids, target ids), per pair (the fitted tokenizers).
        collate: examples ({"src_ids", "tgt_ids"}) -> a padded batch.
        max_length: most tokens a side; longer pairs are dropped (and counted in the log).
        batch_size, max_tokens, pool_batches: as for BucketBatchSampler.
        bucket: sort a pool by length before it is cut into batches (False: batches of
            batch_size pairs as drawn, max_tokens unused).
        seed: of every draw.
        num_replicas, rank: this process's share under data parallelism.
        ahead: batches the consumer holds fetched but not yet trained on, which its state
            does not count as given. Lightning fetches one batch ahead of training from a
            loader without a length (its _PrefetchDataFetcher), so the data module gives 1:
            a run stopped after training batch k resumes with batch k + 1, the one fetched.
    """

    def __init__(
        self,
        blocks: LineBlocks,
        encode: Callable[[list[str], list[str]], tuple[list[list[int]], list[list[int]]]],
        collate: Callable[[list[dict[str, Any]]], Any],
        max_length: int,
        batch_size: int,
        max_tokens: int | None,
        pool_batches: int,
        bucket: bool,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        ahead: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got {rank} and {num_replicas}")
        self.blocks, self.encode, self.collate = blocks, encode, collate
        self.max_length, self.batch_size = max_length, batch_size
        self.max_tokens, self.pool_batches, self.bucket = max_tokens, pool_batches, bucket
        self.seed, self.num_replicas, self.rank = seed, num_replicas, rank
        # Blocks a pool: as many as hold pool_batches * batch_size pairs.
        self.pool_blocks = max(1, math.ceil(pool_batches * batch_size / BLOCK_LINES))
        self.epoch = self.pool = self.given = 0  # where the stream is (what has been given)
        # Where the stream was after each of the last ahead + 1 batches given: the first is
        # where the consumer is.
        self._states: deque[dict[str, int]] = deque([self._now()], maxlen=ahead + 1)
        self._order: tuple[Any, np.ndarray] = (None, np.zeros(0, dtype=np.int64))
        self._counts = {"pairs": 0, "batches": 0, "long": 0, "empty": 0}  # of this epoch

    def pools(self) -> int:
        """Pools an epoch."""
        return math.ceil(len(self.blocks) / self.pool_blocks)

    def _pool(self, epoch: int, pool: int) -> list[list[dict[str, Any]]]:
        """This process's batches of one pool, in the order given."""
        return self._batches(self._read(epoch, pool), epoch, pool)

    def _read(self, epoch: int, pool: int) -> list[dict[str, Any]]:
        """One pool's examples ({"src_ids", "tgt_ids"}): its blocks read in file order,
        tokenized, the empty pairs and those over max_length dropped (counted)."""
        if self._order[0] != (self.seed, epoch):  # the epoch's block order, drawn once
            rng = np.random.default_rng([self.seed, epoch])
            self._order = ((self.seed, epoch), rng.permutation(len(self.blocks)))
        order = self._order[1]
        chosen = np.sort(order[pool * self.pool_blocks : (pool + 1) * self.pool_blocks])
        pairs = [pair for block in chosen.tolist() for pair in self.blocks.read(block)]
        filled = [p for p in pairs if p["src"] and p["tgt"]]
        src_ids, tgt_ids = self.encode([p["src"] for p in filled], [p["tgt"] for p in filled])
        examples = [
            {"src_ids": s, "tgt_ids": t}
            for s, t in zip(src_ids, tgt_ids, strict=True)
            if max(len(s), len(t)) <= self.max_length
        ]
        if self.rank == 0:
            counts = self._counts
            counts["empty"] += len(pairs) - len(filled)
            counts["long"] += len(filled) - len(examples)
            counts["pairs"] += len(examples)
        return examples

    def _batches(
        self, examples: list[dict[str, Any]], epoch: int, pool: int
    ) -> list[list[dict[str, Any]]]:
        """A pool's examples cut into this process's batches, as BucketBatchSampler cuts its
        pools: shuffled, sorted by length (stable), cut under max_tokens, the batches shuffled,
        evened out over the processes; every draw seeded by (seed, epoch, pool)."""
        rng = np.random.default_rng([self.seed, epoch, pool])
        shuffled = rng.permutation(len(examples))
        lengths = np.array([max(len(e["src_ids"]), len(e["tgt_ids"]) + 1) for e in examples])
        if self.bucket:
            ordered = shuffled[np.argsort(lengths[shuffled], kind="stable")]
            cuts = batch_starts(lengths[ordered].tolist(), self.batch_size, self.max_tokens)[1:]
        else:
            ordered, cuts = shuffled, list(range(self.batch_size, len(shuffled), self.batch_size))
        batches = [batch for batch in np.split(ordered, cuts) if len(batch)]
        batches = [batches[i] for i in rng.permutation(len(batches))]
        # Too few pairs to even out by halving: some repeated.
        batches = repeated_to(evened(batches, self.num_replicas), self.num_replicas)
        return [[examples[i] for i in batch.tolist()] for batch in batches][
            self.rank :: self.num_replicas
        ]

    def __iter__(self) -> Iterator[Any]:
        self._states.clear()
        self._states.append(self._now())
        while True:
            whole = self.pool == 0 and self.given == 0  # this epoch read from its start
            empty_epoch = True
            for pool in range(self.pool, self.pools()):
                self.pool = pool
                batches = self._pool(self.epoch, pool)
                for batch in batches[self.given :]:
                    self.given += 1
                    empty_epoch = False
                    if self.rank == 0:
                        self._counts["batches"] += 1
                    self._states.append(self._now())
                    yield self.collate(batch)
                self.given = 0
            if empty_epoch and whole:
                raise ValueError(
                    f"the training files have no pair of at most data.max_length="
                    f"{self.max_length} tokens a side: raise data.max_length"
                )
            self._end_epoch()

    def _end_epoch(self) -> None:
        if self.rank == 0:
            c = self._counts
            log.info(
                "Training stream, epoch %d done: %d pairs in %d batches of this process; "
                "dropped %d longer than data.max_length=%d tokens and %d empty",
                self.epoch, c["pairs"], c["batches"], c["long"], self.max_length, c["empty"],
            )  # fmt: skip
        self._counts = dict.fromkeys(self._counts, 0)
        self.epoch, self.pool, self.given = self.epoch + 1, 0, 0

    def _now(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "pool": self.pool, "given": self.given}

    def state_dict(self) -> dict[str, int]:
        """Where the consumer is: the state after the batch it trained last."""
        return dict(self._states[0])

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch = state["seed"], state["epoch"]
        self.pool, self.given = state["pool"], state["given"]
        self._states.clear()
        self._states.append(self._now())
