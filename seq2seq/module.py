"""The LightningModule: the training, validation and test steps around the model.

It takes plain hyperparameters only (ModelConfig fields, optimizer and schedule values, the
vocabularies as lists) and builds the model itself, so ``Seq2SeqModule.load_from_checkpoint(path)``
needs nothing else, and a checkpoint alone is enough to decode. What it measures is in
metrics.py, the optimizer and the learning-rate schedule in optim.py, the checkpoint's keys in
checkpoint.py. The hooks follow the order Lightning calls them in: set-up, a training batch,
validation and test, the epoch's end and its checkpoint; then decoding.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection

from seq2seq import checks
from seq2seq.callbacks import TimeBudget
from seq2seq.checkpoint import restore_run_state, save_run_state
from seq2seq.curves import TIME
from seq2seq.data.tokenizer import tokenizer_from_dict
from seq2seq.decoding import DecodingConfig, generate
from seq2seq.doctor import Doctor
from seq2seq.metrics import EpochTexts, exact_match, stage_metrics, write_test_texts
from seq2seq.model import ModelConfig, Seq2SeqTransformer
from seq2seq.optim import SCHEDULES, adamw_with_schedule
from seq2seq.score import BLEU_TOKENIZERS, corpus_scores, signatures

log = logging.getLogger(__name__)

NONFINITE_LOSS = ("stop", "skip")


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite (on_nonfinite_loss=stop)."""


def check_hyperparameters(hp: dict[str, Any]) -> None:
    """One clear error for the first bad value (types included: `model.lr=abc` is a string)."""
    checks.number("model.lr", hp["lr"], low=0, low_open=True)
    betas = hp["betas"]
    if not (
        isinstance(betas, (list, tuple))
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
    ):
        raise ValueError(f"model.betas must be two numbers in [0, 1), got {list(betas)}")
    checks.number("model.weight_decay", hp["weight_decay"], low=0)
    checks.choice("model.schedule", hp["schedule"], SCHEDULES)
    checks.integer("model.warmup_steps", hp["warmup_steps"], minimum=0)
    checks.number("model.min_lr_ratio", hp["min_lr_ratio"], low=0, high=1)
    checks.number("model.label_smoothing", hp["label_smoothing"], low=0, high=1, high_open=True)
    DecodingConfig.from_hparams(hp)  # max_len_a, max_len_b, beam_size, length_penalty
    checks.integer("model.log_examples", hp["log_examples"], minimum=0)
    if hp["val_decode_limit"] is not None:
        checks.integer("model.val_decode_limit", hp["val_decode_limit"], minimum=1)
    checks.choice("model.bleu_tokenize", hp["bleu_tokenize"], BLEU_TOKENIZERS)
    checks.choice("model.on_nonfinite_loss", hp["on_nonfinite_loss"], NONFINITE_LOSS)
    if not isinstance(hp["net"], dict):
        raise ValueError(f"model.net must be a mapping of ModelConfig fields, got {hp['net']!r}")


class Seq2SeqModule(L.LightningModule):
    """Trains a Seq2SeqTransformer with label-smoothed cross-entropy and AdamW.

    Args:
        net: ModelConfig fields except the vocabulary sizes and special ids, which come from
            the vocabularies.
        src_vocab, tgt_vocab: saved vocabularies (Vocabulary.to_dict()).
        lr: peak learning rate. betas, weight_decay: AdamW's; decay applies to matrices only.
        schedule: "inverse_sqrt", "cosine" or "constant", after warmup_steps of linear warmup.
        min_lr_ratio: the cosine schedule's final learning rate, as a fraction of lr.
        label_smoothing: of the cross-entropy loss.
        max_len_a, max_len_b: decoding makes at most a * source length + b tokens.
        beam_size: beam width for decoding the test set (1: greedy); validation is greedy.
        compile: train with torch.compile (the model's forward; decoding stays eager).
        length_penalty: beam search ranks by log-probability / length ** length_penalty.
        log_examples: decoded validation examples written to the log each validation epoch.
        val_decode_limit: validation decodes (for exact match, BLEU, chrF, CER) only its first
            this many examples, so a long validation set does not dominate training time;
            loss and token accuracy cover it all, and the test set is always decoded whole.
        bleu_tokenize: sacreBLEU's tokenizer: 13a (its default), char (for targets of one
            word, such as number words, where word n-grams do not exist), intl, none.
        on_nonfinite_loss: "stop": a NaN or infinite training loss stops the run with an error
            naming the step, before the update, so the checkpoints on disk stay good; "skip":
            leave that batch out (no update) and count it in the log.
    """

    def __init__(
        self,
        net: dict[str, Any],
        src_vocab: dict[str, Any],
        tgt_vocab: dict[str, Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.98),
        weight_decay: float = 0.01,
        schedule: str = "inverse_sqrt",
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.0,
        label_smoothing: float = 0.1,
        max_len_a: float = 1.0,
        max_len_b: int = 10,
        beam_size: int = 1,
        length_penalty: float = 1.0,
        log_examples: int = 3,
        compile: bool = False,
        val_decode_limit: int | None = 1000,
        bleu_tokenize: str = "13a",
        on_nonfinite_loss: str = "stop",
    ) -> None:
        super().__init__()
        check_hyperparameters(locals())
        self.save_hyperparameters()
        self.src_vocab = tokenizer_from_dict(src_vocab)
        self.tgt_vocab = tokenizer_from_dict(tgt_vocab)
        v = self.tgt_vocab
        self.config = ModelConfig(
            src_vocab_size=len(self.src_vocab),
            tgt_vocab_size=len(v),
            pad_id=v.pad_id,
            bos_id=v.bos_id,
            eos_id=v.eos_id,
            **net,
        )
        self.model = Seq2SeqTransformer(self.config)
        # The composed run config, set by train.py and saved in every checkpoint for inspect.
        self.run_config: dict[str, Any] | None = None
        # The decoded texts of the current validation and test epochs, for BLEU and chrF.
        self._texts = {
            "val": EpochTexts(self.src_vocab, self.tgt_vocab, with_sources=False),
            "test": EpochTexts(self.src_vocab, self.tgt_vocab, with_sources=True),
        }
        self.doctor = Doctor()  # degenerate outputs at each validation, in the log and metrics
        self._train_seconds = 0.0  # training time of earlier starts (a resumed run)
        self._rng_to_restore: dict[str, Any] = {}  # a resumed run's, at its first batch
        self._compiled = False  # configure_model compiles once
        self._skipped = 0  # batches left out for a non-finite loss (on_nonfinite_loss=skip)
        self._val_decoded = 0  # examples decoded in this validation (val_decode_limit)
        self._train_started = time.monotonic()
        self._signatures_logged = False
        # One collection per stage, so their states never mix (val_metrics, test_metrics, ...).
        vocab_size, pad = len(self.tgt_vocab), self.tgt_vocab.pad_id
        self.train_metrics = stage_metrics("train", vocab_size, pad)
        self.val_metrics = stage_metrics("val", vocab_size, pad)
        self.test_metrics = stage_metrics("test", vocab_size, pad)

    def configure_model(self) -> None:
        # In place (nn.Module.compile), so parameter names and checkpoints do not change.
        if self.hparams.compile and not self._compiled:
            self.model.compile()
            self._compiled = True

    def configure_optimizers(self) -> dict[str, Any]:
        # Not estimated_stepping_batches right here: asking for it now loads the train loader
        # before Lightning restores a checkpoint's loader state, and a mid-epoch resume would
        # then start a fresh shuffle. Asked lazily, it is first needed after the restore.
        def total() -> float:
            return float(self.trainer.estimated_stepping_batches)  # inf: no step limit

        hp = self.hparams
        callbacks = self._trainer.callbacks if self._trainer is not None else []
        budget = next((c for c in callbacks if isinstance(c, TimeBudget)), None)
        progress = None
        if budget is not None:
            progress = functools.partial(budget.decay_progress, warmup_steps=hp.warmup_steps)
        return adamw_with_schedule(
            self.parameters(),
            lr=hp.lr,
            betas=hp.betas,
            weight_decay=hp.weight_decay,
            schedule=hp.schedule,
            warmup_steps=hp.warmup_steps,
            min_lr_ratio=hp.min_lr_ratio,
            total_steps=total,
            time_progress=progress,
            # One fused kernel for all tensors instead of a loop over them: optimizer steps
            # 4-7x faster on a CPU, where torch's default is the plain loop. Not under mixed
            # precision: Lightning's AMP plugin refuses to clip the gradients of an optimizer
            # that unscales them itself, as the fused one does.
            fused=not self._mixed_precision(),
        )

    def _mixed_precision(self) -> bool:
        return self._trainer is not None and "mixed" in str(self._trainer.precision)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Applied at the next training batch, the point where the saving run stood: Lightning
        # still sets up loaders and loops between this hook and then.
        self._rng_to_restore, self._train_seconds = restore_run_state(checkpoint)

    def on_train_start(self) -> None:
        self._train_started = time.monotonic()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        states, self._rng_to_restore = self._rng_to_restore, {}
        if "torch" in states:
            torch.set_rng_state(states["torch"].cpu())
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def model_step(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Loss averaged over the real (non-pad) target tokens, and the logits."""
        logits = self.model(batch["src"], batch["tgt_in"])  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            batch["labels"].flatten(),
            ignore_index=self.tgt_vocab.pad_id,
            label_smoothing=self.hparams.label_smoothing,
        )
        return loss, logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor | None:
        loss, logits = self.model_step(batch)
        if not torch.isfinite(loss):
            return self._non_finite(loss)
        self._record("train", batch, loss, logits)
        pad = self.tgt_vocab.pad_id
        positions = batch["src"].numel() + batch["tgt_in"].numel()
        padded = (batch["src"] == pad).sum() + (batch["tgt_in"] == pad).sum()
        self.train_metrics["train/padding"].update(padded / positions, weight=positions)
        self.log("train/loss_step", loss, prog_bar=True, batch_size=batch["src"].size(0))
        # Training time, for curves against time (seq2seq.curves); restored on resume.
        self.log(TIME, self._train_seconds + time.monotonic() - self._train_started)
        return loss

    def _non_finite(self, loss: Tensor) -> None:
        """Stop before the bad update reaches the weights, or leave the batch out.

        Returning None from training_step makes Lightning skip backward and the optimizer step.
        """
        step = self.global_step
        if self.hparams.on_nonfinite_loss == "skip":
            self._skipped += 1
            log.warning("non-finite loss (%s) at step %d: batch skipped", loss.item(), step)
            return None
        last = Path(self.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint yet"
        raise NonFiniteLossError(
            f"non-finite loss ({loss.item()}) at step {step}: training stopped before that "
            f"update; {kept}. Lower model.lr, raise model.warmup_steps, or set "
            "model.on_nonfinite_loss=skip"
        )

    def _update(self, stage: str, batch: dict[str, Tensor]) -> Tensor:
        loss, logits = self.model_step(batch)
        self._record(stage, batch, loss, logits)
        return loss

    def _record(self, stage: str, batch: dict[str, Tensor], loss: Tensor, logits: Tensor) -> None:
        metrics = self._stage_metrics(stage)
        n_tokens = (batch["labels"] != self.tgt_vocab.pad_id).sum()
        metrics[f"{stage}/loss"].update(loss.detach(), weight=n_tokens)
        metrics[f"{stage}/token_acc"].update(
            logits.detach().flatten(0, 1), batch["labels"].flatten()
        )

    def on_validation_start(self) -> None:
        self._log_signatures_once()

    def on_test_start(self) -> None:
        self._log_signatures_once()

    def _log_signatures_once(self) -> None:
        if not self._signatures_logged and self.trainer.is_global_zero:
            sig = signatures(self.hparams.bleu_tokenize)
            log.info("BLEU and chrF are sacreBLEU's: BLEU %s; chrF %s", sig["bleu"], sig["chrf"])
        self._signatures_logged = True

    def on_validation_epoch_start(self) -> None:
        self._val_decoded = 0  # val_decode_limit counts from each validation's start

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch, batch_idx)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch, batch_idx)

    def _eval_step(self, stage: str, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._update(stage, batch)
        limit = self.hparams.val_decode_limit
        if stage == "val" and limit is not None and self._val_decoded >= limit:
            return
        beam = self.decoding.beam_size if stage == "test" else 1
        predictions = self.generate(batch["src"], beam)
        metrics = self._stage_metrics(stage)
        v = self.tgt_vocab
        metrics[f"{stage}/exact_match"].update(
            exact_match(predictions, batch["labels"], v.pad_id, v.eos_id)
        )
        texts = self._texts[stage].add(batch["src"], batch["labels"], predictions)
        metrics[f"{stage}/cer"].update(*texts)
        if stage == "val":
            self._val_decoded += batch["src"].size(0)
            if batch_idx == 0:
                self._log_examples(batch, predictions)

    def _log_examples(self, batch: dict[str, Tensor], predictions: Tensor) -> None:
        if self.trainer.sanity_checking or not self.hparams.log_examples:
            return
        lines = [f"epoch {self.current_epoch} validation examples:"]
        for i in range(min(self.hparams.log_examples, batch["src"].size(0))):
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
        metrics = self._stage_metrics(stage)
        # compute() already reduces across processes (torchmetrics syncs its states).
        values = metrics.compute()
        metrics.reset()
        if stage != "train":
            keep = len(self.trainer.test_dataloaders.dataset) if stage == "test" else None
            rows = self._texts[stage].take(self.trainer.world_size, keep)
            if rows:
                hypotheses, references, _, ended = zip(*rows, strict=True)
                scores = corpus_scores(hypotheses, references, self.hparams.bleu_tokenize)
                values |= {f"{stage}/{name}": score["score"] for name, score in scores.items()}
                if stage == "val" and not self.trainer.sanity_checking:
                    values |= self._consult_doctor(hypotheses, references, ended, values)
            if stage == "test" and self.trainer.is_global_zero:
                write_test_texts(Path(self.trainer.default_root_dir), rows)
        self.log_dict(values, prog_bar=stage == "val")

    def _stage_metrics(self, stage: str) -> MetricCollection:
        return getattr(self, f"{stage}_metrics")

    def _consult_doctor(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        ended: Sequence[bool],
        values: dict[str, Any],
    ) -> dict[str, float]:
        """The doctor's metrics of this validation; what looks wrong goes to the log."""
        loss, bleu = float(values["val/loss"]), float(values["val/bleu"])
        metrics, warnings = self.doctor.diagnose(hypotheses, references, ended, loss, bleu)
        if self.trainer.is_global_zero:
            for warning in warnings:
                log.warning("validation at step %d: %s", self.global_step, warning)
        return {f"val/{name}": value for name, value in metrics.items()}

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning does not save random states; seq2seq.checkpoint owns these keys.
        save_run_state(
            checkpoint,
            run_config=self.run_config,
            metrics=self.trainer.callback_metrics,
            metric_signatures=signatures(self.hparams.bleu_tokenize),
            train_seconds=self._train_seconds + time.monotonic() - self._train_started,
        )

    def on_train_end(self) -> None:
        if self._skipped:
            log.warning("skipped %d batches with a non-finite loss", self._skipped)

    def generate(self, src: Tensor, beam_size: int = 1) -> Tensor:
        """(B, S) source ids -> (B, L) predictions, by greedy search or beam search."""
        return generate(self.model, src, self.decoding, beam_size)

    def greedy(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, L) greedy predictions (EOS, then padding)."""
        return self.generate(src, beam_size=1)

    @property
    def decoding(self) -> DecodingConfig:
        # Read from hparams each time: evaluating a checkpoint (train=false) sets new values.
        return DecodingConfig.from_hparams(self.hparams)
