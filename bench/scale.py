"""Cost as the corpus grows: the data preparation of experiment=parallel_bpe on corpora of 10^4,
10^5 and 10^6 pairs (10^7 with --full), each step in a fresh process.

    python bench/scale.py                  # 10^4, 10^5, 10^6 pairs
    python bench/scale.py --sizes 10000 100000
    python bench/scale.py --full           # and 10^7 (a corpus of about 1 GB on disk)

The corpora are made from the shipped Tatoeba file, with nothing downloaded: pair i joins two
or three Tatoeba pairs drawn with a seed, in the order drawn, source with source and target
with target, so that deduplication does not collapse them (76,037 pairs give 4e14 ordered
triples). Each is one TSV file read as `data.corpus.train.file`, validation and test split off
by source sentence as the experiment does. For each size, in fresh processes:

- the first preparation: read, clean, deduplicate, split, fit the shared BPE tokenizer,
  tokenize, lengths (the data module's prepare_data, datasets' cache empty): seconds and peak
  resident memory (the child's ru_maxrss);
- the cache's size on disk (datasets' Arrow files and the tokenizers);
- a cached start: the same preparation again, read from the cache.

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


def make_corpus(size: int, path: Path) -> None:
    """`size` pairs, each two or three Tatoeba pairs joined in the order drawn (seeded)."""
    with gzip.open(TATOEBA, "rt", encoding="utf-8", newline="") as f:
        pairs = [(row["en"], row["fr"]) for row in csv.DictReader(f, delimiter="\t")]
    rng = random.Random(SEED)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8") as out:
        out.write("src\ttgt\n")
        for _ in range(size):
            drawn = [pairs[rng.randrange(len(pairs))] for _ in range(rng.choice((2, 3)))]
            out.write(" ".join(p[0] for p in drawn) + "\t" + " ".join(p[1] for p in drawn) + "\n")
    partial.replace(path)


def prepare(corpus: Path, data_dir: Path) -> dict:
    """In this process: the experiment's data module on `corpus`, prepared; its seconds."""
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(ROOT))
    import train  # noqa: F401  (registers the configs' resolvers)

    overrides = [
        "experiment=parallel_bpe", f"data.corpus.train.file={corpus}", f"paths.data_dir={data_dir}",
    ]  # fmt: skip
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data)
    start = time.perf_counter()
    datamodule.prepare_data()
    seconds = time.perf_counter() - start
    splits = datamodule.splits
    return {"seconds": seconds, "pairs": {name: len(split) for name, split in splits.items()}}


def in_fresh_process(corpus: Path, data_dir: Path) -> dict:
    """prepare() in a new Python process: its result, wall seconds and peak resident bytes."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, __file__, "_prepare", str(corpus), str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"preparing {corpus} failed (exit {child.returncode}); run it alone: "
                         f"python {__file__} _prepare {corpus} {data_dir}")  # fmt: skip
    result = json.loads(out.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - start
    result["peak_rss"] = usage.ru_maxrss * 1024  # KiB on Linux
    return result


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
    if len(sys.argv) == 4 and sys.argv[1] == "_prepare":
        print(json.dumps(prepare(Path(sys.argv[2]), Path(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    parser.add_argument("--full", action="store_true", help="also 10^7 pairs")
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
        data_dir = OUT / f"data-{size}"
        shutil.rmtree(data_dir, ignore_errors=True)  # a first preparation: nothing cached
        first = in_fresh_process(corpus, data_dir)
        cached = in_fresh_process(corpus, data_dir)
        disk = disk_bytes(data_dir)
        figures.append((size, first, cached, disk))
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
    if len(figures) > 1:
        xs = [float(f[0]) for f in figures]
        print("growth exponents between sizes (1: linear):")
        print(f"  first preparation: {slope(xs, [f[1]['seconds'] for f in figures])}")
        print(f"  its peak RSS: {slope(xs, [float(f[1]['peak_rss']) for f in figures])}")
        print(f"  cache on disk: {slope(xs, [float(f[3]) for f in figures])}")
        print(f"  cached start: {slope(xs, [f[2]['seconds'] for f in figures])}")


if __name__ == "__main__":
    main()
