"""A corpus's text pairs made into the three splits: empty pairs dropped, duplicates dropped
(dedupe), validation and test split off the training pairs where the corpus lacks them, and the
overlap of their sources with training counted. Computed as row numbers of the loaded datasets,
from their Arrow columns (no Python object per pair: 10 million pairs prepare within a few GiB),
and cached by the loaded datasets' fingerprints and the settings, so a second start reads a
small file instead of doing any of it again (bench/scale.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import DatasetDict

from seq2seq.data.corpora.common import SPLITS
from seq2seq.data.phases import Phases

log = logging.getLogger(__name__)

SPLIT_OFF = 1000  # pairs split off train for a validation or test split the corpus lacks
VERSION = 1  # of the cached file: a change to what it holds or how it is computed raises it


def column(dataset: Any, name: str) -> Any:
    """A column as Arrow (a split's rows only): read as Python lists, the columns took most
    of a cached start-up's data time."""
    return dataset.with_format("arrow")[name]


def lengths(dataset: Any, name: str, of: Callable = pc.list_value_length) -> np.ndarray:
    """Per row, the length of a column's list (token ids) or, of=pc.utf8_length, text."""
    return of(column(dataset, name)).to_numpy()


def keep(dataset: Any, rows: np.ndarray) -> Any:
    """The rows where the mask `rows` holds; the dataset itself when all do. (Not datasets'
    filter: its indices mapping, even when it drops nothing, makes every later read slower.)"""
    return dataset if rows.all() else select(dataset, np.flatnonzero(rows))


# Rows an Arrow batch of the files datasets writes (and, tokenizing, a batch encoded): its default,
# 1,000, made 10^4 batches of a 10^7-pair split, each opened and its pages mapped when the file is
# (0.7 GiB resident), and writing an index of 10^7 rows took 1.5 s.
WRITER_BATCH = 10_000


def select(dataset: Any, rows: np.ndarray) -> Any:
    """The rows of dataset, by number: an array, not a list (datasets fingerprints select's
    indices, and pickled a list of a million ints for it in 11 s), written in large batches."""
    return dataset.select(rows, writer_batch_size=WRITER_BATCH)


def _encoded(values: Any) -> tuple[np.ndarray, Any]:
    """Per row, the number of its string among the distinct strings, and those strings (in the
    order first seen): Arrow's dictionary encoding, with one dictionary for every chunk. (Half
    the time and three quarters the memory of unique, then index_in: 10^7 sources, bench/scale.py.)
    """
    encoded = pc.dictionary_encode(values)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    if len({len(chunk.dictionary) for chunk in chunks}) > 1:
        chunks = pa.table({"v": encoded}).unify_dictionaries()["v"].chunks
    if not chunks:
        return np.zeros(0, dtype=np.int64), pa.array([], pa.string())
    ids = np.concatenate([chunk.indices.to_numpy(zero_copy_only=False) for chunk in chunks])
    return ids, chunks[0].dictionary


# Sorted rows compared with their neighbours this many at a time (a slice of the strings copied).
RANK_CHUNK = 1_000_000


def _ranks(values: Any) -> np.ndarray:
    """Per row, the rank of its string among the distinct strings sorted (as Python sorts str:
    UTF-8's byte order is code point order). The rows sorted, then each compared with the one
    before it, a chunk at a time: no copy of the distinct strings is held (10^7 sources: 2.0
    GiB of anonymous memory at the peak with Arrow's dictionary of them, 0.95 GiB so, and 10 s
    rather than 13, bench/scale.py)."""
    order = pc.array_sort_indices(values).to_numpy()
    starts = np.ones(len(order), dtype=bool)  # a sorted row whose string differs from the last
    for at in range(1, len(order), RANK_CHUNK):
        both = values.take(pa.array(order[at - 1 : at + RANK_CHUNK]))
        same = pc.equal(both.slice(1), both.slice(0, len(both) - 1))
        starts[at : at + len(both) - 1] = ~same.to_numpy(zero_copy_only=False)
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.cumsum(starts) - 1
    return ranks


def _ranks_among(values: Any, reference: Any, reference_ranks: np.ndarray) -> np.ndarray:
    """Per row of values, the rank of its string in reference (reference_ranks, per row of
    reference), or -1 where reference lacks it. The small side is the lookup's value set."""
    ids, distinct = _encoded(values)
    where = pc.fill_null(pc.index_in(reference, value_set=distinct), -1).to_numpy()
    rank_of = np.full(len(distinct), -1, dtype=np.int64)
    rank_of[where[where >= 0]] = reference_ranks[where >= 0]
    return rank_of[ids]


@dataclass
class TextSplits:
    """What the text splits are: for each of train, validation, test, the loaded split it
    comes from and its row numbers there, and the log lines that making them said."""

    rows: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    said: list[tuple[int, str]] = field(default_factory=list)

    def say(self, level: int, message: str) -> None:
        self.said.append((level, message))
        log.log(level, message)

    def save(self, path: Path) -> None:
        from seq2seq.files import written_whole  # the project's one way to replace a file whole

        arrays = {split: rows for split, (_, rows) in self.rows.items()}
        meta = {"version": VERSION, "from": {s: src for s, (src, _) in self.rows.items()},
                "said": self.said}  # fmt: skip
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
        path.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(path) as part:
            part.write_bytes(buffer.getvalue())

    @classmethod
    def read(cls, path: Path) -> TextSplits | None:
        """The splits saved at path, their log lines said again; None if there are none (or
        they are of another version, or unreadable: then they are made again)."""
        try:
            with np.load(path) as saved:
                meta = json.loads(str(saved["meta"]))
                if meta.get("version") != VERSION:
                    return None
                rows = {split: (meta["from"][split], saved[split]) for split in SPLITS}
        except (OSError, ValueError, KeyError):
            return None
        splits = cls(rows=rows)
        for level, message in meta["said"]:
            splits.say(level, message)
        return splits

    def select(self, loaded: DatasetDict) -> DatasetDict:
        """The splits as datasets: the loaded datasets' rows (the whole dataset when it is all
        of its rows in order)."""
        out = {}
        for split, (source, rows) in self.rows.items():
            dataset = loaded[source]
            whole = len(rows) == len(dataset) and bool((rows == np.arange(len(rows))).all())
            out[split] = dataset if whole else select(dataset, rows)
        return DatasetDict(out)


class TextSplitter:
    """Makes TextSplits from loaded datasets, or reads them from the cache under data_dir.

    Args:
        dedupe: drop pairs given twice in a split (the first is kept).
        sizes: pairs to split off train for "test" and "validation" where the corpus lacks them.
        split_by: "source" (all pairs of a drawn source sentence go together) or "pair".
        seed: of the split.
        phases: times each phase (clean, with the sources' ranks; deduplicate; split; overlap;
            or "split, cached").
    """

    def __init__(
        self, dedupe: bool, sizes: dict[str, int], split_by: str, seed: int, phases: Phases
    ) -> None:
        self.dedupe, self.sizes, self.split_by, self.seed = dedupe, sizes, split_by, seed
        self.phases = phases

    def __call__(self, loaded: DatasetDict, data_dir: Path) -> DatasetDict:
        settings = [VERSION, self.dedupe, self.sizes, self.split_by, self.seed]
        fingerprints = {split: dataset._fingerprint for split, dataset in loaded.items()}
        key = hashlib.sha256(json.dumps([fingerprints, settings], sort_keys=True).encode())
        path = Path(data_dir) / "text_splits" / f"{key.hexdigest()[:16]}.npz"
        if path.is_file():
            with self.phases("split, cached"):
                splits = TextSplits.read(path)
                if splits is not None:
                    return splits.select(loaded)
        splits = self.make(loaded)
        splits.save(path)
        return splits.select(loaded)

    def make(self, loaded: DatasetDict) -> TextSplits:
        splits = TextSplits()
        ranks: dict[str, np.ndarray] = {}  # per loaded split, its rows' source ranks (a split
        # of the corpus's own: the ranks of its sources among training's, -1 for none)
        for name in sorted(loaded, key=lambda split: split != "train"):  # train first
            dataset = loaded[name]
            src, tgt = column(dataset, "src"), column(dataset, "tgt")
            with self.phases("clean"):
                if name == "train":
                    ranks[name] = _ranks(src)
                    for other in set(loaded) - {"train"}:  # its sources among training's
                        ranks[other] = _ranks_among(column(loaded[other], "src"), src, ranks[name])
                    pa.default_memory_pool().release_unused()
                filled = (pc.utf8_length(src).to_numpy() > 0) & (pc.utf8_length(tgt).to_numpy() > 0)
                rows = np.flatnonzero(filled)
                if len(rows) < len(dataset):
                    splits.say(logging.WARNING, f"{name}: dropped {len(dataset) - len(rows)} "
                               f"empty pairs of {len(dataset)}")  # fmt: skip
            if self.dedupe:
                with self.phases("deduplicate"):
                    own = ranks[name] if name == "train" else _encoded(src)[0]
                    rows = self._first_of_each_pair(name, rows, own, tgt, splits)
            splits.rows[name] = (name, rows)
        with self.phases("split"):
            self._split_off(splits, ranks["train"])
        with self.phases("overlap"):
            self._count_overlap(splits, ranks)
        return splits

    @staticmethod
    def _first_of_each_pair(
        name: str, rows: np.ndarray, src_ids: np.ndarray, tgt: Any, splits: TextSplits
    ) -> np.ndarray:
        """Of the rows, the first of each (source, target) pair, in order; the rest counted.
        Only rows whose source is given more than once can repeat a pair, so only their targets
        are encoded (all 10^7 targets took a 1.3 GiB dictionary, bench/scale.py)."""
        sources = src_ids[rows]
        shared = rows[np.bincount(sources)[sources] > 1]
        tgt_ids, _ = _encoded(tgt.take(pa.array(shared)))
        pairs = src_ids[shared].astype(np.int64) * (int(tgt_ids.max(initial=0)) + 1) + tgt_ids
        _, first = np.unique(pairs, return_index=True)  # the first occurrence of each
        if len(first) < len(shared):
            repeated = np.ones(len(shared), dtype=bool)
            repeated[first] = False
            splits.say(logging.WARNING, f"{name}: dropped {int(repeated.sum())} duplicate "
                       f"pairs of {len(rows)}")  # fmt: skip
            rows = rows[~np.isin(rows, shared[repeated], assume_unique=True)]
        return rows

    def _split_off(self, splits: TextSplits, train_ranks: np.ndarray) -> None:
        """Validation and test splits the corpus lacks, taken from train with the seed."""
        for split in ("test", "validation"):
            if split in splits.rows:
                continue
            size, name = (
                self.sizes[split],
                f"data.{'val' if split == 'validation' else 'test'}_size",
            )
            _, train = splits.rows["train"]
            if size >= len(train) // 2:
                raise ValueError(
                    f"cannot split {size} {split} pairs off a training split of {len(train)}: "
                    f"lower {name} or give data.corpus.{split} files"
                )
            if self.split_by == "source":
                rest, held = _split_by_source(train, train_ranks[train], size, self.seed)
            else:  # as datasets' train_test_split(test_size=size, seed=seed) draws them
                order = np.random.default_rng(self.seed).permutation(len(train))
                rest, held = train[order[size:]], train[order[:size]]
            splits.rows["train"], splits.rows[split] = ("train", rest), ("train", held)
            splits.say(logging.INFO,
                       f"{split}: split {len(held)} pairs off the training data "
                       f"(by {self.split_by}, seed {self.seed})")  # fmt: skip
        for split in SPLITS:
            if len(splits.rows[split][1]) == 0:
                raise ValueError(f"the {split} split is empty: give data with pairs in it")
        splits.rows = {split: splits.rows[split] for split in SPLITS}

    @staticmethod
    def _count_overlap(splits: TextSplits, ranks: dict[str, np.ndarray]) -> None:
        """Validation and test sources that training also has: the model may have seen them."""
        _, train_rows = splits.rows["train"]
        in_train = np.zeros(int(ranks["train"].max(initial=-1)) + 2, dtype=bool)
        in_train[ranks["train"][train_rows]] = True  # the last, at -1, stays False: not found
        for split in ("validation", "test"):
            source, rows = splits.rows[split]
            seen = int(in_train[ranks[source][rows]].sum())
            if seen:
                splits.say(logging.WARNING,
                           f"{split}: {seen} of {len(rows)} pairs have a source sentence that "
                           "training also has (their scores read high; data.split_by=source "
                           "keeps them apart)")  # fmt: skip


def _split_by_source(
    rows: np.ndarray, ranks: np.ndarray, size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rest, held out) of rows: held out has every pair of the source sentences drawn with
    the seed until it holds at least size pairs; no source is on both sides.

    The draw is random.Random(seed).shuffle of the distinct sources sorted, as before this was
    computed on Arrow columns, so every corpus splits as it always has."""
    distinct, position = np.unique(ranks, return_inverse=True)  # the sources these rows have
    order = list(range(len(distinct)))
    random.Random(seed).shuffle(order)
    counts = np.bincount(position, minlength=len(distinct))
    drawn = np.asarray(order, dtype=np.int64)
    enough = int(np.searchsorted(np.cumsum(counts[drawn]), size)) + 1
    held = np.zeros(len(distinct), dtype=bool)
    held[drawn[:enough]] = True
    is_held = held[position]
    return rows[~is_held], rows[is_held]
