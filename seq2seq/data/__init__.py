"""Data: synthetic tasks, vocabularies and the LightningDataModules that batch them."""

from seq2seq.data.datamodule import Seq2SeqDataModule, SyntheticDataModule, collate
from seq2seq.data.vocab import Vocabulary

__all__ = ["Seq2SeqDataModule", "SyntheticDataModule", "Vocabulary", "collate"]
