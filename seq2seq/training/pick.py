"""The search picked on the validation split once training ends (`pick_search`): the beam
width and length penalty that score best there are what the test uses and what the tested
checkpoint keeps as its decoding defaults, with every candidate's scores beside them.

The test split decides nothing: the pick reads the pairs each validation decodes (the first
model.training.val_decode_limit of them), with the weights the test will read (the best
checkpoint, or the average average_last made), and ranks by BLEU or chrF. A tie keeps
model.decoding's own setting, else the first in the grid's order. Under DDP every process
decodes the same pairs and rank 0's pick is every process's. The time budget keeps time for
it (callbacks.TimeBudget, `pick_share`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from seq2seq import checks
from seq2seq import metric_names as names
from seq2seq.core.decoding import DecodingConfig, generate
from seq2seq.score import corpus_scores

log = logging.getLogger(__name__)

RECORD_KEY = "picked_search"  # the checkpoint's key (seq2seq.checkpoint lists it)
METRICS = (names.BLEU, names.CHRF)


@dataclass(frozen=True)
class SearchGrid:
    """The candidates: every beam width with every length penalty (None: model.decoding's)."""

    beam_sizes: tuple[int, ...] | None = None
    length_penalties: tuple[float, ...] | None = None
    metric: str | None = None  # bleu or chrf; None: the checkpoints' monitor's, else bleu

    @classmethod
    def from_config(cls, given: Any) -> SearchGrid:
        """pick_search as plain values (None or {}: off), each value checked. The run config's
        node is made plain where the config is read (preflight, the time budget's _convert_)."""
        given = dict(given or {})
        unknown = sorted(set(given) - {"beam_sizes", "length_penalties", "metric"})
        if unknown:
            raise ValueError(
                f"pick_search.{unknown[0]} is not a setting: give beam_sizes, length_penalties "
                "or metric"
            )
        beams = _listed("pick_search.beam_sizes", given.get("beam_sizes"))
        penalties = _listed("pick_search.length_penalties", given.get("length_penalties"))
        for beam in beams or ():
            checks.integer("pick_search.beam_sizes", beam, minimum=1)
        for penalty in penalties or ():
            checks.number("pick_search.length_penalties", penalty)
        metric = given.get("metric")
        if metric is not None:
            checks.choice("pick_search.metric", metric, METRICS)
        return cls(beams, None if penalties is None else tuple(map(float, penalties)), metric)

    @property
    def active(self) -> bool:
        return self.beam_sizes is not None or self.length_penalties is not None

    def candidates(self, decoding: DecodingConfig) -> list[DecodingConfig]:
        """decoding with each beam width and length penalty of the grid, beam widths outer."""
        beams = self.beam_sizes or (decoding.beam_size,)
        penalties = self.length_penalties or (decoding.length_penalty,)
        points = [
            replace(decoding, beam_size=b, length_penalty=p) for b in beams for p in penalties
        ]
        return list(dict.fromkeys(points))  # a value listed twice is searched once

    def metric_for(self, monitor: str | None) -> str:
        """The metric ranked by: the grid's, else the checkpoints' monitor's if BLEU or chrF."""
        if self.metric is not None:
            return self.metric
        name = (monitor or "").rpartition("/")[2]
        return name if name in METRICS else names.BLEU


def _listed(name: str, value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]  # pick_search.beam_sizes=5 means [5]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"{name} must be a non-empty list such as [4,5,8], got {checks.describe(value)}"
        )
    return tuple(value)


def pick_share(grid: SearchGrid, decoding: dict[str, Any] | None) -> float:
    """The pick's expected duration in validations (what TimeBudget reserves): each candidate
    decodes the validation's pairs, a beam of k costing about sqrt(k) greedy decodings (see
    callbacks._test_share)."""
    if not grid.active or decoding is None:
        return 0.0
    return sum(p.beam_size**0.5 for p in grid.candidates(DecodingConfig(**decoding)))


@torch.inference_mode()
def score_candidates(
    module: Any, loader: Any, candidates: list[DecodingConfig], limit: int | None, tokenize: str
) -> tuple[list[dict[str, Any]], int]:
    """Each candidate's BLEU and chrF (0-1) on the loader's batches until `limit` pairs (None:
    all; whole batches, as validation decodes them), and the seconds it took; and the pairs."""
    import time

    model, vocab = module.model, module.tgt_vocab
    device = next(model.parameters()).device
    batches, pairs = [], 0
    for batch in loader:
        if limit is not None and pairs >= limit:
            break
        batches.append((batch["src"].to(device), batch["labels"]))
        pairs += batch["src"].size(0)
    references = [vocab.decode(row) for _, labels in batches for row in labels.tolist()]
    rows = []
    for decoding in candidates:
        start = time.perf_counter()
        outputs = [generate(model, src, decoding).tolist() for src, _ in batches]
        hypotheses = [vocab.decode(row) for output in outputs for row in output]
        scores = corpus_scores(hypotheses, references, tokenize)
        rows.append({
            "beam_size": decoding.beam_size,
            "length_penalty": decoding.length_penalty,
            **{name: round(score["score"], 6) for name, score in scores.items()},
            "seconds": round(time.perf_counter() - start, 2),
        })  # fmt: skip
    return rows, pairs


def best_of(rows: list[dict[str, Any]], metric: str, default: DecodingConfig) -> dict[str, Any]:
    """The row with the highest metric; a tie keeps the default's setting, else the first."""

    def is_default(row: dict[str, Any]) -> bool:
        return (row["beam_size"], row["length_penalty"]) == (
            default.beam_size,
            default.length_penalty,
        )

    top = max(row[metric] for row in rows)
    tied = [row for row in rows if row[metric] == top]
    return next((row for row in tied if is_default(row)), tied[0])


def pick_search(
    trainer: Any,
    module: Any,
    datamodule: Any,
    grid: SearchGrid,
    monitor: str | None,
    weights: str | None = None,
) -> dict[str, Any]:
    """Score every candidate on the validation pairs with the weights of checkpoint `weights`
    (None: the module's own), set the best as the module's decoding (what the test reads) and
    return the record: metric, pairs, rows and the pick."""
    from seq2seq.checkpoint import load_checkpoint, load_weights, picked_search_lines

    if weights is not None:
        load_weights(module, load_checkpoint(weights)["state_dict"], weights, others=[])
    decoding = module.decoding
    metric = grid.metric_for(monitor)
    limit = module.settings.val_decode_limit
    module.to(trainer.strategy.root_device).eval()
    rows, pairs = score_candidates(
        module, datamodule.whole_loader("validation"), grid.candidates(decoding), limit,
        module.settings.bleu_tokenize,
    )  # fmt: skip
    best = best_of(rows, metric, decoding)
    best = trainer.strategy.broadcast(best, src=0)  # one pick for every process
    record = {"metric": metric, "pairs": pairs, "rows": rows, "picked": best}
    picked = replace(decoding, beam_size=best["beam_size"], length_penalty=best["length_penalty"])
    module.hparams["decoding"] = picked.to_dict()
    if trainer.is_global_zero:
        log.info("The search, %s", "\n".join(picked_search_lines(record)))
    return record


def record_in_checkpoint(path: str | Path, record: dict[str, Any]) -> None:
    """Make the pick the checkpoint's decoding defaults (translate, serve and export read them)
    and keep the record beside them; written to a new file first and then moved over the old,
    so an interruption leaves the old file whole."""
    from seq2seq.checkpoint import load_checkpoint

    path = Path(path)
    checkpoint = load_checkpoint(path)
    picked = record["picked"]
    decoding = checkpoint["hyper_parameters"]["decoding"]
    decoding.update(beam_size=picked["beam_size"], length_penalty=picked["length_penalty"])
    checkpoint[RECORD_KEY] = record
    part = path.with_name(path.name + ".part")
    try:
        torch.save(checkpoint, part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)  # a save that failed half-way: the old file stays whole
