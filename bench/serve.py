"""Serving: our decoder against CTranslate2 on the same model and inputs, side by side.

    python bench/serve.py                      # docs/decoding.md's tables (CPU, about 8 minutes)
    python bench/serve.py --lengths 64 --batches 32 --repeats 1 --no-quality  # a quick look
    python bench/serve.py --real path/to/best.ckpt --sources test.en --references test.fr

Speed: our cached greedy and beam 4 (seq2seq.core.decoding) against CTranslate2 float32 and int8
(the same float32 export, quantized as it loads) on the `small` sizes with random weights
(d_model 256, 8 heads, 3+3 layers, vocabulary 1,000, sources of 32 tokens) and on the
real-text model; batch 1 and 32, 64 and 256 new tokens, EOS ruled out on both sides so each
run makes exactly that many. Tokens per second (new tokens of the best hypothesis), medians
of --repeats taken in turn, and ours / CTranslate2 (above 1: ours is faster).

Quality: the real-text model's test split translated through `seq2seq.translate` with --ckpt
(ours), and with --model on an export under each --quantization (CTranslate2 computes in the
nearest type this machine supports: on a CPU without float16, float16 weights are rounded and
computed in float32), with the checkpoint's decoding (beam 5 for experiment=parallel_bpe):
the weights' size, BLEU, chrF, seconds (load included), and how many outputs equal ours. The
real-text model is the 30-minute run of bench/recipe.py (docs/results.md, "The recipe, measured");
without it those rows are left out. A model CTranslate2 cannot express (`model.net.qk_norm=true`)
is refused in one line before anything is measured.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import environment, interleaved_seconds, print_table  # noqa: E402

from seq2seq import translate as translate_cli  # noqa: E402
from seq2seq.checkpoint import load_module  # noqa: E402
from seq2seq.core.decoding import beam_search, greedy_decode  # noqa: E402
from seq2seq.export import (  # noqa: E402
    QUANTIZATIONS,
    check_exportable,
    import_ctranslate2,
    token_strings,
    write_export,
)
from seq2seq.score import corpus_scores, read_lines  # noqa: E402
from seq2seq.training.module import Seq2SeqModule  # noqa: E402

RUN = ROOT / "bench" / "out" / "recipe" / "30min-average_last5-base"
REAL = RUN / "checkpoints" / "epoch005-step003473.ckpt"


def small_module(vocab: int) -> Seq2SeqModule:
    """The `small` sizes with random weights and a vocabulary of `vocab` symbols."""
    symbols = {"kind": "symbol", "symbols": [f"w{i}" for i in range(vocab - 4)]}
    net = {"d_model": 256, "num_heads": 8, "d_ff": 1024, "num_encoder_layers": 3,
           "num_decoder_layers": 3, "max_positions": 512}  # fmt: skip
    return Seq2SeqModule(net=net, src_vocab=symbols, tgt_vocab=symbols).eval()


class Ours:
    """Our search on a module whose EOS is ruled out (a hook on the output projection)."""

    def __init__(self, module: Seq2SeqModule) -> None:
        self.model = module.model
        eos = torch.tensor([module.config.eos_id])
        self.model.generator.register_forward_hook(
            lambda _m, _i, logits: logits.index_fill(-1, eos, float("-inf"))
        )

    def run(self, src: torch.Tensor, new_tokens: int, beam: int) -> int:
        if beam == 1:
            out = greedy_decode(self.model, src, new_tokens)
        else:
            out = beam_search(self.model, src, new_tokens, beam)[0][:, 0]
        return int((out != self.model.config.pad_id).sum())


class Theirs:
    """CTranslate2's search on the export, EOS ruled out by a minimum length."""

    def __init__(self, directory: Path, module, compute_type: str, threads: int) -> None:
        ctranslate2 = import_ctranslate2()
        self.translator = ctranslate2.Translator(
            str(directory), compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.tokens = token_strings(module.src_vocab)

    def run(self, src: torch.Tensor, new_tokens: int, beam: int) -> int:
        source = [[self.tokens[i] for i in row] for row in src.tolist()]
        results = self.translator.translate_batch(
            source, beam_size=beam, max_decoding_length=new_tokens,
            min_decoding_length=new_tokens, max_batch_size=0,
        )  # fmt: skip
        return sum(len(r.hypotheses[0]) for r in results)


def speed_rows(name: str, module, src_pool: torch.Tensor, args, work: Path) -> list[list]:
    directory = write_export(module, work / name)
    engines = {
        "ours": Ours(module),
        "ct2 float32": Theirs(directory, module, "float32", args.threads),
        "ct2 int8": Theirs(directory, module, "int8", args.threads),
    }
    rows = []
    for batch in args.batches:
        src = src_pool[:batch]
        for new_tokens in args.lengths:
            for beam in (1, args.beam):
                made = {key: engine.run(src, new_tokens, beam) for key, engine in engines.items()}
                calls = {
                    key: functools.partial(engine.run, src, new_tokens, beam)
                    for key, engine in engines.items()
                }
                times = interleaved_seconds(calls, torch.device("cpu"), args.repeats, warmup=0)
                rate = {key: made[key] / statistics.median(t) for key, t in times.items()}
                search = "greedy" if beam == 1 else f"beam {beam}"
                rows.append(
                    [name, batch, new_tokens, search, f"{rate['ours']:.0f}",
                     f"{rate['ct2 float32']:.0f}", f"{rate['ct2 int8']:.0f}",
                     f"{rate['ours'] / rate['ct2 float32']:.2f}",
                     f"{rate['ours'] / rate['ct2 int8']:.2f}"]
                )  # fmt: skip
                print(f"  {name} batch {batch}, {new_tokens} tokens, {search}", file=sys.stderr)
    return rows


def real_sources(module, path: Path, count: int) -> torch.Tensor:
    """The first count lines of path as one padded batch of source ids."""
    lines = read_lines(path)[:count]
    ids = [module.src_vocab.encode(line) for line in lines]
    width = max(map(len, ids))
    return torch.tensor([row + [module.src_vocab.pad_id] * (width - len(row)) for row in ids])


def quality_rows(ckpt: Path, sources: Path, references: Path, work: Path) -> list[list]:
    """Ours, then the export under each --quantization, on the test split via translate."""
    ctranslate2 = import_ctranslate2()
    module = load_module(ckpt)
    refs = read_lines(references)
    beam = str(module.decoding.beam_size)
    runs = {"ours (PyTorch)": (["--ckpt", str(ckpt)], None)}
    for quantization in QUANTIZATIONS:
        directory = write_export(module, work / f"real-{quantization}", quantization)
        runs[f"export {quantization}"] = (["--model", str(directory)], directory)
    outputs, rows = {}, []
    for name, (model, directory) in runs.items():
        argv = [*model, "--input", str(sources), "--beam", beam, "--truncate"]
        start = time.perf_counter()
        with torch.inference_mode():
            outputs[name] = translate_cli.translate(translate_cli.parse_args(argv))
        seconds = time.perf_counter() - start
        bleu, chrf = (s["score"] * 100 for s in corpus_scores(outputs[name], refs).values())
        same = sum(a == b for a, b in zip(outputs[name], outputs["ours (PyTorch)"], strict=True))
        if directory is None:
            computes, size = "float32", ckpt.stat().st_size  # the checkpoint: optimizer too
        else:
            computes = ctranslate2.Translator(str(directory)).compute_type
            size = (directory / "model.bin").stat().st_size
        rows.append([name, computes, f"{size / 2**20:.1f}", f"{bleu:.2f}", f"{chrf:.2f}",
                     f"{seconds:.1f}", f"{same / len(refs):.1%}"])  # fmt: skip
        print(f"  quality: {name}", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="for torch and CTranslate2")
    parser.add_argument("--real", type=Path, default=REAL, help="the real-text checkpoint")
    parser.add_argument("--sources", type=Path, default=RUN / "test_sources.txt")
    parser.add_argument("--references", type=Path, default=RUN / "test_references.txt")
    parser.add_argument("--no-quality", action="store_true", help="speed tables only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    real = args.real.is_file()
    if not real:
        print(f"# no real-text model at {args.real}: its rows are left out (see --real)\n")
    else:  # QK-norm does not export: say so before any table is measured
        try:
            check_exportable(load_module(args.real).config)
        except ValueError as refused:
            parser.error(f"--real {args.real}: {refused}")

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        work = Path(tmp)
        print(f"# serving, {environment()}; CTranslate2 {import_ctranslate2().__version__}\n")
        print("New tokens per second (median of repeats); ours/ct2 above 1: ours is faster.\n")
        small = small_module(1000)
        rows = speed_rows("small", small, torch.randint(4, 1000, (max(args.batches), 32)), args,
                          work)  # fmt: skip
        if real:
            module = load_module(args.real)
            src = real_sources(module, args.sources, max(args.batches))
            rows += speed_rows("real text", module, src, args, work)
        print_table(
            ["model", "batch", "new tokens", "search", "ours", "ct2 f32", "ct2 int8",
             "ours/f32", "ours/int8"],
            rows,
        )  # fmt: skip
        if real and not args.no_quality:
            print(f"\nQuality on {args.sources} ({args.real.parent.parent.name}):\n")
            print(f"Beam {load_module(args.real).decoding.beam_size}; 'computes as': the type")
            print("CTranslate2 chose on this machine for the export's weights.\n")
            print_table(
                ["decoder", "computes as", "MiB", "BLEU", "chrF", "seconds",
                 "same output as ours"],
                quality_rows(args.real, args.sources, args.references, work),
            )  # fmt: skip


if __name__ == "__main__":
    main()
