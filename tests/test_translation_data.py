"""Translation data: generated corpora, the user's files, tokenizers, length bucketing."""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from seq2seq.data import TranslationDataModule, fit_tokenizer, tokenizer_from_dict
from seq2seq.data.batching import BucketBatchSampler
from seq2seq.data.corpora import Dates, HubCorpus, NumberWords, ParallelFiles

TEXTS = ["Grüße aus Köln — ça va?", "dreihundertsiebenundvierzig", "Sonntag, 29. November 2026"]


# ---------------------------------------------------------------------------------------------
# Tokenizers


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_char_and_bpe_round_trip_non_ascii_text(kind: str) -> None:
    tokenizer = fit_tokenizer(kind, TEXTS * 20, vocab_size=None if kind == "char" else 300)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.decode([1, *ids, 2, 7, 0]) == text  # <bos> ... <eos> then ignored
    restored = tokenizer_from_dict(tokenizer.to_dict())
    assert restored == tokenizer and restored.encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])
    if kind == "bpe":  # byte-level: even characters training never saw come back
        assert tokenizer.decode(tokenizer.encode("日本語 ŝ")) == "日本語 ŝ"
        assert tokenizer.unk_id not in tokenizer.encode("日本語 ŝ")


def test_word_tokenizer_splits_punctuation_and_maps_unknown_words_to_unk() -> None:
    tokenizer = fit_tokenizer("word", TEXTS * 5, vocab_size=100)
    assert tokenizer.decode(tokenizer.encode("Grüße aus Köln")) == "Grüße aus Köln"
    assert tokenizer.decode(tokenizer.encode("Köln, ça va?")) == "Köln , ça va ?"
    ids = tokenizer.encode("Grüße aus Berlin")
    assert ids[-1] == tokenizer.unk_id and tokenizer.unk_id not in ids[:-1]
    assert tokenizer_from_dict(tokenizer.to_dict()) == tokenizer


def test_char_vocabulary_maps_unseen_characters_to_unk_and_keeps_specials_first() -> None:
    tokenizer = fit_tokenizer("char", ["abc", "cab"])
    assert len(tokenizer) == 4 + 3
    assert tokenizer.encode("abz") == [tokenizer.encode("a")[0], tokenizer.encode("b")[0], 3]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("chars", None), "kind must be one of char, word, bpe, got 'chars'"),
        (("bpe", None), "vocab_size is needed for kind='bpe'"),
        (("word", 4), "vocab_size must exceed the 4 special tokens, got 4"),
        (("word", "many"), "vocab_size must exceed the 4 special tokens, got 'many'"),
    ],
)
def test_bad_tokenizer_settings_fail_clearly(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_tokenizer(args[0], TEXTS, args[1])


# ---------------------------------------------------------------------------------------------
# Generated corpora


def pairs(corpus, data_dir: Path) -> dict[str, list[tuple[str, str]]]:
    loaded = corpus.load(data_dir)
    return {split: list(zip(ds["src"], ds["tgt"], strict=True)) for split, ds in loaded.items()}


SMALL = {"train_size": 300, "val_size": 20, "test_size": 30}


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: NumberWords(high=999, seed=seed, **SMALL),
        lambda seed: Dates(start="2000-01-01", end="2001-12-31", seed=seed, **SMALL),
    ],
    ids=["numbers", "dates"],
)
def test_generated_corpora_are_seeded_and_hold_test_pairs_out_of_training(
    make, data_dir: Path
) -> None:
    first, again, other = (pairs(make(seed), data_dir) for seed in (1, 1, 2))
    assert first == again
    assert first != other
    assert {k: len(v) for k, v in first.items()} == {"train": 300, "validation": 20, "test": 30}
    train_sources = {src for src, _ in first["train"]}
    held_out = first["validation"] + first["test"]
    assert len(set(held_out)) == 50
    assert not train_sources & {src for src, _ in held_out}


def test_number_words_and_dates_say_what_they_should(data_dir: Path) -> None:
    import datetime

    from num2words import num2words

    from seq2seq.data.corpora import date_text, number_text

    assert number_text(347, "en", "words") == "three hundred and forty-seven"
    assert number_text(347, "de", "words") == "dreihundertsiebenundvierzig"
    assert date_text(datetime.date(2026, 11, 29), "de_DE", "full") == "Sonntag, 29. November 2026"
    assert date_text(datetime.date(2026, 11, 29), "iso", "long") == "2026-11-29"
    digits = NumberWords(src_form="digits", tgt_lang="fr", high=999, seed=0, **SMALL)
    for split in pairs(digits, data_dir).values():
        for src, tgt in split:
            assert tgt == num2words(int(src), lang="fr")
    forms = ["full", "short"]
    dates = Dates(src_forms=forms, start="2026-01-01", end="2027-12-31", seed=0, **SMALL)
    for src, tgt in pairs(dates, data_dir)["train"]:
        date = datetime.date.fromisoformat(tgt)
        assert src in (date_text(date, "de_DE", "full"), date_text(date, "de_DE", "short"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: NumberWords(src_lang="xx"), "src_lang='xx' is not a num2words language"),
        (lambda: NumberWords(tgt_form="roman"), "tgt_form must be words or digits"),
        (lambda: NumberWords(high=99, val_size=40, test_size=20), "exceeds half of the 100"),
        (lambda: NumberWords(train_size=0), "train_size must be a positive integer, got 0"),
        (lambda: Dates(src_locale="xx_YY"), "src_locale='xx_YY' is not a locale Babel knows"),
        (lambda: Dates(start="2020-13-01"), "start and end must be ISO dates"),
        (lambda: Dates(start="2020-01-02", end="2020-01-01"), "end=2020-01-01 is before start"),
        (lambda: Dates(src_forms=[]), "src_forms is empty"),
    ],
)
def test_bad_corpus_settings_fail_clearly(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


# ---------------------------------------------------------------------------------------------
# The user's files


def write(path: Path, text: str | bytes) -> Path:
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def load_files(tmp_path: Path, **splits) -> dict[str, list[tuple[str, str]]]:
    return pairs(ParallelFiles(**splits), tmp_path / "cache")


def test_aligned_text_files_gzip_and_unicode(tmp_path: Path) -> None:
    src = write(tmp_path / "train.en.gz", "Good morning\n  Cologne \nKo\u0308ln\n")
    tgt = write(tmp_path / "train.de", "Guten Morgen\nKöln\r\nKöln\n")
    loaded = load_files(tmp_path, train={"src": str(src), "tgt": str(tgt)})
    # Stripped, CRLF removed, and NFC: the decomposed "Ko\u0308ln" reads as "Köln".
    assert loaded == {
        "train": [("Good morning", "Guten Morgen"), ("Cologne", "Köln"), ("Köln", "Köln")]
    }


def test_tsv_csv_and_jsonl_files(tmp_path: Path) -> None:
    tsv = write(tmp_path / "a.tsv", 'id\ten\tde\n1\t"Hello"\tHallo\n2\tyes, sir\tja\n')
    csv_file = write(tmp_path / "a.csv", 'en,de\n"Hello, you",Hallo\n')
    jsonl = write(
        tmp_path / "a.jsonl.gz",
        "\n".join(json.dumps({"translation": {"en": e, "de": d}}) for e, d in [("a", "ä")]),
    )
    columns = {"src_column": "en", "tgt_column": "de"}
    assert load_files(tmp_path, train={"file": str(tsv)}, **columns)["train"] == [
        ('"Hello"', "Hallo"),  # TSV: quotes are text, commas too
        ("yes, sir", "ja"),
    ]
    assert load_files(tmp_path, train={"file": str(csv_file)}, **columns)["train"] == [
        ("Hello, you", "Hallo")
    ]
    nested = {"src_column": "translation.en", "tgt_column": "translation.de"}
    assert load_files(tmp_path, train={"file": str(jsonl)}, **nested)["train"] == [("a", "ä")]


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tsv", "src\ttgt\none\teins\n")
    assert load_files(tmp_path, train={"file": str(path)})["train"] == [("one", "eins")]
    time.sleep(0.01)
    write(path, "src\ttgt\ntwo\tzwei\n")
    assert load_files(tmp_path, train={"file": str(path)})["train"] == [("two", "zwei")]


def test_several_files_a_glob_or_a_list_are_read_as_one_corpus_in_order(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in (2, 10, 1):  # sorted as names: 1, 10, 2
        write(shards / f"part-{i}.tsv.gz" if i == 10 else shards / f"part-{i}.tsv",
              f"src\ttgt\none {i}\teins {i}\ntwo {i}\tzwei {i}\n")  # fmt: skip
    order = ["1", "10", "2"]
    expected = [
        (f"{w} {i}", f"{v} {i}") for i in order for w, v in (("one", "eins"), ("two", "zwei"))
    ]
    assert load_files(tmp_path, train={"file": str(shards / "part-*.tsv*")})["train"] == expected
    listed = [str(shards / "part-2.tsv"), str(shards / "part-1.tsv")]
    assert load_files(tmp_path, train={"file": listed})["train"] == expected[4:] + expected[:2]
    for lang, words in (("en", ("a", "b")), ("de", ("x", "y"))):
        for n, word in enumerate(words):
            write(shards / f"{n}.{lang}", f"{word}{n}\n")
    aligned = {"src": str(shards / "*.en"), "tgt": str(shards / "*.de")}
    assert load_files(tmp_path, train=aligned)["train"] == [("a0", "x0"), ("b1", "y1")]
    # A pattern that matches nothing, and unequal counts of src and tgt files, are named.
    with pytest.raises(ValueError, match=r"^data.corpus.train.file: no file matches .*nope-\*"):
        ParallelFiles(train={"file": str(shards / "nope-*.tsv")})
    with pytest.raises(ValueError, match=r"^data.corpus.train.src names 2 files but tgt names 1"):
        ParallelFiles(train={"src": str(shards / "*.en"), "tgt": str(shards / "0.de")})


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"train.en": "a\nb\nc\n", "train.de": "x\ny\n"},
            r"train\.en has 3 lines but .*train\.de has 2: the files must be aligned",
        ),
        ({"train.en": "", "train.de": ""}, r"train\.en and .*train\.de are empty"),
        (
            {"train.en": b"ok\nbad \xe9 byte\n", "train.de": "x\ny\n"},
            r"train\.en line 2 is not valid UTF-8 \(byte 0xe9 at column 5\)",
        ),
        ({"pairs.tsv": "en\tfr\nhi\tsalut\n"}, r"pairs\.tsv has no column 'src' \(its header: en"),
        ({"pairs.tsv": "src\ttgt\nhello\n"}, r"pairs\.tsv line 2 has 1 fields but the header has"),
        ({"pairs.tsv": ""}, r"pairs\.tsv is empty: a TSV file needs a header row"),
        ({"pairs.jsonl": '{"src": "a"}\n'}, r"pairs\.jsonl line 1 has no field 'tgt'"),
        ({"pairs.jsonl": "{oops\n"}, r"pairs\.jsonl line 1 is not valid JSON"),
    ],
    ids=["lines", "empty", "utf8", "tsv-column", "tsv-fields", "tsv-empty", "jsonl-key", "json"],
)
def test_bad_files_fail_with_the_file_and_line(tmp_path: Path, files: dict, message: str) -> None:
    paths = [write(tmp_path / name, content) for name, content in files.items()]
    if len(paths) == 2:
        spec = {"src": str(paths[0]), "tgt": str(paths[1])}
    else:
        spec = {"file": str(paths[0])}
    with pytest.raises(ValueError, match=message):
        load_files(tmp_path, train=spec)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"src": "missing.en", "tgt": "missing.de"}, "train.src: file missing.en does not exist"),
        ({}, "data.corpus.train needs files"),
        ({"src": "x"}, "needs both src and tgt files"),
    ],
)
def test_missing_files_fail_before_reading(train: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParallelFiles(train=train)


def test_unknown_file_format_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.xlsx", "x")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*pairs\.xlsx"):
        ParallelFiles(train={"file": str(path)})


def test_hub_offline_fails_at_once_with_a_message(tmp_path: Path) -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"offline .* and not cached; use data=parallel_files"):
        HubCorpus("nobody/no-such-dataset", "en", "de").load(tmp_path)
    assert time.perf_counter() - start < 30  # no network retries


# ---------------------------------------------------------------------------------------------
# The data module


def test_datamodule_drops_and_counts_empty_and_long_pairs_and_splits_off_missing_splits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [(f"source {i}", f"Ziel {i}") for i in range(200)]
    lines[5] = ("", "nur Ziel")
    lines[6] = ("   ", "   ")
    lines[7] = ("long " * 30, "lang")
    src = write(tmp_path / "train.en", "\n".join(s for s, _ in lines) + "\n")
    tgt = write(tmp_path / "train.de", "\n".join(t for _, t in lines) + "\n")

    def make() -> TranslationDataModule:
        return TranslationDataModule(
            ParallelFiles(train={"src": str(src), "tgt": str(tgt)}),
            tokenizer={"kind": "char"},
            max_length=20,
            batch_size=8,
            num_workers=0,
            data_dir=str(tmp_path / "data"),
            val_size=20,
            test_size=30,
            seed=1,
        )

    with caplog.at_level(logging.WARNING):
        datamodule = make()
        datamodule.setup("fit")
    assert "train: dropped 2 empty pairs of 200" in caplog.text
    assert "train: dropped 1 of 148 pairs longer than data.max_length=20 tokens" in caplog.text
    sizes = {split: len(ds) for split, ds in datamodule.splits.items()}
    assert sizes == {"train": 147, "validation": 20, "test": 30}
    again = make()
    src, tgt = again.tokenizers()  # asked for first: fitted on the same training split
    assert (src, tgt) == (datamodule.src_vocab, datamodule.tgt_vocab) and len(src) > 4
    again.setup("fit")
    assert again.splits["test"]["src_ids"] == datamodule.splits["test"]["src_ids"]
    test_sources = {tuple(ids) for ids in datamodule.splits["test"]["src_ids"]}
    assert not test_sources & {tuple(ids) for ids in datamodule.splits["train"]["src_ids"]}


def hygiene_datamodule(tmp_path: Path, rows: list[str], **kwargs) -> TranslationDataModule:
    path, text = tmp_path / "pairs.tsv", "src\ttgt\n" + "".join(r + "\n" for r in rows)
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write(path, text)  # not again: the file's time is part of the corpus's cache key
    args = dict(
        tokenizer={"kind": "char"},
        max_length=40,
        batch_size=8,
        num_workers=0,
        data_dir=str(tmp_path / "data"),
        val_size=10,
        test_size=20,
        seed=3,
        dedupe=True,
    )  # fmt: skip  (as configs/data/parallel_files.yaml)
    corpus = kwargs.pop("corpus", None) or ParallelFiles(train={"file": str(path)})
    return TranslationDataModule(corpus, **{**args, **kwargs})


# 60 source sentences with 1-3 translations each (as in Tatoeba), and 5 pairs given twice.
MANY = [
    f"sentence {i}\t{t} {i}" for i in range(60) for t in ("phrase", "Satz", "frase")[: 1 + i % 3]
]
MANY += MANY[:5]


def test_duplicate_pairs_are_dropped_and_counted(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        datamodule = hygiene_datamodule(tmp_path, MANY)
        datamodule.setup("fit")
    assert f"train: dropped 5 duplicate pairs of {len(MANY)}" in caplog.text
    assert sum(len(ds) for ds in datamodule.splits.values()) == len(MANY) - 5


def reference_text_splits(
    src: list[str], tgt: list[str], size: int, seed: int, split_by: str
) -> dict[str, list[int]]:
    """Row numbers of train, validation and test as plain Python makes them (the data module's
    code before it computed them on Arrow columns): empty pairs out, the first of each pair
    kept, then test and validation split off by source (random.Random(seed).shuffle of the
    sorted sources, drawn until size pairs) or by pair (datasets' train_test_split)."""
    import random

    from datasets import Dataset

    rows, seen = [], set()
    for row, pair in enumerate(zip(src, tgt, strict=True)):
        if pair[0] and pair[1] and pair not in seen:
            seen.add(pair)
            rows.append(row)
    out = {}
    for split in ("test", "validation"):
        if split_by == "pair":
            parts = Dataset.from_dict({"row": rows}).train_test_split(test_size=size, seed=seed)
            rows, out[split] = parts["train"]["row"][:], parts["test"]["row"][:]
            continue
        distinct = sorted({src[row] for row in rows})
        random.Random(seed).shuffle(distinct)
        held: set[int] = set()
        for source in distinct:
            if len(held) >= size:
                break
            held |= {row for row in rows if src[row] == source}
        out[split], rows = sorted(held), [row for row in rows if row not in held]
    return {"train": rows, **out}


@pytest.mark.parametrize("split_by", ["source", "pair"])
def test_text_splits_on_arrow_columns_equal_a_plain_python_reference(split_by: str) -> None:
    import random

    from datasets import Dataset, DatasetDict

    from seq2seq.data.phases import Phases
    from seq2seq.data.text_splits import TextSplitter

    rng = random.Random(7)  # sources sharing translations, duplicates, empties, non-ASCII
    words = ["a", "B", "é", "Z", "z", "ä b", "日本", "😀", "ß", "", "a b", "É"]
    src = [" ".join(rng.choices(words, k=rng.randint(1, 3))).strip() for _ in range(3000)]
    tgt = [rng.choice(["x", "ü", ""]) + str(rng.randint(0, 30)) * (rng.random() < 0.95)
           for _ in src]  # fmt: skip
    src += src[:200]
    tgt += tgt[:200]
    loaded = DatasetDict({"train": Dataset.from_dict({"src": src, "tgt": tgt})})
    for seed, size in ((0, 40), (3, 300)):
        splitter = TextSplitter(True, {"test": size, "validation": size}, split_by, seed,
                                Phases())  # fmt: skip
        made = {split: rows.tolist() for split, (_, rows) in splitter.make(loaded).rows.items()}
        assert made == reference_text_splits(src, tgt, size, seed, split_by)
    # A validation split of the corpus's own: its duplicates dropped, its sources that
    # training keeps counted, as plain Python counts them.
    val_src = [*src[:50:3], "never in training", "日本 é", *src[:10:3]]
    val_tgt = [*tgt[:50:3], "t", "u", *tgt[:10:3]]
    loaded["validation"] = Dataset.from_dict({"src": val_src, "tgt": val_tgt})
    splitter = TextSplitter(True, {"test": 40, "validation": 40}, split_by, 0, Phases())
    made = splitter.make(loaded)
    _, validation = made.rows["validation"]
    val_rows, seen = [], set()
    for row, pair in enumerate(zip(val_src, val_tgt, strict=True)):
        if pair[0] and pair[1] and pair not in seen:
            seen.add(pair)
            val_rows.append(row)
    assert validation.tolist() == val_rows
    kept = {src[row] for row in made.rows["train"][1]}
    overlap = sum(val_src[row] in kept for row in val_rows)
    assert overlap > 0 and any(val_src[row] not in kept for row in val_rows)
    assert (f"validation: {overlap} of {len(val_rows)} pairs have a source sentence that "
            "training also has") in "\n".join(message for _, message in made.said)  # fmt: skip


def test_a_second_start_reads_the_text_splits_from_the_cache(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    """Cleaning, deduplicating and splitting run once: a second start reads their rows and
    says their log lines again, whatever the corpus's size."""
    from seq2seq.data.text_splits import TextSplitter

    first = hygiene_datamodule(tmp_path, MANY)
    first.setup("fit")

    def refuse(*args, **kwargs):
        raise AssertionError("the text splits were made again")

    monkeypatch.setattr(TextSplitter, "make", refuse)
    with caplog.at_level(logging.WARNING):
        second = hygiene_datamodule(tmp_path, MANY)
        second.setup("fit")
    assert f"train: dropped 5 duplicate pairs of {len(MANY)}" in caplog.text
    for split in ("train", "validation", "test"):
        assert second.splits[split]["src_ids"] == first.splits[split]["src_ids"]
    assert "split, cached" in second.phases.timings and "split" not in second.phases.timings


def test_a_large_split_is_tokenized_by_a_process_a_core_as_one_process_tokenizes_it(
    tmp_path: Path, monkeypatch
) -> None:
    from seq2seq.data import datamodule as module

    assert module.processes(module.PROCESS_ROWS - 1) is None
    cores = min(len(os.sched_getaffinity(0)), 64)
    assert module.processes(64 * module.PROCESS_ROWS) == (cores if cores > 1 else None)
    for name in ("one", "several"):
        (tmp_path / name).mkdir()
    one = hygiene_datamodule(tmp_path / "one", MANY)
    one.setup("fit")
    monkeypatch.setattr(module, "PROCESS_ROWS", 20)
    monkeypatch.setattr(module, "processes", lambda rows: 3 if rows >= 60 else None)
    several = hygiene_datamodule(tmp_path / "several", MANY)
    several.setup("fit")
    assert sorted(p.name[-21:] for p in (tmp_path / "several").rglob("*_of_00003.arrow")) == [
        f"_{rank:05d}_of_00003.arrow" for rank in range(3)
    ]  # the training split, in three processes; the others in this one
    for split in ("train", "validation", "test"):
        assert several.splits[split].features["src_ids"].feature.dtype == "int32"
        for column in ("src_ids", "tgt_ids", "length"):
            assert several.splits[split][column] == one.splits[split][column]


def test_tokenizers_are_fitted_on_a_seeded_sample_of_a_larger_training_split(
    tmp_path: Path, caplog
) -> None:
    rows = [f"{word}{i}\t{word.upper()}{i}" for i, word in enumerate(["ab", "cd", "ef", "gh"] * 30)]
    with caplog.at_level(logging.INFO):
        whole = hygiene_datamodule(tmp_path, rows, tokenizer={"kind": "word", "vocab_size": 500})
        whole.setup("fit")
        sampled = hygiene_datamodule(
            tmp_path, rows, tokenizer={"kind": "word", "vocab_size": 500, "sample": 8}
        )
        sampled.setup("fit")
    train = len(whole.splits["train"])
    assert f"Fitted word tokenizers on {train} training pairs:" in caplog.text
    assert f"on 8 training pairs (data.tokenizer.sample) of {train}:" in caplog.text
    # Every word is distinct: 4 specials and a word a pair for the 8, all of training's else.
    assert len(sampled.src_vocab) == 4 + 8 and len(whole.src_vocab) == 4 + train
    again = hygiene_datamodule(tmp_path, rows, tokenizer={"kind": "word", "vocab_size": 500,
                                                          "sample": 8})  # fmt: skip
    again.setup("fit")
    assert again.src_vocab == sampled.src_vocab  # drawn with the seed: another draws others
    other = hygiene_datamodule(tmp_path, rows, tokenizer={"kind": "word", "vocab_size": 500,
                                                          "sample": 8}, seed=4)  # fmt: skip
    other.setup("fit")
    assert len(other.src_vocab) == 12 and other.src_vocab != sampled.src_vocab
    with pytest.raises(
        ValueError, match=r"^data.tokenizer.sample must be a positive integer, got 0"
    ):
        hygiene_datamodule(tmp_path, rows, tokenizer={"kind": "word", "vocab_size": 9, "sample": 0})


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_second_start_reads_the_tokenized_splits_from_the_cache(
    kind: str, tmp_path: Path
) -> None:
    """The first start fits the tokenizers and tokenizes; a second (a new data module, as a
    new process makes) reads both from the cache and writes nothing: datasets keys the
    tokenized splits by a hash of the tokenizers, which must hash alike fitted and read back."""
    tokenizer = {"kind": kind, "vocab_size": 300 if kind == "bpe" else None, "shared": True}
    first = hygiene_datamodule(tmp_path, MANY, tokenizer=tokenizer)
    first.setup("fit")
    written = sorted((tmp_path / "data").rglob("*.arrow"))
    second = hygiene_datamodule(tmp_path, MANY, tokenizer=tokenizer)
    second.setup("fit")
    assert sorted((tmp_path / "data").rglob("*.arrow")) == written
    assert second.splits["train"]["src_ids"] == first.splits["train"]["src_ids"]


@pytest.mark.parametrize("split_by", ["source", "pair"])
def test_split_by_source_keeps_every_source_on_one_side(
    split_by: str, tmp_path: Path, caplog
) -> None:
    with caplog.at_level(logging.INFO):
        datamodule = hygiene_datamodule(tmp_path, MANY, split_by=split_by)
        datamodule.setup("fit")
    sources = {
        split: {datamodule.src_vocab.decode(ids) for ids in ds["src_ids"]}
        for split, ds in datamodule.splits.items()
    }
    shared = (sources["validation"] | sources["test"]) & sources["train"]
    if split_by == "source":
        assert not shared and not sources["validation"] & sources["test"]
        assert len(datamodule.splits["test"]) >= 20 and len(datamodule.splits["validation"]) >= 10
        assert "have a source sentence that training also has" not in caplog.text
    else:  # drawn pair by pair, some translations of a test source stay in training
        assert shared
        assert "pairs have a source sentence that training also has" in caplog.text
    assert sum(len(ds) for ds in datamodule.splits.values()) == len(MANY) - 5


def test_given_splits_that_share_sources_with_training_are_counted(tmp_path: Path, caplog) -> None:
    train = write(
        tmp_path / "train.tsv", "src\ttgt\n" + "".join(f"s{i}\tt{i}\n" for i in range(30))
    )
    held = write(tmp_path / "held.tsv", "src\ttgt\ns1\tother\ns99\tt99\n")
    corpus = ParallelFiles(train={"file": str(train)}, validation={"file": str(held)},
                           test={"file": str(held)})  # fmt: skip
    with caplog.at_level(logging.WARNING):
        hygiene_datamodule(tmp_path, [], corpus=corpus, val_size=None, test_size=None).setup("fit")
    assert "test: 1 of 2 pairs have a source sentence that training also has" in caplog.text
    # A split-off size for a split the corpus has would change nothing: refused, not ignored.
    with pytest.raises(
        ValueError,
        match=r"^data.test_size=20 sizes a test split taken off the "
        r"training data, but ParallelFiles has its own test split: drop",
    ):
        hygiene_datamodule(tmp_path, [], corpus=corpus, val_size=None).setup("fit")


def test_lengths_are_reported_per_split(tmp_path: Path, caplog) -> None:
    rows = ["ab\tabcd", "abcdef\tabc"] * 1 + [f"x{i}\ty{i}y" for i in range(40)]
    with caplog.at_level(logging.INFO):
        hygiene_datamodule(tmp_path, rows, val_size=5, test_size=5).setup("fit")
    line = next(r for r in caplog.text.splitlines() if "train: " in r and "source tokens" in r)
    assert "32 pairs; source tokens mean" in line and "target/source" in line


def test_unknown_validation_characters_are_counted_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = write(tmp_path / "train.tsv", "src\ttgt\n" + "abc\txyz\n" * 10)
    valid = write(tmp_path / "valid.tsv", "src\ttgt\nabq\txyz\nqqa\txy\n")
    datamodule = TranslationDataModule(
        ParallelFiles(train={"file": str(train)}, validation={"file": str(valid)},
                      test={"file": str(valid)}),
        tokenizer={"kind": "char"}, max_length=10, batch_size=4, num_workers=0,
        data_dir=str(tmp_path / "data"),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        datamodule.setup("fit")
    assert "validation: 3 source tokens in 2 pairs are not in the vocabulary" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_length": 0}, "data.max_length must be a positive integer, got 0"),
        ({"max_tokens": 10}, "max_tokens=10 cannot hold one pair of max_length=20"),
        ({"tokenizer": {"kind": "char", "size": 3}}, r"unknown data.tokenizer settings \['size'\]"),
        ({"batch_size": 0}, "data.batch_size must be a positive integer, got 0"),
    ],
)
def test_bad_datamodule_settings_fail_clearly(overrides: dict, message: str) -> None:
    args = dict(
        corpus=NumberWords(), tokenizer={"kind": "char"}, max_length=20, batch_size=8,
        num_workers=0, data_dir="unused",
    )  # fmt: skip
    with pytest.raises(ValueError, match=message):
        TranslationDataModule(**{**args, **overrides})


# ---------------------------------------------------------------------------------------------
# Length bucketing


def test_bucketing_covers_every_example_once_within_the_token_budget() -> None:
    lengths = torch.randint(1, 60, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = BucketBatchSampler(lengths, batch_size=64, max_tokens=512, pool_batches=10, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    for batch in batches:
        assert len(batch) <= 64 and len(batch) * max(lengths[i] for i in batch) <= 512

    def padding(batches: list[list[int]]) -> float:
        padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
        return 1 - sum(lengths) / padded

    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).tolist()
    random_batches = [shuffled[i : i + 16] for i in range(0, 1000, 16)]
    assert padding(batches) < 0.1 < 0.3 < padding(random_batches)


def test_bucketing_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch() -> None:
    lengths = list(range(1, 101))
    sampler = BucketBatchSampler(lengths, batch_size=8, max_tokens=200, seed=5)
    first = list(sampler)
    assert first == list(BucketBatchSampler(lengths, batch_size=8, max_tokens=200, seed=5))
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    iterator = iter(sampler)
    taken = [next(iterator) for _ in range(3)]
    restored = BucketBatchSampler(lengths, batch_size=8, max_tokens=200, seed=0)
    restored.load_state_dict(sampler.state_dict())
    assert taken + list(restored) == second


def greedy_batches(lengths: list[int], batch_size: int, max_tokens: int | None, pool_batches: int,
                   seed: int, epoch: int) -> list[list[int]]:  # fmt: skip
    """BucketBatchSampler's batches as a plain loop makes them, one example at a time."""
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    pool, batches = pool_batches * batch_size, []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])  # stable
        batch: list[int] = []
        for index in chunk:
            longest = max([lengths[i] for i in batch] + [lengths[index]])
            if batch and (
                len(batch) == batch_size
                or longest * (len(batch) + 1) > (max_tokens or float("inf"))
            ):
                batches.append(batch)
                batch = []
            batch.append(index)
        batches.append(batch)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def test_bucketing_equals_a_plain_greedy_fill() -> None:
    import random

    rng = random.Random(0)
    for case in range(30):
        lengths = [rng.randint(1, 80) for _ in range(rng.choice([1, 7, 200, 1500]))]
        settings = (rng.choice([1, 3, 16, 64]), rng.choice([None, 50, 300, 1280]),
                    rng.choice([1, 2, 50]))  # fmt: skip
        sampler = BucketBatchSampler(lengths, *settings, seed=case)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            assert list(sampler) == greedy_batches(lengths, *settings, case, epoch), settings


def test_an_example_longer_than_the_budget_gets_a_batch_of_its_own() -> None:
    batches = list(BucketBatchSampler([5, 50, 5, 5], batch_size=4, max_tokens=20, seed=0))
    assert [1] in batches and sorted(len(b) for b in batches) == [1, 3]


def test_samplers_shard_one_epoch_order_between_processes() -> None:
    from seq2seq.data.batching import EpochShuffle, InOrder

    whole = list(EpochShuffle(10, seed=4))
    shards = [list(EpochShuffle(10, seed=4, num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]  # padded by repeating the first items
    assert [i for r in range(4) for i in (s[r] for s in shards)] == whole + whole[:2]
    assert list(InOrder(5, num_replicas=2, rank=1)) == [1, 3, 0]
    lengths = list(range(1, 201))
    for replicas in (2, 3, 7):
        buckets = [
            list(BucketBatchSampler(lengths, 8, 100, seed=2, num_replicas=replicas, rank=r))
            for r in range(replicas)
        ]
        assert len({len(shard) for shard in buckets}) == 1  # as many steps on every process
        together = sorted(i for shard in buckets for batch in shard for i in batch)
        assert together == list(range(200))  # every example once: halved, not repeated
        within = [len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 100
                  for shard in buckets for b in shard]  # fmt: skip
        assert all(within)  # a longer example alone, as ever
    # Too few examples to halve (1 for 2 processes): padded by repeating, as before.
    shards = [
        list(BucketBatchSampler([3], 8, None, seed=0, num_replicas=2, rank=r)) for r in (0, 1)
    ]
    assert shards == [[[0]], [[0]]]


def test_bucketed_loader_gets_its_epoch_from_lightning_and_resumes_mid_epoch(
    tmp_path: Path,
) -> None:
    from lightning.fabric.utilities.data import _set_sampler_epoch

    rows = "".join(f"{'a' * (1 + i % 17)}\t{'b' * (1 + i % 5)}\n" for i in range(300))
    path = write(tmp_path / "pairs.tsv", "src\ttgt\n" + rows)
    datamodule = TranslationDataModule(
        ParallelFiles(train={"file": str(path)}), tokenizer={"kind": "char"}, max_length=20,
        batch_size=16, num_workers=0, data_dir=str(tmp_path / "data"), val_size=20,
        test_size=20, max_tokens=128,
    )  # fmt: skip
    datamodule.setup("fit")

    def epoch(loader, number: int) -> list[list[list[int]]]:
        _set_sampler_epoch(loader, number)  # what Lightning calls before each epoch
        return [batch["src"].tolist() for batch in loader]

    loader = datamodule.train_dataloader()
    first, second = epoch(loader, 0), epoch(loader, 1)
    assert first != second  # a new order each epoch
    _set_sampler_epoch(loader, 1)
    iterator = iter(loader)
    taken = [next(iterator)["src"].tolist() for _ in range(4)]
    state = loader.state_dict()
    resumed = datamodule.train_dataloader()
    resumed.load_state_dict(state)
    assert taken + [batch["src"].tolist() for batch in resumed] == second
