"""seq2seq.core.dropout against its definition: the rate, the scale, the gradient,
independence of the elements that share a 64-bit draw, and repeatability under a seed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.core.attention import MultiHeadAttention, attend
from seq2seq.core.dropout import Dropout, dropout, keep_scale

N = 1 << 20  # elements: the drop rate's standard error at p = 0.1 is 0.0003


def dropped(p: float, n: int = N, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return dropout(torch.ones(n), p) == 0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_element_is_dropped_with_probability_p(p: float) -> None:
    mask = dropped(p)
    sigma = (p * (1 - p) / N) ** 0.5
    assert abs(mask.float().mean().item() - p) < 5 * sigma
    # The four 16-bit lanes of each 64-bit draw (a draw that left the sign bit out, as
    # random_() does by default, would never drop in the top lane).
    lanes = mask.view(-1, 4).float().mean(0)
    assert (lanes - p).abs().max().item() < 5 * sigma * 2, lanes


def test_neighbours_are_dropped_independently() -> None:
    p = 0.3
    mask = dropped(p).view(-1, 2).float()
    both, n = (mask[:, 0] * mask[:, 1]).mean().item(), mask.size(0)
    assert abs(both - p * p) < 5 * (p * p * (1 - p * p) / n) ** 0.5


def test_kept_elements_are_scaled_and_the_gradient_is_the_mask() -> None:
    torch.manual_seed(0)
    x = (torch.rand(64, 33) + 0.5).requires_grad_()  # no zeros of its own
    out = dropout(x, 0.25)
    kept = out != 0
    assert 0 < kept.sum() < x.numel()
    assert torch.equal(out[kept], x[kept] * (1 / 0.75))
    g = torch.randn_like(x)
    out.backward(g)
    assert torch.equal(x.grad, torch.where(kept, g * (1 / 0.75), 0.0))


def test_same_seed_same_masks_other_seed_other_masks() -> None:
    assert torch.equal(dropped(0.1, 4096, seed=3), dropped(0.1, 4096, seed=3))
    assert not torch.equal(dropped(0.1, 4096, seed=3), dropped(0.1, 4096, seed=4))


def test_off_in_evaluation_and_at_zero() -> None:
    x = torch.randn(8, 8)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    layer = Dropout(0.5).eval()
    assert layer(x) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_keeps_the_dtype_and_shape() -> None:
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    assert keep_scale(x, 0.1).dtype == torch.bfloat16
    assert dropout(x, 0.1).shape == (3, 5, 7)


def test_the_layer_has_dropouts_interface_and_no_state() -> None:
    layer = Dropout(0.1)
    assert layer.p == 0.1 and repr(layer) == "Dropout(p=0.1)"
    assert layer.state_dict() == {} == torch.nn.Dropout(0.1).state_dict()
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\], got 1.5"):
        Dropout(1.5)


def test_attention_drops_probabilities_with_this_mask_on_the_cpu() -> None:
    """In training on the CPU, attention's dropout is this one, on the probabilities."""
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5) > 0.3
    torch.manual_seed(7)
    out, _ = attend(q, k, v, keep, dropout_p=0.2)
    probs = (q @ k.transpose(-2, -1) / 2).masked_fill(~keep, float("-inf")).softmax(-1)
    torch.manual_seed(7)
    expected = (probs * keep_scale(probs, 0.2)) @ v
    torch.testing.assert_close(out, expected)


def test_attention_with_dropout_is_unbiased() -> None:
    """Averaged over many masks, training-mode attention is the evaluation-mode one."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(in_dim=8, k_dim=4, v_dim=4, num_heads=2, dropout=0.3)
    x = torch.randn(1, 6, 8).expand(4000, 6, 8)
    clean = attn.eval()(x[:1])
    noisy = attn.train()(x).mean(0, keepdim=True)
    torch.testing.assert_close(noisy, clean, atol=0.03, rtol=0)
    assert not torch.allclose(attn(x[:1]), clean, atol=1e-3)  # each draw does drop


def test_matches_torch_dropout_in_distribution() -> None:
    """The same rate and scale as F.dropout: equal means and second moments of the output."""
    x = torch.full((N,), 2.0)
    torch.manual_seed(1)
    ours, theirs = dropout(x, 0.2), F.dropout(x, 0.2)
    assert abs(ours.mean().item() - theirs.mean().item()) < 0.01
    assert abs(ours.pow(2).mean().item() - theirs.pow(2).mean().item()) < 0.05


def test_set_dropout_turns_every_dropout_of_the_model_off_and_on() -> None:
    """Seq2SeqTransformer.set_dropout(0.0) (a time budget that buys few epochs): in training
    mode the model then computes exactly what it computes in evaluation mode, with no random
    draw left anywhere (embeddings, sublayers, feed-forward, attention); set_dropout(p) draws
    again. config.dropout keeps the rate the model was built with."""
    from seq2seq.core.model import ModelConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, d_ff=64,
                         dropout=0.3, activation="swiglu")  # fmt: skip
    model = Seq2SeqTransformer(config)
    src, tgt = torch.randint(3, 30, (4, 9)), torch.randint(3, 30, (4, 7))
    model.eval()
    reference = model(src, tgt)
    model.train()
    assert not torch.allclose(model(src, tgt), reference)  # dropout at 0.3
    model.set_dropout(0.0)
    state = torch.get_rng_state()
    assert torch.allclose(model(src, tgt), reference, atol=1e-6)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn
    assert model.config.dropout == 0.3
    model.set_dropout(0.3)
    assert not torch.allclose(model(src, tgt), reference)
    with pytest.raises(ValueError, match="dropout"):
        model.set_dropout(1.0)
