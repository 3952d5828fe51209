"""A training split read from its files a block of lines at a time, in any order, without a
copy of it cached (data.corpus.streaming=true).

One pass over the files finds where every BLOCK_LINES-th line starts (a few MB of offsets for
10^8 lines, cached under data_dir/stream_index, keyed by the files' size and modification
time); a block is then one seek and one read. Line-based files only: two aligned text files,
TSV (no quoting) or JSONL, uncompressed. A CSV field may hold a line break, so its lines are
not its rows, and a gzip file cannot be read from the middle.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.data.corpora.formats import (
    check_streamable,
    jsonl_pair,
    row_pair,
    table_columns,
    table_kind,
    table_reader,
)
from seq2seq.data.tokenizer import clean, decode_line

BLOCK_LINES = 256  # lines a block: the unit of the stream's shuffle (and of one read)
READ_BYTES = 1 << 24  # read a file 16 MiB at a time while indexing it
VERSION = 1  # of the cached index


def block_starts(path: Path, skip: int) -> tuple[np.ndarray, int]:
    """Byte offsets where blocks of BLOCK_LINES lines start, after `skip` lines (a header),
    with the file's size last; and how many lines there are after those skipped."""
    size = path.stat().st_size
    starts, seen = [np.zeros(1, dtype=np.int64)] if size else [], 1 if size else 0
    with open(path, "rb") as f:
        at = 0
        while chunk := f.read(READ_BYTES):
            ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10) + at + 1
            ends = ends[ends < size]  # a line starts after each line end but the file's last
            starts.append(ends.astype(np.int64))
            seen += len(ends)
            at += len(chunk)
    every = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    lines = max(seen - skip, 0)
    return np.append(every[skip::BLOCK_LINES], size), lines


def _stamps(paths: list[Path]) -> list[tuple[str, int, int]]:
    return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]


class LineBlocks:
    """The pairs of a split's files, by block.

    Args:
        files: {"src": paths, "tgt": paths} (aligned text files, the i-th of each paired) or
            {"file": paths} (TSV or JSONL), as ParallelFiles expands them.
        src_column, tgt_column: the columns (TSV) or keys (JSONL) of a table file.
        data_dir: where the index is cached.
    """

    def __init__(
        self, files: dict[str, tuple[str, ...]], src_column: str, tgt_column: str, data_dir: Path
    ) -> None:
        self.src_column, self.tgt_column = src_column, tgt_column
        self.aligned = "file" not in files
        groups = list(zip(files["src"], files["tgt"], strict=True)) if self.aligned else [
            (f,) for f in files["file"]
        ]  # fmt: skip
        self.groups = [tuple(Path(p) for p in group) for group in groups]
        for group in self.groups:
            for path in group:
                check_streamable(path, self.aligned)
        paths = [path for group in self.groups for path in group]
        settings = [VERSION, BLOCK_LINES, _stamps(paths), src_column, tgt_column]
        self.key = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
        self._index = self._indexed(Path(data_dir) / "stream_index" / f"{self.key}.npz")
        # Per block: its group (file or file pair) and its number there.
        counts = [len(starts[0]) - 1 for starts in self._index["starts"]]
        self.blocks = np.concatenate(
            [np.stack([np.full(n, g), np.arange(n)], axis=1) for g, n in enumerate(counts)]
        ).astype(np.int64)
        self.lines = sum(self._index["lines"])
        # Per group: where a TSV file's source and target columns are (None: not TSV).
        self._columns = [
            None if header is None
            else table_columns(group[0], "tsv", header, src_column, tgt_column)
            for group, header in zip(self.groups, self._index["headers"], strict=True)
        ]  # fmt: skip
        self._open: dict[Path, Any] = {}

    def _header(self, path: Path) -> list[str] | None:
        """A TSV file's header row (None for JSONL and text files)."""
        if self.aligned or table_kind(path) != "tsv":
            return None
        with open(path, "rb") as f:
            first = f.readline()
        return next(table_reader([decode_line(first, str(path), 1)], "tsv"), None)

    def _indexed(self, cached: Path) -> dict[str, Any]:
        """Each group's block starts (per file) and lines: read from the cache, or made by one
        pass over the files and cached."""
        if cached.is_file():
            with np.load(cached, allow_pickle=False) as saved:
                meta = json.loads(str(saved["meta"]))
                starts = [[saved[f"{g}-{i}"] for i in range(n)] for g, n in enumerate(meta["n"])]
                return {"starts": starts, "lines": meta["lines"], "headers": meta["headers"]}
        starts, lines, headers = [], [], []
        for group in self.groups:
            header = self._header(group[0])
            if header is not None:
                table_columns(group[0], "tsv", header, self.src_column, self.tgt_column)
            indexed = [block_starts(path, skip=0 if header is None else 1) for path in group]
            counts = [count for _, count in indexed]
            if len(set(counts)) > 1:
                raise ValueError(
                    f"{group[0]} has {counts[0]} lines but {group[1]} has {counts[1]}: the files "
                    "must be aligned, one sentence a line"
                )
            if counts[0] == 0:
                raise ValueError(f"{group[0]} has no pairs: it is empty or holds only a header")
            starts.append([offsets for offsets, _ in indexed])
            lines.append(counts[0])
            headers.append(header)
        from seq2seq.files import written_whole  # the project's one way to replace a file whole

        arrays = {f"{g}-{i}": a for g, group in enumerate(starts) for i, a in enumerate(group)}
        meta = {"n": [len(group) for group in starts], "lines": lines, "headers": headers}
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
        cached.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(cached) as part:
            part.write_bytes(buffer.getvalue())
        return {"starts": starts, "lines": lines, "headers": headers}

    def __len__(self) -> int:
        return len(self.blocks)

    def _lines(self, group: int, file: int, block: int) -> Iterator[tuple[int, str]]:
        """(line number in the file, text) of one block of one file."""
        path = self.groups[group][file]
        offsets = self._index["starts"][group][file]
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = open(path, "rb")  # noqa: SIM115 (kept for the next read)
        handle.seek(int(offsets[block]))
        raw = handle.read(int(offsets[block + 1] - offsets[block]))
        raw = raw[:-1] if raw.endswith(b"\n") else raw  # the last line's end ends no line
        skip = 0 if self._index["headers"][group] is None else 1
        first = skip + block * BLOCK_LINES + 1
        for number, line in enumerate(raw.split(b"\n"), first):
            yield number, decode_line(line, str(path), number)

    def read(self, block: int) -> list[dict[str, str]]:
        """The pairs of one block, in file order (blank JSONL lines and empty TSV rows left
        out; empty sentences kept, as the cached path reads them)."""
        group, number = (int(v) for v in self.blocks[block])
        if self.aligned:
            src, tgt = self._lines(group, 0, number), self._lines(group, 1, number)
            return [
                {"src": clean(s), "tgt": clean(t)} for (_, s), (_, t) in zip(src, tgt, strict=True)
            ]
        path, header = self.groups[group][0], self._index["headers"][group]
        lines = list(self._lines(group, 0, number))
        if header is None:
            pairs = (
                jsonl_pair(text, path, n, self.src_column, self.tgt_column) for n, text in lines
            )
        else:
            rows = table_reader([text for _, text in lines], "tsv")
            columns = self._columns[group]
            pairs = (
                row_pair(row, len(header), columns, path, n)
                for (n, _), row in zip(lines, rows, strict=True)
            )
        return [pair for pair in pairs if pair is not None]

    def sample(self, size: int | None, seed: int) -> Iterator[dict[str, str]]:
        """The pairs of whole blocks drawn at random with the seed, each block in file order,
        `size` of them at most (None: all): a tokenizer's sample, read without a pass over the
        corpus."""
        given = 0
        for block in np.random.default_rng(seed).permutation(len(self)).tolist():
            pairs = self.read(block)
            if size is not None:
                pairs = pairs[: size - given]
            given += len(pairs)
            yield from pairs
            if size is not None and given >= size:
                return
