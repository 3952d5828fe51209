"""The checkpoint format: what a checkpoint holds besides Lightning's keys, and reading it
safely (tensors and plain values only, with clear errors).

Lightning writes state_dict, hyper_parameters (the module's plain-value arguments, the
tokenizers included), epoch, global_step, optimizer, scheduler, loop and callback states. This
project adds (RunState.save; write_run_config, which callbacks.SaveRunConfig calls):

    seq2seq_format     FORMAT_VERSION; files written before it existed have none and read as
                       format 0, which holds the same keys. Format 2 groups the module's
                       hyperparameters (net, training, decoding) where 0 and 1 had the
                       settings flat beside net: load_checkpoint reads those grouped
    run_config         the composed run config (train.py), for inspect and a resume's checks
    metrics            the callback metrics at the save, plain floats
    metric_signatures  sacreBLEU's signatures of the BLEU and chrF among them
    train_seconds      training time so far: a resumed run continues its clock
    rng_states         torch's (and CUDA's) random states: dropout after a resume draws what an
                       uninterrupted run would have drawn
    train_metric_states  saved mid-epoch by one process: the epoch's training metrics so far
                       (torchmetrics states), so the epoch's means after a resume are the
                       whole epoch's (optional: files without it resume with none)
    picked_search      with pick_search, in the checkpoint the run tested: every candidate
                       search's validation scores and the pick, which is also the file's
                       decoding defaults (optional; seq2seq.training.pick writes it)

The tools read them through run_record (inspect) and carry_run_record (average). A file of a
newer format is refused in one line naming its version. A change to these keys bumps
FORMAT_VERSION and teaches load_checkpoint to read the older formats.

A checkpoint is a pickle file, and unpickling can run arbitrary code. Everything here reads
with ``torch.load(weights_only=True)``, which accepts tensors, numbers, strings, lists and dicts
and refuses anything else *before* running it. Our checkpoints hold nothing else.
"""

from __future__ import annotations

import pickle
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq.core.decoding import Decodes

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "RunState",
    "TrainedModel",
    "carry_run_record",
    "load_checkpoint",
    "load_module",
    "load_weights",
    "picked_search_lines",
    "run_record",
    "trained_model",
    "write_run_config",
]

FORMAT_KEY = "seq2seq_format"
FORMAT_VERSION = 2


class CheckpointError(ValueError):
    """A file that is not a readable, safe checkpoint of this project."""


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """The checkpoint's dict, read without unpickling arbitrary objects. mmap=True maps the
    tensors instead of reading them: for checks that look at the plain values only."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a file)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): was its save interrupted?")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, whole or not at all
        raise CheckpointError(
            f"cannot read {path} as a checkpoint: it is truncated or not a file torch.save wrote"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"refusing to load {path}: it holds Python objects other than tensors and plain "
            f"values, and loading them could run code ({first_line})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(
            f"cannot read {path} as a checkpoint (truncated or not a torch file): {error}"
        ) from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= set(
        checkpoint
    ):
        raise CheckpointError(
            f"{path} is not a seq2seq checkpoint: it has no state_dict and hyper_parameters"
        )
    version = checkpoint.get(FORMAT_KEY, 0)
    if not isinstance(version, int) or not 0 <= version <= FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is checkpoint format {version!r}; this seq2seq reads formats 0-"
            f"{FORMAT_VERSION}: use the seq2seq version that wrote it, or a newer one"
        )
    if version < 2:
        _group_settings(checkpoint, path)
    return checkpoint


def _group_settings(checkpoint: dict[str, Any], path: Path) -> None:
    """Formats 0 and 1 saved the module's settings flat (lr, beam_size, ... beside net), in
    its hyperparameters and in the run config's model group: read them as format 2 groups."""
    from seq2seq.hparams import grouped

    try:
        checkpoint["hyper_parameters"] = grouped(checkpoint["hyper_parameters"])
        model = (checkpoint.get("run_config") or {}).get("model")
        if isinstance(model, dict):
            checkpoint["run_config"]["model"] = grouped(model)
    except (AttributeError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{path} holds hyperparameters this version cannot use: {error}"
        ) from None


def run_record(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """This project's keys of a checkpoint as the tools read them (a file saved without them
    reads as format 0, with no run config, metrics or signatures)."""
    return {
        "format": checkpoint.get(FORMAT_KEY, 0),
        "last_metrics": checkpoint.get("metrics", {}),
        "metric_signatures": checkpoint.get("metric_signatures", {}),  # sacreBLEU's
        "run_config": checkpoint.get("run_config"),
        "picked_search": checkpoint.get("picked_search"),  # None: not picked
    }


def picked_search_lines(record: dict[str, Any]) -> list[str]:
    """A picked_search record as the log and inspect show it: the metric, then each
    candidate's scores, the pick marked."""
    picked = record["picked"]
    lines = [
        f"picked by validation {record['metric']} on {record['pairs']} pairs:",
        f"  {'beam':>4} {'length penalty':>14} {'BLEU':>7} {'chrF':>7} {'seconds':>8}",
    ]
    for row in record["rows"]:
        mark = "  <- picked" if row == picked else ""
        lines.append(
            f"  {row['beam_size']:>4} {row['length_penalty']:>14g} {row['bleu']:>7.4f} "
            f"{row['chrf']:>7.4f} {row['seconds']:>8.1f}{mark}"
        )
    return lines


def carry_run_record(source: dict[str, Any], target: dict[str, Any]) -> None:
    """Copy the run config of source into target (an averaged checkpoint), which is of this
    format: load_checkpoint read source's older format as this one."""
    target[FORMAT_KEY] = FORMAT_VERSION
    if "run_config" in source:
        target["run_config"] = source["run_config"]


def write_run_config(checkpoint: dict[str, Any], run_config: dict[str, Any]) -> None:
    checkpoint["run_config"] = run_config


class RunState:
    """What a run carries across a stop and a resume besides the weights, optimizer and loops:
    its training clock and random states. The module's hooks call it (start, restore, at the
    first batch apply_rng, save); this class writes and reads the keys.
    """

    def __init__(self) -> None:
        self._seconds_before = 0.0  # training time of earlier starts (a resumed run)
        self._started = time.monotonic()
        self._rng: dict[str, Any] = {}  # a resumed run's random states, for its first batch
        self.train_metric_states: dict[str, dict[str, Tensor]] = {}  # a resumed run's, idem

    def start(self) -> None:
        self._started = time.monotonic()

    def train_seconds(self) -> float:
        return self._seconds_before + time.monotonic() - self._started

    def save(
        self,
        checkpoint: dict[str, Any],
        metrics: dict[str, Any],
        signatures: dict[str, str],
        train_metric_states: dict[str, dict[str, Tensor]] | None = None,
    ) -> None:
        """Add this project's keys to a checkpoint Lightning is saving (plain values only, so
        it loads with weights_only=True). callbacks.SaveRunConfig adds the run config."""
        if train_metric_states:
            checkpoint["train_metric_states"] = train_metric_states
        checkpoint[FORMAT_KEY] = FORMAT_VERSION
        checkpoint["metrics"] = {name: float(value) for name, value in metrics.items()}
        checkpoint["metric_signatures"] = signatures
        checkpoint["train_seconds"] = self.train_seconds()
        checkpoint["rng_states"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng_states"]["cuda"] = torch.cuda.get_rng_state_all()

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Read a checkpoint's clock and random states (none, 0 s: a file saved without them).
        The states wait for apply_rng: Lightning still sets up loaders and loops between
        restoring and the next training batch, where the saving run stood."""
        self._rng = checkpoint.get("rng_states") or {}
        self._seconds_before = float(checkpoint.get("train_seconds", 0.0))
        self.train_metric_states = checkpoint.get("train_metric_states") or {}

    def apply_rng(self) -> None:
        states, self._rng = self._rng, {}
        if "torch" in states:
            torch.set_rng_state(states["torch"].cpu())
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])


@dataclass
class TrainedModel(Decodes):
    """A trained network as a checkpoint holds it, ready to use: the network (eval mode), its
    source and target tokenizers, and the hyperparameters it was saved with (its decoding
    defaults among them; `decoding`, `generate` and `greedy` as the LightningModule has them).
    Plain PyTorch: translate, inspect and export read checkpoints through it and never import
    Lightning; the LightningModule is for training and for testing a checkpoint (train=false)."""

    hparams: dict[str, Any]
    src_vocab: Any
    tgt_vocab: Any
    model: Any

    @property
    def config(self) -> Any:
        """The network's ModelConfig."""
        return self.model.config

    @torch.inference_mode()
    def attention(self, src_ids: list[int], output_ids: list[int]) -> dict[str, list[Tensor]]:
        """Every attention module's probabilities while the network reads source src_ids and
        produces output_ids (teacher-forced: the decoder's input is <bos> and the output
        but its last token, so query row t is where output token t was produced). Per layer,
        (H, Tq, Tk): "cross" (output over source), "self" (the decoder's, causal) and
        "encoder" (source over source)."""
        from seq2seq.core.attention import capture_attention

        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.tgt_vocab.bos_id, *output_ids[:-1]]], device=self.device)
        with capture_attention(self.model) as maps:
            self.model(src, tgt_in)
        decoder, encoder = (
            range(self.config.num_decoder_layers),
            range(self.config.num_encoder_layers),
        )
        return {
            "cross": [maps[f"decoder.layers.{i}.cross_attn"][0].float() for i in decoder],
            "self": [maps[f"decoder.layers.{i}.self_attn"][0].float() for i in decoder],
            "encoder": [maps[f"encoder.layers.{i}.self_attn"][0].float() for i in encoder],
        }

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def output_ids(self, ids: list[int]) -> list[int]:
        """A decoded row as the tokens it produced: up to and including <eos> (padding after
        it, or after a row cut at its limit, dropped)."""
        eos, pad_id = self.tgt_vocab.eos_id, self.tgt_vocab.pad_id
        if eos in ids:
            return ids[: ids.index(eos) + 1]
        while ids and ids[-1] == pad_id:
            ids = ids[:-1]
        return ids


def load_module(path: str | Path, map_location: str | torch.device = "cpu") -> TrainedModel:
    """The trained model of a checkpoint, rebuilt from the file alone."""
    return trained_model(load_checkpoint(path, map_location), path, map_location)


def trained_model(
    checkpoint: dict[str, Any], path: str | Path, map_location: str | torch.device = "cpu"
) -> TrainedModel:
    """The TrainedModel of a checkpoint dict load_checkpoint returned: its hyperparameters
    checked and completed as the module does (seq2seq.hparams), the network's weights loaded
    strictly."""
    from seq2seq.hparams import build_network, complete_hparams

    saved = checkpoint["hyper_parameters"]
    try:
        groups = (saved.get(group) for group in ("net", "training", "decoding"))
        vocabs = {"src_vocab": saved["src_vocab"], "tgt_vocab": saved["tgt_vocab"]}
        hparams = {**complete_hparams(*groups), **vocabs}
        src_vocab, tgt_vocab, model = build_network(hparams)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{path} holds hyperparameters this version cannot use: {error}"
        ) from None
    weights = checkpoint["state_dict"]
    network = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    load_weights(model, network, path, others=[k for k in weights if not k.startswith("model.")])
    return TrainedModel(hparams, src_vocab, tgt_vocab, model.to(map_location).eval())


def load_weights(
    module: torch.nn.Module, weights: dict[str, Any], path: str | Path, others: list[str]
) -> None:
    """Load weights into module, every tensor of the right shape and none missing or extra."""
    try:
        missing, unexpected = module.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # a tensor of another shape
        detail = " ".join(str(error).split())
        raise CheckpointError(f"{path} does not match its own model config: {detail}") from None
    unexpected = [*others, *unexpected]
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match its own model config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
