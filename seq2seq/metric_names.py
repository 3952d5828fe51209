"""The names of what a run logs, defined once: the module and its metrics log them, the
checkpoint callbacks rank by them (callbacks.model_checkpoint.monitor), train.py returns the
test value of the ranked one to a sweeper, and the curves and reports read them.

A stage's metrics are "<stage>/<name>" (val/chrf, test/bleu). A new metric is logged under
one of these names, or a new name here.
"""

from __future__ import annotations

STAGES = ("train", "val", "test")

# Each stage's, from the loss and the logits (train: also the share of padded positions).
LOSS = "loss"
TOKEN_ACC = "token_acc"
PADDING = "padding"  # train only
# Validation's and the test's, from the decoded outputs (validation: greedy; test: its beam).
EXACT_MATCH = "exact_match"
CER = "cer"
BLEU = "bleu"  # sacreBLEU's (seq2seq.score), with its signature in the checkpoint
CHRF = "chrf"

TRAIN_LOSS_STEP = "train/loss_step"  # each step's loss (the epoch's mean is train/loss)
TIME = "time/train_s"  # training time at each logged step, restored on a resume
DROPOUT = "train/dropout"  # the rate at each step, where dropout_from_epoch turns it on
LR = "lr-AdamW/pg1"  # Lightning's LearningRateMonitor: the matrices' group (weight decay)


def learning_rate(keys) -> str:
    """The first parameter group's logged rate among these metric names: LearningRateMonitor
    names it after the optimizer's class (LR for AdamW, lr-MuonWithAdamW/pg1 for Muon)."""
    return next((k for k in keys if k.startswith("lr-") and k.endswith("/pg1")), LR)


# What ranks checkpoints unless a config says otherwise (real text: val/chrf).
DEFAULT_MONITOR = "val/exact_match"


def metric(stage: str, name: str) -> str:
    """The logged name of a stage's metric: metric("val", CHRF) == "val/chrf"."""
    return f"{stage}/{name}"


def logged(stage: str) -> tuple[str, ...]:
    """Every metric name a stage logs from StageMetrics (the doctor adds its own to val)."""
    names = (LOSS, TOKEN_ACC, PADDING) if stage == "train" else (LOSS, TOKEN_ACC, EXACT_MATCH)
    decoded = () if stage == "train" else (CER, BLEU, CHRF)
    return tuple(metric(stage, name) for name in (*names, *decoded))


def on_test(monitored: str) -> str:
    """The test split's name of a validation metric: val/chrf -> test/chrf."""
    stage, _, name = monitored.partition("/")
    return metric("test", name) if stage == "val" else monitored
