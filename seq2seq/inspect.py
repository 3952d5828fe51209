"""Look inside a checkpoint: its config, sizes, metrics, attention; or compare two.

    python -m seq2seq.inspect best.ckpt                 # a readable report
    python -m seq2seq.inspect best.ckpt --json          # the same as JSON
    python -m seq2seq.inspect best.ckpt --attention "3 1 4 1 5" --out attn.png
    python -m seq2seq.inspect best.ckpt --attention "3 1 4 1 5" --grid cross   # model_view.png
    python -m seq2seq.inspect a.ckpt b.ckpt --diff      # which config values and tensors differ
    python -m seq2seq.inspect RUN_DIR --curves          # RUN_DIR/curves.png: loss, lr, metrics

Checkpoints are read with torch.load(weights_only=True): a file holding arbitrary Python
objects is refused before anything in it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint import (
    load_checkpoint,
    load_module,
    picked_search_lines,
    run_record,
    trained_model,
)
from seq2seq.checks import flatten
from seq2seq.cli import ArgumentParser, run_tool
from seq2seq.curves import save_figure, write_curves
from seq2seq.data.tokenizer import clean
from seq2seq.files import written_whole

# Not the standard library's `inspect`: run as `python -m seq2seq.inspect`.


def parameter_counts(module: torch.nn.Module) -> dict[str, int]:
    """Parameters per top-level part of the model, and the total (shared tensors once)."""
    counts = {}
    for name, child in module.model.named_children():
        counts[name] = sum(p.numel() for p in child.parameters())
    counts["total"] = sum(p.numel() for p in module.model.parameters())
    return counts


def report(path: str) -> dict[str, Any]:
    """Everything inspect knows about one checkpoint, as plain values."""
    checkpoint = load_checkpoint(path)
    module = trained_model(checkpoint, path)
    best, dropout_off_at = {}, None
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and state.get("best_model_score") is not None:
            best = {state["monitor"]: float(state["best_model_score"])}
        if key == "TimeBudget":  # the step at which a budget of few epochs turned dropout off
            dropout_off_at = state.get("dropout_off_at")
    return {
        "file": str(Path(path).resolve()),
        "file_size_bytes": Path(path).stat().st_size,
        "epoch": checkpoint.get("epoch"),
        "global_step": checkpoint.get("global_step"),
        "has_optimizer_state": bool(checkpoint.get("optimizer_states")),
        "dropout_off_at_step": dropout_off_at,  # model_config's dropout until then
        # Late dropout: none until this many epochs were trained, model_config's from there.
        "dropout_from_epoch": checkpoint.get("hyper_parameters", {})
        .get("training", {})
        .get("dropout_from_epoch"),
        "model_config": module.config.to_dict(),
        "parameters": parameter_counts(module),
        "tokenizer": {
            "kind": module.src_vocab.kind,
            "src_vocab_size": len(module.src_vocab),
            "tgt_vocab_size": len(module.tgt_vocab),
        },
        "best_metric": best,
        **run_record(checkpoint),  # format, last_metrics, metric_signatures, run_config
    }


def print_report(info: dict[str, Any]) -> None:
    size = info["file_size_bytes"] / 2**20
    print(f"checkpoint   {info['file']} ({size:.2f} MiB, format {info['format']})")
    print(f"progress     epoch {info['epoch']}, global step {info['global_step']}")
    print(f"optimizer    {'state inside (resumable)' if info['has_optimizer_state'] else 'none'}")
    if info["dropout_off_at_step"] is not None:
        rate = info["model_config"]["dropout"]
        print(f"dropout      {rate} until step {info['dropout_off_at_step']}, then off (the time "
              "budget bought fewer epochs than model.training.dropout_min_epochs)")  # fmt: skip
    if info["dropout_from_epoch"] is not None:
        rate = info["model_config"]["dropout"]
        print(f"dropout      none until {info['dropout_from_epoch']:g} epochs were trained, then "
              f"{rate} (model.training.dropout_from_epoch)")  # fmt: skip
    tok = info["tokenizer"]
    sizes = f"source {tok['src_vocab_size']}, target {tok['tgt_vocab_size']}"
    print(f"tokenizer    {tok['kind']}: {sizes}")
    print("\nparameters")
    for name, count in info["parameters"].items():
        print(f"  {name:<12} {count:>12,}")
    print("\nmodel config")
    for name, value in info["model_config"].items():
        print(f"  {name:<20} {value}")
    print("\nmetrics")
    for name, value in info["best_metric"].items():
        print(f"  best {name:<20} {value:.4f}")
    signatures = info["metric_signatures"]
    for name, value in sorted(info["last_metrics"].items()):
        signature = signatures.get(name.split("/")[-1])
        print(f"  last {name:<20} {value:.4f}" + (f"  ({signature})" if signature else ""))
    if info["picked_search"] is not None:  # the run's pick_search: its decoding defaults
        print("\nsearch " + "\n".join(picked_search_lines(info["picked_search"])))
    print("\nrun config (as composed by Hydra)")
    if info["run_config"] is None:
        print("  (not saved in this checkpoint)")
    else:
        for key, value in flatten(info["run_config"]).items():
            print(f"  {key} = {value}")


def diff(path_a: str, path_b: str) -> list[str]:
    """Lines naming each config value and parameter tensor that differs between two files."""
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    lines = []
    run_a, run_b = run_record(a)["run_config"] or {}, run_record(b)["run_config"] or {}
    config_a = flatten({"hparams": a["hyper_parameters"], "run": run_a})
    config_b = flatten({"hparams": b["hyper_parameters"], "run": run_b})
    for key in sorted(set(config_a) | set(config_b)):
        if key.startswith(("hparams.src_vocab", "hparams.tgt_vocab")):
            continue  # compared as a whole below
        if config_a.get(key, "<absent>") != config_b.get(key, "<absent>"):
            lines.append(
                f"config  {key}: {config_a.get(key, '<absent>')} -> {config_b.get(key, '<absent>')}"
            )
    for side in ("src_vocab", "tgt_vocab"):
        if a["hyper_parameters"][side] != b["hyper_parameters"][side]:
            lines.append(f"config  hparams.{side}: differs")
    state_a, state_b = a["state_dict"], b["state_dict"]
    for name in sorted(set(state_a) | set(state_b)):
        ta, tb = state_a.get(name), state_b.get(name)
        if ta is None or tb is None:
            lines.append(f"tensor  {name}: only in {'A' if tb is None else 'B'}")
        elif ta.shape != tb.shape:
            lines.append(f"tensor  {name}: shape {tuple(ta.shape)} -> {tuple(tb.shape)}")
        elif not torch.equal(ta, tb):
            delta = (ta.float() - tb.float()).abs().max().item()
            lines.append(f"tensor  {name}: values differ (max abs difference {delta:.3g})")
    return lines


def plot_attention(path: str, text: str, out: str, grid: str | None = None) -> int:
    """Decode text greedily, then draw the encoder's attention over the source and the
    decoder's while it reads its output; with grid (an attention kind), every layer and head
    of that kind as small maps (the page's model view)."""
    from seq2seq.plots import attention_figure, model_view_figure

    module = load_module(path)
    vocab_in, vocab_out = module.src_vocab, module.tgt_vocab
    src = torch.tensor([vocab_in.encode(clean(text))])
    if src.numel() == 0:
        raise ValueError("--attention needs a non-empty source text")
    with torch.inference_mode():
        output = module.output_ids(module.greedy(src)[0].tolist())
    maps = module.attention(src[0].tolist(), output)
    tgt_in = [vocab_out.bos_id, *output[:-1]]
    if grid is not None:
        title = f"{text!r} -> {vocab_out.decode(output)!r}: {grid} attention"
        figure = model_view_figure(maps[grid], title, grid)
        save_figure(figure, out, bbox_inches="tight")
        heads = sum(layer.size(0) for layer in maps[grid])
        print(f"wrote {out}: {len(maps[grid])} layers, {heads} heads of {grid} attention")
        return 0
    figure = attention_figure(
        cross=maps["cross"],
        self_attn=maps["self"],
        encoder=maps["encoder"],
        source_tokens=[vocab_in.token_label(i) for i in src[0].tolist()],
        output_tokens=[vocab_out.token_label(i) for i in tgt_in],
        title=f"{text!r} -> {vocab_out.decode(output)!r}",
    )
    save_figure(figure, out, bbox_inches="tight")
    print(f"wrote {out}: {len(figure.axes) - 1} heat maps, output {vocab_out.decode(output)!r}")
    return 0


def plot_over_run(
    run: str, text: str, out: str, kind: str, layer: int | None, head: int | None
) -> int:
    """--over-run: the greedy output of text and the chosen head's attention at every
    checkpoint the run kept, a heat map each, titled with its step and validation BLEU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seq2seq.curves import kept_checkpoints

    history = kept_checkpoints(run)
    fig, axes = plt.subplots(1, len(history), figsize=(2.8 * len(history), 3.4), squeeze=False,
                             layout="constrained")  # fmt: skip
    for ax, (step, path, bleu) in zip(axes[0], history, strict=True):
        module = load_module(str(path))
        chosen = module.config.num_decoder_layers - 1 if layer is None else layer
        module.model.attention_module(kind, chosen)  # a one-line error for a layer it lacks
        src = module.src_vocab.encode(clean(text))
        if not src:
            raise ValueError("--attention needs a non-empty source text")
        with torch.inference_mode():
            output = module.output_ids(module.greedy(torch.tensor([src]))[0].tolist())
        weights = module.attention(src, output)[kind][chosen]
        shown = weights.mean(0) if head is None else weights[head]
        ax.imshow(shown.numpy(), vmin=0, vmax=1, cmap="Blues")
        score = f", val BLEU {bleu:.1f}" if bleu is not None else ""
        ax.set_title(f"step {step}{score}\n{module.tgt_vocab.decode(output)[:40]}", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    which = f"head {head}" if head is not None else "mean of the heads"
    fig.suptitle(f"{text!r}: {kind} attention, layer {layer if layer is not None else 'last'}, "
                 f"{which}, at each checkpoint", fontsize=9)  # fmt: skip
    save_figure(fig, out, bbox_inches="tight")
    print(f"wrote {out}: {len(history)} checkpoints, steps {history[0][0]}-{history[-1][0]}")
    return 0


def aligning(rate: dict) -> str:
    """One layer's (or head's) AER, as --align --gold and --heads print it."""
    which = "mean of its heads" if rate["head"] is None else f"head {rate['head']}"
    return f"cross-attention layer {rate['layer']}, {which}: AER {rate['aer']:.3f}"


def print_alignments(
    path: str, sources: str, references: str | None, layer: int | None, head: int | None,
    gold: str | None = None,
) -> int:  # fmt: skip
    """--align: a line of Pharaoh links a sentence (an empty line for an empty one); with
    --gold, every layer's and head's AER against it instead."""
    from seq2seq.align import alignment_error_rates, pharaoh, read_gold
    from seq2seq.inference import Engine
    from seq2seq.score import read_lines

    engine = Engine(path)
    config = engine.model.module.model.config
    layer = config.num_decoder_layers - 1 if layer is None else layer
    engine.model.module.model.attention_module("cross", layer)  # a one-line error if it lacks it
    if head is not None and not 0 <= head < config.num_heads:
        raise ValueError(f"--head must be in 0-{config.num_heads - 1}, got {head}")
    texts = read_lines(sources)
    targets = read_lines(references) if references else [None] * len(texts)
    if len(targets) != len(texts):
        raise ValueError(
            f"--ref has {len(targets)} lines for {len(texts)} sentences: give one a line"
        )
    if gold is not None:
        golds = read_gold(gold, texts, targets)
        found = alignment_error_rates(engine, texts, targets, Path(gold).name, golds)
        for rate in found["rates"]:
            print(aligning(rate))
        if found["best"] is not None:
            print(f"aligns best ({found['sentences']} pairs): {aligning(found['best'])}")
        return 0
    lines = [pharaoh(engine, t, r, layer, head) if t.strip() else ""
             for t, r in zip(texts, targets, strict=True)]  # fmt: skip
    print("\n".join(lines))
    return 0


def write_atlas(
    path: str, src: str | None, ref: str | None, limit: int, out: str | None,
    split: str = "test", gold: str | None = None,
) -> int:  # fmt: skip
    """--heads: the atlas of path's heads, as heads.json and heads.png."""
    from seq2seq.align import alignment_error_rates, gold_of, read_gold
    from seq2seq.heads import atlas, heads_figure
    from seq2seq.inference import Engine
    from seq2seq.run_dir import RunDir
    from seq2seq.score import read_lines

    run = RunDir.of_checkpoint(path)
    if src is None:
        sources_file = run.path / f"{split}_sources.txt" if run is not None else None
        if sources_file is None or not sources_file.is_file():
            raise ValueError(
                f"{path}'s run wrote no {split}_sources.txt to take pairs from (runs of "
                "earlier releases wrote no validation pairs): give --src FILE --ref FILE"
            )
        src, ref = str(sources_file), str(run.path / f"{split}_references.txt")
    sources, references = read_lines(src)[:limit], read_lines(ref)[:limit]
    engine = Engine(path)
    found = atlas(engine, sources, references)
    saved = run_record(load_checkpoint(path, mmap=True))["run_config"] or {}
    known = gold_of((saved.get("data") or {}).get("corpus") or {})
    if gold is not None:
        task = Path(gold).name
        golds = read_gold(gold, sources, references)
    elif known is not None:  # a task whose construction knows its gold alignment
        task = known[0]
        golds = [known[1](s, r) for s, r in zip(sources, references, strict=True)]
    if gold is not None or known is not None:
        found["alignment"] = alignment_error_rates(engine, sources, references, task, golds)
    directory = Path(out) if out else (run.path if run is not None else Path("."))
    directory.mkdir(parents=True, exist_ok=True)
    with written_whole(directory / "heads.json") as temporary:
        temporary.write_text(json.dumps({"checkpoint": str(Path(path).resolve()), **found},
                                        indent=1), encoding="utf-8")  # fmt: skip
    title = f"{Path(path).name}: {found['pairs']} pairs, greedy BLEU {found['bleu']:.2f}"
    save_figure(heads_figure(found, title), directory / "heads.png", bbox_inches="tight")
    rows = sorted(found["heads"], key=lambda r: r["importance"])
    halves = next((c for c in found["pruning"] if c["removed"] >= len(rows) // 2), None)
    if "alignment" in found and found["alignment"]["best"]:
        print(f"aligns best ({task}'s gold): {aligning(found['alignment']['best'])}")
    print(f"wrote {directory / 'heads.json'} and heads.png: {len(rows)} heads, "
          f"{found['seconds']:.0f} s; least important {rows[0]['kind']}:{rows[0]['layer']}:"
          f"{rows[0]['head']}, most {rows[-1]['kind']}:{rows[-1]['layer']}:{rows[-1]['head']}"
          + (f"; {halves['removed']} heads off: BLEU {halves['bleu']:.2f} (of "
             f"{found['bleu']:.2f})" if halves else ""))  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m seq2seq.inspect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "checkpoints", nargs="+", help="one checkpoint, two with --diff, a run dir with --curves"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--attention", metavar="TEXT", help="draw attention while decoding TEXT")
    parser.add_argument(
        "--grid", nargs="?", const="cross", choices=["cross", "self", "encoder"],
        help="with --attention: every layer and head of one kind (default cross) as small maps",
    )  # fmt: skip
    parser.add_argument(
        "--heads", action="store_true",
        help="the head atlas: every head's importance, roles and the pruning curve, on the "
        "run's test pairs (or --src and --ref); heads.json and heads.png in the run's directory "
        "(or --out DIR)",
    )  # fmt: skip
    parser.add_argument(
        "--align", metavar="FILE",
        help="word alignments (Pharaoh i-j, a line) of FILE's sentences and their greedy outputs "
        "(or --ref's), from cross-attention: --layer (default the last), --head (default mean)",
    )  # fmt: skip
    parser.add_argument(
        "--over-run", action="store_true",
        help="with --attention and a run directory: the attention of TEXT at every checkpoint "
        "the run kept (--kind, --layer, --head), as a strip of heat maps (over_run.png)",
    )  # fmt: skip
    parser.add_argument("--kind", default="cross", choices=["cross", "self", "encoder"],
                        help="--over-run: the attention kind")  # fmt: skip
    parser.add_argument("--layer", type=int, default=None, help="--align, --over-run: the layer")
    parser.add_argument("--head", type=int, default=None, help="--align, --over-run: the head "
                        "(none: the mean of the layer's)")  # fmt: skip
    parser.add_argument("--src", help="--heads: a file of sources, one a line")
    parser.add_argument("--ref", help="--heads, --align: references (targets), one a line")
    parser.add_argument(
        "--gold", metavar="FILE",
        help="--align with --ref, --heads: gold alignments of the pairs (i-j sure, i?j possible, "
        "a line a pair): every layer's and head's AER against them",
    )  # fmt: skip
    parser.add_argument("--limit", type=int, default=500, help="--heads: pairs used, at most")
    parser.add_argument(
        "--split", choices=["test", "validation"], default="test",
        help="--heads: the run's split whose pairs it wrote (default test; validation: what "
        "its validations decoded)",
    )  # fmt: skip
    parser.add_argument("--curves", action="store_true", help="draw a run's training curves")
    parser.add_argument(
        "--out", help="where --attention (attention.png) or --curves (RUN_DIR/curves.png) writes"
    )
    parser.add_argument("--diff", action="store_true", help="compare two checkpoints")
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    args = parser.parse_args(argv)
    if args.diff != (len(args.checkpoints) == 2) or len(args.checkpoints) > 2:
        parser.error("give one checkpoint, or two with --diff")
    if (args.src is None) != (args.ref is None) and args.align is None:
        parser.error("--src and --ref come together: the sources and their references")
    if args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    if args.over_run and args.attention is None:
        parser.error('--over-run draws the attention of a sentence: add --attention "TEXT"')
    if args.gold is not None and (args.ref is None or not (args.align or args.heads)):
        parser.error("--gold scores alignments of given pairs: add --align FILE --ref REFS "
                     "(or --heads --src FILE --ref REFS)")  # fmt: skip
    if args.grid is not None and args.attention is None:
        parser.error('--grid draws the attention of a sentence: add --attention "TEXT"')

    def work() -> int:
        if args.diff:
            lines = diff(*args.checkpoints)
            print("\n".join(lines) if lines else "no differences")
        elif args.curves:
            out = write_curves(args.checkpoints[0], args.out)
            print(f"training curves: {out}")
        elif args.align is not None:
            return print_alignments(args.checkpoints[0], args.align, args.ref, args.layer,
                                    args.head, args.gold)  # fmt: skip
        elif args.heads:
            return write_atlas(args.checkpoints[0], args.src, args.ref, args.limit, args.out,
                               args.split, args.gold)  # fmt: skip
        elif args.over_run:
            return plot_over_run(args.checkpoints[0], args.attention, args.out or "over_run.png",
                                 args.kind, args.layer, args.head)  # fmt: skip
        elif args.attention is not None:
            out = args.out or ("model_view.png" if args.grid else "attention.png")
            return plot_attention(args.checkpoints[0], args.attention, out, args.grid)
        elif args.json:
            print(json.dumps(report(args.checkpoints[0]), indent=2))
        else:
            print_report(report(args.checkpoints[0]))
        return 0

    return run_tool(work, args.debug)


if __name__ == "__main__":
    sys.exit(main())
