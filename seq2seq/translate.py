"""Translate with a trained checkpoint: one input a line in, one output a line out.

    python -m seq2seq.translate --ckpt best.ckpt "3 1 4 1 5"
    python -m seq2seq.translate --ckpt best.ckpt --input sources.txt > outputs.txt
    cat sources.txt | python -m seq2seq.translate --ckpt best.ckpt --beam 4
    python -m seq2seq.translate --ckpt best.ckpt --sample --top-p 0.9 --seed 1 "3 1 4"

Outputs come in input order. Empty input lines give empty output lines. With --n-best N > 1,
each input gives N lines "INDEX<TAB>SCORE<TAB>OUTPUT", best first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.checkpoint import load_module
from seq2seq.data.tokenizer import clean, decode_line
from seq2seq.decoding import beam_search, greedy_decode, max_decode_length, sample_decode


@dataclass
class Encoded:
    """One non-empty input line as token ids, with what went wrong on the way."""

    index: int  # 0-based position in the input
    ids: list[int]
    unknown: int  # how many tokens mapped to <unk>


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m seq2seq.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("texts", nargs="*", help="inputs; none: read --input or standard input")
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by train.py")
    parser.add_argument("--input", help="a file with one input a line ('-': standard input)")
    parser.add_argument("--beam", type=int, default=1, help="beam width (1: greedy)")
    parser.add_argument("--n-best", type=int, default=1, help="outputs per input (<= --beam)")
    parser.add_argument("--length-penalty", type=float, default=None, help="beam ranking")
    parser.add_argument("--max-len", type=int, default=None, help="most new tokens per output")
    parser.add_argument("--sample", action="store_true", help="sample instead of searching")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="for --sample")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument(
        "--truncate", action="store_true", help="cut inputs longer than the model accepts"
    )
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    args = parser.parse_args(argv)
    if args.sample and (args.beam > 1 or args.n_best > 1):
        parser.error("--sample draws one output per input: drop --beam and --n-best")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    return args


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The input lines; bytes that are not UTF-8 fail naming the file (or stdin) and line."""
    if args.texts:
        return list(args.texts)
    if args.input and args.input != "-":
        with open(args.input, "rb") as f:
            raw, source = f.read(), args.input
    else:
        raw, source = sys.stdin.buffer.read(), "standard input"
    return [decode_line(line, source, n) for n, line in enumerate(raw.splitlines(), 1)]


def encode_inputs(lines: list[str], vocab, max_positions: int, truncate: bool) -> list[Encoded]:
    """Token ids of every non-empty line; too-long lines fail (or are cut with --truncate)."""
    encoded = []
    for index, line in enumerate(lines):
        text = clean(line)
        if not text:
            continue
        ids = vocab.encode(text)
        if len(ids) > max_positions:
            if not truncate:
                raise ValueError(
                    f"input line {index + 1} has {len(ids)} tokens, more than the model's "
                    f"{max_positions}; shorten it or pass --truncate"
                )
            ids = ids[:max_positions]
        encoded.append(Encoded(index, ids, sum(i == vocab.unk_id for i in ids)))
    return encoded


def batches(items: list[Encoded], size: int) -> Iterator[list[Encoded]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def pad(rows: list[list[int]], pad_id: int, device: torch.device) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], device=device)


def decode_batch(module, src: Tensor, args: argparse.Namespace, generator) -> list[list[tuple]]:
    """Per input, a list of (score, token ids) pairs, best first."""
    hp = module.hparams
    max_len = args.max_len or max_decode_length(module.model, src, hp.max_len_a, hp.max_len_b)
    max_len = min(max_len, module.config.max_positions)
    if args.sample:
        out = sample_decode(
            module.model, src, max_len, args.temperature, args.top_k, args.top_p, generator
        )
        return [[(float("nan"), row)] for row in out.tolist()]
    if args.beam == 1:
        return [[(float("nan"), row)] for row in greedy_decode(module.model, src, max_len).tolist()]
    penalty = hp.length_penalty if args.length_penalty is None else args.length_penalty
    tokens, scores = beam_search(module.model, src, max_len, args.beam, penalty, args.n_best)
    return [
        list(zip(s, t, strict=True)) for s, t in zip(scores.tolist(), tokens.tolist(), strict=True)
    ]


def translate(args: argparse.Namespace) -> list[str]:
    """The output lines for the inputs, in order."""
    device = torch.device(args.device)
    module = load_module(args.ckpt, map_location=device)
    lines = read_inputs(args)
    encoded = encode_inputs(lines, module.src_vocab, module.config.max_positions, args.truncate)
    for item in encoded:
        if item.unknown:
            print(
                f"warning: input line {item.index + 1}: {item.unknown} unknown token(s) "
                "mapped to <unk>",
                file=sys.stderr,
            )
    generator = torch.Generator(device=device).manual_seed(args.seed)
    results: dict[int, list[tuple]] = {}
    for batch in batches(encoded, args.batch_size):
        src = pad([item.ids for item in batch], module.src_vocab.pad_id, device)
        for item, hyps in zip(batch, decode_batch(module, src, args, generator), strict=True):
            results[item.index] = hyps
    out = []
    for index in range(len(lines)):
        hyps = results.get(index, [(float("nan"), [])] * args.n_best)
        for score, ids in hyps:
            text = module.tgt_vocab.decode(ids)
            out.append(text if args.n_best == 1 else f"{index}\t{score:.4f}\t{text}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with torch.inference_mode():
            for line in translate(args):
                print(line)
    except (ValueError, OSError) as error:  # CheckpointError is a ValueError
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
