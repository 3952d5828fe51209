"""The real-text recipe, measured: each choice of `experiment=parallel_bpe` trained under the same
time budget on the shipped Tatoeba corpus, then the decoding choices on one run's checkpoints.

    python bench/recipe.py train base batch256 lr2e-3        # rows by name (ROWS below)
    python bench/recipe.py train mine:model.training.lr=3e-3,data.batch_size=512   # or your own
    python bench/recipe.py train base --budget 30             # minutes of budget per run
    python bench/recipe.py train base --regime joined --every 3   # joined pairs, a third of them
    python bench/recipe.py train base --threads 1             # a machine about half as fast
    python bench/recipe.py train base --slow-start 240        # its first 4 minutes twice as slow
    python bench/recipe.py decode bench/out/recipe/30min-base # greedy, beam, length penalty,
                                                             # averages of the last N checkpoints
    python bench/recipe.py decode RUN --last --only "beam 5, length penalty 1.0" picked  # some

Every row of `train` is `python train.py experiment=parallel_bpe <corpus> trainer.max_time=<budget>
<row's overrides>` in its own process, one at a time (two torch processes on 2 cores slow each
other several times: run nothing else meanwhile); its run directory is
bench/out/recipe/<budget>min-<row>, and a row whose directory holds a summary is read, not run
again, so an interrupted table resumes where it stopped. Each row names the commit it ran at,
and below the table what its clock decided (RUN/clock.json) and the `python train.py
replay=RUN` that trains it again step for step (docs/runs.md). `decode` tests one run's checkpoints
with `train=false` under each decoding setting (beam search costs no training time, so these
rows share one model). The corpus is Tatoeba English-French (data/corpora/tatoeba-en-fr),
validation and test split off by English sentence; `--reverse` trains French to English.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import MODEL_OPTIONS, print_table  # noqa: E402

CORPUS = ROOT / "data" / "corpora" / "tatoeba-en-fr" / "en-fr.tsv.gz"  # ships with the project
OUT = ROOT / "bench" / "out" / "recipe"

# Each row changes one or two things from experiment=parallel_bpe with --common applied (the
# table in docs/results.md pins what the experiment was before the table tuned it: peak lr 1e-3, one
# validation an epoch, no averaging, and warmup 300 steps, the share of an 8-minute run that
# 1,000 steps are of a 30-minute one). Row overrides come after --common and win.
ROWS: dict[str, list[str]] = {
    "base": [],
    "batch64": ["data.batch_size=64"],
    "batch256": ["data.batch_size=256"],
    "batch512": ["data.batch_size=512"],
    "tokens8192": ["data.max_tokens=8192"],  # the batch before it was set in tokens: 128 pairs
    "tokens2560": ["data.max_tokens=2560"],
    "lr2e-3": ["model.training.lr=2e-3"],
    "lr3e-3": ["model.training.lr=3e-3"],
    "batch64-lr2e-3": ["data.batch_size=64", "model.training.lr=2e-3"],
    "lr5e-4": ["model.training.lr=5e-4"],
    "warmup300": ["model.training.warmup_steps=300"],
    "warmup1000": ["model.training.warmup_steps=1000"],
    "warmup3000": ["model.training.warmup_steps=3000"],
    "warmup-share": ["model.training.warmup_share=0.1"],  # the warmup ends by the clock if sooner
    "steps-warmup": ["model.training.warmup_share=null"],  # in steps alone: the recipe before 0.25
    "seed1": ["seed=1", "data.seed=0"],  # a second seed, the same split
    "validations8": ["validations=8"],  # 8 validations by the clock, not twice an epoch
    "inverse_sqrt": ["model.training.schedule=inverse_sqrt"],  # no decay to the deadline
    "bpe4000": ["data.tokenizer.vocab_size=4000"],
    "bpe16000": ["data.tokenizer.vocab_size=16000"],
    "dropout0": ["model.net.dropout=0.0"],
    "dropout0.2": ["model.net.dropout=0.2"],
    "dropout-always": ["model.training.dropout_min_epochs=null"],  # on however few epochs
    "smoothing0": ["model.training.label_smoothing=0.0"],
    "tiny": ["model=tiny", "model.net.max_positions=256"],
    "wide": ["model.net.d_model=384", "model.net.d_ff=1536"],
    "deep": ["model.net.num_encoder_layers=6", "model.net.num_decoder_layers=6"],
    # Depth for width at about the small model's parameters (7.8 M against 7.6 M): 6+6 layers
    # of d_model 192 instead of 3+3 of 256.
    "deep-narrow": [
        "model.net.d_model=192",
        "model.net.d_ff=768",
        "model.net.num_encoder_layers=6",
        "model.net.num_decoder_layers=6",
    ],
    **MODEL_OPTIONS,  # the model options of the 2020s, each alone (docs/results.md)
    # The speed records' methods (issue 49), each off in the recipe until it wins here.
    "qknorm-lr3e-3": ["model.net.qk_norm=true", "model.training.lr=3e-3"],  # norm, higher rate
    "bpe-dropout0.1": ["data.bpe_dropout=0.1"],  # the paper's rate; tokens 8% more on Tatoeba
    "ema": ["callbacks=ema", "callbacks.ema.decay=0.999"],  # an average over ~1,000 steps
    "wsd": ["model.training.schedule=wsd", "model.training.cooldown_share=0.2"],
    # An average with a schedule that stays at its peak until the last fifth.
    "wsd-ema": [
        "model.training.schedule=wsd",
        "model.training.cooldown_share=0.2",
        "callbacks=ema",
        "callbacks.ema.decay=0.999",
    ],
    "muon": ["model.training.optimizer=muon"],  # Muon on the layers' matrices, AdamW's rate
    # The two that gained in every comparison, each within a seed's spread, together.
    "qknorm-muon": [
        "model.net.qk_norm=true",
        "model.training.lr=3e-3",
        "model.training.optimizer=muon",
    ],
    # A deeper encoder with a shallower decoder (Kasai et al. 2021): the decoder runs once a
    # token when validation and test decode, the encoder once a sentence.
    "enc4-dec2": ["model.net.num_encoder_layers=4", "model.net.num_decoder_layers=2"],
    "enc5-dec1": ["model.net.num_encoder_layers=5", "model.net.num_decoder_layers=1"],
    # The options that did not lose alone, together (RMSNorm lost 1.0 BLEU alone).
    "modern": [
        "model.net.activation=swiglu",
        "model.net.positional=rotary",
        "model.net.num_kv_heads=2",
        "model.net.bias=false",
    ],
}


# The second length regime: Tatoeba's pairs joined JOIN at a time into one longer pair (source
# with source, target with target), about 19 BPE tokens a source sentence instead of 6, like
# the 10-30-word sentences of most public corpora. Honest by construction: the pairs are split
# by source sentence first (every pair of a sentence on one side), then shuffled and joined
# within each split, so no test sentence is seen in training, even inside a joined pair.
JOIN = 3
JOINED_HELD_OUT = 3000  # pairs of the file per held-out split: 1,000 joined pairs each
JOINED_SEED = 0


def joined_corpus(reverse: bool) -> dict[str, Path]:
    """The joined regime's train/validation/test TSV files (made once, under bench/out)."""
    import csv
    import gzip
    import random

    src = "fr" if reverse else "en"
    folder = OUT / f"joined{JOIN}-by-{src}"
    files = {split: folder / f"{split}.tsv" for split in ("train", "validation", "test")}
    if all(f.is_file() for f in files.values()):
        return files
    with gzip.open(CORPUS, "rt", encoding="utf-8", newline="") as f:
        pairs = list(
            dict.fromkeys((row["en"], row["fr"]) for row in csv.DictReader(f, delimiter="\t"))
        )
    by_source: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        by_source.setdefault(pair[0 if src == "en" else 1], []).append(pair)
    sources = sorted(by_source)
    rng = random.Random(JOINED_SEED)
    rng.shuffle(sources)
    splits: dict[str, list[tuple[str, str]]] = {"test": [], "validation": [], "train": []}
    for source in sources:
        split = next(
            (s for s in ("test", "validation") if len(splits[s]) < JOINED_HELD_OUT), "train"
        )
        splits[split] += by_source[source]
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        rng.shuffle(rows)
        write_joined(rows, files[split])
    return files


def write_joined(pairs: list[tuple[str, str]], path: Path) -> int:
    """The pairs joined JOIN at a time, in order (a remainder left out), as a TSV file with an
    en/fr header, written whole; returns how many joined pairs."""
    import csv

    joined = [pairs[i : i + JOIN] for i in range(0, len(pairs) - JOIN + 1, JOIN)]
    part = path.with_suffix(".part")
    with part.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["en", "fr"])
        writer.writerows([" ".join(p[0] for p in g), " ".join(p[1] for p in g)] for g in joined)
    part.rename(path)
    return len(joined)


def every_nth(path: Path, every: int) -> Path:
    """Every `every`-th pair of a TSV file, from the first (made once, beside it): a smaller
    corpus of the same sentences, where a budget buys more epochs."""
    if every == 1:
        return path
    made = path.with_name(f"{path.stem}-every{every}.tsv")
    if not made.is_file():
        with path.open("rb") as f:  # lines as csv wrote them: split at b"\n" alone
            header, *rows = f.readlines()
        part = made.with_suffix(".part")
        part.write_bytes(header + b"".join(rows[::every]))
        part.rename(made)
    return made


def corpus_overrides(reverse: bool, regime: str = "tatoeba", every: int = 1) -> list[str]:
    src, tgt = ("fr", "en") if reverse else ("en", "fr")
    columns = [f"data.corpus.src_column={src}", f"data.corpus.tgt_column={tgt}"]
    if regime == "tatoeba":
        return [f"data.corpus.train.file={CORPUS}", *columns]
    files = joined_corpus(reverse)
    files["train"] = every_nth(files["train"], every)
    return [f"data.corpus.{split}.file={path}" for split, path in files.items()] + columns


def parse_row(spec: str) -> tuple[str, list[str]]:
    """'name' (a row of ROWS) or 'name:key=value,key=value' (your own)."""
    name, _, overrides = spec.partition(":")
    if overrides:
        return name, overrides.split(",")
    if name not in ROWS:
        raise SystemExit(f"unknown row {name!r}: pick from {', '.join(ROWS)} or name:k=v,k=v")
    return name, ROWS[name]


def train_py(overrides: list[str], run_dir: Path, threads: int | None = None) -> float:
    """Run train.py with these overrides into run_dir (on `threads` CPU threads, or torch's
    default; bench/ on its PYTHONPATH for bench/slow_start.py); returns the wall time in
    seconds."""
    if run_dir.exists():  # a row stopped before its summary: start it again from nothing
        shutil.rmtree(run_dir)
    log = run_dir.parent / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "train.py", "experiment=parallel_bpe", *overrides,
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    with log.open("w") as f:
        path = os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        env.update({"OMP_NUM_THREADS": str(threads)} if threads else {})
        done = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"train.py failed ({done.returncode}): see {log}")
    return time.perf_counter() - start


def training_figures(run_dir: Path) -> dict[str, float]:
    """Steps, epochs, training seconds, validation BLEU by epoch and parameters of one run."""
    import torch

    rows = []
    for path in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        with path.open() as f:
            rows += list(csv.DictReader(f))
    steps = max(int(r["step"]) for r in rows if r.get("step"))
    seconds = max(float(r["time/train_s"]) for r in rows if r.get("time/train_s"))
    val_bleu = [float(r["val/bleu"]) for r in rows if r.get("val/bleu")]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    storages = {t.untyped_storage().data_ptr(): t.numel() for t in ckpt["state_dict"].values()}
    return {
        "steps": steps,
        "epochs": ckpt["epoch"] + 1,
        "train_s": seconds,
        "val_bleu": val_bleu,
        "params_m": sum(storages.values()) / 1e6,
    }


def test_figures(run_dir: Path) -> dict[str, float]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"bleu": summary["test"]["test/bleu"], "chrf": summary["test"]["test/chrf"]}


def clock_line(name: str, run_dir: Path) -> tuple[str, str]:
    """(the commit a row ran at, one line of what its clock decided and how to replay it),
    from RUN/clock.json (seq2seq.training.clock)."""
    from seq2seq.training.clock import read_record

    try:
        record = read_record(run_dir)
    except ValueError as error:
        return "-", f"{name}: cannot be replayed ({error})"
    commit = record.commit or "-"  # sha (40 hex digits), "-dirty" if files were changed
    short = commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")
    validations = ", ".join(f"{step:,}" for step in record.validations)
    return short, (
        f"{name}: validated at steps {validations}; warmup ended at {record.warmup_ended_at}, "
        f"dropout off at {record.dropout_off_at}, stopped at {record.stopped_at}; "
        f"python train.py replay={run_dir}"
    )


def train_rows(
    specs: list[str], budget: float, reverse: bool, common: list[str], regime: str, every: int,
    threads: int | None = None, slow_start: float | None = None,
) -> None:  # fmt: skip
    tag = "".join("-" + c.rpartition(".")[2].replace("=", "") for c in common)  # warmup_steps300
    if slow_start:  # bench/slow_start.py: the first slow_start seconds of training at half pace
        common = [*common, "+callbacks.slow_start._target_=slow_start.SlowStart",
                  f"+callbacks.slow_start.seconds={slow_start:g}"]  # fmt: skip
        tag += f"-slow{slow_start:g}s"
    regime_tag = "" if regime == "tatoeba" else f"-{regime}{JOIN}"
    regime_tag += f"-every{every}" if every != 1 else ""
    regime_tag += f"-threads{threads}" if threads else ""
    minutes = f"{budget:g}min" + ("-fr-en" if reverse else "") + regime_tag + tag
    max_time = time.strftime("00:%H:%M:%S", time.gmtime(budget * 60))
    table, clocks = [], []
    for spec in specs:
        name, overrides = parse_row(spec)
        run_dir = OUT / f"{minutes}-{name}"
        if not (run_dir / "summary.json").is_file():
            corpus = corpus_overrides(reverse, regime, every)
            wall = train_py([*corpus, f"trainer.max_time={max_time}", *common, *overrides],
                            run_dir, threads)  # fmt: skip
            (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
        figures = {**training_figures(run_dir), **test_figures(run_dir)}
        wall = float((run_dir / "wall_s.txt").read_text())
        commit, clock = clock_line(name, run_dir)
        clocks.append(clock)
        table.append([
            name, " ".join(overrides) or "(experiment as is)", f"{figures['params_m']:.1f}",
            f"{figures['steps']:,}", figures["epochs"], f"{figures['train_s']:.0f}",
            f"{wall:.0f}", f"{100 * figures['val_bleu'][-1]:.1f}" if figures["val_bleu"] else "-",
            f"{100 * figures['bleu']:.2f}", f"{100 * figures['chrf']:.2f}", commit,
        ])  # fmt: skip
        print(f"{name}: {figures}", flush=True)
    direction = ("fr->en" if reverse else "en->fr") + f", {regime} regime"
    direction += f", one training pair in {every}" if every != 1 else ""
    direction += f", {threads} CPU thread{'s' * (threads > 1)}" if threads else ""
    direction += f", the first {slow_start:g} s of training twice as slow" if slow_start else ""
    print(
        f"\nBudget {budget:g} min a run ({direction}), every row with {common or 'nothing'} added"
    )
    print_table(
        ["row", "overrides", "params (M)", "steps", "epochs", "train s", "wall s",
         "val BLEU (greedy)", "test BLEU", "test chrF", "commit"],
        table,
    )  # fmt: skip
    print("\nWhat each row's clock decided (RUN/clock.json), and the command that replays it:")
    print("\n".join(clocks))


def search(beam: int, length_penalty: float | None = None) -> list[str]:
    """The overrides of a decoding row: beam width and length penalty."""
    given = [f"model.decoding.beam_size={beam}"]
    if length_penalty is not None:
        given.append(f"model.decoding.length_penalty={length_penalty}")
    return given


PENALTIES = (0.6, 0.8, 1.0, 1.2, 1.4)  # the length penalties decode tests, and picks among


def decode_rows(
    run_dir: Path, reverse: bool, last: list[int], regime: str, only: list[str] | None = None
) -> None:
    """Test one run's checkpoints under each decoding setting, and averages of its last N;
    with `only`, just the settings whose label holds one of these words."""
    from seq2seq.average import recent_checkpoints, write_average

    best = json.loads((run_dir / "summary.json").read_text())["best_checkpoint"]
    settings: list[tuple[str, str, list[str]]] = [
        ("greedy", best, search(1)),
        *((f"beam 5, length penalty {lp}", best, search(5, lp)) for lp in PENALTIES),
        ("beam 10, length penalty 1.0", best, search(10, 1.0)),
        # The test with the length penalty validation picks (pick_search), from PENALTIES.
        ("beam 5, picked on validation", best, [
            "pick_search.beam_sizes=[5]",
            f"pick_search.length_penalties=[{','.join(map(str, PENALTIES))}]",
        ]),
    ]  # fmt: skip
    for n in last:
        averaged = run_dir / "checkpoints" / f"bench-average-last{n}.ckpt"
        if not averaged.is_file():
            write_average(recent_checkpoints(run_dir, n), averaged)
        settings.append((f"average of last {n}, beam 5, lp 1.0", str(averaged),
                         search(5, 1.0)))  # fmt: skip
    if only:
        settings = [row for row in settings if any(word in row[0] for word in only)]
        if not settings:
            raise SystemExit(f"--only {' '.join(only)}: no decoding setting's label holds it")
    table = []
    for label, ckpt, overrides in settings:
        eval_dir = run_dir / "decode" / label.replace(" ", "").replace(",", "-")
        if not (eval_dir / "summary.json").is_file():
            wall = train_py([*corpus_overrides(reverse, regime), "train=false", f"ckpt_path={ckpt}",
                             *overrides], eval_dir)  # fmt: skip
            (eval_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
        figures = test_figures(eval_dir)
        wall = float((eval_dir / "wall_s.txt").read_text())
        picked = json.loads((eval_dir / "summary.json").read_text()).get("picked_search")
        if picked:  # which penalty validation picked, and its validation score
            choice = picked["picked"]
            label += (f" ({choice['length_penalty']:g}: validation {picked['metric']} "
                      f"{100 * choice[picked['metric']]:.2f})")  # fmt: skip
        table.append([label, Path(ckpt).name, f"{100 * figures['bleu']:.2f}",
                      f"{100 * figures['chrf']:.2f}",
                      f"{wall:.0f}"])  # fmt: skip
    direction = "fr->en" if reverse else "en->fr"
    print(f"\nDecoding {run_dir.name}'s checkpoints ({direction} test split)")
    headers = ["decoding", "checkpoint", "test BLEU", "test chrF", "wall s (whole command)"]
    print_table(headers, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train rows under one budget, one after another")
    train.add_argument("rows", nargs="+", help=f"names ({', '.join(ROWS)}) or name:k=v,k=v")
    train.add_argument("--budget", type=float, default=10, help="minutes a run (default 10)")
    train.add_argument("--common", nargs="*", default=[], help="overrides for every row (first)")
    train.add_argument("--every", type=int, default=1, help="train on every Nth training pair "
                       "of the joined regime, where a budget buys N times the epochs")  # fmt: skip
    train.add_argument("--threads", type=int, default=None, help="CPU threads a run "
                       "(OMP_NUM_THREADS; default torch's): fewer, a slower machine")  # fmt: skip
    train.add_argument("--slow-start", type=float, default=None, metavar="SECONDS",
                       help="every training step twice as slow for the first SECONDS of "
                       "training, as on a machine busy with other work "
                       "(bench/slow_start.py)")  # fmt: skip
    decode = sub.add_parser("decode", help="decoding settings on one run's checkpoints")
    decode.add_argument("run_dir", type=Path)
    decode.add_argument("--last", type=int, nargs="*", default=[2, 4], help="averages to test")
    decode.add_argument("--only", nargs="*", help="the settings whose label holds one of these "
                        "(e.g. 'beam 5, length penalty 1.0' picked)")  # fmt: skip
    for p in (train, decode):
        p.add_argument("--reverse", action="store_true", help="French to English")
        p.add_argument("--regime", choices=("tatoeba", "joined"), default="tatoeba",
                       help=f"tatoeba: the shipped pairs as they are (about 6 tokens a "
                       f"sentence); joined: {JOIN} pairs joined into one (about 19)")  # fmt: skip
    args = parser.parse_args()
    if not CORPUS.is_file():
        raise SystemExit(f"the shipped corpus is missing: {CORPUS} (a clone of the project has it)")
    if args.command == "train":
        # Tatoeba's validation and test pairs are split off its training file: a part of the
        # file would split them differently. The joined regime's held-out files stay whole.
        if args.every < 1 or (args.every > 1 and args.regime != "joined"):
            raise SystemExit(f"--every {args.every}: give a whole number of at least 1, and "
                             "more than 1 only with --regime joined")  # fmt: skip
        if args.threads is not None and args.threads < 1:
            raise SystemExit(f"--threads {args.threads}: give a whole number of at least 1")
        if args.slow_start is not None and args.slow_start <= 0:
            raise SystemExit(f"--slow-start {args.slow_start:g}: give seconds above 0")
        train_rows(args.rows, args.budget, args.reverse, args.common, args.regime, args.every,
                   args.threads, args.slow_start)  # fmt: skip
    else:
        decode_rows(args.run_dir, args.reverse, args.last, args.regime, args.only)


if __name__ == "__main__":
    main()
