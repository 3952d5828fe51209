"""Training throughput: our model through the Lightning module against a plain PyTorch loop over
torch.nn.Transformer of the same size, same batches, same optimizer, side by side.

    python bench/train_throughput.py                       # docs/performance.md's table
    python bench/train_throughput.py --sizes tiny --lengths 16 64 --repeats 3   # a quick look
    python bench/train_throughput.py --device cuda

For each size (the `tiny` and `small` model configs) and length (source = target length), both
train on the same pre-made batches of random tokens (batch 32, vocabulary 1,000) with AdamW
(weight decay on matrices; ours fused, the baseline torch's default unless --baseline-fused),
gradient clipping at 1.0, and the config's dropout and label smoothing. Ours runs inside
Lightning's fit loop with everything it does each step (loss and token-accuracy metrics, the
learning-rate schedule, logging); the baseline is a bare loop.

They take turns in one process: a block of --steps steps of ours, then a block of the
baseline's, --repeats times after a warm-up block each; the table gives target tokens per
second (medians) and the median of the per-block ratios ours/baseline (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import environment, print_table, sync  # noqa: E402

from seq2seq.core.model import SinusoidalPositions  # noqa: E402

SIZES = {  # the net sections of configs/model/{tiny,small}.yaml
    "tiny": dict(d_model=64, num_heads=4, d_ff=256, layers=2, dropout=0.0, smoothing=0.0),
    "small": dict(d_model=256, num_heads=8, d_ff=1024, layers=3, dropout=0.1, smoothing=0.1),
}
VOCAB = 1000


class Baseline(nn.Module):
    """Embeddings with sinusoidal positions, nn.Transformer (batch_first, pre-norm), a linear
    output layer: the plain PyTorch model of the same size as ours."""

    def __init__(self, size: dict, max_len: int) -> None:
        super().__init__()
        d = size["d_model"]
        self.src_embed = nn.Embedding(VOCAB, d, padding_idx=0)
        self.tgt_embed = nn.Embedding(VOCAB, d, padding_idx=0)
        self.positions = SinusoidalPositions(max_len, d)  # the paper's table, as ours uses
        self.transformer = nn.Transformer(
            d, size["num_heads"], size["layers"], size["layers"], size["d_ff"], size["dropout"],
            batch_first=True, norm_first=True,
        )  # fmt: skip
        self.out = nn.Linear(d, VOCAB, bias=False)
        self.scale = math.sqrt(d)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        s = self.src_embed(src) * self.scale + self.positions(src.size(1))
        t = self.tgt_embed(tgt) * self.scale + self.positions(tgt.size(1))
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.transformer(
            s, t, tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0,
            memory_key_padding_mask=src == 0,
        )  # fmt: skip
        return self.out(h)


def adamw(model: nn.Module, lr: float, fused: bool) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    # fused=None is torch's default: a loop over the tensors on a CPU, foreach on a GPU.
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), fused=fused or None)


def make_batches(n: int, batch: int, length: int, device: torch.device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        src = torch.randint(4, VOCAB, (batch, length), generator=g)
        tgt = torch.randint(4, VOCAB, (batch, length), generator=g)
        bos = torch.ones(batch, 1, dtype=torch.long)
        eos = torch.full((batch, 1), 2, dtype=torch.long)
        tgt_in, labels = torch.cat([bos, tgt[:, :-1]], 1), torch.cat([tgt[:, 1:], eos], 1)
        pair = {"src": src, "tgt_in": tgt_in, "labels": labels}
        out.append({name: value.to(device) for name, value in pair.items()})
    return out


def measure(size_name: str, length: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(ours tokens/s, baseline tokens/s, median per-block ratio ours/baseline)."""
    import lightning as L
    from torch.utils.data import DataLoader

    from seq2seq.data.vocab import Vocabulary
    from seq2seq.training.module import Seq2SeqModule

    device = torch.device(args.device)
    size = SIZES[size_name]
    blocks = args.repeats + 1  # the first block of each is a warm-up
    batches = make_batches(args.steps, args.batch, length, device)
    vocab = Vocabulary(str(i) for i in range(VOCAB - 4)).to_dict()
    torch.manual_seed(0)
    ours = Seq2SeqModule(
        net=dict(
            d_model=size["d_model"], num_heads=size["num_heads"], d_ff=size["d_ff"],
            num_encoder_layers=size["layers"], num_decoder_layers=size["layers"],
            dropout=size["dropout"], max_positions=length + 1,
        ),
        src_vocab=vocab, tgt_vocab=vocab,
        training=dict(
            lr=1e-3, schedule="constant", warmup_steps=10, label_smoothing=size["smoothing"]
        ),
    )  # fmt: skip
    baseline = Baseline(size, length + 1).to(device)
    optimizer = adamw(baseline, 1e-3, args.baseline_fused)

    def baseline_block() -> float:
        baseline.train()
        sync(device)
        start = time.perf_counter()
        for batch in batches:
            logits = baseline(batch["src"], batch["tgt_in"])
            loss = F.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=0,
                label_smoothing=size["smoothing"],
            )  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(baseline.parameters(), 1.0)
            optimizer.step()
        sync(device)
        return time.perf_counter() - start

    ours_times: list[float] = []
    base_times: list[float] = []

    class TakeTurns(L.Callback):
        """Times each block of our steps (fit loop included), then runs a baseline block."""

        def __init__(self) -> None:
            self.start = 0.0

        def on_train_start(self, trainer, module) -> None:
            sync(device)
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if (batch_idx + 1) % args.steps == 0:
                sync(device)
                ours_times.append(time.perf_counter() - self.start)
                base_times.append(baseline_block())
                sync(device)
                self.start = time.perf_counter()

    loader = DataLoader(batches, batch_size=None)
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
        max_epochs=blocks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[TakeTurns()],
    )  # fmt: skip
    trainer.fit(ours, train_dataloaders=loader)
    tokens = args.steps * args.batch * length
    ours_times, base_times = ours_times[1:], base_times[1:]
    ratios = [b / o for o, b in zip(ours_times, base_times, strict=True)]
    return (
        tokens / statistics.median(ours_times),
        tokens / statistics.median(base_times),
        statistics.median(ratios),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks of each")
    parser.add_argument(
        "--baseline-fused", action="store_true",
        help="give the baseline fused AdamW too (ours always has it; default: torch's default)",
    )  # fmt: skip
    args = parser.parse_args()
    import logging

    logging.getLogger("lightning").setLevel(logging.WARNING)
    optimizer = "fused AdamW" if args.baseline_fused else "torch's default AdamW"
    print(f"# training throughput, batch {args.batch}, {environment()}, device {args.device}")
    print(f"# ours: fused AdamW; baseline: {optimizer}\n")
    rows = []
    for size in args.sizes:
        for length in args.lengths:
            ours, base, ratio = measure(size, length, args)
            rows.append([size, length, f"{ours:,.0f}", f"{base:,.0f}", f"{ratio:.2f}"])
            print(f"  measured {size} at length {length}", file=sys.stderr)
    print_table(
        ["size", "length", "ours tokens/s", "nn.Transformer tokens/s", "ours/baseline"], rows
    )


if __name__ == "__main__":
    main()
