"""Greedy, beam search and sampling: equivalences between them, the cache and batching."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.core.decoding import (
    DecodingConfig,
    beam_search,
    filter_logits,
    greedy_decode,
    sample_decode,
)
from seq2seq.core.model import ModelConfig, Seq2SeqTransformer

PAD, BOS, EOS, VOCAB = 0, 1, 2, 12


def random_batch(batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Reverse task: sources of length 2-7, padded; decoder inputs and labels."""
    lengths = torch.randint(2, 8, (batch,), generator=gen)
    src = torch.randint(3, VOCAB, (batch, 7), generator=gen)
    src = src.masked_fill(torch.arange(7)[None] >= lengths[:, None], PAD)
    labels = torch.full((batch, 8), PAD)
    for i, n in enumerate(lengths.tolist()):
        labels[i, :n] = src[i, :n].flip(0)
        labels[i, n] = EOS
    tgt_in = torch.cat([torch.full((batch, 1), BOS), labels[:, :-1]], 1)
    return src, tgt_in.masked_fill(tgt_in == EOS, PAD), labels


@pytest.fixture(scope="module")
def trained() -> Seq2SeqTransformer:
    """A small model trained briefly on reversal: good, not perfect, so search matters."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    config = ModelConfig(
        VOCAB, VOCAB, d_model=32, num_heads=4, d_ff=64, dropout=0.0, max_positions=32
    )
    model = Seq2SeqTransformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        src, tgt_in, labels = random_batch(32, gen)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def sources(batch: int = 12, seed: int = 1) -> Tensor:
    return random_batch(batch, torch.Generator().manual_seed(seed))[0]


@torch.no_grad()
def sequence_log_prob(model: Seq2SeqTransformer, src: Tensor, out: Tensor) -> Tensor:
    """(B,) teacher-forced log-probability of each output up to and including its EOS, with
    <pad> and <bos> ruled out as the search rules them out (they are never outputs)."""
    tgt_in = torch.cat([torch.full((out.size(0), 1), BOS), out[:, :-1]], 1)
    logits = model(src, tgt_in).index_fill(-1, torch.tensor([PAD, BOS]), float("-inf"))
    logp = logits.log_softmax(-1).gather(-1, out[..., None]).squeeze(-1)
    ended = (out == EOS).long().cumsum(1)
    counted = (ended == 0) | ((ended == 1) & (out == EOS))  # up to the first EOS
    return torch.where(counted, logp, 0.0).sum(1)  # -inf (a <pad> after EOS) times 0 is nan


def test_batch_greedy_equals_each_example_alone(trained: Seq2SeqTransformer) -> None:
    src = sources()
    batch = greedy_decode(trained, src, max_len=10)
    for i in range(src.size(0)):
        length = int((src[i] != PAD).sum())
        alone = greedy_decode(trained, src[i : i + 1, :length], max_len=10)[0]
        assert batch[i, : alone.size(0)].tolist() == alone.tolist()
        assert (batch[i, alone.size(0) :] == PAD).all()


def test_cached_greedy_equals_recomputing_the_whole_prefix(trained: Seq2SeqTransformer) -> None:
    src = sources()
    assert torch.equal(
        greedy_decode(trained, src, max_len=10),
        greedy_decode(trained, src, max_len=10, use_cache=False),
    )
    untrained = Seq2SeqTransformer(trained.config).eval()  # long outputs, no early EOS
    assert torch.equal(
        greedy_decode(untrained, src, max_len=20),
        greedy_decode(untrained, src, max_len=20, use_cache=False),
    )


def test_greedy_stops_at_eos_and_pads_after(trained: Seq2SeqTransformer) -> None:
    out = greedy_decode(trained, sources(), max_len=10)
    assert (out == EOS).any(1).all()
    after_eos = (out == EOS).long().cumsum(1) - (out == EOS).long() > 0
    assert (out[after_eos] == PAD).all()


def test_pad_and_bos_are_never_outputs_even_when_most_likely(
    trained: Seq2SeqTransformer,
) -> None:
    def decode_all(model: Seq2SeqTransformer) -> dict[str, Tensor]:
        src, seeded = sources(), torch.Generator().manual_seed(0)
        return {
            "greedy": greedy_decode(model, src, max_len=10),
            "beam": beam_search(model, src, max_len=10, beam_size=3)[0],
            "sample": sample_decode(model, src, max_len=10, generator=seeded),
        }

    plain = decode_all(trained)
    boost = torch.zeros(VOCAB)
    boost[PAD], boost[BOS] = 100.0, 50.0  # <pad>, then <bos>, the likeliest everywhere
    hook = trained.generator.register_forward_hook(lambda _m, _i, logits: logits + boost)
    try:
        boosted = decode_all(trained)
    finally:
        hook.remove()
    for name, out in boosted.items():
        assert torch.equal(out, plain[name]), name  # the boost changed nothing
        before_eos = (out == EOS).long().cumsum(-1) == 0
        assert not (out[before_eos] == PAD).any() and not (out == BOS).any(), name


def test_beam_of_one_equals_greedy(trained: Seq2SeqTransformer) -> None:
    src = sources()
    greedy = greedy_decode(trained, src, max_len=10)
    beam, _ = beam_search(trained, src, max_len=10, beam_size=1)
    width = max(greedy.size(1), beam.size(2))
    assert torch.equal(
        F.pad(beam[:, 0], (0, width - beam.size(2)), value=PAD),
        F.pad(greedy, (0, width - greedy.size(1)), value=PAD),
    )


def test_beam_finds_sequences_at_least_as_likely_as_greedy(
    trained: Seq2SeqTransformer,
) -> None:
    src = sources(batch=32, seed=5)
    greedy = greedy_decode(trained, src, max_len=10)
    beam, scores = beam_search(trained, src, max_len=10, beam_size=4, length_penalty=0.0)
    greedy_lp = sequence_log_prob(trained, src, greedy)
    beam_lp = sequence_log_prob(trained, src, beam[:, 0])
    torch.testing.assert_close(beam_lp, scores[:, 0], atol=1e-4, rtol=1e-4)
    assert (beam_lp >= greedy_lp - 1e-4).all()
    assert (beam_lp > greedy_lp + 1e-3).any(), "beam search never beat greedy: a weak test"


def test_n_best_is_sorted_and_distinct(trained: Seq2SeqTransformer) -> None:
    beam, scores = beam_search(trained, sources(batch=4), max_len=10, beam_size=5, n_best=3)
    assert beam.shape[:2] == (4, 3) and scores.shape == (4, 3)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    for hyps in beam:
        assert len({tuple(h.tolist()) for h in hyps}) == 3


def test_batch_beam_equals_each_example_alone(trained: Seq2SeqTransformer) -> None:
    src = sources(batch=5)
    batch, batch_scores = beam_search(trained, src, max_len=10, beam_size=3)
    assert (src == PAD).any(), "no padded source in the batch: a weak test"
    for i in range(src.size(0)):
        length = int((src[i] != PAD).sum())  # alone means unpadded
        alone, score = beam_search(trained, src[i : i + 1, :length], max_len=10, beam_size=3)
        n = alone.size(2)
        assert batch[i, 0, :n].tolist() == alone[0, 0].tolist()
        torch.testing.assert_close(batch_scores[i, 0], score[0, 0])


@pytest.mark.parametrize("beam", [1, 3])
def test_a_limit_a_row_decodes_each_row_as_it_would_alone(
    trained: Seq2SeqTransformer, beam: int
) -> None:
    """max_len as a (B,) tensor: each row stops at its own limit, and so equals that row
    decoded alone with its limit, whatever the limits of the rows beside it (the server batches
    requests of different lengths; translate gives each input its own length rule)."""
    src = sources(batch=8)
    limits = torch.tensor([2, 6, 3, 9, 1, 4, 5, 7])

    def decode(rows: Tensor, max_len) -> list[list[int]]:
        if beam == 1:
            return greedy_decode(trained, rows, max_len).tolist()
        tokens, scores = beam_search(trained, rows, max_len, beam_size=beam, n_best=2)
        return [[*t[0], *t[1], round(float(s[0]), 4)] for t, s in zip(tokens, scores, strict=True)]

    batch = decode(src, limits)
    cut = 0
    for i in range(src.size(0)):
        length = int((src[i] != PAD).sum())
        alone = decode(src[i : i + 1, :length], int(limits[i]))[0]
        row = batch[i]
        if beam == 1:  # the batch's row is padded after the row's own output
            assert row[: len(alone)] == alone and set(row[len(alone) :]) <= {PAD}
            cut += EOS not in alone
        else:
            assert [t for t in row if t != PAD] == [t for t in alone if t != PAD], i
    assert beam > 1 or cut >= 3, "too few rows ran to their limit: a weak test"
    with pytest.raises(ValueError, match="max_len must be at least 1, got 0"):
        greedy_decode(trained, src, torch.zeros(8, dtype=torch.long))


def test_sampling_is_seeded_and_top_k_one_is_greedy(trained: Seq2SeqTransformer) -> None:
    src = sources()

    def draw(seed: int, **kw) -> Tensor:
        return sample_decode(trained, src, 10, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(draw(3, temperature=1.5), draw(3, temperature=1.5))
    assert not torch.equal(draw(3, temperature=1.5), draw(4, temperature=1.5))
    greedy = greedy_decode(trained, src, max_len=10)
    for kw in ({"top_k": 1}, {"top_p": 1e-6}):
        out = draw(0, **kw)
        assert torch.equal(out[:, : greedy.size(1)], greedy)


def test_filter_logits_keeps_top_k_and_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda out: torch.isfinite(out)[0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [True, True, False, False]
    assert kept(filter_logits(logits, top_p=0.8)) == [True, True, False, False]
    assert kept(filter_logits(logits, top_p=0.81)) == [True, True, True, False]
    assert kept(filter_logits(logits, top_p=0.1)) == [True, False, False, False]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be positive, got 0.0"),
        ({"top_k": -1}, "top_k must be 0 .* got -1"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_sampling_settings_fail_clearly(
    trained: Seq2SeqTransformer, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sample_decode(trained, sources(), 5, **kwargs)


def test_bad_beam_settings_fail_clearly(trained: Seq2SeqTransformer) -> None:
    with pytest.raises(ValueError, match="beam_size must be at least 1, got 0"):
        beam_search(trained, sources(), 5, beam_size=0)
    with pytest.raises(ValueError, match=r"n_best must be in \[1, beam_size=2\], got 3"):
        beam_search(trained, sources(), 5, beam_size=2, n_best=3)


def test_decoding_config_length_rule_and_checks() -> None:
    decoding = DecodingConfig(max_len_a=1.2, max_len_b=10)
    assert decoding.max_len(20, max_positions=256) == 34  # a * S + b
    assert decoding.max_len(300, max_positions=256) == 256  # never past the positions
    assert DecodingConfig(max_len_a=0.0, max_len_b=0).max_len(5, 256) == 1  # at least one
    hparams = {"decoding": decoding.to_dict(), "training": {"lr": 1.0}}  # a checkpoint's groups
    assert DecodingConfig.from_hparams(hparams) == decoding
    with pytest.raises(ValueError, match=r"model\.decoding\.beam_size must be a positive int"):
        DecodingConfig(beam_size=0)


# --- a prefix: forced tokens, then a text spelled as the model likes ------------------------------

# The tokens' texts of a made-up subword vocabulary: several ways to spell "abab".
TEXTS = ("", "", "", "a", "b", "ab", "ba", "aba", "bab", "abab", "c", "ca")


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
@pytest.mark.parametrize("spell", ["abab", "ba", "c", "babcaab"])
def test_a_prefix_forces_its_tokens_then_spells_its_text(trained, search, spell) -> None:
    """Whatever the model would say (the reversal model knows nothing of these texts), every
    output begins with the forced tokens, then tokens whose texts spell `spell` (and may go on
    past it within the last token), in every search."""
    from seq2seq.core.decoding import Prefix

    src = sources(batch=6)
    forced = [[4, 3], [], [10], [5, 5, 5], [3], []]
    prefix = Prefix.of(forced, [spell] * 6, PAD, src.device, TEXTS)
    if search == "greedy":
        out = greedy_decode(trained, src, 12, prefix=prefix)
    elif search == "sample":
        gen = torch.Generator().manual_seed(0)
        out = sample_decode(trained, src, 12, generator=gen, prefix=prefix)
    else:
        out = beam_search(trained, src, 14, 5, n_best=5, prefix=prefix)[0].flatten(0, 1)
        forced = [row for row in forced for _ in range(5)]
    for row, own in zip(out.tolist(), forced, strict=True):
        assert row[: len(own)] == own
        spelled = ""
        for token in row[len(own) :]:
            if len(spelled) >= len(spell):
                break
            spelled += TEXTS[token]
        assert spelled.startswith(spell), (row, own, spelled)


def test_a_prefix_of_the_greedy_output_as_forced_tokens_leaves_it_unchanged(trained) -> None:
    from seq2seq.core.decoding import Prefix

    src = sources(batch=8)
    greedy = greedy_decode(trained, src, 10).tolist()
    for k in range(1, 6):
        prefix = Prefix.of([row[:k] for row in greedy], None, PAD, src.device)
        assert greedy_decode(trained, src, 10, prefix=prefix).tolist() == greedy
