"""The sequence metrics the module computes itself, before handing text to torchmetrics:
exact match, and the text each prediction decodes to. Every convergence claim rests on them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq.data.vocab import Vocabulary
from seq2seq.training.metrics import exact_match

VOCAB = Vocabulary(str(i) for i in range(10))  # <pad>=0 <bos>=1 <eos>=2 <unk>=3, symbols 4-13
PAD, EOS = VOCAB.pad_id, VOCAB.eos_id


def match(predictions: list[list[int]], labels: list[list[int]]) -> list[float]:
    return exact_match(torch.tensor(predictions), torch.tensor(labels), PAD, EOS).tolist()


def test_same_sequence_with_eos_matches() -> None:
    assert match([[5, 6, 7, EOS]], [[5, 6, 7, EOS]]) == [1.0]


def test_padding_after_eos_is_ignored_on_either_side() -> None:
    assert match([[5, 6, EOS, PAD, PAD, PAD]], [[5, 6, EOS]]) == [1.0]  # prediction longer
    assert match([[5, 6, EOS]], [[5, 6, EOS, PAD, PAD]]) == [1.0]  # labels padded in a batch


def test_tokens_after_eos_are_not_part_of_the_sequence() -> None:
    # As the text metrics read it: decode() stops at the first EOS.
    assert match([[5, 6, EOS, 9, 9]], [[5, 6, EOS, PAD, PAD]]) == [1.0]


def test_a_longer_or_shorter_prediction_is_wrong() -> None:
    assert match([[5, 6, 7, 8, EOS]], [[5, 6, 7, EOS]]) == [0.0]  # one token too many
    assert match([[5, 6, EOS, PAD]], [[5, 6, 7, EOS]]) == [0.0]  # one token too few
    assert match([[5, 6, 7]], [[5, 6, 7, EOS]]) == [0.0]  # cut off before its EOS
    assert match([[5, 6, 7, PAD]], [[5, 6, 7, EOS]]) == [0.0]  # padding is not an EOS


def test_a_batch_of_mixed_cases_scores_each_row() -> None:
    predictions = [
        [5, 6, EOS, PAD, PAD],  # right, padded
        [5, 6, 7, 8, EOS],  # too long
        [9, EOS, PAD, PAD, PAD],  # right
        [9, 9, 9, 9, 9],  # no EOS
        [4, 5, EOS, PAD, PAD],  # wrong token
    ]
    labels = [[5, 6, EOS, PAD], [5, 6, 7, EOS], [9, EOS, PAD, PAD], [9, 9, EOS, PAD],
              [4, 6, EOS, PAD]]  # fmt: skip
    assert match(predictions, labels) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert exact_match(torch.tensor(predictions), torch.tensor(labels), PAD, EOS).mean() == 0.4


sequences = st.lists(st.integers(4, 13), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(prediction=sequences, label=sequences, tail=st.lists(st.integers(0, 13), max_size=4),
       pad=st.integers(0, 3), eos=st.booleans())  # fmt: skip
def test_exact_match_is_equality_of_the_decoded_text(
    prediction: list[int], label: list[int], tail: list[int], pad: int, eos: bool
) -> None:
    """Exact match and the text metrics agree on what a sequence is: for symbol tokens, a
    prediction matches exactly when it decodes to the reference's text."""
    predicted = prediction + ([EOS, *tail] if eos else [])
    reference = label + [EOS] + [PAD] * pad
    width = max(len(predicted), len(reference))
    got = match([predicted + [PAD] * (width - len(predicted))],
                [reference + [PAD] * (width - len(reference))])[0]  # fmt: skip
    same_text = VOCAB.decode(predicted) == VOCAB.decode(reference)
    assert got == float(same_text and eos)  # without its EOS a prediction was cut off


@pytest.mark.parametrize("row", [[5, 6, EOS, 9, PAD], [5, 6, EOS], [1, 5, 6, EOS, EOS]])
def test_decoded_text_stops_at_eos_and_drops_bos_and_padding(row: list[int]) -> None:
    assert VOCAB.decode(row) == "1 2"
