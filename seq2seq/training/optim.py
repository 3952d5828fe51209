"""The optimizer and the learning-rate schedule: AdamW with weight decay on matrices only (or
Muon on the layers' weight matrices with AdamW on the rest), and a linear warmup followed by
inverse square root, cosine or warmup-stable-decay (to a step count or a time budget's
deadline) or a constant rate.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from seq2seq.hparams import TrainingConfig
from seq2seq.training.callbacks import TimeBudget
from seq2seq.training.clock import Progress
from seq2seq.training.muon import Muon, dtype_for

log = logging.getLogger(__name__)


def lr_lambda(
    schedule: str, warmup_steps: int, min_lr_ratio: float, progress: Progress,
    cooldown_share: float | None = None,
) -> Callable[[int], float]:  # fmt: skip
    """Multiplier of the peak learning rate at optimizer step `step` (0-based), from the
    schedule's progress there (by_steps, or TimeBudget.schedule with a time budget): the warmup
    rises to the peak, then inverse square root (Vaswani et al.), cosine down to min_lr_ratio,
    wsd (the peak until the last cooldown_share of the decay, then a straight line down to
    min_lr_ratio: warmup-stable-decay, as language-model speed records use it), or constant."""

    def factor(step: int) -> float:
        warming, done = progress(step)
        if warming:
            return done
        if schedule == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        if schedule == "cosine":
            return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))
        if schedule == "wsd":
            assert cooldown_share is not None  # TrainingConfig requires it for wsd
            return min_lr_ratio + (1 - min_lr_ratio) * min(1.0, (1 - done) / cooldown_share)
        return 1.0

    return factor


def by_steps(warmup_steps: int, total_steps: Callable[[], float], decays: bool) -> Progress:
    """A schedule's progress by steps: the warmup linear over warmup_steps, then (for a schedule
    that `decays` to an end, cosine and wsd) the steps since over those to total_steps(),
    asked once, after the warmup (a resume restores the loader before; inf: no step limit)."""
    total = functools.cache(total_steps)

    def progress(step: int) -> tuple[bool, float]:
        if step < warmup_steps:
            return True, (step + 1) / warmup_steps
        done = step - warmup_steps
        if not decays or done <= 0:
            return False, 0.0
        return False, min(1.0, done / max(1, total() - warmup_steps))

    return progress


def optimizer_with_schedule(
    named_parameters: Iterable[tuple[str, Tensor]], hp: TrainingConfig, trainer: Any | None
) -> dict[str, Any]:
    """Lightning's configure_optimizers answer: the optimizer and its per-step LambdaLR schedule.

    named_parameters: the module's (names decide Muon's share). hp: the module's training
    settings (optimizer, lr, betas, weight_decay, schedule, warmup_steps, warmup_share,
    min_lr_ratio). trainer: the run's (its step count, a TimeBudget's clock, the precision);
    None for a module used alone.
    """
    named = list(named_parameters)
    parameters = [p for _, p in named]
    # One fused kernel for all tensors instead of a loop over them: optimizer steps 4-7x faster
    # on a CPU, where torch's default is the plain loop. Not under mixed precision: Lightning's
    # AMP plugin refuses to clip the gradients of an optimizer that unscales them itself, as
    # the fused one does.
    mixed = trainer is not None and "mixed" in str(trainer.precision)
    fused = not mixed and fused_adamw_supported(parameters)
    if hp.optimizer == "muon":
        hidden = [p for name, p in named if is_hidden_matrix(name, p)]
        rest = [p for name, p in named if not is_hidden_matrix(name, p)]
        muon = Muon(
            hidden, lr=hp.lr, weight_decay=hp.weight_decay, steps=hp.muon_steps,
            coefficients=hp.muon_coefficients, precision=hp.muon_precision,
        )  # fmt: skip
        optimizer: torch.optim.Optimizer = MuonWithAdamW(muon, adamw(rest, hp, fused))
        log.info(
            "Muon: %d matrices (%d parameters), %d %s iterations in %s; AdamW: %d tensors (%d "
            "parameters)", len(hidden), sum(p.numel() for p in hidden), hp.muon_steps,
            hp.muon_coefficients, dtype_for(hp.muon_precision, hidden[0].device) if hidden else "-",
            len(rest), sum(p.numel() for p in rest),
        )  # fmt: skip
    else:
        optimizer = adamw(parameters, hp, fused)

    # Not estimated_stepping_batches right away: asking for it while Lightning configures the
    # optimizer loads the train loader before a checkpoint's loader state is restored, and a
    # mid-epoch resume would then start a fresh shuffle. Asked lazily, after the restore.
    def total() -> float:
        return float(trainer.estimated_stepping_batches) if trainer else math.inf

    callbacks = trainer.callbacks if trainer is not None else []
    budget = next((c for c in callbacks if isinstance(c, TimeBudget)), None)
    progress = by_steps(hp.warmup_steps, total, hp.schedule in ("cosine", "wsd"))
    if budget is not None:
        progress = budget.schedule(progress, hp.warmup_steps, hp.warmup_share)
    factor = lr_lambda(hp.schedule, hp.warmup_steps, hp.min_lr_ratio, progress, hp.cooldown_share)
    # interval "step": stepped once per optimizer step, so right under gradient accumulation.
    scheduler = {"scheduler": LambdaLR(optimizer, factor), "interval": "step"}
    return {"optimizer": optimizer, "lr_scheduler": scheduler}


def adamw(parameters: list[Tensor], hp: TrainingConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW with hp's rate and betas, weight decay on matrices (weights of linear maps and
    embeddings) and not on biases or norm gains."""
    decay = [p for p in parameters if p.dim() >= 2]
    no_decay = [p for p in parameters if p.dim() < 2]
    log.info(
        "AdamW: %d tensors (%d parameters) with weight decay, %d (%d) without",
        len(decay), sum(p.numel() for p in decay),
        len(no_decay), sum(p.numel() for p in no_decay),
    )  # fmt: skip
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": hp.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=hp.lr,
        betas=tuple(hp.betas),
        fused=fused,
    )


def is_hidden_matrix(name: str, parameter: Tensor) -> bool:
    """Whether Muon trains this parameter: a weight matrix of an encoder or decoder layer
    (attention projections, feed-forward), not an embedding, the output projection, a bias or
    a norm's gain, which have no matrix geometry for Muon to orthogonalise."""
    return parameter.dim() == 2 and ".layers." in f".{name}"


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped as one optimizer, as Lightning's automatic optimization needs.

    Its param_groups are the two optimizers' own (Muon's first), so a scheduler and gradient
    clipping see and set every group; its state_dict holds both optimizers' states.
    Why not two optimizers: Lightning steps two only under manual optimization, which would
    take gradient accumulation, clipping and precision out of its hands.
    """

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        super().__init__(
            [p for g in muon.param_groups + adamw.param_groups for p in g["params"]], {}
        )
        self.param_groups = [*muon.param_groups, *adamw.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(
                f"the optimizer state holds {sorted(state_dict)}, not Muon's and AdamW's: it "
                "was saved with model.training.optimizer=adamw; resume with that setting"
            )
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = [*self.muon.param_groups, *self.adamw.param_groups]


def fused_adamw_supported(params: list[Tensor]) -> bool:
    """Whether torch's fused AdamW takes these tensors (CPU and CUDA, floating point)."""
    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
