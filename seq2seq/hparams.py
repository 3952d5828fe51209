"""The module's hyperparameters, apart from Lightning: TrainingConfig (the training settings'
defaults and checks), complete_hparams (what a checkpoint saves), and the network and
tokenizers a checkpoint's hyperparameters describe. The LightningModule (module.py) and the
Lightning-free checkpoint reader (checkpoint.TrainedModel, which the tools use) both build from
here, so a checkpoint means the same to both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from seq2seq import checks
from seq2seq.core.decoding import DECODING_KEYS, DecodingConfig
from seq2seq.core.model import ModelConfig, Seq2SeqTransformer
from seq2seq.score import BLEU_TOKENIZERS

SCHEDULES = ("inverse_sqrt", "cosine", "constant")

NONFINITE_LOSS = ("stop", "skip")


@dataclass(frozen=True)
class TrainingConfig:
    """The module's hyperparameters besides the model (ModelConfig) and decoding
    (DecodingConfig): each field's default, meaning and check, in one place.

    They reach the module flat (model.lr, ... in configs/model/*.yaml) and are saved flat in
    checkpoints as Lightning's hyperparameters; complete_hparams() checks them and fills in
    defaults. A new hyperparameter is a field here (checked in __post_init__) and the same
    default in configs/model/shared/module.yaml (tests/test_architecture.py compares them).
    """

    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW's
    weight_decay: float = 0.01  # AdamW's, on matrices only (not biases or norm gains)
    schedule: str = "inverse_sqrt"  # inverse_sqrt, cosine or constant, after the warmup
    warmup_steps: int = 100  # of linear warmup
    # With a time budget (trainer.max_time), the warmup also ends once training has taken this
    # share of the budget's training time, if that comes before warmup_steps: the warmup then
    # scales with the steps the budget buys on this machine and corpus. None: steps alone.
    warmup_share: float | None = None
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
        if self.warmup_share is not None:
            checks.number("model.warmup_share", self.warmup_share, 0, 1, True, True)
            if self.schedule != "cosine":
                raise ValueError(
                    f"model.warmup_share={self.warmup_share} needs model.schedule=cosine (the "
                    f"{self.schedule} schedule follows the warmup's step count); set "
                    "model.schedule=cosine or model.warmup_share=null"
                )
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


def build_network(hparams: Mapping[str, Any]) -> tuple[Any, Any, Seq2SeqTransformer]:
    """(source tokenizer, target tokenizer, a new network) from hyperparameters as a checkpoint
    saves them: net's ModelConfig fields, with the sizes and special ids from the tokenizers."""
    from seq2seq.data.tokenizer import tokenizer_from_dict

    src_vocab = tokenizer_from_dict(hparams["src_vocab"])
    tgt_vocab = tokenizer_from_dict(hparams["tgt_vocab"])
    config = ModelConfig(
        src_vocab_size=len(src_vocab),
        tgt_vocab_size=len(tgt_vocab),
        pad_id=tgt_vocab.pad_id,
        bos_id=tgt_vocab.bos_id,
        eos_id=tgt_vocab.eos_id,
        **hparams["net"],
    )
    return src_vocab, tgt_vocab, Seq2SeqTransformer(config)
