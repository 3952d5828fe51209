"""Files that appear whole or not at all: whatever the project writes (checkpoints' companions,
splits, exports, averages, atlases, curves) goes through `written_whole`: into a hidden file (or
directory) beside the target, renamed onto it once complete, and removed if anything (a full
disk, Ctrl-C, SIGTERM) stops it first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["written_whole"]


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind an error: torch.save reports a full disk as a RuntimeError raised
    while handling the OSError of the file it writes to."""
    while error is not None and not isinstance(error, OSError):
        error = error.__context__
    return error


def _remove(path: Path) -> None:
    """Remove what a stopped write left, if anything (a read-only disk refuses even to unlink
    a file that is not there)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        with contextlib.suppress(OSError):
            path.unlink()


@contextmanager
def written_whole(path: str | Path, directory: bool = False) -> Iterator[Path]:
    """A hidden path beside `path` to write into (a new directory if `directory`); renamed
    onto `path` when the block ends, removed if it raises (or is interrupted).

    An existing `path` is replaced only once the new one is complete (a directory is moved
    aside, then removed). A failed write raises ValueError naming `path` and the reason.
    """
    path = Path(path)
    part = path.with_name(f".{path.name}.part-{os.getpid()}")
    try:
        if directory:
            part.mkdir()
        yield part
        if directory and path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            part.rename(path)
            _remove(old)
        else:
            os.replace(part, path)
    except (OSError, RuntimeError) as error:
        _remove(part)
        reason = _os_error(error)
        if reason is None:  # not a failed write: a bug to show as it is
            raise
        raise ValueError(
            f"cannot write {path} ({reason.strerror or reason}); nothing was written: free "
            "some space or choose another place"
        ) from None
    except BaseException:
        _remove(part)
        raise
