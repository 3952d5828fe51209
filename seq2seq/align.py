"""Word alignments from cross-attention, and how well each layer and head aligns.

    python -m seq2seq.inspect best.ckpt --align sources.txt            # Pharaoh "i-j" a line
    python -m seq2seq.inspect best.ckpt --align sources.txt --ref refs.txt --layer 2 --head 3

Each target token is linked to the source token its cross-attention weighs most (one layer and
head, or the mean of a layer's heads), and the links of subword tokens are merged into links of
the words they belong to: "i-j" is source word i aligned to target word j, from 0 (the format
fast_align, GIZA++ and Moses read). Without --ref the target is the model's own greedy output.

The alignment error rate (Och and Ney, 2003) of links A against gold sure links S and possible
ones P (S within P) is 1 - (|A & S| + |A & P|) / (|A| + |S|). The generated symbol tasks know
their gold alignment (copy: word i to i; reverse: i to n-1-i; sort: each symbol to the place
it sorts to, ties possible), so every layer's and head's AER is measured on them.
"""

from __future__ import annotations

from typing import Any

from seq2seq.inference import Engine

__all__ = ["aer", "alignment_error_rates", "gold", "links", "word_of"]

Links = set[tuple[int, int]]


def word_of(texts: list[str], joined: bool) -> list[int | None]:
    """The word each token belongs to (None: a token of spaces only). joined: the tokens' texts
    make the text (byte-level BPE, characters), a word beginning at a token that begins with
    a space; otherwise (words, symbols) each token is a word."""
    if not joined:
        return list(range(len(texts)))
    out: list[int | None] = []
    word, ended = -1, True
    for text in texts:
        if not text.strip():
            out.append(None)
            ended = True
            continue
        if ended or text[0].isspace():
            word += 1
        out.append(word)
        ended = text[-1].isspace()
    return out


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


def alignment_error_rates(engine: Engine, sources: list[str], task: str) -> dict[str, Any]:
    """Every cross-attention layer's and head's AER (and each layer's mean of heads) over the
    sources, against the task's gold alignment, aligning the model's own outputs where they
    are the task's answer (elsewhere the gold's target words are not the output's)."""
    totals: dict[tuple[int, int | None], list[float]] = {}
    used = 0
    for source in sources:
        if not source.strip():
            continue
        src, tgt, maps = align(engine, source)
        words = source.split()
        sure, possible = gold(task, words)
        if len(tgt) != len(words) or not src:
            continue  # a wrong output's words are not the gold's
        used += 1
        src_words = _words(engine, engine.model.src_vocab, src)
        tgt_words = _words(engine, engine.model.tgt_vocab, tgt)
        for layer, weights in enumerate(maps["cross"]):
            for head in [*range(weights.size(0)), None]:
                w = weights.mean(0) if head is None else weights[head]
                rate = aer(links(w, src_words, tgt_words), sure, possible)
                totals.setdefault((layer, head), []).append(rate)
    rates = [
        {"layer": layer, "head": head, "aer": sum(v) / len(v)}
        for (layer, head), v in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1))
    ]
    best = min(rates, key=lambda r: r["aer"]) if rates else None
    return {"task": task, "sentences": used, "rates": rates, "best": best}
