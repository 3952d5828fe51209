"""Word alignments from cross-attention, and how well each layer and head aligns.

    python -m seq2seq.inspect best.ckpt --align sources.txt            # Pharaoh "i-j" a line
    python -m seq2seq.inspect best.ckpt --align sources.txt --ref refs.txt --layer 2 --head 3

Each target token is linked to the source token its cross-attention weighs most (one layer and
head, or the mean of a layer's heads), and the links of subword tokens are merged into links of
the words they belong to: "i-j" is source word i aligned to target word j, from 0 (the format
fast_align, GIZA++ and Moses read). Without --ref the target is the model's own greedy output.

The alignment error rate (Och and Ney, 2003) of links A against gold sure links S and possible
ones P (S within P) is 1 - (|A & S| + |A & P|) / (|A| + |S|). The generated tasks know their
gold alignment (and --gold FILE gives one for any pairs), so every layer's and head's AER is
measured on their pairs (the reference
forced as the target): the symbol tasks link words (copy: word i to i; reverse: i to n-1-i;
sort: each symbol to the place it sorts to, ties possible); the dates link the fields of a
date's two writings, whatever their characters or order ("Dienstag, 3. März 2026" ->
"2026-03-03": the day's "3" to "03", "März" to the month's "03", "2026" to "2026"; the weekday
to nothing), the fields read from the Babel pattern each side was written with.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

from seq2seq.inference import Engine

__all__ = [
    "DateGold", "aer", "alignment_error_rates", "date_fields", "gold", "gold_of", "links",
    "read_gold", "symbol_gold", "token_units", "word_of",
]  # fmt: skip

Links = set[tuple[int, int]]
Spans = list[tuple[int, int]]  # a unit's characters, start and end, one a unit
# A pair's gold: its source's units, its target's, the sure links and the possible ones.
Gold = tuple[Spans, Spans, Links, Links]


def word_of(texts: list[str], joined: bool) -> list[int | None]:
    """The word each token belongs to (None: a token of spaces only). joined: the tokens' texts
    make the text (byte-level BPE, characters), a word being what lies between spaces (as
    token_units reads it); otherwise (words, symbols) each token is a word."""
    if not joined:
        return list(range(len(texts)))
    text = "".join(texts)
    return token_units(texts, text, _word_spans(text))  # the text is the tokens': never None


def links(weights: Any, src_words: list[int | None], tgt_words: list[int | None]) -> Links:
    """(source word, target word) for each target token, by its cross-attention's largest
    weight over the source tokens. weights: (T, S), T the target tokens (without EOS)."""
    found: Links = set()
    for t, row in enumerate(weights):
        j, i = tgt_words[t], src_words[int(row.argmax())]
        if i is not None and j is not None:
            found.add((i, j))
    return found


def aer(found: Links, sure: Links, possible: Links) -> float:
    """Och and Ney's alignment error rate (S within P)."""
    possible = possible | sure
    if not found and not sure:
        return 0.0
    return 1 - (len(found & sure) + len(found & possible)) / (len(found) + len(sure))


def gold(task: str, source: list[str]) -> tuple[Links, Links]:
    """The (sure, possible) links of a symbol task's pair, from its source words alone."""
    n = len(source)
    if task == "copy":
        return {(i, i) for i in range(n)}, set()
    if task == "reverse":
        return {(i, n - 1 - i) for i in range(n)}, set()
    if task == "sort":
        order = sorted(range(n), key=lambda i: (source[i], i))
        sure = {(i, j) for j, i in enumerate(order)}
        ties = {(i, j) for j, k in enumerate(order) for i in range(n) if source[i] == source[k]}
        return sure, ties
    raise ValueError(
        f"gold alignments are known for the copy, reverse and sort tasks, not {task!r}"
    )


def _word_spans(text: str) -> Spans:
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def symbol_gold(task: str) -> Callable[[str, str], Gold | None]:
    """A symbol task's gold on the words of a pair (None where the reference is not its
    source's answer word for word)."""

    def pair_gold(source: str, reference: str) -> Gold | None:
        words = source.split()
        if len(reference.split()) != len(words):
            return None
        return _word_spans(source), _word_spans(reference), *gold(task, words)

    return pair_gold


FIELD_KINDS = {"d": "day", "M": "month", "L": "month", "y": "year", "Y": "year", "u": "year",
               "E": "weekday", "e": "weekday", "c": "weekday", "G": "era"}  # fmt: skip


def date_fields(
    date: datetime.date, locale: str, form: str
) -> tuple[str, list[tuple[str, int, int]]]:
    """The date as corpora.date_text writes it, with each field's kind and character span,
    read from the Babel pattern of the locale's form (or the CLDR pattern form is)."""
    from babel.dates import DateTimeFormat, get_date_format, tokenize_pattern

    if locale == "iso":
        locale, pattern = "en", "yyyy-MM-dd"
    elif form in ("full", "long", "medium", "short"):
        pattern = get_date_format(form, locale=locale).pattern
    else:
        pattern = form
    values = DateTimeFormat(date, locale)
    text, fields = "", []
    for kind, value in tokenize_pattern(pattern):
        if kind == "field":
            letter, count = value
            piece = values[letter * count]
            fields.append((FIELD_KINDS.get(letter, letter), len(text), len(text) + len(piece)))
        else:
            piece = value
        text += piece
    return text, fields


class DateGold:
    """The dates task's gold: each field of the source (day, month, year, weekday) linked to the
    target's field of its kind. Its arguments are the Dates corpus's (a run's data.corpus)."""

    def __init__(
        self, src_locale: str = "de_DE", src_forms: Any = ("full", "long", "medium"),
        tgt_locale: str = "iso", tgt_form: str = "long", start: str = "1900-01-01",
        end: str = "2099-12-31", **_: Any,
    ) -> None:  # fmt: skip
        self.src_locale, self.src_forms = src_locale, tuple(src_forms)
        self.tgt_locale, self.tgt_form = tgt_locale, tgt_form
        self.start, self.end = start, end
        self._dates: dict[str, datetime.date | None] | None = None

    def date_of(self, reference: str) -> datetime.date | None:
        if self.tgt_locale == "iso":
            try:
                return datetime.date.fromisoformat(reference.strip())
            except ValueError:
                return None
        if self._dates is None:  # every date of the corpus's range as the target writes it
            first = datetime.date.fromisoformat(self.start)
            days = (datetime.date.fromisoformat(self.end) - first).days + 1
            self._dates = {}
            for n in range(days):
                date = first + datetime.timedelta(days=n)
                text = date_fields(date, self.tgt_locale, self.tgt_form)[0]
                self._dates[text] = None if text in self._dates else date  # None: ambiguous
        return self._dates.get(reference.strip())

    def __call__(self, source: str, reference: str) -> Gold | None:
        date = self.date_of(reference)
        if date is None:
            return None
        target, tgt_fields = date_fields(date, self.tgt_locale, self.tgt_form)
        written = (date_fields(date, self.src_locale, form) for form in self.src_forms)
        src_fields = next((fields for text, fields in written if text == source), None)
        if src_fields is None or target != reference:
            return None
        sure = {(i, j) for i, (a, *_) in enumerate(src_fields)
                for j, (b, *_) in enumerate(tgt_fields) if a == b}  # fmt: skip
        return [f[1:] for f in src_fields], [f[1:] for f in tgt_fields], sure, set()


def gold_of(corpus: dict[str, Any]) -> tuple[str, Callable[[str, str], Gold | None]] | None:
    """The gold of a run's corpus (its data.corpus config), named, if its construction knows
    one: the symbol tasks and the dates."""
    task = corpus.get("task")
    if task in ("copy", "reverse", "sort"):
        return task, symbol_gold(task)
    if str(corpus.get("_target_", "")).rsplit(".", 1)[-1] == "Dates":
        return "dates", DateGold(**{k: v for k, v in corpus.items() if k != "_target_"})
    return None


def read_gold(path: str, sources: list[str], references: list[str]) -> list[Gold | None]:
    """A gold file's alignments of the pairs, a line a pair: "i-j" a sure link of source word
    i to target word j (from 0, words split at spaces), "i?j" a possible one (the format of
    the Hansards and Europarl gold sets once converted; an empty line: no link)."""
    from seq2seq.score import read_lines

    lines = read_lines(path)
    if len(lines) != len(sources):
        raise ValueError(
            f"--gold {path} has {len(lines)} lines for {len(sources)} pairs: give one a pair"
        )
    golds: list[Gold | None] = []
    for number, (line, source, reference) in enumerate(
        zip(lines, sources, references, strict=True), 1
    ):
        src_units, tgt_units = _word_spans(source), _word_spans(reference)
        sure: Links = set()
        possible: Links = set()
        for link in line.split():
            match = re.fullmatch(r"(\d+)([-?])(\d+)", link)
            if match is None:
                raise ValueError(
                    f"--gold {path} line {number}: {link!r} is not a link; write i-j (sure) "
                    "or i?j (possible), word numbers from 0"
                )
            i, j = int(match[1]), int(match[3])
            if i >= len(src_units) or j >= len(tgt_units):
                raise ValueError(
                    f"--gold {path} line {number}: {link!r} names a word past the pair's "
                    f"{len(src_units)} source and {len(tgt_units)} target words"
                )
            (sure if match[2] == "-" else possible).add((i, j))
        golds.append((src_units, tgt_units, sure, possible))
    return golds


def token_units(texts: list[str], text: str, units: Spans) -> list[int | None] | None:
    """The unit each token falls in (None: in none, e.g. a separator), by the token's first
    character that is not a space. texts: the tokens' own texts, which make the text
    (characters, byte-level BPE) or are its words (word and symbol vocabularies); None if
    they do neither."""
    if "".join(texts) == text:
        starts, at = [], 0
        for piece in texts:
            starts.append(at + len(piece) - len(piece.lstrip()) if piece.strip() else None)
            at += len(piece)
    elif [t.strip() for t in texts] == text.split():
        starts = [start for start, _ in _word_spans(text)]
    else:
        return None
    return [
        None
        if start is None
        else next((u for u, (a, b) in enumerate(units) if a <= start < b), None)
        for start in starts
    ]


def _words(engine: Engine, vocab: Any, ids: list[int]) -> list[int | None]:
    texts = [vocab.decode([i]) for i in ids]
    return word_of(texts, "".join(texts) == vocab.decode(ids))


def align(
    engine: Engine, source: str, target: str | None = None
) -> tuple[list[int], list[int], dict[str, list]]:
    """The source's ids, the target's (given, or the greedy output; without EOS) and every
    layer's cross-attention over it, (H, T, S) a layer."""
    from seq2seq.inference import Settings

    chosen = Settings(beam=1)
    search = engine.search(chosen)
    sentence = engine.encode([source], chosen, search)[0]
    module = engine.model.module
    if target is None:
        output = module.output_ids(engine.generate([sentence], search)[0][0][1])
    else:
        output = [*engine.model.tgt_vocab.encode(target), engine.model.tgt_vocab.eos_id]
    maps = module.attention(sentence.ids, output)
    ids = output[:-1] if output and output[-1] == engine.model.tgt_vocab.eos_id else output
    return sentence.ids, ids, {"cross": [layer[:, : len(ids)] for layer in maps["cross"]]}


def pharaoh(engine: Engine, source: str, target: str | None, layer: int, head: int | None) -> str:
    """One line of "i-j" links, from a layer's head (or the mean of its heads)."""
    src, tgt, maps = align(engine, source, target)
    if not src or not tgt:
        return ""
    weights = maps["cross"][layer]
    weights = weights.mean(0) if head is None else weights[head]
    src_words = _words(engine, engine.model.src_vocab, src)
    tgt_words = _words(engine, engine.model.tgt_vocab, tgt)
    return " ".join(f"{i}-{j}" for i, j in sorted(links(weights, src_words, tgt_words)))


def alignment_error_rates(
    engine: Engine, sources: list[str], references: list[str], task: str,
    golds: list[Gold | None],
) -> dict[str, Any]:  # fmt: skip
    """Every cross-attention layer's and head's AER (and each layer's mean of heads) over the
    pairs, the reference forced as the target, against each pair's gold (pairs without one,
    None, are left out and counted)."""
    totals: dict[tuple[int, int | None], list[float]] = {}
    used = 0
    for source, reference, known in zip(sources, references, golds, strict=True):
        if known is None or not source.strip() or not reference.strip():
            continue
        src_spans, tgt_spans, sure, possible = known
        src, tgt, maps = align(engine, source, reference)
        vocabs = engine.model.src_vocab, engine.model.tgt_vocab
        src_units = token_units([vocabs[0].decode([i]) for i in src], source, src_spans)
        tgt_units = token_units([vocabs[1].decode([i]) for i in tgt], reference, tgt_spans)
        if src_units is None or tgt_units is None:
            continue  # tokens (an unknown one) that do not spell the text
        used += 1
        for layer, weights in enumerate(maps["cross"]):
            for head in [*range(weights.size(0)), None]:
                w = weights.mean(0) if head is None else weights[head]
                rate = aer(links(w, src_units, tgt_units), sure, possible)
                totals.setdefault((layer, head), []).append(rate)
    rates = [
        {"layer": layer, "head": head, "aer": sum(v) / len(v)}
        for (layer, head), v in sorted(
            totals.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])
        )
    ]
    best = min(rates, key=lambda r: r["aer"]) if rates else None
    return {"task": task, "sentences": used, "left_out": len(sources) - used, "rates": rates,
            "best": best}  # fmt: skip
