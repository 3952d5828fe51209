"""What Muon's step costs: the optimizer step alone and the whole training step, for the recipe
(fused AdamW) and for the round-two pair (QK-norm, peak rate 3e-3, Muon) with torch's Muon and
with ours at each precision, iteration count and coefficient schedule, side by side.

    python bench/muon.py                        # docs/performance.md's table
    python bench/muon.py --rounds 2 --steps 3   # a quick look
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        python bench/muon.py   # as an AVX2 CPU (docs/performance.md)

The model is experiment=parallel_bpe's (configs/model/small.yaml, 8,000 shared tokens), the
batches random tokens of Tatoeba's shape (--batch 128 pairs of --length 10, about the recipe's
1,280 tokens). A whole step is the module's model_step, backward, clipping at 1.0 and the
optimizer's step, in a plain loop (bench/mfu.py's "bare" step); the optimizer step alone is
timed on the same gradients. Rows take turns in every round, so a drift of the machine's speed
falls on all alike; the figures are medians and the ratios are to the recipe's whole step.
With the three variables above, oneDNN, MKL and torch's own kernels run at AVX2 on an AVX-512
machine: a stand-in for an AVX2 CPU, where bf16 matrix products have no hardware of their own.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import environment, print_table  # noqa: E402
from mfu import batches_for, module_for  # noqa: E402

from seq2seq.training.muon import dtype_for  # noqa: E402
from seq2seq.training.optim import MuonWithAdamW, adamw, is_hidden_matrix  # noqa: E402

QK_NORM = ["model.net.qk_norm=true", "model.training.lr=3e-3"]
PAIR = [*QK_NORM, "model.training.optimizer=muon"]
TORCH_MUON = "torch.optim.Muon"  # the pair's row that steps torch's Muon in place of ours


def variants(quick: bool) -> dict[str, list[str]]:
    """Row name -> its overrides of experiment=parallel_bpe (the recipe: none)."""
    rows = {
        "recipe: fused AdamW": [],
        "QK-norm, 3e-3, fused AdamW": QK_NORM,  # the pair without Muon: what QK-norm costs
        "pair: torch's Muon": [*PAIR, TORCH_MUON],
    }
    for precision in ("bf16", "fp32"):
        for coefficients, steps in [("jordan", 5), ("jordan", 4), ("jordan", 3),
                                    ("polar_express", 5), ("polar_express", 3)]:  # fmt: skip
            if quick and steps == 4:
                continue
            rows[f"pair: ours, {precision}, {coefficients} x{steps}"] = [
                *PAIR,
                f"model.training.muon_precision={precision}",
                f"model.training.muon_coefficients={coefficients}",
                f"model.training.muon_steps={steps}",
            ]
    return rows


def build(overrides: list[str]):
    """The module and its optimizer: as configured, or with torch's Muon in place of ours."""
    module = module_for("small", [o for o in overrides if o != TORCH_MUON])
    if TORCH_MUON in overrides:  # the rest (AdamW's share) as ours
        hp = module.settings
        named = list(module.named_parameters())
        hidden = [p for name, p in named if is_hidden_matrix(name, p)]
        rest = [p for name, p in named if not is_hidden_matrix(name, p)]
        muon = torch.optim.Muon(
            hidden, lr=hp.lr, weight_decay=hp.weight_decay, adjust_lr_fn="match_rms_adamw"
        )
        return module, MuonWithAdamW(muon, adamw(rest, hp, fused=True))  # type: ignore[arg-type]
    return module, module.configure_optimizers()["optimizer"]


def whole_step(module, optimizer, batch: dict) -> None:
    loss, _ = module.model_step(batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    optimizer.step()


def timed(fn, count: int) -> list[float]:
    """Seconds of each of count calls of fn."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="whole steps a row, each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="leave out the 4-iteration rows")
    args = parser.parse_args()

    import logging

    logging.getLogger("seq2seq").setLevel(logging.WARNING)
    print(environment(), "| kernels:", torch.backends.cpu.get_cpu_capability(),
          "| auto precision:", dtype_for("auto", torch.device("cpu")))  # fmt: skip
    rows = variants(args.quick)
    built = {name: build(overrides) for name, overrides in rows.items()}
    batches = batches_for(next(iter(built.values()))[0], args.steps, args.batch, args.length)
    whole: dict[str, list[float]] = {name: [] for name in rows}
    alone: dict[str, list[float]] = {name: [] for name in rows}
    for module, optimizer in built.values():  # warm-up: first steps allocate
        module.train()
        whole_step(module, optimizer, batches[0])
    for _ in range(args.rounds):
        for name, (module, optimizer) in built.items():
            for batch in batches:
                step = functools.partial(whole_step, module, optimizer, batch)
                whole[name] += timed(step, 1)
            alone[name] += timed(optimizer.step, args.steps)
    base = statistics.median(whole["recipe: fused AdamW"])
    table = []
    for name in rows:
        step, opt = statistics.median(whole[name]), statistics.median(alone[name])
        table.append([name, f"{opt * 1000:.1f}", f"{step * 1000:.0f}", f"{step / base:.3f}"])
    print_table(["row", "optimizer step (ms)", "whole step (ms)", "whole / recipe's"], table)


if __name__ == "__main__":
    main()
