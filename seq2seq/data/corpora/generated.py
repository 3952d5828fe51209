"""Corpora made offline from a seed: number words (num2words) and dates (Babel). A population
of items numbered 0..N-1; validation and test items are drawn first and never trained on."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

from datasets import DatasetDict

from seq2seq.data.corpora.common import check_sizes, generated_splits, population_split


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
        return generated_splits(number_pairs, data_dir, "numbers", **self.kwargs)


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
        return generated_splits(date_pairs, data_dir, "dates", **self.kwargs)
