"""What the module measures: torchmetrics collections per stage, exact match, and the decoded
texts of an epoch (gathered across processes, and written out for re-scoring); StageMetrics
holds them all, so the module's steps hand it a batch and its epoch ends ask it for values.

BLEU and chrF are not torchmetrics here: they come from sacreBLEU itself, on the texts of the
whole epoch (seq2seq.score), so each carries its signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import CharErrorRate

from seq2seq import metric_names as names
from seq2seq.score import corpus_scores

# (hypothesis, reference, source, ended): one decoded pair; ended is False where the
# prediction was cut at the length limit without EOS.
TextRow = tuple[str, str, str, bool]


def stage_metrics(stage: str, vocab_size: int, pad_id: int) -> MetricCollection:
    """The metrics of one stage (train, val or test), named "<stage>/<metric>"."""
    metrics: dict[str, Any] = {
        names.LOSS: MeanMetric(),
        names.TOKEN_ACC: MulticlassAccuracy(
            vocab_size, average="micro", ignore_index=pad_id, validate_args=False
        ),
    }
    if stage == "train":
        metrics[names.PADDING] = MeanMetric()  # fraction of batch positions that are <pad>
    else:
        # From greedy (test: beam) decoding, on detokenised text for the text metrics.
        metrics[names.EXACT_MATCH] = MeanMetric()
        metrics[names.CER] = CharErrorRate()
    return MetricCollection(metrics, prefix=f"{stage}/", compute_groups=False)


def exact_match(predictions: Tensor, labels: Tensor, pad_id: int, eos_id: int) -> Tensor:
    """(B,) 1.0 where the prediction equals the label sequence up to and including its EOS.

    A sequence ends at its first EOS, as the text metrics read it (tokenizers decode up to
    it): what follows, padding or not, is not compared. A prediction without EOS (cut off at
    the length limit) never matches, since every label ends with one.
    """
    width = max(predictions.size(1), labels.size(1))
    predictions = F.pad(predictions, (0, width - predictions.size(1)), value=pad_id)
    labels = F.pad(labels, (0, width - labels.size(1)), value=pad_id)
    same = _end_at_eos(predictions, pad_id, eos_id) == _end_at_eos(labels, pad_id, eos_id)
    return same.all(dim=1).float()


def _end_at_eos(ids: Tensor, pad_id: int, eos_id: int) -> Tensor:
    """(B, L) ids with every position after the first EOS set to pad_id."""
    after = (ids == eos_id).long().cumsum(1) - (ids == eos_id).long() > 0  # (B, L)
    return ids.masked_fill(after, pad_id)


def gather_texts(rows: list[TextRow], world_size: int, keep: int | None = None) -> list[TextRow]:
    """Every process's decoded rows, in the split's order (rows alone with one process).

    The distributed samplers deal pair i to process i % world_size: this deals them back.
    keep: the split's length, where the samplers evened out the shares by repeating pairs.
    """
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size <= 1 or not distributed:
        return rows
    shares: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(shares, rows)
    rows = [s[i] for i in range(max(map(len, shares))) for s in shares if i < len(s)]
    return rows[:keep] if keep is not None else rows


class EpochTexts:
    """One validation's or test's decoded texts: added batch by batch as TextRows, then taken
    whole, gathered from every process in the split's order (and emptied for the next epoch).

    Sources are decoded only where asked (the test split's files): validation has no use for
    them.
    """

    def __init__(self, src_vocab: Any, tgt_vocab: Any, with_sources: bool) -> None:
        self.src_vocab, self.tgt_vocab, self.with_sources = src_vocab, tgt_vocab, with_sources
        self.rows: list[TextRow] = []

    def add(self, src: Tensor, labels: Tensor, predictions: Tensor) -> tuple[list, list]:
        """Decode a batch; returns its hypotheses and references (for the text metrics)."""
        hypotheses = [self.tgt_vocab.decode(row) for row in predictions.tolist()]
        references = [self.tgt_vocab.decode(row) for row in labels.tolist()]
        sources = (
            [self.src_vocab.decode(row) for row in src.tolist()]
            if self.with_sources
            else [""] * len(hypotheses)
        )
        ended = (predictions == self.tgt_vocab.eos_id).any(1).tolist()  # False: cut off
        self.rows.extend(zip(hypotheses, references, sources, ended, strict=True))
        return hypotheses, references

    def take(self, world_size: int, keep: int | None = None) -> list[TextRow]:
        """Every process's rows in the split's order (see gather_texts); empties this."""
        rows, self.rows = self.rows, []
        return gather_texts(rows, world_size, keep)


def write_test_texts(run_dir: Path, rows: Sequence[TextRow]) -> None:
    """test_hypotheses.txt, test_references.txt and test_sources.txt in run_dir, one line a
    pair in the test split's order, for `python -m seq2seq.score`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(("hypotheses", "references", "sources")):
        lines = "".join(row[index].replace("\n", " ") + "\n" for row in rows)
        (run_dir / f"test_{name}.txt").write_text(lines, encoding="utf-8")


def write_validation_pairs(run_dir: Path, rows: Sequence[TextRow]) -> None:
    """validation_sources.txt and validation_references.txt in run_dir, once (the split does
    not change): the pairs the validations decoded, for `inspect CKPT --heads --split
    validation`, which then needs no corpus."""
    if (run_dir / "validation_references.txt").is_file():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    for index, name in ((2, "sources"), (1, "references")):
        lines = "".join(row[index].replace("\n", " ") + "\n" for row in rows)
        (run_dir / f"validation_{name}.txt").write_text(lines, encoding="utf-8")


class StageMetrics(nn.Module):
    """Everything measured in training, validation and test: one torchmetrics collection per
    stage (so their states never mix), fed batch by batch, and the decoded texts of validation
    and test, scored with sacreBLEU once the epoch is whole.

    An nn.Module so the collections follow the module to its device; they hold no weights and
    add nothing to the state_dict (a checkpoint saved mid-epoch carries the training epoch's
    states in a key of its own: train_states, restore_train_states).
    """

    def __init__(self, src_vocab: Any, tgt_vocab: Any) -> None:
        super().__init__()
        self.tgt_vocab = tgt_vocab
        size, pad = len(tgt_vocab), tgt_vocab.pad_id
        for stage in ("train", "val", "test"):  # as train_metrics, ... ("train" is a method)
            self.add_module(f"{stage}_metrics", stage_metrics(stage, size, pad))
        self.texts = {
            "val": EpochTexts(src_vocab, tgt_vocab, with_sources=True),
            "test": EpochTexts(src_vocab, tgt_vocab, with_sources=True),
        }

    def update(self, stage: str, batch: dict[str, Tensor], loss: Tensor, logits: Tensor) -> None:
        """The loss (weighted by real target tokens) and token accuracy of a batch; in
        training also the share of padded positions."""
        metrics = self.get_submodule(f"{stage}_metrics")
        pad = self.tgt_vocab.pad_id
        metrics[names.metric(stage, names.LOSS)].update(
            loss.detach(), weight=(batch["labels"] != pad).sum()
        )
        metrics[names.metric(stage, names.TOKEN_ACC)].update(
            logits.detach().flatten(0, 1), batch["labels"].flatten()
        )
        if stage == "train":
            positions = batch["src"].numel() + batch["tgt_in"].numel()
            padded = (batch["src"] == pad).sum() + (batch["tgt_in"] == pad).sum()
            metrics[names.metric(stage, names.PADDING)].update(padded / positions, weight=positions)

    def train_states(self) -> dict[str, dict[str, Tensor]]:
        """The training epoch's metric states so far, as plain tensors."""
        return {
            name: {key: value.detach().cpu().clone() for key, value in metric.metric_state.items()}
            for name, metric in self.get_submodule("train_metrics").items()
        }

    def restore_train_states(self, states: dict[str, dict[str, Tensor]]) -> None:
        """Continue a training epoch from train_states() saved mid-epoch."""
        metrics = self.get_submodule("train_metrics")
        for name, saved in states.items():
            metric = metrics[name]
            for key, value in saved.items():
                setattr(metric, key, value.to(getattr(metric, key).device))
            metric._update_count = max(metric._update_count, 1)  # computed as if updated here
            metric._computed = None

    def update_outputs(self, stage: str, batch: dict[str, Tensor], predictions: Tensor) -> None:
        """Exact match and CER of a decoded batch; its texts kept for the epoch's BLEU, chrF."""
        metrics = self.get_submodule(f"{stage}_metrics")
        v = self.tgt_vocab
        exact = exact_match(predictions, batch["labels"], v.pad_id, v.eos_id)
        metrics[names.metric(stage, names.EXACT_MATCH)].update(exact)
        texts = self.texts[stage].add(batch["src"], batch["labels"], predictions)
        metrics[names.metric(stage, names.CER)].update(*texts)

    def compute(
        self, stage: str, world_size: int, keep: int | None, bleu_tokenize: str
    ) -> tuple[dict[str, Tensor], list[TextRow]]:
        """The epoch's values (reduced across processes) and decoded rows; starts the next.

        keep: the split's length (see gather_texts). BLEU and chrF are added where the epoch
        decoded anything.
        """
        metrics = self.get_submodule(f"{stage}_metrics")
        values = metrics.compute()  # torchmetrics syncs the states across processes
        metrics.reset()
        if stage not in self.texts:
            return values, []
        rows = self.texts[stage].take(world_size, keep)
        if rows:
            hypotheses, references = [r[0] for r in rows], [r[1] for r in rows]
            scores = corpus_scores(hypotheses, references, bleu_tokenize)
            values |= {names.metric(stage, name): score["score"] for name, score in scores.items()}
        return values, rows
