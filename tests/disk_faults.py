"""Run tools' main() in this process and report each exit code and stderr as JSON.

tests/test_tools_bad_input.py starts this script inside a private mount namespace (`unshare
-m`) where a tiny tmpfs stands for a full disk and a read-only one for a read-only disk, so the
tools meet real ENOSPC and EROFS errors from the kernel; the namespace and its mounts vanish
with the process. Argument: a JSON list of [module, argv] pairs.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys


def main() -> None:
    results = []
    for module, argv in json.loads(sys.argv[1]):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = importlib.import_module(module).main(argv)
        results.append({"code": code, "stderr": err.getvalue()})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
