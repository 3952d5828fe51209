"""The table of every config group and option in docs/configuration.md, made from configs/.

    python docs/configs_table.py           # rewrite the table in docs/configuration.md
    python docs/configs_table.py --check   # exit 1 if the table is not what configs/ says

Each group comes from configs/train.yaml's defaults list (its comment says what the group
selects), each option is a file of the group's folder, and what an option is comes from the
comment the file starts with. tests/test_docs.py runs the check, so the
table cannot drift from the files.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- configs table: made by python docs/configs_table.py; do not edit by hand -->"
END = "<!-- end of configs table -->"


def description(path: Path) -> str:
    """What a config file says it is: the comment it starts with (Hydra's `# @package` line
    left out), as one line, up to the first example command ("For example:" dropped)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text or text.startswith(("python ", "srun ")):
            break
        if not line.startswith("# @package"):
            lines.append(text)
    said = " ".join(lines).removesuffix("For example:").strip()
    return said.removesuffix(":").replace("|", "\\|")


def groups() -> list[tuple[str, str | None, str]]:
    """(group, its default option or None, what it selects), from train.yaml's defaults."""
    found = []
    for line in (CONFIGS / "train.yaml").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s+- (\w+): (\w+)\s+# (.*)", line)
        if match and (CONFIGS / match[1]).is_dir():
            default = None if match[2] == "null" else match[2]
            found.append((match[1], default, match[3]))
    return found


def table() -> str:
    rows = ["| group | option | what it is |", "|---|---|---|"]
    for group, default, selects in groups():
        rows.append(f"| **`{group}`** | | {selects} |")
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            option = f"`{group}={path.stem}`" + (" (default)" if path.stem == default else "")
            rows.append(f"| | {option} | {description(path)} |")
    return "\n".join(rows)


def with_table(page: str, made: str, begin: str = BEGIN, end: str = END) -> str:
    """page with what stands between its markers replaced by made."""
    if begin not in page or end not in page:
        raise ValueError(f"no table markers: put {begin!r} and {end!r} where it goes")
    head, rest = page.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{made}\n{end}{tail}"


def write_or_check(argv: list[str] | None, doc: str, page_path: Path, made: Any, what: str) -> int:
    """A table script's command line: write made(page) into page_path, or with --check exit 1
    if the page is not what it would write."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check, do not write")
    args = parser.parse_args(argv)
    page = page_path.read_text(encoding="utf-8")
    new = made(page)
    if args.check:
        if new != page:
            script = Path(sys.argv[0]).name if sys.argv else "the table script"
            print(f"{page_path} is out of date: run python docs/{script}", file=sys.stderr)
            return 1
        return 0
    page_path.write_text(new, encoding="utf-8")
    print(f"wrote {what} into {page_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    what = f"the table of {len(groups())} config groups"
    return write_or_check(argv, __doc__, PAGE, lambda page: with_table(page, table()), what)


if __name__ == "__main__":
    sys.exit(main())
