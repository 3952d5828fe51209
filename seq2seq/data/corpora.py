"""Where translation pairs come from: made offline from a seed, read from files, or the hub.

A corpus has one method, ``load(data_dir) -> DatasetDict`` of text pairs ("src", "tgt"), with
a "train" split and, where the corpus has them, "validation" and "test" (the data module
splits off any that are missing). Pairs are NFC-normalised and stripped; the data module
drops empty ones and counts them.

    NumberWords   "three hundred and forty-seven" -> "dreihundertsiebenundvierzig" (num2words)
    Dates         "Sonntag, 29. November 2026" -> "2026-11-29" (Babel)
    ParallelFiles two aligned text files, or one TSV/CSV/JSONL file (optionally .gz)
    HubCorpus     a HuggingFace hub dataset with a translation column (online only)

The generated corpora and the files are cached as HuggingFace datasets under data_dir; the
cache key covers every setting, and for files their size and modification time, so an edited
file is read again.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import json
import logging
import os
import random
import socket
from collections.abc import Callable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from datasets import Dataset, DatasetDict

from seq2seq import checks
from seq2seq.data.tokenizer import clean, decode_line

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


def _from_generator(generator: Callable, cache_dir: Path, **gen_kwargs: Any) -> Dataset:
    """Dataset.from_generator, with our own ValueErrors passed through unwrapped.

    datasets wraps any error of the generator in DatasetGenerationError; a bad file should
    read as its one-line message. Lists in gen_kwargs are shards to datasets (the generator
    would run once per element), so callers pass tuples.
    """
    if any(isinstance(value, list) for value in gen_kwargs.values()):
        raise TypeError("pass tuples, not lists, in gen_kwargs: datasets shards lists")
    from datasets.exceptions import DatasetGenerationError

    try:
        return Dataset.from_generator(
            generator, gen_kwargs=gen_kwargs, cache_dir=str(cache_dir), split="train"
        )
    except DatasetGenerationError as error:
        cause = error.__cause__
        while cause is not None and not isinstance(cause, ValueError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


# ----------------------------------------------------------------------------------------
# Generated corpora: a population of items numbered 0..N-1, held-out items drawn first.


def check_sizes(population: int, train_size: int, val_size: int, test_size: int, what: str):
    sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
    for name, size in sizes.items():
        checks.integer(f"data.corpus.{name}", size, minimum=1)
    if val_size + test_size > population // 2:
        raise ValueError(
            f"data.corpus.val_size + test_size = {val_size + test_size} exceeds half of the "
            f"{population} distinct {what}; lower the sizes or widen the range"
        )


def population_split(
    population: int, split: str, train_size: int, val_size: int, test_size: int, seed: int
) -> Iterator[int]:
    """Item numbers of one split. Validation and test items are distinct and drawn first; the
    training items are drawn (with repeats) from the rest, so no test item is ever trained on.
    """
    held_out = random.Random(f"held-out-{seed}").sample(range(population), val_size + test_size)
    if split == "validation":
        yield from held_out[:val_size]
    elif split == "test":
        yield from held_out[val_size:]
    elif split == "train":
        excluded = set(held_out)
        rng = random.Random(f"train-{seed}")
        made = 0
        while made < train_size:
            item = rng.randrange(population)
            if item not in excluded:
                made += 1
                yield item
    else:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")


def _generated(generator: Callable, data_dir: Path, name: str, **kwargs: Any) -> DatasetDict:
    cache_dir = Path(data_dir) / name
    return DatasetDict(
        {split: _from_generator(generator, cache_dir, split=split, **kwargs) for split in SPLITS}
    )


def number_text(number: int, lang: str, form: str) -> str:
    """347 as "347" (form "digits") or in words of lang ("dreihundertsiebenundvierzig")."""
    if form == "digits":
        return str(number)
    from num2words import num2words

    return num2words(number, lang=lang)


def number_pairs(
    split: str, src_lang: str, src_form: str, tgt_lang: str, tgt_form: str,
    low: int, high: int, train_size: int, val_size: int, test_size: int, seed: int,
) -> Iterator[dict[str, str]]:  # fmt: skip
    for item in population_split(high - low + 1, split, train_size, val_size, test_size, seed):
        number = low + item
        yield {
            "src": number_text(number, src_lang, src_form),
            "tgt": number_text(number, tgt_lang, tgt_form),
        }


class NumberWords:
    """Numbers written in one language (or as digits) to another, with num2words.

    Args:
        src_lang, tgt_lang: num2words language codes ("en", "de", "fr", ...).
        src_form, tgt_form: "words" or "digits".
        low, high: the numbers drawn, uniformly, from low..high inclusive.
        train_size, val_size, test_size: pairs per split; test numbers never occur in training.
        seed: the same seed always gives the same pairs.
    """

    def __init__(
        self,
        src_lang: str = "en",
        tgt_lang: str = "de",
        src_form: str = "words",
        tgt_form: str = "words",
        low: int = 0,
        high: int = 9999,
        train_size: int = 20000,
        val_size: int = 500,
        test_size: int = 1000,
        seed: int = 0,
    ) -> None:
        from num2words import CONVERTER_CLASSES

        for side, lang, form in (("src", src_lang, src_form), ("tgt", tgt_lang, tgt_form)):
            if form not in ("words", "digits"):
                raise ValueError(f"data.corpus.{side}_form must be words or digits, got {form!r}")
            if form == "words" and lang not in CONVERTER_CLASSES:
                raise ValueError(
                    f"data.corpus.{side}_lang={lang!r} is not a num2words language; "
                    f"choose one of {', '.join(sorted(CONVERTER_CLASSES))}"
                )
        if not 0 <= low <= high:
            raise ValueError(f"need 0 <= low <= high, got low={low} and high={high}")
        check_sizes(high - low + 1, train_size, val_size, test_size, "numbers")
        self.kwargs = dict(
            src_lang=src_lang, src_form=src_form, tgt_lang=tgt_lang, tgt_form=tgt_form,
            low=low, high=high, train_size=train_size, val_size=val_size,
            test_size=test_size, seed=seed,
        )  # fmt: skip

    def load(self, data_dir: Path) -> DatasetDict:
        return _generated(number_pairs, data_dir, "numbers", **self.kwargs)


def date_text(date: datetime.date, locale: str, form: str) -> str:
    """The date in a Babel locale and format (full, long, medium, short or a CLDR pattern
    such as "d. MMMM y"), or locale "iso": 2026-11-29."""
    if locale == "iso":
        return date.isoformat()
    from babel.dates import format_date

    return format_date(date, format=form, locale=locale)


def date_pairs(
    split: str, src_locale: str, src_forms: tuple[str, ...], tgt_locale: str, tgt_form: str,
    start: str, end: str, train_size: int, val_size: int, test_size: int, seed: int,
) -> Iterator[dict[str, str]]:  # fmt: skip
    first = datetime.date.fromisoformat(start)
    days = (datetime.date.fromisoformat(end) - first).days + 1
    population = days * len(src_forms)
    for item in population_split(population, split, train_size, val_size, test_size, seed):
        date = first + datetime.timedelta(days=item // len(src_forms))
        form = src_forms[item % len(src_forms)]
        yield {
            "src": date_text(date, src_locale, form),
            "tgt": date_text(date, tgt_locale, tgt_form),
        }


class Dates:
    """A date written out in one locale to ISO 8601 (or to another locale), with Babel.

    Args:
        src_locale: e.g. "de_DE"; src_forms: the formats drawn from for each source date.
        tgt_locale: "iso" or a locale; tgt_form: its format (ignored for iso).
        start, end: the dates drawn, uniformly, from start..end (ISO, inclusive).
        train_size, val_size, test_size: pairs per split; a (date, format) of the test split
            never occurs in training.
        seed: the same seed always gives the same pairs.
    """

    def __init__(
        self,
        src_locale: str = "de_DE",
        src_forms: tuple[str, ...] = ("full", "long", "medium"),
        tgt_locale: str = "iso",
        tgt_form: str = "long",
        start: str = "1900-01-01",
        end: str = "2099-12-31",
        train_size: int = 20000,
        val_size: int = 500,
        test_size: int = 1000,
        seed: int = 0,
    ) -> None:
        from babel import Locale, UnknownLocaleError

        locales = [("src_locale", src_locale)]
        if tgt_locale != "iso":
            locales.append(("tgt_locale", tgt_locale))
        for name, locale in locales:
            try:
                Locale.parse(locale)
            except (UnknownLocaleError, ValueError):
                raise ValueError(
                    f"data.corpus.{name}={locale!r} is not a locale Babel knows, "
                    "e.g. de_DE, en_US, fr_FR (or tgt_locale=iso)"
                ) from None
        src_forms = tuple(src_forms)
        if not src_forms:
            raise ValueError("data.corpus.src_forms is empty; give at least one, e.g. [long]")
        try:
            first, last = datetime.date.fromisoformat(start), datetime.date.fromisoformat(end)
        except ValueError as error:
            raise ValueError(f"data.corpus.start and end must be ISO dates: {error}") from None
        if last < first:
            raise ValueError(f"data.corpus.end={end} is before start={start}")
        days = (last - first).days + 1
        check_sizes(days * len(src_forms), train_size, val_size, test_size, "dates and formats")
        self.kwargs = dict(
            src_locale=src_locale, src_forms=src_forms, tgt_locale=tgt_locale,
            tgt_form=tgt_form, start=start, end=end, train_size=train_size,
            val_size=val_size, test_size=test_size, seed=seed,
        )  # fmt: skip

    def load(self, data_dir: Path) -> DatasetDict:
        return _generated(date_pairs, data_dir, "dates", **self.kwargs)


# ----------------------------------------------------------------------------------------
# The user's files.


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


def table_pairs(path: Path, src_column: str, tgt_column: str) -> Iterator[dict[str, str]]:
    """Pairs from a TSV or CSV file with a header row, or a JSONL file of objects."""
    kind = table_kind(path)
    lines = read_lines(path)
    count = 0
    if kind == "jsonl":
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
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
            count += 1
            yield {"src": clean(str(pair["src"])), "tgt": clean(str(pair["tgt"]))}
    else:
        delimiter = "\t" if kind == "tsv" else ","
        quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
        reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty: a {kind.upper()} file needs a header row")
        missing = [c for c in (src_column, tgt_column) if c not in header]
        if missing:
            raise ValueError(
                f"{path} has no column {missing[0]!r} (its header: {', '.join(header)}); set "
                "data.corpus.src_column and tgt_column"
            )
        src_index, tgt_index = header.index(src_column), header.index(tgt_column)
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path} line {reader.line_num} has {len(row)} fields but the header has "
                    f"{len(header)}"
                )
            count += 1
            yield {"src": clean(row[src_index]), "tgt": clean(row[tgt_index])}
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


def file_pairs(
    files: dict[str, str], src_column: str, tgt_column: str, stamps: tuple[Any, ...]
) -> Iterator[dict[str, str]]:
    """The generator behind ParallelFiles; `stamps` only keys the cache."""
    if files.get("file"):
        yield from table_pairs(Path(files["file"]), src_column, tgt_column)
    else:
        yield from aligned_pairs(Path(files["src"]), Path(files["tgt"]))


class ParallelFiles:
    """The user's corpus from local files, per split either

    - ``{src: train.en, tgt: train.de}``: two aligned plain-text files, one sentence a line;
    - ``{file: train.tsv}``: one TSV or CSV file with a header row, or JSONL, holding the
      columns src_column and tgt_column (JSONL keys may be nested: translation.de).

    Any file may be gzip-compressed (.gz). A split left out (null) is split off the training
    data by the data module.
    """

    def __init__(
        self,
        train: dict[str, str | None],
        validation: dict[str, str | None] | None = None,
        test: dict[str, str | None] | None = None,
        src_column: str = "src",
        tgt_column: str = "tgt",
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
        for key, path in files.items():
            if not Path(path).is_file():
                raise ValueError(f"data.corpus.{split}.{key}: file {path} does not exist")
        if "file" in files:
            table_kind(Path(files["file"]))
        return files

    def load(self, data_dir: Path) -> DatasetDict:
        cache_dir = Path(data_dir) / "files"
        out = {}
        for split, files in self.splits.items():
            paths = [Path(p).resolve() for p in files.values()]
            stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
            out[split] = _from_generator(
                file_pairs, cache_dir, files=files, src_column=self.src_column,
                tgt_column=self.tgt_column, stamps=stamps,
            )  # fmt: skip
        return DatasetDict(out)


# ----------------------------------------------------------------------------------------
# The HuggingFace hub.


class HubCorpus:
    """A hub dataset with a translation column ({lang: text}), e.g. name=wmt/wmt14
    subset=de-en src_lang=en tgt_lang=de. Needs the network the first time; offline (or with
    the hub unreachable) it fails at once with a message, never waits.
    """

    def __init__(
        self,
        name: str,
        src_lang: str,
        tgt_lang: str,
        subset: str | None = None,
        column: str = "translation",
        revision: str | None = None,
    ) -> None:
        if not name:
            raise ValueError("data.corpus.name is empty: give a hub dataset, e.g. wmt/wmt14")
        self.name, self.subset, self.revision = name, subset, revision
        self.src_lang, self.tgt_lang, self.column = src_lang, tgt_lang, column

    def load(self, data_dir: Path) -> DatasetDict:
        from datasets import load_dataset

        offline = any(
            os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
            for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        )
        if not offline:
            _check_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        try:
            loaded = load_dataset(
                self.name, self.subset, revision=self.revision, cache_dir=str(data_dir / "hub")
            )
        except Exception as error:  # datasets raises many kinds; all mean "not available"
            reason = "offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set) and not cached"
            raise ValueError(
                f"cannot load hub dataset {self.name!r}: "
                f"{reason if offline else ' '.join(str(error).split())[:200]}; "
                "use data=parallel_files with local files instead"
            ) from None
        out = {}
        for split, dataset in loaded.items():
            name = {"dev": "validation", "valid": "validation"}.get(split, split)
            if name in SPLITS:
                out[name] = dataset.map(
                    _translation_pair, remove_columns=dataset.column_names,
                    fn_kwargs={"column": self.column, "src": self.src_lang, "tgt": self.tgt_lang},
                )  # fmt: skip
        if "train" not in out:
            raise ValueError(f"hub dataset {self.name!r} has no train split: {list(loaded)}")
        return DatasetDict(out)


def _translation_pair(example: dict[str, Any], column: str, src: str, tgt: str):
    pair = example[column]
    return {"src": clean(pair[src]), "tgt": clean(pair[tgt])}


def _check_reachable(endpoint: str, timeout: float = 5.0) -> None:
    url = urlparse(endpoint)
    host, port = url.hostname or endpoint, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        raise ValueError(
            f"cannot reach the hub at {endpoint} ({error}); work offline with "
            "data=parallel_files, or set HF_HUB_OFFLINE=1 to use a cached copy"
        ) from None
