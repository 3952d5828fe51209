"""Vocabularies that are a plain list of symbols, with the special tokens first.

`Vocabulary` reads whitespace-separated symbols (the symbol tasks, which know their symbols
in advance); `CharVocabulary` reads characters (number words, dates). A list is the whole
state and goes into the checkpoint as such. The learned word and BPE tokenizers, built on the
`tokenizers` library, are in tokenizer.py; all share the interface used here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)


class Vocabulary:
    """Maps symbols to ids and back; ids 0-3 are <pad>, <bos>, <eos>, <unk>.

    >>> vocab = Vocabulary(["a", "b", "c"])
    >>> vocab.encode("c a b")
    [6, 4, 5]
    >>> vocab.decode([1, 6, 4, 2, 0])
    'c a'
    """

    kind = "symbol"
    pad_id, bos_id, eos_id, unk_id = range(4)

    def __init__(self, symbols: Iterable[str]) -> None:
        self.symbols = list(symbols)
        clashes = sorted(set(self.symbols) & set(SPECIALS))
        if clashes:
            raise ValueError(f"symbols must not include the special tokens, got {clashes}")
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError("symbols must be unique, got duplicates in the vocabulary")
        self.itos = [*SPECIALS, *self.symbols]
        self.stoi = {s: i for i, s in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def split(self, text: str) -> list[str]:
        return text.split()

    def join(self, symbols: list[str]) -> str:
        return " ".join(symbols)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(s, self.unk_id) for s in self.split(text)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Symbols up to the first <eos>, without <bos> or <pad>."""
        return self.join([self.itos[i] for i in strip_specials(ids, self)])

    def token_label(self, i: int) -> str:
        """How token i reads on its own (axis labels of attention maps)."""
        return self.itos[i]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "symbols": list(self.symbols)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Vocabulary:
        if state.get("kind") != cls.kind:
            raise ValueError(f"not a saved {cls.__name__}: kind={state.get('kind')!r}")
        return cls(state["symbols"])


class CharVocabulary(Vocabulary):
    """One token per character, spaces included: decode(encode(text)) == text when every
    character of text is in the vocabulary.

    A plain list rather than the `tokenizers` library, which has no character model; fitting
    is a count of characters.

    >>> vocab = CharVocabulary.fit(["drei", "zwei"])
    >>> vocab.decode(vocab.encode("dreizehn"))
    'dreize<unk><unk>'
    """

    kind = "char"

    def split(self, text: str) -> list[str]:
        return list(text)

    def join(self, symbols: list[str]) -> str:
        return "".join(symbols)

    @classmethod
    def fit(
        cls, texts: Iterable[str], vocab_size: int | None = None, min_frequency: int = 1
    ) -> CharVocabulary:
        """The characters of texts seen at least min_frequency times, the most frequent
        first, at most vocab_size tokens in all (the 4 special tokens included)."""
        counts = Counter(char for text in texts for char in text)
        ranked = sorted(
            (char for char, n in counts.items() if n >= min_frequency),
            key=lambda char: (-counts[char], char),
        )
        if vocab_size is not None:
            ranked = ranked[: max(0, vocab_size - len(SPECIALS))]
        return cls(sorted(ranked))


def strip_specials(ids: Sequence[int], vocab: Any) -> list[int]:
    """The ids up to the first <eos>, without <bos> or <pad>."""
    out = []
    for i in ids:
        if i == vocab.eos_id:
            break
        if i not in (vocab.pad_id, vocab.bos_id):
            out.append(i)
    return out
