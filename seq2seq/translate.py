"""Translate with a trained checkpoint: one input a line in, one output a line out.

    python -m seq2seq.translate --ckpt best.ckpt "3 1 4 1 5"
    python -m seq2seq.translate --ckpt best.ckpt --input sources.txt > outputs.txt
    cat sources.txt | python -m seq2seq.translate --ckpt best.ckpt --beam 4
    python -m seq2seq.translate --ckpt best.ckpt --sample --top-p 0.9 --seed 1 "3 1 4"
    python -m seq2seq.translate --model model-ct2 --beam 4 "3 1 4"   # a seq2seq.export

Outputs come in input order. Empty input lines give empty output lines. With --n-best N > 1,
each input gives N lines "INDEX<TAB>SCORE<TAB>OUTPUT", best first. --model translates with
CTranslate2 (pip install -e ".[export]"): same tokenizers, options and output.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from seq2seq.checkpoint import load_module
from seq2seq.cli import ArgumentParser, run_tool
from seq2seq.core.decoding import (
    DecodingConfig,
    Sampling,
    Search,
    beam_search,
    greedy_decode,
    sample_decode,
)
from seq2seq.data.tokenizer import clean, text_lines

MIN_TEMPERATURE = 1e-4  # sampling's: a logit of 50 over 1e-37 is past float32's largest
MAX_SEED = 2**32 - 1  # CTranslate2's set_random_seed takes an unsigned 32-bit integer


@dataclass
class Encoded:
    """One non-empty input line as token ids, with what went wrong on the way."""

    index: int  # 0-based position in the input
    ids: list[int]
    unknown: int  # how many tokens mapped to <unk>


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="python -m seq2seq.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("texts", nargs="*", help="inputs; none: read --input or standard input")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--ckpt", help="a checkpoint written by train.py")
    model.add_argument("--model", help="a CTranslate2 directory written by seq2seq.export")
    parser.add_argument("--input", help="a file with one input a line ('-': standard input)")
    parser.add_argument(
        "--beam", type=int, default=None,
        help="beam width (1: greedy; default: the model's own, its model.decoding.beam_size)",
    )  # fmt: skip
    parser.add_argument("--n-best", type=int, default=1, help="outputs per input (<= --beam)")
    parser.add_argument(
        "--length-penalty", type=float, default=None,
        help="beam search ranks by log-probability / length ** this (default: the model's own)",
    )  # fmt: skip
    parser.add_argument(
        "--max-len", type=int, default=None,
        help="most new tokens per output (default: the model's rule, a * source length + b)",
    )  # fmt: skip
    parser.add_argument("--sample", action="store_true", help="sample instead of searching")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="for --sample")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument(
        "--compute-type", default=None,
        help="--model only: CTranslate2's compute type (default: the export's; e.g. int8)",
    )  # fmt: skip
    parser.add_argument(
        "--truncate", action="store_true", help="cut inputs longer than the model accepts"
    )
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    args = parser.parse_args(argv)
    problem = option_error(args)
    if problem:
        parser.error(problem)
    return args


def option_error(args: argparse.Namespace) -> str | None:
    """What is wrong with translate's options, in one line; None if nothing (both backends
    get only options they can run)."""
    for name in ("beam", "n_best", "batch_size", "max_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {value}"
    if args.sample and ((args.beam or 1) > 1 or args.n_best > 1):
        return "--sample draws one output per input: drop --beam and --n-best"
    if args.beam is not None and args.n_best > args.beam:
        return f"--n-best {args.n_best} needs a beam at least as wide: add --beam {args.n_best}"
    if args.length_penalty is not None and not math.isfinite(args.length_penalty):
        return f"--length-penalty must be a finite number, got {args.length_penalty}"
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        return f"--temperature must be a positive number, got {args.temperature}"
    if args.temperature < MIN_TEMPERATURE:  # the logits over it would overflow float32
        return (
            f"--temperature must be at least {MIN_TEMPERATURE:g}, got {args.temperature:g}: "
            "for the most likely tokens, drop --sample (greedy search)"
        )
    if args.top_k < 0:
        return f"--top-k must be 0 (all tokens) or more, got {args.top_k}"
    if not 0 < args.top_p <= 1:
        return f"--top-p must be in (0, 1], got {args.top_p}"
    if not 0 <= args.seed <= MAX_SEED:
        return f"--seed must be in 0-{MAX_SEED} (both backends take 32 bits), got {args.seed}"
    if args.compute_type is not None and args.ckpt:
        return "--compute-type is for a CTranslate2 --model; drop it with --ckpt"
    return None


def search_for(args: argparse.Namespace, saved: DecodingConfig) -> Search:
    """The search the options ask for; what they leave out is the model's own, as it was
    tested (its beam width, widened to --n-best; its length penalty; its length rule)."""
    if args.sample:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        return Search(replace(saved, beam_size=1), sampling=sampling)
    beam = args.beam if args.beam is not None else max(saved.beam_size, args.n_best)
    penalty = saved.length_penalty if args.length_penalty is None else args.length_penalty
    return Search(replace(saved, beam_size=beam, length_penalty=penalty), n_best=args.n_best)


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The input lines; bytes that are not UTF-8 fail naming the file (or stdin) and line."""
    if args.texts:
        return list(args.texts)
    if args.input and args.input != "-":
        if not Path(args.input).is_file():
            raise ValueError(
                f"--input {args.input} is not a file: give a file with one input a line"
            )
        return text_lines(Path(args.input).read_bytes(), args.input)
    return text_lines(sys.stdin.buffer.read(), "standard input")


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


class CheckpointModel:
    """translate's --ckpt path: the checkpoint's model, searching with seq2seq.core.decoding.

    It shares ExportedModel's interface (src_vocab, tgt_vocab, max_positions, decoding,
    generate), so translate runs one way for both.
    """

    def __init__(self, path: str, device: str = "cpu", seed: int = 0) -> None:
        self.device = torch_device(device)
        self.module = load_module(path, map_location=self.device)
        self.src_vocab, self.tgt_vocab = self.module.src_vocab, self.module.tgt_vocab
        self.max_positions = self.module.config.max_positions
        self.decoding = self.module.decoding
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def generate(
        self,
        rows: list[list[int]],
        max_len: int | list[int],
        search: Search,
        stop: Callable[[], bool] | None = None,
    ) -> list:
        """Per source row of token ids, a list of (score, token ids) pairs, best first; at
        most max_len tokens (one for every row, or one a row). stop is asked before every step:
        True raises SearchStopped."""
        model, src = self.module.model, pad(rows, self.src_vocab.pad_id, self.device)
        if isinstance(max_len, list):
            max_len = torch.tensor(max_len, device=self.device)
        if search.sampling is not None:
            s = search.sampling
            out = sample_decode(
                model, src, max_len, s.temperature, s.top_k, s.top_p, self.generator, stop
            )
            return [[(float("nan"), row)] for row in out.tolist()]
        beam, penalty = search.decoding.beam_size, search.decoding.length_penalty
        if beam == 1:
            found = greedy_decode(model, src, max_len, stop=stop)
            return [[(float("nan"), row)] for row in found.tolist()]
        tokens, scores = beam_search(model, src, max_len, beam, penalty, search.n_best, stop)
        return [
            list(zip(s, t, strict=True))
            for s, t in zip(scores.tolist(), tokens.tolist(), strict=True)
        ]


def output_limit(
    source_length: int, search: Search, max_positions: int, max_len: int | None = None
) -> int:
    """Most tokens one input's output may have: --max-len, else the model's rule for the
    input's own length (so an output never depends on the inputs batched with it), and never
    more than the model's positions."""
    limit = search.decoding.max_len(source_length, max_positions)
    return min(max_len or limit, max_positions)


def torch_device(name: str) -> torch.device:
    """--device as a torch device that exists here, or a one-line error."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda, cuda:N or mps, got {name!r}") from None
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available()
        and (device.index is None or device.index < torch.cuda.device_count()),
        "mps": torch.backends.mps.is_available(),
    }
    if not available.get(device.type, False):
        raise ValueError(f"--device {name}: no such device on this machine; use --device cpu")
    return device


def load_model(args: argparse.Namespace):
    """The --ckpt or --model to translate with."""
    if args.ckpt:
        return CheckpointModel(args.ckpt, args.device, args.seed)
    from seq2seq.exported import ExportedModel  # imports CTranslate2, an optional extra

    return ExportedModel(
        args.model, args.device, args.compute_type or "default", torch.get_num_threads(),
        args.seed,
    )  # fmt: skip


def translate(args: argparse.Namespace) -> list[str]:
    """The output lines for the inputs, in order."""
    model = load_model(args)
    lines = read_inputs(args)
    encoded = encode_inputs(lines, model.src_vocab, model.max_positions, args.truncate)
    for item in encoded:
        if item.unknown:
            print(
                f"warning: input line {item.index + 1}: {item.unknown} unknown token(s) "
                "mapped to <unk>",
                file=sys.stderr,
            )
    search = search_for(args, model.decoding)
    results: dict[int, list[tuple]] = {}
    for batch in batches(encoded, args.batch_size):
        rows = [item.ids for item in batch]
        limits = [output_limit(len(row), search, model.max_positions, args.max_len) for row in rows]
        for item, hyps in zip(batch, model.generate(rows, limits, search), strict=True):
            results[item.index] = hyps
    out = []
    for index in range(len(lines)):
        hyps = results.get(index, [(float("nan"), [])] * args.n_best)
        for score, ids in hyps:
            text = model.tgt_vocab.decode(ids)
            out.append(text if args.n_best == 1 else f"{index}\t{score:.4f}\t{text}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def work() -> None:
        with torch.inference_mode():
            outputs = translate(args)
        print("\n".join(outputs), end="\n" if outputs else "")  # all or nothing: one write
        sys.stdout.flush()

    return run_tool(work, args.debug)


if __name__ == "__main__":
    sys.exit(main())
