"""Average the weights of checkpoints of one run: a cheap ensemble that usually scores better
than any one of them (Vaswani et al. averaged the last 5 or 20; fairseq, OpenNMT-py and JoeyNMT
ship the same tool).

    python -m seq2seq.average a.ckpt b.ckpt c.ckpt --out avg.ckpt
    python -m seq2seq.average --last 5 outputs/train/runs/<run>      # its newest 5 recent-*.ckpt

The average loads wherever a checkpoint does: translate, inspect and `train=false` evaluation.
It holds the weights (the mean of each floating-point tensor), the newest checkpoint's
hyperparameters, vocabularies and run config, and the list of files averaged; no optimizer
state, so a run cannot be resumed from it. A run keeps the checkpoints of its last N
validations with `average_last=N`, and then tests their average.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint import CheckpointError, carry_run_record, load_checkpoint
from seq2seq.cli import ArgumentParser, run_tool
from seq2seq.files import written_whole
from seq2seq.run_dir import RunDir

log = logging.getLogger("train")  # average_last_validations reports in the run's log
RECENT = "recent-step*.ckpt"  # configs/callbacks/default.yaml: recent_checkpoints


def newest_recent(run_dir: str | Path, n: int) -> list[Path]:
    """Up to n of the newest checkpoints the run kept at its validations (oldest first)."""
    return sorted(RunDir(run_dir).checkpoints.glob(RECENT))[-n:]


def recent_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """Exactly the newest n checkpoints the run kept at its validations (oldest first)."""
    if n < 1:
        raise ValueError(f"--last must be at least 1, got {n}")
    found = newest_recent(run_dir, n)
    if len(found) < n:
        raise ValueError(
            f"{run_dir} has {len(found)} checkpoint(s) of its last validations ({RECENT}), not "
            f"{n}: train with average_last={n} to keep them, or give the checkpoints by name"
        )
    return found


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """A checkpoint whose weights are the mean of the given checkpoints' weights."""
    if not paths:
        raise ValueError("give at least one checkpoint to average")
    checkpoints = [load_checkpoint(path) for path in paths]
    first, newest = checkpoints[0], max(checkpoints, key=lambda c: c.get("global_step", 0))
    for path, checkpoint in zip(paths[1:], checkpoints[1:], strict=True):
        _check_same_model(paths[0], first, path, checkpoint)
    state: dict[str, torch.Tensor] = {}
    for key, tensor in first["state_dict"].items():
        tensors = [c["state_dict"][key] for c in checkpoints]
        if tensor.is_floating_point():
            # Summed in float64: the mean of many bf16 or fp16 tensors keeps its precision.
            mean = torch.stack([t.double() for t in tensors]).mean(0)
            state[key] = mean.to(tensor.dtype)
        else:  # integer buffers (counters, masks) are the newest checkpoint's
            state[key] = newest["state_dict"][key]
    kept = ("epoch", "global_step", "pytorch-lightning_version", "hyper_parameters")
    averaged = {key: newest[key] for key in kept if key in newest}
    carry_run_record(newest, averaged)
    averaged["state_dict"] = state
    averaged["averaged_from"] = [str(Path(p).resolve()) for p in paths]
    return averaged


def _check_same_model(path_a: Any, a: dict, path_b: Any, b: dict) -> None:
    hp_a, hp_b = a["hyper_parameters"], b["hyper_parameters"]
    for key in ("net", "src_vocab", "tgt_vocab"):
        if hp_a.get(key) != hp_b.get(key):
            raise CheckpointError(
                f"{path_a} and {path_b} are of different models (their {key} differs): "
                "average checkpoints of one run"
            )
    if a["state_dict"].keys() != b["state_dict"].keys():
        raise CheckpointError(f"{path_a} and {path_b} hold different tensors")


def write_average(paths: Sequence[str | Path], out: str | Path) -> Path:
    out = Path(out)
    if out.resolve() in {Path(p).resolve() for p in paths}:
        raise ValueError(f"--out {out} is one of the checkpoints to average: choose a new file")
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory: give the file to write, e.g. {out}/avg.ckpt")
    averaged = average_checkpoints(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(out) as part, part.open("wb") as f:  # whole or not at all
        torch.save(averaged, f)  # through a file object: a full disk is an OSError then
    return out


def average_last_validations(run_dir: Path, n: int, trainer: Any) -> str | None:
    """The average of the run's last n validation checkpoints (fewer if it validated fewer
    times), written beside them by rank 0; None if there are none."""
    paths = newest_recent(run_dir, n)
    if not paths:
        log.warning("average_last=%d: no validation checkpoints; testing the best one", n)
        return None
    if len(paths) < n:
        log.warning("average_last=%d: only %d validations; averaging those", n, len(paths))
    out = RunDir(run_dir).average(len(paths))
    if trainer.is_global_zero:
        write_average(paths, out)
        log.info("Averaged the last %d validation checkpoints into %s", len(paths), out)
    trainer.strategy.barrier()
    return str(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m seq2seq.average",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", help="checkpoints, or with --last one run directory")
    parser.add_argument("--last", type=int, help="average the run's newest N recent-*.ckpt")
    parser.add_argument("--out", help="the averaged checkpoint (with --last: "
                        "RUN_DIR/checkpoints/average-lastN.ckpt)")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)

    def work() -> None:
        if args.last is not None:
            if len(args.paths) != 1:
                raise ValueError(f"--last takes one run directory, got {len(args.paths)} paths")
            paths: list[Any] = recent_checkpoints(args.paths[0], args.last)
            default = RunDir(args.paths[0]).average(args.last)
            out = args.out or default
        else:
            if args.out is None:
                raise ValueError("give the file to write: --out FILE")
            paths, out = args.paths, args.out
        written = write_average(paths, out)
        print(f"averaged {len(paths)} checkpoints into {written}")

    return run_tool(work, args.debug)


if __name__ == "__main__":
    sys.exit(main())
