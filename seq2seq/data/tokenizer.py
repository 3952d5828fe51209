"""Tokenizers for text: characters, words, or BPE learned from the training split.

Every tokenizer has the interface of `Vocabulary` (encode, decode, token_label, len, the
special ids 0-3, to_dict/from_dict), so the model, decoding and the command-line tools never
ask which one they hold. The saved form is plain values (for words and BPE, the `tokenizers`
library's JSON), so a checkpoint carries its tokenizers and loads with weights_only=True.

    kind    tokens                                   decode(encode(text)) == text
    symbol  whitespace-separated symbols (copy, ...)  up to whitespace
    char    characters                               yes, for characters seen in training
    word    words and punctuation marks              up to spacing around punctuation
    bpe     byte-level BPE subwords                  yes, any Unicode text (no <unk> ever)
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from seq2seq import checks
from seq2seq.data.vocab import SPECIALS, UNK, CharVocabulary, Vocabulary, strip_specials

KINDS = ("char", "word", "bpe")


def decode_line(raw: bytes, source: str, number: int) -> str:
    """One line of UTF-8 bytes as text, without its line end; bad bytes fail naming the
    source, the line and the byte."""
    try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{source} line {number} is not valid UTF-8 (byte {raw[error.start]:#04x} at column "
            f"{error.start + 1}); convert it, e.g. iconv -f latin1 -t utf-8"
        ) from None
    return line.rstrip("\r\n")


def text_lines(raw: bytes, source: str) -> list[str]:
    """The lines of a text file's bytes, split at "\\n" alone as training files are read
    (a bare "\\r" stays inside its line, and "\\r\\n" ends one), so that translate,
    score and the corpora count the same lines."""
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the last line's end (or an empty file)
    return [decode_line(line, source, number) for number, line in enumerate(lines, 1)]


def clean(text: str) -> str:
    """What every text goes through before tokenizing, in training and in translate: NFC
    normalisation ("Ko\u0308ln" and "Köln" become the same characters) and stripping."""
    return unicodedata.normalize("NFC", text).strip()


class LearnedTokenizer:
    """A word-level or byte-level BPE tokenizer of the HuggingFace `tokenizers` library.

    Wrapped rather than used bare so it shares Vocabulary's interface: the special tokens are
    the first four ids, encode adds none, decode stops at <eos>.
    """

    pad_id, bos_id, eos_id, unk_id = range(4)

    def __init__(self, kind: str, tokenizer: Any) -> None:
        if kind not in ("word", "bpe"):
            raise ValueError(f"a learned tokenizer is 'word' or 'bpe', got {kind!r}")
        self.kind = kind
        self.tokenizer = tokenizer
        specials = [tokenizer.token_to_id(token) for token in SPECIALS]
        if specials != [0, 1, 2, 3]:
            raise ValueError(f"the special tokens {SPECIALS} must have ids 0-3, got {specials}")

    @classmethod
    def fit(
        cls, kind: str, texts: Iterable[str], vocab_size: int, min_frequency: int = 1
    ) -> LearnedTokenizer:
        from tokenizers import Tokenizer as Library
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if kind == "word":
            tokenizer = Library(models.WordLevel(unk_token=UNK))
            tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ and [^\w\s]+ runs
            trainer = trainers.WordLevelTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency,
                special_tokens=list(SPECIALS), show_progress=False,
            )  # fmt: skip
        elif kind == "bpe":
            # Byte-level: every string is some sequence of the 256 byte tokens, so nothing is
            # ever unknown and decoding gives back the exact text, spaces and accents included.
            tokenizer = Library(models.BPE())
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency,
                special_tokens=list(SPECIALS), show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            )  # fmt: skip
        else:
            raise ValueError(f"a learned tokenizer is 'word' or 'bpe', got {kind!r}")
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(kind, tokenizer)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LearnedTokenizer) and self.to_dict() == other.to_dict()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text up to the first <eos>, without <bos> or <pad> (an <unk> stays visible)."""
        return self.tokenizer.decode(strip_specials(ids, self), skip_special_tokens=False)

    def token_label(self, i: int) -> str:
        # Byte-level tokens are stored with bytes mapped to printable symbols ("Ġ" is a
        # space); decoding one token alone shows the text it stands for.
        if self.kind == "bpe" and i >= len(SPECIALS):
            return self.tokenizer.decode([i])
        return self.tokenizer.id_to_token(i)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "json": self.tokenizer.to_str()}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LearnedTokenizer:
        from tokenizers import Tokenizer as Library

        return cls(state["kind"], Library.from_str(state["json"]))


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer of the project is (Vocabulary, CharVocabulary, LearnedTokenizer;
    not the `tokenizers` library's Tokenizer, which LearnedTokenizer wraps): the data module,
    the model's sizes, decoding and the tools read nothing else."""

    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    def __len__(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_label(self, i: int) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


def check_tokenizer_settings(kind: Any, vocab_size: Any, min_frequency: Any) -> None:
    """data.tokenizer's values, checked before any text is read."""
    checks.choice("data.tokenizer.kind", kind, KINDS)
    checks.integer("data.tokenizer.min_frequency", min_frequency, minimum=1)
    if vocab_size is None:
        if kind != "char":
            raise ValueError(f"data.tokenizer.vocab_size is needed for kind={kind!r}, e.g. 8000")
        return
    if not checks.is_integer(vocab_size) or vocab_size <= len(SPECIALS):
        raise ValueError(
            f"data.tokenizer.vocab_size must exceed the {len(SPECIALS)} special tokens, "
            f"got {checks.describe(vocab_size)}"
        )


def fit_tokenizer(
    kind: str, texts: Iterable[str], vocab_size: int | None = None, min_frequency: int = 1
) -> Tokenizer:
    """A tokenizer of the given kind fitted on texts (the training split)."""
    check_tokenizer_settings(kind, vocab_size, min_frequency)
    if kind == "char":
        return CharVocabulary.fit(texts, vocab_size, min_frequency)
    return LearnedTokenizer.fit(kind, texts, vocab_size, min_frequency)


def tokenizer_from_dict(state: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from its to_dict() (as saved in checkpoints)."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == Vocabulary.kind:
        return Vocabulary.from_dict(state)
    if kind == CharVocabulary.kind:
        return CharVocabulary.from_dict(state)
    if kind in ("word", "bpe"):
        return LearnedTokenizer.from_dict(state)
    raise ValueError(f"not a saved tokenizer: kind={kind!r}")


def save_tokenizer(tokenizer: Tokenizer, path: Any) -> None:
    path.write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")


def load_tokenizer(path: Any) -> Tokenizer:
    return tokenizer_from_dict(json.loads(path.read_text(encoding="utf-8")))
