"""BPE-dropout on the training batches (`data.bpe_dropout`): subword regularisation, each
batch's pairs segmented afresh into smaller pieces of the same vocabulary.

BPE-dropout (Provilkov et al., 2020) drops each merge with probability p while a word is
segmented, so the model sees the same text cut in many ways and learns what the pieces
compose. Here it works on the token ids the cache holds: each token of a pair is split, with
probability p, into the two tokens whose merge made it, and each part again with probability
p, down to single bytes. Every segmentation this gives is one the paper's can give; the
paper's can also join a dropped merge's parts with their neighbours, which this never does.

Not the tokenizers library's own dropout (BPE(dropout=p)), deliberately: it draws from a
generator no seed reaches (huggingface/tokenizers#644), so no run would repeat and none would
resume as it ran; and it segments text, which the tokenized cache no longer holds. Here a
batch's draws come from the run's seed and the batch's own tokens, nothing else: a resumed
run draws what the uninterrupted one drew, and an epoch, which batches its pairs anew, draws
anew.

A pair split past data.max_length keeps its whole tokens (the model has positions for no more),
and the batch's budget of data.max_tokens counts the tokens before the split. Validation and
test batches are never split.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from seq2seq.data.tokenizer import LearnedTokenizer


def merge_parts(tokenizer: LearnedTokenizer) -> tuple[np.ndarray, np.ndarray]:
    """For each token id, the ids of the two tokens its merge joined (its first merge, where
    two merges make the same token); -1 for the bytes and the special tokens, made by none."""
    if tokenizer.kind != "bpe":
        raise ValueError(f"BPE-dropout needs a BPE tokenizer, got a {tokenizer.kind!r} one")
    model = json.loads(tokenizer.tokenizer.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    left = np.full(len(tokenizer), -1, dtype=np.int64)
    right = np.full(len(tokenizer), -1, dtype=np.int64)
    for merge in model["merges"]:  # [a, b] since tokenizers 0.20; "a b" in files before it
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        joined = vocab[a + b]
        if left[joined] < 0:
            left[joined], right[joined] = vocab[a], vocab[b]
    return left, right


class MergeSplitter:
    """Splits rows of token ids by undoing merges, each with probability p (see the module)."""

    def __init__(self, tokenizer: LearnedTokenizer, p: float) -> None:
        self.left, self.right = merge_parts(tokenizer)
        self.p = p

    def split(self, rows: list[list[int]], rng: np.random.Generator) -> list[list[int]]:
        """The rows split, the whole batch at once: each round draws for the tokens the last
        round made (all of them in the first), and splits those drawn below p that have parts."""
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        ids = np.fromiter((i for row in rows for i in row), dtype=np.int64, count=lengths.sum())
        row_of = np.repeat(np.arange(len(rows)), lengths)
        fresh = np.ones(len(ids), dtype=bool)
        while True:
            drop = fresh & (self.left[ids] >= 0) & (rng.random(len(ids)) < self.p)
            if not drop.any():
                break
            copies = 1 + drop
            first = (np.cumsum(copies) - copies)[drop]  # where each split token's parts go
            parts = ids[drop]
            ids, row_of = np.repeat(ids, copies), np.repeat(row_of, copies)
            ids[first], ids[first + 1] = self.left[parts], self.right[parts]
            fresh = np.zeros(len(ids), dtype=bool)
            fresh[first] = fresh[first + 1] = True
        ends = np.cumsum(np.bincount(row_of, minlength=len(rows)))
        return [part.tolist() for part in np.split(ids, ends[:-1])]


class SubwordDropout:
    """A training collate: the pairs' tokens split (MergeSplitter, source and target each by
    its own tokenizer's merges), then the pairs collated as before.

    Args:
        collate: examples ({"src_ids", "tgt_ids"}) -> a padded batch.
        src_vocab, tgt_vocab: the BPE tokenizers the ids are of.
        p: the probability each token is split (data.bpe_dropout).
        seed: the run's; with the batch's tokens, what its draws come from.
        max_length: the most tokens of a side; a row split past it stays whole.
    """

    def __init__(
        self,
        collate: Callable[[list[dict[str, Any]]], Any],
        src_vocab: LearnedTokenizer,
        tgt_vocab: LearnedTokenizer,
        p: float,
        seed: int,
        max_length: int,
    ) -> None:
        self.collate = collate
        self.src = MergeSplitter(src_vocab, p)
        self.tgt = self.src if tgt_vocab is src_vocab else MergeSplitter(tgt_vocab, p)
        self.seed, self.max_length = seed, max_length

    def draws(self, examples: list[dict[str, Any]]) -> np.random.Generator:
        """The batch's generator: from the seed and a checksum of every row, lengths included
        (so "1 2" + "3" and "1" + "2 3" differ)."""
        rows = [np.asarray(e[side], dtype=np.int32) for e in examples for side in SIDES]
        lengths = np.array([len(row) for row in rows], dtype=np.int32)
        checksum = zlib.crc32(np.concatenate([lengths, *rows]).tobytes())
        return np.random.default_rng([self.seed, checksum])

    def __call__(self, examples: list[dict[str, Any]]) -> Any:
        rng = self.draws(examples)
        sides = {}
        for side, splitter in zip(SIDES, (self.src, self.tgt), strict=True):
            whole = [list(e[side]) for e in examples]
            split = splitter.split(whole, rng)
            fits = [len(row) <= self.max_length for row in split]
            sides[side] = [s if ok else w for s, w, ok in zip(split, whole, fits, strict=True)]
        return self.collate([
            {"src_ids": src, "tgt_ids": tgt}
            for src, tgt in zip(sides["src_ids"], sides["tgt_ids"], strict=True)
        ])  # fmt: skip


SIDES = ("src_ids", "tgt_ids")
