"""docs/pictures/page.png: the serve page, as tests/test_serve.py drives it, on a real model.

    python docs/page_picture.py RUN/checkpoints/BEST.ckpt --text "Where is the station?"

Starts `python -m seq2seq.serve CKPT` on a free loopback port, opens its page in Debian's
chromium through Playwright (tests/helpers.drive_page, the page test's own steps), types the
text, asks for the 3 best, shows the cross-attention of the chosen layer and head, and saves
the screenshot at a laptop's size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="a checkpoint of the real-text model")
    parser.add_argument("--text", default="Where is the station?")
    parser.add_argument("--layer", type=int, default=None, help="0-based; default the last")
    parser.add_argument("--head", default="mean", help="0-based, or mean")
    parser.add_argument("--out", default=str(ROOT / "docs" / "pictures" / "page.png"))
    args = parser.parse_args(argv)
    from helpers import ServeProcess, drive_page

    server = ServeProcess(args.ckpt).ready()
    try:
        shown = drive_page(
            server.url, args.text, Path(args.out), layer=args.layer, head=args.head,
            size=(1280, 720),
        )  # fmt: skip
    finally:
        server.stop()
    print(f"wrote {args.out}: {args.text!r} -> {shown['tgt']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
