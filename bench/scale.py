"""Cost as the corpus grows: the data preparation of experiment=parallel_bpe on corpora of 10^4,
10^5 and 10^6 pairs (10^7 with --full), each step in a fresh process.

    python bench/scale.py                  # 10^4, 10^5, 10^6 pairs
    python bench/scale.py --sizes 10000 100000
    python bench/scale.py --full           # and 10^7 (a corpus of about 1 GB on disk)
    python bench/scale.py --full --streaming   # the same corpora with data.corpus.streaming=true

About 12 minutes on the Zen 5 of docs/machines.md, 22 with --full (docs/data.md has its figures).

The corpora are made from the shipped Tatoeba file, with nothing downloaded: pair i joins two
or three Tatoeba pairs drawn with a seed, in the order drawn, source with source and target
with target, so that deduplication does not collapse them (76,037 pairs give 4e14 ordered
triples). Each is one TSV file read as `data.corpus.train.file`, validation and test split off
by source sentence as the experiment does. For each size, in fresh processes:

- the first preparation: read, clean, deduplicate, split, fit the shared BPE tokenizer,
  tokenize, lengths (the data module's prepare_data, datasets' cache empty): seconds and peak
  resident memory (the child's ru_maxrss);
- the cache's size on disk (datasets' Arrow files and the tokenizers);
- a cached start: the same preparation again, read from the cache;
- training (--steps, 200): `python train.py` on the cached data for that many steps, with the
  time from the process's start to its first step, steps a second and resident memory at the
  first and last step; then the same run stopped by SIGTERM at half the steps and resumed with
  `resume=RUN`: the time to its first step, and whether every step's loss and every final
  weight equal the uninterrupted run's (bench/scale_clock.py records the steps).

With --streaming, the training split is read as it trains (data.corpus.streaming=true,
seq2seq/data/stream.py): a first start indexes the file and fits the tokenizer on a sample of
its blocks, and the cache holds that index and the held-out pairs; validation and test are a
file of 1,000 other pairs made the same way (another seed), deduplication off.

It prints a table and each measure's growth exponent between sizes (the slope of log time
against log size: 1 is linear). Nothing is asserted; run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table  # noqa: E402

TATOEBA = ROOT / "data" / "corpora" / "tatoeba-en-fr" / "en-fr.tsv.gz"
OUT = ROOT / "bench" / "out" / "scale"
SEED = 0


HELD_OUT = 1000  # pairs of a streamed corpus's validation and test file


def held_out(corpus: Path) -> Path:
    """The validation and test file of a streamed corpus."""
    return corpus.with_name(corpus.stem + "-held.tsv")


def streamed(corpus: Path | None) -> list[str]:
    """The overrides that stream `corpus` (None: not streamed)."""
    if corpus is None:
        return []
    return ["data.corpus.streaming=true", "data.dedupe=false",
            f"data.corpus.validation.file={held_out(corpus)}",
            f"data.corpus.test.file={held_out(corpus)}"]  # fmt: skip


def make_corpus(size: int, path: Path, seed: int = SEED) -> None:
    """`size` pairs, each two or three Tatoeba pairs joined in the order drawn (seeded)."""
    with gzip.open(TATOEBA, "rt", encoding="utf-8", newline="") as f:
        pairs = [(row["en"], row["fr"]) for row in csv.DictReader(f, delimiter="\t")]
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8") as out:
        out.write("src\ttgt\n")
        for _ in range(size):
            drawn = [pairs[rng.randrange(len(pairs))] for _ in range(rng.choice((2, 3)))]
            out.write(" ".join(p[0] for p in drawn) + "\t" + " ".join(p[1] for p in drawn) + "\n")
    partial.replace(path)


def prepare(corpus: Path, data_dir: Path, streaming: bool) -> dict:
    """In this process: the experiment's data module on `corpus`, prepared; its seconds."""
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(ROOT))
    import train  # noqa: F401  (registers the configs' resolvers)

    overrides = [
        "experiment=parallel_bpe", f"data.corpus.train.file={corpus}", f"paths.data_dir={data_dir}",
        *streamed(corpus if streaming else None),
    ]  # fmt: skip
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data)
    start = time.perf_counter()
    datamodule.prepare_data()
    seconds = time.perf_counter() - start
    pairs = {name: len(split) for name, split in datamodule.splits.items()}
    if streaming:  # lines: a stream's pairs are counted as it trains
        pairs["train"] = datamodule.train_blocks.lines
    return {
        "seconds": seconds,
        "pairs": pairs,
        "phases": datamodule.phases.timings,
    }


def in_fresh_process(corpus: Path, data_dir: Path, streaming: bool) -> dict:
    """prepare() in a new Python process: its result, wall seconds and peak resident bytes."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, __file__, "_prepare", str(corpus), str(data_dir), str(int(streaming))],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        alone = f"python {__file__} _prepare {corpus} {data_dir} {int(streaming)}"
        raise SystemExit(
            f"preparing {corpus} failed (exit {child.returncode}); run it alone: {alone}"
        )
    result = json.loads(out.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - start
    result["peak_rss"] = usage.ru_maxrss * 1024  # KiB on Linux
    return result


def _phase(result: dict, phase: str) -> str:
    entry = result["phases"].get(phase)
    return f"{entry['seconds']:.2f} ({entry['peak_rss'] / 2**30:.2f})" if entry else "-"


TRAIN = [
    "trainer.max_steps={steps}", "validations=null", "trainer.limit_val_batches=0",
    "callbacks.model_checkpoint.monitor=null", "test=false", "trainer.log_every_n_steps=1",
    "logger=csv", "+callbacks.scale_clock._target_=scale_clock.StepClock",
]  # fmt: skip


def run_train(args: list[str], cwd: Path, clock: Path, sigterm_at: int = 0) -> dict:
    """`python train.py ARGS` in a fresh process: its exit status, and the steps StepClock
    recorded (when each ended, the memory then), with seconds from the process's start."""
    clock.unlink(missing_ok=True)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "bench"), "SCALE_CLOCK_OUT": str(clock),
           "SCALE_CLOCK_SIGTERM_AT": str(sigterm_at)}  # fmt: skip
    start = time.time()
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    steps = [json.loads(line) for line in clock.read_text().splitlines()] if clock.exists() else []
    for step in steps:
        step["seconds"] = step.pop("time") - start
    return {"returncode": done.returncode, "steps": steps, "output": done.stdout + done.stderr}


def losses(run_dir: Path) -> dict[int, float]:
    """train/loss_step by step over every start of the run (csv/version_*)."""
    found: dict[int, float] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("train/loss_step"):
                    found[int(row["step"])] = float(row["train/loss_step"])
    return found


def train_and_resume(size: int, corpus: Path, data_dir: Path, steps: int, streaming: bool) -> dict:
    """STEPS training steps on the prepared corpus, uninterrupted; then the same run stopped by
    SIGTERM at half of them and resumed with resume=RUN. Exact when every step's loss and
    every final weight are the same."""
    import torch

    work = OUT / f"train-{size}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    common = ["experiment=parallel_bpe", f"data.corpus.train.file={corpus}",
              f"paths.data_dir={data_dir}", *(a.format(steps=steps) for a in TRAIN)]  # fmt: skip
    if streaming:  # no epoch end: validation (none here, limit_val_batches=0) by steps
        common += [*streamed(corpus), f"trainer.val_check_interval={steps}"]
    whole = run_train([*common, f"hydra.run.dir={work / 'whole'}"], work, work / "whole.jsonl")
    half = steps // 2
    stopped = run_train([*common, f"hydra.run.dir={work / 'stopped'}"], work,
                        work / "stopped.jsonl", sigterm_at=half)  # fmt: skip
    resumed = run_train([f"resume={work / 'stopped'}"], work, work / "resumed.jsonl")
    for name, run, code in (("uninterrupted", whole, 0), ("stopped", stopped, 143),
                            ("resumed", resumed, 0)):  # fmt: skip
        if run["returncode"] != code or not run["steps"]:
            raise SystemExit(f"the {name} run at {size:,} pairs exited {run['returncode']}: "
                             f"{run['output'][-2000:]}")  # fmt: skip

    def weights(name: str) -> dict:
        path = work / name / "checkpoints" / "last.ckpt"
        return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]

    a, b = weights("whole"), weights("stopped")
    same_weights = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first, last = whole["steps"][0], whole["steps"][-1]
    return {
        "first_step_s": first["seconds"],
        "steps_per_s": (last["step"] - first["step"]) / (last["seconds"] - first["seconds"]),
        "rss_first": first["rss"], "rss_last": last["rss"], "peak_rss": last["peak_rss"],
        "anon_first": first["anon"], "anon_last": last["anon"],
        "resume_first_step_s": resumed["steps"][0]["seconds"],
        "resumed_at": resumed["steps"][0]["step"] - 1,
        "exact": same_weights and losses(work / "whole") == losses(work / "stopped")
        and len(losses(work / "whole")) == steps,
    }  # fmt: skip


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def slope(xs: list[float], ys: list[float]) -> str:
    """The growth exponent between consecutive sizes: log(y2/y1) / log(x2/x1)."""
    points = list(zip(xs, ys, strict=True))
    parts = [
        f"{math.log(y2 / y1) / math.log(x2 / x1):.2f}"
        for (x1, y1), (x2, y2) in itertools.pairwise(points)
        if y1 > 0 and y2 > 0
    ]
    return ", ".join(parts) or "-"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "_prepare":
        print(json.dumps(prepare(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1")))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    parser.add_argument("--full", action="store_true", help="also 10^7 pairs")
    parser.add_argument("--streaming", action="store_true", help="data.corpus.streaming=true")
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="training steps at each size, SIGTERM at half then resume (0: none)",
    )
    args = parser.parse_args()
    sizes = sorted(set(args.sizes + ([10**7] if args.full else [])))
    if any(size < 4000 for size in sizes):
        raise SystemExit(f"--sizes {sizes}: give 4,000 pairs or more (2,000 are held out)")
    rows, figures = [], []
    for size in sizes:
        corpus = OUT / f"pairs-{size}.tsv"
        if not corpus.is_file():
            print(f"making {corpus} ...", flush=True)
            make_corpus(size, corpus)
        if args.streaming and not held_out(corpus).is_file():
            make_corpus(HELD_OUT, held_out(corpus), seed=SEED + 1)
        data_dir = OUT / f"data-{size}{'-streamed' if args.streaming else ''}"
        shutil.rmtree(data_dir, ignore_errors=True)  # a first preparation: nothing cached
        first = in_fresh_process(corpus, data_dir, args.streaming)
        cached = in_fresh_process(corpus, data_dir, args.streaming)
        disk = disk_bytes(data_dir)
        trained = (
            train_and_resume(size, corpus, data_dir, args.steps, args.streaming)
            if args.steps else None
        )  # fmt: skip
        figures.append((size, first, cached, disk, trained))
        rows.append([
            f"{size:,}", f"{first['pairs']['train']:,}", f"{first['seconds']:.1f}",
            f"{first['peak_rss'] / 2**30:.2f}", f"{disk / 2**20:,.0f}",
            f"{cached['seconds']:.1f}", f"{cached['wall']:.1f}",
            f"{cached['peak_rss'] / 2**30:.2f}",
        ])  # fmt: skip
        print(f"{size:,} pairs: {json.dumps({'first': first, 'cached': cached, 'disk': disk})}",
              flush=True)  # fmt: skip
    print_table(
        ["pairs", "train pairs", "first preparation s", "its peak RSS GiB", "cache MiB",
         "cached start: data s", "cached start: process s", "its peak RSS GiB"],
        rows,
    )  # fmt: skip
    if args.steps:
        print(
            f"training, {args.steps} steps (the data cached): the process's start to its first "
            f"step, pace, memory; SIGTERM at step {args.steps // 2}, then resume=RUN"
        )
        print_table(
            ["pairs", "to first step s", "steps/s", "RSS (anonymous) at first step GiB",
             f"RSS (anonymous) at step {args.steps} GiB", "peak RSS GiB",
             "resume: to first step s", "resumed at step", "resume exact"],
            [[f"{f[0]:,}", f"{t['first_step_s']:.1f}", f"{t['steps_per_s']:.2f}",
              f"{t['rss_first'] / 2**30:.2f} ({t['anon_first'] / 2**30:.2f})",
              f"{t['rss_last'] / 2**30:.2f} ({t['anon_last'] / 2**30:.2f})",
              f"{t['peak_rss'] / 2**30:.2f}", f"{t['resume_first_step_s']:.1f}",
              str(t["resumed_at"]), "yes" if t["exact"] else "NO"]
             for f in figures if (t := f[4])],
        )  # fmt: skip
    phases = list(dict.fromkeys(p for f in figures for p in f[1]["phases"]))
    print("the first preparation by phase: seconds (peak RSS GiB at its end)")
    print_table(
        ["phase", *(f"{f[0]:,}" for f in figures), "growth"],
        [[phase, *(_phase(f[1], phase) for f in figures),
          slope([float(f[0]) for f in figures],
                [f[1]["phases"].get(phase, {}).get("seconds", 0.0) for f in figures])]
         for phase in phases],
    )  # fmt: skip
    if len(figures) > 1:
        xs = [float(f[0]) for f in figures]
        print("growth exponents between sizes (1: linear):")
        print(f"  first preparation: {slope(xs, [f[1]['seconds'] for f in figures])}")
        print(f"  its peak RSS: {slope(xs, [float(f[1]['peak_rss']) for f in figures])}")
        print(f"  cache on disk: {slope(xs, [float(f[3]) for f in figures])}")
        print(f"  cached start: {slope(xs, [f[2]['seconds'] for f in figures])}")


if __name__ == "__main__":
    main()
