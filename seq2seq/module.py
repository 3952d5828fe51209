"""The LightningModule: the training, validation and test steps around the model.

It takes plain hyperparameters only (ModelConfig fields; TrainingConfig's and DecodingConfig's
fields, flat; the vocabularies as lists) and builds the model itself, so
``Seq2SeqModule.load_from_checkpoint(path)`` needs nothing else, and a checkpoint alone is
enough to decode. What it measures is in metrics.py, the optimizer and the learning-rate
schedule in optim.py, the checkpoint's keys and the run's clock and random states in
checkpoint.py. The hooks follow the order Lightning calls them in: set-up, a training batch,
validation and test, the epoch's end and its checkpoint; then decoding.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq import checks
from seq2seq.checkpoint import RunState
from seq2seq.curves import TIME
from seq2seq.data.tokenizer import tokenizer_from_dict
from seq2seq.decoding import DECODING_KEYS, DecodingConfig, generate
from seq2seq.doctor import Doctor
from seq2seq.metrics import StageMetrics, TextRow, write_test_texts
from seq2seq.model import ModelConfig, Seq2SeqTransformer
from seq2seq.optim import SCHEDULES, adamw_with_schedule
from seq2seq.score import BLEU_TOKENIZERS, signatures

log = logging.getLogger(__name__)

NONFINITE_LOSS = ("stop", "skip")


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite (on_nonfinite_loss=stop)."""


@dataclass(frozen=True)
class TrainingConfig:
    """The module's hyperparameters besides the model (ModelConfig) and decoding
    (DecodingConfig): each field's default, meaning and check, in one place.

    They reach the module flat (model.lr, ... in configs/model/*.yaml) and are saved flat in
    checkpoints as Lightning's hyperparameters; complete_hparams() checks them and fills in
    defaults. A new hyperparameter is a field here (checked in __post_init__) and its line in
    the YAML.
    """

    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW's
    weight_decay: float = 0.01  # AdamW's, on matrices only (not biases or norm gains)
    schedule: str = "inverse_sqrt"  # inverse_sqrt, cosine or constant, after the warmup
    warmup_steps: int = 100  # of linear warmup
    min_lr_ratio: float = 0.0  # the cosine schedule ends at lr * min_lr_ratio
    label_smoothing: float = 0.1  # of the cross-entropy loss
    log_examples: int = 3  # decoded validation examples written to the log each validation
    compile: bool = False  # train with torch.compile (the model's forward; decoding is eager)
    # Validation decodes (for exact match, BLEU, chrF, CER) only its first this many pairs, so a
    # long validation split does not dominate training time; loss and token accuracy cover it
    # all, and the test split is always decoded whole. None: all.
    val_decode_limit: int | None = 1000
    # sacreBLEU's tokenizer: 13a (its default), char (for targets of one word, such as number
    # words, where word n-grams do not exist), intl, none.
    bleu_tokenize: str = "13a"
    # "stop": a NaN or infinite training loss stops the run with an error naming the step,
    # before the update, so the checkpoints on disk stay good; "skip": leave that batch out.
    on_nonfinite_loss: str = "stop"

    def __post_init__(self) -> None:
        checks.number("model.lr", self.lr, low=0, low_open=True)
        betas = self.betas
        if not (
            isinstance(betas, (list, tuple))
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
        ):
            raise ValueError(f"model.betas must be two numbers in [0, 1), got {list(betas)}")
        checks.number("model.weight_decay", self.weight_decay, low=0)
        checks.choice("model.schedule", self.schedule, SCHEDULES)
        checks.integer("model.warmup_steps", self.warmup_steps, minimum=0)
        checks.number("model.min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        checks.number("model.label_smoothing", self.label_smoothing, 0, 1, high_open=True)
        checks.integer("model.log_examples", self.log_examples, minimum=0)
        checks.choice("model.compile", self.compile, (True, False))
        if self.val_decode_limit is not None:
            checks.integer("model.val_decode_limit", self.val_decode_limit, minimum=1)
        checks.choice("model.bleu_tokenize", self.bleu_tokenize, BLEU_TOKENIZERS)
        checks.choice("model.on_nonfinite_loss", self.on_nonfinite_loss, NONFINITE_LOSS)


TRAINING_KEYS = tuple(field.name for field in fields(TrainingConfig))


def complete_hparams(net: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The module's hyperparameters as it saves them: net, then the given settings checked and
    the rest at their defaults (TrainingConfig's and DecodingConfig's fields, flat). An unknown
    name is refused."""
    if not isinstance(net, dict):
        raise ValueError(f"model.net must be a mapping of ModelConfig fields, got {net!r}")
    unknown = sorted(set(given) - {*TRAINING_KEYS, *DECODING_KEYS})
    if unknown:
        raise ValueError(
            f"model.{unknown[0]} is not a setting of the module; known: net, "
            f"{', '.join([*TRAINING_KEYS, *DECODING_KEYS])}"
        )
    training = TrainingConfig(**{k: v for k, v in given.items() if k in TRAINING_KEYS})
    decoding = DecodingConfig(**{k: v for k, v in given.items() if k in DECODING_KEYS})
    return {"net": net, **asdict(training), **decoding.to_dict()}


class Seq2SeqModule(L.LightningModule):
    """Trains a Seq2SeqTransformer with label-smoothed cross-entropy and AdamW.

    Args:
        net: ModelConfig fields except the vocabulary sizes and special ids, which come from
            the vocabularies.
        src_vocab, tgt_vocab: saved vocabularies (Vocabulary.to_dict()).
        **given: TrainingConfig's and DecodingConfig's fields, flat (lr=..., beam_size=...);
            the rest take their defaults. All are in self.hparams, which a checkpoint saves.
    """

    def __init__(
        self, net: dict[str, Any], src_vocab: dict[str, Any], tgt_vocab: dict[str, Any], **given
    ) -> None:
        super().__init__()
        vocabs = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab}
        self.save_hyperparameters({**complete_hparams(net, given), **vocabs})
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
        self.metrics = StageMetrics(self.src_vocab, self.tgt_vocab)  # see metrics.py
        self.doctor = Doctor()  # degenerate outputs at each validation, in the log and metrics
        self.run_state = RunState()  # the training clock and random states, across resumes
        self._compiled = False  # configure_model compiles once
        self._skipped = 0  # batches left out for a non-finite loss (on_nonfinite_loss=skip)
        self._val_decoded = 0  # examples decoded in this validation (val_decode_limit)
        self._signatures_logged = False

    def configure_model(self) -> None:
        # In place (nn.Module.compile), so parameter names and checkpoints do not change.
        if self.hparams.compile and not self._compiled:
            self.model.compile()
            self._compiled = True

    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_with_schedule(self.parameters(), self.hparams, self._trainer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.run_state.restore(checkpoint)

    def on_train_start(self) -> None:
        self.run_state.start()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.run_state.apply_rng()  # a resumed run's, where the saving run stood

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
        self.metrics.update("train", batch, loss, logits)
        self.log("train/loss_step", loss, prog_bar=True, batch_size=batch["src"].size(0))
        # Training time, for curves against time (seq2seq.curves); restored on resume.
        self.log(TIME, self.run_state.train_seconds())
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
        self.metrics.update(stage, batch, *self.model_step(batch))
        limit = self.hparams.val_decode_limit
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
        keep = len(self.trainer.test_dataloaders.dataset) if stage == "test" else None
        world, tokenize = self.trainer.world_size, self.hparams.bleu_tokenize
        values, rows = self.metrics.compute(stage, world, keep, tokenize)
        if stage == "val" and rows and not self.trainer.sanity_checking:
            values |= self._consult_doctor(rows, values)
        if stage == "test" and self.trainer.is_global_zero:
            write_test_texts(Path(self.trainer.default_root_dir), rows)
        self.log_dict(values, prog_bar=stage == "val")

    def _consult_doctor(self, rows: list[TextRow], values: dict[str, Any]) -> dict[str, float]:
        """The doctor's metrics of this validation; what looks wrong goes to the log."""
        hypotheses, references, _, ended = zip(*rows, strict=True)
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
        signature = signatures(self.hparams.bleu_tokenize)
        self.run_state.save(checkpoint, self.trainer.callback_metrics, signature)

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
