"""The whole model: masking invariants, incremental decoding, configuration errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from seq2seq.core.model import ModelConfig, Seq2SeqTransformer

PAD, BOS, EOS = 0, 1, 2
ATOL = 1e-5


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(
        src_vocab_size=17,
        tgt_vocab_size=19,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.1,
        max_positions=32,
    )
    return ModelConfig(**{**fields, **overrides})


def tiny_model(**overrides) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(**overrides)).eval()


def tokens(batch: int, length: int, vocab: int) -> Tensor:
    return torch.randint(3, vocab, (batch, length))  # real tokens: no pad, bos or eos


VARIANTS = [
    {},
    {"norm_first": False},
    {"positional": "learned"},
    {"tie_output": True},
    {"k_dim": 5, "v_dim": 7, "num_heads": 3},
    {"tgt_vocab_size": 17, "share_embeddings": True},
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_changing_later_targets_leaves_earlier_logits_unchanged(overrides: dict) -> None:
    model = tiny_model(**overrides)
    src, tgt = tokens(2, 6, 17), tokens(2, 8, model.config.tgt_vocab_size)
    changed = tgt.clone()
    changed[:, 5:] = tokens(2, 3, model.config.tgt_vocab_size)
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=ATOL, rtol=ATOL)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("overrides", VARIANTS)
def test_padding_appended_to_the_source_changes_nothing(overrides: dict) -> None:
    model = tiny_model(**overrides)
    src, tgt = tokens(2, 6, 17), tokens(2, 5, model.config.tgt_vocab_size)
    src_padded = torch.cat([src, torch.full((2, 4), PAD)], dim=1)
    torch.testing.assert_close(model(src_padded, tgt), model(src, tgt), atol=ATOL, rtol=ATOL)


def with_pad_embeddings_redrawn(model: Seq2SeqTransformer, src: Tensor, tgt: Tensor) -> Tensor:
    """The logits after the <pad> rows of both embedding tables are drawn anew: what padded
    keys contribute, if anything, changes; real tokens are untouched."""
    with torch.no_grad():
        model.src_embed.tokens.weight[PAD].normal_()
        model.tgt_embed.tokens.weight[PAD].normal_()
    return model(src, tgt)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_target_padding_is_masked_as_keys(overrides: dict) -> None:
    # Padding before and between real target tokens: the causal mask alone lets later real
    # positions see it (padding appended at the end would be hidden by the causal mask even
    # without the target padding mask, so it would prove nothing here).
    model = tiny_model(**overrides)
    vocab = model.config.tgt_vocab_size
    src = tokens(2, 5, 17)
    tgt = tokens(2, 7, vocab)
    tgt[:, :2] = PAD
    tgt[0, 4] = PAD
    real = tgt != PAD
    # Logits of the real positions; the <pad> column aside, which a tied output layer reads
    # from the very embedding row that is redrawn.
    before = model(src, tgt)[real][:, PAD + 1 :]
    after = with_pad_embeddings_redrawn(model, src, tgt)[real][:, PAD + 1 :]
    torch.testing.assert_close(after, before, atol=ATOL, rtol=ATOL)
    unpadded = tgt.masked_fill(~real, 5)  # the same places holding a real token
    assert not torch.allclose(model(src, unpadded)[real][:, PAD + 1 :], after)


def test_source_padding_is_masked_as_keys() -> None:
    # Left padding: real tokens after the pads must not see them, in the encoder or through
    # cross-attention.
    model = tiny_model()
    src = torch.cat([torch.full((1, 3), PAD), tokens(1, 5, 17)], dim=1)
    tgt = tokens(1, 4, 19)
    before = model(src, tgt)
    torch.testing.assert_close(
        with_pad_embeddings_redrawn(model, src, tgt), before, atol=ATOL, rtol=ATOL
    )
    unpadded = src.clone()
    unpadded[:, :3] = tokens(1, 3, 17)
    assert not torch.allclose(model(unpadded, tgt), before)


def test_sequence_padded_inside_a_batch_equals_it_alone() -> None:
    model = tiny_model()
    short_src, short_tgt = tokens(1, 3, 17), tokens(1, 2, 19)
    long_src, long_tgt = tokens(1, 9, 17), tokens(1, 7, 19)
    src = torch.cat([torch.cat([short_src, torch.full((1, 6), PAD)], 1), long_src])
    tgt = torch.cat([torch.cat([short_tgt, torch.full((1, 5), PAD)], 1), long_tgt])
    batch = model(src, tgt)
    torch.testing.assert_close(batch[:1, :2], model(short_src, short_tgt), atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(batch[1:], model(long_src, long_tgt), atol=ATOL, rtol=ATOL)


def test_all_padding_source_gives_finite_logits_and_gradients() -> None:
    model = tiny_model().train()
    src = torch.cat([tokens(1, 4, 17), torch.full((1, 4), PAD)])
    logits = model(src, tokens(2, 3, 19))
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_incremental_decoding_equals_full_forward(overrides: dict) -> None:
    model = tiny_model(**overrides)
    src = torch.cat([tokens(3, 7, 17)[:, :5], torch.full((3, 2), PAD)], 1)
    src[0, 5:] = tokens(1, 2, 17)  # one row without padding
    tgt = torch.cat([torch.full((3, 1), BOS), tokens(3, 8, model.config.tgt_vocab_size)], 1)
    full = model(src, tgt)
    memory, memory_keep = model.encode(src), model.keep_mask(src)
    cache = model.new_cache()
    for t in range(tgt.size(1)):
        step = model.decode(tgt[:, t : t + 1], memory, memory_keep, cache)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=ATOL, rtol=ATOL)
    assert len(cache) == tgt.size(1)
    # The cache also keeps the stacked q/k/v weights: they are the model's, not stale copies.
    layer = model.decoder.layers[0].self_attn
    stacked = torch.cat([layer.proj_q.weight, layer.proj_k.weight, layer.proj_v.weight])
    assert torch.equal(cache.self_attn[0].qkv_weight, stacked)


def test_last_only_projects_just_the_last_position() -> None:
    model = tiny_model()
    src, tgt = tokens(3, 5, 17), tokens(3, 6, 19)
    memory, memory_keep = model.encode(src), model.keep_mask(src)
    last = model.decode(tgt, memory, memory_keep, last_only=True)
    assert last.shape == (3, 1, model.config.tgt_vocab_size)
    torch.testing.assert_close(last[:, 0], model(src, tgt)[:, -1], atol=ATOL, rtol=ATOL)


def test_cache_reorder_follows_the_batch() -> None:
    # Beam search reshuffles rows between steps; the cache must follow them.
    model = tiny_model()
    src, tgt = tokens(3, 5, 17), tokens(3, 6, 19)
    memory, memory_keep = model.encode(src), model.keep_mask(src)
    cache = model.new_cache()
    model.decode(tgt[:, :3], memory, memory_keep, cache)
    order = torch.tensor([2, 0, 0])
    cache.reorder(order)
    rest = model.decode(tgt[order, 3:], memory[order], memory_keep[order], cache)
    torch.testing.assert_close(rest, model(src[order], tgt[order])[:, 3:], atol=ATOL, rtol=ATOL)


def test_cache_reordered_at_every_step_equals_the_full_forward() -> None:
    # Beam search reorders at every step, through the growth of the cache's buffers (16, then
    # 32 positions), in inference mode (where the cache gathers into buffers it keeps).
    model = tiny_model(max_positions=40)
    src, tgt = tokens(3, 5, 17), tokens(3, 40, 19)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        memory, keep = model.encode(src), model.keep_mask(src)
        cache, rows, history = model.new_cache(), torch.arange(3), tgt[:, :1]
        model.decode(history, memory, keep, cache)
        for t in range(1, tgt.size(1)):
            index = torch.randint(0, 3, (3,), generator=generator)
            cache.reorder(index)
            rows, history = rows[index], history[index]
            history = torch.cat([history, tgt[rows, t : t + 1]], 1)
            last = model.decode(history[:, -1:], memory[rows], keep[rows], cache)
            full = model(src[rows], history)[:, -1:]
            torch.testing.assert_close(last, full, atol=ATOL, rtol=ATOL)


def test_permuting_the_source_changes_the_output() -> None:
    model = tiny_model()
    src, tgt = tokens(1, 8, 17), tokens(1, 4, 19)
    while torch.equal(src.flip(1), src):
        src = tokens(1, 8, 17)
    assert not torch.allclose(model(src, tgt), model(src.flip(1), tgt), atol=1e-3)


def test_tied_and_shared_embeddings_share_storage() -> None:
    model = tiny_model(tgt_vocab_size=17, share_embeddings=True, tie_output=True)
    assert model.generator.weight is model.tgt_embed.tokens.weight
    assert model.src_embed is model.tgt_embed
    untied = tiny_model()
    assert untied.generator.weight is not untied.tgt_embed.tokens.weight
    n_tied = sum(p.numel() for p in model.parameters())
    n_untied = sum(p.numel() for p in tiny_model(tgt_vocab_size=17).parameters())
    assert n_untied - n_tied == 2 * 17 * 16  # one source embedding and one projection fewer


def test_sequences_longer_than_max_positions_fail_clearly() -> None:
    model = tiny_model(max_positions=8)
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_positions=8"):
        model(tokens(1, 9, 17), tokens(1, 3, 19))
    with pytest.raises(ValueError, match="sequence length 10 exceeds max_positions=8"):
        model(tokens(1, 3, 17), tokens(1, 10, 19))
    memory = model.encode(tokens(1, 3, 17))
    cache = model.new_cache()
    model.decode(tokens(1, 8, 19), memory, torch.ones(1, 3, dtype=torch.bool), cache)
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_positions=8"):
        model.decode(tokens(1, 1, 19), memory, torch.ones(1, 3, dtype=torch.bool), cache)


def test_memory_keep_of_the_wrong_shape_fails_clearly() -> None:
    model = tiny_model()
    memory = model.encode(tokens(2, 5, 17))
    with pytest.raises(ValueError, match=r"memory_keep must have shape \(B, S\) = \(2, 5\)"):
        model.decode(tokens(2, 3, 19), memory, torch.ones(2, 1, 1, 5, dtype=torch.bool))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 10, "num_heads": 3}, "d_model must be divisible by num_heads.*10 and 3"),
        ({"num_heads": 0}, "num_heads must be a positive integer, got 0"),
        ({"d_ff": -4}, "d_ff must be a positive integer, got -4"),
        ({"k_dim": 0}, "k_dim must be a positive integer, got 0"),
        ({"src_vocab_size": 2}, r"pad_id must be in \[0, 2\)|eos_id must be in \[0, 2\)"),
        ({"bos_id": 0}, "pad_id, bos_id and eos_id must differ, got 0, 0 and 2"),
        ({"dropout": 1.0}, r"dropout must be a number in \[0, 1\), got 1.0"),
        ({"positional": "alibi"}, "positional must be one of .*'rotary'.*got 'alibi'"),
        ({"share_embeddings": True}, "share_embeddings needs one vocabulary.*17.*19"),
    ],
)
def test_invalid_configs_raise_value_error(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_uneven_heads_allowed_with_explicit_head_widths() -> None:
    config = tiny_config(d_model=10, num_heads=3, k_dim=4, v_dim=5)
    assert config.head_dims == (4, 5)
    model = Seq2SeqTransformer(config)
    assert model(tokens(2, 4, 17), tokens(2, 3, 19)).shape == (2, 3, 19)


def test_config_round_trips_through_a_plain_dict() -> None:
    config = tiny_config(positional="learned", k_dim=6)
    assert ModelConfig(**config.to_dict()) == config
    assert dataclasses.asdict(config) == config.to_dict()


def test_model_learns_to_copy() -> None:
    """A few hundred steps on a fixed batch: the loss must fall far and greedy must copy."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        tiny_config(
            src_vocab_size=12, tgt_vocab_size=12, d_model=32, num_heads=4, d_ff=64, dropout=0.0
        )
    )
    src = tokens(16, 6, 12)
    tgt_in = torch.cat([torch.full((16, 1), BOS), src], 1)
    labels = torch.cat([src, torch.full((16, 1), EOS)], 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    model.eval()
    assert torch.equal(model(src, tgt_in).argmax(-1), labels)
