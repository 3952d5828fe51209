"""Where the text pairs come from: made offline from a seed, read from files, or the hub.

A corpus (the Corpus protocol) has one method, ``load(data_dir) -> DatasetDict`` of text pairs
("src", "tgt"), with a "train" split and, where the corpus has them, "validation" and "test"
(the data module splits off any that are missing). Pairs are NFC-normalised and stripped; the
data module drops empty ones and counts them. A corpus whose tokens are known in advance
(SymbolTask; the CorpusWithTokenizers protocol) also has ``tokenizers() -> (source, target)``;
the others' are fitted on the training split. A corpus whose training split is read as it
trains (StreamedFiles, what ParallelFiles(streaming=True) makes; the StreamedCorpus protocol)
also has ``train_stream(data_dir)``, and its load() gives the held-out splits alone.

    SymbolTask    copy, reverse or sort symbols: "3 9 4" -> "4 9 3" (its own fixed tokenizers)
    NumberWords   "three hundred and forty-seven" -> "dreihundertsiebenundvierzig" (num2words)
    Dates         "Sonntag, 29. November 2026" -> "2026-11-29" (Babel)
    ParallelFiles two aligned text files, or one TSV/CSV/JSONL file (optionally .gz)
    HubCorpus     a HuggingFace hub dataset with a translation column (online only)

The generated corpora and the files are cached as HuggingFace datasets under data_dir; the
cache key covers every setting, and for files their size and modification time, so an edited
file is read again.
"""

from seq2seq.data.corpora.common import (
    SPLITS,
    Corpus,
    CorpusWithTokenizers,
    StreamedCorpus,
    check_sizes,
    population_split,
)
from seq2seq.data.corpora.files import ParallelFiles, StreamedFiles
from seq2seq.data.corpora.formats import aligned_pairs, read_lines, table_pairs
from seq2seq.data.corpora.generated import Dates, NumberWords, date_text, number_text
from seq2seq.data.corpora.hub import HubCorpus
from seq2seq.data.corpora.symbols import SymbolTask

__all__ = [
    "SPLITS",
    "Corpus",
    "CorpusWithTokenizers",
    "Dates",
    "HubCorpus",
    "NumberWords",
    "ParallelFiles",
    "StreamedCorpus",
    "StreamedFiles",
    "SymbolTask",
    "aligned_pairs",
    "check_sizes",
    "date_text",
    "number_text",
    "population_split",
    "read_lines",
    "table_pairs",
]
