"""Fine-tuning against training from scratch: a trained Tatoeba model (`python train.py
experiment=tatoeba_en_fr`) fine-tuned on the joined pairs (init_from=CKPT) against the same
budget from scratch on them, side by side in one sitting.

    python bench/finetune.py outputs/tatoeba_en_fr/runs/<run>              # 10 minutes each
    python bench/finetune.py outputs/tatoeba_en_fr/runs/<run> --budget 5

Honest by construction: the joined pairs (bench/recipe.py's second regime: three Tatoeba pairs
joined into one, about 19 BPE tokens a source sentence) are split here from the trained run's
own split, so the joined test pairs are made of the run's test pairs alone (sentences the model
never trained on) and no joined training or validation pair holds one of them. Both rows then
train on the same joined files with `experiment=parallel_bpe` and the budget; the fine-tuned
row keeps the model's tokenizers and network, the other fits its own. A row whose directory
holds a summary is read, not run again (bench/out/finetune/). Run nothing else meanwhile: the
budget buys what the machine's pace buys.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table
from recipe import (
    CORPUS,
    JOIN,
    ROOT,
    clock_line,
    test_figures,
    train_py,
    training_figures,
    write_joined,
)

OUT = ROOT / "bench" / "out" / "finetune"
HELD_OUT = 3000  # pairs of the run's training side kept for the joined validation split


def joined_from_run(run: Path, out: Path) -> dict[str, Path]:
    """Joined train/validation/test TSV files whose test pairs are the run's test pairs (by
    English sentence, test_sources.txt) and whose other pairs hold none of them."""
    files = {split: out / f"{split}.tsv" for split in ("train", "validation", "test")}
    if all(f.is_file() for f in files.values()):
        return files
    sources = run / "test_sources.txt"
    if not sources.is_file():
        raise SystemExit(f"{run} has no test_sources.txt: give the directory of a finished run")
    test_sentences = set(sources.read_text(encoding="utf-8").splitlines())
    with gzip.open(CORPUS, "rt", encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t")
        pairs = list(dict.fromkeys((row["en"].strip(), row["fr"].strip()) for row in rows))
    test = [p for p in pairs if p[0] in test_sentences]
    rest = [p for p in pairs if p[0] not in test_sentences]
    rng = random.Random(0)
    rng.shuffle(test)
    rng.shuffle(rest)
    out.mkdir(parents=True, exist_ok=True)
    for split, chosen in (("test", test), ("validation", rest[:HELD_OUT]),
                          ("train", rest[HELD_OUT:])):  # fmt: skip
        joined = write_joined(chosen, files[split])
        print(f"{split}: {len(chosen):,} pairs -> {joined:,} joined", flush=True)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished experiment=tatoeba_en_fr run")
    parser.add_argument("--budget", type=float, default=10, help="minutes a row (default 10)")
    args = parser.parse_args()
    import json

    summary = json.loads((args.run / "summary.json").read_text(encoding="utf-8"))
    ckpt = summary["best_checkpoint"]
    files = joined_from_run(args.run, OUT / f"joined{JOIN}-from-{args.run.name}")
    corpus = [f"data.corpus.{split}.file={path}" for split, path in files.items()]
    corpus += ["data.corpus.src_column=en", "data.corpus.tgt_column=fr"]
    max_time = time.strftime("00:%H:%M:%S", time.gmtime(args.budget * 60))
    rows, clocks = [], []
    for name, extra in (("scratch", []), ("fine-tuned", [f"init_from={ckpt}"])):
        run_dir = OUT / f"{args.budget:g}min-{args.run.name}-{name}"
        if not (run_dir / "summary.json").is_file():
            train_py([*corpus, f"trainer.max_time={max_time}", *extra], run_dir)
        figures = {**training_figures(run_dir), **test_figures(run_dir)}
        commit, clock = clock_line(name, run_dir)
        clocks.append(clock)
        val = figures["val_bleu"]
        rows.append([
            name, f"{figures['steps']:,}", figures["epochs"],
            f"{100 * val[0]:.1f} / {100 * val[-1]:.1f}" if val else "-",
            f"{100 * figures['bleu']:.2f}", f"{100 * figures['chrf']:.2f}", commit,
        ])  # fmt: skip
    print(f"\n# joined pairs, {args.budget:g} minutes a row, from {ckpt}")
    print_table(["row", "steps", "epochs", "val BLEU (greedy), first / last", "test BLEU",
                 "test chrF", "commit"], rows)  # fmt: skip
    print("\n".join(clocks))


if __name__ == "__main__":
    main()
