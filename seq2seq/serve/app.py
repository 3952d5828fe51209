"""The HTTP service: FastAPI's app over an Engine (the model) and a Batcher (its worker).

    GET  /health      liveness, cheap
    GET  /info        what is loaded (the file and its hash, sizes, languages, tokenizer,
                      decoding defaults, backend, the run's test score and signatures)
    POST /translate   {"src": "..." | ["...", ...], beam, n_best, length_penalty, max_len,
                       sample, temperature, top_k, top_p, seed, truncate, prefix, heal}
    POST /score       {"src": "..." | [...], "tgt": "..." | [...], length_penalty}: each given
                      translation's score, log-probability and tokens (forced decoding)
    POST /search      {"src": "...", beam, top_k, length_penalty, max_len, prefix, heal}: the
                      beam search as a tree (checkpoint backend)
    POST /what-if     {"src": "...", step, layer, source, head}: the greedy output, and the same
                      with that step's cross-attention forced onto that source token
    POST /attention   {"src": "...", beam, length_penalty, max_len, truncate, prefix, heal}:
                      the output's tokens and every layer's and head's attention (checkpoint)
    GET  /heads       the head atlas `inspect CKPT --heads` wrote beside the run (404 without)
    GET  /            the page (seq2seq/serve/page.html); FastAPI's /docs

The settings are seq2seq/inference.py's OPTIONS: the request schemas below are made from them.

Every error is JSON, {"error": "one line naming the field and the fix"}, with its status: 401
without the token (where one is set), 408 for a body still arriving at the deadline, 413 past
the size limits (sentences, characters, beam, the body, a search's memory), 422 for a bad
request (invalid text included), 501 for what an export cannot do, 503 when the queue is full
or the server is stopping, 504 past the deadline.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException

from seq2seq import checks
from seq2seq.core.decoding import Search, SearchStopped
from seq2seq.inference import OPTIONS, Engine, RequestError, RunHistory, Sentence, Settings
from seq2seq.serve.batcher import Batcher, Job

__all__ = ["Limits", "create_app"]

PAGE = Path(__file__).with_name("page.html")


def _limit(default: Any, help: str, flag: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True)
class Limits:
    """What one request may ask, and how long the server waits for it: the serve command's
    options (--max-sentences for max_sentences; seq2seq/serve/cli.py makes them from here)."""

    max_sentences: int = _limit(64, "sentences a request")
    max_chars: int = _limit(20_000, "characters a request, all its texts together")
    timeout_s: float = _limit(30.0, "seconds a request may take before it is answered 504",
                              "--timeout")  # fmt: skip
    max_queue: int = _limit(4096, "sentences waiting; past it, 503")
    max_batch: int = _limit(32, "sentences decoded together, across requests (1: one at a time)")
    wait_ms: float = _limit(20.0, "how long the worker waits for more sentences before a search")
    max_beam: int = _limit(64, "the widest beam (and most n_best) a request may ask")
    max_search_mb: float = _limit(
        2048.0, "memory one search may hold, as estimated before it starts (past it: 413)"
    )
    # 20,000 characters in JSON's escapes take at most 240 kB
    max_body: int = _limit(
        1 << 20, "bytes a request's body may have (past it: 413, before the rest is read)"
    )
    max_top_k: int = _limit(20, "/search: the most alternatives a step shows")
    max_trace: int = _limit(
        20_000, "/search: the most nodes a tree may have (steps x beam x (top_k + 1))"
    )

    @classmethod
    def options(cls) -> list[tuple[str, str, type, Any, str]]:
        """(field, flag, type, default, help) of each limit, for the command line."""
        return [
            (f.name, f.metadata["flag"] or "--" + f.name.replace("_", "-"),
             type(f.default), f.default, f.metadata["help"])
            for f in fields(cls)
        ]  # fmt: skip


def request_model(name: str, request: str, **more: Any) -> type[BaseModel]:
    """The JSON body of a request: `more` (its own fields, e.g. src) and every option that
    the request takes, from seq2seq/inference.py's declaration (/docs shows their help)."""
    fields: dict[str, Any] = {}
    for option in OPTIONS:
        if request not in option.requests:
            continue
        kind: Any = option.kind
        if option.name == "prefix":
            kind = str | list[str]  # one for every sentence, or one a sentence
        default = more.pop(option.name, option.default)
        fields[option.name] = (
            kind | None if option.optional else kind,
            Field(default, description=option.help),
        )
    config = ConfigDict(extra="forbid", strict=True)
    return create_model(name, __config__=config, **more, **fields)


SENTENCES = (str | list[str], Field(description="a sentence, or a list of them"))
CHECKPOINT = (
    str | None,
    Field(None, description="a server of a run (serve RUN): which of its checkpoints, by name"),
)
TranslateRequest = request_model(
    "TranslateRequest", "translate", src=SENTENCES, checkpoint=CHECKPOINT
)
AttentionRequest = request_model(
    "AttentionRequest", "attention", src=(str, Field(description="one sentence")),
    checkpoint=CHECKPOINT,
)  # fmt: skip
SearchRequest = request_model(
    "SearchRequest", "search", src=(str, Field(description="one sentence")), top_k=5
)
ScoreRequest = request_model(
    "ScoreRequest", "score", src=SENTENCES,
    tgt=(str | list[str], Field(description="a translation of each sentence, to score")),
)  # fmt: skip
WhatIfRequest = request_model(
    "WhatIfRequest", "what_if", src=(str, Field(description="one sentence")),
    step=(int, Field(description="the output step whose attention is forced (from 0)")),
    layer=(int, Field(description="the cross-attention layer (from 0)")),
    source=(int, Field(description="the source token it is forced onto (from 0)")),
    head=(int | None, Field(None, description="one head of the layer; none: all of them")),
)  # fmt: skip
REQUESTS = {"/translate": TranslateRequest, "/attention": AttentionRequest,
            "/search": SearchRequest, "/score": ScoreRequest,
            "/what-if": WhatIfRequest}  # fmt: skip


def create_app(
    engine: Engine,
    limits: Limits | None = None,
    token: str | None = None,
    batcher: Batcher | None = None,
    history: RunHistory | None = None,
) -> FastAPI:
    """The app; its worker (a Batcher of its own in a thread, unless one is given) starts
    with the app and stops, once the work queued is done, with it. With a run's history
    (serve RUN), /translate and /attention answer from the checkpoint a request names."""
    limits = limits or Limits()
    info = {
        **engine.info(), "limits": limits.__dict__, "auth": token is not None,
        "settings": [option.control() for option in OPTIONS],  # the page makes its controls
        "checkpoints": history.checkpoints if history else None,
        "checkpoint": history.default if history else None,
    }  # fmt: skip

    def engine_of(body: Any) -> Engine:
        """The engine a request names (a run's checkpoint), or the server's own."""
        name = getattr(body, "checkpoint", None)
        if name is None or (history is not None and name == history.default):
            return engine
        if history is None:
            raise RequestError(
                "checkpoint: this server serves one checkpoint; serve a run directory "
                "(python -m seq2seq.serve RUN) to ask for others"
            )
        return history.engine(name)

    async def loaded(body: Any) -> None:
        """The checkpoint a request names in memory, loaded off the event loop (about half a
        second for a small model: the other requests go on meanwhile)."""
        name = getattr(body, "checkpoint", None)
        if history is not None and name is not None and not history.holds(name):
            await asyncio.to_thread(history.engine, name)

    state: dict[str, Any] = {"stopping": False}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["batcher"] = batcher or Batcher(
            engine, limits.max_batch, limits.wait_ms / 1000, max_bytes=limits.max_search_mb * 2**20
        )
        yield
        state["stopping"] = True
        await asyncio.to_thread(state["batcher"].stop)  # the queued work finishes first

    app = FastAPI(
        title="seq2seq",
        version=info["seq2seq_version"],
        summary="Translate with a trained seq2seq model, and see its attention.",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, max_body=limits.max_body, timeout_s=limits.timeout_s)

    def authorized(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(value.strip(), token):
            raise RequestError(
                "this server needs its token: send the header Authorization: Bearer TOKEN",
                status=401,
            )

    guarded = [Depends(authorized)]

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse({"error": str(error)}, status_code=error.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        fields = REQUESTS.get(request.url.path, TranslateRequest)
        return JSONResponse({"error": validation_message(error, fields)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = str(error.detail)
        if isinstance(error.__cause__, UnicodeDecodeError):  # FastAPI's 400 for such a body
            return JSONResponse({"error": not_utf8(error.__cause__)}, status_code=422)
        if error.status_code == 404:
            message = f"no endpoint {request.method} {request.url.path}: see /docs"
        elif error.status_code == 405:
            message = f"{request.url.path} does not take {request.method}: see /docs"
        return JSONResponse({"error": message}, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        detail = " ".join(str(error).split())[:300]
        return JSONResponse({"error": f"the server failed: {detail}"}, status_code=500)

    async def outcome(request: Request, job: Job, started: float) -> Any:
        """The job's answer; 504 past the deadline; None if the client went away (the job
        is cancelled, so its sentences that have not started are never decoded)."""
        if state["stopping"]:
            raise RequestError("the server is stopping: send the request again later", 503)
        job.deadline = started + limits.timeout_s  # the worker skips, or stops, it past this
        waiting = state["batcher"].waiting
        if waiting + len(job.sentences) > limits.max_queue:
            raise RequestError(
                f"the server is busy ({waiting} sentences wait, --max-queue "
                f"{limits.max_queue}): send the request again later",
                status=503,
            )
        state["batcher"].submit(job)
        late = RequestError(
            f"no answer within the server's --timeout of {limits.timeout_s:g} s: send "
            "fewer or shorter sentences, or try again when the server is less busy",
            status=504,
        )
        while True:
            left = limits.timeout_s - (time.monotonic() - started)
            if left <= 0:
                job.cancelled = True
                raise late
            # The answer wakes this at once; the timeout only looks for a client gone away.
            done, _ = await asyncio.wait({job.future}, timeout=min(left, 0.25))
            if done:
                failure = job.future.exception()
                if isinstance(failure, SearchStopped):  # the worker saw the deadline first
                    raise late
                if isinstance(failure, RequestError):  # what the work found wrong with it
                    raise failure
                if failure is not None:  # logged by the worker; the server goes on
                    detail = " ".join(str(failure).split())[:300]
                    raise RequestError(f"the search failed: {detail}", status=500)
                return job.future.result()
            if await request.is_disconnected():
                job.cancelled = True
                return None

    def checked(body: BaseModel, texts: list[str], *more_texts: list[str]) -> tuple:
        """The request's sentences within the limits, its settings checked, its search and
        its sentences encoded: or a one-line RequestError naming the limit, before any work."""
        asked = engine_of(body)
        if not texts:
            raise RequestError("src is an empty list: send at least one sentence")
        if len(texts) > limits.max_sentences:
            raise RequestError(
                f"src has {len(texts)} sentences, more than this server's --max-sentences "
                f"{limits.max_sentences}: send them in several requests",
                status=413,
            )
        prefix = getattr(body, "prefix", None)
        given = [*texts, *(t for group in more_texts for t in group)]
        given += [prefix] if isinstance(prefix, str) else prefix or []
        chars = sum(len(text) for text in given)
        if chars > limits.max_chars:
            raise RequestError(
                f"{'src' if len(given) == len(texts) else 'the request'} has {chars:,} "
                f"characters, more than this server's --max-chars "
                f"{limits.max_chars:,}: send them in several requests",
                status=413,
            )
        settings = Settings(**{o.name: getattr(body, o.name) for o in OPTIONS
                               if o.name in type(body).model_fields})  # fmt: skip
        for name in ("beam", "n_best"):
            value = getattr(settings, name)
            if value is not None and value > limits.max_beam:
                raise RequestError(
                    f"{name} {value} is more than this server's --max-beam {limits.max_beam}: "
                    "ask for a narrower search",
                    status=413,
                )
        search = asked.search(settings)
        sentences = asked.encode(texts, settings, search)
        if more_texts:  # translations to score: /score weighs what scoring them holds
            return settings, search, sentences
        # The largest search this request can make: its longest sentences, a batch of them.
        longest = sorted(sentences, key=lambda s: (len(s.ids), s.limit), reverse=True)
        batch = longest[: limits.max_batch]
        need = asked.search_bytes(batch, search) / 2**20
        if need > limits.max_search_mb:
            raise RequestError(
                f"this search would hold about {need:,.0f} MB (beam "
                f"{search.decoding.beam_size}, {len(batch)} sentence(s) "
                f"of up to {len(batch[0].ids)} tokens, outputs of up to "
                f"{max(s.limit for s in batch)} tokens), more than this server's "
                f"--max-search-mb {limits.max_search_mb:g}: send fewer or shorter sentences, "
                "a narrower beam or a smaller max_len",
                status=413,
            )
        return settings, search, sentences

    async def answered(request: Request, job: Job, started: float) -> Any:
        found = await outcome(request, job, started)
        if found is None:
            raise RequestError("the client went away", status=499)
        return found

    @app.get("/health", summary="Liveness: the server answers, and how much it batches")
    async def health() -> dict[str, Any]:
        batcher = state["batcher"]
        return {
            "status": "stopping" if state["stopping"] else "ok",
            "waiting": batcher.waiting,  # sentences queued
            "searches": batcher.searches,  # searches run so far,
            "sentences": batcher.sentences,  # and the sentences they decoded together
            "stopped": batcher.stopped,  # searches stopped once nobody waited for them
        }

    @app.get("/info", summary="What is loaded", dependencies=guarded)
    async def about() -> dict[str, Any]:
        return info

    @app.get("/heads", summary="The head atlas of this checkpoint", dependencies=guarded)
    async def heads() -> dict[str, Any]:
        return await asyncio.to_thread(engine.atlas)

    @app.post("/translate", summary="Translate a sentence or a list", dependencies=guarded)
    async def translate(body: TranslateRequest, request: Request) -> Any:  # type: ignore[valid-type]
        started = time.monotonic()
        single = isinstance(body.src, str)
        texts = [body.src] if single else body.src
        await loaded(body)
        settings, search, sentences = checked(body, texts)
        loop = asyncio.get_running_loop()
        seed = settings.seed if settings.sample else None
        job = Job(sentences, search, loop.create_future(), loop, seed=seed)
        asked = engine_of(body)
        if asked is not engine:  # another checkpoint of the run: a search of its own
            job.work = lambda: asked.generate(sentences, search, seed, stop=job.expired)
        found = await answered(request, job, started)
        outputs = [
            [{"tgt": asked.text(ids), "score": None if math.isnan(s) else s} for s, ids in hyps]
            for hyps in found
        ]
        tgt = [hyps[0]["tgt"] for hyps in outputs]
        return {
            "tgt": tgt[0] if single else tgt,
            "n_best": outputs[0] if single else outputs,
            "warnings": unknown_warnings(sentences),
            "time_s": round(time.monotonic() - started, 4),
        }

    @app.post("/score", summary="Score given translations (forced decoding)", dependencies=guarded)
    async def score(body: ScoreRequest, request: Request) -> Any:  # type: ignore[valid-type]
        started = time.monotonic()
        single = isinstance(body.src, str)
        if single != isinstance(body.tgt, str):
            raise RequestError(
                "src and tgt must both be one sentence (a string) or both lists, one "
                "translation a sentence"
            )
        texts, tgts = ([body.src], [body.tgt]) if single else (body.src, body.tgt)
        _, search, sentences = checked(body, texts, tgts)
        targets = engine.targets(tgts, sentences)
        longest = sorted(range(len(targets)), key=lambda i: len(targets[i]), reverse=True)
        batch = longest[: limits.max_batch]
        need = engine.score_bytes([sentences[i] for i in batch], [targets[i] for i in batch])
        if need / 2**20 > limits.max_search_mb:
            raise RequestError(
                f"scoring these would hold about {need / 2**20:,.0f} MB, more than this "
                f"server's --max-search-mb {limits.max_search_mb:g}: send fewer or shorter "
                "sentences",
                status=413,
            )
        loop = asyncio.get_running_loop()
        job = Job(sentences, search, loop.create_future(), loop, targets=targets)
        found = await answered(request, job, started)
        return {
            **(found[0] if single else {"scores": found}),
            "warnings": unknown_warnings(sentences),
            "time_s": round(time.monotonic() - started, 4),
        }

    def one_sentence(body: BaseModel) -> tuple[Engine, Sentence, Search]:
        """The engine a one-sentence request asks, its sentence (not blank) and search."""
        _, search, sentences = checked(body, [body.src])
        if not sentences[0].ids:
            raise RequestError("src is blank: send a sentence to translate")
        return engine_of(body), sentences[0], search

    async def alone(
        request: Request, started: float, asked: Engine, sentence: Sentence, search: Search,
        work: Callable[[Callable[[], bool] | None], Any],
    ) -> Any:  # fmt: skip
        """work(stop) on the worker, a job of its own: what the checkpoint alone can answer
        (an export's engine refuses it in one line before it queues)."""
        if asked.backend != "torch":
            work(None)  # says what to do instead
        loop = asyncio.get_running_loop()
        job = Job([sentence], search, loop.create_future(), loop)
        job.work = lambda: work(job.expired)
        found = await answered(request, job, started)
        return {**found, "time_s": round(time.monotonic() - started, 4)}

    @app.post("/search", summary="The beam search as a tree", dependencies=guarded)
    async def search_tree(body: SearchRequest, request: Request) -> Any:  # type: ignore[valid-type]
        started = time.monotonic()
        if body.top_k < 1:
            raise RequestError(f"top_k must be at least 1 (alternatives a step), got {body.top_k}")
        if body.top_k > limits.max_top_k:
            raise RequestError(
                f"top_k {body.top_k} is more than this server's --max-top-k "
                f"{limits.max_top_k}: ask for fewer alternatives a step",
                status=413,
            )
        asked, sentence, search = one_sentence(body)
        nodes = sentence.limit * search.decoding.beam_size * (body.top_k + 1)
        if asked.backend == "torch" and nodes > limits.max_trace:
            raise RequestError(
                f"this tree could have {nodes:,} nodes ({sentence.limit} steps x beam "
                f"{search.decoding.beam_size} x {body.top_k + 1}), more than this server's "
                f"--max-trace {limits.max_trace:,}: ask for a narrower beam, fewer "
                "alternatives (top_k) or a smaller max_len",
                status=413,
            )
        work = lambda stop: asked.trace(sentence, search, body.top_k, stop=stop)  # noqa: E731
        return await alone(request, started, asked, sentence, search, work)

    @app.post("/what-if", summary="Force one step's attention, decode on", dependencies=guarded)
    async def what_if(body: WhatIfRequest, request: Request) -> Any:  # type: ignore[valid-type]
        started = time.monotonic()
        asked, sentence, search = one_sentence(body)
        ask = (sentence, search, body.step, body.layer, body.source, body.head)
        work = lambda stop: asked.what_if(*ask)  # noqa: E731  (greedy: too short to stop)
        return await alone(request, started, asked, sentence, search, work)

    @app.post("/attention", summary="The output and its attention", dependencies=guarded)
    async def attention(body: AttentionRequest, request: Request) -> Any:  # type: ignore[valid-type]
        started = time.monotonic()
        await loaded(body)
        asked, sentence, search = one_sentence(body)
        work = lambda stop: asked.attention(sentence, search, stop=stop)  # noqa: E731
        return await alone(request, started, asked, sentence, search, work)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


def unknown_warnings(sentences: list) -> list[str]:
    return [
        f"src[{i}]: {s.unknown} unknown token(s) mapped to <unk>"
        for i, s in enumerate(sentences)
        if s.unknown
    ]


class BodyRefused(HTTPException):
    """A body past --max-body, or one that has not arrived by --timeout: raised while the app
    reads it (FastAPI's HTTPException, which its body parsing passes on as it is)."""


class BodyLimit:
    """ASGI middleware: a body larger than max_body is refused with 413 from its Content-Length
    before any of it is read, or, sent in chunks, as soon as the bytes read pass the limit;
    a body still arriving timeout_s after the request came (a client that trickles it, or
    never ends it) is refused with 408. Either way the connection closes and nothing more of
    the body is read. Not FastAPI's own max_body_size (in its recent releases): that bounds
    the size only, not the time, and answers in its own form, not this service's one line."""

    def __init__(self, app: Any, max_body: int, timeout_s: float) -> None:
        self.app, self.max_body, self.timeout_s = app, max_body, timeout_s

    def too_large(self, size: str) -> str:
        return (
            f"the body has {size} bytes, more than this server's --max-body {self.max_body:,}: "
            "send the sentences in several requests"
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            response = JSONResponse(
                {"error": self.too_large(f"{int(length):,}")},
                status_code=413,
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        read, whole = 0, False

        async def limited() -> dict:
            nonlocal read, whole
            if whole:  # the body is in: what comes now is the client going away
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                raise BodyRefused(
                    408,
                    f"the body did not arrive within the server's --timeout of "
                    f"{self.timeout_s:g} s: send it whole, at once",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if read > self.max_body:
                    raise BodyRefused(
                        413, self.too_large(f"over {self.max_body:,}"), {"Connection": "close"}
                    )
            return message

        await self.app(scope, limited, send)


def not_utf8(error: UnicodeDecodeError) -> str:
    """A body that is not UTF-8, in one line naming the field where the bad byte is."""
    before = bytes(error.object[: error.start]).decode("utf-8", "replace")
    fields = re.findall(r'"([^"\\]+)"\s*:', before)
    where = f" in {fields[-1]}" if fields else ""
    byte = bytes(error.object[error.start : error.start + 1]).hex()
    return (
        f"the body is not UTF-8: byte 0x{byte} at position {error.start}{where} is not "
        "valid text: send the text encoded as UTF-8"
    )


def validation_message(error: RequestValidationError, fields: type[BaseModel]) -> str:
    """FastAPI's list of validation errors as one line: the first, naming its field."""
    errors = error.errors()
    first = errors[0]
    kind, location = first.get("type", ""), [p for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        return 'the body is not valid JSON: send an object such as {"src": "a sentence"}'
    if not location or kind == "model_attributes_type":
        return (
            'the body must be a JSON object such as {"src": "a sentence"}, sent as '
            "Content-Type: application/json"
        )
    field = str(location[0])
    if kind == "extra_forbidden":
        hint = checks.nearest(field, fields.model_fields)
        return f"{field} is not a setting of this endpoint; {hint}"
    if kind == "missing":
        return f'{field} is missing: send {{"{field}": ...}} (see /docs)'
    given = first.get("input")
    if field in ("src", "tgt") and fields in (TranslateRequest, ScoreRequest):  # str | list
        item = next((e for e in errors if len(e["loc"]) > 3 and isinstance(e["loc"][3], int)), None)
        if item is not None:
            return f"{field}[{item['loc'][3]}] must be a string, got {_shown(item.get('input'))}"
        return f"{field} must be a sentence (a string) or a list of them, got {_shown(given)}"
    message = first.get("msg", "is not valid")
    return f"{field}: {message[0].lower()}{message[1:]}, got {_shown(given)}"


def _shown(value: Any) -> str:
    """A value as an error shows it: JSON's own spelling, cut at 80 characters."""
    import json

    return json.dumps(value)[:80]
