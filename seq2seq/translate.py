"""Translate with a trained checkpoint: one input a line in, one output a line out.

    python -m seq2seq.translate --ckpt best.ckpt "3 1 4 1 5"
    python -m seq2seq.translate --ckpt best.ckpt --input sources.txt > outputs.txt
    cat sources.txt | python -m seq2seq.translate --ckpt best.ckpt --beam 4
    python -m seq2seq.translate --ckpt best.ckpt --sample --top-p 0.9 --seed 1 "3 1 4"
    python -m seq2seq.translate --model model-ct2 --beam 4 "3 1 4"   # a seq2seq.export

    python -m seq2seq.translate --ckpt best.ckpt --prefix "The man" "Der Mann ist da."
    python -m seq2seq.translate --ckpt best.ckpt --input src.txt --score refs.txt --tokens

Outputs come in input order. Empty input lines give empty output lines. With --n-best N > 1,
each input gives N lines "INDEX<TAB>SCORE<TAB>OUTPUT", best first. --prefix: the output begins
with that text and the search goes on from it. --score REF_FILE scores the given translations
(forced decoding): "SCORE<TAB>LOGPROB<TAB>MEAN" a line, SCORE as beam search ranks (its length
penalty), LOGPROB the total log-probability (the end of the sentence counted), MEAN its
per-token mean; --tokens gives JSON with each token's log-probability. --model translates
with CTranslate2 (pip install -e ".[export]"): same tokenizers, options and output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from seq2seq.cli import ArgumentParser, run_tool
from seq2seq.data.tokenizer import text_lines
from seq2seq.inference import (
    TRANSLATE_BATCH,
    Engine,
    RequestError,
    add_arguments,
    check,
    flag_name,
    settings_from_args,
)


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
    add_arguments(parser)  # the search settings: seq2seq/inference.py declares them
    parser.add_argument(
        "--prefix-file", help="one prefix a line, for the input on the same line (empty: none)"
    )
    parser.add_argument(
        "--score", metavar="REF_FILE",
        help="score the translations in REF_FILE (one a line, for the input on the same line) "
        "instead of translating: SCORE<TAB>LOGPROB<TAB>MEAN a line",
    )  # fmt: skip
    parser.add_argument(
        "--tokens", action="store_true",
        help="with --score: one JSON object a line, each target token with its log-probability",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=TRANSLATE_BATCH)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument(
        "--compute-type", default=None,
        help="--model only: CTranslate2's compute type (default: the export's; e.g. int8)",
    )  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    args = parser.parse_args(argv)
    problem = option_error(args)
    if problem:
        parser.error(problem)
    try:
        check(settings_from_args(args), flag_name)
    except RequestError as error:
        parser.error(str(error))
    return args


def option_error(args: argparse.Namespace) -> str | None:
    """What is wrong with translate's own options (the search settings are checked as every
    request's are, by the Engine), in one line; None if nothing."""
    if args.batch_size < 1:
        return f"--batch-size must be at least 1, got {args.batch_size}"
    if args.compute_type is not None and args.ckpt:
        return "--compute-type is for a CTranslate2 --model; drop it with --ckpt"
    if args.prefix is not None and args.prefix_file is not None:
        return "--prefix is one text for every input, --prefix-file one a line: give one"
    if args.tokens and args.score is None:
        return "--tokens shows the tokens of scored translations: add --score REF_FILE"
    if args.score is not None and (args.prefix is not None or args.prefix_file is not None):
        return "--score scores whole translations: drop --prefix and --prefix-file"
    return None


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The input lines; bytes that are not UTF-8 fail naming the file (or stdin) and line."""
    if args.texts:
        return list(args.texts)
    if args.input and args.input != "-":
        return read_file(args.input, "--input", "one input a line")
    return text_lines(sys.stdin.buffer.read(), "standard input")


def read_file(path: str, flag: str, what: str) -> list[str]:
    if not Path(path).is_file():
        raise ValueError(f"{flag} {path} is not a file: give a file with {what}")
    return text_lines(Path(path).read_bytes(), path)


def load_model(args: argparse.Namespace) -> Engine:
    """The --ckpt or --model to translate with."""
    return Engine(
        args.ckpt, args.model, args.device, args.compute_type, torch.get_num_threads(), args.seed
    )


def translate(args: argparse.Namespace) -> list[str]:
    """The output lines for the inputs, in order (or, with --score, the scores' lines)."""
    engine = load_model(args)
    lines = read_inputs(args)
    settings = settings_from_args(args)
    if args.prefix_file is not None:
        prefixes = read_file(args.prefix_file, "--prefix-file", "one prefix a line")
        if len(prefixes) != len(lines):
            raise ValueError(
                f"--prefix-file has {len(prefixes)} lines for {len(lines)} inputs: give one "
                "prefix a line (an empty line for none)"
            )
        settings = replace(settings, prefix=prefixes)
    search = engine.search(settings, flag_name)
    sentences = engine.encode(
        lines, settings, search, lambda i: f"input line {i + 1}", flag_name
    )  # fmt: skip
    for index, sentence in enumerate(sentences):
        if sentence.unknown:
            print(
                f"warning: input line {index + 1}: {sentence.unknown} unknown token(s) "
                "mapped to <unk>",
                file=sys.stderr,
            )
    if args.score is not None:
        return scored(engine, args, sentences, search)
    found = engine.generate(sentences, search, batch_size=args.batch_size)
    out = []
    for index, hyps in enumerate(found):
        for score, ids in hyps:
            text = engine.text(ids)
            out.append(text if args.n_best == 1 else f"{index}\t{score:.4f}\t{text}")
    return out


def scored(engine: Engine, args: argparse.Namespace, sentences: list, search) -> list[str]:
    """--score: a line a pair, SCORE, LOGPROB and MEAN tab-separated (or JSON with
    --tokens)."""
    references = read_file(args.score, "--score", "one translation a line")
    if len(references) != len(sentences):
        raise ValueError(
            f"--score {args.score} has {len(references)} lines for {len(sentences)} inputs: "
            "give one translation a line, for the input on the same line"
        )
    targets = engine.targets(references, sentences, where=lambda i: f"--score line {i + 1}")
    results = engine.score(sentences, targets, search, batch_size=args.batch_size)
    if args.tokens:
        return [json.dumps(r, ensure_ascii=False) for r in results]
    return [f"{r['score']:.6f}\t{r['logprob']:.6f}\t{r['mean']:.6f}" for r in results]


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
