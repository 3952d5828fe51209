"""The HTTP service and its page, as users meet them: FastAPI's TestClient for the schema and
every error; real servers (`python -m seq2seq.serve`, uvicorn on a free loopback port) for
answers that equal translate's whatever the concurrency, auth, limits, the deadline and a
SIGTERM drain; and a real browser (Debian's chromium, driven by Playwright) on the page.

The extra `serve` (and Playwright, in `dev`) may be left out deliberately: the tests then skip,
except in CI (CI=true), where a missing piece fails them."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import ServeProcess, need, one_line_error

need("fastapi")
httpx = need("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.inference import Engine, Settings  # noqa: E402
from seq2seq.serve.app import Limits, create_app  # noqa: E402
from seq2seq.translate import parse_args, translate  # noqa: E402

SENTENCES = [" ".join(random.Random(i).choices("0123456789", k=1 + i % 9)) for i in range(40)]


def translated(model: list[str], texts: list[str], *options: str) -> list[str]:
    """What `python -m seq2seq.translate` prints for these inputs and options, line by line."""
    import torch

    with torch.inference_mode():
        return translate(parse_args([*model, *options, *texts]))


@pytest.fixture(scope="module")
def ckpt(trained) -> str:
    return trained[0]["best_checkpoint"]


@pytest.fixture(scope="module")
def engine(ckpt: str) -> Engine:
    return Engine(ckpt)


@pytest.fixture(scope="module")
def client(engine: Engine):
    limits = Limits(max_sentences=10, max_chars=200)
    with TestClient(create_app(engine, limits)) as test_client:
        yield test_client


# --- the app, in process ----------------------------------------------------------------------


def test_the_schema_documents_every_endpoint_and_the_page_is_served(client) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/health", "/info", "/translate", "/attention"} <= set(schema["paths"])
    fields = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert {"src", "beam", "n_best", "length_penalty", "max_len", "sample", "seed"} <= set(fields)
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and 'id="heatmap"' in page.text
    assert "http" not in re.sub(r"<!--.*?-->", "", page.text)  # nothing fetched from elsewhere
    assert client.get("/health").json()["status"] == "ok"


def test_info_says_what_is_loaded_and_how_it_tested(client, ckpt, trained) -> None:
    import hashlib

    info = client.get("/info").json()
    assert info["backend"] == "torch" and info["path"] == str(Path(ckpt).resolve())
    assert info["sha256"] == hashlib.sha256(Path(ckpt).read_bytes()).hexdigest()
    assert info["parameters"] == 235_264 and info["tokenizer"]["src_vocab_size"] == 14
    assert info["decoding"] == {"max_len_a": 1.0, "max_len_b": 5, "beam_size": 1,
                                "length_penalty": 1.0}  # fmt: skip
    assert info["test"] == trained[0]["test"]  # the run tested this checkpoint
    assert info["signatures"]["bleu"].startswith("nrefs:1|")


@pytest.mark.parametrize(
    "options",
    [[], ["--beam", "3"], ["--beam", "4", "--n-best", "3"], ["--sample", "--seed", "7"],
     ["--max-len", "3"], ["--beam", "3", "--length-penalty", "0.5"]],
    ids=["greedy", "beam", "n-best", "sampling", "max-len", "length-penalty"],
)  # fmt: skip
def test_answers_are_what_translate_prints(client, ckpt, options: list[str]) -> None:
    """A string gives a string, a list a list (blank lines: empty outputs), each as
    `python -m seq2seq.translate` prints it for the same inputs and options."""
    body: dict = {}
    for name, value in itertools.pairwise([*options, None]):
        if name.startswith("--"):
            key = name[2:].replace("-", "_")
            is_flag = value is None or value.startswith("--")
            body[key] = True if is_flag else float(value) if "." in value else int(value)
    texts = [*SENTENCES[:6], "", *SENTENCES[6:8]]
    expected = translated(["--ckpt", ckpt], texts, *options)
    answer = client.post("/translate", json={"src": texts, **body}).json()
    n_best = body.get("n_best", 1)
    if n_best == 1:
        assert answer["tgt"] == expected
        single = client.post("/translate", json={"src": texts[0], **body}).json()
        alone = translated(["--ckpt", ckpt], texts[:1], *options)  # a draw: the batch's own
        assert single["tgt"] == alone[0] and isinstance(single["n_best"], list)
    else:  # translate prints INDEX<TAB>SCORE<TAB>OUTPUT, n_best lines an input
        lines = [
            f"{i}\t{math.nan if h['score'] is None else h['score']:.4f}\t{h['tgt']}"
            for i, hyps in enumerate(answer["n_best"])
            for h in hyps
        ]
        assert lines == expected
    assert answer["time_s"] > 0 and answer["warnings"] == []


BAD = [
    ("{src", 422, "the body is not valid JSON"),
    ("[]", 422, "the body must be a JSON object"),
    ({"src": 5}, 422, "src must be a sentence (a string) or a list of them, got 5"),
    ({"src": ["1 2", 3]}, 422, "src[1] must be a string, got 3"),
    ({"src": []}, 422, "src is an empty list: send at least one sentence"),
    ({}, 422, 'src is missing: send {"src": ...}'),
    ({"src": "1", "beem": 2}, 422, "beem is not a setting of this endpoint; did you mean beam?"),
    ({"src": "1", "beam": 0}, 422, "beam must be at least 1, got 0"),
    ({"src": "1", "beam": "4"}, 422, 'beam: input should be a valid integer, got "4"'),
    ({"src": "1", "beam": 2, "n_best": 3}, 422, "n_best 3 needs a beam at least as wide"),
    ({"src": "1", "sample": True, "beam": 2}, 422, "sample draws one output per input"),
    ({"src": "1", "temperature": 0}, 422, "temperature must be a positive number, got 0"),
    ({"src": "1", "top_p": 1.5}, 422, "top_p must be in (0, 1], got 1.5"),
    ({"src": "1", "top_k": -1}, 422, "top_k must be 0 (all tokens) or more, got -1"),
    ({"src": "1", "seed": -1}, 422, "seed must be in 0-4294967295 (both backends take 32"),
    ({"src": "1", "seed": 2**32}, 422, "seed must be in 0-4294967295"),
    ({"src": "1", "sample": True, "temperature": 1e-40}, 422, "temperature must be at least"),
    ({"src": "1", "beam": 65}, 413, "beam 65 is more than this server's --max-beam 64"),
    ({"src": "1", "n_best": 65}, 413, "n_best 65 is more than this server's --max-beam 64"),
    ('{"src": ["1", "\\ud800"]}', 422, "src[1] is not valid text: character 0 is a lone"),
    ('{"src": "1 \\udfff 2"}', 422, "src[0] is not valid text: character 2 is a lone"),
    (b'{"src": "1 \xff 2"}', 422, "the body is not UTF-8: byte 0xff at position 11 in src is"),
    ({"src": "1", "max_len": 0}, 422, "max_len must be at least 1, got 0"),
    ({"src": ["1"] * 11}, 413, "src has 11 sentences, more than this server's --max-sentences 10"),
    ({"src": ["1 " * 60, "2 " * 60]}, 413, "src has 240 characters, more than this server's"),
    ({"src": "1 " * 80}, 422, "src[0] has 80 tokens, more than the model's 64: shorten it, or"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD, ids=[m[:24] for *_, m in BAD])
def test_bad_requests_get_one_line_naming_the_field_and_the_server_goes_on(
    client, body, status: int, message: str
) -> None:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    response = client.post(
        "/translate", content=content, headers={"Content-Type": "application/json"}
    )
    assert message in one_line_error(response, status)
    assert client.post("/translate", json={"src": "1 2 3"}).status_code == 200


def test_unknown_paths_and_methods_and_attention_errors_are_one_line(client) -> None:
    assert one_line_error(client.get("/nowhere"), 404) == "no endpoint GET /nowhere: see /docs"
    assert "does not take GET" in one_line_error(client.get("/translate"), 405)
    assert "src is blank" in one_line_error(client.post("/attention", json={"src": "  "}), 422)
    error = one_line_error(client.post("/attention", json={"src": "1", "n_best": 2}), 422)
    assert error.startswith("n_best is not a setting of this endpoint")


def test_a_long_sentence_is_cut_when_the_request_asks(client, ckpt) -> None:
    long = " ".join("7" * 70)
    answer = client.post("/translate", json={"src": long, "truncate": True}).json()
    assert answer["tgt"] == translated(["--ckpt", ckpt], [long], "--truncate")[0]


def test_unknown_tokens_are_counted_as_translate_warns(client) -> None:
    answer = client.post("/translate", json={"src": ["1 x 2 y", "3"]}).json()
    assert answer["warnings"] == ["src[0]: 2 unknown token(s) mapped to <unk>"]


def test_attention_is_every_layer_and_head_of_the_output_shown(client, engine, ckpt) -> None:
    """The best output for the search asked, and the attention the checkpoint's model gives
    while producing it (TrainedModel.attention, what inspect --attention draws)."""
    import torch

    text = SENTENCES[12]
    answer = client.post("/attention", json={"src": text, "beam": 3}).json()
    assert answer["tgt"] == translated(["--ckpt", ckpt], [text], "--beam", "3")[0]
    module = engine.model.module
    src = module.src_vocab.encode(text)
    assert answer["src_tokens"] == text.split()
    assert answer["tgt_tokens"][-1] == "<eos>"
    output = [module.tgt_vocab.stoi[t] for t in answer["tgt_tokens"]]
    reference = module.attention(src, output)
    config = module.config
    for kind, rows, cols in (("cross", len(output), len(src)), ("self", len(output),
                              len(output)), ("encoder", len(src), len(src))):  # fmt: skip
        layers = config.num_encoder_layers if kind == "encoder" else config.num_decoder_layers
        got = torch.tensor(answer[kind], dtype=torch.float64)
        assert got.shape == (layers, config.num_heads, rows, cols)
        torch.testing.assert_close(got, torch.stack(reference[kind]).double(), atol=5e-5, rtol=0)
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1], dtype=got.dtype),
                                   atol=1e-3, rtol=0)  # fmt: skip
    assert torch.tensor(answer["self"]).triu(1).abs().max() == 0  # causal


def test_concurrent_sampling_requests_are_drawn_each_from_its_own_seed(client) -> None:
    """Sampling requests that arrive together are never searched together: each answer is the
    one the request gets alone (a joint draw would give others)."""
    requests = [
        {"src": SENTENCES[10:14], "sample": True, "temperature": 3.0, "seed": seed}
        for seed in range(8)
    ]
    alone = [client.post("/translate", json=r).json()["tgt"] for r in requests]
    assert len({json.dumps(a) for a in alone}) > 1  # the seeds draw differently
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda r: client.post("/translate", json=r), requests))
    assert [answer.json()["tgt"] for answer in together] == alone


def test_a_token_guards_every_endpoint_but_health_and_the_page(engine) -> None:
    with TestClient(create_app(engine, token="s3cret")) as guarded:
        for method, path in (("get", "/info"), ("post", "/translate"), ("post", "/attention")):

            def call(headers: dict | None = None, method=method, path=path):
                body = {"json": {"src": "1"}} if method == "post" else {}
                return guarded.request(method, path, headers=headers, **body)

            response = call()
            assert "needs its token" in one_line_error(response, 401)
            assert response.headers["www-authenticate"] == "Bearer"
            assert call({"Authorization": "Bearer no"}).status_code == 401
            for other in ("Basic s3cret", "s3cret", "Token s3cret", "Bearers3cret"):
                assert call({"Authorization": other}).status_code == 401, other
            assert call({"Authorization": "Bearer s3cret"}).status_code == 200
            assert call({"Authorization": "bearer s3cret"}).status_code == 200  # RFC 7235
        assert guarded.get("/health").status_code == 200 and guarded.get("/").status_code == 200


def test_the_export_serves_what_translate_model_prints(ckpt, tmp_path: Path) -> None:
    need("ctranslate2")
    from seq2seq.export import export

    exported = export(ckpt, tmp_path / "ct2")
    with TestClient(create_app(Engine(model_dir=str(exported)))) as ct2:
        texts = SENTENCES[:10]
        for options, body in (([], {}), (["--beam", "3", "--n-best", "1"], {"beam": 3})):
            answer = ct2.post("/translate", json={"src": texts, **body}).json()
            assert answer["tgt"] == translated(["--model", str(exported)], texts, *options)
        assert ct2.get("/info").json()["backend"] == "ctranslate2"
        error = one_line_error(ct2.post("/attention", json={"src": "1 2"}), 501)
        assert error.startswith("attention needs the checkpoint: serve it with")


def test_an_exports_greedy_search_stops_between_its_tokens(ckpt, tmp_path: Path) -> None:
    """CTranslate2 asks the stop after every token of a greedy search: a 40-token output is
    given up after the third, not finished."""
    need("ctranslate2")
    from seq2seq.core.decoding import SearchStopped
    from seq2seq.export import export

    engine = Engine(model_dir=str(export(ckpt, tmp_path / "ct2")))
    settings = Settings(beam=1)
    search = engine.search(settings)
    sentences = engine.encode([" ".join("7" * 40)], settings, search)
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(SearchStopped):
        engine.generate(sentences, search, stop=stop)
    assert len(asked) < 10, len(asked)


# --- real servers on loopback ------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(ckpt: str):
    """A: open, batching over 50 ms; B: a token and a 0.3 s deadline; C: for the SIGTERM
    drain. B may wait 1 s for company, C 3 s: once a search has held 5 sentences, a lone one
    waits that long for as many again (so B's passes its deadline, and C's is in flight when
    the signal comes, for longer than a drain cut short would wait). Started together."""
    made = {
        "A": ServeProcess(ckpt, "--wait-ms", "50", "--max-sentences", "40"),
        "B": ServeProcess(ckpt, "--token", "s3cret", "--timeout", "0.3", "--wait-ms", "1000"),
        "C": ServeProcess(ckpt, "--wait-ms", "3000"),
    }
    try:
        yield {name: server.ready() for name, server in made.items()}
    finally:
        for server in made.values():
            server.stop()


def decoded_alone(module, text: str, beam: int) -> str:
    """The sentence decoded alone by the core search, with none of translate's helpers: the
    model's own length rule written out, greedy_decode or beam_search on a batch of one."""
    import torch

    from seq2seq.core.decoding import beam_search, greedy_decode

    ids, rule = module.src_vocab.encode(text), module.decoding
    limit = int(rule.max_len_a * len(ids) + rule.max_len_b)
    limit = max(1, min(limit, module.config.max_positions))
    src = torch.tensor([ids])
    with torch.inference_mode():
        if beam == 1:
            out = greedy_decode(module.model, src, limit)[0]
        else:
            out = beam_search(module.model, src, limit, beam, rule.length_penalty)[0][0, 0]
    return module.tgt_vocab.decode(out.tolist())


def test_a_real_server_answers_as_translate_whatever_else_is_in_the_batch(
    servers, ckpt, engine
) -> None:
    """32 requests at once, greedy and beam mixed, one sentence each: every answer equals
    that sentence's answer alone, translate's output and the core search's for it alone, and
    the server searched them in fewer searches than requests (batching across requests)."""
    url = servers["A"].url
    requests = [{"src": SENTENCES[i], **({"beam": 3} if i % 2 else {})} for i in range(32)]
    alone = [httpx.post(f"{url}/translate", json=r, timeout=30).json()["tgt"] for r in requests]
    # A round of 8 sentences: the worker then waits (up to its 50 ms) for company, so requests
    # that arrive together are searched together however fast this machine decodes.
    httpx.post(f"{url}/translate", json={"src": SENTENCES[:8]}, timeout=30)
    before = httpx.get(f"{url}/health").json()
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda r: httpx.post(f"{url}/translate", json=r, timeout=60),
                                requests))  # fmt: skip
    after = httpx.get(f"{url}/health").json()
    assert [a.json()["tgt"] for a in answers] == alone
    greedy = translated(["--ckpt", ckpt], SENTENCES[0:32:2])
    beam = translated(["--ckpt", ckpt], SENTENCES[1:32:2], "--beam", "3")
    assert alone[0::2] == greedy and alone[1::2] == beam
    module = engine.model.module
    assert alone == [decoded_alone(module, r["src"], r.get("beam", 1)) for r in requests]
    searches, sentences = (after[k] - before[k] for k in ("searches", "sentences"))
    assert sentences == 32 and searches < 32, (searches, sentences)
    listed = httpx.post(f"{url}/translate", json={"src": SENTENCES[:40]}, timeout=30).json()
    assert listed["tgt"] == translated(["--ckpt", ckpt], SENTENCES[:40])
    too_many = httpx.post(f"{url}/translate", json={"src": [*SENTENCES[:40], "1"]}, timeout=30)
    assert "--max-sentences 40" in one_line_error(too_many, 413)


def test_a_real_server_with_a_token_and_a_deadline(servers) -> None:
    url, right = servers["B"].url, {"Authorization": "Bearer s3cret"}
    assert httpx.get(f"{url}/info").status_code == 401
    assert httpx.get(f"{url}/info", headers=right).json()["auth"] is True
    five = httpx.post(f"{url}/translate", json={"src": SENTENCES[:5]}, headers=right, timeout=30)
    assert five.status_code == 200  # no company to wait for: answered at once
    late = httpx.post(f"{url}/translate", json={"src": "1 2"}, headers=right, timeout=30)
    assert "--timeout of 0.3 s" in one_line_error(late, 504)
    assert httpx.get(f"{url}/health").json()["status"] == "ok"  # and it goes on


def test_sigterm_lets_the_requests_in_flight_finish_then_exits_0(servers, ckpt) -> None:
    server = servers["C"]
    # A round of 5 sentences: the worker then waits (up to its 3 s) for as many again, so the
    # next request is still in flight when SIGTERM comes, and for 2.6 s after it.
    httpx.post(f"{server.url}/translate", json={"src": SENTENCES[:5]}, timeout=60)
    answers: list = []

    def send() -> None:
        answer = httpx.post(f"{server.url}/translate", json={"src": SENTENCES[5]}, timeout=60)
        answers.append((answer, time.monotonic()))

    sending = threading.Thread(target=send)
    sending.start()
    time.sleep(0.4)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    sending.join(timeout=60)
    assert server.process.wait(timeout=60) == 0
    ((answer, answered),) = answers
    assert answered > signalled + 2  # in flight when the signal came, and answered 2 s after
    assert answer.status_code == 200
    assert answer.json()["tgt"] == translated(["--ckpt", ckpt], SENTENCES[5:6])[0]
    assert "stopped by SIGTERM; the requests in flight were answered" in "".join(server.output)
    with pytest.raises(httpx.TransportError):  # no longer listening
        httpx.get(f"{server.url}/health", timeout=2)


# --- the page, in a real browser ----------------------------------------------------------------


def test_the_page_translates_and_draws_the_attention_of_the_chosen_layer_and_head(
    servers, ckpt, tmp_path: Path
) -> None:
    """Debian's chromium, through Playwright: type a sentence, click Translate; the output is
    translate's, and the heat map is drawn for the chosen kind, layer and head from /attention."""
    from helpers import drive_page

    if not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    need("playwright")
    url, text = servers["A"].url, SENTENCES[7]
    shown = drive_page(url, text, tmp_path / "page.png", kind="cross", layer=1, head=2)
    assert shown["tgt"] == translated(["--ckpt", ckpt], [text])[0]
    assert shown["error"] == ""
    attention = httpx.post(f"{url}/attention", json={"src": text, "beam": 1}).json()
    assert shown["table"] == {"kind": "cross", "layer": "1", "head": "2"}
    assert shown["rows"] == attention["tgt_tokens"] and shown["cols"] == attention["src_tokens"]
    expected = [[f"{v:.4f}" for v in row] for row in attention["cross"][1][2]]
    assert shown["cells"] == expected
    assert (tmp_path / "page.png").read_bytes()[:4] == b"\x89PNG"


def test_the_pages_heat_map_is_of_the_output_shown_for_a_beam_model(ckpt, tmp_path: Path) -> None:
    """A checkpoint whose own search is beam 4 with a length penalty of 20 (long outputs win),
    on a sentence where that search and greedy search differ: the page shows the beam's output
    and the attention of that output, not of the greedy one."""
    import torch
    from helpers import drive_page

    if not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    need("playwright")
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["hyper_parameters"]["decoding"] |= {"beam_size": 4, "length_penalty": 20.0}
    beam_ckpt = tmp_path / "beam4.ckpt"
    torch.save(checkpoint, beam_ckpt)
    model = ["--ckpt", str(beam_ckpt)]
    searched = translated(model, SENTENCES)
    greedy = translated(model, SENTENCES, "--beam", "1")
    differ = [i for i, (b, g) in enumerate(zip(searched, greedy, strict=True)) if b != g]
    assert differ, "beam 4 at length penalty 20 gave greedy's outputs: pick another penalty"
    text = SENTENCES[differ[0]]
    server = ServeProcess(str(beam_ckpt), "--wait-ms", "0").ready()
    try:
        shown = drive_page(server.url, text, tmp_path / "page.png", kind="cross", layer=1, head=0)
        assert shown["error"] == "" and shown["tgt"] == searched[differ[0]]
        beam = httpx.post(f"{server.url}/attention", json={"src": text, "beam": 4}).json()
        first = httpx.post(f"{server.url}/attention", json={"src": text, "beam": 1}).json()
    finally:
        server.stop()
    assert shown["rows"] == beam["tgt_tokens"] != first["tgt_tokens"]
    assert shown["cells"] == [[f"{v:.4f}" for v in row] for row in beam["cross"][1][0]]


def test_bad_serve_options_and_models_are_one_line_before_it_listens(ckpt, tmp_path, capsys):
    import socket

    from seq2seq.serve import cli

    with pytest.raises(SystemExit) as stop:
        cli.main([])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: give a checkpoint (CKPT) or an export (--model DIR), one of them "
        "(see python -m seq2seq.serve --help)"
    ]
    for argv, message in (
        (["--max-beam", "0"], "--max-beam must be at least 1, got 0"),
        (["--max-body", "0"], "--max-body must be at least 1, got 0"),
        (["--max-search-mb", "-1"], "--max-search-mb must be positive, got -1"),
    ):
        with pytest.raises(SystemExit) as stop:
            cli.main([ckpt, *argv])
        assert stop.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {message}"), line
    for argv, message in (
        ([str(tmp_path / "none.ckpt")], f"error: checkpoint {tmp_path / 'none.ckpt'} does not"),
        (["--model", str(tmp_path)], f"error: --model {tmp_path} is not a seq2seq export"),
    ):
        assert cli.main(argv) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(message), line
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        assert cli.main([ckpt, "--port", str(taken.getsockname()[1])]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert (
            line.startswith("error: cannot listen on 127.0.0.1:") and "pick another --port" in line
        )
    finally:
        taken.close()


def test_the_token_comes_from_the_option_or_the_environment(ckpt, monkeypatch) -> None:
    from seq2seq.serve.cli import TOKEN_VARIABLE, parse_args

    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    assert parse_args([ckpt]).token is None  # open
    monkeypatch.setenv(TOKEN_VARIABLE, "from-env")
    assert parse_args([ckpt]).token == "from-env"
    assert parse_args([ckpt, "--token", "given"]).token == "given"
