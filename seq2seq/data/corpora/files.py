"""The user's own parallel text: two aligned text files, or one TSV/CSV/JSONL file (either
optionally .gz; formats.py reads them), cached as a HuggingFace dataset keyed by every setting
and the files' size and modification time (an edited file is read again); or, streamed, its
training files read as it trains (StreamedFiles)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

from datasets import DatasetDict

from seq2seq import checks
from seq2seq.data.corpora.blocks import LineBlocks
from seq2seq.data.corpora.common import from_generator
from seq2seq.data.corpora.formats import check_streamable, file_pairs, table_kind


def _expand(setting: str, given: Any) -> tuple[str, ...]:
    """The files a setting names: a path, a glob pattern (*, ?, [...]; ** for any depth) matched
    in sorted order, or a list of either; each must exist."""
    if isinstance(given, str):
        given = [given]
    paths: list[str] = []
    for item in given:
        item = str(item)
        if glob.has_magic(item):
            matched = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not matched:
                raise ValueError(f"{setting}: no file matches {item}")
            paths += matched
        elif not Path(item).is_file():
            raise ValueError(f"{setting}: file {item} does not exist")
        else:
            paths.append(item)
    if not paths:
        raise ValueError(f"{setting} is an empty list: give a file, a glob pattern, or a list")
    return tuple(paths)


class ParallelFiles:
    """The user's corpus from local files, per split either

    - ``{src: train.en, tgt: train.de}``: two aligned plain-text files, one sentence a line;
    - ``{file: train.tsv}``: one TSV or CSV file with a header row, or JSONL, holding the
      columns src_column and tgt_column (JSONL keys may be nested: translation.de).

    Each may be a glob pattern (``file: shards/*.tsv.gz``; src and tgt patterns pair their
    files in sorted order) or a list, read as one corpus in that order. Any file may be
    gzip-compressed (.gz). A split left out (null) is split off the training
    data by the data module.

    With ``streaming=True`` it is a StreamedFiles: the training split is read as it trains.
    """

    def __new__(cls, *args: Any, streaming: bool = False, **kwargs: Any) -> ParallelFiles:
        # data.corpus.streaming=true makes the streamed kind of this corpus: the setting users
        # (and the configs of earlier runs) give, the class the data module asks for.
        checks.choice("data.corpus.streaming", streaming, (True, False))
        return super().__new__(StreamedFiles if streaming else cls)

    def __init__(
        self,
        train: dict[str, str | None],
        validation: dict[str, str | None] | None = None,
        test: dict[str, str | None] | None = None,
        src_column: str = "src",
        tgt_column: str = "tgt",
        streaming: bool = False,
    ) -> None:
        self.splits = {}
        for split, files in (("train", train), ("validation", validation), ("test", test)):
            files = {k: v for k, v in (files or {}).items() if v}
            if not files:
                if split == "train":
                    raise ValueError(
                        "data.corpus.train needs files: src=PATH tgt=PATH (aligned text "
                        "files) or file=PATH (TSV, CSV or JSONL)"
                    )
                continue
            self.splits[split] = self._check(split, files)
        self.src_column, self.tgt_column = src_column, tgt_column

    @staticmethod
    def _check(split: str, files: dict[str, str]) -> dict[str, str]:
        if "file" in files and ("src" in files or "tgt" in files):
            raise ValueError(f"data.corpus.{split}: give file=PATH or src and tgt, not both")
        if "file" not in files and not ("src" in files and "tgt" in files):
            given = ", ".join(sorted(files))
            raise ValueError(f"data.corpus.{split} needs both src and tgt files, got {given}")
        expanded = {
            key: _expand(f"data.corpus.{split}.{key}", given) for key, given in files.items()
        }
        if "file" in expanded:
            for path in expanded["file"]:
                table_kind(Path(path))
        elif len(expanded["src"]) != len(expanded["tgt"]):
            raise ValueError(
                f"data.corpus.{split}.src names {len(expanded['src'])} files but tgt names "
                f"{len(expanded['tgt'])}: give as many, paired in sorted order"
            )
        return expanded

    def load(self, data_dir: Path) -> DatasetDict:
        return DatasetDict({split: self._cached(split, data_dir) for split in self.splits})

    def _cached(self, split: str, data_dir: Path) -> Any:
        """One split's pairs, cached, keyed by the files' size and modification time."""
        files = self.splits[split]
        paths = [Path(p).resolve() for names in files.values() for p in names]
        stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
        return from_generator(
            file_pairs, Path(data_dir) / "files", files=files, src_column=self.src_column,
            tgt_column=self.tgt_column, stamps=stamps,
        )  # fmt: skip


class StreamedFiles(ParallelFiles):
    """ParallelFiles whose training split is not cached: the data module reads its files a
    block of lines at a time as training goes (corpora/blocks.py; text, TSV or JSONL,
    uncompressed), and validation and test must be given as files (a stream is not split).
    Made by ParallelFiles(..., streaming=True)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        missing = [split for split in ("validation", "test") if split not in self.splits]
        if missing:
            raise ValueError(
                f"data.corpus.streaming=true needs data.corpus.{missing[0]} files: a stream "
                "is read as it trains and is not split (give held-out files, or set "
                "data.corpus.streaming=false)"
            )
        for key, paths in self.splits["train"].items():
            for path in paths:
                check_streamable(Path(path), aligned=key != "file")

    def load(self, data_dir: Path) -> DatasetDict:
        """The held-out splits; the training split is train_stream()'s."""
        return DatasetDict({split: self._cached(split, data_dir) for split in self.splits
                            if split != "train"})  # fmt: skip

    def train_stream(self, data_dir: Path) -> LineBlocks:
        """The training files by block (the index of their lines cached under data_dir)."""
        return LineBlocks(self.splits["train"], self.src_column, self.tgt_column, data_dir)
