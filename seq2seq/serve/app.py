"""The HTTP service: FastAPI's app over an Engine (the model) and a Batcher (its worker).

    GET  /health      liveness, cheap
    GET  /info        what is loaded (the file and its hash, sizes, languages, tokenizer,
                      decoding defaults, backend, the run's test score and signatures)
    POST /translate   {"src": "..." | ["...", ...], beam, n_best, length_penalty, max_len,
                       sample, temperature, top_k, top_p, seed, truncate}
    POST /attention   {"src": "...", beam, length_penalty, max_len, truncate}: the output's
                      tokens and every layer's and head's attention (checkpoint backend)
    GET  /            the page (seq2seq/serve/page.html); FastAPI's /docs

Every error is JSON, {"error": "one line naming the field and the fix"}, with its status: 401
without the token (where one is set), 408 for a body still arriving at the deadline, 413 past
the size limits (sentences, characters, beam, the body, a search's memory), 422 for a bad
request (invalid text included), 501 for attention from an export, 503 when the queue is full
or the server is stopping, 504 past the deadline.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from seq2seq import checks
from seq2seq.core.decoding import SearchStopped
from seq2seq.serve.batcher import Batcher, Job
from seq2seq.serve.engine import Engine, RequestError, Settings

__all__ = ["Limits", "create_app"]

PAGE = Path(__file__).with_name("page.html")


@dataclass(frozen=True)
class Limits:
    """What one request may ask, and how long the server waits for it (the serve options)."""

    max_sentences: int = 64  # sentences a request
    max_chars: int = 20_000  # characters a request, all its sentences together
    timeout_s: float = 30.0  # from arrival to answer; past it, 504
    max_queue: int = 4096  # sentences waiting; past it, 503
    max_batch: int = 32  # sentences one search decodes together (1: no batching)
    wait_ms: float = 20.0  # how long the worker may wait for more sentences to batch
    max_beam: int = 64  # beam width and n_best a request may ask (the page offers up to 64)
    max_search_mb: float = 2048.0  # memory one search may hold (Engine.search_bytes); past it, 413
    max_body: int = 1 << 20  # bytes a request's body may have (20,000 characters in JSON's
    # escapes take at most 240 kB); past it, 413 before the rest is read


class SearchSettings(BaseModel):
    """translate's search options (None: the model's own)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    beam: int | None = Field(None, description="beam width (1: greedy); default the model's")
    length_penalty: float | None = Field(None, description="log-prob / length ** this")
    max_len: int | None = Field(None, description="most output tokens; default a * len + b")
    truncate: bool = Field(False, description="cut a sentence longer than the model accepts")


class TranslateRequest(SearchSettings):
    src: str | list[str] = Field(description="a sentence, or a list of them")
    n_best: int = Field(1, description="outputs a sentence (<= beam)")
    sample: bool = Field(False, description="draw each token instead of searching")
    temperature: float = 1.0
    top_k: int = Field(0, description="sample from the k most likely (0: all)")
    top_p: float = Field(1.0, description="sample from the most likely reaching p (1: all)")
    seed: int = Field(0, description="where sampling's draw starts")


class AttentionRequest(SearchSettings):
    src: str = Field(description="one sentence")


def create_app(
    engine: Engine,
    limits: Limits | None = None,
    token: str | None = None,
    batcher: Batcher | None = None,
) -> FastAPI:
    """The app; its worker (a Batcher of its own in a thread, unless one is given) starts
    with the app and stops, once the work queued is done, with it."""
    limits = limits or Limits()
    info = {**engine.info(), "limits": limits.__dict__, "auth": token is not None}
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
        fields = AttentionRequest if request.url.path == "/attention" else TranslateRequest
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
                if failure is not None:  # logged by the worker; the server goes on
                    detail = " ".join(str(failure).split())[:300]
                    raise RequestError(f"the search failed: {detail}", status=500)
                return job.future.result()
            if await request.is_disconnected():
                job.cancelled = True
                return None

    def checked(body: SearchSettings, texts: list[str], **more: Any) -> tuple:
        if not texts:
            raise RequestError("src is an empty list: send at least one sentence")
        if len(texts) > limits.max_sentences:
            raise RequestError(
                f"src has {len(texts)} sentences, more than this server's --max-sentences "
                f"{limits.max_sentences}: send them in several requests",
                status=413,
            )
        chars = sum(len(text) for text in texts)
        if chars > limits.max_chars:
            raise RequestError(
                f"src has {chars:,} characters, more than this server's --max-chars "
                f"{limits.max_chars:,}: send them in several requests",
                status=413,
            )
        settings = Settings(
            beam=body.beam, length_penalty=body.length_penalty, max_len=body.max_len,
            truncate=body.truncate, **more,
        )  # fmt: skip
        for name in ("beam", "n_best"):
            value = getattr(settings, name)
            if value is not None and value > limits.max_beam:
                raise RequestError(
                    f"{name} {value} is more than this server's --max-beam {limits.max_beam}: "
                    "ask for a narrower search",
                    status=413,
                )
        search = engine.search(settings)
        sentences = engine.encode(texts, settings, search)
        # The largest search this request can make: its longest sentences, a batch of them.
        longest = sorted(sentences, key=lambda s: (len(s.ids), s.limit), reverse=True)
        batch = longest[: limits.max_batch]
        need = engine.search_bytes(batch, search) / 2**20
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

    @app.post("/translate", summary="Translate a sentence or a list", dependencies=guarded)
    async def translate(body: TranslateRequest, request: Request) -> Any:
        started = time.monotonic()
        single = isinstance(body.src, str)
        texts = [body.src] if single else body.src
        more = {k: getattr(body, k) for k in ("n_best", "sample", "temperature", "top_k", "top_p",
                                               "seed")}  # fmt: skip
        settings, search, sentences = checked(body, texts, **more)
        loop = asyncio.get_running_loop()
        seed = settings.seed if settings.sample else None
        job = Job(sentences, search, loop.create_future(), loop, seed=seed)
        found = await outcome(request, job, started)
        if found is None:
            return JSONResponse({"error": "the client went away"}, status_code=499)
        outputs = [
            [{"tgt": engine.text(ids), "score": None if math.isnan(s) else s} for s, ids in hyps]
            for hyps in found
        ]
        warnings = [
            f"src[{i}]: {s.unknown} unknown token(s) mapped to <unk>"
            for i, s in enumerate(sentences)
            if s.unknown
        ]
        tgt = [hyps[0]["tgt"] for hyps in outputs]
        return {
            "tgt": tgt[0] if single else tgt,
            "n_best": outputs[0] if single else outputs,
            "warnings": warnings,
            "time_s": round(time.monotonic() - started, 4),
        }

    @app.post("/attention", summary="The output and its attention", dependencies=guarded)
    async def attention(body: AttentionRequest, request: Request) -> Any:
        started = time.monotonic()
        _, search, sentences = checked(body, [body.src])
        if not sentences[0].ids:
            raise RequestError("src is blank: send a sentence to translate")
        if engine.backend != "torch":
            engine.attention(sentences[0], search)  # says what to do instead
        loop = asyncio.get_running_loop()
        job = Job(sentences, search, loop.create_future(), loop)
        job.work = lambda: engine.attention(sentences[0], search, stop=job.expired)
        found = await outcome(request, job, started)
        if found is None:
            return JSONResponse({"error": "the client went away"}, status_code=499)
        return {**found, "time_s": round(time.monotonic() - started, 4)}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


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
    if field == "src" and fields is TranslateRequest:  # str | list[str]: say both
        item = next((e for e in errors if len(e["loc"]) > 3 and isinstance(e["loc"][3], int)), None)
        if item is not None:
            return f"src[{item['loc'][3]}] must be a string, got {_shown(item.get('input'))}"
        return f"src must be a sentence (a string) or a list of them, got {_shown(given)}"
    message = first.get("msg", "is not valid")
    return f"{field}: {message[0].lower()}{message[1:]}, got {_shown(given)}"


def _shown(value: Any) -> str:
    """A value as an error shows it: JSON's own spelling, cut at 80 characters."""
    import json

    return json.dumps(value)[:80]
