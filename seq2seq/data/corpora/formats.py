"""The file formats a corpus is read from: aligned UTF-8 text files, TSV or CSV with a header
row, JSONL (any of them gzip-compressed), pair by pair, each bad line named; what ParallelFiles
caches and a stream (blocks.py) reads a block at a time."""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any

from seq2seq.data.tokenizer import clean, decode_line

__all__ = [
    "aligned_pairs", "check_streamable", "file_pairs", "jsonl_pair", "read_lines", "row_pair",
    "table_columns", "table_kind", "table_pairs", "table_reader",
]  # fmt: skip


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
