"""MultiHeadAttention and CrossAttention against trusted references.

Oracles: torch.nn.MultiheadAttention (where its shapes allow) and a plain per-head reference
written here, kept out of the package on purpose so it cannot become a runtime fallback.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from seq2seq.core.attention import (
    CrossAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadSelfAttention,
    causal_mask,
)

ATOL = 1e-5


def reference_attention(
    attn: MultiHeadAttention | CrossAttention, xq: Tensor, xkv: Tensor, keep: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One head at a time, with plain matmuls; fully masked query rows give zeros."""
    if isinstance(attn, CrossAttention):
        wq, wk, wv = attn.proj_q1.weight, attn.proj_k2.weight, attn.proj_v2.weight
    else:
        wq, wk, wv = attn.proj_q.weight, attn.proj_k.weight, attn.proj_v.weight
    dk, dv, heads = attn.k_dim, attn.v_dim, attn.num_heads
    b, tq, tk = xq.size(0), xq.size(1), xkv.size(1)
    keep = torch.ones(b, heads, tq, tk, dtype=torch.bool) if keep is None else keep
    keep = keep.expand(b, heads, tq, tk)
    outputs, probs = [], []
    for h in range(heads):
        q = xq @ wq[h * dk : (h + 1) * dk].T  # (B, Tq, Dk)
        k = xkv @ wk[h * dk : (h + 1) * dk].T  # (B, Tk, Dk)
        v = xkv @ wv[h * dv : (h + 1) * dv].T  # (B, Tk, Dv)
        scores = q @ k.transpose(1, 2) / math.sqrt(dk)
        scores = scores.masked_fill(~keep[:, h], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        p = torch.where(keep[:, h].any(-1, keepdim=True), p, torch.zeros_like(p))
        outputs.append(p @ v)
        probs.append(p)
    out = torch.cat(outputs, dim=-1) @ attn.proj_o.weight.T + attn.proj_o.bias
    return out, torch.stack(probs, dim=1)


def torch_mha_like(attn: MultiHeadAttention | CrossAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding our weights, in-projection bias zeroed."""
    if isinstance(attn, CrossAttention):
        mha = nn.MultiheadAttention(
            attn.in_dim1, attn.num_heads, kdim=attn.in_dim2, vdim=attn.in_dim2, batch_first=True
        )
        with torch.no_grad():
            mha.q_proj_weight.copy_(attn.proj_q1.weight)
            mha.k_proj_weight.copy_(attn.proj_k2.weight)
            mha.v_proj_weight.copy_(attn.proj_v2.weight)
    else:
        mha = nn.MultiheadAttention(attn.in_dim, attn.num_heads, batch_first=True)
        with torch.no_grad():
            w = torch.cat([attn.proj_q.weight, attn.proj_k.weight, attn.proj_v.weight])
            mha.in_proj_weight.copy_(w)
    with torch.no_grad():
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(attn.proj_o.weight)
        mha.out_proj.bias.copy_(attn.proj_o.bias)
    return mha


def padding_keep(batch: int, length: int, lengths: list[int]) -> Tensor:
    return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)


def parameter_grads(attn: MultiHeadAttention | CrossAttention, mha: nn.MultiheadAttention):
    """Pairs (name, our gradient, torch's gradient) of every weight the two modules share."""
    if isinstance(attn, CrossAttention):
        ours = [attn.proj_q1.weight, attn.proj_k2.weight, attn.proj_v2.weight]
        theirs = [mha.q_proj_weight.grad, mha.k_proj_weight.grad, mha.v_proj_weight.grad]
    else:
        ours = [attn.proj_q.weight, attn.proj_k.weight, attn.proj_v.weight]
        theirs = list(mha.in_proj_weight.grad.chunk(3))
    ours += [attn.proj_o.weight, attn.proj_o.bias]
    theirs += [mha.out_proj.weight.grad, mha.out_proj.bias.grad]
    names = ["q", "k", "v", "o.weight", "o.bias"]
    return [(n, p.grad, g) for n, p, g in zip(names, ours, theirs, strict=True)]


def assert_same_with_grads(ours_fn, theirs_fn, *inputs: Tensor, modules=None) -> None:
    """Same outputs, same input gradients and (given modules=(ours, torch's)) the same
    gradients of every weight."""
    a = [x.clone().requires_grad_() for x in inputs]
    b = [x.clone().requires_grad_() for x in inputs]
    if modules:
        for module in modules:
            module.zero_grad(set_to_none=True)
    out_a, out_b = ours_fn(*a), theirs_fn(*b)
    torch.testing.assert_close(out_a, out_b, atol=ATOL, rtol=ATOL)
    grad = torch.randn_like(out_a)
    out_a.backward(grad)
    out_b.backward(grad)
    for xa, xb in zip(a, b, strict=True):
        torch.testing.assert_close(xa.grad, xb.grad, atol=ATOL, rtol=ATOL)
    for name, ours, theirs in parameter_grads(*modules) if modules else []:
        assert ours is not None, f"no gradient reached proj_{name}"
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=ATOL, msg=f"proj_{name}")


# --- oracle: torch.nn.MultiheadAttention -------------------------------------------------


def test_self_attention_equals_torch_with_key_padding() -> None:
    attn = MultiHeadAttention(in_dim=32, k_dim=8, v_dim=8, num_heads=4)
    mha = torch_mha_like(attn)
    keep = padding_keep(3, 6, [6, 4, 1])  # (B, T)
    assert_same_with_grads(
        lambda x: attn(x, keep[:, None, None, :]),
        lambda x: mha(x, x, x, key_padding_mask=~keep, need_weights=False)[0],
        torch.randn(3, 6, 32),
        modules=(attn, mha),
    )


def test_self_attention_equals_torch_with_causal_mask() -> None:
    attn = MultiHeadAttention(in_dim=32, k_dim=8, v_dim=8, num_heads=4)
    mha = torch_mha_like(attn)
    theirs_mask = ~causal_mask(7, 7)  # torch: True = may NOT attend
    x = torch.randn(2, 7, 32)
    assert_same_with_grads(
        lambda x: attn(x, is_causal=True),
        lambda x: mha(x, x, x, attn_mask=theirs_mask, need_weights=False)[0],
        x,
        modules=(attn, mha),
    )
    assert_same_with_grads(
        lambda x: attn(x, causal_mask(7, 7)),
        lambda x: mha(x, x, x, attn_mask=theirs_mask, need_weights=False)[0],
        x,
        modules=(attn, mha),
    )


def test_self_attention_weights_equal_torch() -> None:
    attn = MultiHeadAttention(in_dim=16, k_dim=4, v_dim=4, num_heads=4)
    mha = torch_mha_like(attn)
    keep = padding_keep(2, 5, [5, 3])
    x = torch.randn(2, 5, 16)
    out, weights = attn(x, keep[:, None, None, :], need_weights=True)
    out_t, weights_t = mha(
        x, x, x, key_padding_mask=~keep, need_weights=True, average_attn_weights=False
    )
    torch.testing.assert_close(out, out_t, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(weights, weights_t, atol=ATOL, rtol=ATOL)


def test_cross_attention_equals_torch() -> None:
    attn = CrossAttention(in_dim1=24, in_dim2=40, k_dim=6, v_dim=6, num_heads=4)
    mha = torch_mha_like(attn)
    keep = padding_keep(3, 9, [9, 2, 5])
    assert_same_with_grads(
        lambda x1, x2: attn(x1, x2, keep[:, None, None, :]),
        lambda x1, x2: mha(x1, x2, x2, key_padding_mask=~keep, need_weights=False)[0],
        torch.randn(3, 4, 24),
        torch.randn(3, 9, 40),
        modules=(attn, mha),
    )


# --- the explicit reference, for shapes torch cannot express ------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
def test_self_attention_with_different_key_and_value_widths(with_mask: bool) -> None:
    attn = MultiHeadAttention(in_dim=20, k_dim=16, v_dim=24, num_heads=3)
    x = torch.randn(2, 6, 20)
    keep = padding_keep(2, 6, [6, 3])[:, None, None, :] if with_mask else None
    expected, expected_weights = reference_attention(attn, x, x, keep)
    torch.testing.assert_close(attn(x, keep), expected, atol=ATOL, rtol=ATOL)
    out, weights = attn(x, keep, need_weights=True)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("with_mask", [False, True])
def test_cross_attention_with_different_key_and_value_widths(with_mask: bool) -> None:
    attn = CrossAttention(in_dim1=12, in_dim2=18, k_dim=16, v_dim=24, num_heads=2)
    x1, x2 = torch.randn(2, 3, 12), torch.randn(2, 8, 18)
    keep = padding_keep(2, 8, [8, 5])[:, None, None, :] if with_mask else None
    expected, _ = reference_attention(attn, x1, x2, keep)
    torch.testing.assert_close(attn(x1, x2, keep), expected, atol=ATOL, rtol=ATOL)


masks_and_shapes = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 3),
        "tq": st.integers(1, 7),
        "tk": st.integers(1, 7),
        "heads": st.integers(1, 4),
        "k_dim": st.integers(1, 9),
        "v_dim": st.integers(1, 9),
        "in_dim": st.integers(1, 12),
        "mask_kind": st.sampled_from(["none", "per_key", "per_head", "full"]),
        "seed": st.integers(0, 2**16),
    }
)


def random_keep(p: dict, gen: torch.Generator) -> Tensor | None:
    shapes = {
        "per_key": (p["batch"], 1, 1, p["tk"]),
        "per_head": (p["batch"], p["heads"], 1, p["tk"]),
        "full": (p["batch"], p["heads"], p["tq"], p["tk"]),
    }
    if p["mask_kind"] == "none":
        return None
    return torch.rand(shapes[p["mask_kind"]], generator=gen) < 0.6


@settings(max_examples=60, deadline=None)
@given(masks_and_shapes)
def test_cross_attention_matches_reference_on_random_shapes(p: dict) -> None:
    gen = torch.Generator().manual_seed(p["seed"])
    attn = CrossAttention(p["in_dim"], p["in_dim"] + 1, p["k_dim"], p["v_dim"], p["heads"])
    x1 = torch.randn(p["batch"], p["tq"], p["in_dim"], generator=gen)
    x2 = torch.randn(p["batch"], p["tk"], p["in_dim"] + 1, generator=gen)
    keep = random_keep(p, gen)
    expected, expected_weights = reference_attention(attn, x1, x2, keep)
    torch.testing.assert_close(attn(x1, x2, keep), expected, atol=ATOL, rtol=ATOL)
    out, weights = attn(x1, x2, keep, need_weights=True)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=ATOL)


@settings(max_examples=60, deadline=None)
@given(masks_and_shapes)
def test_self_attention_matches_reference_on_random_shapes(p: dict) -> None:
    p = {**p, "tk": p["tq"]}
    gen = torch.Generator().manual_seed(p["seed"])
    attn = MultiHeadAttention(p["in_dim"], p["k_dim"], p["v_dim"], p["heads"])
    x = torch.randn(p["batch"], p["tq"], p["in_dim"], generator=gen)
    keep = random_keep(p, gen)
    expected, _ = reference_attention(attn, x, x, keep)
    torch.testing.assert_close(attn(x, keep), expected, atol=ATOL, rtol=ATOL)
    causal = causal_mask(p["tq"], p["tq"])
    expected, _ = reference_attention(attn, x, x, causal if keep is None else keep & causal)
    torch.testing.assert_close(attn(x, keep, is_causal=True), expected, atol=ATOL, rtol=ATOL)


# --- masking invariants -------------------------------------------------------------------


def test_fully_masked_rows_give_zeros_and_finite_gradients() -> None:
    attn = MultiHeadAttention(in_dim=8, k_dim=4, v_dim=4, num_heads=2)
    x = torch.randn(2, 5, 8, requires_grad=True)
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[0, :, 2] = False  # query 2 of example 0 may attend nothing
    keep[1] = False  # example 1 may attend nothing at all
    for need_weights in (False, True):
        x.grad = None
        out = attn(x, keep, need_weights=need_weights)
        out, weights = out if need_weights else (out, None)
        assert torch.isfinite(out).all()
        # With nothing to attend to, the heads give zeros, so only proj_o's bias remains.
        torch.testing.assert_close(out[0, 2], attn.proj_o.bias)
        torch.testing.assert_close(out[1], attn.proj_o.bias.expand(5, 8))
        if weights is not None:
            assert (weights[1] == 0).all() and (weights[0, :, 2] == 0).all()
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
        assert torch.isfinite(attn.proj_q.weight.grad).all()


def test_masked_keys_do_not_influence_the_output() -> None:
    attn = CrossAttention(in_dim1=8, in_dim2=8, k_dim=4, v_dim=4, num_heads=2)
    x1, x2 = torch.randn(1, 3, 8), torch.randn(1, 6, 8)
    keep = padding_keep(1, 6, [4])[:, None, None, :]
    changed = x2.clone()
    changed[:, 4:] = torch.randn(1, 2, 8) * 100
    torch.testing.assert_close(attn(x1, x2, keep), attn(x1, changed, keep))


def test_integer_masks_read_as_boolean() -> None:
    attn = MultiHeadAttention(in_dim=8, k_dim=4, v_dim=4, num_heads=2)
    x = torch.randn(2, 4, 8)
    keep = padding_keep(2, 4, [4, 2])[:, None, None, :]
    torch.testing.assert_close(attn(x, keep.long()), attn(x, keep))


def test_causal_mask_aligns_new_queries_to_the_last_keys() -> None:
    assert causal_mask(3, 3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_self_attention_cache_equals_full_causal_attention() -> None:
    attn = MultiHeadAttention(in_dim=16, k_dim=4, v_dim=6, num_heads=2)
    x = torch.randn(2, 6, 16)
    full = attn(x, is_causal=True)
    cache = KVCache()
    first = attn(x[:, :2], is_causal=True, cache=cache)  # a prompt of two positions
    steps = [attn(x[:, t : t + 1], is_causal=True, cache=cache) for t in range(2, 6)]
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, atol=ATOL, rtol=ATOL)
    assert len(cache) == 6


def test_cross_attention_cache_computes_keys_once() -> None:
    attn = CrossAttention(in_dim1=8, in_dim2=8, k_dim=4, v_dim=4, num_heads=2)
    x1, x2 = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    cache = KVCache()
    first = attn(x1, x2, cache=cache)
    cached_k = cache.k.data_ptr()
    again = attn(x1, x2, cache=cache)
    assert cache.k.data_ptr() == cached_k and len(cache) == 5  # reused, not appended again
    torch.testing.assert_close(first, again)
    torch.testing.assert_close(first, attn(x1, x2))


def test_cache_reorder_selects_batch_rows() -> None:
    cache = KVCache()
    k, v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 6)
    cache.append(k, v)
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.k, k[[2, 2, 0]])
    torch.testing.assert_close(cache.v, v[[2, 2, 0]])
    # Appending past the initial capacity keeps everything written so far.
    more_k, more_v = torch.randn(3, 2, 20, 5), torch.randn(3, 2, 20, 6)
    all_k, all_v = cache.append(more_k, more_v)
    torch.testing.assert_close(all_k, torch.cat([k[[2, 2, 0]], more_k], dim=2))
    torch.testing.assert_close(all_v, torch.cat([v[[2, 2, 0]], more_v], dim=2))
    assert len(cache) == 24


def test_attention_dropout_only_in_training() -> None:
    attn = MultiHeadAttention(in_dim=16, k_dim=4, v_dim=4, num_heads=4, dropout=0.5)
    plain = MultiHeadAttention(in_dim=16, k_dim=4, v_dim=4, num_heads=4)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 8, 16)
    attn.eval()
    torch.testing.assert_close(attn(x), plain(x))
    attn.train()
    assert not torch.allclose(attn(x), plain(x))
    _, weights = attn(x, need_weights=True)  # probabilities are reported before dropout
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 8))


# --- the design documents' parameter names and the simpler form ----------------------------


def test_parameter_names_of_the_design_documents_load() -> None:
    attn = MultiHeadAttention(in_dim=8, k_dim=2, v_dim=3, num_heads=2)
    state = {
        "proj_q.weight": torch.randn(4, 8),
        "proj_k.weight": torch.randn(4, 8),
        "proj_v.weight": torch.randn(6, 8),
        "proj_o.weight": torch.randn(8, 6),
        "proj_o.bias": torch.randn(8),
    }
    attn.load_state_dict(state, strict=True)
    cross = CrossAttention(in_dim1=8, in_dim2=5, k_dim=2, v_dim=3, num_heads=2)
    assert set(cross.state_dict()) == {
        "proj_q1.weight",
        "proj_k2.weight",
        "proj_v2.weight",
        "proj_o.weight",
        "proj_o.bias",
    }


def test_multi_head_self_attention_is_the_even_split() -> None:
    attn = MultiHeadSelfAttention(d_model=12, num_heads=3)
    assert isinstance(attn, MultiHeadAttention)
    assert (attn.in_dim, attn.k_dim, attn.v_dim, attn.num_heads) == (12, 4, 4, 3)
    assert attn(torch.randn(2, 5, 12)).shape == (2, 5, 12)
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads, got 10 and 3"):
        MultiHeadSelfAttention(d_model=10, num_heads=3)


# --- regressions: each defect of the original code ------------------------------------------


def test_regression_class_constructs_with_its_own_super_and_num_heads() -> None:
    # The original called super(NultiHeadAttention, ...) and read the undefined `numheads`.
    attn = MultiHeadAttention(in_dim=8, k_dim=2, v_dim=2, num_heads=4)
    assert attn.num_heads == 4
    assert len(list(attn.parameters())) == 5


def test_regression_forward_runs_without_typos() -> None:
    # `premute`, `slef` and `batch_size. seq_len` made both forwards crash.
    assert MultiHeadAttention(8, 2, 2, 4)(torch.randn(3, 5, 8)).shape == (3, 5, 8)
    assert CrossAttention(8, 6, 2, 2, 4)(torch.randn(3, 5, 8), torch.randn(3, 2, 6)).shape == (
        3,
        5,
        8,
    )


def test_regression_scores_scaled_by_inverse_sqrt_k_dim() -> None:
    # The original divided by k_dim ** 0.54. With k_dim = 64 the two scales differ by 21%.
    attn = MultiHeadAttention(in_dim=64, k_dim=64, v_dim=4, num_heads=1)
    x = torch.randn(1, 5, 64)
    _, weights = attn(x, need_weights=True)
    q, k = attn.proj_q(x), attn.proj_k(x)
    expected = torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1)
    wrong = torch.softmax(q @ k.transpose(1, 2) / 64**0.54, dim=-1)
    torch.testing.assert_close(weights[:, 0], expected)
    assert not torch.allclose(weights[:, 0], wrong)


def test_regression_output_projection_is_proj_o() -> None:
    # The original called self.project_o, which does not exist.
    attn = MultiHeadAttention(in_dim=8, k_dim=2, v_dim=2, num_heads=4)
    with torch.no_grad():
        attn.proj_o.weight.zero_()
        attn.proj_o.bias.fill_(3.0)
    torch.testing.assert_close(attn(torch.randn(2, 3, 8)), torch.full((2, 3, 8), 3.0))


def test_regression_cross_attention_key_length_is_an_int() -> None:
    # The original set seq_len2 = x2.size() (a Size); any T2 != T1 must work.
    attn = CrossAttention(in_dim1=8, in_dim2=8, k_dim=2, v_dim=2, num_heads=4)
    _, weights = attn(torch.randn(2, 3, 8), torch.randn(2, 11, 8), need_weights=True)
    assert weights.shape == (2, 4, 3, 11)


def test_regression_cross_attention_uses_keys_of_x2() -> None:
    # The original multiplied by an undefined k1 instead of x2's keys k2.
    attn = CrossAttention(in_dim1=8, in_dim2=8, k_dim=4, v_dim=4, num_heads=2)
    x1, x2 = torch.randn(1, 3, 8), torch.randn(1, 4, 8)
    _, weights = attn(x1, x2, need_weights=True)
    q = attn.proj_q1(x1).view(1, 3, 2, 4).transpose(1, 2)
    k = attn.proj_k2(x2).view(1, 4, 2, 4).transpose(1, 2)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1))


def test_regression_cross_attention_softmax_over_keys_not_heads() -> None:
    # The original took softmax over dim=1, the heads, so weights summed to 1 across heads.
    attn = CrossAttention(in_dim1=8, in_dim2=8, k_dim=2, v_dim=2, num_heads=4)
    _, weights = attn(torch.randn(2, 3, 8), torch.randn(2, 5, 8), need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 3))
    assert not torch.allclose(weights.sum(1), torch.ones(2, 3, 5))


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MultiHeadAttention(0, 4, 4, 2), "in_dim must be a positive integer, got 0"),
        (lambda: MultiHeadAttention(8, -1, 4, 2), "k_dim must be a positive integer, got -1"),
        (lambda: MultiHeadAttention(8, 4, 0, 2), "v_dim must be a positive integer, got 0"),
        (lambda: MultiHeadAttention(8, 4, 4, 0), "num_heads must be a positive integer, got 0"),
        (
            lambda: MultiHeadAttention(8, 4, 4, 2, 1.5),
            r"dropout must be a number in \[0, 1\), got 1.5",
        ),
        (lambda: CrossAttention(8, 0, 4, 4, 2), "in_dim2 must be a positive integer, got 0"),
    ],
)
def test_bad_sizes_raise_value_error_naming_the_value(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_inputs_raise_value_error_naming_the_shapes() -> None:
    attn = MultiHeadAttention(in_dim=8, k_dim=2, v_dim=2, num_heads=4)
    with pytest.raises(ValueError, match="last dimension must equal in_dim=8, got 6"):
        attn(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"\(2, 1, 1, 4\) cannot broadcast .* \(2, 4, 3, 3\)"):
        attn(torch.randn(2, 3, 8), torch.ones(2, 1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        attn(torch.randn(2, 3, 8), torch.ones(3, 3))
    cross = CrossAttention(in_dim1=8, in_dim2=8, k_dim=2, v_dim=2, num_heads=4)
    with pytest.raises(ValueError, match="same batch size, got 2 and 3"):
        cross(torch.randn(2, 3, 8), torch.randn(3, 3, 8))
