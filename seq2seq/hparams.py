"""The module's hyperparameters, apart from Lightning: TrainingConfig (the training settings'
defaults and checks), complete_hparams (what a checkpoint saves, in three groups: net,
training, decoding), grouped (the same from the flat settings of files written before the
groups), and the network and tokenizers a checkpoint's hyperparameters describe. The
LightningModule (module.py) and the Lightning-free checkpoint reader (checkpoint.TrainedModel,
which the tools use) both build from here, so a checkpoint means the same to both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from seq2seq import checks
from seq2seq.core.decoding import DECODING_KEYS, DecodingConfig
from seq2seq.core.model import ModelConfig, Seq2SeqTransformer
from seq2seq.score import BLEU_TOKENIZERS

SCHEDULES = ("inverse_sqrt", "cosine", "wsd", "constant")
OPTIMIZERS = ("adamw", "muon")
MUON_COEFFICIENTS = ("jordan", "polar_express")
MUON_PRECISIONS = ("auto", "bf16", "fp32")
MUON_MAX_STEPS = 10  # each iteration costs a share of every step: a bound on what may be asked
POLAR_EXPRESS_STEPS = 5  # the iterations its published schedule has

NONFINITE_LOSS = ("stop", "skip")


@dataclass(frozen=True)
class TrainingConfig:
    """The module's hyperparameters besides the model (ModelConfig) and decoding
    (DecodingConfig): each field's default, meaning and check, in one place.

    They reach the module as one group (model.training.lr, ... in configs/model/*.yaml) and are
    saved so in checkpoints as Lightning's hyperparameters; complete_hparams() checks them and
    fills in defaults. A new hyperparameter is a field here (checked in __post_init__) and the same
    default in configs/model/shared/module.yaml (tests/test_architecture.py compares them).
    """

    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW's
    weight_decay: float = 0.01  # on matrices only (not biases or norm gains)
    # adamw: AdamW on every parameter. muon: torch.optim.Muon (momentum 0.95, its update scaled
    # to AdamW's size, so lr and weight_decay keep their meaning) on the encoder's and
    # decoder's weight matrices, AdamW on the embeddings, output projection, biases and norms.
    optimizer: str = "adamw"
    # optimizer=muon: its Newton-Schulz iterations (each costs about a fifth of the five's time),
    # their coefficients (jordan: torch's quintic each step; polar_express: Amsel et al.'s
    # schedule, at most 5), and their precision (auto: bf16 where the hardware multiplies bf16
    # fast, AVX-512 BF16, AMX or a GPU; fp32 elsewhere, where bf16 is several times slower).
    muon_steps: int = 5
    muon_coefficients: str = "jordan"
    muon_precision: str = "auto"
    schedule: str = "inverse_sqrt"  # inverse_sqrt, cosine, wsd or constant, after the warmup
    warmup_steps: int = 100  # of linear warmup
    # With a time budget (trainer.max_time), the warmup also ends once training has taken this
    # share of the budget's training time, if that comes before warmup_steps: the warmup then
    # scales with the steps the budget buys on this machine and corpus. None: steps alone.
    warmup_share: float | None = None
    min_lr_ratio: float = 0.0  # the cosine and wsd schedules end at lr * min_lr_ratio
    # schedule=wsd (warmup, stable, decay): after the warmup the rate stays at its peak, then
    # falls in a straight line to lr * min_lr_ratio over this last share of the training after
    # the warmup (of its time with a budget, as the cosine's progress; of its steps without).
    cooldown_share: float | None = None
    # With a time budget: once the first validation has measured the pace, dropout
    # (model.net.dropout) is turned off for the rest of the run if the budget buys fewer than
    # this many epochs, where a model underfits rather than overfits. None: dropout throughout.
    dropout_min_epochs: float | None = None
    # Late dropout (Liu et al. 2023, "Dropout Reduces Underfitting"): dropout (model.net.dropout)
    # is off until the run has trained this many epochs, then on to the end: decided by the data
    # seen, never by the clock, so a slow start cannot change it. None: dropout from the start.
    dropout_from_epoch: float | None = None
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
        checks.number("model.training.lr", self.lr, low=0, low_open=True)
        checks.choice("model.training.optimizer", self.optimizer, OPTIMIZERS)
        checks.choice("model.training.muon_coefficients", self.muon_coefficients, MUON_COEFFICIENTS)
        checks.choice("model.training.muon_precision", self.muon_precision, MUON_PRECISIONS)
        checks.integer("model.training.muon_steps", self.muon_steps, minimum=1)
        most = POLAR_EXPRESS_STEPS if self.muon_coefficients == "polar_express" else MUON_MAX_STEPS
        if self.muon_steps > most:
            raise ValueError(
                f"model.training.muon_steps={self.muon_steps} is more than the {most} "
                f"muon_coefficients={self.muon_coefficients} allows; give 1 to {most}"
            )
        betas = self.betas
        if not (
            isinstance(betas, (list, tuple))
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
        ):
            raise ValueError(
                f"model.training.betas must be two numbers in [0, 1), got {list(betas)}"
            )
        checks.number("model.training.weight_decay", self.weight_decay, low=0)
        checks.choice("model.training.schedule", self.schedule, SCHEDULES)
        checks.integer("model.training.warmup_steps", self.warmup_steps, minimum=0)
        if self.warmup_share is not None:
            checks.number("model.training.warmup_share", self.warmup_share, 0, 1, True, True)
            if self.schedule not in ("cosine", "wsd"):
                raise ValueError(
                    f"model.training.warmup_share={self.warmup_share} needs "
                    f"model.training.schedule=cosine or wsd (the {self.schedule} schedule "
                    "follows the warmup's step count); set model.training.schedule=cosine or "
                    "model.training.warmup_share=null"
                )
        if self.schedule == "wsd" or self.cooldown_share is not None:
            if self.schedule != "wsd":
                raise ValueError(
                    f"model.training.cooldown_share={self.cooldown_share} is the decay of "
                    f"schedule=wsd, not of {self.schedule}: set model.training.schedule=wsd or "
                    "model.training.cooldown_share=null"
                )
            if self.cooldown_share is None:
                raise ValueError(
                    "model.training.schedule=wsd needs model.training.cooldown_share, the last "
                    "share of training its decay takes: e.g. model.training.cooldown_share=0.2"
                )
            checks.number("model.training.cooldown_share", self.cooldown_share, 0, 1, True)
        checks.number("model.training.min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        if self.dropout_min_epochs is not None:
            checks.number(
                "model.training.dropout_min_epochs", self.dropout_min_epochs, low=0, low_open=True
            )
        if self.dropout_from_epoch is not None:
            checks.number(
                "model.training.dropout_from_epoch", self.dropout_from_epoch, low=0, low_open=True
            )
            if self.dropout_min_epochs is not None:
                raise ValueError(
                    f"model.training.dropout_from_epoch={self.dropout_from_epoch:g} and "
                    f"dropout_min_epochs={self.dropout_min_epochs:g} both decide dropout: set one "
                    "of them to null"
                )
        checks.number("model.training.label_smoothing", self.label_smoothing, 0, 1, high_open=True)
        checks.integer("model.training.log_examples", self.log_examples, minimum=0)
        checks.choice("model.training.compile", self.compile, (True, False))
        if self.val_decode_limit is not None:
            checks.integer("model.training.val_decode_limit", self.val_decode_limit, minimum=1)
        checks.choice("model.training.bleu_tokenize", self.bleu_tokenize, BLEU_TOKENIZERS)
        checks.choice("model.training.on_nonfinite_loss", self.on_nonfinite_loss, NONFINITE_LOSS)


TRAINING_KEYS = tuple(field.name for field in fields(TrainingConfig))

# The module's settings besides the network, by group: model.training.NAME, model.decoding.NAME.
GROUPS = {"training": TRAINING_KEYS, "decoding": DECODING_KEYS}

# model.net.NAME: ModelConfig's fields but those the tokenizers set (sizes and special ids).
NET_KEYS = tuple(
    field.name
    for field in fields(ModelConfig)
    if field.name not in ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id")
)

# Where each setting of the flat layout before the groups (model.lr, model.beam_size; checkpoint
# formats 0 and 1) is now.
MOVED_SETTINGS = {key: f"{group}.{key}" for group, keys in GROUPS.items() for key in keys}


def complete_hparams(net: Any, training: Any = None, decoding: Any = None) -> dict[str, Any]:
    """The module's hyperparameters as it saves them: net, and the training and decoding
    groups checked with the rest at their defaults (TrainingConfig's, DecodingConfig's
    fields). An unknown name is refused in one line."""
    given = {"net": net, "training": training or {}, "decoding": decoding or {}}
    for group, value in given.items():
        if not isinstance(value, Mapping):
            raise ValueError(f"model.{group} must be a mapping of settings, got {value!r}")
    for group, keys in {"net": NET_KEYS, **GROUPS}.items():
        unknown = sorted(set(given[group]) - set(keys))
        if unknown:
            moved = next((MOVED_SETTINGS[k] for k in unknown if k in MOVED_SETTINGS), None)
            hint = f"it is model.{moved}" if moved else checks.nearest(unknown[0], keys)
            raise ValueError(f"model.{group}.{unknown[0]} is not a {group} setting; {hint}")
    return {
        "net": dict(net),
        "training": asdict(TrainingConfig(**given["training"])),
        "decoding": DecodingConfig(**given["decoding"]).to_dict(),
    }


def check_groups(settings: Mapping[str, Any]) -> None:
    """The model config's keys are its groups: a setting of the flat layout before them
    (model.lr) or an unknown key is refused in one line."""
    for key in settings:
        if key in MOVED_SETTINGS:
            new = MOVED_SETTINGS[key]
            raise ValueError(
                f"model.{key} is now model.{new}: write model.{new}=... (in a YAML file, "
                f"{key} goes under {new.split('.')[0]}:)"
            )
        if key not in ("net", *GROUPS):
            raise ValueError(
                f"model.{key} is not a setting of the module; its groups are net, "
                f"{', '.join(GROUPS)}"
            )


def grouped(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The module's settings in groups (net, training, decoding, and any others as given):
    the flat layout before the groups (lr=..., beam_size=... beside net; checkpoint formats 0
    and 1, and run configs saved then) moved into theirs (other keys are kept as they are). A
    setting given both ways is refused in one line."""
    out = {key: value for key, value in settings.items() if key not in MOVED_SETTINGS}
    for key, value in settings.items():
        if key in MOVED_SETTINGS:
            group = MOVED_SETTINGS[key].split(".")[0]
            section = out.setdefault(group, {})
            if not isinstance(section, Mapping) or key in section:
                new = MOVED_SETTINGS[key]
                raise ValueError(
                    f"model.{key} is set both flat and as model.{new}: keep model.{new}"
                )
            out[group] = {**section, key: value}
    return out


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
