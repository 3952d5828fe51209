"""The table of what each test file proves, in docs/guarantees.md, made from tests/.

    python docs/tests_table.py           # rewrite the table in docs/guarantees.md
    python docs/tests_table.py --check   # exit 1 if the table is not what tests/ says

Each row is a tests/test_*.py file: what its docstring says it proves (the first paragraph),
and how many tests it defines (functions named test_*, before parametrization).
tests/test_docs.py runs the check, so the table cannot drift from the files.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from configs_table import ROOT, with_table, write_or_check

PAGE = ROOT / "docs" / "guarantees.md"
BEGIN = "<!-- tests table: made by python docs/tests_table.py; do not edit by hand -->"
END = "<!-- end of tests table -->"


def rows() -> list[tuple[str, str, int]]:
    """(file, what it proves, its tests) for every test file."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        proves = (ast.get_docstring(tree) or "").split("\n\n")[0]
        tests = sum(
            isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            for node in tree.body
        )
        found.append((path.name, " ".join(proves.split()), tests))
    return found


def table() -> str:
    lines = ["| file | tests | what it proves |", "|---|---|---|"]
    for name, proves, tests in rows():
        lines.append(f"| `tests/{name}` | {tests} | {proves.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    what = f"the table of {len(rows())} test files"
    return write_or_check(
        argv, __doc__, PAGE, lambda page: with_table(page, table(), BEGIN, END), what
    )


if __name__ == "__main__":
    sys.exit(main())
