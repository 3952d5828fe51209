"""A fixed vocabulary of whitespace-separated symbols, with the special tokens first.

Synthetic tasks know their symbols in advance, so nothing needs fitting; a plain list is the
whole state and goes into the checkpoint as such. (Learned tokenizers, which need the
`tokenizers` library, come with the translation tasks.)
"""

from __future__ import annotations

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

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(s, self.unk_id) for s in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        """Symbols up to the first <eos>, without <bos> or <pad>."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(self.itos[i])
        return " ".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "vocabulary", "symbols": list(self.symbols)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Vocabulary:
        if state.get("kind") != "vocabulary":
            raise ValueError(f"not a saved Vocabulary: kind={state.get('kind')!r}")
        return cls(state["symbols"])
