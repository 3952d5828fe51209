"""The encoder-decoder Transformer (Vaswani et al., 2017), top-down:

ModelConfig -> Seq2SeqTransformer (encode / decode / forward) -> Embedding (tokens and
absolute positions) -> Encoder, Decoder (and the DecoderCache of incremental decoding) ->
EncoderLayer, DecoderLayer -> Residual (norm + dropout + residual, written once), FeedForward or
GatedFeedForward -> attention (seq2seq.core.attention, handed the RotaryPositions of rotary models).

The options of the 2020s (RMSNorm, GELU and gated feed-forward layers, rotary positions,
grouped-query attention, bias-free linear layers) are fields of ModelConfig, each off by
default, so a config or checkpoint that does not name them means what it always meant.

The model knows nothing of Lightning or tokenizers: it maps token ids to logits. Padding is
found from ``config.pad_id`` and masked everywhere; the decoder is causal. Masks follow the
project's convention, True = may attend.

Axis letters: B batch, S source length, T target length, D model width, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq import checks
from seq2seq.core.attention import CrossAttention, MultiHeadAttention
from seq2seq.core.dropout import Dropout
from seq2seq.core.kv_cache import KVCache

__all__ = ["DecoderCache", "ModelConfig", "Seq2SeqTransformer"]

POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "rotary")
NORMS = ("layer", "rms")
ACTIVATIONS = ("relu", "gelu", "swiglu", "geglu")
GATED = {"swiglu": nn.SiLU, "geglu": nn.GELU}  # the gated units and their gates' activation
NORM_EPS = 1e-5  # LayerNorm's default, used by RMSNorm too (the export has one epsilon)


@dataclass
class ModelConfig:
    """Sizes and options of Seq2SeqTransformer; every field is a plain value (fit for YAML)."""

    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    d_model: int = 128
    num_heads: int = 4
    k_dim: int | None = None  # per-head query/key width; None: d_model // num_heads
    v_dim: int | None = None  # per-head value width; None: d_model // num_heads
    d_ff: int = 512  # hidden width of the feed-forward block
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    dropout: float = 0.1  # on embeddings, sublayer outputs, attention probabilities and FF
    max_positions: int = 256  # longest source or target sequence the model accepts
    # "learned", or "rotary": queries and keys of self-attention rotated by their position
    # (Su et al., 2021), nothing added to the embeddings; cross-attention has no positions.
    positional: str = "sinusoidal"
    norm_first: bool = True  # pre-norm (stable without warmup tricks); False: post-norm
    tie_output: bool = False  # output projection shares the target embedding's weights
    share_embeddings: bool = False  # one embedding for source and target (one vocabulary)
    norm: str = "layer"  # or "rms": RMSNorm (Zhang & Sennrich, 2019), no centring, no bias
    # "gelu", or a gated unit (Shazeer, 2020) "swiglu" / "geglu", whose three matrices are
    # gated_width(d_ff) wide: about 2/3 of d_ff, so the block has the parameters of a plain one
    activation: str = "relu"
    num_kv_heads: int | None = None  # key/value heads (None: num_heads; 1: multi-query)
    bias: bool = True  # False: no bias in any linear layer (attention output, feed-forward)
    # QK-norm: RMS-normalise each attention head's queries and keys. true: in every attention;
    # "self": in self-attention only (encoder and decoder), which CTranslate2 exports exactly.
    qk_norm: bool | str = False

    def __post_init__(self) -> None:
        self._check_sizes()
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            limit = min(self.src_vocab_size, self.tgt_vocab_size)
            if not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}) (the vocabularies), got {value}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise ValueError(
                "pad_id, bos_id and eos_id must differ, got "
                f"{self.pad_id}, {self.bos_id} and {self.eos_id}"
            )
        if (self.k_dim is None or self.v_dim is None) and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model must be divisible by num_heads when k_dim or v_dim is not given, "
                f"got {self.d_model} and {self.num_heads}; set k_dim and v_dim or change "
                "num_heads"
            )
        checks.number("dropout", self.dropout, low=0, high=1, high_open=True)
        if self.positional not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"positional must be one of {POSITIONAL_ENCODINGS}, got {self.positional!r}"
            )
        for name, known in (("norm", NORMS), ("activation", ACTIVATIONS)):
            if getattr(self, name) not in known:
                raise ValueError(f"{name} must be one of {known}, got {getattr(self, name)!r}")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads (each key/value head serves a group of "
                f"query heads), got {self.num_kv_heads} and {self.num_heads}"
            )
        if self.positional == "rotary" and self.head_dims[0] % 2:
            raise ValueError(
                f"positional=rotary turns pairs of query/key features, so the per-head k_dim "
                f"must be even, got {self.head_dims[0]}; change k_dim or num_heads"
            )
        for name in ("norm_first", "tie_output", "share_embeddings", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not (isinstance(self.qk_norm, bool) or self.qk_norm == "self"):
            raise ValueError(
                f"qk_norm must be true, false or self (self-attention only), got {self.qk_norm!r}"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary, got src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )

    def _check_sizes(self) -> None:
        sizes = ["src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff"]
        sizes += ["num_encoder_layers", "num_decoder_layers", "max_positions"]
        optional = ("k_dim", "v_dim", "num_kv_heads")
        sizes += [name for name in optional if getattr(self, name) is not None]
        for name in sizes:
            checks.integer(name, getattr(self, name), minimum=1)

    @property
    def head_dims(self) -> tuple[int, int]:
        """The per-head (k_dim, v_dim) after defaults."""
        default = self.d_model // self.num_heads
        return self.k_dim or default, self.v_dim or default

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads after the default."""
        return self.num_kv_heads or self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer from token ids to next-token logits.

    Args:
        config: a ModelConfig (sizes, special ids, options).

    Shape:
        src: (B, S) source ids; tgt: (B, T) decoder input ids (BOS + target, shifted);
        output: (B, T, V) logits over the target vocabulary.

    Example:
        >>> model = Seq2SeqTransformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20))
        >>> model(torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))).shape
        torch.Size([2, 5, 20])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d, n = config.d_model, config.max_positions
        absolute = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}
        positions = absolute.get(config.positional, NoPositions)
        self.src_embed = Embedding(config, config.src_vocab_size, positions(n, d))
        if config.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = Embedding(config, config.tgt_vocab_size, positions(n, d))
        # One table of angles for every self-attention layer (buffers only: nothing is saved).
        rotary = RotaryPositions(n, config.head_dims[0]) if config.positional == "rotary" else None
        self.encoder = Encoder(config, rotary)
        self.decoder = Decoder(config, rotary)
        self.generator = nn.Linear(d, config.tgt_vocab_size, bias=False)
        self._init_weights()
        if config.tie_output:
            self.generator.weight = self.tgt_embed.tokens.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                # Scaled up by sqrt(D) in forward, so token vectors start with unit-size entries;
                # the same scale suits the tied output projection.
                nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()

    def keep_mask(self, ids: Tensor) -> Tensor:
        """(B, L) True where ids are real tokens (not padding)."""
        return ids != self.config.pad_id

    def encode(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory. Padding positions are masked as keys."""
        src_keep = self.keep_mask(src)[:, None, None, :]  # (B, 1, 1, S): every head and query
        return self.encoder(self.src_embed(src), src_keep)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_keep: Tensor,
        cache: DecoderCache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Decoder input ids (B, T) over memory (B, S, D) -> logits (B, T, V).

        memory_keep is (B, S), True where the source holds a real token (keep_mask(src)).
        With a cache (new_cache()), tgt holds only the new positions; the keys and values of
        earlier steps come from the cache, and the logits equal the full forward's.
        last_only=True projects only the last position to the vocabulary: logits (B, 1, V).
        """
        if memory_keep.shape != memory.shape[:2]:
            raise ValueError(
                f"memory_keep must have shape (B, S) = {tuple(memory.shape[:2])}, "
                f"got {tuple(memory_keep.shape)}"
            )
        offset = len(cache) if cache is not None else 0
        tgt_keep = self.keep_mask(tgt)
        if cache is not None:
            tgt_keep = cache.append_keep(tgt_keep)
        x = self.tgt_embed(tgt, offset)
        # (B, 1, 1, T) and (B, 1, 1, S): the same keys for every head and query position (the
        # self-attention adds its causal mask).
        x = self.decoder(
            x, tgt_keep[:, None, None, :], memory, memory_keep[:, None, None, :], cache
        )
        return self.generator(x[:, -1:] if last_only else x)

    def attention_module(self, kind: str, layer: int) -> str:
        """The qualified name of a layer's attention of a kind: "encoder" (the encoder's
        self-attention), "self" (the decoder's) or "cross"; a one-line error for one the
        model lacks."""
        layers = {"encoder": self.config.num_encoder_layers, "self": self.config.num_decoder_layers,
                  "cross": self.config.num_decoder_layers}  # fmt: skip
        if kind not in layers:
            raise ValueError(f"an attention kind is encoder, self or cross, got {kind!r}")
        if not 0 <= layer < layers[kind]:
            raise ValueError(f"{kind} attention has layers 0-{layers[kind] - 1}, got layer {layer}")
        side = "encoder" if kind == "encoder" else "decoder"
        return f"{side}.layers.{layer}.{'cross_attn' if kind == 'cross' else 'self_attn'}"

    def head_masks(self, off: Iterable[tuple[str, int, int]]) -> dict[str, Tensor]:
        """mask_heads' masks that switch off the heads (kind, layer, head) and keep the rest."""
        masks: dict[str, Tensor] = {}
        device = next(self.parameters()).device
        for kind, layer, head in off:
            name = self.attention_module(kind, layer)
            if not 0 <= head < self.config.num_heads:
                raise ValueError(
                    f"{kind} attention has heads 0-{self.config.num_heads - 1}, got head {head}"
                )
            mask = masks.setdefault(name, torch.ones(self.config.num_heads, device=device))
            mask[head] = 0.0
        return masks

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.config.num_decoder_layers)

    def set_dropout(self, p: float) -> None:
        """Every dropout of the model (embeddings, sublayer outputs, feed-forward hidden layer,
        attention probabilities) at rate p from now on; config.dropout stays the rate the model
        was built with. A time budget that buys few epochs turns dropout off so
        (seq2seq.training.callbacks.TimeBudget)."""
        checks.number("dropout", p, low=0, high=1, high_open=True)
        for module in self.modules():
            if isinstance(module, Dropout):
                module.p = p
            elif isinstance(module, (MultiHeadAttention, CrossAttention)):
                module.dropout = p

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """(B, S) source ids and (B, T) decoder input ids -> (B, T, V) logits."""
        memory = self.encode(src)
        return self.decode(tgt, memory, self.keep_mask(src))


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(D), plus positions, then dropout."""

    def __init__(self, config: ModelConfig, vocab_size: int, positions: nn.Module) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, config.d_model, padding_idx=config.pad_id)
        self.positions = positions
        self.scale = math.sqrt(config.d_model)
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale + self.positions(ids.size(1), offset)  # (B, T, D)
        return self.dropout(x)


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos positions of the original paper; nothing to learn or to save."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        position = torch.arange(max_positions).unsqueeze(1)
        freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_positions, d_model)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq[: d_model // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        _check_length(length + offset, self.max_positions)
        return self.table[offset : offset + length]  # (T, D)


class NoPositions(nn.Module):
    """Rotary models add no positions to the embeddings; the length limit still holds."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions

    def forward(self, length: int, offset: int = 0) -> Tensor:
        _check_length(length + offset, self.max_positions)
        return torch.zeros(())  # broadcasts: adds nothing


class RotaryPositions(nn.Module):
    """Rotary position embedding (RoFormer, Su et al., 2021), applied to queries and keys.

    Each pair of features (2i, 2i+1) of a head is turned by the angle p * base ** (-2i / D) at
    position p, so the score of a query at position i and a key at j depends on i - j only.
    Pairs are adjacent features ("interleaved", RoFormer's and CTranslate2's default layout).

    Shape: x (B, H, T, D) at positions offset .. offset + T - 1 -> the same shape.
    """

    def __init__(self, max_positions: int, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.base = base
        freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * freq  # (N, D/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        length = x.size(-2)
        _check_length(length + offset, self.max_positions)
        cos, sin = self.cos[offset : offset + length], self.sin[offset : offset + length]
        even, odd = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
        turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
        return turned.flatten(-2).type_as(x)


class LearnedPositions(nn.Module):
    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        _check_length(length + offset, self.max_positions)
        return self.table.weight[offset : offset + length]  # (T, D)


def _check_length(length: int, max_positions: int) -> None:
    if length > max_positions:
        raise ValueError(
            f"sequence length {length} exceeds max_positions={max_positions}; "
            "shorten the input or train a model with a larger max_positions"
        )


def make_norm(config: ModelConfig) -> nn.Module:
    """The normalisation layer config.norm names, over d_model features."""
    if config.norm == "rms":
        return nn.RMSNorm(config.d_model, eps=NORM_EPS)
    return nn.LayerNorm(config.d_model, eps=NORM_EPS)


def self_attention(config: ModelConfig, rotary: RotaryPositions | None) -> MultiHeadAttention:
    (k_dim, v_dim), h = config.head_dims, config.num_heads
    return MultiHeadAttention(
        config.d_model, k_dim, v_dim, h, config.dropout,
        num_kv_heads=config.kv_heads, bias=config.bias, rotary=rotary,
        qk_norm=config.qk_norm is not False,
    )  # fmt: skip


class Encoder(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryPositions | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(config, rotary) for _ in range(config.num_encoder_layers)
        )
        # Pre-norm leaves the residual stream unnormalised: one last norm before use.
        self.norm = make_norm(config) if config.norm_first else nn.Identity()

    def forward(self, x: Tensor, src_keep: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, src_keep)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryPositions | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(config, rotary) for _ in range(config.num_decoder_layers)
        )
        self.norm = make_norm(config) if config.norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        tgt_keep: Tensor,
        memory: Tensor,
        memory_keep: Tensor,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layer(i) if cache is not None else None
            x = layer(x, tgt_keep, memory, memory_keep, layer_cache)
        return self.norm(x)


class DecoderCache:
    """Everything the decoder keeps between steps of incremental decoding.

    Per layer, the self-attention keys/values of the positions so far and the cross-attention
    keys/values of the source (computed at the first step); plus which target positions are
    real tokens, so target padding stays masked as in the full forward.
    """

    def __init__(self, num_layers: int) -> None:
        self.self_attn = [KVCache() for _ in range(num_layers)]
        self.cross_attn = [KVCache() for _ in range(num_layers)]
        self.tgt_keep: Tensor | None = None  # (B, T) True = real token

    def __len__(self) -> int:
        return 0 if self.tgt_keep is None else self.tgt_keep.size(1)

    def layer(self, i: int) -> tuple[KVCache, KVCache]:
        return self.self_attn[i], self.cross_attn[i]

    def append_keep(self, keep: Tensor) -> Tensor:
        self.tgt_keep = keep if self.tgt_keep is None else torch.cat([self.tgt_keep, keep], 1)
        return self.tgt_keep

    def reorder(self, index: Tensor, within_source: bool = False) -> None:
        """Keep the batch rows named by index (beam search).

        within_source=True: every row moves among the rows of its own source, whose
        cross-attention keys and values are equal (beam search's beams), so those stay put.
        """
        for kv in self.self_attn if within_source else self.self_attn + self.cross_attn:
            kv.reorder(index)
        if self.tgt_keep is not None:
            self.tgt_keep = self.tgt_keep.index_select(0, index)


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryPositions | None = None) -> None:
        super().__init__()
        self.self_attn = self_attention(config, rotary)
        self.ff = feed_forward(config)
        self.res_attn = Residual(config)
        self.res_ff = Residual(config)

    def forward(self, x: Tensor, src_keep: Tensor) -> Tensor:
        x = self.res_attn(x, lambda h: self.self_attn(h, src_keep))
        return self.res_ff(x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryPositions | None = None) -> None:
        super().__init__()
        d, (k_dim, v_dim), h = config.d_model, config.head_dims, config.num_heads
        self.self_attn = self_attention(config, rotary)
        # No rotary here: queries (target positions) and keys (source positions) are in two
        # sequences, whose distance i - j means nothing; cross-attention aligns by content.
        self.cross_attn = CrossAttention(
            d,
            d,
            k_dim,
            v_dim,
            h,
            config.dropout,
            num_kv_heads=config.kv_heads,
            bias=config.bias,
            qk_norm=config.qk_norm is True,  # not with "self"
        )
        self.ff = feed_forward(config)
        self.res_self = Residual(config)
        self.res_cross = Residual(config)
        self.res_ff = Residual(config)

    def forward(
        self,
        x: Tensor,
        tgt_keep: Tensor,
        memory: Tensor,
        memory_keep: Tensor,
        cache: tuple[KVCache, KVCache] | None = None,
    ) -> Tensor:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.res_self(
            x, lambda h: self.self_attn(h, tgt_keep, is_causal=True, cache=self_cache)
        )
        x = self.res_cross(x, lambda h: self.cross_attn(h, memory, memory_keep, cache=cross_cache))
        return self.res_ff(x, self.ff)


class Residual(nn.Module):
    """x + dropout(sublayer(norm(x))) in pre-norm; norm(x + dropout(sublayer(x))) in post-norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(config)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer: Any) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


def feed_forward(config: ModelConfig) -> nn.Module:
    d, bias = config.d_model, config.bias
    if config.activation in GATED:
        width = gated_width(config.d_ff)
        return GatedFeedForward(d, width, config.dropout, GATED[config.activation](), bias)
    activation = nn.GELU() if config.activation == "gelu" else nn.ReLU()
    return FeedForward(d, config.d_ff, config.dropout, activation, bias)


def gated_width(d_ff: int) -> int:
    """The hidden width of a gated unit standing in for a plain block d_ff wide: three
    matrices of 2/3 * d_ff hold what two of d_ff do (Shazeer, 2020), rounded to a multiple of 8
    (1024 -> 680)."""
    return max(8, round(2 * d_ff / 3 / 8) * 8)


class FeedForward(nn.Sequential):
    """linear -> activation -> dropout -> linear (the paper's ReLU block, or GELU)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float,
        activation: nn.Module | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__(
            nn.Linear(d_model, d_ff, bias=bias),
            activation if activation is not None else nn.ReLU(),
            Dropout(dropout),
            nn.Linear(d_ff, d_model, bias=bias),
        )


class GatedFeedForward(nn.Module):
    """down(dropout(activation(gate(x)) * up(x))): SwiGLU with SiLU, GEGLU with GELU."""

    def __init__(
        self, d_model: int, width: int, dropout: float, activation: nn.Module, bias: bool = True
    ) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, width, bias=bias)
        self.up = nn.Linear(d_model, width, bias=bias)
        self.down = nn.Linear(width, d_model, bias=bias)
        self.activation = activation
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(self.activation(self.gate(x)) * self.up(x)))
