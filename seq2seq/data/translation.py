"""The data module of every task: a corpus's text pairs -> tokenizers -> batches.

corpus.load()          text pairs per split (corpora/), cached by datasets
drop empty pairs       counted in the log
drop duplicate pairs   the same source and target twice in a split (dedupe), counted
split off              validation / test the corpus lacks, from train, with the seed: all pairs
                       of one source sentence on one side (split_by=source) or pairs (pair)
check overlap          sources of validation and test also in train: counted in the log
                       (these four on Arrow columns, cached as row numbers: text_splits.py)
fit tokenizers         on the training split, at most data.tokenizer.sample pairs of it drawn
                       with the seed (cached under data_dir/tokenizers), unless the corpus
                       brings its own (the symbol tasks)
tokenize               ids and lengths, cached by datasets
drop long pairs        longer than max_length tokens on either side, counted in the log
report lengths         tokens per sentence and the target/source ratio, per split, in the log
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import DatasetDict

from seq2seq import checks
from seq2seq.data.corpora.blocks import LineBlocks
from seq2seq.data.corpora.common import Corpus, CorpusWithTokenizers, StreamedCorpus
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.text_splits import SPLIT_OFF, TextSplitter, keep, lengths, select
from seq2seq.data.tokenizer import (
    Tokenizer,
    check_tokenizer_settings,
    fit_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

log = logging.getLogger(__name__)

SPLIT_BY = ("source", "pair")
# Pairs the tokenizers are fitted on at most (data.tokenizer.sample): fitting grows with the pairs
# (shared BPE: 21 s at a million on the Zen 5, bench/scale.py), so a larger corpus is sampled.
TOKENIZER_SAMPLE = 1_000_000


def length_report(src: np.ndarray, tgt: np.ndarray) -> str:
    """Pairs, tokens per sentence (mean, 95th percentile, max) a side, and the mean
    target/source length ratio, of a split's source and target lengths."""

    def side(lengths: np.ndarray) -> str:
        ordered = np.sort(lengths)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return f"mean {lengths.mean():.1f}, 95% <= {p95}, max {ordered[-1]}"

    ratio = (tgt / np.maximum(src, 1)).mean()
    return (
        f"{len(src)} pairs; source tokens {side(src)}; target tokens {side(tgt)}; "
        f"target/source {ratio:.2f}"
    )


def _texts(dataset: Any, name: str, batch: int = 10_000) -> Iterator[str]:
    """A text column's strings, read a batch of rows at a time (a whole column as Python
    strings is gigabytes at 10 million pairs)."""
    for rows in dataset.with_format("arrow").iter(batch_size=batch):
        yield from rows[name].to_pylist()


def _count_unknown(batch: dict[str, list], unk_id: int) -> dict[str, list[int]]:
    return {"unknown": [ids.count(unk_id) for ids in batch["src_ids"]]}


def _tokenizer_config(tokenizer: dict[str, Any] | None, corpus: Corpus) -> dict[str, Any] | None:
    """data.tokenizer with its defaults filled in; None for a corpus with its own tokenizers
    (which a data.tokenizer setting would silently not change, so it is refused)."""
    name = type(corpus).__name__
    if not isinstance(corpus, Corpus):
        raise ValueError(
            f"data.corpus built {name}, which is not a corpus (no load(data_dir) -> "
            "DatasetDict method): point data.corpus._target_ at a class of seq2seq/data/corpora"
        )
    if isinstance(corpus, CorpusWithTokenizers):
        if tokenizer is not None:
            raise ValueError(
                f"data.tokenizer does not apply to {name}, whose tokenizers are fixed: "
                "set data.tokenizer=null"
            )
        return None
    if tokenizer is None:
        raise ValueError(
            f"data.tokenizer is null, but {name} needs one fitted: give data.tokenizer.kind"
        )
    known = {"kind", "vocab_size", "min_frequency", "shared", "sample"}
    unknown = sorted(set(tokenizer) - known)
    if unknown:
        raise ValueError(f"unknown data.tokenizer settings {unknown}; known: {sorted(known)}")
    config = {
        "kind": tokenizer.get("kind", "char"),
        "vocab_size": tokenizer.get("vocab_size"),
        "min_frequency": tokenizer.get("min_frequency", 1),
        "shared": bool(tokenizer.get("shared", False)),
        "sample": tokenizer.get("sample", TOKENIZER_SAMPLE),
    }
    if config["sample"] is not None:
        checks.integer("data.tokenizer.sample", config["sample"], minimum=1)
    check_tokenizer_settings(config["kind"], config["vocab_size"], config["min_frequency"])
    return config


class TrainingText(Protocol):
    """The training text the tokenizers are fitted on: `key` names it for the tokenizers'
    cache; sample(size) gives texts(column) -> that column's texts of at most `size` pairs drawn
    with the seed, a one-item list that holds how many pairs (once read), and of how many (None
    where all were used); `blocks` is a stream's files by block (None: cached whole)."""

    key: Any
    blocks: LineBlocks | None

    def sample(self, size: int | None) -> tuple[Any, list[int], Any]: ...


class CachedText:
    """The training split, cached whole (a dataset)."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed, self.blocks = dataset, seed, None
        self.key = dataset._fingerprint

    def sample(self, size: int | None) -> tuple[Any, list[int], Any]:
        train, sample = self.dataset, self.dataset
        if size is not None and size < len(train):
            drawn = np.random.default_rng(self.seed).choice(len(train), size, False)
            sample = select(train, np.sort(drawn))  # in order: the file is read front to back
        every = len(sample) == len(train)
        return (lambda column: _texts(sample, column)), [len(sample)], None if every else len(train)


class StreamedText:
    """A streamed corpus's training files, by block: sampled as whole blocks drawn at random,
    with no pass over the corpus."""

    def __init__(self, blocks: LineBlocks, seed: int) -> None:
        self.blocks, self.seed = blocks, seed
        self.key = ["stream", blocks.key, seed]

    def sample(self, size: int | None) -> tuple[Any, list[int], Any]:
        pairs = [0]

        def streamed(column: str) -> Iterator[str]:
            pairs[0] = 0
            for pair in self.blocks.sample(size, self.seed):
                if pair["src"] and pair["tgt"]:
                    pairs[0] += 1
                    yield pair[column]

        every = size is None or size >= self.blocks.lines
        return streamed, pairs, None if every else f"{self.blocks.lines} lines"


class TranslationDataModule(Seq2SeqDataModule):
    """Text pairs from a corpus, with tokenizers fitted on its training split (or the
    corpus's own).

    Args:
        corpus: an object with load(data_dir) -> DatasetDict of "src"/"tgt" texts, and
            optionally tokenizers() -> (source, target) (SymbolTask, NumberWords, Dates,
            ParallelFiles, HubCorpus in corpora/).
        tokenizer: kind (char, word or bpe), vocab_size (null: every character, for char),
            min_frequency, shared (one tokenizer for both sides, fitted on both), and sample
            (fitted on at most this many training pairs, drawn with the seed; null: all); null
            for a corpus with its own tokenizers.
        max_length: most tokens on either side; longer pairs are dropped and counted, never
            cut.
        val_size, test_size: pairs split off the training data when the corpus has no
            validation or test split (null: 1000); refused for a split the corpus has, which
            they would not change.
        seed: of that split.
        split_by: "source": a split-off validation or test split takes every pair of the
            source sentences it draws, so no source is in both training and test (a corpus
            with several translations of one sentence otherwise tests on seen sources);
            "pair": pairs drawn one by one.
        dedupe: drop pairs that occur twice in a split (same source and target), counted.
        bpe_dropout: the probability each token of a training pair is split into the two
            tokens its merge joined, and each part again (BPE-dropout, subword_dropout.py);
            0 (the default): never. BPE tokenizers only.
        batch_size, num_workers, data_dir, pin_memory, bucket, max_tokens, pool_batches: as
            in Seq2SeqDataModule.
    """

    def __init__(
        self,
        corpus: Corpus,
        tokenizer: dict[str, Any] | None,
        max_length: int,
        batch_size: int,
        num_workers: int,
        data_dir: str,
        val_size: int | None = None,
        test_size: int | None = None,
        seed: int = 0,
        split_by: str = "source",
        dedupe: bool = False,
        pin_memory: bool = False,
        bucket: bool = True,
        max_tokens: int | None = None,
        pool_batches: int = 50,
        bpe_dropout: float = 0.0,
    ) -> None:
        super().__init__(
            batch_size, num_workers, data_dir, pin_memory, bucket, max_tokens, pool_batches
        )
        checks.integer("data.max_length", max_length, minimum=1)
        if max_tokens is not None and max_tokens < max_length + 1:
            raise ValueError(
                f"data.max_tokens={max_tokens} cannot hold one pair of max_length={max_length} "
                f"tokens (plus <eos>): raise it to at least {max_length + 1}"
            )
        for name, size in (("val_size", val_size), ("test_size", test_size)):
            if size is not None:
                checks.integer(f"data.{name}", size, minimum=1)
        self.corpus = corpus
        self.tokenizer_config = _tokenizer_config(tokenizer, corpus)
        self.bpe_dropout = checks.number("data.bpe_dropout", bpe_dropout, 0.0, 1.0)
        if self.bpe_dropout and (self.tokenizer_config or {}).get("kind") != "bpe":
            tokens = (
                f"{type(corpus).__name__} brings its own tokenizers"
                if self.tokenizer_config is None
                else f"the tokenizer is {self.tokenizer_config['kind']!r}"
            )
            raise ValueError(
                f"data.bpe_dropout={bpe_dropout} needs BPE tokens (merges to undo), but {tokens}: "
                "set data.tokenizer.kind=bpe or data.bpe_dropout=0"
            )
        self.max_length = max_length
        self.val_size, self.test_size, self.seed = val_size, test_size, seed
        self.split_by = checks.choice("data.split_by", split_by, SPLIT_BY)
        self.dedupe = checks.choice("data.dedupe", dedupe, (True, False))
        streamed = isinstance(corpus, StreamedCorpus)
        if streamed and dedupe:
            raise ValueError(
                "data.dedupe=true needs the whole training split at once, which "
                "data.corpus.streaming=true never holds: set data.dedupe=false"
            )
        if streamed and num_workers:
            raise ValueError(
                f"data.num_workers={num_workers}: a streamed corpus is read and tokenized by the "
                "training process itself (a pool of batches at a time): set data.num_workers=0"
            )

    def load_splits(self) -> DatasetDict:
        # The tokenizers are fitted on the training text, so they exist from here on.
        text, train = self._load_text()
        self.train_blocks = train.blocks
        self.src_vocab, self.tgt_vocab = self._fit(train)
        return text

    def _training_collate(self, pad: Any) -> Any:
        if not self.bpe_dropout:
            return pad
        from seq2seq.data.subword_dropout import SubwordDropout

        # The run's seed, as the samplers take it (seed_everything set it).
        return SubwordDropout(
            pad, self.src_vocab, self.tgt_vocab, self.bpe_dropout, torch.initial_seed(),
            self.max_length,
        )  # fmt: skip

    def _tokenized(self) -> DatasetDict:
        splits = super()._tokenized()
        if self.src_vocab.kind in ("char", "word"):
            self._log_unknown(splits)
        with self.phases("lengths"):
            return self._within_max_length(splits)

    def _within_max_length(self, splits: DatasetDict) -> DatasetDict:
        kept = {}
        for split, dataset in splits.items():
            src, tgt = lengths(dataset, "src_ids"), lengths(dataset, "tgt_ids")
            within = np.maximum(src, tgt) <= self.max_length
            kept[split] = keep(dataset, within)
            dropped = len(dataset) - len(kept[split])
            if dropped:
                log.warning(
                    "%s: dropped %d of %d pairs longer than data.max_length=%d tokens",
                    split, dropped, len(dataset), self.max_length,
                )  # fmt: skip
            if len(kept[split]) == 0:
                raise ValueError(
                    f"the {split} split has no pair of at most data.max_length={self.max_length} "
                    "tokens: raise data.max_length"
                )
            log.info("%s: %s", split, length_report(src[within], tgt[within]))
        return DatasetDict(kept)

    def _log_unknown(self, splits: DatasetDict) -> None:
        """Source tokens of validation and test that training never saw map to <unk>."""
        for split in ("validation", "test"):
            counts = splits[split].map(
                _count_unknown, batched=True, fn_kwargs={"unk_id": self.src_vocab.unk_id},
                remove_columns=splits[split].column_names, desc=f"{split}: unknown tokens",
            )["unknown"]  # fmt: skip
            if sum(counts):
                log.warning(
                    "%s: %d source tokens in %d pairs are not in the vocabulary and map to <unk>",
                    split, sum(counts), sum(1 for n in counts if n),
                )  # fmt: skip

    def _load_text(self) -> tuple[DatasetDict, TrainingText]:
        """The text splits to tokenize, and the training text the tokenizers are fitted on (the
        training split itself, or a streamed corpus's files)."""
        with self.phases("read"):
            loaded = self.corpus.load(self.data_dir)
        if isinstance(self.corpus, StreamedCorpus):
            with self.phases("index the training files"):
                blocks = self.corpus.train_stream(self.data_dir)
            log.info(
                "train: streamed from its files, %d lines in %d blocks, read as it trains "
                "(data.corpus.streaming)", blocks.lines, len(blocks),
            )  # fmt: skip
            with self.phases("clean"):
                held = {split: self._filled(split, loaded[split]) for split in loaded}
            return DatasetDict(held), StreamedText(blocks, self.seed)
        sizes = {}
        for split, size in (("test", self.test_size), ("validation", self.val_size)):
            name = f"data.{'val' if split == 'validation' else 'test'}_size"
            if split in loaded and size is not None:
                raise ValueError(
                    f"{name}={size} sizes a {split} split taken off the training data, but "
                    f"{type(self.corpus).__name__} has its own {split} split: drop {name} "
                    "(a generated corpus sizes its splits with data.corpus.*_size)"
                )
            sizes[split] = SPLIT_OFF if size is None else size
        splitter = TextSplitter(self.dedupe, sizes, self.split_by, self.seed, self.phases)
        text = splitter(loaded, self.data_dir)
        return text, CachedText(text["train"], self.seed)

    @staticmethod
    def _filled(split: str, dataset: Any) -> Any:
        """A held-out split of a streamed corpus without its empty pairs, counted (the cached
        path's TextSplitter does this with the rest)."""
        filled = (lengths(dataset, "src", pc.utf8_length) > 0) & (
            lengths(dataset, "tgt", pc.utf8_length) > 0
        )
        if not filled.all():
            log.warning(
                "%s: dropped %d empty pairs of %d", split, int((~filled).sum()), len(dataset)
            )
        return keep(dataset, filled)

    def _fit(self, train: TrainingText) -> tuple[Tokenizer, Tokenizer]:
        """The corpus's own tokenizers, or source and target tokenizers fitted on the training
        text (or read from the cache)."""
        config = self.tokenizer_config
        if self.kept_tokenizers is not None:
            return self._kept(train)
        if config is None:
            return self.corpus.tokenizers()
        key = json.dumps([train.key, config], sort_keys=True)
        key = hashlib.sha256(key.encode()).hexdigest()[:16]
        paths = [Path(self.data_dir) / "tokenizers" / f"{key}-{side}.json" for side in "st"]
        if all(p.is_file() for p in paths):
            with self.phases("tokenizers, cached"):
                return load_tokenizer(paths[0]), load_tokenizer(paths[1])
        with self.phases("fit tokenizers"):
            return self._fit_and_save(train, config, paths)

    def _kept(self, train: TrainingText) -> tuple[Tokenizer, Tokenizer]:
        """The tokenizers given (a checkpoint's, init_from), with what they make of this corpus:
        a corpus with tokenizers of its own must have the same; others are cut by them as they
        are (the lengths below say how long its sentences become)."""
        src, tgt = self.kept_tokenizers
        if self.tokenizer_config is None and self.corpus.tokenizers() != (src, tgt):
            raise ValueError(
                f"{type(self.corpus).__name__}'s tokens are not those of the model fine-tuned "
                "(init_from): its vocabulary differs; fine-tune on a corpus the model's "
                "tokenizers can cut"
            )
        texts, pairs, _ = train.sample(2000)
        encoded = src.encode_batch(list(texts("src")))
        lengths = [len(ids) for ids in encoded]
        unknown = sum(ids.count(src.unk_id) for ids in encoded)
        log.info(
            "Tokenizers kept from the model fine-tuned (init_from), not fitted: %s source "
            "tokens a sentence on %d training pairs, %d unknown (%s, %d tokens)",
            f"{sum(lengths) / max(len(lengths), 1):.1f}", pairs[0], unknown, src.kind, len(src),
        )  # fmt: skip
        return src, tgt

    def _fit_and_save(
        self, train: TrainingText, config: dict[str, Any], paths: list[Path]
    ) -> tuple[Tokenizer, Tokenizer]:
        texts, pairs, total = train.sample(config["sample"])

        def fit(*columns: str) -> Tokenizer:
            chained = (text for column in columns for text in texts(column))
            return fit_tokenizer(
                config["kind"], chained, config["vocab_size"], config["min_frequency"]
            )

        if config["shared"]:
            src = tgt = fit("src", "tgt")
        else:
            src, tgt = fit("src"), fit("tgt")
        of = "" if total is None else f" (data.tokenizer.sample) of {total}"
        log.info(
            "Fitted %s tokenizers on %d training pairs%s: source %d tokens, target %d%s",
            config["kind"], pairs[0], of, len(src), len(tgt),
            " (shared)" if config["shared"] else "",
        )  # fmt: skip
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for tokenizer, path in zip((src, tgt), paths, strict=True):
            save_tokenizer(tokenizer, path)
        # As every later start reads them: datasets keys the tokenized splits' cache by a hash
        # of the tokenizers, and a freshly fitted one hashes otherwise than itself read back,
        # so the second start tokenized everything again (bench/scale.py).
        return load_tokenizer(paths[0]), load_tokenizer(paths[1])
