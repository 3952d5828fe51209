"""The service's worker (seq2seq/serve/batcher.py): its deadline, queue and memory limits, a
search stopped between its steps, and a client gone before its turn never decoded for."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import need, one_line_error

need("fastapi")
httpx = need("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.inference import Engine, Settings  # noqa: E402
from seq2seq.serve.app import Limits, create_app  # noqa: E402

SENTENCES = [" ".join(random.Random(i).choices("0123456789", k=1 + i % 9)) for i in range(40)]


@pytest.fixture(scope="module")
def engine(trained) -> Engine:
    return Engine(trained[0]["best_checkpoint"])


def test_past_the_deadline_504_a_full_queue_503_a_failed_search_500(engine) -> None:
    slow = SlowEngine(engine, delay=0.4)
    limits = Limits(timeout_s=0.15, max_queue=3)
    with TestClient(create_app(slow, limits)) as slow_client:
        error = one_line_error(slow_client.post("/translate", json={"src": "1 2"}), 504)
        assert error.startswith("no answer within the server's --timeout of 0.15 s")
        error = one_line_error(slow_client.post("/translate", json={"src": ["1"] * 4}), 503)
        assert "the server is busy" in error and "--max-queue 3" in error
    with TestClient(create_app(slow, Limits(timeout_s=5))) as slow_client:
        slow.fail = True
        error = one_line_error(slow_client.post("/translate", json={"src": "1 2"}), 500)
        assert error == "the search failed: the search broke"
        assert slow_client.post("/translate", json={"src": "1 2"}).status_code == 200


def test_the_queue_limit_counts_the_sentences_already_waiting(engine) -> None:
    """--max-queue 3: with 2 sentences waiting behind a search, a request of 2 more is refused,
    though 2 alone are within the limit."""
    slow = SlowEngine(engine, delay=1.0)
    with TestClient(create_app(slow, Limits(max_queue=3, wait_ms=0))) as slow_client:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(slow_client.post, "/translate", json={"src": "1"})
            assert slow.searching.wait(timeout=30)  # the worker is in the first search
            waiting = pool.submit(slow_client.post, "/translate", json={"src": ["2", "3"]})
            deadline = time.monotonic() + 30
            while slow_client.get("/health").json()["waiting"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            error = one_line_error(slow_client.post("/translate", json={"src": ["4", "5"]}), 503)
            assert "(2 sentences wait, --max-queue 3)" in error
            assert first.result().status_code == waiting.result().status_code == 200
        assert slow_client.post("/translate", json={"src": ["4", "5"]}).status_code == 200


def test_a_search_past_its_deadline_stops_between_its_steps(engine, monkeypatch) -> None:
    """Each decoder step held back 50 ms, and EOS never chosen: a 60-token output would take
    3 s; the request is answered 504 at its 0.4 s deadline and its search stops at the next
    step, not 2.6 s later."""
    model = engine.model.module.model
    steps: list[float] = []
    real_decode = model.decode

    def slow_decode(*args, **kwargs):
        steps.append(time.monotonic())
        time.sleep(0.05)
        logits = real_decode(*args, **kwargs).clone()
        logits[..., model.config.eos_id] = float("-inf")
        return logits

    monkeypatch.setattr(model, "decode", slow_decode)
    with TestClient(create_app(engine, Limits(timeout_s=0.4))) as slow_client:
        started = time.monotonic()
        asked = {"src": "7 7", "max_len": 60}
        error = one_line_error(slow_client.post("/translate", json=asked), 504)
        assert "--timeout of 0.4 s" in error
        deadline = time.monotonic() + 10
        while slow_client.get("/health").json()["stopped"] < 1:
            assert time.monotonic() < deadline, "the search went on past its deadline"
            time.sleep(0.02)
    assert len(steps) < 30 and steps[-1] - started < 1.5, (len(steps), steps[-1] - started)


def test_a_search_past_the_memory_limit_is_refused_with_its_figure_before_it_starts(
    engine,
) -> None:
    limits = Limits(max_search_mb=0.5)
    with TestClient(create_app(engine, limits)) as small:
        wide = {"src": SENTENCES[:10], "beam": 64}
        error = one_line_error(small.post("/translate", json=wide), 413)
        assert error.startswith("this search would hold about ") and "beam 64, 10 sentence" in error
        assert "--max-search-mb 0.5" in error
        assert small.get("/health").json()["searches"] == 0  # no work started
        assert small.post("/translate", json={"src": SENTENCES[0]}).status_code == 200
    # The estimate grows with what a request asks: sentences x beam (the cache's rows).
    search = engine.search(Settings(beam=4))
    one = engine.encode(SENTENCES[8:9], Settings(beam=4), search)
    assert engine.search_bytes(one * 8, search) > 7 * engine.search_bytes(one, search)
    wider = engine.search(Settings(beam=16))
    assert engine.search_bytes(one, wider) > 3 * engine.search_bytes(one, search)


def test_a_client_that_goes_away_is_never_decoded_for(engine) -> None:
    """A request whose client disconnects while it waits (here: a client timeout while the
    worker is busy) is cancelled: its sentence is never decoded, and the server goes on."""
    import uvicorn

    slow = SlowEngine(engine, delay=1.2)  # the server looks for gone clients every 0.25 s
    config = uvicorn.Config(create_app(slow, Limits(wait_ms=0)), host="127.0.0.1", port=0,
                            log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        busy = threading.Thread(
            target=lambda: httpx.post(f"{url}/translate", json={"src": "1 1"}, timeout=30)
        )
        busy.start()
        assert slow.searching.wait(timeout=30)  # the worker is in the first search
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/translate", json={"src": "9 9 9"}, timeout=0.3)
        busy.join()
        time.sleep(0.3)
        assert httpx.post(f"{url}/translate", json={"src": "2 2"}, timeout=30).status_code == 200
        gone = engine.model.src_vocab.encode("9 9 9")
        assert gone not in slow.decoded and len(slow.decoded) == 2, slow.decoded
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class SlowEngine:
    """The real engine, each search held back by `delay` s (and made to fail when asked)."""

    def __init__(self, engine: Engine, delay: float) -> None:
        self.engine, self.delay, self.fail, self.decoded = engine, delay, False, []
        self.searching = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, sentences, search, seed=None, stop=None):
        self.searching.set()
        time.sleep(self.delay)
        if self.fail:
            self.fail = False
            raise RuntimeError("the search broke")
        self.decoded.extend(s.ids for s in sentences)
        return self.engine.generate(sentences, search, seed, stop)


def test_an_error_for_a_job_nobody_awaits_is_never_logged_as_unretrieved() -> None:
    """A search stopped because its client left resolves the job's future with the error; the
    request no longer awaits it, and asyncio would log "Future exception was never retrieved"
    with a traceback once the future is collected (a real server printed one under attack).
    A job still awaited gets its error as before."""
    import asyncio
    import gc

    from seq2seq.core.decoding import SearchStopped
    from seq2seq.serve.batcher import Job

    loop = asyncio.new_event_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        left = Job([], None, loop.create_future(), loop, cancelled=True)
        left.resolve(error=SearchStopped("the search was stopped after 9 steps"))
        waited = Job([], None, loop.create_future(), loop)
        waited.resolve(error=SearchStopped("stopped"))
        loop.run_until_complete(asyncio.sleep(0))
        with pytest.raises(SearchStopped):
            loop.run_until_complete(waited.future)
        del left
        gc.collect()
    finally:
        loop.close()
    assert not [c for c in reported if "never retrieved" in c.get("message", "")], reported
