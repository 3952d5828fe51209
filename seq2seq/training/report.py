"""What a run leaves when it ends: summary.json, the test metrics with their sacreBLEU
signatures, and the commands that use the run (translate, inspect, export, re-score) with its
curves.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from seq2seq.run_dir import RunDir

log = logging.getLogger("train")

__all__ = ["report"]


def report(summary: dict[str, Any], datamodule: Any, model_config: Any) -> None:
    """Write summary.json and print where things are and how to use them (model_config: the
    network's ModelConfig, which decides whether CTranslate2 can run it)."""
    from seq2seq.export import check_exportable  # imports no CTranslate2

    run_dir = Path(summary["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    files = RunDir(run_dir)
    files.summary.write_text(json.dumps(summary, indent=2))
    log.info("Run directory:   %s", run_dir)
    if summary["best_checkpoint"] or not summary["last_checkpoint"]:
        log.info("Best checkpoint: %s", summary["best_checkpoint"])
    else:  # a run shorter than its first validation: its last checkpoint is what it leaves
        log.info("Best checkpoint: none (no validation ranked one)")
        log.info("Last checkpoint: %s (tested)", summary["last_checkpoint"])
    for name, value in summary["test"].items():
        signature = summary["signatures"].get(name.split("/")[-1])
        log.info("%-16s %.4f%s", name + ":", value, f"  ({signature})" if signature else "")
    ckpt = summary["best_checkpoint"] or summary["last_checkpoint"]
    if ckpt:
        example = datamodule.src_vocab.decode(datamodule.splits["test"][0]["src_ids"])
        log.info('Translate with:  python -m seq2seq.translate --ckpt %s "%s"', ckpt, example)
        log.info("Inspect with:    python -m seq2seq.inspect %s", ckpt)
        log.info("Serve with:      python -m seq2seq.serve %s", ckpt)
        try:
            check_exportable(model_config)
        except ValueError as refused:  # the command would only fail: say why instead
            log.info("No export:       %s", refused)
        else:
            log.info("Export with:     python -m seq2seq.export %s --out %s", ckpt, run_dir / "ct2")
    if files.metrics_files():
        from seq2seq.curves import write_curves

        log.info("Curves:          %s", write_curves(run_dir))
    hypotheses = files.test_hypotheses
    if hypotheses.is_file():
        log.info(
            "Re-score with:   python -m seq2seq.score %s %s", hypotheses,
            files.test_references,
        )  # fmt: skip
