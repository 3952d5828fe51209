"""The symbol tasks, the vocabulary, batching and the data module's cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2seq.data import TranslationDataModule, Vocabulary, collate
from seq2seq.data.corpora import SymbolTask
from seq2seq.data.corpora.symbols import TASKS, generate


def make_datamodule(data_dir: Path, batch_size: int = 16, **overrides) -> TranslationDataModule:
    """The reverse task's data module as configs/data/reverse.yaml makes it."""
    args = dict(
        task="reverse", num_symbols=10, min_length=1, max_length=6, train_size=300,
        val_size=40, test_size=60, seed=3,
    )  # fmt: skip
    return TranslationDataModule(
        corpus=SymbolTask(**{**args, **overrides}),
        tokenizer=None,
        max_length=6,
        batch_size=batch_size,
        num_workers=0,
        data_dir=str(data_dir),
        bucket=False,
    )


def test_vocabulary_round_trip_and_specials() -> None:
    vocab = Vocabulary(["a", "b", "c"])
    assert len(vocab) == 7
    assert vocab.decode(vocab.encode("b c a")) == "b c a"
    assert vocab.encode("a z") == [4, vocab.unk_id]
    assert vocab.decode([vocab.bos_id, 5, vocab.eos_id, 6]) == "b"  # stops at EOS
    assert Vocabulary.from_dict(vocab.to_dict()) == vocab
    with pytest.raises(ValueError, match="special tokens"):
        Vocabulary(["a", "<pad>"])


def test_collate_shifts_the_target_and_pads() -> None:
    examples = [{"src_ids": [5, 6, 7], "tgt_ids": [8, 9]}, {"src_ids": [4], "tgt_ids": [10]}]
    batch = collate(examples, pad_id=0, bos_id=1, eos_id=2)
    assert batch["src"].dtype == batch["labels"].dtype == torch.long
    assert batch["src"].tolist() == [[5, 6, 7], [4, 0, 0]]
    assert batch["tgt_in"].tolist() == [[1, 8, 9], [1, 10, 0]]
    assert batch["labels"].tolist() == [[8, 9, 2], [10, 2, 0]]


@pytest.mark.parametrize(
    ("task", "expected"), [("copy", "3 9 4"), ("reverse", "4 9 3"), ("sort", "3 4 9")]
)
def test_tasks_map_source_to_target(task: str, expected: str) -> None:
    assert " ".join(map(str, TASKS[task]([3, 9, 4]))) == expected


def splits(**kwargs) -> dict[str, list[dict[str, str]]]:
    args = dict(
        task="sort", num_symbols=5, min_length=1, max_length=4, train_size=500, val_size=30,
        test_size=50, seed=1,
    )  # fmt: skip
    return {
        s: list(generate(split=s, **{**args, **kwargs})) for s in ("train", "validation", "test")
    }


def test_generation_is_seeded_and_held_out_sequences_stay_out_of_training() -> None:
    a, b = splits(), splits()
    assert a == b
    assert splits(seed=2) != a
    assert [len(a[s]) for s in a] == [500, 30, 50]
    train = {e["src"] for e in a["train"]}
    held_out = [e["src"] for e in a["validation"] + a["test"]]
    assert len(set(held_out)) == len(held_out)  # distinct
    assert not train & set(held_out)
    # Every length still occurs in training (at most half of each length is held out).
    assert {len(s.split()) for s in train} == {1, 2, 3, 4}
    assert all(e["tgt"] == " ".join(sorted(e["src"].split())) for e in a["train"])


def test_impossible_held_out_sizes_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"val_size \+ test_size = 100 exceeds the 3"):
        make_datamodule(
            tmp_path, num_symbols=2, min_length=1, max_length=2, val_size=50, test_size=50
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task": "hueg"}, "unknown data.corpus.task 'hueg'; choose one of"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"min_length": 5, "max_length": 2}, "min_length=5 and max_length=2"),
        ({"train_size": 0}, "train_size must be a positive integer, got 0"),
    ],
)
def test_bad_data_settings_fail_clearly(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_datamodule(tmp_path, **overrides)


def test_datamodule_batches_and_caches_under_data_dir(tmp_path: Path) -> None:
    dm = make_datamodule(tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["src"].shape[0] == 16
    assert batch["tgt_in"].shape == batch["labels"].shape
    assert (batch["tgt_in"][:, 0] == dm.tgt_vocab.bos_id).all()
    # Reverse: the label sequence (before EOS) is the source reversed.
    src = dm.src_vocab.decode(batch["src"][0].tolist()).split()
    assert dm.tgt_vocab.decode(batch["labels"][0].tolist()).split() == src[::-1]
    files = {f["filename"] for split in dm.splits.values() for f in split.cache_files}
    assert files and all(Path(f).is_relative_to(tmp_path) for f in files)

    again = make_datamodule(tmp_path)
    again.setup("fit")
    assert {f["filename"] for s in again.splits.values() for f in s.cache_files} == files
    first = next(iter(again.val_dataloader()))
    assert torch.equal(first["src"], next(iter(dm.val_dataloader()))["src"])


def test_epoch_shuffle_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch() -> None:
    from seq2seq.data.datamodule import EpochShuffle

    sampler = EpochShuffle(20, seed=7)
    first = list(sampler)
    assert sorted(first) == list(range(20)) and first == list(EpochShuffle(20, seed=7))
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and sorted(second) == list(range(20))

    it = iter(sampler)  # epoch 1 again: stop after 6 indices, save, restore elsewhere
    taken = [next(it) for _ in range(6)]
    state = sampler.state_dict()
    assert state == {"epoch": 1, "seed": 7, "yielded": 6}
    restored = EpochShuffle(20, seed=0)
    restored.load_state_dict(state)
    assert taken + list(restored) == second
    assert list(restored) == second  # the next pass is a whole epoch again


def test_an_epochs_order_is_torchs_permutation_of_seed_plus_epoch_held_as_int32() -> None:
    """The order runs drew before it was held as int32 (runs resumed across the change carry
    on in the same order), in half the memory; lengths that are not counts are refused."""
    from seq2seq.data.batching import BucketBatchSampler, EpochShuffle

    sampler = EpochShuffle(5000, seed=7)
    sampler.set_epoch(3)
    drawn = torch.randperm(5000, generator=torch.Generator().manual_seed(10))
    assert list(sampler) == drawn.tolist()
    assert sampler._items(torch.Generator().manual_seed(10)).dtype == "int32"
    with pytest.raises(ValueError, match=r"^lengths must be integers .*, got float64$"):
        BucketBatchSampler([1.5, 2.0], batch_size=2)
