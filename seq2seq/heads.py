"""The head atlas: what each attention head of a checkpoint does and how much it matters.

    python -m seq2seq.inspect best.ckpt --heads                  # the run's test pairs
    python -m seq2seq.inspect best.ckpt --heads --src src.txt --ref ref.txt --limit 500

For every head of every attention kind (the encoder's self-attention, the decoder's, and the
cross-attention over the source), on the given pairs, teacher-forced:

- importance as Michel et al. (2019, "Are Sixteen Heads Really Better than One?") measure it:
  the loss's gradient with respect to a per-head mask (seq2seq.core.attention.mask_heads),
  its absolute value summed over batches, normalised within each layer (L2);
- the change in loss and in BLEU (greedy search) when that head alone is switched off;
- confidence as Voita et al. (2019) define it, the mean of the head's largest weight over
  the queries, and the mean entropy of its weights;
- a role where one is plain, each of a head's queries judged by the key it weighs most (where
  that weight is at least twice an even spread's):
  "previous token" or "next token" (self-attention, at least 90% of queries), "first-token
  sink" or "last-token sink" (at least half of the queries), "diagonal" (cross-attention: the
  source position proportional to the output's, within one, at least 90%);
- the greedy pruning curve: heads switched off least important first, BLEU after each step.

Lightning-free (a tool): the checkpoint through seq2seq.inference.Engine.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.core.attention import capture_attention, mask_heads
from seq2seq.core.decoding import Search
from seq2seq.inference import Engine, Sentence, pad

__all__ = ["KINDS", "atlas", "heads_figure"]

KINDS = ("encoder", "self", "cross")
POSITIONAL = 0.9  # of the queries, for a positional or diagonal role
SINK = 0.5  # of the queries, for a sink
# Sentences a greedy search of the atlas decodes together: the atlas of the Tatoeba model on
# 500 pairs took 180 s at 64 and 150 s at 256 (Zen 4, 2 cores, side by side).
BLEU_BATCH = 256


def _batches(
    engine: Engine, sources: list[list[int]], targets: list[list[int]], size: int
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """(src, tgt_in, labels) as training reads them: <bos> + target in, target + <eos> out."""
    vocab, device = engine.model.tgt_vocab, engine.model.device
    for start in range(0, len(sources), size):
        src = pad(sources[start : start + size], vocab.pad_id, device)
        part = targets[start : start + size]
        tgt_in = pad([[vocab.bos_id, *t] for t in part], vocab.pad_id, device)
        labels = pad([[*t, vocab.eos_id] for t in part], vocab.pad_id, device)
        yield src, tgt_in, labels


def _loss(net: Any, batch: tuple[Tensor, Tensor, Tensor], pad_id: int) -> Tensor:
    src, tgt_in, labels = batch
    logits = net(src, tgt_in)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=pad_id,
                           reduction="sum")  # fmt: skip


def _modules(net: Any) -> list[tuple[str, int, str]]:
    """(kind, layer, qualified name) of every attention module."""
    config = net.config
    layers = {"encoder": config.num_encoder_layers, "self": config.num_decoder_layers,
              "cross": config.num_decoder_layers}  # fmt: skip
    return [(k, i, net.attention_module(k, i)) for k in KINDS for i in range(layers[k])]


def importance(engine: Engine, batches: list) -> dict[str, Tensor]:
    """Michel et al.'s head importance: sum over batches of |d loss / d mask|, a (H,) per
    module, normalised within each layer (L2)."""
    net = engine.model.module.model
    pad_id = engine.model.tgt_vocab.pad_id
    device = engine.model.device
    masks = {
        name: torch.ones(net.config.num_heads, requires_grad=True, device=device)
        for _, _, name in _modules(net)
    }
    total = {name: torch.zeros_like(mask) for name, mask in masks.items()}
    with torch.enable_grad(), mask_heads(net, masks):
        for batch in batches:
            tokens = int((batch[2] != pad_id).sum())
            (_loss(net, batch, pad_id) / tokens).backward()
            for name, mask in masks.items():
                total[name] += mask.grad.abs()
                mask.grad = None
    return {name: t / t.norm().clamp(min=1e-12) for name, t in total.items()}


def mean_loss(engine: Engine, batches: list, off: tuple = ()) -> float:
    """The mean token loss over the batches, with the heads `off` switched off."""
    net, pad_id = engine.model.module.model, engine.model.tgt_vocab.pad_id
    total = tokens = 0.0
    with torch.inference_mode(), engine.model.heads(off):
        for batch in batches:
            total += float(_loss(net, batch, pad_id))
            tokens += int((batch[2] != pad_id).sum())
    return total / max(tokens, 1)


def bleu(engine: Engine, sentences: list[Sentence], refs: list[str], off: tuple = ()) -> float:
    """Greedy search's corpus BLEU (0-100) with the heads `off` switched off."""
    from seq2seq.score import corpus_scores

    search = Search(replace(engine.model.decoding, beam_size=1), heads_off=off)
    found = engine.generate(sentences, search, batch_size=BLEU_BATCH)
    hypotheses = [engine.text(hyps[0][1]) for hyps in found]
    return 100 * corpus_scores(hypotheses, refs)["bleu"]["score"]


def attention_stats(engine: Engine, batches: list) -> dict[str, dict[str, Tensor]]:
    """Per module, per head: confidence, entropy and each role's share of the queries."""
    net = engine.model.module.model
    pad_id = engine.model.tgt_vocab.pad_id
    sums: dict[str, dict[str, Tensor]] = {}
    with torch.inference_mode(), capture_attention(net) as maps:
        for src, tgt_in, _ in batches:
            net(src, tgt_in)
            src_keep, tgt_keep = src != pad_id, tgt_in != pad_id
            for kind, _, name in _modules(net):
                weights = maps[name].float()  # (B, H, Tq, Tk)
                queries = src_keep if kind == "encoder" else tgt_keep
                keys = tgt_keep if kind == "self" else src_keep
                stats = _head_stats(kind, weights, queries, keys)
                into = sums.setdefault(name, {k: torch.zeros_like(v) for k, v in stats.items()})
                for key, value in stats.items():
                    into[key] += value
    out = {}
    for name, stats in sums.items():
        count = stats.pop("count")
        out[name] = {key: value / count.clamp(min=1) for key, value in stats.items()}
    return out


def _head_stats(kind: str, weights: Tensor, queries: Tensor, keys: Tensor) -> dict[str, Tensor]:
    """Sums over the batch's real queries, per head (H,): confidence, entropy, the roles'
    hits, and the count of queries (with the counts the positional roles need)."""
    b, h, tq, _ = weights.shape
    real = queries[:, None, :].expand(b, h, tq).float()  # (B, H, Tq)
    top = weights.max(-1)
    entropy = -(weights * weights.clamp(min=1e-12).log()).sum(-1)
    where = top.indices  # (B, H, Tq)
    position = torch.arange(tq, device=weights.device)[None, None, :]
    last_key = (keys.sum(1) - 1).clamp(min=0)[:, None, None]  # each row's last real key
    query_count = queries.sum(1)[:, None, None].clamp(min=1)
    diagonal = torch.round(position * last_key / (query_count - 1).clamp(min=1))
    # A query counts for a role only where it looks somewhere: its largest weight at least
    # twice an even spread's (an even row's first key is its argmax by a tie, not a choice).
    peaked = top.values >= 2.0 / keys.sum(1).clamp(min=1)[:, None, None]
    hits = {
        "previous": (where == position - 1) & (position >= 1),
        "next": (where == position + 1) & (position + 1 <= last_key),
        "first": where == 0,
        "last": where == last_key,
        "diagonal": (where - diagonal).abs() <= 1,
    }
    out = {
        "confidence": (top.values * real).sum((0, 2)),
        "entropy": (entropy * real).sum((0, 2)),
        "count": real.sum((0, 2)),
    }
    for role, hit in hits.items():
        out[role] = ((hit & peaked).float() * real).sum((0, 2))
    if kind == "cross":
        out["previous"] = out["next"] = torch.zeros(h, device=weights.device)
    else:
        out["diagonal"] = torch.zeros(h, device=weights.device)
    if kind == "self":
        out["next"] = torch.zeros(h, device=weights.device)  # causal: no next token to see
    return out


def role(shares: dict[str, float]) -> str | None:
    """The plain role of a head from its roles' shares of the queries, or None."""
    for name, label, threshold in (
        ("previous", "previous token", POSITIONAL), ("next", "next token", POSITIONAL),
        ("diagonal", "diagonal", POSITIONAL), ("first", "first-token sink", SINK),
        ("last", "last-token sink", SINK),
    ):  # fmt: skip
        if shares[name] >= threshold:
            return label
    return None


def atlas(
    engine: Engine,
    sources: list[str],
    references: list[str],
    batch_size: int = 32,
    steps: int = 10,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The atlas of every head on these pairs (see the module's text), as JSON-ready data."""
    if engine.backend != "torch":
        raise ValueError("the head atlas needs the checkpoint (an export has no head masks)")
    if len(sources) != len(references) or not sources:
        raise ValueError(
            f"the atlas needs pairs: {len(sources)} sources and {len(references)} references"
        )
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    net = engine.model.module.model
    from seq2seq.inference import Settings

    chosen = Settings(beam=1, truncate=True)
    search = engine.search(chosen)
    sentences = engine.encode(sources, chosen, search, lambda i: f"source line {i + 1}")
    vocab = engine.model.tgt_vocab
    targets = [vocab.encode(r)[: engine.max_positions - 1] for r in references]
    keep = [i for i, (s, t) in enumerate(zip(sentences, targets, strict=True)) if s.ids and t]
    sentences = [sentences[i] for i in keep]
    targets, references = [targets[i] for i in keep], [references[i] for i in keep]
    batches = list(_batches(engine, [s.ids for s in sentences], targets, batch_size))
    heads = [(k, layer, h) for k, layer, _ in _modules(net) for h in range(net.config.num_heads)]
    say(f"heads: {len(heads)} heads, {len(sentences)} pairs, {len(batches)} batches")
    base_loss, base_bleu = mean_loss(engine, batches), bleu(engine, sentences, references)
    scores = importance(engine, batches)
    stats = attention_stats(engine, batches)
    say(f"heads: importance and attention in {time.monotonic() - started:.0f} s")
    rows = []
    for number, (kind, layer, head) in enumerate(heads, start=1):
        name = net.attention_module(kind, layer)
        shares = {key: float(value[head]) for key, value in stats[name].items()}
        off = ((kind, layer, head),)
        rows.append({
            "kind": kind, "layer": layer, "head": head,
            "importance": float(scores[name][head]),
            "loss_change": mean_loss(engine, batches, off) - base_loss,
            "bleu_change": bleu(engine, sentences, references, off) - base_bleu,
            "confidence": shares["confidence"], "entropy": shares["entropy"],
            "role": role(shares),
            "shares": {k: round(v, 4) for k, v in shares.items()
                       if k not in ("confidence", "entropy")},
        })  # fmt: skip
        if number % 8 == 0 or number == len(heads):
            done = round(20 * number / len(heads))
            say(f"heads: [{'#' * done}{'.' * (20 - done)}] {number}/{len(heads)} switched off "
                f"alone ({time.monotonic() - started:.0f} s)")  # fmt: skip
    order = sorted(rows, key=lambda r: r["importance"])
    chunk = max(1, math.ceil(len(order) / steps))
    curve = [{"removed": 0, "bleu": base_bleu, "heads": []}]
    for end in [*range(chunk, len(order), chunk), len(order)]:
        off = tuple((r["kind"], r["layer"], r["head"]) for r in order[:end])
        added = [f"{k}:{layer}:{h}" for k, layer, h in off[curve[-1]["removed"] :]]
        curve.append({"removed": end, "bleu": bleu(engine, sentences, references, off),
                      "heads": added})  # fmt: skip
    say(f"heads: the pruning curve, {len(curve) - 1} steps ({time.monotonic() - started:.0f} s)")
    return {
        "pairs": len(sentences), "loss": base_loss, "bleu": base_bleu,
        "heads": rows, "pruning": curve, "seconds": round(time.monotonic() - started, 1),
        "method": {
            "importance": "Michel et al. 2019: sum over batches of |dL/dmask|, L2-normalised "
                          "within each layer",
            "bleu": "greedy search, sacreBLEU's default (13a), 0-100",
            "roles": f"positional and diagonal: >= {POSITIONAL:.0%} of queries; sinks: >= "
                     f"{SINK:.0%}",
        },
    }  # fmt: skip


def heads_figure(found: dict[str, Any], title: str = ""):
    """Importance of every head (a panel a kind: layers x heads) and the pruning curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = found["heads"]
    fig, axes = plt.subplots(1, len(KINDS) + 1, figsize=(4.2 * (len(KINDS) + 1), 3.6),
                             layout="constrained")  # fmt: skip
    image = None
    for ax, kind in zip(axes, KINDS, strict=False):
        own = [r for r in rows if r["kind"] == kind]
        layers = 1 + max(r["layer"] for r in own)
        heads = 1 + max(r["head"] for r in own)
        grid = torch.zeros(layers, heads)
        for r in own:
            grid[r["layer"], r["head"]] = r["importance"]
        image = ax.imshow(grid.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"{kind} attention: importance", fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
        for r in own:
            if r["role"]:
                ax.text(r["head"], r["layer"], r["role"].split()[0][:4], ha="center",
                        va="center", fontsize=6, color="darkred")  # fmt: skip
    fig.colorbar(image, ax=axes[: len(KINDS)], shrink=0.8)
    curve = found["pruning"]
    axes[-1].plot([c["removed"] for c in curve], [c["bleu"] for c in curve], marker="o")
    axes[-1].set_title("BLEU as heads go, least important first", fontsize=9)
    axes[-1].set_xlabel("heads switched off", fontsize=8)
    axes[-1].set_ylabel("BLEU (greedy)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
