"""Decoding speed: cached vs uncached greedy, and beam search vs greedy, side by side.

    python bench/decode.py                 # docs/performance.md's table (CPU, a few minutes)
    python bench/decode.py --device cuda
    python bench/decode.py --lengths 16 64 --repeats 1   # a quick look

The model has the `small` sizes (d_model 256, 8 heads, 3+3 layers) with random weights, and
EOS is masked out so every run makes exactly the asked number of new tokens; sources are 32
tokens long, batch 32. Uncached greedy re-runs the decoder over the whole prefix every step.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import environment, median_seconds, print_table

from seq2seq.core.decoding import beam_search, greedy_decode
from seq2seq.core.model import ModelConfig, Seq2SeqTransformer


def build_model(args: argparse.Namespace, device: torch.device) -> Seq2SeqTransformer:
    config = ModelConfig(
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab,
        d_model=args.d_model,
        num_heads=8,
        d_ff=4 * args.d_model,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        max_positions=max(args.lengths) + 1,
    )
    model = Seq2SeqTransformer(config).to(device).eval()

    def no_eos(module: torch.nn.Module, inputs: tuple, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, torch.tensor([config.eos_id], device=device), float("-inf"))

    model.generator.register_forward_hook(no_eos)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=32)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(args, device)
    src = torch.randint(4, args.vocab, (args.batch, args.source_length), device=device)

    print(f"# decoding, batch {args.batch}, {environment()}, device {device}\n")
    print(
        "Time per batch in ms (median of repeats); a ratio > 1: the first is that many "
        "times slower.\n"
    )
    greedy_decode(model, src, 4)  # loads the kernels once; each measurement then runs cold
    rows = []
    for n in args.lengths:
        cached = median_seconds(
            partial(greedy_decode, model, src, n), device, args.repeats, warmup=0
        )
        uncached = median_seconds(
            partial(greedy_decode, model, src, n, use_cache=False), device, args.repeats, warmup=0
        )
        beam = median_seconds(
            partial(beam_search, model, src, n, beam_size=args.beam), device, args.repeats, warmup=0
        )
        rows.append(
            [n, f"{cached * 1e3:.0f}", f"{uncached * 1e3:.0f}", f"{uncached / cached:.1f}",
             f"{beam * 1e3:.0f}", f"{beam / cached:.1f}"]
        )  # fmt: skip
        print(f"  measured {n} new tokens", file=sys.stderr)
    print_table(
        ["new tokens", "greedy cached", "greedy uncached", "uncached/cached",
         f"beam {args.beam}", f"beam {args.beam}/greedy"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
