"""`python -m seq2seq.serve` (and `seq2seq-serve`): load the model once and serve it.

    python -m seq2seq.serve best.ckpt                   # http://127.0.0.1:8000/
    python -m seq2seq.serve outputs/tatoeba_en_fr/runs/RUN   # every checkpoint the run kept
    python -m seq2seq.serve --model model-ct2 --port 0  # a free port, printed
    SEQ2SEQ_SERVE_TOKEN=secret python -m seq2seq.serve best.ckpt --host 0.0.0.0

SIGTERM or Ctrl-C stops taking requests, lets the ones in flight finish, then exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq.cli import ArgumentParser, error_line

TOKEN_VARIABLE = "SEQ2SEQ_SERVE_TOKEN"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from seq2seq.serve.app import Limits

    parser = ArgumentParser(
        prog="python -m seq2seq.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "ckpt", nargs="?",
        help="a checkpoint written by train.py, or a run directory: every checkpoint it kept "
        "(the page's slider over them; the run's tested checkpoint first)",
    )  # fmt: skip
    parser.add_argument("--model", help="a CTranslate2 directory written by seq2seq.export")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_VARIABLE),
        help=f"require 'Authorization: Bearer TOKEN' (default: ${TOKEN_VARIABLE}; none: open)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--compute-type", help="--model only: CTranslate2's compute type")
    parser.add_argument("--threads", type=int, default=0, help="--model only: 0: torch's count")
    for _, flag, kind, default, help in Limits.options():
        parser.add_argument(flag, type=kind, default=default, help=help)
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    args = parser.parse_args(argv)
    if (args.ckpt is None) == (args.model is None):
        parser.error("give a checkpoint (CKPT) or an export (--model DIR), one of them")
    if args.compute_type is not None and args.ckpt:
        parser.error("--compute-type is for a CTranslate2 --model; drop it with a checkpoint")
    for name in ("max_batch", "max_sentences", "max_chars", "max_queue", "max_beam", "max_body",
                 "max_top_k", "max_trace"):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
            )
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0-65535, got {args.port}")
    if not (args.timeout > 0 and args.wait_ms >= 0):
        parser.error("--timeout must be positive and --wait-ms 0 or more")
    if not args.max_search_mb > 0:
        parser.error(f"--max-search-mb must be positive, got {args.max_search_mb:g}")
    return args


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound now so that --port 0 can say which port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY: asyncio
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port} ({error.strerror}): pick another --port"
        ) from None
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvicorn

        from seq2seq.inference import Engine, RunHistory
        from seq2seq.serve.app import Limits, create_app
        from seq2seq.serve.batcher import Batcher
    except ImportError as error:
        missing = f"serving needs FastAPI and uvicorn ({error.name} is missing)"
        print(f'error: {missing}: pip install -e ".[serve]"', file=sys.stderr)
        return 1
    try:
        history = None
        if args.ckpt is not None and Path(args.ckpt).is_dir():
            history = RunHistory(args.ckpt, args.device)
            engine = history.engine()
        else:
            engine = Engine(args.ckpt, args.model, args.device, args.compute_type, args.threads)
        limits = Limits(**{name: getattr(args, flag[2:].replace("-", "_"))
                           for name, flag, *_ in Limits.options()})  # fmt: skip
        batcher = Batcher(engine, limits.max_batch, limits.wait_ms / 1000, thread=False,
                          max_bytes=limits.max_search_mb * 2**20)  # fmt: skip
        app = create_app(engine, limits, args.token, batcher, history)
        sock = listening_socket(args.host, args.port)
    except (ValueError, OSError) as error:
        if args.debug:
            raise
        print(f"error: {error_line(error)}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    what = args.ckpt or args.model
    print(f"serving {what} ({engine.backend}) on http://{host}:{port}/", flush=True)
    config = uvicorn.Config(
        app, log_level="info", timeout_graceful_shutdown=args.timeout + 5, access_log=False
    )
    server = uvicorn.Server(config)

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            batcher.stop()  # the app's shutdown stops it too; twice is harmless

    # The event loop in a thread, the model in the main thread (seq2seq/serve/batcher.py says
    # why). SIGTERM and Ctrl-C ask uvicorn to stop: it stops taking requests, lets the ones
    # in flight finish, then shuts the app down, which ends the worker; a second Ctrl-C stops
    # at once.
    stopped: list[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signal.Signals(signum).name)
        server.force_exit = server.should_exit
        server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    loop = threading.Thread(target=serve, name="seq2seq-serve-http")
    try:
        loop.start()
        batcher.run()
        loop.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"stopped{' by ' + stopped[0] if stopped else ''}; the requests in flight were answered",
          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
