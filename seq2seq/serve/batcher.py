"""One worker thread owns the model and decodes the sentences of concurrent requests together.

A request's sentences go into one queue. The worker takes what is waiting and, while it holds
fewer than the most of its last 8 rounds took (as many requests as were in flight then are
likely to come again), waits up to `wait_s` for more, never past `max_batch` sentences: one
client waits for nobody, 32 clients are searched 32 at a time. It groups them by search
settings (beam, n_best, length penalty: those one search shares; translations to score, by
their length penalty) and runs each group as one padded search (or one scoring), each
sentence with its own length limit, so an answer never depends on what else was in the batch.
A sampling request is a group of its own, drawn from its seed in translate's batches. The event
loop never decodes: it awaits a future the worker resolves.

A request whose client went away is marked cancelled, and one whose deadline passed has
expired: the worker skips its sentences that have not started, and stops a search between two
steps once every request in it is cancelled or expired. A group whose search would hold more
memory than `max_bytes` (Engine.search_bytes) is searched in several parts, at the requests'
boundaries (the app refuses a request that alone is past it).

`python -m seq2seq.serve` runs the worker in the process's main thread and the event loop in
another: torch decodes in the main thread at up to twice the speed of any other here (its
OpenMP team: 35 against 83 ms for one Tatoeba sentence with beam 5 on 2 cores, 420 against
601 ms for 32). In process (tests, FastAPI's TestClient) it starts a thread of its own.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from seq2seq.core.decoding import Search, SearchStopped
from seq2seq.inference import Sentence

__all__ = ["Batcher", "Job"]

log = logging.getLogger(__name__)
_numbers = itertools.count()


@dataclass
class Job:
    """One request's work: its sentences, the search, and the future its answer resolves
    (a list of (score, ids) lists, one a sentence, or the error the search raised)."""

    sentences: list[Sentence]
    search: Search
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    seed: int | None = None  # sampling: the draw starts from it
    work: Callable[[], Any] | None = None  # instead of a search: run this on the worker
    targets: list[list[int]] | None = None  # /score: a translation a sentence, to score
    cancelled: bool = False
    deadline: float = math.inf  # time.monotonic() past which nobody waits for the answer
    number: int = field(default_factory=lambda: next(_numbers))
    _results: dict[int, list] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        """What a search of several jobs' sentences must share: the search, and for sampling
        or other work the job itself (a draw from its own seed)."""
        if self.search.sampling is not None or self.work is not None:
            return ("alone", self.number)
        if self.targets is not None:  # scored together: they share the penalty and the heads
            return ("score", self.search.decoding.length_penalty, self.search.heads_off)
        return ("search", self.search)

    def expired(self) -> bool:
        """Nobody waits for this job's answer: its client went away or its deadline passed."""
        return self.cancelled or time.monotonic() > self.deadline

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
                if self.expired():  # its client left or its deadline passed: nobody awaits it
                    self.future.exception()  # read here, or asyncio logs it as never retrieved
            else:
                self.future.set_result(value)

        self.loop.call_soon_threadsafe(settle)


class Batcher:
    """The worker: `submit` a Job from the event loop, await its future there. With
    thread=False the caller runs run() itself (the serve command, in its main thread)."""

    def __init__(
        self,
        engine: Any,
        max_batch: int = 32,
        wait_s: float = 0.005,
        thread: bool = True,
        max_bytes: float = math.inf,
    ) -> None:
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self.max_bytes = max_bytes  # memory one search may hold (Engine.search_bytes)
        self.stopped = 0  # searches stopped between steps: nobody waited for them any more
        self._waiting = 0  # sentences queued and not yet taken
        self.searches = self.sentences = 0  # searches run, and the sentences they decoded
        self._recent: collections.deque[int] = collections.deque([1], maxlen=8)  # rounds' sizes
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[Job, int, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self.run, name="seq2seq-serve-worker")
            self._thread.daemon = True
            self._thread.start()

    @property
    def waiting(self) -> int:
        """Sentences queued and not yet taken by the worker."""
        with self._lock:
            return self._waiting

    def _count(self, change: int) -> None:
        with self._lock:
            self._waiting += change

    def submit(self, job: Job) -> None:
        """Queue a job's sentences in parts of at most max_batch (a job of no sentences, or
        of other work, is one part)."""
        count = max(len(job.sentences), 1)
        step = count if job.key[0] == "alone" else self.max_batch
        for start in range(0, count, step):
            self._count(min(step, count - start))
            self._queue.put((job, start, min(start + step, count)))

    def stop(self) -> None:
        """Finish what is queued, then end run() (and wait for its thread, if it has one)."""
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def run(self) -> None:
        """Decode what is submitted until stop()."""
        stopping = False
        while not stopping:
            try:  # a timeout, so that signals reach the main thread's handlers
                first = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if first is None:
                break
            parts, size = [first], first[2] - first[1]
            deadline = time.monotonic() + self.wait_s
            while size < self.max_batch:
                # What waits already; then more, while fewer than last time have come.
                wait = deadline - time.monotonic() if size < max(self._recent) else 0.0
                try:
                    part = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if part is None:
                    stopping = True
                    break
                parts.append(part)
                size += part[2] - part[1]
            self._count(-size)
            self._recent.append(size)
            groups: dict[tuple, list[tuple[Job, int, int]]] = {}
            for part in parts:
                if not part[0].expired():
                    groups.setdefault(part[0].key, []).append(part)
            for group in groups.values():
                for search in self._within_memory(group):
                    self._decode(search)

    def _within_memory(self, group: list[tuple[Job, int, int]]) -> list[list]:
        """The group in consecutive searches of parts whose sentences together stay within
        max_bytes (a part alone always makes a search)."""
        if self.max_bytes == math.inf or len(group) == 1:
            return [group]
        searches: list[list[tuple[Job, int, int]]] = [[]]
        for part in group:
            joined = [*searches[-1], part]
            sentences = [s for j, start, end in joined for s in j.sentences[start:end]]
            if part[0].targets is not None:
                targets = [t for j, start, end in joined for t in j.targets[start:end]]
                held = self.engine.score_bytes(sentences, targets)
            else:
                held = self.engine.search_bytes(sentences, part[0].search)
            if searches[-1] and held > self.max_bytes:
                searches.append([part])
            else:
                searches[-1] = joined
        return searches

    def _decode(self, group: list[tuple[Job, int, int]]) -> None:
        """One search over the group's sentences; each job resolves once all its parts are in.
        The search stops between steps once no job in it is waited for."""
        job = group[0][0]

        def nobody_waits() -> bool:
            return all(j.expired() for j, _, _ in group)

        try:
            if job.work is not None:
                job.resolve(job.work())
                return
            sentences = [s for j, start, end in group for s in j.sentences[start:end]]
            if job.targets is not None:
                targets = [t for j, start, end in group for t in j.targets[start:end]]
                found = self.engine.score(sentences, targets, job.search, stop=nobody_waits)
            else:
                found = self.engine.generate(sentences, job.search, job.seed, stop=nobody_waits)
            self.searches, self.sentences = self.searches + 1, self.sentences + len(sentences)
        except SearchStopped as stopped:  # its jobs were answered 504, or their clients left
            self.stopped += 1
            log.info("a search nobody waited for any more: %s", stopped)
            for j, _, _ in group:
                j.resolve(error=stopped)
            return
        except Exception as error:  # the search failed: every job in it gets the error
            if isinstance(error, ValueError) and hasattr(error, "status"):
                log.info("a request the work refused: %s", error)  # a RequestError: 4xx
            else:
                log.exception("decoding failed")
            for j, _, _ in group:
                j.resolve(error=error)
            return
        offset = 0
        for j, start, end in group:
            j._results[start] = found[offset : offset + end - start]
            offset += end - start
            if sum(len(part) for part in j._results.values()) == len(j.sentences):
                j.resolve([h for key in sorted(j._results) for h in j._results[key]])
