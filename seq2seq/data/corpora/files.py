"""The user's own parallel text: two aligned text files, or one TSV/CSV/JSONL file (either
optionally .gz), cached as a HuggingFace dataset keyed by every setting and the files' size and
modification time (an edited file is read again)."""

from __future__ import annotations

import csv
import glob
import gzip
import json
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any

from datasets import DatasetDict

from seq2seq import checks
from seq2seq.data.corpora.common import from_generator
from seq2seq.data.tokenizer import clean, decode_line


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (or .gz), without line ends; bad bytes name the line."""
    with _open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            yield decode_line(raw, str(path), number)


def _count_lines(lines: Iterator[str]) -> int:
    return sum(1 for _ in lines)


def aligned_pairs(src: Path, tgt: Path) -> Iterator[dict[str, str]]:
    """Line i of src with line i of tgt; files of different lengths fail with both counts."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    number = 0
    for number, (source, target) in enumerate(zip_longest(src_lines, tgt_lines), 1):
        if source is None or target is None:
            n_src = number - 1 + (source is not None) + _count_lines(src_lines)
            n_tgt = number - 1 + (target is not None) + _count_lines(tgt_lines)
            raise ValueError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}: the files must be aligned, "
                "one sentence a line"
            )
        yield {"src": clean(source), "tgt": clean(target)}
    if number == 0:
        raise ValueError(f"{src} and {tgt} are empty: give files with one sentence a line")


def _field(record: dict[str, Any], column: str) -> Any:
    """record["a"]["b"] for column "a.b" (e.g. translation.de), or KeyError."""
    value: Any = record
    for key in column.split("."):
        if not isinstance(value, dict):
            raise KeyError(column)
        value = value[key]
    return value


def jsonl_pair(line: str, path: Path, number: int, src_column: str, tgt_column: str):
    """The pair of one JSONL line (None for a blank line); a bad line fails naming it."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
        pair = {"src": _field(record, src_column), "tgt": _field(record, tgt_column)}
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} line {number} is not valid JSON: {error.msg}") from None
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"{path} line {number} has no field {error.args[0]!r}; set "
            "data.corpus.src_column and tgt_column to its keys (a.b for nested ones)"
        ) from None
    return {"src": clean(str(pair["src"])), "tgt": clean(str(pair["tgt"]))}


def table_reader(lines: Iterable[str], kind: str) -> Any:
    """csv.reader of TSV (no quoting: a field may hold quotes) or CSV lines."""
    if kind == "tsv":
        return csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    return csv.reader(lines, delimiter=",", quoting=csv.QUOTE_MINIMAL)


def table_columns(path: Path, kind: str, header: list[str] | None, src_column: str,
                  tgt_column: str) -> tuple[int, int]:  # fmt: skip
    """Where src_column and tgt_column are in a TSV or CSV header; a missing one fails naming
    the header."""
    if header is None:
        raise ValueError(f"{path} is empty: a {kind.upper()} file needs a header row")
    missing = [c for c in (src_column, tgt_column) if c not in header]
    if missing:
        raise ValueError(
            f"{path} has no column {missing[0]!r} (its header: {', '.join(header)}); set "
            "data.corpus.src_column and tgt_column"
        )
    return header.index(src_column), header.index(tgt_column)


def row_pair(row: list[str], width: int, columns: tuple[int, int], path: Path, number: int):
    """The pair of one TSV or CSV row (None for an empty row); a row of the wrong width fails
    naming its line."""
    if not row:
        return None
    if len(row) != width:
        raise ValueError(f"{path} line {number} has {len(row)} fields but the header has {width}")
    return {"src": clean(row[columns[0]]), "tgt": clean(row[columns[1]])}


def table_pairs(path: Path, src_column: str, tgt_column: str) -> Iterator[dict[str, str]]:
    """Pairs from a TSV or CSV file with a header row, or a JSONL file of objects."""
    kind = table_kind(path)
    lines = read_lines(path)
    count = 0
    if kind == "jsonl":
        pairs = (
            jsonl_pair(line, path, n, src_column, tgt_column) for n, line in enumerate(lines, 1)
        )
    else:
        reader = table_reader(lines, kind)
        header = next(reader, None)
        columns = table_columns(path, kind, header, src_column, tgt_column)
        pairs = (row_pair(row, len(header), columns, path, reader.line_num) for row in reader)
    for pair in pairs:
        if pair is not None:
            count += 1
            yield pair
    if count == 0:
        raise ValueError(f"{path} has no pairs: it is empty or holds only a header")


def table_kind(path: Path) -> str:
    suffix = Path(path.name.removesuffix(".gz")).suffix.lower()
    kinds = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
    if suffix not in kinds:
        raise ValueError(
            f"cannot tell the format of {path} from its name: use .tsv, .csv or .jsonl "
            "(optionally .gz), or give two aligned text files as src and tgt"
        )
    return kinds[suffix]


def check_streamable(path: Path, aligned: bool) -> None:
    """Refuses a file that cannot be read a block at a time: gzip, or CSV."""
    if Path(path).name.endswith(".gz"):
        raise ValueError(
            f"data.corpus.streaming=true reads blocks from the middle of a file, which "
            f"{path} (gzip) cannot give: decompress it (gunzip -k {path}), or set "
            "data.corpus.streaming=false"
        )
    if not aligned and table_kind(Path(path)) == "csv":
        raise ValueError(
            f"data.corpus.streaming=true reads a file by lines, and a CSV field may span "
            f"lines ({path}): convert it to TSV or JSONL, or set data.corpus.streaming=false"
        )


def file_pairs(
    files: dict[str, tuple[str, ...]], src_column: str, tgt_column: str, stamps: tuple[Any, ...]
) -> Iterator[dict[str, str]]:
    """The generator behind ParallelFiles: the pairs of every file in order (of src and tgt
    files, the i-th of each aligned); `stamps` only keys the cache."""
    if files.get("file"):
        for path in files["file"]:
            yield from table_pairs(Path(path), src_column, tgt_column)
    else:
        for src, tgt in zip(files["src"], files["tgt"], strict=True):
            yield from aligned_pairs(Path(src), Path(tgt))


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

    With ``streaming=True`` the training split is not cached: the data module reads its files
    (``train_files``) a block of lines at a time as training goes (corpora/blocks.py; text,
    TSV or JSONL, uncompressed), and validation and test must be given as files (a stream is
    not split).
    """

    def __init__(
        self,
        train: dict[str, str | None],
        validation: dict[str, str | None] | None = None,
        test: dict[str, str | None] | None = None,
        src_column: str = "src",
        tgt_column: str = "tgt",
        streaming: bool = False,
    ) -> None:
        self.streaming = checks.choice("data.corpus.streaming", streaming, (True, False))
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
        if streaming:
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
        cache_dir = Path(data_dir) / "files"
        out = {}
        for split, files in self.splits.items():
            if split == "train" and self.streaming:  # read as it trains: train_files
                continue
            paths = [Path(p).resolve() for names in files.values() for p in names]
            stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
            out[split] = from_generator(
                file_pairs, cache_dir, files=files, src_column=self.src_column,
                tgt_column=self.tgt_column, stamps=stamps,
            )  # fmt: skip
        return DatasetDict(out)

    def train_files(self) -> tuple[dict[str, tuple[str, ...]], str, str]:
        """What a stream of the training split reads (corpora/blocks.py's LineBlocks): its
        files, and the source and target columns."""
        return self.splits["train"], self.src_column, self.tgt_column
