"""How close a training step comes to this machine's matrix-multiply peak, measured in one
process: the model FLOP utilisation (MFU) of our training, bare and inside Lightning's fit.

    python bench/mfu.py                               # tiny and small, short and real lengths
    python bench/mfu.py --sizes small --lengths 15 --steps 3
    python bench/mfu.py --options --sizes small --lengths 15   # each model option's step cost

- The peak: fp32 matrix products of --peak-size (2048) squared, 2 n^3 FLOPs each, on torch's
  threads as training uses them; the fastest of 20, measured before the steps and again after
  them (the machine's speed drifts: both are printed, and the faster is the peak).
- A step's FLOPs: counted by torch (torch.utils.flop_counter.FlopCounterMode) over one training
  step, forward and backward, not estimated by hand. The optimizer's elementwise work is not
  counted (FlopCounterMode counts matrix products and attention), as MFU usually is not.
- Bare: the module's own step (model_step: forward and the label-smoothed loss), backward,
  gradient clipping and the fused AdamW of its configure_optimizers, in a plain loop.
- Fit: the same module and batches in Lightning's fit loop as `python train.py` runs it
  (metrics, the learning-rate schedule, the learning-rate monitor and CSV logging every step
  as configured), timed from one batch's start to the next one's.

Sizes: `tiny` is configs/model/tiny.yaml on the copy task's 14 symbols; `small` is
experiment=parallel_bpe's model (configs/model/small.yaml, shared and tied embeddings) on an
8,000-token vocabulary. Batches hold --batch pairs of random tokens with source and target of
the given length and no padding: lengths 7 (Tatoeba's sentences, 6.3 BPE tokens) and 15
(longer real text). Seconds and GFLOP/s are medians; compare the ratios, which one run takes
side by side, rather than single figures across runs.

--options: the bare step of each model option of OPTIONS (docs/model.md) against the model as
configured, in rounds that take every option in turn (so a drift of the machine's speed falls on
all alike); it prints parameters, FLOPs and the median step, and each as a ratio to the first.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import MODEL_OPTIONS, environment, print_table, sync  # noqa: E402

from seq2seq.training.memory import keep_freed_memory  # noqa: E402

SIZES = {"tiny": (["experiment=copy"], 14), "small": (["experiment=parallel_bpe"], 8000)}
OPTIONS = {"as configured": [], **MODEL_OPTIONS}


def matmul_peak(n: int, repeats: int = 20) -> float:
    """GFLOP/s of an n x n by n x n fp32 product: the fastest of repeats after a warm-up (a
    shared machine only ever slows a product down)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def module_for(size: str, extra: list[str] | None = None):
    """The size's Seq2SeqModule as train.py would build it (its composed model config, with
    extra overrides) over a vocabulary of the size's width."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from seq2seq.data.vocab import Vocabulary

    overrides, vocab_size = SIZES[size]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, *(extra or [])])
    vocab = Vocabulary(str(i) for i in range(vocab_size - 4)).to_dict()  # + 4 specials
    torch.manual_seed(0)
    return instantiate(cfg.model, src_vocab=vocab, tgt_vocab=vocab)


def batches_for(module, count: int, batch: int, length: int) -> list[dict]:
    """Random full-length pairs: <bos> + target in, target + <eos> out, no padding."""
    generator = torch.Generator().manual_seed(0)
    size, config = len(module.tgt_vocab), module.config
    out = []
    for _ in range(count):
        src = torch.randint(4, size, (batch, length), generator=generator)
        tgt = torch.randint(4, size, (batch, length), generator=generator)
        bos = torch.full((batch, 1), config.bos_id)
        eos = torch.full((batch, 1), config.eos_id)
        out.append({"src": src, "tgt_in": torch.cat([bos, tgt], 1),
                    "labels": torch.cat([tgt, eos], 1)})  # fmt: skip
    return out


def step_gflop(module, batch: dict) -> float:
    """FLOPs torch counts in one training step's forward and backward, in GFLOP."""
    from torch.utils.flop_counter import FlopCounterMode

    module.train()
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = module.model_step(batch)
        loss.backward()
    module.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 1e9


def bare_seconds(module, batches: list[dict], warmup: int) -> float:
    """Median seconds of a training step in a plain loop over the module's own pieces."""
    optimizer = module.configure_optimizers()["optimizer"]
    module.train()
    times = []
    for index, batch in enumerate(batches):
        start = time.perf_counter()
        loss, _ = module.model_step(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        sync(torch.device("cpu"))
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit_seconds(module, batches: list[dict], warmup: int) -> float:
    """Median seconds from one batch's start to the next one's in Lightning's fit loop."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader

    starts: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            starts.append(time.perf_counter())

        def on_train_end(self, trainer, pl_module) -> None:
            starts.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as logs:
        trainer = L.Trainer(
            accelerator="cpu", devices=1, max_epochs=1, gradient_clip_val=1.0,
            logger=CSVLogger(logs), log_every_n_steps=1, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
            num_sanity_val_steps=0, callbacks=[Clock(), LearningRateMonitor("step")],
        )  # fmt: skip
        trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    intervals = [b - a for a, b in itertools.pairwise(starts)]
    return statistics.median(intervals[warmup:])


def option_rows(size: str, length: int, batch: int, rounds: int) -> list[list]:
    """Per option: parameters, GFLOP a step and the median bare step, in interleaved rounds."""
    modules = {name: module_for(size, extra) for name, extra in OPTIONS.items()}
    optimizers = {name: m.configure_optimizers()["optimizer"] for name, m in modules.items()}
    batches = batches_for(modules["as configured"], 1, batch, length)
    times: dict[str, list[float]] = {name: [] for name in modules}
    for index in range(rounds + 1):  # the first round warms up
        for name, module in modules.items():
            module.train()
            start = time.perf_counter()
            loss, _ = module.model_step(batches[0])
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            optimizers[name].step()
            if index:
                times[name].append(time.perf_counter() - start)
    rows, first = [], None
    for name, module in modules.items():
        params = sum(p.numel() for p in module.parameters()) / 1e6
        gflop, seconds = step_gflop(module, batches[0]), statistics.median(times[name])
        first = first or (params, gflop, seconds)
        rows.append([name, " ".join(OPTIONS[name]) or "-", f"{params:.2f}",
                     f"{params / first[0]:.2f}", f"{gflop:.1f}", f"{gflop / first[1]:.2f}",
                     f"{seconds:.3f}", f"{seconds / first[2]:.2f}"])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[7, 15])
    parser.add_argument("--batch", type=int, default=128, help="pairs a batch")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up)")
    parser.add_argument("--peak-size", type=int, default=2048)
    parser.add_argument("--options", action="store_true", help="each model option's step cost")
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("seq2seq").setLevel(logging.ERROR)
    if args.options:
        for size, length in itertools.product(args.sizes, args.lengths):
            print(f"# the model options' bare step, {size} model, batch {args.batch} x length "
                  f"{length}, median of {args.steps} rounds, {environment()}")  # fmt: skip
            print_table(
                ["option", "overrides", "params (M)", "ratio", "GFLOP/step", "ratio",
                 "step s", "ratio"], option_rows(size, length, args.batch, args.steps),
            )  # fmt: skip
        return
    warmup = 2
    keep_freed_memory()  # as train.py does
    before = matmul_peak(args.peak_size)
    rows = []
    for size in args.sizes:
        for length in args.lengths:
            module = module_for(size)
            batches = batches_for(module, warmup + args.steps, args.batch, length)
            gflop = step_gflop(module, batches[0])
            bare = bare_seconds(module, batches, warmup)
            fit = fit_seconds(module_for(size), batches, warmup)
            rows.append([size, length, gflop, bare, fit])
            print(f"  measured {size} at length {length}", file=sys.stderr)
    after = matmul_peak(args.peak_size)
    peak = max(before, after)
    print(f"# model FLOP utilisation, batch {args.batch}, {environment()}")
    print(f"# fp32 matmul peak ({args.peak_size}^3): {peak:.1f} GFLOP/s "
          f"(before the steps {before:.1f}, after {after:.1f})\n")  # fmt: skip
    rows = [
        [size, length, f"{gflop:.2f}", f"{bare:.3f}", f"{gflop / bare:.1f}",
         f"{gflop / bare / peak:.2f}", f"{fit:.3f}", f"{gflop / fit:.1f}",
         f"{gflop / fit / peak:.2f}"]
        for size, length, gflop, bare, fit in rows
    ]  # fmt: skip
    print_table(
        ["size", "length", "GFLOP/step", "bare s", "bare GFLOP/s", "bare MFU", "fit s",
         "fit GFLOP/s", "fit MFU"], rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
