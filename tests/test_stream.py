"""Streaming (data.corpus.streaming=true): the training files read a block of lines at a time
give every pair the cached reader gives; an epoch of the stream gives every pair once, in
batches within their limits, under one process or two; the stream resumes at any batch as it
would have gone on; a real run stopped by SIGTERM resumes exactly; what cannot stream is
refused in one line."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest
from helpers import compose_train

from seq2seq.data.corpora import aligned_pairs, table_pairs
from seq2seq.data.corpora.blocks import LineBlocks
from seq2seq.data.stream import StreamBatches

ROWS = 600  # three blocks of 256 lines: 256, 256, 88


def pair_text(i: int) -> tuple[str, str]:
    """Pair i: a source of 1-3 words, its reverse as the target."""
    words = [f"w{(i * 7 + k) % 97}" for k in range(1 + i % 3)]
    return f"{i} " + " ".join(words), " ".join(reversed(words)) + f" {i}"


def write_tsv(path: Path, rows: range, header: str = "src\ttgt") -> Path:
    lines = [header] + ["\t".join(pair_text(i)) for i in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def streaming(train_file: Path, held_out: Path, *extra: str) -> list[str]:
    """Overrides of a small streamed run on train_file (held_out as validation and test)."""
    return [
        "data=parallel_files", f"data.corpus.train.file={train_file}",
        f"data.corpus.validation.file={held_out}", f"data.corpus.test.file={held_out}",
        "data.corpus.streaming=true", "data.dedupe=false", "data.tokenizer.kind=char",
        "data.tokenizer.vocab_size=null", "data.max_length=24", "data.batch_size=32",
        "data.pool_batches=2", "data.max_tokens=null", "model=tiny", "model.net.dropout=0.1",
        "trainer.max_steps=48", "trainer.val_check_interval=16", "trainer.log_every_n_steps=1",
        "callbacks.step_checkpoint.every_n_train_steps=5", *extra,
    ]  # fmt: skip


def blocks_of(files: dict, tmp_path: Path) -> LineBlocks:
    as_tuples = {key: tuple(str(p) for p in paths) for key, paths in files.items()}
    return LineBlocks(as_tuples, "src", "tgt", tmp_path / "data")


def every_pair(blocks: LineBlocks) -> list[dict[str, str]]:
    return [pair for block in range(len(blocks)) for pair in blocks.read(block)]


def test_blocks_give_every_pair_of_a_tsv_file_as_the_cached_reader_does(tmp_path: Path) -> None:
    # Two files read as one: a header each, an empty row, a sentence with spaces to strip.
    first = write_tsv(tmp_path / "a.tsv", range(ROWS))
    with open(first, "a", encoding="utf-8") as f:
        f.write("\n  padded  \tkept\n")
    second = write_tsv(tmp_path / "b.tsv", range(ROWS, ROWS + 10))
    blocks = blocks_of({"file": [first, second]}, tmp_path)
    reference = [*table_pairs(first, "src", "tgt"), *table_pairs(second, "src", "tgt")]
    assert every_pair(blocks) == reference
    assert len(reference) == ROWS + 11 and {"src": "padded", "tgt": "kept"} in reference
    assert len(blocks) == 3 + 1 and blocks.lines == ROWS + 2 + 10


def test_blocks_give_every_pair_of_jsonl_and_of_aligned_text_as_the_cached_readers_do(
    tmp_path: Path,
) -> None:
    jsonl = tmp_path / "pairs.jsonl"
    records = [json.dumps({"t": dict(zip("ab", pair_text(i), strict=True))}) for i in range(ROWS)]
    records[300] = ""  # a blank line: skipped by both
    jsonl.write_text("\n".join(records), encoding="utf-8")  # no line end after the last line
    blocks = LineBlocks({"file": (str(jsonl),)}, "t.a", "t.b", tmp_path / "data")
    assert every_pair(blocks) == list(table_pairs(jsonl, "t.a", "t.b"))
    # Aligned text with a byte-order mark, Windows line ends and an empty line.
    src, tgt = tmp_path / "x.src", tmp_path / "x.tgt"
    lines = [pair_text(i) for i in range(ROWS)]
    src.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(s for s, _ in lines).encode() + b"\r\n")
    tgt.write_text("\n".join("" if i == 5 else t for i, (_, t) in enumerate(lines)) + "\n")
    blocks = blocks_of({"src": [src], "tgt": [tgt]}, tmp_path)
    assert every_pair(blocks) == list(aligned_pairs(src, tgt))
    assert every_pair(blocks)[0]["src"] == pair_text(0)[0]  # the mark is not text


def test_the_index_is_read_from_its_cache_and_made_again_for_a_changed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seq2seq.data.corpora import blocks as module

    path = write_tsv(tmp_path / "a.tsv", range(ROWS))
    first = every_pair(blocks_of({"file": [path]}, tmp_path))

    def no_pass(*args, **kwargs):
        raise AssertionError("indexed again")

    monkeypatch.setattr(module, "block_starts", no_pass)
    assert every_pair(blocks_of({"file": [path]}, tmp_path)) == first  # from the cache
    write_tsv(path, range(ROWS + 1))  # edited: another size
    with pytest.raises(AssertionError, match="indexed again"):
        blocks_of({"file": [path]}, tmp_path)


def test_a_bad_line_fails_naming_its_file_and_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "pairs.jsonl"
    records = [
        json.dumps(dict(zip(("src", "tgt"), pair_text(i), strict=True))) for i in range(ROWS)
    ]
    records[299] = "{not json"
    jsonl.write_text("\n".join(records) + "\n", encoding="utf-8")
    blocks = blocks_of({"file": [jsonl]}, tmp_path)
    blocks.read(0)
    with pytest.raises(ValueError, match=f"{jsonl} line 300 is not valid JSON"):
        blocks.read(1)
    tsv = write_tsv(tmp_path / "a.tsv", range(ROWS))
    lines = tsv.read_text().splitlines()
    lines[400] += "\textra"  # line 401 of the file
    tsv.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="line 401 has 3 fields but the header has 2"):
        every_pair(blocks_of({"file": [tsv]}, tmp_path))


def test_what_cannot_stream_is_refused_in_one_line(tmp_path: Path) -> None:
    from seq2seq.data.corpora import ParallelFiles

    tsv = write_tsv(tmp_path / "a.tsv", range(ROWS))
    gz = tmp_path / "a.tsv.gz"
    gz.write_bytes(gzip.compress(tsv.read_bytes()))
    comma = tmp_path / "a.csv"
    with open(comma, "w", newline="") as f:
        csv.writer(f).writerows([("src", "tgt"), ('a "b"\nc', "d")])
    short = tmp_path / "short.tgt"
    short.write_text("one\n")
    held = {"file": str(tsv)}
    cases = {
r"\(gzip\) cannot give: decompress it": {"file": str(gz)},
        "a CSV field may span lines": {"file": str(comma)},
        "has 601 lines but .* has 1: the files must be": {"src": str(tsv), "tgt": str(short)},
    }  # fmt: skip
    for message, files in cases.items():
        with pytest.raises(ValueError, match=message):
            corpus = ParallelFiles(files, held, held, streaming=True)
            corpus.train_stream(tmp_path / "data")
    with pytest.raises(ValueError, match=r"needs data\.corpus\.test files: a stream is read"):
        ParallelFiles({"file": str(tsv)}, held, streaming=True)
    with pytest.raises(ValueError, match=r"data\.corpus\.streaming must be one of"):
        ParallelFiles({"file": str(tsv)}, held, held, streaming="yes")


def chars(src: list[str], tgt: list[str]) -> tuple[list, list]:
    return [[ord(c) for c in s] for s in src], [[ord(c) for c in t] for t in tgt]


def stream_of(blocks: LineBlocks, **settings) -> StreamBatches:
    options = {"max_length": 14, "batch_size": 16, "max_tokens": 200, "pool_batches": 4,
               "bucket": True, "seed": 3} | settings  # fmt: skip
    return StreamBatches(blocks, chars, lambda examples: examples, **options)


def key(example: dict) -> tuple:
    return tuple(example["src_ids"]), tuple(example["tgt_ids"])


def epochs_of(stream: StreamBatches, count: int) -> list[list[list[dict]]]:
    """The batches of the stream's next `count` epochs, epoch by epoch."""
    epochs: list[list[list[dict]]] = [[] for _ in range(count)]
    for batch in stream:
        if stream.epoch == count:
            return epochs
        epochs[stream.epoch].append(batch)
    raise AssertionError("the stream ended")


def test_an_epoch_gives_every_pair_within_max_length_once_in_batches_within_their_limits(
    tmp_path: Path,
) -> None:
    blocks = blocks_of({"file": [write_tsv(tmp_path / "a.tsv", range(2000))]}, tmp_path)
    encoded = chars(*zip(*((p["src"], p["tgt"]) for p in every_pair(blocks)), strict=True))
    within = sorted(
        (tuple(s), tuple(t)) for s, t in zip(*encoded, strict=True) if max(len(s), len(t)) <= 14
    )
    assert 0 < len(within) < 2000  # some pairs are too long, and dropped
    stream = stream_of(blocks)
    assert stream.pool_blocks == 1 and stream.pools() == 8  # 64-pair pools: one block each
    first, second = epochs_of(stream, 2)
    assert sorted(key(e) for batch in first for e in batch) == within
    for batch in first:
        longest = max(max(len(e["src_ids"]), len(e["tgt_ids"]) + 1) for e in batch)
        assert len(batch) <= 16 and len(batch) * longest <= 200
    assert sorted(key(e) for batch in second for e in batch) == within
    assert [key(b[0]) for b in second] != [key(b[0]) for b in first]  # a new order each epoch
    # Without bucketing: batches of batch_size as drawn, the same pairs.
    (plain,) = epochs_of(stream_of(blocks, bucket=False, max_tokens=None), 1)
    assert sorted(key(e) for batch in plain for e in batch) == within
    assert sum(len(batch) < 16 for batch in plain) <= stream.pools()  # a pool's last is short


def test_two_processes_share_each_epoch_with_no_pair_twice_and_as_many_batches(
    tmp_path: Path,
) -> None:
    blocks = blocks_of({"file": [write_tsv(tmp_path / "a.tsv", range(2000))]}, tmp_path)
    whole = sorted(key(e) for batch in epochs_of(stream_of(blocks), 1)[0] for e in batch)
    shares = [epochs_of(stream_of(blocks, num_replicas=2, rank=r), 1)[0] for r in (0, 1)]
    assert len(shares[0]) == len(shares[1])  # each step averages the gradients of both
    assert sorted(key(e) for share in shares for batch in share for e in batch) == whole


def test_the_stream_resumes_at_any_batch_as_it_would_have_gone_on(tmp_path: Path) -> None:
    blocks = blocks_of({"file": [write_tsv(tmp_path / "a.tsv", range(300))]}, tmp_path)
    stream = stream_of(blocks)
    iterator = iter(stream)
    states, batches = [], []
    for _ in range(60):  # into the third epoch (2 pools, of 256 and 44 pairs)
        states.append(stream.state_dict())
        batches.append([key(e) for e in next(iterator)])
    assert states[-1]["epoch"] >= 2
    for at in (0, 1, 7, 23, len(batches) - 5):
        resumed = stream_of(blocks, seed=99)  # the seed comes back with the state
        resumed.load_state_dict(states[at])
        again = iter(resumed)
        assert [[key(e) for e in next(again)] for _ in batches[at:]] == batches[at:], at


def test_a_streamed_run_stopped_by_sigterm_resumes_exactly(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run of 48 steps over an epoch of about 19 batches (three pools of two 32-pair
    batches' worth of blocks), stopped by SIGTERM at step 21 in its second epoch and resumed with
    resume=RUN: every later step's loss and the final weights equal an uninterrupted run's."""
    from test_resume import stopped_in_process_resumes_exactly

    train_file = write_tsv(tmp_path / "train.tsv", range(ROWS))
    held_out = write_tsv(tmp_path / "held.tsv", range(ROWS, ROWS + 40))
    overrides = streaming(train_file, held_out)
    # stopped after step 21 of the 48 that streaming() sets (trainer.max_steps)
    stopped_in_process_resumes_exactly(tmp_path, data_dir, overrides, monkeypatch, 21, 48)


def test_a_streamed_runs_batches_follow_its_seed(tmp_path: Path) -> None:
    """The data module's stream draws its order from the run's seed (seed_everything's): the
    same seed gives the same first batches, another seed others."""
    import lightning as L
    from hydra.utils import instantiate

    train_file = write_tsv(tmp_path / "train.tsv", range(ROWS))
    held_out = write_tsv(tmp_path / "held.tsv", range(ROWS, ROWS + 40))

    def first_batches(seed: int) -> list[list[int]]:
        L.seed_everything(seed)
        cfg = compose_train(tmp_path, tmp_path / "data", streaming(train_file, held_out))
        datamodule = instantiate(cfg.data)
        datamodule.setup()
        batches = iter(datamodule.train_dataloader())
        return [next(batches)["src"][:, 0].tolist() for _ in range(3)]

    assert first_batches(1) == first_batches(1)
    assert first_batches(2) != first_batches(1)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["data.dedupe=true"], "data.dedupe=true needs the whole training split"),
        (["data.num_workers=2"], "data.num_workers=2: a streamed corpus is read"),
        (["trainer.max_steps=-1"], "trainer.max_steps=N or trainer.max_time"),
        (["trainer.val_check_interval=0.5"], "val_check_interval=0.5: give"),
        (["model.training.dropout_from_epoch=2"], "dropout_from_epoch=2 counts epochs, which"),
    ],
)
def test_settings_a_stream_cannot_run_with_are_refused_before_any_data_is_read(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    from hydra.errors import InstantiationException

    from seq2seq.training.preflight import check_config

    train_file = write_tsv(tmp_path / "train.tsv", range(ROWS))
    cfg = compose_train(tmp_path, tmp_path / "data", [*streaming(train_file, train_file), *extra])
    given = {override.split("=")[0] for override in extra}  # as typed on the command line
    with pytest.raises((ValueError, InstantiationException), match=message):
        check_config(cfg, given)
    assert not (tmp_path / "data").exists()


def test_the_recipes_late_dropout_gives_way_to_dropout_throughout_on_a_stream(
    tmp_path: Path, caplog
) -> None:
    """experiment=parallel_bpe sets late dropout, which counts epochs; a stream has none: the
    recipe streams with dropout throughout (as before late dropout), and the log says so."""
    from seq2seq.training.preflight import check_config

    train_file = write_tsv(tmp_path / "train.tsv", range(ROWS))
    recipe = ["experiment=parallel_bpe", "data.dedupe=false", "trainer.max_time=00:00:01:00"]
    cfg = compose_train(tmp_path, tmp_path / "data", [*recipe, *streaming(train_file, train_file)])
    assert cfg.model.training.dropout_from_epoch == 4
    with caplog.at_level("WARNING"):
        check_config(cfg)
    assert cfg.model.training.dropout_from_epoch is None
    assert "dropout_from_epoch=4 counts epochs" in caplog.text
    assert "dropout is model.net.dropout throughout" in caplog.text


def test_a_streamed_run_of_the_recipe_stopped_by_sigterm_resumes_exactly(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume reads the recipe's late dropout again and gives it way as the run did: it
    continues the run, not refused as a change of its settings."""
    from test_resume import stopped_in_process_resumes_exactly

    train_file = write_tsv(tmp_path / "train.tsv", range(ROWS))
    held_out = write_tsv(tmp_path / "held.tsv", range(ROWS, ROWS + 40))
    recipe = ["experiment=parallel_bpe", "trainer.max_time=null", "validations=null"]
    overrides = [*recipe, *streaming(train_file, held_out)]
    # stopped after step 21 of the 48 that streaming() sets (trainer.max_steps)
    stopped_in_process_resumes_exactly(tmp_path, data_dir, overrides, monkeypatch, 21, 48)
