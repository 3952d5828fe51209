"""The LightningModule: the training, validation and test steps around the model.

It takes plain hyperparameters only, in groups (net: ModelConfig fields; training:
TrainingConfig's; decoding: DecodingConfig's; the vocabularies as lists) and builds the model
itself, so ``Seq2SeqModule.load_from_checkpoint(path)`` needs nothing else, and a checkpoint
alone is enough to decode (module_from_checkpoint below also reads the flat settings of
checkpoint formats 0 and 1, through seq2seq.checkpoint.load_checkpoint). What it measures is
in metrics.py, the optimizer and the learning-rate schedule in optim.py, the checkpoint's keys
and the run's clock and random states in checkpoint.py. The hooks follow the order Lightning
calls them in: set-up, a training batch, validation and test, the epoch's end and its
checkpoint; then decoding.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq import metric_names as names
from seq2seq.checkpoint import CheckpointError, RunState, load_checkpoint, load_weights
from seq2seq.core.decoding import Decodes, DecodingConfig
from seq2seq.hparams import TrainingConfig, build_network, complete_hparams
from seq2seq.run_dir import RunDir
from seq2seq.score import signatures
from seq2seq.training.callbacks import last_batch, steps_per_epoch
from seq2seq.training.doctor import Doctor
from seq2seq.training.metrics import (
    StageMetrics,
    TextRow,
    write_test_texts,
    write_validation_pairs,
)
from seq2seq.training.optim import optimizer_with_schedule

log = logging.getLogger(__name__)


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite (on_nonfinite_loss=stop)."""


class Seq2SeqModule(Decodes, L.LightningModule):
    """Trains a Seq2SeqTransformer with label-smoothed cross-entropy and AdamW.

    Args:
        net: ModelConfig fields except the vocabulary sizes and special ids, which come from
            the vocabularies.
        src_vocab, tgt_vocab: saved vocabularies (Vocabulary.to_dict()).
        training: TrainingConfig fields (the optimizer, schedule, loss and validation);
            the rest take their defaults.
        decoding: DecodingConfig fields (how validation, the test and translate search).
    All are in self.hparams, which a checkpoint saves.
    """

    def __init__(
        self,
        net: dict[str, Any],
        src_vocab: dict[str, Any],
        tgt_vocab: dict[str, Any],
        training: dict[str, Any] | None = None,
        decoding: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        vocabs = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab}
        self.save_hyperparameters({**complete_hparams(net, training, decoding), **vocabs})
        self.src_vocab, self.tgt_vocab, self.model = build_network(self.hparams)
        self.config = self.model.config
        self.metrics = StageMetrics(self.src_vocab, self.tgt_vocab)  # see metrics.py
        self.doctor = Doctor()  # degenerate outputs at each validation, in the log and metrics
        self.run_state = RunState()  # the training clock and random states, across resumes
        self._compiled = False  # configure_model compiles once
        self._skipped = 0  # batches left out for a non-finite loss (on_nonfinite_loss=skip)
        self._val_decoded = 0  # examples decoded in this validation (val_decode_limit)
        self._signatures_logged = False
        self._dropout_on: bool | None = None  # late dropout's state (None: not decided yet)

    @property
    def settings(self) -> TrainingConfig:
        """The training settings (model.training), read from hparams as `decoding` is."""
        return TrainingConfig(**self.hparams["training"])

    def configure_model(self) -> None:
        # In place (nn.Module.compile), so parameter names and checkpoints do not change.
        if self.settings.compile and not self._compiled:
            self.model.compile()
            self._compiled = True

    def configure_optimizers(self) -> dict[str, Any]:
        return optimizer_with_schedule(self.named_parameters(), self.settings, self._trainer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.run_state.restore(checkpoint)

    def on_train_start(self) -> None:
        self.run_state.start()
        if self.run_state.train_metric_states:  # resumed mid-epoch: the epoch goes on
            self.metrics.restore_train_states(self.run_state.train_metric_states)
            self.run_state.train_metric_states = {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.run_state.apply_rng()  # a resumed run's, where the saving run stood
        self._late_dropout()

    def _late_dropout(self) -> None:
        """model.training.dropout_from_epoch: dropout off before that many epochs of training
        and on from there, by the steps made (a resume or a replay at a step decides as the run
        did there; the clock has no say)."""
        start = self.hparams["training"].get("dropout_from_epoch")
        if start is None:
            return
        epochs = epochs_trained(self.trainer)
        on = epochs >= start
        if on != self._dropout_on:
            self.model.set_dropout(self.config.dropout if on else 0.0)
            log.info(
                "Late dropout: %g from step %d (%.2f epochs trained; %s at "
                "model.training.dropout_from_epoch=%g)",
                self.config.dropout if on else 0.0, self.global_step, epochs,
                "on" if on else "off until", start,
            )  # fmt: skip
            self._dropout_on = on

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def model_step(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Loss averaged over the real (non-pad) target tokens, and the logits."""
        logits = self.model(batch["src"], batch["tgt_in"])  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            batch["labels"].flatten(),
            ignore_index=self.tgt_vocab.pad_id,
            label_smoothing=self.settings.label_smoothing,
        )
        return loss, logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor | None:
        loss, logits = self.model_step(batch)
        if not torch.isfinite(loss):
            return self._non_finite(loss)
        self.metrics.update("train", batch, loss, logits)
        self.log(names.TRAIN_LOSS_STEP, loss, prog_bar=True, batch_size=batch["src"].size(0))
        # Training time, for curves against time (seq2seq.curves); restored on resume.
        self.log(names.TIME, self.run_state.train_seconds())
        if self._dropout_on is not None:  # late dropout: where it turned on, in the curves
            self.log(names.DROPOUT, self.config.dropout if self._dropout_on else 0.0)
        return loss

    def _non_finite(self, loss: Tensor) -> None:
        """Stop before the bad update reaches the weights, or leave the batch out.

        Returning None from training_step makes Lightning skip backward and the optimizer step.
        """
        step = self.global_step
        if self.settings.on_nonfinite_loss == "skip":
            self._skipped += 1
            log.warning("non-finite loss (%s) at step %d: batch skipped", loss.item(), step)
            return None
        last = RunDir(self.trainer.default_root_dir).last
        kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint yet"
        raise NonFiniteLossError(
            f"non-finite loss ({loss.item()}) at step {step}: training stopped before that "
            f"update; {kept}. Lower model.training.lr, raise model.training.warmup_steps, or "
            "set model.training.on_nonfinite_loss=skip"
        )

    def on_validation_start(self) -> None:
        self._log_signatures_once()

    def on_test_start(self) -> None:
        self._log_signatures_once()

    def _log_signatures_once(self) -> None:
        if not self._signatures_logged and self.trainer.is_global_zero:
            sig = signatures(self.settings.bleu_tokenize)
            bleu, chrf = sig[names.BLEU], sig[names.CHRF]
            log.info("BLEU and chrF are sacreBLEU's: BLEU %s; chrF %s", bleu, chrf)
        self._signatures_logged = True

    def on_validation_epoch_start(self) -> None:
        self._val_decoded = 0  # val_decode_limit counts from each validation's start

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch, batch_idx)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch, batch_idx)

    def _eval_step(self, stage: str, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.metrics.update(stage, batch, *self.model_step(batch))
        limit = self.settings.val_decode_limit
        if stage == "val" and limit is not None and self._val_decoded >= limit:
            return
        beam = self.decoding.beam_size if stage == "test" else 1
        predictions = self.generate(batch["src"], beam)
        self.metrics.update_outputs(stage, batch, predictions)
        if stage == "val":
            self._val_decoded += batch["src"].size(0)
            if batch_idx == 0:
                self._log_examples(batch, predictions)

    def _log_examples(self, batch: dict[str, Tensor], predictions: Tensor) -> None:
        if self.trainer.sanity_checking or not self.settings.log_examples:
            return
        lines = [f"epoch {self.current_epoch} validation examples:"]
        for i in range(min(self.settings.log_examples, batch["src"].size(0))):
            lines.append(f"  source:     {self.src_vocab.decode(batch['src'][i].tolist())}")
            lines.append(f"  reference:  {self.tgt_vocab.decode(batch['labels'][i].tolist())}")
            lines.append(f"  prediction: {self.tgt_vocab.decode(predictions[i].tolist())}")
        if self.trainer.is_global_zero:
            log.info("\n".join(lines))

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, stage: str) -> None:
        keep = len(self.trainer.test_dataloaders.dataset) if stage == "test" else None
        world, tokenize = self.trainer.world_size, self.settings.bleu_tokenize
        values, rows = self.metrics.compute(stage, world, keep, tokenize)
        if stage == "val" and rows and not self.trainer.sanity_checking:
            values |= self._consult_doctor(rows, values)
            if self.trainer.is_global_zero:
                write_validation_pairs(Path(self.trainer.default_root_dir), rows)
        if stage == "test" and self.trainer.is_global_zero:
            write_test_texts(Path(self.trainer.default_root_dir), rows)
        self.log_dict(values, prog_bar=stage == "val")

    def _consult_doctor(self, rows: list[TextRow], values: dict[str, Any]) -> dict[str, float]:
        """The doctor's metrics of this validation; what looks wrong goes to the log."""
        hypotheses, references, _, ended = zip(*rows, strict=True)
        loss = float(values[names.metric("val", names.LOSS)])
        bleu = float(values[names.metric("val", names.BLEU)])
        metrics, warnings = self.doctor.diagnose(hypotheses, references, ended, loss, bleu)
        if self.trainer.is_global_zero:
            for warning in warnings:
                log.warning("validation at step %d: %s", self.global_step, warning)
        return {names.metric("val", name): value for name, value in metrics.items()}

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning does not save random states; seq2seq.checkpoint owns these keys.
        signature = signatures(self.settings.bleu_tokenize)
        # The epoch's training metrics so far, where a resume goes on with the epoch: saved
        # mid-epoch, by one process (under DDP each has its own share, which one file cannot
        # give back to each: there a resumed epoch's means cover the batches after it).
        trainer = self.trainer
        mid_epoch = trainer.state.fn == "fit" and not last_batch(trainer)
        states = self.metrics.train_states() if mid_epoch and trainer.world_size == 1 else None
        self.run_state.save(checkpoint, trainer.callback_metrics, signature, states)

    def on_train_end(self) -> None:
        if self._skipped:
            log.warning("skipped %d batches with a non-finite loss", self._skipped)


def module_from_checkpoint(checkpoint: dict[str, Any], path: str | Path):
    """The LightningModule (eval mode) of a checkpoint dict, to test it (train=false)."""
    try:
        module = Seq2SeqModule(**checkpoint["hyper_parameters"])
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"{path} holds hyperparameters this version cannot use: {error}"
        ) from None
    load_weights(module, checkpoint["state_dict"], path, others=[])
    return module.eval()


def start_from(module: Seq2SeqModule, path: str | Path) -> None:
    """init_from=CKPT: the new run's network takes CKPT's weights (every tensor, of the same
    shapes: preflight gave the run CKPT's network settings and tokenizers); the optimizer, the
    schedule and the budget are the new run's own."""
    checkpoint = load_checkpoint(path)
    weights = checkpoint["state_dict"]
    network = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    load_weights(module.model, network, path, others=[])
    log.info(
        "Fine-tuning: the network starts from %s (its step %s); a fresh optimizer and schedule",
        path, checkpoint.get("global_step", "?"),
    )  # fmt: skip


def load_for_evaluation(path: str | Path, tokenizers: tuple[Any, Any], decoding: dict[str, Any]):
    """The module of a checkpoint to test on the data (train=false): its tokenizers must be
    the data's; everything is the checkpoint's (its decoding settings too, a picked search
    included), but for the decoding settings given (model.decoding.NAME=... on the command
    line)."""
    module = module_from_checkpoint(load_checkpoint(path), path)
    if (module.src_vocab, module.tgt_vocab) != tokenizers:
        raise ValueError(
            f"the vocabulary of {path} differs from the data's: evaluate it on the data it was "
            "trained on (drop data=... and experiment=... to use the run's own)"
        )
    module.hparams["decoding"] = DecodingConfig(
        **{**module.hparams["decoding"], **decoding}
    ).to_dict()
    return module


def epochs_trained(trainer: Any) -> float:
    """Epochs of training data the optimizer steps so far have seen: the steps over an epoch's
    (gradient accumulation counted), or whole epochs where an epoch's length is unknown."""
    per_epoch = steps_per_epoch(trainer)
    if 0 < per_epoch < float("inf"):
        return trainer.global_step / per_epoch
    return float(trainer.current_epoch)
