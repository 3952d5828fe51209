"""Decoding from a trained model: greedy, beam search and sampling.

All three are batched, stop when every sequence has produced EOS (or at max_len: one for the
batch, or one a row, so that a row's output never depends on the rows beside it), and use the
decoder's key/value cache: each step feeds only the newest token, and the cross-attention keys
and values of the source are computed once. Outputs are token ids without BOS, each row ending
with EOS (unless cut at max_len) and padded after it.

Put the model in eval mode first (dropout would make every method random). Decoding runs under
torch.inference_mode (it saves a third of the time of a step at batch 32 on a CPU): clone the
outputs before using them in anything autograd records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from seq2seq import checks
from seq2seq.core.model import DecoderCache, Seq2SeqTransformer

__all__ = [
    "DECODING_KEYS",
    "Decodes",
    "DecodingConfig",
    "Prefix",
    "Sampling",
    "Search",
    "SearchStopped",
    "beam_search",
    "forced_log_probs",
    "generate",
    "greedy_decode",
    "sample_decode",
]


@dataclass(frozen=True)
class DecodingConfig:
    """How outputs are searched for: what the module's evaluation, translate and an export read.

    The module takes these as one group of plain hyperparameters (model.decoding.max_len_a, ...
    in the configs, hparams["decoding"] in a checkpoint); from_hparams reads them. A new
    decoding option is a field here and its default in configs/model/shared/module.yaml.
    """

    max_len_a: float = 1.0  # at most a * source length + b new tokens (fairseq's rule)
    max_len_b: int = 10
    beam_size: int = 1  # the test split's search (1: greedy); validation is always greedy
    length_penalty: float = 1.0  # beam search ranks by log-probability / length ** this

    def __post_init__(self) -> None:
        checks.number("model.decoding.max_len_a", self.max_len_a, low=0)
        checks.integer("model.decoding.max_len_b", self.max_len_b, minimum=0)
        checks.integer("model.decoding.beam_size", self.beam_size, minimum=1)
        checks.number("model.decoding.length_penalty", self.length_penalty)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> DecodingConfig:
        return cls(**hparams["decoding"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def max_len(self, source_length: int, max_positions: int) -> int:
        """Most new tokens for a longest source of source_length tokens: a * S + b, and no
        more than the model's positions. Translating with CTranslate2 uses the same rule."""
        limit = int(self.max_len_a * source_length + self.max_len_b)
        return max(1, min(limit, max_positions))


DECODING_KEYS = tuple(field.name for field in fields(DecodingConfig))


@dataclass(frozen=True)
class Sampling:
    """Draw each token instead of searching (translate --sample): sample_decode's settings."""

    temperature: float = 1.0
    top_k: int = 0  # keep the k most likely tokens (0: all)
    top_p: float = 1.0  # keep the most likely tokens whose probability reaches p (1.0: all)


@dataclass(frozen=True)
class Search:
    """What translate asks of either backend (the checkpoint, or its CTranslate2 export): the
    DecodingConfig (beam width, length penalty; the length rule gives max_len), how many
    outputs an input (n_best <= beam), or sampling instead of a search; and attention heads
    to switch off while it runs (Seq2SeqTransformer.head_masks)."""

    decoding: DecodingConfig
    n_best: int = 1
    sampling: Sampling | None = None
    heads_off: tuple[tuple[str, int, int], ...] = ()  # (kind, layer, head): switched off

    def __post_init__(self) -> None:
        checks.integer("n_best", self.n_best, minimum=1)
        if self.sampling is None and self.n_best > self.decoding.beam_size:
            raise ValueError(
                f"--n-best {self.n_best} needs a beam at least as wide: add --beam {self.n_best}"
            )


def generate(
    model: Seq2SeqTransformer, src: Tensor, decoding: DecodingConfig, beam_size: int | None = None
) -> Tensor:
    """(B, S) source ids -> (B, L) best outputs under decoding's settings: greedy search or
    beam search (beam_size, default decoding.beam_size), at most decoding.max_len tokens."""
    source_length = int(model.keep_mask(src).sum(1).max().item()) if src.numel() else 0
    max_len = decoding.max_len(source_length, model.config.max_positions)
    beam_size = decoding.beam_size if beam_size is None else beam_size
    if beam_size == 1:
        return greedy_decode(model, src, max_len)
    tokens, _ = beam_search(model, src, max_len, beam_size, decoding.length_penalty)
    return tokens[:, 0]


class Decodes:
    """Decoding for what holds a trained network (`model`) and the hyperparameters it was
    saved with (`hparams`, DecodingConfig's fields its "decoding" group): the LightningModule
    and the Lightning-free checkpoint.TrainedModel decode alike."""

    model: Seq2SeqTransformer
    hparams: Mapping[str, Any]

    @property
    def decoding(self) -> DecodingConfig:
        # Read from hparams each time: evaluating a checkpoint (train=false) sets new values.
        return DecodingConfig.from_hparams(self.hparams)

    def generate(self, src: Tensor, beam_size: int = 1) -> Tensor:
        """(B, S) source ids -> (B, L) predictions, by greedy search or beam search."""
        return generate(self.model, src, self.decoding, beam_size)

    def greedy(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, L) greedy predictions (EOS, then padding)."""
        return self.generate(src, beam_size=1)


def _never_outputs(model: Seq2SeqTransformer, device: torch.device) -> Tensor:
    """The ids of <pad> and <bos>: never outputs, so they get -inf (fairseq does the same). A
    generated <pad> would be masked out of the decoder's own input at the next step, and a
    CTranslate2 export, which knows no padding token, would read it as a word."""
    return torch.tensor([model.config.pad_id, model.config.bos_id], device=device)


def _next_token_logits(
    model: Seq2SeqTransformer,
    step_input: Tensor,
    memory: Tensor,
    memory_keep: Tensor,
    cache: DecoderCache | None,
    never: Tensor,
) -> Tensor:
    """(B, V) logits of the next token after step_input's last position, the ids in never
    (_never_outputs) ruled out."""
    logits = model.decode(step_input, memory, memory_keep, cache, last_only=True)[:, -1]
    return logits.index_fill(-1, never, float("-inf"))


@dataclass(frozen=True)
class Prefix:
    """Target tokens each row's output must begin with: forced tokens (every other token gets
    -inf at their step), then, optionally, a text the next tokens must spell (a healed prefix's
    last word, seq2seq.inference: any tokens whose texts make it, as the model spells it). The
    forced tokens keep their own log-probabilities: a search's score counts them, as a forced
    decoding of them would.

    tokens: (N, P) ids, padded after a row's own; lengths: (N,); spell: a text a row ("": none);
    texts: every token's text (what `spell` is matched against; "" for a special token). The
    searches move the rows with their hypotheses (rows) and the texts on as tokens are taken
    (advance).
    """

    tokens: Tensor
    lengths: Tensor
    spell: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    _masks: dict = field(default_factory=dict, compare=False, repr=False)  # spell -> allowed

    @classmethod
    def of(
        cls,
        rows: list[list[int]],
        spell: list[str] | None,
        pad_id: int,
        device: torch.device,
        texts: tuple[str, ...] = (),
    ) -> Prefix:
        """From per-row lists: each row's forced ids, and the text its next tokens spell."""
        width = max((len(r) for r in rows), default=0)
        tokens = torch.full((len(rows), max(width, 1)), pad_id, dtype=torch.long, device=device)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long, device=device)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
        spelled = tuple(spell) if spell is not None and any(spell) else ()
        if spelled and not texts:
            raise ValueError("a prefix that spells a text needs the tokens' texts")
        return cls(tokens, lengths, spelled, texts)

    def rows(self, which: Tensor) -> Prefix:
        """The prefixes of rows `which`, in that order (a beam's hypotheses as they move)."""
        spell = tuple(self.spell[i] for i in which.tolist()) if self.spell else ()
        return Prefix(self.tokens[which], self.lengths[which], spell, self.texts, self._masks)

    def _allowed(self, rest: str, device: torch.device) -> Tensor:
        """(V,) the tokens that go on spelling `rest`: their text begins it, or finishes it."""
        if rest not in self._masks:
            self._masks[rest] = torch.tensor(
                [bool(t) and (rest.startswith(t) or t.startswith(rest)) for t in self.texts],
                device=device,
            )
        return self._masks[rest]

    def constrain(self, scores: Tensor, position: int) -> Tensor:
        """scores (N, V), or (B, K, V) with N = B*K rows, for output position `position` (0:
        the first token), with what the prefix rules out at -inf."""
        flat = scores.reshape(-1, scores.size(-1))
        keep = torch.ones_like(flat, dtype=torch.bool)
        if self.spell:
            for i, rest in enumerate(self.spell):
                if rest and int(self.lengths[i]) <= position:
                    keep[i] = self._allowed(rest, flat.device)
        if position < self.tokens.size(1):
            forced = self.lengths > position
            only = torch.nn.functional.one_hot(self.tokens[:, position], flat.size(-1)).bool()
            keep = torch.where(forced[:, None], only, keep)
        return flat.masked_fill(~keep, float("-inf")).view_as(scores)

    def advance(self, tokens: Tensor, position: int) -> Prefix:
        """After each row took tokens[i] at `position`: what it has left to spell."""
        if not self.spell:
            return self
        spell = []
        for i, (rest, token) in enumerate(zip(self.spell, tokens.tolist(), strict=True)):
            if rest and int(self.lengths[i]) <= position:
                text = self.texts[token]
                rest = rest[len(text) :] if rest.startswith(text) else ""
            spell.append(rest)
        return Prefix(self.tokens, self.lengths, tuple(spell), self.texts, self._masks)


@torch.inference_mode()
def forced_log_probs(model: Seq2SeqTransformer, src: Tensor, tgt: Tensor) -> Tensor:
    """Forced decoding: the log-probability of each target token given the source and the
    target tokens before it, as the searches compute it (<pad> and <bos> ruled out).

    Args:
        src: (B, S) source ids, padded.
        tgt: (B, T) target ids without BOS, padded after each row's last token (end a row
            with EOS to score a whole output, as a search that ended would).

    Returns:
        (B, T) log-probabilities, 0 at padding: a row's sum is its total log-probability.
    """
    cfg = model.config
    bos = torch.full((tgt.size(0), 1), cfg.bos_id, dtype=torch.long, device=tgt.device)
    logits = model(src, torch.cat([bos, tgt[:, :-1]], dim=1))
    logits = logits.index_fill(-1, _never_outputs(model, src.device), float("-inf"))
    token = logits.float().log_softmax(-1).gather(2, tgt[..., None])[..., 0]
    return token.masked_fill(tgt == cfg.pad_id, 0.0)


class SearchStopped(Exception):
    """Raised between two steps of a search whose `stop` callable said so (a server's request
    past its deadline, or whose client went away): the search's work ends there."""


def _check_stop(stop: Callable[[], bool] | None, produced: int) -> None:
    if stop is not None and stop():
        raise SearchStopped(f"the search was stopped after {produced - 1} steps")


def _limits(max_len: int | Tensor, batch: int, device: torch.device) -> tuple[int, Tensor]:
    """(the steps to run, each row's limit (B,)) for max_len, one for the batch or one a row."""
    limits = torch.as_tensor(max_len, dtype=torch.long, device=device).expand(batch)
    if limits.numel() and int(limits.min()) < 1:
        raise ValueError(f"max_len must be at least 1, got {int(limits.min())}")
    return (int(limits.max()) if limits.numel() else 0), limits


def _token_by_token(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int | Tensor,
    pick: Callable[[Tensor], Tensor],
    use_cache: bool = True,
    stop: Callable[[], bool] | None = None,
    prefix: Prefix | None = None,
) -> Tensor:
    """The loop greedy decoding and sampling share: pick(logits (B, V)) -> tokens (B,)."""
    cfg = model.config
    memory, memory_keep = model.encode(src), model.keep_mask(src)
    cache = model.new_cache() if use_cache else None
    never = _never_outputs(model, src.device)
    out = torch.full((src.size(0), 1), cfg.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    steps, limits = _limits(max_len, src.size(0), src.device)
    for produced in range(1, steps + 1):
        _check_stop(stop, produced)
        step_input = out[:, -1:] if use_cache else out
        # Only the newest position's logits, with or without the cache: the uncached reference
        # then re-runs the decoder over the prefix, as a naive loop would, but not the output
        # projection of positions it has already decided.
        logits = _next_token_logits(model, step_input, memory, memory_keep, cache, never)
        if prefix is not None:
            logits = prefix.constrain(logits, produced - 1)
        token = pick(logits).masked_fill(finished, cfg.pad_id)
        if prefix is not None:
            prefix = prefix.advance(token, produced - 1)
        out = torch.cat([out, token[:, None]], dim=1)
        finished |= (token == cfg.eos_id) | (limits <= produced)
        if bool(finished.all()):
            break
    return out[:, 1:]


@torch.inference_mode()
def greedy_decode(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int | Tensor,
    use_cache: bool = True,
    stop: Callable[[], bool] | None = None,
    prefix: Prefix | None = None,
) -> Tensor:
    """The most likely next token at every step.

    Args:
        model: the Transformer, in eval mode.
        src: (B, S) source ids, padded with the config's pad id.
        max_len: most tokens to produce per sequence, EOS included: one int for every row, or
            a (B,) tensor of each row's (a row then decodes as it would alone).
        use_cache: False re-runs the decoder over the whole prefix at every step (the slow
            reference the cache is measured and tested against).
        stop: asked before every step; True raises SearchStopped (all three searches take it).
        prefix: tokens each output must begin with (all three searches take it).

    Returns:
        (B, L) token ids, L <= max_len.
    """
    return _token_by_token(
        model, src, max_len, lambda logits: logits.argmax(-1), use_cache, stop, prefix
    )


@torch.inference_mode()
def sample_decode(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int | Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    stop: Callable[[], bool] | None = None,
    prefix: Prefix | None = None,
) -> Tensor:
    """Draw each next token from the model's distribution.

    Args:
        temperature: divides the logits; below 1 sharpens, above 1 flattens.
        top_k: keep only the k most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches p
            (nucleus sampling; 1.0: all).
        generator: a seeded torch.Generator on src's device, for reproducible samples.

    Returns:
        (B, L) token ids, L <= max_len.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be 0 (off) or positive, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")

    def pick(logits: Tensor) -> Tensor:
        logits = filter_logits(logits.float() / temperature, top_k, top_p)
        return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)

    return _token_by_token(model, src, max_len, pick, stop=stop, prefix=prefix)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """(B, V) logits with the tokens outside top-k / top-p set to -inf."""
    if top_k and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass(frozen=True)
class BeamStep:
    """One step of beam_search, as its `observe` sees it: the beams before the step (each
    source's K rows), every candidate's log-probability and score, and the K kept.

    tokens (B*K, t): the beams' tokens so far; log_prob, length, finished (B, K): theirs;
    step (B, K, V): each beam's next-token log-probabilities (a finished beam: <pad> at 0, the
    rest -inf); score (B, K*V): each candidate's length-penalised score; best (B, K): the
    kept candidates (beam = index // V, token = index % V), best first; source (B,): which
    source each row is.
    """

    produced: int
    tokens: Tensor
    log_prob: Tensor
    length: Tensor
    finished: Tensor
    step: Tensor
    score: Tensor
    best: Tensor
    source: Tensor


@torch.inference_mode()
def beam_search(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int | Tensor,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    n_best: int = 1,
    stop: Callable[[], bool] | None = None,
    prefix: Prefix | None = None,
    observe: Callable[[BeamStep], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """Keep the beam_size best partial translations of each source at every step.

    Hypotheses are ranked by log-probability / length ** length_penalty (0: raw log-prob,
    which favours short outputs; 1: per-token average). A hypothesis that has produced EOS stays
    in the beam, frozen, until every beam of every source has finished or max_len is reached,
    so one tensor holds the whole search (no per-sentence Python lists). With a limit a row
    (max_len a (B,) tensor), a source's beams freeze where its limit ends them, as the loop's
    end would for that source alone.

    prefix: tokens each output must begin with. observe: called at every step with the step's
    BeamStep (the search as it runs, for seq2seq.inference's tree; the rows still searched).

    Returns:
        tokens (B, n_best, L) and their scores (B, n_best), best first.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    cfg = model.config
    b, k, device = src.size(0), beam_size, src.device
    memory = model.encode(src).repeat_interleave(k, dim=0)  # (B*K, S, D)
    if prefix is not None:  # a row a hypothesis: each spells on as it goes
        prefix = prefix.rows(torch.arange(b, device=device).repeat_interleave(k))
    memory_keep = model.keep_mask(src).repeat_interleave(k, dim=0)
    cache, never = model.new_cache(), _never_outputs(model, device)

    tokens = torch.full((b * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    log_prob = torch.full((b, k), float("-inf"), device=device)
    log_prob[:, 0] = 0.0  # one live beam at the start, so the first step has no duplicates
    length = torch.zeros(b, k, device=device)
    finished = torch.zeros(b, k, dtype=torch.bool, device=device)
    offsets = (torch.arange(b, device=device) * k)[:, None]  # (B, 1)
    steps, limits = _limits(max_len, b, device)
    # A source whose beams have all finished leaves the search (its rows of every tensor, the
    # cache's included): the rest go on as they would have alone, at the cost of the rows left.
    source = torch.arange(b, device=device)  # the sources still searched, by their row
    done_tokens: list[tuple[int, Tensor]] = []
    done_log_prob = torch.empty(b, k, device=device)
    done_length = torch.empty(b, k, device=device)

    def retire(which: Tensor) -> None:
        """Keep the final beams of the searched sources `which` (indices into the rows)."""
        for i in which.tolist():
            done_tokens.append((int(source[i]), tokens[i * k : (i + 1) * k, 1:]))
        done_log_prob[source[which]] = log_prob[which]
        done_length[source[which]] = length[which]

    for produced in range(1, steps + 1):
        _check_stop(stop, produced)
        step_input = tokens[:, -1:]
        logits = _next_token_logits(
            model, step_input, memory, memory_keep, cache, never
        )  # (B*K, V)
        step = logits.float().log_softmax(-1).view(b, k, -1)  # (B, K, V)
        if prefix is not None:
            step = prefix.constrain(step, produced - 1)
        vocab = step.size(-1)
        # A finished beam can only continue with padding, at no cost.
        step = step.masked_fill(finished[..., None], float("-inf"))
        step[..., cfg.pad_id] = torch.where(finished, 0.0, step[..., cfg.pad_id])

        # Every beam times every token: (B, K, 1) + (B, K, V), flattened to (B, K*V) candidates,
        # each ranked by its log-probability over its length ** length_penalty (a beam's
        # candidates share a length: the divisor is computed once a beam, not once a token).
        cand_log_prob = (log_prob[..., None] + step).view(b, k * vocab)
        cand_length = length + (~finished).float()  # (B, K)
        divisor = cand_length.clamp(min=1) ** length_penalty
        score = (cand_log_prob.view(b, k, vocab) / divisor[..., None]).view(b, k * vocab)
        best = score.topk(k, dim=-1).indices  # (B, K)
        origin, token = best // vocab, best % vocab
        if observe is not None:
            observe(BeamStep(produced, tokens[:, 1:], log_prob, length, finished, step,
                             score, best, source))  # fmt: skip

        log_prob = cand_log_prob.gather(1, best)  # (B, K): the chosen candidates'
        length = cand_length.gather(1, origin)
        finished = finished.gather(1, origin) | (token == cfg.eos_id)  # the beams extended
        finished |= (limits <= produced)[:, None]  # a source at its limit: its search ends
        rows = (offsets + origin).view(-1)  # (B*K,) which beam each new beam extends
        cache.reorder(rows, within_source=True)  # a beam continues a beam of its own source
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        if prefix is not None:
            prefix = prefix.rows(rows).advance(token.view(-1), produced - 1)
        ended = finished.all(1)  # (B,)
        if bool(ended.all()):
            break
        if bool(ended.any()):
            retire(ended.nonzero().squeeze(1))
            going = (~ended).nonzero().squeeze(1)
            rows = (going[:, None] * k + torch.arange(k, device=device)).view(-1)
            cache.reorder(rows)  # fewer sources: their cross-attention rows too
            tokens, memory, memory_keep = tokens[rows], memory[rows], memory_keep[rows]
            log_prob, length, finished = log_prob[going], length[going], finished[going]
            limits, source = limits[going], source[going]
            prefix = None if prefix is None else prefix.rows(rows)
            b = going.numel()
            offsets = (torch.arange(b, device=device) * k)[:, None]
    retire(torch.arange(b, device=device))

    final = done_log_prob / done_length.clamp(min=1) ** length_penalty  # (B, K)
    top, order = final.topk(n_best, dim=-1)  # (B, N)
    # Each source's K rows of tokens, padded to the longest search's length, then its N best.
    width = max(t.size(1) for _, t in done_tokens)
    all_tokens = torch.full((final.size(0), k, width), cfg.pad_id, dtype=torch.long, device=device)
    for i, rows_of_source in done_tokens:
        all_tokens[i, :, : rows_of_source.size(1)] = rows_of_source
    chosen = all_tokens.gather(1, order[..., None].expand(-1, -1, width))
    return chosen, top
