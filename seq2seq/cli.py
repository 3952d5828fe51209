"""What the command-line tools (translate, inspect, average, score, export) share: one-line
errors with an exit code, signals that stop a tool cleanly, and files that appear whole or
not at all.

    error: MESSAGE                      exit 1: bad input or a file that cannot be read or written
    error: MESSAGE (see PROG --help)    exit 2: a bad option (argparse's usage, on one line)
    error: interrupted by Ctrl-C        exit 130
    error: stopped by SIGTERM           exit 143

`--debug` shows the traceback instead. Whatever a tool writes goes through `written_whole`: into
a hidden file (or directory) beside the target, renamed onto it once complete, and removed if
anything (a full disk, Ctrl-C, SIGTERM) stops it first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["ArgumentParser", "Terminated", "run_tool", "written_whole"]


class Terminated(BaseException):
    """SIGTERM, raised where the tool is so that its `finally` blocks run (Python's default
    for SIGTERM ends the process at once, leaving half-written files behind)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors on one line, as every other error of the project."""

    def error(self, message: str) -> Any:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def describe(error: BaseException) -> str:
    """An error as one line: an OSError as its file and reason, not `[Errno 28] ...`."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    return " ".join(str(error).split())


def run_tool(work: Callable[[], int | None], debug: bool = False) -> int:
    """Run a tool's work and turn its errors and signals into one line and an exit code."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return work() or 0
    except BrokenPipeError:
        # The reader went away (`... | head`): nothing to report, as other Unix tools.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (Python's own advice for this)
        return 128 + signal.SIGPIPE
    except (ValueError, OSError) as error:
        if debug:
            raise
        print(f"error: {describe(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted by Ctrl-C", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated:
        print("error: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
