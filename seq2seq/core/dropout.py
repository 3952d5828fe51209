"""Dropout with a cheaper random mask on the CPU.

Why not ``nn.Dropout`` everywhere: on the CPU, torch draws dropout's mask with one Mersenne
Twister number per element (``aten::bernoulli_``), serially; in a training step of
experiment=parallel_bpe that was 16% of the step's time, more than the feed-forward layers'
matrix products. Here each element's keep/drop decision is 16 random bits, four of them cut
from one 64-bit draw of the same generator: a quarter of the draws, the same semantics.

- Each element is zeroed with probability round(p * 65536) / 65536 (p = 0.1: 0.100006),
  independently; the rest are scaled by 1 / (1 - p), as ``nn.Dropout`` does.
- The bits come from torch's default generator, so ``torch.manual_seed`` (and a checkpoint's
  saved random state) makes the masks repeat exactly; they are not the masks ``nn.Dropout``
  would draw under the same seed.
- On other devices (CUDA draws counter-based numbers inside its dropout kernel, which is
  already cheap) and outside training, this is ``torch.nn.functional.dropout``.

Measured by bench/mfu.py (docs/performance.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq import checks

__all__ = ["Dropout", "dropout"]

_BITS = 16  # random bits that decide one element: p is rounded to a multiple of 2**-16
_LANES = 64 // _BITS  # elements decided by one 64-bit draw


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    return x * keep_scale(x, p)


def keep_scale(x: Tensor, p: float) -> Tensor:
    """A tensor of x's shape and dtype: 1 / (1 - p) where x is kept, 0 where dropped."""
    words = torch.empty(-(-x.numel() // _LANES), dtype=torch.int64, device=x.device)
    words.random_(-(2**63), None)  # all 64 bits (random_() alone leaves the sign bit 0)
    draws = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over -2**15..2**15-1
    keep = draws >= round(p * 2**_BITS) - 2 ** (_BITS - 1)
    return torch.where(keep, 1.0 / (1.0 - p), 0.0).to(x.dtype)


class Dropout(nn.Module):
    """``nn.Dropout``'s interface (``p``, no parameters, off in eval mode) over ``dropout``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = checks.number("dropout", p, low=0, high=1)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
