"""Multi-head attention: self-attention and cross-attention (their key/value cache is
seq2seq/core/kv_cache.py).

These are the two classes of the design documents the project grew from, with their defects
fixed and their signatures and parameter names kept, so weights saved from them load here.

Mask convention (the only one in this project, the same polarity as
``torch.nn.functional.scaled_dot_product_attention``): a mask is a boolean tensor
broadcastable to ``(B, H, Tq, Tk)`` where **True means "may attend"** and False means
"masked". Integer masks of 0/1 are accepted and read the same way. Name mask variables by what
True means (``keep``, ``may_attend``). Note that ``torch.nn.MultiheadAttention`` uses the
opposite polarity: never hand it our masks.

A query row whose keys are all masked has nothing to attend to; it yields zeros (and zero
gradients), never NaN.

Axis letters: B batch, H heads, Tq query length, Tk key length, Dk/Dv per-head key/value width.

Why not ``torch.nn.MultiheadAttention``? It ties the key and value widths to the model width
(per-head k_dim and v_dim may differ here), its boolean masks mean the opposite of ours, and its
packed ``in_proj_weight`` would break the parameter names of the documents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq import checks
from seq2seq.core.dropout import dropout as apply_dropout
from seq2seq.core.kv_cache import KVCache

__all__ = [
    "CrossAttention",
    "KVCache",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "attend",
    "capture_attention",
    "causal_mask",
    "force_attention",
    "mask_heads",
]


QK_NORM_EPS = 1e-5  # of QK-norm's RMSNorm: model.py's NORM_EPS, as its other norms


def _check_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        checks.integer(name, value, minimum=1)


def _check_dropout(dropout: float) -> None:
    checks.number("dropout", dropout, low=0, high=1, high_open=True)


def _check_input(name: str, x: Tensor, in_dim: int) -> None:
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (B, T, {in_dim}), got {tuple(x.shape)}")
    if x.size(-1) != in_dim:
        raise ValueError(
            f"{name}'s last dimension must equal in_dim={in_dim}, got {x.size(-1)} "
            f"(shape {tuple(x.shape)})"
        )


def causal_mask(tq: int, tk: int, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) boolean mask, True where query i may attend key j.

    The queries are the last Tq positions of the Tk keys (bottom-right aligned), so one new
    query over a cache of Tk keys sees them all, and Tq == Tk gives the usual lower triangle.
    """
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=tk - tq)


def _normalize_mask(mask: Tensor, shape: tuple[int, int, int, int]) -> Tensor:
    """Check a user mask against the score shape (B, H, Tq, Tk) and return it as bool."""
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise ValueError(
            f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
            "pass mask.bool() or a comparison such as tokens != pad_id"
        )
    # By hand rather than torch.broadcast_shapes, which costs more than the check is worth
    # on every decoding step. Each mask dimension must be 1 or the score's size.
    dims = tuple(mask.shape)
    fits = len(dims) <= 4 and all(
        d in (1, n) for d, n in zip(dims[::-1], shape[::-1], strict=False)
    )
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} cannot broadcast to the attention scores' "
            f"shape (B, H, Tq, Tk) = {shape}"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    may_attend: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over heads, softmax over the key axis.

    Args:
        q: (B, H, Tq, Dk) queries. k: (B, H, Tk, Dk) keys. v: (B, H, Tk, Dv) values.
        may_attend: boolean mask broadcastable to (B, H, Tq, Tk), True = may attend.
        is_causal: also hide keys after each query (bottom-right aligned, see causal_mask).
        dropout_p: dropout on the attention probabilities (pass 0.0 outside training).
        need_weights: also return the probabilities (B, H, Tq, Tk), before dropout.

    Returns:
        (B, H, Tq, Dv) output and the probabilities or None.
    """
    tq, tk = q.size(-2), k.size(-2)
    # On the CPU, SDPA with dropout runs its plain matmul-softmax path anyway, drawing the mask
    # with aten::bernoulli_; ours (seq2seq.core.dropout) draws a quarter of the numbers.
    explicit = need_weights or (dropout_p > 0 and q.device.type == "cpu")
    if is_causal and tq == 1:
        is_causal = False  # one query, the newest position: every key is at or before it
    if is_causal and (may_attend is not None or tq != tk or explicit):
        causal = causal_mask(tq, tk, q.device)
        may_attend = causal if may_attend is None else may_attend & causal
        is_causal = False

    empty_row = None
    if may_attend is not None:
        # Rows with no key: let them attend everywhere (finite softmax), then zero them.
        empty_row = ~may_attend.any(dim=-1, keepdim=True)  # (..., Tq, 1)
        may_attend = may_attend | empty_row

    if explicit:
        out, weights = _explicit_attention(q, k, v, may_attend, dropout_p)
        weights = weights if need_weights else None
    else:
        # The fast path: fused kernels (flash / memory-efficient) where the device has them.
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=may_attend, dropout_p=dropout_p, is_causal=is_causal
        )
        weights = None

    if empty_row is not None:
        out = out.masked_fill(empty_row, 0.0)
        if weights is not None:
            weights = weights.masked_fill(empty_row, 0.0)
    return out, weights


def _explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, may_attend: Tensor | None, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """The matmul-softmax path: when the probabilities are asked for, and for dropout on the
    CPU."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if may_attend is not None:
        # The dtype's most negative value, not -1e9: that overflows in half precision.
        scores = scores.masked_fill(~may_attend, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    dropped = apply_dropout(weights, dropout_p)
    return dropped @ v, weights  # (B, H, Tq, Dv)


class _Attention(nn.Module):
    """What self- and cross-attention share: sizes, checks, head split and merge.

    num_kv_heads < num_heads is grouped-query attention (Ainslie et al., 2023; 1 is multi-query,
    Shazeer, 2019): keys and values have num_kv_heads heads, each serving num_heads //
    num_kv_heads consecutive query heads, and a key/value cache holds only those.
    """

    def __init__(
        self,
        k_dim: int,
        v_dim: int,
        num_heads: int,
        dropout: float,
        num_kv_heads: int | None,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_positive(k_dim=k_dim, v_dim=v_dim, num_heads=num_heads, num_kv_heads=num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads, got {num_kv_heads} and {num_heads}"
            )
        _check_dropout(dropout)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.k_dim = k_dim
        self.v_dim = v_dim
        self.dropout = dropout
        # QK-norm (Dehghani et al., 2023; Wortsman et al., 2023): each head's queries and keys
        # RMS-normalised, with a learned gain, before the scores, which bounds the logits and
        # lets training take a higher learning rate. Identity (no parameters) when off.
        self.q_norm = nn.RMSNorm(k_dim, eps=QK_NORM_EPS) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(k_dim, eps=QK_NORM_EPS) if qk_norm else nn.Identity()
        # A weight a head (H,) on each head's output before they are joined (Michel et al.,
        # 2019): 0 switches a head off, and the loss's gradient with respect to it is the
        # head's importance. None (the default) is all ones. Set by mask_heads, never saved.
        self.head_mask: Tensor | None = None
        # The attention what-if (Strobelt et al., 2018's Seq2Seq-Vis): (heads (H,) bool, weights
        # (Tk,)): the last query's attention of those heads replaced by these weights. Set by
        # force_attention, never saved.
        self.forced: tuple[Tensor, Tensor] | None = None

    def _split(self, x: Tensor, head_dim: int, heads: int | None = None) -> Tensor:
        b, t, _ = x.shape
        heads = heads or self.num_heads
        return x.view(b, t, heads, head_dim).transpose(1, 2)  # (B, heads, T, head_dim)

    def _share(self, kv: Tensor) -> Tensor:
        """(B, H_kv, T, D) -> (B, H, T, D): each key/value head repeated for its query heads."""
        group = self.num_heads // self.num_kv_heads
        if group == 1:
            return kv
        b, h_kv, t, d = kv.shape
        return kv[:, :, None].expand(b, h_kv, group, t, d).reshape(b, h_kv * group, t, d)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        need_weights: bool,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, _, tq, _ = q.shape
        if mask is not None:
            mask = _normalize_mask(mask, (b, self.num_heads, tq, k.size(-2)))
        dropout_p = self.dropout if self.training else 0.0
        k, v = self._share(k), self._share(v)
        out, weights = attend(
            q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, need_weights=need_weights
        )
        if self.forced is not None:  # the last query of the chosen heads: the given weights
            heads, given = self.forced
            last = given.to(v.dtype) @ v  # (B, H, Dv): (Tk,) @ (B, H, Tk, Dv)
            out = out.clone()
            out[:, heads, -1] = last[:, heads]
        if self.head_mask is not None:  # (B, H, Tq, Dv): each head's output weighed
            out = out * self.head_mask.to(out.dtype)[:, None, None]
        out = out.transpose(1, 2).reshape(b, tq, self.num_heads * self.v_dim)  # (B, Tq, H*Dv)
        out = self.proj_o(out)
        return (out, weights) if need_weights else out


class MultiHeadAttention(_Attention):
    """Multi-head self-attention: queries, keys and values all come from x.

    Args:
        in_dim: width of x (and of the output).
        k_dim: per-head width of queries and keys; scores are scaled by 1/sqrt(k_dim).
        v_dim: per-head width of values (may differ from k_dim).
        num_heads: number of heads H.
        dropout: dropout on the attention probabilities, in training only.
        num_kv_heads: heads of keys and values (default num_heads; see _Attention).
        bias: a bias in the output projection (the q/k/v projections have none).
        rotary: turns queries and keys by their positions before the scores (model.py's
            RotaryPositions: a callable (x (B, H, T, Dk), offset) -> x); None: no positions.
        qk_norm: RMS-normalise each head's queries and keys (a learned gain each) before
            the scores, and before rotary turns them.

    Shape:
        x: (B, T, in_dim); mask: broadcastable to (B, H, T, T), True = may attend;
        output: (B, T, in_dim); weights (with need_weights=True): (B, H, T, T).

    Example:
        >>> attn = MultiHeadAttention(in_dim=64, k_dim=16, v_dim=24, num_heads=4)
        >>> attn(torch.randn(2, 10, 64), is_causal=True).shape
        torch.Size([2, 10, 64])
    """

    def __init__(
        self,
        in_dim: int,
        k_dim: int,
        v_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        *,
        num_kv_heads: int | None = None,
        bias: bool = True,
        rotary: Callable[[Tensor, int], Tensor] | None = None,
        qk_norm: bool = False,
    ) -> None:
        _check_positive(in_dim=in_dim)
        super().__init__(k_dim, v_dim, num_heads, dropout, num_kv_heads, qk_norm)
        self.in_dim = in_dim
        kv_heads = self.num_kv_heads
        self.proj_q = nn.Linear(in_dim, k_dim * num_heads, bias=False)
        self.proj_k = nn.Linear(in_dim, k_dim * kv_heads, bias=False)
        self.proj_v = nn.Linear(in_dim, v_dim * kv_heads, bias=False)
        self.proj_o = nn.Linear(v_dim * num_heads, in_dim, bias=bias)
        self.rotary = rotary

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from x to itself.

        With a cache, x holds only the new positions; their keys and values are appended to
        the cache and the queries attend over all positions so far (the mask then covers
        (Tq, Tk_total) and is_causal aligns the new queries to the last positions).
        Returns the output, or (output, weights) when need_weights is True.
        """
        _check_input("x", x, self.in_dim)
        # One matmul for q, k and v: the weights stay three named parameters.
        w = cache.qkv_weight if cache is not None else None
        if w is None:
            w = torch.cat([self.proj_q.weight, self.proj_k.weight, self.proj_v.weight])
            if cache is not None:
                cache.qkv_weight = w
        sizes = [self.proj_q.out_features, self.proj_k.out_features, self.proj_v.out_features]
        q, k, v = F.linear(x, w).split(sizes, -1)
        h_kv = self.num_kv_heads
        q = self._split(q, self.k_dim)  # (B, H, T, Dk)
        k, v = self._split(k, self.k_dim, h_kv), self._split(v, self.v_dim, h_kv)  # (B, H_kv, ...)
        q, k = self.q_norm(q), self.k_norm(k)  # keys enter the cache normalised
        if self.rotary is not None:  # keys enter the cache turned by their own positions
            offset = len(cache) if cache is not None else 0
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)
        return self._attend(q, k, v, mask, is_causal, need_weights)


class MultiHeadSelfAttention(MultiHeadAttention):
    """The second design document's form: per-head widths d_model // num_heads.

    >>> MultiHeadSelfAttention(d_model=64, num_heads=4).k_dim
    16
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        _check_positive(d_model=d_model, num_heads=num_heads)
        if d_model % num_heads:
            raise ValueError(
                f"d_model must be divisible by num_heads, got {d_model} and {num_heads}"
            )
        head_dim = d_model // num_heads
        super().__init__(d_model, head_dim, head_dim, num_heads, dropout)


class CrossAttention(_Attention):
    """Multi-head cross-attention: queries from x1, keys and values from x2.

    Args:
        in_dim1: width of x1 (the queries' side, and of the output).
        in_dim2: width of x2 (the keys' and values' side).
        k_dim, v_dim, num_heads, dropout, num_kv_heads, bias, qk_norm: as in
            MultiHeadAttention.

    Shape:
        x1: (B, T1, in_dim1); x2: (B, T2, in_dim2); mask: broadcastable to (B, H, T1, T2),
        True = may attend; output: (B, T1, in_dim1); weights: (B, H, T1, T2).

    Example:
        >>> attn = CrossAttention(in_dim1=32, in_dim2=48, k_dim=8, v_dim=8, num_heads=4)
        >>> attn(torch.randn(2, 5, 32), torch.randn(2, 7, 48)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(
        self,
        in_dim1: int,
        in_dim2: int,
        k_dim: int,
        v_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        *,
        num_kv_heads: int | None = None,
        bias: bool = True,
        qk_norm: bool = False,
    ) -> None:
        _check_positive(in_dim1=in_dim1, in_dim2=in_dim2)
        super().__init__(k_dim, v_dim, num_heads, dropout, num_kv_heads, qk_norm)
        self.in_dim1 = in_dim1
        self.in_dim2 = in_dim2
        kv_heads = self.num_kv_heads
        self.proj_q1 = nn.Linear(in_dim1, k_dim * num_heads, bias=False)
        self.proj_k2 = nn.Linear(in_dim2, k_dim * kv_heads, bias=False)
        self.proj_v2 = nn.Linear(in_dim2, v_dim * kv_heads, bias=False)
        self.proj_o = nn.Linear(v_dim * num_heads, in_dim1, bias=bias)

    def forward(
        self,
        x1: Tensor,
        x2: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from x1 to x2.

        With a cache, x2's keys and values are computed on the first call and reused after,
        since x2 (the encoder output) does not change while decoding.
        Returns the output, or (output, weights) when need_weights is True.
        """
        _check_input("x1", x1, self.in_dim1)
        _check_input("x2", x2, self.in_dim2)
        if x1.size(0) != x2.size(0):
            raise ValueError(
                f"x1 and x2 must have the same batch size, got {x1.size(0)} and {x2.size(0)}"
            )
        q = self._split(self.proj_q1(x1), self.k_dim)  # (B, H, T1, Dk)
        if cache is not None and cache.k is not None and cache.v is not None:
            k, v = cache.k, cache.v
        else:
            w = torch.cat([self.proj_k2.weight, self.proj_v2.weight])
            k, v = F.linear(x2, w).split([self.proj_k2.out_features, self.proj_v2.out_features], -1)
            h_kv = self.num_kv_heads  # (B, H_kv, T2, Dk|Dv)
            k, v = self._split(k, self.k_dim, h_kv), self._split(v, self.v_dim, h_kv)
            k = self.k_norm(k)
            if cache is not None:
                cache.append(k, v)
        return self._attend(self.q_norm(q), k, v, mask, False, need_weights)


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Record the attention probabilities of every attention module inside model.

    Within the block, each MultiHeadAttention and CrossAttention computes its weights (the
    explicit path) and the dict maps its qualified name (e.g. "decoder.layers.0.cross_attn")
    to the weights of its latest call, (B, H, Tq, Tk). The modules still return what their
    callers expect, so the model's outputs do not change. Hooks are removed on exit.

        >>> with capture_attention(model) as maps:
        ...     model(src, tgt)
        >>> maps["decoder.layers.0.cross_attn"].shape
    """
    maps: dict[str, Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, _Attention):

            def ask(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                return args, {**kwargs, "need_weights": True}

            def keep(mod: nn.Module, args: tuple, kwargs: dict, output: tuple, name=name) -> Tensor:
                out, maps[name] = output
                return out

            handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
            handles.append(module.register_forward_hook(keep, with_kwargs=True))
    try:
        yield maps
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def mask_heads(model: nn.Module, masks: dict[str, Tensor]) -> Iterator[None]:
    """Weigh each head's output by masks[name] (H,) in the attention module of that qualified
    name (e.g. "decoder.layers.0.cross_attn"): 0 switches a head off, 1 keeps it, and a mask
    that requires grad collects each head's importance. Restored on exit.

        >>> with mask_heads(model, {"decoder.layers.1.cross_attn": torch.tensor([1., 0., 1., 1.])}):
        ...     logits = model(src, tgt)
    """
    modules = dict(model.named_modules())
    before = {}
    for name, mask in masks.items():
        module = modules.get(name)
        if not isinstance(module, _Attention):
            known = [n for n, m in modules.items() if isinstance(m, _Attention)]
            raise ValueError(f"no attention module {name!r}; the model has {', '.join(known)}")
        if mask.shape != (module.num_heads,):
            raise ValueError(
                f"the head mask of {name} must have shape ({module.num_heads},), "
                f"got {tuple(mask.shape)}"
            )
        before[name] = module.head_mask
        module.head_mask = mask
    try:
        yield
    finally:
        for name, mask in before.items():
            modules[name].head_mask = mask


@contextmanager
def force_attention(module: nn.Module, heads: Tensor, weights: Tensor) -> Iterator[None]:
    """Within the block, the attention module's last query attends with `weights` (Tk,) in the
    heads `heads` ((H,) bool) instead of its own: what the output would be had it looked
    there. Restored on exit."""
    if not isinstance(module, _Attention):
        raise ValueError(f"force_attention needs an attention module, got {type(module).__name__}")
    if heads.shape != (module.num_heads,):
        raise ValueError(f"heads must have shape ({module.num_heads},), got {tuple(heads.shape)}")
    before, module.forced = module.forced, (heads, weights)
    try:
        yield
    finally:
        module.forced = before
