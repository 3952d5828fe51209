"""Decoding from a trained model: batched, cached, stopping at EOS.

Greedy decoding is here; every step feeds only the newest token and reuses the decoder's
key/value cache, and the cross-attention keys/values of the source are computed once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.model import Seq2SeqTransformer


def max_decode_length(
    model: Seq2SeqTransformer, src: Tensor, max_len_a: float, max_len_b: int
) -> int:
    """At most a * S + b new tokens (fairseq's rule), and no more than the model's positions."""
    source_length = int(model.keep_mask(src).sum(1).max().item()) if src.numel() else 0
    return max(1, min(int(max_len_a * source_length + max_len_b), model.config.max_positions))


@torch.no_grad()
def greedy_decode(model: Seq2SeqTransformer, src: Tensor, max_len: int) -> Tensor:
    """Most likely next token at every step, for a whole batch at once.

    Args:
        model: the Transformer (put it in eval mode first).
        src: (B, S) source ids, padded with the config's pad id.
        max_len: most tokens to produce per sequence, EOS included.

    Returns:
        (B, L) token ids, L <= max_len: each row ends with EOS (unless cut at max_len) and is
        padded after it. BOS is not included.
    """
    cfg = model.config
    memory, memory_mask = model.encode(src), model.keep_mask(src)
    cache = model.new_cache()
    step_input = torch.full((src.size(0), 1), cfg.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    out = []
    for _ in range(max_len):
        logits = model.decode(step_input, memory, memory_mask, cache)[:, -1]  # (B, V)
        token = logits.argmax(-1).masked_fill(finished, cfg.pad_id)
        out.append(token)
        finished |= token == cfg.eos_id
        if bool(finished.all()):
            break
        step_input = token[:, None]
    return torch.stack(out, dim=1)
