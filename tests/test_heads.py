"""Attention heads switched off (Michel et al., 2019's head mask): the mask weighs each head's
output before the heads are joined. An all-ones mask changes nothing; a zero equals zeroing
that head's slice of the joined head outputs by hand, for every attention kind and with
grouped key/value heads; the loss's gradient with respect to the mask is what finite
differences say; and translate and the server switch heads off as asked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seq2seq.core.attention import mask_heads
from seq2seq.core.decoding import beam_search, greedy_decode
from seq2seq.core.model import ModelConfig, Seq2SeqTransformer

KINDS = ("encoder", "self", "cross")


def tiny(kv_heads: int | None = None, dtype=torch.float32) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = ModelConfig(13, 13, d_model=32, num_heads=4, d_ff=48, dropout=0.0,
                         max_positions=24, num_kv_heads=kv_heads)  # fmt: skip
    return Seq2SeqTransformer(config).to(dtype).eval()


def batch(dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(3, 13, (5, 7), generator=gen)
    src[3, 5:] = 0  # padding
    tgt = torch.randint(3, 13, (5, 6), generator=gen)
    labels = torch.randint(3, 13, (5, 6), generator=gen)
    return src, tgt, labels


def test_an_all_ones_mask_changes_nothing() -> None:
    model = tiny()
    src, tgt, _ = batch()
    every = {model.attention_module(kind, layer): torch.ones(4) for kind in KINDS
             for layer in range(2)}  # fmt: skip
    plain = model(src, tgt)
    found = (greedy_decode(model, src, 8), *beam_search(model, src, 8, 3, 0.6, n_best=2))
    with mask_heads(model, every):
        assert torch.equal(model(src, tgt), plain)
        again = (greedy_decode(model, src, 8), *beam_search(model, src, 8, 3, 0.6, n_best=2))
    assert all(torch.equal(a, b) for a, b in zip(found, again, strict=True))


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_a_zero_equals_zeroing_that_heads_slice_by_hand(kind, kv_heads) -> None:
    """The joined head outputs are the input of the output projection, (B, T, H * Dv): a hook
    zeroes head h's Dv columns there; the mask must give the same logits, with the cache too."""
    model = tiny(kv_heads)
    src, tgt, _ = batch()
    layer, head = 1, 2
    name = model.attention_module(kind, layer)
    module = dict(model.named_modules())[name]
    width = module.v_dim

    def zero_slice(mod, args):
        joined = args[0].clone()
        joined[..., head * width : (head + 1) * width] = 0
        return (joined,)

    handle = module.proj_o.register_forward_pre_hook(zero_slice)
    try:
        by_hand = model(src, tgt)
        greedy_by_hand = greedy_decode(model, src, 8)
    finally:
        handle.remove()
    assert not torch.allclose(by_hand, model(src, tgt))  # the head mattered
    with mask_heads(model, model.head_masks([(kind, layer, head)])):
        torch.testing.assert_close(model(src, tgt), by_hand, rtol=0, atol=1e-6)
        assert torch.equal(greedy_decode(model, src, 8), greedy_by_hand)


def test_the_masks_gradient_is_what_finite_differences_say() -> None:
    model = tiny(2, torch.float64)
    src, tgt, labels = batch()

    def loss(masks: dict) -> torch.Tensor:
        with mask_heads(model, masks):
            logits = model(src, tgt)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    names = [model.attention_module(kind, 1) for kind in KINDS]
    masks = {name: torch.ones(4, dtype=torch.float64, requires_grad=True) for name in names}
    loss(masks).backward()
    eps = 1e-6
    for name in names:
        for head in range(4):
            nudged = {n: m.detach().clone() for n, m in masks.items()}
            nudged[name][head] += eps
            up = loss(nudged)
            nudged[name][head] -= 2 * eps
            down = loss(nudged)
            estimate = (up - down) / (2 * eps)
            assert masks[name].grad[head].item() == pytest.approx(
                estimate.item(), rel=1e-5, abs=1e-9
            )


def test_a_mask_the_model_lacks_is_one_line() -> None:
    model = tiny()
    with pytest.raises(ValueError, match="cross attention has layers 0-1, got layer 5"):
        model.head_masks([("cross", 5, 0)])
    with pytest.raises(ValueError, match="encoder attention has heads 0-3, got head 4"):
        model.head_masks([("encoder", 0, 4)])
    wrong = {"decoder.layers.0.cross_attn": torch.ones(3)}
    with (
        pytest.raises(ValueError, match=r"must have shape \(4,\), got \(3,\)"),
        mask_heads(model, wrong),
    ):
        pass


# --- translate and the server -------------------------------------------------------------------


def test_translate_and_the_server_switch_off_the_heads_asked(trained, capsys) -> None:
    """Every cross-attention head of the copy model off: it can no longer copy. translate,
    /translate and /score agree with the core's search and forced decoding under that mask."""
    from fastapi.testclient import TestClient

    from seq2seq import translate as translate_cli
    from seq2seq.core.decoding import forced_log_probs
    from seq2seq.inference import Engine
    from seq2seq.serve.app import create_app

    ckpt = trained[0]["best_checkpoint"]
    engine = Engine(ckpt)
    net = engine.model.module.model
    layers, heads = net.config.num_decoder_layers, net.config.num_heads
    spec = ",".join(f"cross:{layer}:{head}" for layer in range(layers) for head in range(heads))
    text = "3 1 4 1 5 9 2"
    assert translate_cli.main(["--ckpt", ckpt, "--head-mask", spec, text]) == 0
    masked = capsys.readouterr().out.strip()
    assert masked != text  # without cross-attention the copy model cannot copy
    src = torch.tensor([engine.model.src_vocab.encode(text)])
    limit = engine.model.decoding.max_len(src.size(1), net.config.max_positions)
    off = [("cross", layer, head) for layer in range(layers) for head in range(heads)]
    with mask_heads(net, net.head_masks(off)):
        core = greedy_decode(net, src, limit)[0].tolist()
        eos = engine.model.tgt_vocab.eos_id
        target = torch.tensor([[*engine.model.tgt_vocab.encode(text), eos]])
        forced = forced_log_probs(net, src, target).sum().item()
    assert masked == engine.text(core)
    with TestClient(create_app(engine)) as client:
        answer = client.post("/translate", json={"src": text, "beam": 1, "head_mask": spec})
        assert answer.json()["tgt"] == masked
        scored = client.post("/score", json={"src": text, "tgt": text, "head_mask": spec})
        assert scored.json()["logprob"] == pytest.approx(forced, rel=1e-5)
        plain = client.post("/score", json={"src": text, "tgt": text}).json()["logprob"]
        assert plain > scored.json()["logprob"]
        for bad, message in [
            ("cross:1", "head_mask has 'cross:1': write each head as KIND:LAYER:HEAD"),
            ("cross:9:0", "head_mask: cross attention has layers 0-"),
            ("enc:0:99", "head_mask: encoder attention has heads 0-"),
        ]:
            refused = client.post("/translate", json={"src": text, "head_mask": bad})
            assert refused.status_code == 422 and message in refused.json()["error"]
    with pytest.raises(SystemExit):  # refused with the other options, before the model loads
        translate_cli.main(["--ckpt", ckpt, "--head-mask", "x:0:0", text])
    assert "--head-mask has 'x:0:0'" in capsys.readouterr().err


def test_the_page_switches_a_head_off_in_the_model_view(trained, tmp_path) -> None:
    """In chromium: translate; click a cell of the cross-attention map: the what-if shown is
    /what-if's for that step and source token; then switch two cross-attention heads off in
    the grid of every layer and head: the translation shown is /translate's with that
    head_mask, the score shown is /score's under it, and the grid marks them off."""
    import shutil

    import httpx
    from helpers import ServeProcess, need_chromium, translated_page

    need_chromium()

    from seq2seq import inspect as inspect_cli

    text = "3 1 4 1 5 9 2 6"
    ckpt = tmp_path / "run" / "checkpoints" / "model.ckpt"  # a run of its own, for its atlas
    ckpt.parent.mkdir(parents=True)
    shutil.copy(trained[0]["best_checkpoint"], ckpt)
    (tmp_path / "pairs.txt").write_text("3 1 4\n2 7 1 8\n", encoding="utf-8")
    pairs = ["--src", str(tmp_path / "pairs.txt"), "--ref", str(tmp_path / "pairs.txt")]
    assert inspect_cli.main([str(ckpt), "--heads", *pairs]) == 0
    server = ServeProcess(str(ckpt), "--wait-ms", "5").ready()
    try:
        with translated_page(server.url, text) as page:
            page.click('#heatmap-table td[data-step="2"][data-source="0"]')  # the what-if
            page.wait_for_selector("#what-if-tgt", timeout=60_000)
            what_if = page.inner_text("#what-if-tgt")
            layer = int(page.input_value("#layer"))
            heads = page.locator("#grid button.toggle").count()
            for switched in ((0, 0), (1, 1)):
                selector = 'button.toggle[data-layer="{}"][data-head="{}"]'.format(*switched)
                page.click(f"#grid {selector}")
                page.wait_for_selector(f"#grid .cell.off {selector}", timeout=60_000)
            page.wait_for_function("document.getElementById('time').dataset.score")
            atlas_rows = page.locator("#atlas-table .atlas-row").count()
            shown = page.inner_text("#tgt")
            score = float(page.get_attribute("#time", "data-score"))
            mask = page.input_value("#head_mask")
            off = page.locator("#grid .cell.off").count()
            page.screenshot(path=str(tmp_path / "heads.png"), full_page=True)
        assert mask == "cross:0:0,cross:1:1" and off == 2 and heads >= 8
        assert atlas_rows == 3 * heads  # every head of the three kinds (the grid: one kind)
        atlas = httpx.get(f"{server.url}/heads").json()
        assert Path(atlas["checkpoint"]) == ckpt.resolve()
        asked = {"src": text, "step": 2, "layer": layer, "source": 0}
        assert what_if == httpx.post(f"{server.url}/what-if", json=asked).json()["tgt"]
        asked = {"src": text, "head_mask": mask}
        assert shown == httpx.post(f"{server.url}/translate", json=asked).json()["tgt"]
        scored = httpx.post(f"{server.url}/score", json={**asked, "tgt": shown}).json()
        assert score == pytest.approx(scored["score"])
    finally:
        server.stop()


# --- the attention what-if ----------------------------------------------------------------------


def test_forcing_the_attention_the_model_chose_anyway_changes_nothing(trained) -> None:
    """For every step and head of each cross-attention layer: the step's own attention
    (captured) forced back gives the same output; forced onto one source token, the output
    still begins with the tokens before that step, and some such forcings change it."""
    from seq2seq.inference import Engine, Settings

    engine = Engine(trained[0]["best_checkpoint"])
    module = engine.model.module
    text = "3 1 4 1 5 9 2"
    chosen = Settings()
    search = engine.search(chosen)
    sentence = engine.encode([text], chosen, search)[0]
    before = module.output_ids(engine.generate([sentence], search)[0][0][1])
    maps = module.attention(sentence.ids, before)["cross"]
    changed = 0
    for layer, weights in enumerate(maps):
        for step in range(len(before)):
            for head in range(weights.size(0)):
                own = engine.what_if(sentence, search, step, layer, 0, head, weights[head, step])
                assert own["tgt"] == own["before"] == engine.text(before)
            moved = engine.what_if(sentence, search, step, layer, 0)  # all heads, onto "3"
            assert engine.model.tgt_vocab.encode(moved["tgt"])[:step] == before[:step]
            changed += moved["tgt"] != moved["before"]
    assert changed > 0


def test_the_server_answers_a_what_if_and_names_a_step_out_of_range(trained) -> None:
    from fastapi.testclient import TestClient

    from seq2seq.inference import Engine
    from seq2seq.serve.app import create_app

    engine = Engine(trained[0]["best_checkpoint"])
    body = {"src": "3 1 4 1 5", "step": 2, "layer": 1, "source": 0}
    with TestClient(create_app(engine)) as client:
        answer = client.post("/what-if", json=body).json()
        assert answer["before"] == client.post("/translate", json={"src": body["src"],
                                                "beam": 1}).json()["tgt"]  # fmt: skip
        assert answer["source_token"] == "3" and answer["step"] == 2
        refused = client.post("/what-if", json={**body, "step": 99})
        assert refused.status_code == 422 and "step must be in 0-" in refused.json()["error"]
        refused = client.post("/what-if", json={**body, "layer": 7})
        assert "layer: cross attention has layers 0-" in refused.json()["error"]


# --- the head atlas ------------------------------------------------------------------------------


def test_a_head_that_always_looks_back_one_token_is_named_so() -> None:
    """Synthetic attention: each query puts 0.95 on the token before it (a previous-token
    head), another head on the first key (a sink), a third spreads evenly (no role)."""
    from seq2seq.heads import _head_stats, role

    t = 6
    weights = torch.full((1, 3, t, t), 0.01)
    for q in range(t):
        weights[0, 0, q, max(q - 1, 0)] = 0.95
        weights[0, 1, q, 0] = 0.95
    weights[0, 2] = 1.0 / t
    keep = torch.ones(1, t, dtype=torch.bool)
    stats = _head_stats("encoder", weights, keep, keep)
    count = stats.pop("count")
    shares = [{k: float(v[h] / count[h]) for k, v in stats.items()} for h in range(3)]
    assert shares[0]["previous"] == pytest.approx(5 / 6)  # the first query has no token before
    assert role({**shares[0], "previous": 0.95}) == "previous token"
    assert role(shares[1]) == "first-token sink"
    assert role(shares[2]) is None
    assert shares[1]["confidence"] == pytest.approx(0.95)
    assert shares[2]["entropy"] == pytest.approx(math.log(t), rel=1e-5)


def test_the_atlas_of_the_copy_model(trained, tmp_path, capsys) -> None:
    """On 48 pairs: every head, importance L2-normalised within each layer, each head's loss
    change what switching it off alone gives, the pruning curve from the model's BLEU down to
    every head off, and inspect --heads writing heads.json and heads.png."""
    import json
    import random

    from seq2seq import inspect as inspect_cli
    from seq2seq.heads import _batches, atlas, mean_loss
    from seq2seq.inference import Engine, Settings

    ckpt = trained[0]["best_checkpoint"]
    engine = Engine(ckpt)
    texts = [" ".join(random.Random(i).choices("0123456789", k=2 + i % 5)) for i in range(48)]
    found = atlas(engine, texts, texts, batch_size=16, steps=4, progress=lambda line: None)
    net = engine.model.module.model
    config = net.config
    assert len(found["heads"]) == (config.num_encoder_layers + 2 * config.num_decoder_layers) * (
        config.num_heads
    )
    for kind in ("encoder", "self", "cross"):
        layer = [r["importance"] for r in found["heads"] if r["kind"] == kind and r["layer"] == 0]
        assert sum(x * x for x in layer) == pytest.approx(1.0)
    row = max(found["heads"], key=lambda r: r["loss_change"])
    chosen = Settings()
    ids = [s.ids for s in engine.encode(texts, chosen, engine.search(chosen))]
    targets = [engine.model.tgt_vocab.encode(t) for t in texts]
    batches = list(_batches(engine, ids, targets, 16))
    off = ((row["kind"], row["layer"], row["head"]),)
    assert row["loss_change"] == pytest.approx(
        mean_loss(engine, batches, off) - mean_loss(engine, batches), rel=1e-4
    )
    curve = found["pruning"]
    assert curve[0]["bleu"] == pytest.approx(found["bleu"]) and found["bleu"] > 90
    assert curve[-1]["removed"] == len(found["heads"]) and curve[-1]["bleu"] < 20
    (tmp_path / "src.txt").write_text("\n".join(texts[:16]) + "\n", encoding="utf-8")
    files = ["--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "src.txt")]
    assert inspect_cli.main([ckpt, "--heads", *files, "--out", str(tmp_path)]) == 0
    assert "heads.json and heads.png" in capsys.readouterr().out
    written = json.loads((tmp_path / "heads.json").read_text(encoding="utf-8"))
    assert written["pairs"] == 16 and (tmp_path / "heads.png").read_bytes()[:4] == b"\x89PNG"
    # the pairs the run's validations decoded, written by training for this
    out = tmp_path / "validation"
    split = ["--split", "validation", "--limit", "24", "--out", str(out)]
    assert inspect_cli.main([ckpt, "--heads", *split]) == 0
    run = Path(ckpt).parent.parent
    sources = (run / "validation_sources.txt").read_text(encoding="utf-8").splitlines()
    assert json.loads((out / "heads.json").read_text(encoding="utf-8"))["pairs"] == 24
    assert len(sources) == trained[1].data.corpus.val_size


# --- alignments ----------------------------------------------------------------------------------


def test_links_merge_subwords_into_words_and_aer_is_och_and_neys() -> None:
    from seq2seq.align import aer, gold, links, word_of

    # byte-level BPE: "Le chat noir" as "Le", " ch", "at", " no", "ir"
    assert word_of(["Le", " ch", "at", " no", "ir"], joined=True) == [0, 1, 1, 2, 2]
    assert word_of(["a", " ", "b"], joined=True) == [0, None, 1]  # characters: spaces between
    assert word_of(["3", "1", "4"], joined=False) == [0, 1, 2]  # symbols: a token a word
    weights = torch.tensor([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7], [0.0, 0.6, 0.4]])  # (T=3, S=3)
    assert links(weights, [0, 1, 1], [0, 1, 1]) == {(0, 0), (1, 1)}  # subword links merged
    sure = {(0, 0), (1, 1)}
    assert aer({(0, 0), (1, 1)}, sure, set()) == 0.0
    assert aer({(0, 0), (1, 0)}, sure, set()) == pytest.approx(0.5)
    assert aer({(0, 0), (1, 0)}, sure, {(1, 0)}) == pytest.approx(1 - 3 / 4)
    assert gold("reverse", list("abc"))[0] == {(0, 2), (1, 1), (2, 0)}
    assert gold("sort", list("bab")) == ({(1, 0), (0, 1), (2, 2)}, {(0, 1), (2, 1), (0, 2),
                                                                   (2, 2), (1, 0)})  # fmt: skip


def test_the_dates_gold_links_each_field_to_its_own_whatever_its_writing() -> None:
    """The gold of the dates task reads the fields from the pattern each side was written
    with: every form gives back the corpus's own text, and day, month and year link across
    orders and spellings, the weekday to nothing; attention on the right field scores AER 0,
    day and month swapped (the medium form's "03.04.") scores 1 on them."""
    import datetime

    from seq2seq.align import DateGold, aer, date_fields, gold_of, links, token_units
    from seq2seq.data.corpora import date_text

    day = datetime.date(2026, 3, 4)
    assert date_fields(day, "de_DE", "full") == (
        "Mittwoch, 4. März 2026", [("weekday", 0, 8), ("day", 10, 11), ("month", 13, 17),
                                   ("year", 18, 22)])  # fmt: skip
    for locale, form in [("de_DE", "full"), ("de_DE", "medium"), ("de_DE", "short"),
                         ("en_US", "long"), ("fr_FR", "full"), ("de_DE", "d. MMMM y"),
                         ("iso", "long")]:  # fmt: skip
        assert date_fields(day, locale, form)[0] == date_text(day, locale, form)
    name, dates = gold_of({"_target_": "seq2seq.data.corpora.Dates", "src_locale": "de_DE",
                           "src_forms": ["full", "medium"], "tgt_locale": "iso"})  # fmt: skip
    assert name == "dates" and isinstance(dates, DateGold)
    src_units, tgt_units, sure, possible = dates("Mittwoch, 4. März 2026", "2026-03-04")
    assert sure == {(1, 2), (2, 1), (3, 0)} and possible == set()  # weekday (0): no link
    assert dates("04.03.2026", "2026-03-04")[2] == {(0, 2), (1, 1), (2, 0)}
    assert dates("04.03.2026", "2026-04-03") is None  # not the reference's date
    assert dates("4. März 2026", "2026-03-04") is None  # a form the corpus does not draw
    english = DateGold(src_forms=["long"], tgt_locale="en_US", start="2026-01-01", end="2026-12-31")
    assert english("4. März 2026", "March 4, 2026")[2] == {(0, 1), (1, 0), (2, 2)}
    # characters: each token in its field, the separators in none
    src, tgt = "04.03.2026", "2026-03-04"
    src_units, tgt_units, sure, possible = dates(src, tgt)
    src_of, tgt_of = token_units(list(src), src, src_units), token_units(list(tgt), tgt, tgt_units)
    assert src_of == [0, 0, None, 1, 1, None, 2, 2, 2, 2]
    assert tgt_of == [0, 0, 0, 0, None, 1, 1, None, 2, 2]
    field_of = {j: i for i, j in sure}  # the target field's source field
    on_field, swapped = torch.zeros(len(tgt), len(src)), torch.zeros(len(tgt), len(src))
    for t, j in enumerate(tgt_of):
        field = field_of[j] if j is not None else 0  # a separator: weighs the first token
        on_field[t, src_of.index(field)] = 1
        swapped[t, src_of.index({0: 1, 1: 0, 2: 2}[field])] = 1  # day and month swapped
    assert aer(links(on_field, src_of, tgt_of), sure, possible) == 0.0
    assert links(swapped, src_of, tgt_of) == {(2, 0), (0, 1), (1, 2)}
    assert aer(links(swapped, src_of, tgt_of), sure, possible) == pytest.approx(1 - 2 / 6)
    # byte-level BPE: a token is in the unit of its first character after its space
    assert token_units(["Le", " ch", "at"], "Le chat", [(0, 2), (3, 7)]) == [0, 1, 1]
    # word vocabularies: a token a word
    assert token_units(["3", "1", "4"], "3 1 4", [(0, 1), (2, 3), (4, 5)]) == [0, 1, 2]
    assert token_units(["3", "<unk>"], "3 1", [(0, 1), (2, 3)]) is None


def test_a_reverse_model_trained_here_aligns_the_anti_diagonal_and_an_untrained_one_does_not(
    tmp_path, data_dir
) -> None:
    """AER against the reverse task's gold (word i to n-1-i), the references forced: a reverse
    model trained here (the tiny model, 4,000 pairs of up to 6 symbols, 6 epochs: about 11 s)
    has a cross-attention layer below 0.3 (measured: the mean of the last layer's heads, 0.04;
    the first layer 0.51; a model that reverses must read word n-1-i as it writes word i, which
    its last layer's attention shows); the same network with fresh random weights is above 0.5
    in every layer (measured 0.70 and 0.63; chance, a link a word drawn evenly, averages
    1 - mean(1/n) = 0.71 over 2-6 words)."""
    import random

    from helpers import compose_train

    from seq2seq.align import alignment_error_rates, symbol_gold
    from seq2seq.inference import Engine
    from train import train

    overrides = ["data=reverse", "model=tiny", "trainer=cpu", "logger=none",
                 "data.corpus.max_length=6", "data.corpus.train_size=4000",
                 "data.corpus.val_size=100", "data.corpus.test_size=100", "trainer.max_epochs=4",
                 "model.training.lr=3e-3", "model.training.warmup_steps=50"]  # fmt: skip
    engine = Engine(train(compose_train(tmp_path, data_dir, overrides))["best_checkpoint"])
    texts = [" ".join(random.Random(i).choices("0123456789", k=2 + i % 5)) for i in range(40)]
    references = [" ".join(reversed(text.split())) for text in texts]
    golds = [symbol_gold("reverse")(s, r) for s, r in zip(texts, references, strict=True)]
    found = alignment_error_rates(engine, texts, references, "reverse", golds)
    assert found["sentences"] == 40 and found["best"]["aer"] < 0.3, found["best"]
    torch.manual_seed(3)
    engine.model.module.model.apply(
        lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None
    )
    fresh = alignment_error_rates(engine, texts, references, "reverse", golds)
    layers = [r["aer"] for r in fresh["rates"] if r["head"] is None]
    assert min(layers) > 0.5, fresh["rates"]


def test_inspect_prints_pharaoh_links_and_the_atlas_names_the_layer_that_aligns(
    trained, tmp_path, capsys
) -> None:
    import json

    from seq2seq import inspect as inspect_cli

    ckpt = trained[0]["best_checkpoint"]
    (tmp_path / "src.txt").write_text("3 1 4\n\n2 7 1 8\n", encoding="utf-8")
    args = [ckpt, "--align", str(tmp_path / "src.txt"), "--layer", "0", "--head", "3"]
    assert inspect_cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0-0 1-1 2-2" and lines[1] == "" and lines[2] == "0-0 1-1 2-2 3-3"
    assert inspect_cli.main([ckpt, "--align", str(tmp_path / "src.txt"), "--layer", "9"]) == 1
    assert "cross attention has layers 0-" in capsys.readouterr().err
    files = ["--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "src.txt")]
    assert inspect_cli.main([ckpt, "--heads", *files, "--out", str(tmp_path)]) == 0
    assert "aligns best (copy's gold): cross-attention layer" in capsys.readouterr().out
    written = json.loads((tmp_path / "heads.json").read_text(encoding="utf-8"))
    assert written["alignment"]["best"]["aer"] < 0.3
    # a gold file (i-j sure, i?j possible) saying what the copy task's gold says scores the same
    (tmp_path / "gold.txt").write_text("0-0 1-1 2?2 2-2\n\n0-0 1-1 2-2 3-3\n", encoding="utf-8")
    gold = ["--gold", str(tmp_path / "gold.txt")]
    assert inspect_cli.main([ckpt, "--heads", *files, *gold, "--out", str(tmp_path / "g")]) == 0
    from_file = json.loads((tmp_path / "g" / "heads.json").read_text(encoding="utf-8"))
    assert from_file["alignment"]["rates"] == written["alignment"]["rates"]
    assert from_file["alignment"]["task"] == "gold.txt"
    capsys.readouterr()
    align = [ckpt, "--align", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "src.txt")]
    assert inspect_cli.main([*align, *gold]) == 0
    printed = capsys.readouterr().out.splitlines()
    best = written["alignment"]["best"]
    assert printed[-1].startswith(f"aligns best (2 pairs): cross-attention layer {best['layer']}")
    assert printed[-1].endswith(f"AER {best['aer']:.3f}")
    (tmp_path / "bad.txt").write_text("0-0\n\n0:1\n", encoding="utf-8")
    assert inspect_cli.main([*align, "--gold", str(tmp_path / "bad.txt")]) == 1
    assert "line 3: '0:1' is not a link; write i-j (sure) or i?j" in capsys.readouterr().err
    (tmp_path / "bad.txt").write_text("0-0\n\n0-4\n", encoding="utf-8")
    assert inspect_cli.main([*align, "--gold", str(tmp_path / "bad.txt")]) == 1
    assert "line 3: '0-4' names a word past the pair's 4 source and 4 target" in (
        capsys.readouterr().err
    )


def test_heads_answers_the_atlas_of_this_checkpoint_or_says_how_to_make_it(trained, tmp_path):
    import shutil

    from fastapi.testclient import TestClient

    from seq2seq.inference import Engine
    from seq2seq.serve.app import create_app

    ckpt = tmp_path / "run" / "checkpoints" / "model.ckpt"
    ckpt.parent.mkdir(parents=True)
    shutil.copy(trained[0]["best_checkpoint"], ckpt)
    with TestClient(create_app(Engine(str(ckpt)))) as client:
        missing = client.get("/heads")
        assert missing.status_code == 404
        assert f"python -m seq2seq.inspect {ckpt} --heads" in missing.json()["error"]
        (ckpt.parent.parent / "heads.json").write_text('{"checkpoint": "/elsewhere.ckpt"}')
        other = client.get("/heads").json()["error"]
        assert "is the atlas of /elsewhere.ckpt, not of this checkpoint" in other


def test_inspect_draws_a_sentences_attention_at_every_checkpoint_of_a_run(trained, tmp_path):
    from seq2seq import inspect as inspect_cli
    from seq2seq.run_dir import RunDir

    run = RunDir.of_checkpoint(trained[0]["best_checkpoint"])
    history = run.history()
    assert len(history) >= 2 and [s for s, _ in history] == sorted(s for s, _ in history)
    out = tmp_path / "over.png"
    args = [str(run.path), "--attention", "3 1 4", "--over-run", "--head", "1", "--out", str(out)]
    assert inspect_cli.main(args) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert inspect_cli.main([str(run.path / "checkpoints"), "--attention", "3", "--over-run"]) == 1


def test_loading_a_runs_checkpoint_holds_up_no_other_request(trained, tmp_path, monkeypatch):
    """A checkpoint of a served run loads in a thread: while one loads (slowed here until the
    test lets it finish), /info answers; the load then ends and its translation is the
    checkpoint's own."""
    import shutil
    import threading

    from fastapi.testclient import TestClient

    from seq2seq import inference
    from seq2seq.serve.app import create_app

    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    shutil.copy(trained[0]["best_checkpoint"], checkpoints / "epoch005-step000500.ckpt")
    shutil.copy(trained[0]["best_checkpoint"], checkpoints / "recent-step000100.ckpt")
    history = inference.RunHistory(tmp_path / "run")
    engine = history.engine()
    loading, answered = threading.Event(), threading.Event()

    class SlowEngine(inference.Engine):
        def __init__(self, *args, **kwargs) -> None:
            loading.set()
            assert answered.wait(60), "/info did not answer while a checkpoint loaded"
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(inference, "Engine", SlowEngine)
    found = {}
    with TestClient(create_app(engine, history=history)) as client:
        body = {"src": "3 1 4", "checkpoint": "recent-step000100.ckpt"}
        slow = threading.Thread(
            target=lambda: found.update(client.post("/translate", json=body).json())
        )
        slow.start()
        assert loading.wait(60)
        assert client.get("/info").status_code == 200  # the event loop is not held up
        answered.set()
        slow.join(60)
        tested = client.post("/translate", json={"src": "3 1 4"}).json()
    assert found["tgt"] == tested["tgt"]  # the same weights under another name
    assert history.holds("recent-step000100.ckpt")


def test_a_served_run_answers_from_the_checkpoint_the_slider_names(trained, tmp_path) -> None:
    """A run of two checkpoints (the trained one at step 500, and at step 100 the same with its
    weights disturbed): serve RUN; in chromium, translate, move the slider to step 100: the
    heat map is /attention's on that checkpoint, and differs from the tested one's."""
    import shutil

    import httpx
    from helpers import ServeProcess, need_chromium, translated_page

    need_chromium()

    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    shutil.copy(trained[0]["best_checkpoint"], checkpoints / "epoch005-step000500.ckpt")
    early = torch.load(trained[0]["best_checkpoint"], weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for name, tensor in early["state_dict"].items():
        if tensor.is_floating_point() and "cross_attn" in name:
            tensor += 0.5 * torch.randn(tensor.shape, generator=generator)
    torch.save(early, checkpoints / "recent-step000100.ckpt")
    text = "3 1 4 1 5"
    server = ServeProcess(str(tmp_path / "run"), "--wait-ms", "5").ready()
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert [c["step"] for c in info["checkpoints"]] == [100, 500]
        assert info["checkpoint"] == "epoch005-step000500.ckpt"
        with translated_page(server.url, text, (1280, 900)) as page:
            cells = "cells => cells.map(c => c.dataset.value)"
            tested = page.locator("#heatmap-table td").evaluate_all(cells)
            page.evaluate(
                "window.before = JSON.stringify(Array.from("
                "document.querySelectorAll('#heatmap-table td')).map(c => c.dataset.value))"
            )
            page.fill("#checkpoint", "0")  # a range input: fill sets it and fires change
            page.wait_for_function(
                "JSON.stringify(Array.from(document.querySelectorAll('#heatmap-table td'))"
                ".map(c => c.dataset.value)) !== window.before",
                timeout=60_000,
            )
            label = page.inner_text("#checkpoint-label")
            early_cells = page.locator("#heatmap-table td").evaluate_all(cells)
            layer = int(page.input_value("#layer"))
        body = {
            "src": text,
            "beam": 3,
            "checkpoint": "recent-step000100.ckpt",
        }  # the page: n-best 3
        attention = httpx.post(f"{server.url}/attention", json=body).json()
        heads = attention["cross"][layer]
        mean = [  # as the page averages: the heads summed in order, then divided
            sum(h[i][j] for h in heads) / len(heads)
            for i in range(len(heads[0]))
            for j in range(len(heads[0][0]))
        ]
        assert early_cells == [f"{v:.4f}" for v in mean]
        assert early_cells != tested and label.startswith("step 100")
        refused = httpx.post(f"{server.url}/attention", json={**body, "checkpoint": "x.ckpt"})
        assert refused.status_code == 422 and "is not one of this run's" in refused.json()["error"]
    finally:
        server.stop()
