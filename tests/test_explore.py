"""Exploring a model's choices (seq2seq/inference.py): a given translation's score (forced
decoding), outputs that continue a prefix, and the beam search as a tree; each checked against
the search's own figures, on the suite's trained copy model, through the Engine, translate and
a real server. The export's score_batch and target_prefix are checked in test_export.py."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from seq2seq import translate as translate_cli
from seq2seq.inference import OPTIONS, Engine, RequestError, Settings

SENTENCES = [" ".join(random.Random(i).choices("0123456789", k=2 + i % 7)) for i in range(24)]


@pytest.fixture(scope="module")
def engine(trained) -> Engine:
    return Engine(trained[0]["best_checkpoint"])


def outputs(engine: Engine, texts: list[str], **settings) -> list[list[tuple[float, list[int]]]]:
    chosen = Settings(**settings)
    search = engine.search(chosen)
    return engine.generate(engine.encode(texts, chosen, search), search)


def scores(engine: Engine, texts: list[str], targets: list[str], penalty=None) -> list[dict]:
    chosen = Settings(length_penalty=penalty)
    search = engine.search(chosen)
    sentences = engine.encode(texts, chosen, search)
    return engine.score(sentences, engine.targets(targets, sentences), search)


# --- the settings, declared once -------------------------------------------------------------


def test_every_setting_is_an_option_a_field_and_a_control(engine, trained, capsys) -> None:
    """translate's --help, the HTTP schema and /info's controls all come from OPTIONS."""
    from fastapi.testclient import TestClient

    from seq2seq.serve.app import create_app

    with pytest.raises(SystemExit):
        translate_cli.parse_args(["--help"])
    help_text = capsys.readouterr().out
    with TestClient(create_app(engine)) as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        controls = client.get("/info").json()["settings"]
    for option in OPTIONS:
        if "translate" in option.requests:
            assert option.flag in help_text
            assert schema["TranslateRequest"]["properties"][option.name]["description"] == (
                option.help
            )
        for request in option.requests:
            model = "".join(part.title() for part in request.split("_")) + "Request"
            assert option.name in schema[model]["properties"]
    assert [c["name"] for c in controls] == [o.name for o in OPTIONS]
    assert schema["SearchRequest"]["properties"]["top_k"]["default"] == 5


# --- scores -----------------------------------------------------------------------------------


@pytest.mark.parametrize("penalty", [0.0, 0.6, 1.0])
def test_the_score_of_each_beam_output_is_the_score_the_beam_reported(engine, penalty) -> None:
    found = outputs(engine, SENTENCES, beam=4, n_best=4, length_penalty=penalty)
    texts, targets, reported = [], [], []
    eos = engine.model.tgt_vocab.eos_id
    for text, hyps in zip(SENTENCES, found, strict=True):
        for score, ids in hyps:
            if eos in ids and ids.index(eos) > 0:  # ended, and not empty
                texts.append(text)
                targets.append(engine.text(ids))
                reported.append(score)
    assert len(reported) > len(SENTENCES)
    given = scores(engine, texts, targets, penalty)
    assert [g["score"] for g in given] == pytest.approx(reported, rel=1e-5, abs=1e-5)
    for g in given:
        assert g["logprob"] == pytest.approx(sum(t["logprob"] for t in g["tokens"]))
        assert g["mean"] == pytest.approx(g["logprob"] / len(g["tokens"]))
        assert g["tokens"][-1]["token"] == "<eos>"


def test_a_worse_translation_scores_lower_and_each_token_says_where(engine) -> None:
    text = "3 1 4 1 5 9"
    best = engine.text(outputs(engine, [text])[0][0][1])
    assert best == text  # the copy task: a trained model copies
    good, bad = scores(engine, [text, text], [best, "3 1 4 7 5 9"])
    assert bad["score"] < good["score"]
    worst = min(bad["tokens"], key=lambda t: t["logprob"])
    assert worst["token"] == "7"


def test_translate_score_prints_the_figures_of_post_score(engine, trained, tmp_path, capsys):
    refs = tmp_path / "refs.txt"
    refs.write_text("3 1 4\n2 7\n", encoding="utf-8")
    ckpt = trained[0]["best_checkpoint"]
    assert translate_cli.main(["--ckpt", ckpt, "--score", str(refs), "3 1 4", "2 7"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    want = scores(engine, ["3 1 4", "2 7"], ["3 1 4", "2 7"])
    assert [[float(x) for x in line] for line in lines] == [
        pytest.approx([w["score"], w["logprob"], w["mean"]], abs=1e-6) for w in want
    ]
    assert (
        translate_cli.main(["--ckpt", ckpt, "--score", str(refs), "--tokens", "3 1 4", "2 7"]) == 0
    )
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [[t["token"] for t in s["tokens"]] for s in shown] == [
        ["3", "1", "4", "<eos>"], ["2", "7", "<eos>"]
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("texts", "targets", "message"),
    [
        (["3 1"], [""], "tgt[0] is blank: send the translation to score"),
        (["3 1"], ["  "], "tgt[0] is blank"),
        (["3 1", "2"], ["3 1"], "src has 2 sentence(s) and tgt 1: send one translation a sentence"),
        (["3 1"], [" ".join(["1"] * 600)], "tgt[0] has 600 tokens, more than the model's"),
        ([""], ["3"], "the source of tgt[0] is blank"),
    ],
)
def test_what_cannot_be_scored_is_one_line(engine, texts, targets, message) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        scores(engine, texts, targets)


# --- prefixes ---------------------------------------------------------------------------------


def test_a_prefix_of_the_greedy_output_leaves_it_unchanged_for_every_length(engine) -> None:
    """For each sentence and each k, the first k tokens of the greedy output as a prefix (its
    text, healed and not) give the same output (every k of a sentence in one batch)."""
    checked = 0
    for text, hyps in zip(SENTENCES, outputs(engine, SENTENCES, beam=1), strict=True):
        ids = engine.model.module.output_ids(hyps[0][1])
        prefixes = [engine.text(ids[:k]) for k in range(1, len(ids) + 1)]
        for heal in (True, False):
            found = outputs(engine, [text] * len(prefixes), beam=1, prefix=prefixes, heal=heal)
            for k, again in enumerate(found, start=1):
                assert engine.model.module.output_ids(again[0][1]) == ids, (text, k, heal)
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("settings", [{"beam": 1}, {"beam": 4}, {"sample": True, "seed": 3}])
def test_every_search_begins_its_output_with_the_prefix(engine, settings) -> None:
    """A prefix the model would not choose ('9 9' for a copy model) is kept by greedy search,
    beam search and sampling, and the search goes on after it."""
    texts = ["3 1 4 1 5", "2 7 1 8"]
    found = outputs(engine, texts, prefix="9 9", heal=False, **settings)
    for hyps in found:
        words = engine.text(hyps[0][1]).split()
        assert words[:2] == ["9", "9"] and len(words) > 2


def test_a_beam_score_with_a_prefix_counts_the_prefix_tokens(engine) -> None:
    (score, ids), *_ = outputs(engine, ["3 1 4 1 5"], beam=4, prefix="3 1 7", heal=False)[0]
    forced = scores(engine, ["3 1 4 1 5"], [engine.text(ids)])[0]
    assert forced["score"] == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (" ".join(["1"] * 600), "prefix has 600 tokens, the model's limit is"),
        ("3 zz", "prefix has a token the model's target vocabulary lacks"),
        (["3", "4"], "prefix has 2 prefixes for 1 sentences"),
    ],
)
def test_a_prefix_the_model_cannot_begin_with_is_one_line(engine, prefix, message) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        outputs(engine, ["3 1 4"], prefix=prefix)


def test_translate_takes_a_prefix_and_a_file_of_them(engine, trained, tmp_path, capsys) -> None:
    ckpt = trained[0]["best_checkpoint"]
    assert translate_cli.main(["--ckpt", ckpt, "--prefix", "9", "3 1 4", "2 7"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["9", "9"]
    (tmp_path / "prefixes.txt").write_text("8\n\n", encoding="utf-8")
    options = ["--prefix-file", str(tmp_path / "prefixes.txt")]
    assert translate_cli.main(["--ckpt", ckpt, *options, "3 1 4", "2 7"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.split()[0] == "8" and second == engine.text(outputs(engine, ["2 7"])[0][0][1])
    assert translate_cli.main(["--ckpt", ckpt, *options, "3 1 4"]) == 1
    assert "--prefix-file has 2 lines for 1 inputs" in capsys.readouterr().err


# --- the search as a tree ----------------------------------------------------------------------


def traced(engine: Engine, text: str, top_k: int, **settings) -> dict:
    chosen = Settings(**settings)
    search = engine.search(chosen)
    return engine.trace(engine.encode([text], chosen, search)[0], search, top_k)


@pytest.mark.parametrize("beam", [1, 3, 5])
def test_the_trees_best_is_the_translation_and_its_kept_are_the_top_beam(engine, beam) -> None:
    """With every token shown (top_k = the vocabulary), each step's kept candidates are
    exactly the `beam` best of all by score, each next step's hypotheses are the kept ones
    (log-probability = parent's + log of the token's probability), and the best finished
    hypothesis and its score are the translation's."""
    vocab = len(engine.model.tgt_vocab)
    for text in SENTENCES[:8]:
        tree = traced(engine, text, vocab, beam=beam, length_penalty=0.6)
        for step, after in zip(tree["steps"], [*tree["steps"][1:], None], strict=True):
            assert sum(h["best"] for h in step["hypotheses"]) == 1  # the best output's way
            candidates = [
                (c["score"], h["slot"], c["id"], c) for h in step["hypotheses"] for c in h["next"]
            ]
            candidates.sort(key=lambda c: -c[0])
            kept = [c for c in candidates if c[3]["kept"]]
            assert len(kept) == min(beam, len(candidates))
            assert min(c[0] for c in kept) >= max([c[0] for c in candidates if not c[3]["kept"]]
                                                  or [-math.inf])  # fmt: skip
            if after is None:
                continue
            by_slot = {h["slot"]: h for h in step["hypotheses"]}
            for h in after["hypotheses"]:
                parent = by_slot[h["parent"]]
                choice = next(c for c in parent["next"] if c["slot"] == h["slot"])
                assert choice["id"] == h["id"]
                want = parent["logprob"] + math.log(choice["prob"]) if choice["prob"] else 0
                if not parent["finished"]:
                    assert h["logprob"] == pytest.approx(want, abs=1e-4)
        score, ids = outputs(engine, [text], beam=beam, length_penalty=0.6)[0][0]
        best = tree["finished"][0]
        assert best["tgt"] == engine.text(ids)
        if beam > 1:
            assert best["score"] == pytest.approx(score, abs=1e-6)


def test_a_tree_shows_top_k_alternatives_and_the_prefix(engine) -> None:
    tree = traced(engine, "3 1 4 1 5", 3, beam=2, prefix="3 1", heal=False)
    assert tree["prefix"] == ["3", "1"]
    first_free = tree["steps"][2]["hypotheses"]
    assert all(3 <= len(h["next"]) <= 5 for h in first_free)  # top 3 and any kept besides
    for h in tree["steps"][0]["hypotheses"]:  # a forced step: one possible token
        assert [c["token"] for c in h["next"]] == ["3"]


# --- a real server, and the page in a real browser ----------------------------------------------


@pytest.fixture(scope="module")
def server(trained):
    from helpers import ServeProcess

    pytest.importorskip("fastapi")
    made = ServeProcess(trained[0]["best_checkpoint"], "--wait-ms", "5").ready()
    yield made
    made.stop()


def test_a_real_server_scores_continues_and_traces(server, engine) -> None:
    import httpx

    url, text = server.url, "3 1 4 1 5"
    scored = httpx.post(f"{url}/score", json={"src": [text, "2 7"], "tgt": [text, "2 8"]}).json()
    want = scores(engine, [text, "2 7"], [text, "2 8"])
    assert [s["score"] for s in scored["scores"]] == pytest.approx([w["score"] for w in want])
    answer = httpx.post(f"{url}/translate", json={"src": text, "prefix": "9", "heal": False})
    assert answer.json()["tgt"].startswith("9 ")
    tree = httpx.post(f"{url}/search", json={"src": text, "beam": 3, "top_k": 2}).json()
    best = httpx.post(f"{url}/translate", json={"src": text, "beam": 3}).json()["n_best"][0]
    assert tree["finished"][0]["tgt"] == best["tgt"]
    assert tree["finished"][0]["score"] == pytest.approx(best["score"])
    for body, status, message in [
        ({"src": text, "tgt": ""}, 422, "tgt[0] is blank"),
        ({"src": [text], "tgt": text}, 422, "src and tgt must both be one sentence"),
        ({"src": text, "tgt": "1", "beam": 2}, 422, "beam is not a setting of this endpoint"),
    ]:
        refused = httpx.post(f"{url}/score", json=body)
        assert refused.status_code == status and message in refused.json()["error"]
    for body, status, message in [
        ({"src": text, "top_k": 21}, 413, "top_k 21 is more than this server's --max-top-k 20"),
        ({"src": text, "top_k": 0}, 422, "top_k must be at least 1"),
        (
            {"src": text, "beam": 64, "top_k": 20, "max_len": 64},
            413,
            "more than this server's --max-trace",
        ),
        ({"src": " "}, 422, "src is blank"),
    ]:
        refused = httpx.post(f"{url}/search", json=body)
        assert refused.status_code == status and message in refused.json()["error"], refused.text
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_the_page_draws_the_tree_branches_from_a_word_and_scores_your_translation(
    server, tmp_path: Path
) -> None:
    """In chromium: type a sentence, Translate, show the search, click an alternative at step
    2: the new output is /translate's with that prefix; type a translation, Score: the score
    shown is /score's."""
    import os
    import shutil

    import httpx

    if not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    from helpers import drive_explore

    url, text, own = server.url, "3 1 4 1 5 9", "3 1 4 7 5 9"
    shown = drive_explore(url, text, own, tmp_path / "explore.png", beam=3, step=1)
    prefix, branched, error = shown["prefix"], shown["branched"], shown["error"]
    shown_score = shown["own_score"]
    assert error == ""
    asked = {"src": text, "prefix": prefix, "heal": False, "beam": 3}
    assert branched == httpx.post(f"{url}/translate", json=asked).json()["tgt"]
    assert branched.startswith(prefix) and len(prefix.split()) == 2
    assert shown_score == httpx.post(f"{url}/score", json={"src": text, "tgt": own}).json()["score"]
    assert (tmp_path / "explore.png").read_bytes()[:4] == b"\x89PNG"


def test_scoring_past_the_memory_limit_is_refused_before_it_starts(engine) -> None:
    from fastapi.testclient import TestClient

    from seq2seq.serve.app import Limits, create_app

    long = " ".join(["7"] * (engine.max_positions - 2))
    small = Limits(max_search_mb=1.0)
    with TestClient(create_app(engine, small)) as client:
        one = client.post("/score", json={"src": "3 1", "tgt": "3 1"})
        assert one.status_code == 200
        many = client.post("/score", json={"src": [long] * 32, "tgt": [long] * 32})
        assert many.status_code == 413
        assert "more than this server's --max-search-mb 1" in many.json()["error"]
        assert client.get("/health").json()["status"] == "ok"
