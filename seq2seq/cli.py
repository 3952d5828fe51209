"""What the command-line tools (translate, inspect, average, score, export, serve) share:
one-line errors with an exit code, and signals that stop a tool cleanly.

    error: MESSAGE                      exit 1: bad input or a file that cannot be read or written
    error: MESSAGE (see PROG --help)    exit 2: a bad option (argparse's usage, on one line)
    error: interrupted by Ctrl-C        exit 130
    error: stopped by SIGTERM           exit 143

`--debug` shows the traceback instead. SIGTERM is raised as `Terminated` where the tool is, so
that a file it was writing (seq2seq.files.written_whole) is removed, not left half-written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ArgumentParser", "Terminated", "error_line", "run_tool"]


class Terminated(BaseException):
    """SIGTERM, raised where the tool is so that its `finally` blocks run (Python's default
    for SIGTERM ends the process at once, leaving half-written files behind)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors on one line, as every other error of the project."""

    def error(self, message: str) -> Any:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def error_line(error: BaseException) -> str:
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
        print(f"error: {error_line(error)}", file=sys.stderr)
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
