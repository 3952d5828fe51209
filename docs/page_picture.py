"""docs/pictures/page.png: the serve page, as tests/test_serve.py drives it, on a real model.

    python docs/page_picture.py RUN/checkpoints/BEST.ckpt --text "Where is the station?"
    python docs/page_picture.py BEST.ckpt --explore --text "..." --own "..."  # exploring.md's

--explore draws docs/pictures/explore.png as tests/test_explore.py drives the page: the search
as a tree, an alternative clicked, and your own translation (--own) scored.

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
    parser.add_argument("--out", default=None, help="default docs/pictures/page.png (explore.png)")
    parser.add_argument("--explore", action="store_true", help="the tree and your translation")
    parser.add_argument("--own", default="", help="--explore: your translation, to score")
    parser.add_argument("--beam", type=int, default=5, help="--explore: the tree's beam")
    parser.add_argument("--step", type=int, default=1, help="--explore: the step clicked")
    parser.add_argument("--word", default=None, help="--explore: the word clicked there")
    args = parser.parse_args(argv)
    from helpers import ServeProcess, drive_explore, drive_page

    name = "explore.png" if args.explore else "page.png"
    out = Path(args.out or ROOT / "docs" / "pictures" / name)
    server = ServeProcess(args.ckpt).ready()
    try:
        if args.explore:
            shown = drive_explore(server.url, args.text, args.own, out, args.beam, args.step,
                                  size=(1280, 1100), top_k=3, word=args.word)  # fmt: skip
        else:
            shown = drive_page(
                server.url, args.text, out, layer=args.layer, head=args.head, size=(1280, 720)
            )
    finally:
        server.stop()
    print(f"wrote {out}: {args.text!r}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
