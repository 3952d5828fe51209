"""Reading checkpoints safely: tensors and plain values only, with clear errors.

A checkpoint is a pickle file, and unpickling can run arbitrary code. Everything here reads
with ``torch.load(weights_only=True)``, which accepts tensors, numbers, strings, lists and dicts
and refuses anything else *before* running it. Our checkpoints hold nothing else: the
hyperparameters and the vocabulary are plain values (see Seq2SeqModule).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "load_checkpoint", "load_module", "module_from_checkpoint"]


class CheckpointError(ValueError):
    """A file that is not a readable, safe checkpoint of this project."""


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, read without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a file)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): was its save interrupted?")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, whole or not at all
        raise CheckpointError(
            f"cannot read {path} as a checkpoint: it is truncated or not a file torch.save wrote"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"refusing to load {path}: it holds Python objects other than tensors and plain "
            f"values, and loading them could run code ({first_line})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(
            f"cannot read {path} as a checkpoint (truncated or not a torch file): {error}"
        ) from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= set(
        checkpoint
    ):
        raise CheckpointError(
            f"{path} is not a seq2seq checkpoint: it has no state_dict and hyper_parameters"
        )
    return checkpoint


def load_module(path: str | Path, map_location: str | torch.device = "cpu"):
    """A Seq2SeqModule (in eval mode) rebuilt from a checkpoint alone."""
    return module_from_checkpoint(load_checkpoint(path, map_location), path, map_location)


def module_from_checkpoint(
    checkpoint: dict[str, Any], path: str | Path, map_location: str | torch.device = "cpu"
):
    """A Seq2SeqModule (in eval mode) from a checkpoint dict load_checkpoint returned."""
    from seq2seq.module import Seq2SeqModule

    try:
        module = Seq2SeqModule(**checkpoint["hyper_parameters"])
    except TypeError as error:
        raise CheckpointError(
            f"{path} holds hyperparameters this version cannot use: {error}"
        ) from None
    try:
        missing, unexpected = module.load_state_dict(checkpoint["state_dict"], strict=False)
    except RuntimeError as error:  # a tensor of another shape
        detail = " ".join(str(error).split())
        raise CheckpointError(f"{path} does not match its own model config: {detail}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match its own model config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    return module.to(map_location).eval()
