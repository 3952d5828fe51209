"""Data: corpora, tokenizers, and the LightningDataModules that batch them.

The names below load on first use (PEP 562): `translate`, `score` and `export` read tokenizers
(seq2seq.data.tokenizer) and would otherwise import Lightning, 3 of the 6 seconds a
`translate --model` took to start, for a data module they never use.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CharVocabulary": "seq2seq.data.vocab",
    "Seq2SeqDataModule": "seq2seq.data.datamodule",
    "TranslationDataModule": "seq2seq.data.translation",
    "Vocabulary": "seq2seq.data.vocab",
    "collate": "seq2seq.data.datamodule",
    "fit_tokenizer": "seq2seq.data.tokenizer",
    "tokenizer_from_dict": "seq2seq.data.tokenizer",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
