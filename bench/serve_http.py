"""The HTTP service under load, on loopback: requests and sentences a second, and latency.

    python bench/serve_http.py RUN/checkpoints/BEST.ckpt           # both backends, ~8 minutes
    python bench/serve_http.py BEST.ckpt --backends torch --requests 64 --levels 1 8 --repeats 1
    python bench/serve_http.py BEST.ckpt --endpoint score --backends torch ctranslate2
    python bench/serve_http.py BEST.ckpt --endpoint search --backends torch --levels 1

--endpoint score sends each sentence with its French reference to /score (forced decoding,
batched across requests as /translate is); --endpoint search asks /search for the beam search
as a tree (beam 5, top_k 5: what the page asks), one search a request, never batched;
--endpoint toggle times what the page asks when a head is switched off (/translate, /score
and /attention with a head_mask, in turn).

For each backend (the checkpoint, decoded by our own search; its CTranslate2 export, made in a
temporary directory) and each batching (on: a search takes up to 32 sentences from concurrent
requests; off: --max-batch 1, one sentence a search), it starts `python -m seq2seq.serve` on
127.0.0.1 and sends --requests requests of one Tatoeba sentence each (English, from the
shipped corpus, drawn with a seed) from 1, 8 and 32 client threads at once, each level bounded
by --seconds. The search is the model's own (beam 5 for the real-text recipe). It prints a
table (requests a second, which are sentences a second here, and the 50th, 95th and 99th
percentile latency), medians of --repeats rounds in which every server runs in turn, and the
ratios that matter: batching on over off at 32 clients (each round's too), and CTranslate2
over our search.

The clients run on the same machine as the server: on 2 cores they take some of its time, so
the figures are a floor. Nothing leaves the machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # helpers.ServeProcess: a server, as the tests start one

from common import environment, print_table  # noqa: E402
from helpers import ServeProcess  # noqa: E402

CORPUS = ROOT / "data" / "corpora" / "tatoeba-en-fr" / "en-fr.tsv.gz"


def sentences(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """count (English, French) pairs of the shipped Tatoeba corpus, drawn with seed."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        pairs = [tuple(line.split("\t")[:2]) for line in f.read().splitlines()[1:]]
    return random.Random(seed).sample(pairs, count)


def request(endpoint: str, pair: tuple[str, str]) -> dict:
    """The body an endpoint is sent for one pair."""
    if endpoint == "score":
        return {"src": pair[0], "tgt": pair[1]}
    if endpoint == "search":
        return {"src": pair[0], "beam": 5, "top_k": 5}
    if endpoint == "toggle":
        return {"src": pair[0], "head_mask": TOGGLED}
    return {"src": pair[0]}


TOGGLED = "cross:0:0,self:1:2"  # --endpoint toggle: two heads switched off, as on the page


def load(url: str, pairs: list, clients: int, seconds: float, endpoint: str = "translate") -> dict:
    """One request a sentence from `clients` threads at once, until the sentences or the
    seconds run out: requests a second and latency percentiles (ms)."""
    import httpx

    latencies: list[float] = []
    stop_at = time.monotonic() + seconds
    local = threading.local()

    def send(pair: tuple[str, str]) -> None:
        if time.monotonic() > stop_at:
            return
        client = getattr(local, "client", None) or httpx.Client(timeout=120)
        local.client = client
        start = time.perf_counter()
        body = request(endpoint, pair)
        if endpoint == "toggle":  # the page's answer to a head switched off: three requests
            answer = client.post(f"{url}/translate", json=body)
            answer.raise_for_status()
            scored = {**body, "tgt": answer.json()["tgt"] or "."}
            client.post(f"{url}/score", json=scored).raise_for_status()
            response = client.post(f"{url}/attention", json=body)
        else:
            response = client.post(f"{url}/{endpoint}", json=body)
        response.raise_for_status()
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, pairs))
    wall = time.perf_counter() - start
    ms = sorted(1000 * x for x in latencies)

    def percentile(p: float) -> float:
        return ms[min(len(ms) - 1, int(p / 100 * len(ms)))]

    return {
        "requests": len(ms),
        "per_second": len(ms) / wall,
        "p50": statistics.median(ms),
        "p95": percentile(95),
        "p99": percentile(99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="the real-text model's checkpoint")
    parser.add_argument("--backends", nargs="+", default=["torch", "ctranslate2"])
    parser.add_argument(
        "--endpoint", choices=["translate", "score", "search", "toggle"], default="translate",
        help="toggle: what the page asks when a head is switched off (/translate, /score and "
        "/attention with a head_mask), one request a sentence",
    )  # fmt: skip
    parser.add_argument("--levels", nargs="+", type=int, default=[1, 8, 32], help="clients")
    parser.add_argument("--requests", type=int, default=256, help="requests a level")
    parser.add_argument("--seconds", type=float, default=60, help="at most, a level")
    parser.add_argument("--wait-ms", default="20", help="the server's --wait-ms, batching on")
    parser.add_argument(
        "--repeats", type=int, default=3,
        help="rounds of every server, on and off in turn: medians, and each round's ratio",
    )  # fmt: skip
    args = parser.parse_args()
    if args.endpoint in ("search", "toggle") and "ctranslate2" in args.backends:
        parser.error("/search needs the checkpoint (an export reports no search's steps): "
                     "--backends torch")  # fmt: skip
    if "ctranslate2" in args.backends:  # before any server starts: QK-norm does not export
        from seq2seq.checkpoint import load_module
        from seq2seq.export import check_exportable

        try:
            check_exportable(load_module(args.ckpt).config)
        except ValueError as refused:
            parser.error(f"{args.ckpt}: {refused}; or measure it with --backends torch")
    texts = sentences(args.requests + 8)
    warm, texts = texts[:8], texts[8:]
    print(f"# {environment()}; /{args.endpoint}: {len(texts)} Tatoeba sentences, one a "
          f"request; medians of {args.repeats} rounds")  # fmt: skip
    alone = args.endpoint in ("search", "toggle")
    batchings = (("on", "32"),) if alone else (("on", "32"), ("off", "1"))
    results: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory() as work:
        models = {"torch": [args.ckpt]}
        if "ctranslate2" in args.backends:
            from seq2seq.export import export

            models["ctranslate2"] = ["--model", str(export(args.ckpt, Path(work) / "ct2"))]
        for _ in range(args.repeats):  # on and off side by side in each round: the machine's
            for backend in args.backends:  # other load moves both alike
                for batching, max_batch in batchings:
                    wait = args.wait_ms if batching == "on" else "0"
                    server = ServeProcess(
                        *models[backend], "--max-batch", max_batch, "--wait-ms", wait,
                        "--timeout", "300",
                    ).ready()  # fmt: skip
                    try:
                        load(server.url, warm, 4, 60, args.endpoint)
                        for clients in args.levels:
                            found = load(server.url, texts, clients, args.seconds, args.endpoint)
                            results.setdefault((backend, batching, clients), []).append(found)
                    finally:
                        server.stop()

    def median(key: tuple, stat: str) -> float:
        return statistics.median(r[stat] for r in results[key])

    rows = [
        [*key, results[key][0]["requests"], f"{median(key, 'per_second'):.1f}",
         *(f"{median(key, p):.0f}" for p in ("p50", "p95", "p99"))]
        for key in results
    ]  # fmt: skip
    print_table(
        ["backend", "batching", "clients", "requests", "sentences/s", "p50 ms", "p95 ms",
         "p99 ms"], rows,
    )  # fmt: skip
    top = max(args.levels)
    for backend in args.backends:
        on, off = results.get((backend, "on", top)), results.get((backend, "off", top))
        if on and off:
            rounds = [a["per_second"] / b["per_second"] for a, b in zip(on, off, strict=True)]
            ratio = median((backend, "on", top), "per_second") / median(
                (backend, "off", top), "per_second"
            )
            each = ", ".join(f"{r:.2f}" for r in rounds)
            print(f"{backend}: batching on / off at {top} clients: {ratio:.2f}x sentences/s "
                  f"(each round: {each})")  # fmt: skip
    if all((b, "on", top) in results for b in ("ctranslate2", "torch")):
        ratio = median(("ctranslate2", "on", top), "per_second") / median(
            ("torch", "on", top), "per_second"
        )
        print(f"ctranslate2 / torch, batching on, {top} clients: {ratio:.2f}x sentences/s")


if __name__ == "__main__":
    main()
