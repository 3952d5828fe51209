"""BPE-dropout (data.bpe_dropout): every split undoes a merge of the tokenizer, so the text is
unchanged; tokens split as often as the rule says (against the expected count of pieces worked
out from the merges); a batch's draws repeat from its seed and tokens alone; the training
batches are split and the held-out ones never; a real run stopped by SIGTERM resumes exactly;
settings it cannot use are refused in one line."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_train
from hydra.utils import instantiate

from seq2seq.data.datamodule import collate
from seq2seq.data.subword_dropout import MergeSplitter, SubwordDropout, merge_parts
from seq2seq.data.tokenizer import LearnedTokenizer

SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "do"]


def sentence(i: int) -> str:
    """Sentence i: 2-4 words of 1-3 syllables drawn with seed i, so BPE learns merges several
    deep and the sentences hardly repeat."""
    draw = random.Random(i)
    words = ["".join(draw.choices(SYLLABLES, k=draw.randint(1, 3))) for _ in range(2 + i % 3)]
    return " ".join(words)


@pytest.fixture(scope="module")
def bpe() -> LearnedTokenizer:
    return LearnedTokenizer.fit("bpe", [sentence(i) for i in range(400)], vocab_size=400)


def token_bytes(tokenizer: LearnedTokenizer, i: int) -> str:
    return tokenizer.tokenizer.id_to_token(i)  # byte-level symbols: parts concatenate


def test_each_token_splits_into_the_two_tokens_its_merge_joined(bpe) -> None:
    left, right = merge_parts(bpe)
    merged = np.flatnonzero(left >= 0)
    assert len(merged) == len(bpe) - 4 - 256  # every token but the specials and the bytes
    for i in merged:
        assert token_bytes(bpe, left[i]) + token_bytes(bpe, right[i]) == token_bytes(bpe, i)
    assert (left[:260] == -1).all() and (right[:260] == -1).all()
    with pytest.raises(ValueError, match=r"^BPE-dropout needs a BPE tokenizer, got a 'word' one$"):
        merge_parts(LearnedTokenizer.fit("word", ["a b c"], vocab_size=10))


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_a_split_row_is_the_same_text(bpe, p) -> None:
    rows = [bpe.encode(sentence(i)) for i in range(200)]
    split = MergeSplitter(bpe, p).split(rows, np.random.default_rng(0))
    assert [bpe.decode(row) for row in split] == [sentence(i) for i in range(200)]
    left, _ = merge_parts(bpe)
    if p == 0.0:
        assert split == rows
    if p == 1.0:  # every merge undone: single bytes only
        assert all(left[i] < 0 for row in split for i in row)
    if 0 < p < 1:
        assert sum(map(len, split)) > sum(map(len, rows))


def expected_pieces(left: np.ndarray, right: np.ndarray, token: int, p: float) -> float:
    """A token's expected count of pieces under the rule, by recursion over its merges:
    whole with probability 1 - p, else its parts' pieces."""
    if left[token] < 0:
        return 1.0
    parts = expected_pieces(left, right, left[token], p) + expected_pieces(
        left, right, right[token], p
    )
    return (1 - p) + p * parts


def test_tokens_split_as_often_as_the_rule_expects(bpe) -> None:
    """Each token alone, drawn 4,000 times: the mean count of pieces against the exact
    expectation, within 5 standard errors (the draws are seeded: the test is fixed)."""
    p = 0.3
    left, right = merge_parts(bpe)
    splitter = MergeSplitter(bpe, p)
    deep = sorted(np.flatnonzero(left >= 0), key=lambda i: -len(token_bytes(bpe, i)))[:5]
    rng = np.random.default_rng(1)
    for token in deep:
        counts = np.array([len(r) for r in splitter.split([[int(token)]] * 4000, rng)])
        expected = expected_pieces(left, right, int(token), p)
        assert expected > 1.3  # deep enough to tell a wrong rule from the right one
        error = counts.std() / np.sqrt(len(counts))
        assert abs(counts.mean() - expected) < 5 * error + 1e-9, (token, counts.mean(), expected)


def examples_of(bpe, indices) -> list[dict]:
    return [
        {"src_ids": bpe.encode(sentence(i)), "tgt_ids": bpe.encode(sentence(i + 1))}
        for i in indices
    ]


def test_a_batch_draws_from_its_seed_and_its_tokens_alone(bpe) -> None:
    pad = partial(collate, pad_id=0, bos_id=1, eos_id=2)
    batch = examples_of(bpe, range(32))
    dropping = SubwordDropout(pad, bpe, bpe, 0.3, seed=7, max_length=60)
    first, again = dropping(batch), dropping(batch)
    assert all((first[k] == again[k]).all() for k in first)
    other_seed = SubwordDropout(pad, bpe, bpe, 0.3, seed=8, max_length=60)(batch)
    assert (
        other_seed["src"].shape != first["src"].shape or (other_seed["src"] != first["src"]).any()
    )

    # The draws depend on the whole batch: the first row, beside other rows (the rest of the
    # batch replaced by later sentences), splits otherwise at least once in five such batches;
    # a generator drawn from the seed alone would split it the same way each time.
    def first_row(rows: list[dict]) -> list[int]:
        row = dropping(rows)["src"][0].tolist()
        return [i for i in row if i != 0]

    alone = first_row(batch)
    others = [first_row([batch[0], *examples_of(bpe, range(40 * k, 40 * k + 31))])
              for k in range(1, 6)]  # fmt: skip
    assert any(split != alone for split in others)
    whole = pad(batch)
    assert first["src"].shape[1] > whole["src"].shape[1]
    # tgt_in and labels are one target: <bos> + the split target, the split target + <eos>.
    labels = first["labels"].masked_fill(first["labels"] == 2, 0)
    assert (first["tgt_in"][:, 1:] == labels[:, :-1]).all() and (labels[:, -1] == 0).all()


def test_a_row_split_past_max_length_stays_whole(bpe) -> None:
    """p = 1 splits every row into its bytes, unless they are more than max_length."""
    pad = partial(collate, pad_id=0, bos_id=1, eos_id=2)
    batch = examples_of(bpe, range(64))
    as_bytes = [list(sentence(i).encode()) for i in range(64)]  # one token a byte, here ASCII
    limit = int(np.median([len(b) for b in as_bytes]))
    out = SubwordDropout(pad, bpe, bpe, 1.0, seed=0, max_length=limit)(batch)
    left, _ = merge_parts(bpe)
    kept = 0
    for row, example, raw in zip(out["src"].tolist(), batch, as_bytes, strict=True):
        ids = row[: len(raw)] if len(raw) <= limit else row[: len(example["src_ids"])]
        assert all(i == 0 for i in row[len(ids) :])  # the rest is padding
        if len(raw) <= limit:
            assert len(ids) == len(raw) and all(left[i] < 0 for i in ids)
        else:
            assert ids == example["src_ids"]
            kept += 1
    assert 0 < kept < 64


def bpe_run(tmp_path: Path, *extra: str) -> list[str]:
    """A small BPE run over 256 training pairs of made-up words: 3 epochs of 8 batches of 32."""
    path = tmp_path / "pairs.tsv"
    rows = [f"{sentence(i)}\t{' '.join(reversed(sentence(i).split()))}" for i in range(296)]
    path.write_text("src\ttgt\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return [
        "data=parallel_files", f"data.corpus.train.file={path}", "data.val_size=20",
        "data.test_size=20", "data.tokenizer.vocab_size=400", "data.max_length=40",
        "data.batch_size=32", "data.max_tokens=null", "model=tiny", "trainer.max_epochs=3",
        "trainer.max_steps=24", "trainer.val_check_interval=8", "trainer.log_every_n_steps=1",
        "callbacks.step_checkpoint.every_n_train_steps=5", *extra,
    ]  # fmt: skip


def test_training_batches_are_split_and_held_out_ones_never(tmp_path: Path) -> None:
    batches = {}
    for p in (0.0, 0.4):
        cfg = compose_train(tmp_path, tmp_path / "data", bpe_run(tmp_path, f"data.bpe_dropout={p}"))
        datamodule = instantiate(cfg.data)
        datamodule.setup()
        loaders = {split: datamodule._loader(split, shuffle=split == "train")
                   for split in ("train", "validation")}  # fmt: skip
        batches[p] = {split: next(iter(loader)) for split, loader in loaders.items()}
    assert batches[0.4]["train"]["src"].numel() > batches[0.0]["train"]["src"].numel()
    for key in ("src", "tgt_in", "labels"):
        assert (batches[0.4]["validation"][key] == batches[0.0]["validation"][key]).all()


def test_a_run_with_bpe_dropout_stopped_by_sigterm_resumes_exactly(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_resume import stopped_in_process_resumes_exactly

    overrides = bpe_run(tmp_path, "data.bpe_dropout=0.2")  # 8 steps an epoch: 11 is mid-epoch
    stopped_in_process_resumes_exactly(tmp_path, data_dir, overrides, monkeypatch, 11, 24)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["data.bpe_dropout=0.1", "data.tokenizer.kind=char", "data.tokenizer.vocab_size=null"],
         r"data.bpe_dropout=0.1 needs BPE tokens \(merges to undo\), but the tokenizer is "
         r"'char': set data.tokenizer.kind=bpe or data.bpe_dropout=0"),
        (["data.bpe_dropout=1.5"], r"data.bpe_dropout must be a number in \[0, 1\], got 1.5"),
    ],
)  # fmt: skip
def test_settings_bpe_dropout_cannot_use_are_refused(tmp_path: Path, extra, message) -> None:
    from hydra.errors import InstantiationException

    cfg = compose_train(tmp_path, tmp_path / "data", bpe_run(tmp_path, *extra))
    with pytest.raises((ValueError, InstantiationException), match=message):
        instantiate(cfg.data)


def test_the_symbol_tasks_refuse_it_too(tmp_path: Path) -> None:
    from hydra.errors import InstantiationException

    cfg = compose_train(tmp_path, tmp_path / "data", ["experiment=reverse", "data.bpe_dropout=0.1"])
    with pytest.raises((ValueError, InstantiationException), match="but SymbolTask brings its own"):
        instantiate(cfg.data)
