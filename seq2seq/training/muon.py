"""Muon (Jordan et al. 2024) with the matrices of one shape orthogonalised in one batched call.

The update is torch.optim.Muon's: Nesterov momentum (0.95), then the momentum's orthogonal
factor approximated by Newton-Schulz iterations, scaled to AdamW's size (Moonshot's
"match_rms_adamw", so lr and weight_decay keep their AdamW meaning), with decoupled weight
decay. What differs is the cost, and two choices torch fixes:

- torch's Muon runs the iterations one matrix at a time; here the matrices of one shape (a tall
  one transposed first, so a 1024x256 joins the 256x1024s) are stacked and go through
  baddbmm together.
- the precision: torch's always iterates in bf16, which a CPU without bf16 dot products
  (AVX-512 BF16, AMX) runs several times slower than fp32 (pytorch/pytorch#146508; measured in
  docs/performance.md). `precision="auto"` takes bf16 where the hardware has it, else fp32.
- the iterations: torch's fixed quintic (3.4445, -4.7750, 2.0315) `steps` times ("jordan"), or
  the Polar Express coefficients (Amsel et al. 2025), one triple per iteration, made for a
  Frobenius norm enlarged by 2% ("polar_express"; 3 or 4 steps take the first 3 or 4).

Why not torch's Muon with a flag: it has neither batching nor a precision nor per-iteration
coefficients (torch 2.13). The optimizer state is torch's (a "momentum_buffer" per matrix),
so a run saved with torch's Muon resumes here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from seq2seq.hparams import MUON_COEFFICIENTS, MUON_MAX_STEPS, MUON_PRECISIONS, POLAR_EXPRESS_STEPS

EPS = 1e-7  # torch.optim.Muon's floor under the norm

# (a, b, c) of X <- a X + b (X X^T) X + c (X X^T)^2 X. Jordan's: one triple for every step
# (torch.optim.Muon's defaults). Polar Express (arXiv 2505.16932, 5 iterations, safety 1.02):
# one triple per step, figures from the paper's published schedule.
JORDAN = (3.4445, -4.7750, 2.0315)
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 1.02  # the norm the coefficients were made for: ||X||_F * 1.02
assert len(POLAR_EXPRESS) == POLAR_EXPRESS_STEPS


def schedule(coefficients: str, steps: int) -> tuple[list[tuple[float, float, float]], float]:
    """The (a, b, c) of each iteration and the factor on the Frobenius norm X is divided by."""
    if coefficients == "polar_express":
        return list(POLAR_EXPRESS[:steps]), POLAR_EXPRESS_SAFETY
    return [JORDAN] * steps, 1.0


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bf16 matrix products run at least as fast as fp32 here: a GPU with bf16, or a
    CPU whose kernels torch runs at AVX-512 and that has AVX-512 BF16 or AMX dot products.
    torch has no public question for the latter (torch 2.13): torch.cpu's private checks are
    the ones its oneDNN dispatch reads. The capability also follows ATEN_CPU_CAPABILITY=avx2,
    with which an AVX-512 machine runs as an AVX2 one (bench/muon.py)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def dtype_for(precision: str, device: torch.device) -> torch.dtype:
    """The iterations' dtype: bf16, fp32, or (auto) bf16 where bf16_is_fast."""
    if precision == "auto":
        precision = "bf16" if bf16_is_fast(device) else "fp32"
    return torch.bfloat16 if precision == "bf16" else torch.float32


def orthogonalise(
    stacked: Tensor, coefficients: Sequence[tuple[float, float, float]], norm_factor: float,
    dtype: torch.dtype, eps: float = EPS,
) -> Tensor:  # fmt: skip
    """Newton-Schulz on a stack of wide (rows <= columns) matrices at once: each divided by
    its Frobenius norm (times norm_factor) so its singular values are at most 1, then one
    odd quintic per (a, b, c). Returns the stack in `dtype`."""
    x = stacked.to(dtype)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * norm_factor).clamp(min=eps)
    for a, b, c in coefficients:
        gram = x @ x.mT
        polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, polynomial, x, beta=a)
    return x


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters (see the module's docstring); settings per param group."""

    def __init__(
        self, params: Iterable[Tensor], lr: float, weight_decay: float,
        momentum: float = 0.95, steps: int = 5, coefficients: str = "jordan",
        precision: str = "auto",
    ) -> None:  # fmt: skip
        if precision not in MUON_PRECISIONS:
            raise ValueError(
                f"Muon's precision must be one of {MUON_PRECISIONS}, got {precision!r}"
            )
        if coefficients not in MUON_COEFFICIENTS:
            raise ValueError(
                f"Muon's coefficients must be one of {MUON_COEFFICIENTS}, got {coefficients!r}"
            )
        most = POLAR_EXPRESS_STEPS if coefficients == "polar_express" else MUON_MAX_STEPS
        if not 1 <= steps <= most:
            raise ValueError(f"Muon's steps with {coefficients} must be 1 to {most}, got {steps}")
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, steps=steps,
            coefficients=coefficients, precision=precision,
        )  # fmt: skip
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes matrices only; a parameter is {tuple(p.shape)}")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also a state saved by torch.optim.Muon (before this class): its groups read as
        torch's Muon computed, 5 iterations of Jordan's quintic in bf16."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("steps", group.get("ns_steps", 5))
            group.setdefault("coefficients", "jordan")
            group.setdefault("precision", "bf16")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        momentum = group["momentum"]
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        grads = [p.grad for p in params]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum)  # Nesterov's look-ahead
        coefficients, norm_factor = schedule(group["coefficients"], group["steps"])
        by_shape: dict[tuple[torch.device, int, int], list[int]] = {}
        for i, u in enumerate(updates):
            rows, cols = sorted(u.shape)  # tall ones transposed: the Gram is the smaller side
            by_shape.setdefault((u.device, rows, cols), []).append(i)
        lr, decay = group["lr"], group["weight_decay"]
        for (device, _, _), members in by_shape.items():
            wide = [updates[i] if updates[i].shape[0] <= updates[i].shape[1] else updates[i].mT
                    for i in members]  # fmt: skip
            dtype = dtype_for(group["precision"], device)
            done = orthogonalise(torch.stack(wide), coefficients, norm_factor, dtype)
            for i, o in zip(members, done, strict=True):
                p = params[i]
                o = o if p.shape[0] <= p.shape[1] else o.mT
                p.mul_(1 - lr * decay)
                p.add_(o, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))  # match_rms_adamw
