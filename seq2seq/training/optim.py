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

log = logging.getLogger(__name__)


def lr_lambda(
    schedule: str,
    warmup_steps: int,
    total_steps: Callable[[], float],
    min_lr_ratio: float,
    time_progress: Callable[[int], float | None] | None = None,
    warmup: Callable[[int], tuple[bool, float | None]] | None = None,
    cooldown_share: float | None = None,
) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based).

    Linear warmup over warmup_steps, then inverse square root (Vaswani et al.), cosine down to
    min_lr_ratio at the end of training, wsd (the peak until the last cooldown_share of the
    training after the warmup, then a straight line down to min_lr_ratio: warmup-stable-decay,
    as language-model speed records use it), or constant. The end is total_steps() (asked only
    when the cosine or wsd needs it, after the warmup; inf without a step limit) or, with a
    time budget, when time_progress(step), the decay's progress by the clock, reaches 1
    (callbacks.TimeBudget.decay_progress), whichever comes first. With a warmup by the clock
    (model.training.warmup_share), warmup(step) says whether step is still warming up and how
    far by the clock (TimeBudget.warming_up and warmup_progress): the warmup then ends at
    warmup_steps or at that share of the budget, whichever comes first, and rises by whichever
    is further.
    """

    @functools.cache
    def total() -> float:
        return total_steps()

    def factor(step: int) -> float:
        warming, by_clock = warmup(step) if warmup is not None else (step < warmup_steps, None)
        if warming:
            return max((step + 1) / warmup_steps, by_clock or 0.0)
        if schedule == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        if schedule in ("cosine", "wsd"):
            done = step - warmup_steps
            progress = 0.0 if done <= 0 else min(1.0, done / max(1, total() - warmup_steps))
            by_time = time_progress(step) if time_progress is not None else None
            if by_time is not None:
                progress = max(progress, by_time)
            if schedule == "wsd":
                assert cooldown_share is not None  # TrainingConfig requires it for wsd
                return min_lr_ratio + (1 - min_lr_ratio) * min(1.0, (1 - progress) / cooldown_share)
            return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor


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
        optimizer: torch.optim.Optimizer = MuonWithAdamW(
            torch.optim.Muon(
                hidden, lr=hp.lr, weight_decay=hp.weight_decay, adjust_lr_fn="match_rms_adamw"
            ),
            adamw(rest, hp, fused),
        )
        log.info(
            "Muon: %d matrices (%d parameters); AdamW: %d tensors (%d parameters)",
            len(hidden), sum(p.numel() for p in hidden),
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
    progress = warmup = None
    steps, share = hp.warmup_steps, hp.warmup_share
    if budget is not None:
        progress = functools.partial(budget.decay_progress, warmup_steps=steps, warmup_share=share)
        if share is not None:

            def warmup(step: int) -> tuple[bool, float | None]:
                return budget.warming_up(step, steps, share), budget.warmup_progress(share)

    factor = lr_lambda(
        hp.schedule, steps, total, hp.min_lr_ratio, progress, warmup, hp.cooldown_share
    )
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

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
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
