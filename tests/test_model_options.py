"""The model's options of the 2020s, each against a reference, and every combination of them
through the masking and key/value-cache invariants.

RMSNorm against its formula; the gated feed-forward units against a plain implementation;
rotary positions by their defining property (a query-key score depends on i - j only) and by
the pair rotation written out; grouped-query attention against full multi-head attention with
the key/value heads repeated; bias-free layers by their parameters.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_model import ATOL, PAD, tiny_config, tiny_model, tokens

from seq2seq.core.attention import CrossAttention, KVCache, MultiHeadAttention
from seq2seq.core.model import (
    FeedForward,
    GatedFeedForward,
    ModelConfig,
    RotaryPositions,
    Seq2SeqTransformer,
    gated_width,
    make_norm,
)

# Every combination of the options (with post-norm and tied, shared embeddings, which touch
# the same code): 2 x 4 x 3 x 2 x 2 x 2 x 2 = 384 small models.
COMBINATIONS = [
    dict(
        zip(
            ("norm", "activation", "positional", "num_kv_heads", "bias", "norm_first", "qk_norm"),
            c,
            strict=True,
        )
    )
    for c in itertools.product(
        ("layer", "rms"),
        ("relu", "gelu", "swiglu", "geglu"),
        ("sinusoidal", "learned", "rotary"),
        (None, 1),
        (True, False),
        (True, False),
        (False, True),
    )
]


def combination_id(options: dict) -> str:
    return "-".join(str(value) for value in options.values())


@pytest.mark.parametrize("options", COMBINATIONS, ids=combination_id)
def test_masking_and_cache_invariants_hold_for_every_combination(options: dict) -> None:
    torch.manual_seed(0)
    model = tiny_model(**options, num_heads=4, tgt_vocab_size=17, share_embeddings=True)
    src = torch.cat([tokens(3, 6, 17), torch.full((3, 2), PAD)], 1)
    src[0, 6:] = tokens(1, 2, 17)  # one row without padding
    tgt = torch.cat([torch.full((3, 1), 1), tokens(3, 6, 17)], 1)
    full = model(src, tgt)
    # Causal: later targets change no earlier logit.
    changed = tgt.clone()
    changed[:, 4:] = tokens(3, 3, 17)
    torch.testing.assert_close(model(src, changed)[:, :4], full[:, :4], atol=ATOL, rtol=ATOL)
    # Source padding: more of it changes nothing.
    more = torch.cat([src, torch.full((3, 3), PAD)], 1)
    torch.testing.assert_close(model(more, tgt), full, atol=ATOL, rtol=ATOL)
    # Incremental decoding with the cache, reordered as beam search reorders it, equals the
    # full forward at every step.
    memory, keep = model.encode(src), model.keep_mask(src)
    cache, rows = model.new_cache(), torch.arange(3)
    order = torch.tensor([2, 0, 0])
    for t in range(tgt.size(1)):
        if t == 3:
            cache.reorder(order)
            rows = rows[order]
        step = model.decode(tgt[rows, t : t + 1], memory[rows], keep[rows], cache)
        torch.testing.assert_close(step[:, 0], full[rows, t], atol=ATOL, rtol=ATOL)


def test_rms_norm_is_its_formula() -> None:
    norm = make_norm(tiny_config(norm="rms"))
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 16)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert [name for name, _ in norm.named_parameters()] == ["weight"]  # no bias


@pytest.mark.parametrize(("activation", "gate"), [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_units_equal_a_plain_implementation(activation: str, gate) -> None:
    model = tiny_model(activation=activation, d_ff=48)
    ff = model.encoder.layers[0].ff
    assert isinstance(ff, GatedFeedForward)
    for linear in (ff.gate, ff.up, ff.down):
        torch.nn.init.normal_(linear.bias)
    x = torch.randn(2, 7, 16)
    hidden = gate(x @ ff.gate.weight.T + ff.gate.bias) * (x @ ff.up.weight.T + ff.up.bias)
    expected = hidden @ ff.down.weight.T + ff.down.bias
    torch.testing.assert_close(ff(x), expected)
    assert ff.gate.out_features == gated_width(48) == 32


def test_gelu_feed_forward_is_the_exact_gelu() -> None:
    ff = tiny_model(activation="gelu").encoder.layers[0].ff
    assert isinstance(ff, FeedForward)
    x = torch.randn(2, 3, 16)
    expected = F.gelu(x @ ff[0].weight.T + ff[0].bias) @ ff[3].weight.T + ff[3].bias
    torch.testing.assert_close(ff(x), expected)


@pytest.mark.parametrize("d_ff", [256, 1024, 2048])
def test_a_gated_block_has_about_the_parameters_of_a_plain_one(d_ff: int) -> None:
    plain = FeedForward(256, d_ff, 0.0)
    gated = GatedFeedForward(256, gated_width(d_ff), 0.0, torch.nn.SiLU())
    count = [sum(p.numel() for p in block.parameters()) for block in (plain, gated)]
    assert abs(count[1] - count[0]) / count[0] < 0.025, count  # the rounding to 8


def test_rotary_scores_depend_only_on_the_distance() -> None:
    rotary = RotaryPositions(64, 8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> float:
        return (rotary(q, i) * rotary(k, j)).sum().item()

    for i, j in [(0, 0), (5, 2), (2, 5), (10, 40)]:
        for shift in (1, 7, 20):
            assert score(i + shift, j + shift) == pytest.approx(score(i, j), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(2, 5), abs=1e-3)  # the sign of i - j counts
    assert score(3, 0) != pytest.approx(score(0, 0), abs=1e-3)  # and its size


def test_rotary_self_attention_sees_only_relative_positions() -> None:
    # The same six inputs at positions 0-5, then at 5-10 after five masked positions in the
    # cache: rotary attention gives the same weights and outputs (queries and keys both turned).
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 8, 8, 2, rotary=RotaryPositions(32, 8)).eval()
    x = torch.randn(1, 6, 16)
    out, weights = attn(x, is_causal=True, need_weights=True)
    cache = KVCache()
    attn(torch.randn(1, 5, 16), cache=cache)
    keep = torch.tensor([False] * 5 + [True] * 6)
    shifted_out, shifted = attn(x, keep, is_causal=True, need_weights=True, cache=cache)
    torch.testing.assert_close(shifted[..., 5:], weights)
    torch.testing.assert_close(shifted_out, out)
    attn.rotary = None  # the same weights without positions attend otherwise
    assert not torch.allclose(attn(x, is_causal=True, need_weights=True)[1], weights, atol=1e-3)


def test_rotary_turns_adjacent_pairs_by_position_times_frequency() -> None:
    rotary = RotaryPositions(16, 4, base=10000.0)
    x = torch.randn(2, 3, 5, 4)  # (B, H, T, D) at positions 7 .. 11
    out = rotary(x, offset=7)
    for t in range(5):
        for pair, freq in enumerate((1.0, 10000.0**-0.5)):
            angle = torch.tensor((7 + t) * freq)
            a, b = x[..., t, 2 * pair], x[..., t, 2 * pair + 1]
            turned_a = a * angle.cos() - b * angle.sin()
            turned_b = a * angle.sin() + b * angle.cos()
            torch.testing.assert_close(out[..., t, 2 * pair], turned_a)
            torch.testing.assert_close(out[..., t, 2 * pair + 1], turned_b)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


def test_rotary_models_add_no_positions_to_the_embeddings_and_keep_the_limit() -> None:
    model = tiny_model(positional="rotary", max_positions=8)
    ids = tokens(2, 5, 17)
    expected = model.src_embed.tokens(ids) * model.src_embed.scale
    torch.testing.assert_close(model.src_embed(ids), expected)
    assert not any("positions" in name for name in model.state_dict())  # nothing saved
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_positions=8"):
        model(tokens(1, 9, 17), tokens(1, 3, 19))
    # Encoder self-attention is where a rotary model sees word order at all.
    src = tokens(1, 6, 17)
    while torch.equal(src.flip(1), src):
        src = tokens(1, 6, 17)
    assert not torch.allclose(model.encode(src).flip(1), model.encode(src.flip(1)), atol=1e-3)


def repeated_heads(grouped: torch.nn.Linear, groups: int, head_dim: int) -> torch.Tensor:
    """A key or value projection's weight with each head's rows repeated for its group."""
    heads = grouped.weight.view(-1, head_dim, grouped.in_features)
    return heads.repeat_interleave(groups, dim=0).reshape(-1, grouped.in_features)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_self_attention_is_full_attention_with_heads_repeated(kv_heads) -> None:
    torch.manual_seed(0)
    grouped = MultiHeadAttention(24, 6, 5, 4, num_kv_heads=kv_heads)
    full = MultiHeadAttention(24, 6, 5, 4)
    groups = 4 // kv_heads
    with torch.no_grad():
        full.proj_q.weight.copy_(grouped.proj_q.weight)
        full.proj_k.weight.copy_(repeated_heads(grouped.proj_k, groups, 6))
        full.proj_v.weight.copy_(repeated_heads(grouped.proj_v, groups, 5))
        full.proj_o.load_state_dict(grouped.proj_o.state_dict())
    x = torch.randn(2, 7, 24)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False
    torch.testing.assert_close(grouped(x, keep, is_causal=True), full(x, keep, is_causal=True))
    _, weights = grouped(x, keep, need_weights=True)
    torch.testing.assert_close(weights, full(x, keep, need_weights=True)[1])
    # The cache holds the key/value heads only: num_heads / kv_heads times smaller.
    cache = KVCache()
    for t in range(7):
        step = grouped(x[:, t : t + 1], keep[..., : t + 1], is_causal=True, cache=cache)
        torch.testing.assert_close(step, full(x, keep, is_causal=True)[:, t : t + 1])
    assert cache.k.shape == (2, kv_heads, 7, 6) and cache.v.shape == (2, kv_heads, 7, 5)


def test_grouped_query_cross_attention_is_full_attention_with_heads_repeated() -> None:
    torch.manual_seed(0)
    grouped = CrossAttention(16, 12, 4, 4, 6, num_kv_heads=2)
    full = CrossAttention(16, 12, 4, 4, 6)
    with torch.no_grad():
        full.proj_q1.weight.copy_(grouped.proj_q1.weight)
        full.proj_k2.weight.copy_(repeated_heads(grouped.proj_k2, 3, 4))
        full.proj_v2.weight.copy_(repeated_heads(grouped.proj_v2, 3, 4))
        full.proj_o.load_state_dict(grouped.proj_o.state_dict())
    x1, x2 = torch.randn(2, 3, 16), torch.randn(2, 5, 12)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None]
    torch.testing.assert_close(grouped(x1, x2, keep), full(x1, x2, keep))


def test_grouped_query_model_has_fewer_parameters_and_a_smaller_cache() -> None:
    full, grouped = tiny_model(num_heads=4), tiny_model(num_heads=4, num_kv_heads=1)
    count = [sum(p.numel() for p in m.parameters()) for m in (full, grouped)]
    # Keys and values shrink from 16 x 16 to 16 x 4 each in 6 attention layers (2 encoder,
    # 2 decoder self, 2 cross).
    assert count[0] - count[1] == 6 * 2 * 16 * 12
    src, tgt = tokens(2, 5, 17), tokens(2, 3, 19)
    cache = grouped.new_cache()
    grouped.decode(tgt, grouped.encode(src), grouped.keep_mask(src), cache)
    assert cache.self_attn[0].k.shape == (2, 1, 3, 4)
    assert cache.cross_attn[0].k.shape == (2, 1, 5, 4)


def test_bias_free_models_have_no_bias_in_any_linear_layer() -> None:
    model = tiny_model(bias=False, activation="swiglu")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.bias is None for m in linears)
    with_bias = tiny_model()
    assert any(m.bias is not None for m in with_bias.modules() if isinstance(m, torch.nn.Linear))


def qk_normed_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gains: tuple, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of (B, H, T, D) heads written out: each query and key vector divided by its
    root mean square (plus 1e-5) and times its gain, then softmax(q k^T / sqrt(D)) v."""

    def normed(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

    q, k = normed(q, gains[0]), normed(k, gains[1])
    scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    return weights @ v, weights


def test_qk_norm_attention_equals_its_definition_written_out() -> None:
    """QK-norm (model.net.qk_norm): self- and cross-attention against the formula, with
    gains that are not one; the cache holds the normalised keys."""
    torch.manual_seed(0)
    b, t1, t2, h, d = 2, 5, 7, 4, 6
    self_attn = MultiHeadAttention(24, d, d, h, qk_norm=True)
    cross = CrossAttention(24, 16, d, d, h, qk_norm=True)
    for attn in (self_attn, cross):
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 2.0)
            attn.k_norm.weight.uniform_(0.5, 2.0)
    gains = (self_attn.q_norm.weight, self_attn.k_norm.weight)

    def heads(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return layer(x).view(b, x.size(1), h, d).transpose(1, 2)

    x = torch.randn(b, t1, 24)
    causal = torch.ones(t1, t1, dtype=torch.bool).tril()
    out, weights = qk_normed_reference(
        heads(x, self_attn.proj_q), heads(x, self_attn.proj_k), heads(x, self_attn.proj_v),
        gains, causal,
    )  # fmt: skip
    expected = self_attn.proj_o(out.transpose(1, 2).reshape(b, t1, h * d))
    got, got_weights = self_attn(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_weights, weights)
    cache = KVCache()
    for t in range(t1):
        step = self_attn(x[:, t : t + 1], is_causal=True, cache=cache)
        torch.testing.assert_close(step, expected[:, t : t + 1])
    memory = torch.randn(b, t2, 16)
    keep = torch.ones(b, 1, 1, t2, dtype=torch.bool)
    keep[1, ..., 5:] = False
    out, weights = qk_normed_reference(
        heads(x, cross.proj_q1), heads(memory, cross.proj_k2), heads(memory, cross.proj_v2),
        (cross.q_norm.weight, cross.k_norm.weight), keep,
    )  # fmt: skip
    expected = cross.proj_o(out.transpose(1, 2).reshape(b, t1, h * d))
    got, got_weights = cross(x, memory, keep, need_weights=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_weights, weights)
    cache = KVCache()
    for _ in range(2):  # the first call fills the cache, the second reads it
        torch.testing.assert_close(cross(x, memory, keep, cache=cache), expected)
    names = set(Seq2SeqTransformer(tiny_config(qk_norm=True)).state_dict())
    assert {
        "decoder.layers.0.cross_attn.q_norm.weight",
        "encoder.layers.1.self_attn.k_norm.weight",
    } <= names
    assert not any("q_norm" in n for n in Seq2SeqTransformer(tiny_config()).state_dict())
    from seq2seq.export import check_exportable

    refusal = r"^cannot export model.net.qk_norm=True: CTranslate2 normalises the cross-attention"
    with pytest.raises(ValueError, match=refusal + r".*; train with qk_norm=self \(self-attention"):
        check_exportable(tiny_config(qk_norm=True))  # CTranslate2 norms cross queries unlike ours
    check_exportable(tiny_config(qk_norm="self"))


def test_qk_norm_self_normalises_self_attention_only() -> None:
    """qk_norm=self: the encoder's and the decoder's self-attention as with qk_norm=true (the
    same weights give the same outputs), the cross-attention as without it."""
    torch.manual_seed(0)
    both, only_self = tiny_model(qk_norm=True), tiny_model(qk_norm="self")
    names = set(only_self.state_dict())
    assert "encoder.layers.0.self_attn.q_norm.weight" in names
    assert "decoder.layers.1.self_attn.k_norm.weight" in names
    assert not any("cross_attn.q_norm" in n or "cross_attn.k_norm" in n for n in names)
    with torch.no_grad():
        for parameter in both.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))  # gains that are not one
    only_self.load_state_dict(both.state_dict(), strict=False)
    for layer in both.decoder.layers:
        layer.cross_attn.q_norm = layer.cross_attn.k_norm = torch.nn.Identity()
    src, tgt = tokens(2, 7, 17), tokens(2, 5, 19)
    torch.testing.assert_close(only_self(src, tgt), both(src, tgt))


def test_default_options_keep_the_parameter_names_of_earlier_checkpoints() -> None:
    names = set(Seq2SeqTransformer(tiny_config()).state_dict())
    assert {"encoder.layers.0.ff.0.weight", "encoder.layers.0.ff.3.bias"} <= names
    assert {
        "encoder.layers.0.res_attn.norm.bias",
        "decoder.layers.1.self_attn.proj_o.bias",
    } <= names
    assert {"src_embed.positions.table"}.isdisjoint(names)  # sinusoids are not saved


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"norm": "batch"}, r"norm must be one of \('layer', 'rms'\), got 'batch'"),
        ({"activation": "tanh"}, r"activation must be one of \('relu', 'gelu', 'swiglu'"),
        ({"num_kv_heads": 3}, "num_kv_heads must divide num_heads .* got 3 and 2"),
        ({"num_kv_heads": 0}, "num_kv_heads must be a positive integer, got 0"),
        ({"positional": "rotary", "k_dim": 5}, "the per-head k_dim must be even, got 5"),
        ({"bias": "no"}, "bias must be true or false, got 'no'"),
        ({"qk_norm": "yes"}, "qk_norm must be true, false or self .* got 'yes'"),
        ({"qk_norm": 1}, r"qk_norm must be true, false or self \(self-attention only\), got 1"),
    ],
)
def test_invalid_options_raise_value_error(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_options_round_trip_through_a_plain_dict() -> None:
    config = tiny_config(norm="rms", activation="geglu", positional="rotary", num_kv_heads=1)
    assert ModelConfig(**config.to_dict()) == config
