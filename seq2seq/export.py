"""Export a checkpoint to CTranslate2, the C++ inference engine behind OpenNMT.

    python -m seq2seq.export best.ckpt --out model-ct2
    python -m seq2seq.export best.ckpt --out model-ct2-int8 --quantization int8
    python -m seq2seq.translate --model model-ct2 "a sentence to translate"

The model goes through CTranslate2's own model-spec API (`ctranslate2.specs`), which writes
model.bin, config.json and the vocabularies; beside them go what translating needs besides
the weights: the project's two tokenizers (src_tokenizer.json, tgt_tokenizer.json, the same
files translate reads from a checkpoint) and seq2seq.json (the decoding defaults, the model
config and which checkpoint and project version the export came from).

CTranslate2 is optional: `pip install -e ".[export]"`. Only this module and the --model path
of translate import it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq import __version__
from seq2seq.checkpoint import load_module
from seq2seq.cli import ArgumentParser, run_tool
from seq2seq.core.model import GATED, GatedFeedForward, NoPositions, SinusoidalPositions
from seq2seq.data.tokenizer import save_tokenizer
from seq2seq.files import written_whole

__all__ = [
    "EXPORT_FILE",
    "QUANTIZATIONS",
    "export",
    "import_ctranslate2",
    "token_strings",
    "write_export",
]

EXPORT_FILE = "seq2seq.json"  # what seq2seq adds to a CTranslate2 model directory
EXPORT_FORMAT = 1
# CTranslate2's weight types (ctranslate2.specs.ModelSpec.optimize); float32 keeps ours.
QUANTIZATIONS = (
    "float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
    "bfloat16",
)  # fmt: skip


def import_ctranslate2() -> Any:
    """The ctranslate2 package, or a one-line error naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise ValueError(
            'CTranslate2 is not installed: pip install -e ".[export]" (or pip install ctranslate2)'
        ) from None
    return ctranslate2


def token_strings(tokenizer: Any) -> list[str]:
    """Token i's string for every id: CTranslate2 reads and writes tokens as strings, so the
    strings must be unique (they are for every tokenizer the project trains)."""
    if hasattr(tokenizer, "itos"):
        tokens = list(tokenizer.itos)
    else:
        tokens = [tokenizer.tokenizer.id_to_token(i) for i in range(len(tokenizer))]
    if None in tokens or len(set(tokens)) != len(tokens):
        raise ValueError("the tokenizer has ids without a token or two ids with one token")
    return tokens


def _numpy(tensor: torch.Tensor) -> Any:
    # A copy: a float32 CPU tensor's .numpy() shares its memory, and CTranslate2's int8
    # quantization scales some arrays in place (it changed the module's embeddings).
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec: Any, *layers: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or more of ours, fused along the output axis (the
    query/key/value projections are one matrix product there)."""
    spec.weight = _numpy(torch.cat([layer.weight for layer in layers]))
    biases = [layer.bias for layer in layers]
    if any(bias is not None for bias in biases):
        if any(bias is None for bias in biases):
            raise ValueError("cannot fuse a linear layer with a bias and one without")
        spec.bias = _numpy(torch.cat(biases))


def _norm(spec: Any, norm: torch.nn.Module) -> None:
    spec.gamma = _numpy(norm.weight)
    if isinstance(norm, torch.nn.LayerNorm):  # RMSNorm has no beta (the spec's rms_norm)
        spec.beta = _numpy(norm.bias)


def _embedding(spec: Any, embedding: Any) -> None:
    # CTranslate2 scales the tokens by sqrt(D) (the spec's scale_embeddings) and adds the
    # positions, as ours does.
    spec.weight = _numpy(embedding.tokens.weight)


def _positions(spec: Any, positions: torch.nn.Module, d_model: int) -> None:
    # Written out for sinusoids too: CTranslate2's own are concatenated (sin | cos), ours
    # interleaved. A rotary model adds none: zeros, since CTranslate2's encoder adds its own
    # sinusoids when the table is left out.
    if isinstance(positions, NoPositions):
        spec.encodings = _numpy(torch.zeros(positions.max_positions, d_model))
    elif isinstance(positions, SinusoidalPositions):
        spec.encodings = _numpy(positions.table)
    else:
        spec.encodings = _numpy(positions.table.weight)


# The ModelConfig fields model_spec maps to CTranslate2's spec. A model option not listed here
# exports only at its default: a new option is refused in one line until it is mapped.
MAPPED = (
    "src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id", "d_model", "num_heads",
    "k_dim", "v_dim", "d_ff", "num_encoder_layers", "num_decoder_layers", "max_positions",
    "positional", "norm_first", "tie_output", "share_embeddings", "norm", "activation",
    "num_kv_heads", "bias",
    "qk_norm",  # "self" only (check_exportable)
    "dropout",  # nothing to export: dropout is off when translating
)  # fmt: skip
# QK-norm with ctranslate2 4.8.5: the encoder's and the decoder's self-attention norms map
# exactly (2e-6 in log-probability), but CTranslate2 applies the cross-attention's query norm
# before splitting the heads, over all of them at once, which differs from ours by up to 2 in
# log-probability. Its cross-attention norms are optional, so qk_norm=self (none there) maps.
QK_NORM_REFUSAL = (
    "CTranslate2 normalises the cross-attention's queries over all heads at once, not head by "
    "head as this model does; train with qk_norm=self (self-attention only, which exports "
    "exactly)"
)


def check_exportable(config: Any) -> None:
    """Refuse, in one line naming the option, what CTranslate2's Transformer cannot run."""
    from dataclasses import fields

    for field in fields(config):
        value = getattr(config, field.name)
        if field.name not in MAPPED and value != field.default:
            raise ValueError(
                f"cannot export model.net.{field.name}={value}: the export does not map this "
                "option to CTranslate2 (seq2seq/export.py, MAPPED); train with its default "
                f"{field.default!r} or translate with --ckpt"
            )
    if config.qk_norm is True:
        raise ValueError(
            f"cannot export model.net.qk_norm=True: {QK_NORM_REFUSAL}, or translate with --ckpt"
        )
    k_dim, v_dim = config.head_dims
    if k_dim != v_dim:
        raise ValueError(
            f"cannot export model.net.k_dim={k_dim} with model.net.v_dim={v_dim}: CTranslate2's "
            "attention has one head width for queries, keys and values; train with k_dim == v_dim"
        )


def model_spec(module: Any) -> Any:
    """The CTranslate2 TransformerSpec holding the module's model, vocabularies and specials."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    model, config = module.model, module.config
    check_exportable(config)
    head_dim = config.head_dims[0]
    activations = {"relu": "RELU", "gelu": "GELU", "swiglu": "SWISH", "geglu": "GELU"}
    options: dict[str, Any] = {
        "pre_norm": config.norm_first,
        # None: CTranslate2's d_model / num_heads, the only width older versions accept.
        "head_dim": None if head_dim * config.num_heads == config.d_model else head_dim,
        # GELU is the exact (erf) one, as torch's; SWISH is x * sigmoid(x), torch's SiLU.
        "activation": getattr(common_spec.Activation, activations[config.activation]),
        "ffn_glu": config.activation in GATED,
        "rms_norm": config.norm == "rms",
        # None: as many as num_heads (what exports before grouped-query attention wrote).
        "num_heads_kv": None if config.kv_heads == config.num_heads else config.kv_heads,
    }
    if config.qk_norm:  # "self": check_exportable refused True
        options["qk_norm"] = True  # RMS norms (the spec's qk_norm_rms) in every attention...
    if config.positional == "rotary":  # every feature, adjacent pairs, base 10000 (ours)
        rotary = model.encoder.layers[0].self_attn.rotary
        options.update(rotary_dim=0, rotary_interleave=True, rotary_base=rotary.base)
    encoder = transformer_spec.TransformerEncoderSpec(
        config.num_encoder_layers, config.num_heads, **options
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config.num_decoder_layers, config.num_heads, **options
    )
    _embedding(encoder.embeddings[0], model.src_embed)
    _positions(encoder.position_encodings, model.src_embed.positions, config.d_model)
    _embedding(decoder.embeddings, model.tgt_embed)
    if config.positional != "rotary":  # with rotary_dim CTranslate2's decoder has no table
        _positions(decoder.position_encodings, model.tgt_embed.positions, config.d_model)
    if config.norm_first:  # the final norms of the pre-norm stacks
        _norm(encoder.layer_norm, model.encoder.norm)
        _norm(decoder.layer_norm, model.decoder.norm)
    for spec, layer in zip(encoder.layer, model.encoder.layers, strict=True):
        attention = layer.self_attn
        _linear(spec.self_attention.linear[0], attention.proj_q, attention.proj_k, attention.proj_v)
        _linear(spec.self_attention.linear[1], attention.proj_o)
        _norm(spec.self_attention.layer_norm, layer.res_attn.norm)
        _qk_norms(spec.self_attention, attention)
        _feed_forward(spec.ffn, layer.ff, layer.res_ff.norm)
    for spec, layer in zip(decoder.layer, model.decoder.layers, strict=True):
        attention, cross = layer.self_attn, layer.cross_attn
        _linear(spec.self_attention.linear[0], attention.proj_q, attention.proj_k, attention.proj_v)
        _linear(spec.self_attention.linear[1], attention.proj_o)
        _norm(spec.self_attention.layer_norm, layer.res_self.norm)
        _qk_norms(spec.self_attention, attention)
        if config.qk_norm:  # ...but cross-attention: CTranslate2's norms there are optional
            del spec.attention.q_norm, spec.attention.k_norm
        _linear(spec.attention.linear[0], cross.proj_q1)
        _linear(spec.attention.linear[1], cross.proj_k2, cross.proj_v2)
        _linear(spec.attention.linear[2], cross.proj_o)
        _norm(spec.attention.layer_norm, layer.res_cross.norm)
        _feed_forward(spec.ffn, layer.ff, layer.res_ff.norm)
    _linear(decoder.projection, model.generator)
    # Our search never outputs <pad> or <bos> (seq2seq.core.decoding); CTranslate2 has no such rule,
    # so the export carries it: a bias that rules both out (exp(-10000) is 0 in every float
    # type, and -10000 fits in float16).
    bias = torch.zeros(config.tgt_vocab_size)
    bias[[config.pad_id, config.bos_id]] = -1e4
    decoder.projection.bias = _numpy(bias)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = model.encoder.layers[0].res_attn.norm.eps
    spec.config.unk_token = "<unk>"
    spec.config.bos_token = "<bos>"
    spec.config.eos_token = "<eos>"
    spec.config.decoder_start_token = "<bos>"
    spec.register_source_vocabulary(token_strings(module.src_vocab))
    spec.register_target_vocabulary(token_strings(module.tgt_vocab))
    return spec


def _qk_norms(spec: Any, attention: torch.nn.Module) -> None:
    """QK-norm's two gains, where the model has them (CTranslate2's epsilon is the model's
    layer_norm_epsilon: QK_NORM_EPS is NORM_EPS)."""
    if isinstance(attention.q_norm, torch.nn.RMSNorm):
        _norm(spec.q_norm, attention.q_norm)
        _norm(spec.k_norm, attention.k_norm)


def _feed_forward(spec: Any, ff: torch.nn.Module, norm: torch.nn.Module) -> None:
    if isinstance(ff, GatedFeedForward):  # CTranslate2: activation(linear_0) * linear_0_noact
        _linear(spec.linear_0, ff.gate)
        _linear(spec.linear_0_noact, ff.up)
        _linear(spec.linear_1, ff.down)
    else:
        _linear(spec.linear_0, ff[0])
        _linear(spec.linear_1, ff[3])
    _norm(spec.layer_norm, norm)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export(
    ckpt: str | Path, out: str | Path, quantization: str = "float32", force: bool = False
) -> Path:
    """Write the CTranslate2 model directory `out` for checkpoint `ckpt`; returns out."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory: pick another --out")
    if out.exists() and any(out.iterdir()) and not force:
        raise ValueError(
            f"{out} exists and is not an empty directory; pick another --out, or replace it "
            "with --force"
        )
    import_ctranslate2()  # before the checkpoint is read: the missing extra is the first error
    ckpt = Path(ckpt)
    module = load_module(ckpt)
    source = {"checkpoint": str(ckpt.resolve()), "checkpoint_sha256": _sha256(ckpt)}
    return write_export(module, out, quantization, source)


def write_export(
    module: Any, out: Path, quantization: str = "float32", source: dict | None = None
) -> Path:
    """Write a Seq2SeqModule as a CTranslate2 model directory, whole or not at all (an
    existing `out` is replaced once the new one is complete); source says where the module
    came from."""
    spec = model_spec(module)  # refuses what cannot be exported before anything is written
    spec.validate()
    spec.optimize(quantization=quantization)
    about = {
        "format": EXPORT_FORMAT,
        "seq2seq_version": __version__,
        **(source or {"checkpoint": None}),
        "quantization": quantization,
        "model": module.config.to_dict(),
        "decoding": module.decoding.to_dict(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(out, directory=True) as part:
        spec.save(str(part))
        save_tokenizer(module.src_vocab, part / "src_tokenizer.json")
        save_tokenizer(module.tgt_vocab, part / "tgt_tokenizer.json")
        (part / EXPORT_FILE).write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="python -m seq2seq.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("ckpt", help="a checkpoint written by train.py")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument(
        "--quantization", default="float32", choices=QUANTIZATIONS,
        help="weight type in the export (default float32: the checkpoint's weights as they are)",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--debug", action="store_true", help="show an error's traceback")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def work() -> None:
        out = export(args.ckpt, args.out, args.quantization, args.force)
        print(f"wrote {out} ({args.quantization}); translate with:")
        print(f'  python -m seq2seq.translate --model {out} "..."')

    return run_tool(work, args.debug)


if __name__ == "__main__":
    sys.exit(main())
