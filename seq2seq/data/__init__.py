"""Data: corpora, tokenizers, and the LightningDataModules that batch them."""

from seq2seq.data.datamodule import Seq2SeqDataModule, collate
from seq2seq.data.tokenizer import fit_tokenizer, tokenizer_from_dict
from seq2seq.data.translation import TranslationDataModule
from seq2seq.data.vocab import CharVocabulary, Vocabulary

__all__ = [
    "CharVocabulary",
    "Seq2SeqDataModule",
    "TranslationDataModule",
    "Vocabulary",
    "collate",
    "fit_tokenizer",
    "tokenizer_from_dict",
]
