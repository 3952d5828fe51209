"""The one way to ask a trained model: translate's command line, the service's endpoints, the
page's controls and the benchmarks go through this module.

- The search settings are declared once (OPTIONS: name, type, default, range, help, the
  requests that take them); translate's options, the HTTP schema (seq2seq/serve/app.py) and
  the page's controls (/info's "settings") are made from the declaration, and `check` says
  what is wrong with a request's in one line, in the spelling of whoever asked (--n-best on
  the command line, n_best over HTTP).
- The Engine loads a checkpoint (our search, seq2seq.core.decoding) or a CTranslate2 export,
  and answers: outputs (with a prefix to continue from), the scores of given translations
  (forced decoding), the search as a tree, attention, and what is loaded. Where the export
  cannot do something it says so in one line.

No web framework here: the server's batcher calls the Engine from its worker thread, the app
only to check a request before it queues.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import Any

import torch

from seq2seq import __version__
from seq2seq.checkpoint import load_module
from seq2seq.core.attention import force_attention, mask_heads
from seq2seq.core.decoding import (
    BeamStep,
    DecodingConfig,
    Prefix,
    Sampling,
    Search,
    beam_search,
    forced_log_probs,
    greedy_decode,
    sample_decode,
)
from seq2seq.data.tokenizer import clean

__all__ = [
    "OPTIONS",
    "CheckpointModel",
    "Engine",
    "Option",
    "RequestError",
    "Sentence",
    "Settings",
    "add_arguments",
    "check",
    "search_for",
    "settings_from_args",
]

MIN_TEMPERATURE = 1e-4  # sampling's: a logit of 50 over 1e-37 is past float32's largest
MAX_SEED = 2**32 - 1  # CTranslate2's set_random_seed takes an unsigned 32-bit integer
# translate decodes its inputs in batches of this many (its --batch-size default): a sampling
# request is drawn in the same batches, so that its seed gives the same outputs.
TRANSLATE_BATCH = 64
HEAL_TOKENS = 8  # a healed prefix frees at most this many of its last word's tokens


# --- the settings, declared once ---------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting of a request: its name (a field over HTTP, --name-with-dashes on the command
    line), type, default, the values it takes (low/high, open or closed; `must` says them in
    words), help, and which requests take it (translate, attention, search, score)."""

    name: str
    kind: type  # int, float, bool or str
    default: Any
    help: str
    must: str = ""  # "must be at least 1": the error's words for a value out of range
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    optional: bool = False  # None is a value: the model's own
    requests: tuple[str, ...] = ("translate",)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.kind in (int, float):
            if not (math.isfinite(value)):
                return False
            if self.low is not None and (value <= self.low if self.low_open else value < self.low):
                return False
            if self.high is not None and value > self.high:
                return False
        return True

    def control(self) -> dict[str, Any]:
        """The declaration as the page reads it (/info's "settings")."""
        return {
            "name": self.name, "type": self.kind.__name__, "default": self.default,
            "optional": self.optional, "low": self.low, "high": self.high,
            "low_open": self.low_open, "help": self.help, "requests": list(self.requests),
        }  # fmt: skip


SEARCHES = ("translate", "attention", "search")  # the requests that run a search
OPTIONS: tuple[Option, ...] = (
    Option("beam", int, None, "beam width (1: greedy; default: the model's own)",
           "must be at least 1", low=1, optional=True, requests=SEARCHES),
    Option("n_best", int, 1, "outputs per input (<= beam)", "must be at least 1", low=1),
    Option("length_penalty", float, None,
           "beam search ranks by log-probability / length ** this (default: the model's own)",
           "must be a finite number", optional=True, requests=(*SEARCHES, "score")),
    Option("max_len", int, None,
           "most new tokens per output (default: the model's rule, a * source length + b)",
           "must be at least 1", low=1, optional=True, requests=(*SEARCHES, "what_if")),
    Option("sample", bool, False, "draw each token instead of searching"),
    Option("temperature", float, 1.0, "sampling: divides the logits (below 1 sharpens)",
           "must be a positive number", low=0, low_open=True),
    Option("top_k", int, 0,
           "sampling: draw from the k most likely tokens (0: all); /search: the alternatives "
           "shown at each step", "must be 0 (all tokens) or more", low=0,
           requests=("translate", "search")),
    Option("top_p", float, 1.0, "sampling: draw from the most likely tokens reaching p (1: all)",
           "must be in (0, 1]", low=0, high=1, low_open=True),
    Option("seed", int, 0, "sampling: where the draw starts",
           f"must be in 0-{MAX_SEED} (both backends take 32 bits)", low=0, high=MAX_SEED),
    Option("truncate", bool, False, "cut an input longer than the model accepts",
           requests=(*SEARCHES, "score", "what_if")),
    Option("prefix", str, None,
           "the output begins with this text, and the search goes on from it",
           optional=True, requests=SEARCHES),
    Option("head_mask", str, None,
           "attention heads to switch off, KIND:LAYER:HEAD a head, comma-separated (KIND: enc, "
           "self or cross; from 0), e.g. cross:2:5,enc:0:1",
           optional=True, requests=(*SEARCHES, "score", "what_if")),
    Option("heal", bool, True,
           "with a prefix: the tokens of its last word may be any that spell it, as the model "
           "would (off: forced as the tokenizer splits them)", requests=SEARCHES),
)  # fmt: skip
_BY_NAME = {o.name: o for o in OPTIONS}

# What a request may set, as one frozen dataclass made from OPTIONS (a list of prefixes, one a
# sentence, goes in `prefix` too). None: the model's own, as translate leaves it.
Settings = make_dataclass(
    "Settings",
    [(o.name, Any, field(default=o.default)) for o in OPTIONS],
    frozen=True,
)
Settings.__doc__ = "A request's settings, one field an Option of OPTIONS (by the same name)."


class RequestError(ValueError):
    """A request the model cannot answer as asked: one line naming the setting and the fix,
    and the HTTP status a server answers it with (422 by default)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def http_name(name: str) -> str:
    return name


def _ask(spell: Callable[[str], str], name: str, value: Any) -> str:
    """How whoever asked sets a setting: 'send "heal": false', or 'pass --no-heal'."""
    if spell is http_name:
        return f"send {json.dumps(name)}: {json.dumps(value)}"
    if value is False:
        return f"pass --no-{name.replace('_', '-')}"
    return f"pass {flag_name(name)}" + ("" if value is True else f" {value}")


def flag_name(name: str) -> str:
    return _BY_NAME[name].flag if name in _BY_NAME else "--" + name.replace("_", "-")


def check(settings: Any, spell: Callable[[str], str] = http_name) -> None:
    """A RequestError naming the first setting that is wrong (in spell's words: flag_name for
    the command line), or nothing; each backend then gets only settings it can run."""

    def fail(message: str) -> None:
        raise RequestError(message)

    for option in OPTIONS:
        value = getattr(settings, option.name)
        if option.name == "prefix":
            continue  # text: encode() checks it
        if not option.accepts(value):
            fail(f"{spell(option.name)} {option.must}, got {value}")
    s = settings
    if s.sample and ((s.beam or 1) > 1 or s.n_best > 1):
        fail(
            f"{spell('sample')} draws one output per input: drop {spell('beam')} and "
            f"{spell('n_best')}"
        )
    if s.beam is not None and s.n_best > s.beam:
        fail(
            f"{spell('n_best')} {s.n_best} needs a beam at least as wide: add "
            f"{spell('beam')} {s.n_best}"
        )
    heads_off(s.head_mask, spell)
    if s.temperature < MIN_TEMPERATURE:  # the logits over it would overflow float32
        fail(
            f"{spell('temperature')} must be at least {MIN_TEMPERATURE:g}, got "
            f"{s.temperature:g}: for the most likely tokens, drop {spell('sample')} (greedy "
            "search)"
        )


HEAD_KINDS = {"enc": "encoder", "encoder": "encoder", "self": "self", "dec": "self",
              "cross": "cross"}  # fmt: skip


def heads_off(spec: str | None, spell: Callable[[str], str] = http_name) -> tuple:
    """ "cross:2:5,enc:0:1" as ((kind, layer, head), ...), or a one-line RequestError."""
    if not spec or not spec.strip():
        return ()
    found = []
    for part in spec.split(","):
        kind, *numbers = part.strip().split(":")
        if kind not in HEAD_KINDS or len(numbers) != 2 or not all(n.isdigit() for n in numbers):
            raise RequestError(
                f"{spell('head_mask')} has {part.strip()!r}: write each head as KIND:LAYER:HEAD "
                "(KIND enc, self or cross; LAYER and HEAD from 0), e.g. cross:2:5,enc:0:1"
            )
        found.append((HEAD_KINDS[kind], int(numbers[0]), int(numbers[1])))
    return tuple(sorted(set(found)))


def search_for(settings: Any, saved: DecodingConfig) -> Search:
    """The search the settings ask for; what they leave out is the model's own, as it was
    tested (its beam width, widened to n_best; its length penalty; its length rule)."""
    off = heads_off(settings.head_mask)
    if settings.sample:
        sampling = Sampling(settings.temperature, settings.top_k, settings.top_p)
        return Search(replace(saved, beam_size=1), sampling=sampling, heads_off=off)
    beam = settings.beam if settings.beam is not None else max(saved.beam_size, settings.n_best)
    penalty = saved.length_penalty if settings.length_penalty is None else settings.length_penalty
    decoding = replace(saved, beam_size=beam, length_penalty=penalty)
    return Search(decoding, n_best=settings.n_best, heads_off=off)


def add_arguments(parser: argparse.ArgumentParser, request: str = "translate") -> None:
    """Every option of `request` as a command-line option (--n-best for n_best)."""
    for option in OPTIONS:
        if request not in option.requests:
            continue
        if option.kind is bool:
            action = argparse.BooleanOptionalAction if option.default else "store_true"
            parser.add_argument(option.flag, action=action, default=option.default,
                                help=option.help)  # fmt: skip
        else:
            parser.add_argument(option.flag, type=option.kind, default=option.default,
                                help=option.help)  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> Any:
    """The Settings of parsed options (those a tool does not take keep their defaults)."""
    return Settings(**{o.name: getattr(args, o.name) for o in OPTIONS if hasattr(args, o.name)})


def output_limit(
    source_length: int, search: Search, max_positions: int, max_len: int | None = None
) -> int:
    """Most tokens one input's output may have: max_len, else the model's rule for the
    input's own length (so an output never depends on the inputs batched with it), and never
    more than the model's positions."""
    limit = search.decoding.max_len(source_length, max_positions)
    return min(max_len or limit, max_positions)


def torch_device(name: str) -> torch.device:
    """--device as a torch device that exists here, or a one-line error."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda, cuda:N or mps, got {name!r}") from None
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available()
        and (device.index is None or device.index < torch.cuda.device_count()),
        "mps": torch.backends.mps.is_available(),
    }
    if not available.get(device.type, False):
        raise ValueError(f"--device {name}: no such device on this machine; use --device cpu")
    return device


def pad(rows: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], device=device)


@dataclass
class Sentence:
    """One sentence of a request, encoded: its token ids (none for a blank one, which gets an
    empty output), the most tokens its output may have, its unknown tokens, and the target
    tokens its output must begin with (a prefix; `spell`: the text the tokens after them must
    spell, where the prefix's last word is healed)."""

    ids: list[int]
    limit: int
    unknown: int
    prefix: list[int] = field(default_factory=list)
    spell: str = ""


# --- the checkpoint's backend --------------------------------------------------------------------


class CheckpointModel:
    """A checkpoint's model, searching with seq2seq.core.decoding. It shares ExportedModel's
    interface (src_vocab, tgt_vocab, max_positions, decoding, generate, score), so every
    request runs one way for both."""

    def __init__(self, path: str, device: str = "cpu", seed: int = 0) -> None:
        self.device = torch_device(device)
        self.module = load_module(path, map_location=self.device)
        self.src_vocab, self.tgt_vocab = self.module.src_vocab, self.module.tgt_vocab
        self.max_positions = self.module.config.max_positions
        self.decoding = self.module.decoding
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._token_texts: tuple[str, ...] = ()

    def token_texts(self) -> tuple[str, ...]:
        """Every target token's own text (the tokenizer's decoding of it alone; "" for the
        special tokens), made once."""
        if not self._token_texts:
            vocab = self.tgt_vocab
            self._token_texts = tuple(vocab.decode([i]) for i in range(len(vocab)))
        return self._token_texts

    def heads(self, off: tuple = ()) -> Any:
        """A context in which the heads `off` ((kind, layer, head), ...) are switched off."""
        if not off:
            return contextlib.nullcontext()
        return mask_heads(self.module.model, self.module.model.head_masks(off))

    def _prefix(self, prefixes: list[list[int]] | None, spell: list[str] | None) -> Prefix | None:
        if not prefixes or (not any(prefixes) and not any(spell or [])):
            return None
        texts = self.token_texts() if spell and any(spell) else ()
        return Prefix.of(prefixes, spell, self.module.config.pad_id, self.device, texts)

    def generate(
        self,
        rows: list[list[int]],
        max_len: int | list[int],
        search: Search,
        stop: Callable[[], bool] | None = None,
        prefixes: list[list[int]] | None = None,
        spell: list[str] | None = None,
        observe: Callable[[BeamStep], None] | None = None,
    ) -> list:
        """Per source row of token ids, a list of (score, token ids) pairs, best first; at
        most max_len tokens (one for every row, or one a row). stop is asked before every step:
        True raises SearchStopped. prefixes: the tokens each output begins with (spell: the text
        the tokens after them spell first; "": none). observe: beam search's BeamStep."""
        with self.heads(search.heads_off):
            return self._generate(rows, max_len, search, stop, prefixes, spell, observe)

    def _generate(self, rows, max_len, search, stop, prefixes, spell, observe) -> list:
        model, src = self.module.model, pad(rows, self.src_vocab.pad_id, self.device)
        if isinstance(max_len, list):
            max_len = torch.tensor(max_len, device=self.device)
        prefix = self._prefix(prefixes, spell)
        if search.sampling is not None:
            s = search.sampling
            out = sample_decode(
                model, src, max_len, s.temperature, s.top_k, s.top_p, self.generator, stop, prefix
            )
            return [[(float("nan"), row)] for row in out.tolist()]
        beam, penalty = search.decoding.beam_size, search.decoding.length_penalty
        if beam == 1 and observe is None:
            found = greedy_decode(model, src, max_len, stop=stop, prefix=prefix)
            return [[(float("nan"), row)] for row in found.tolist()]
        tokens, scores = beam_search(
            model, src, max_len, beam, penalty, search.n_best, stop, prefix, observe
        )
        return [
            list(zip(s, t, strict=True))
            for s, t in zip(scores.tolist(), tokens.tolist(), strict=True)
        ]

    def score(
        self, rows: list[list[int]], targets: list[list[int]], heads_off: tuple = ()
    ) -> list[list[float]]:
        """Per (source, target) pair, the log-probability of each target token and of the
        EOS after them (forced decoding), with the heads `heads_off` switched off."""
        config = self.module.config
        src = pad(rows, config.pad_id, self.device)
        tgt = pad([[*t, config.eos_id] for t in targets], config.pad_id, self.device)
        with self.heads(heads_off):
            found = forced_log_probs(self.module.model, src, tgt).tolist()
        return [row[: len(t) + 1] for row, t in zip(found, targets, strict=True)]


class Engine:
    """A checkpoint (our search) or a CTranslate2 export, loaded once: what translate, the
    server and the page ask their questions of."""

    def __init__(
        self,
        ckpt: str | None = None,
        model_dir: str | None = None,
        device: str = "cpu",
        compute_type: str | None = None,
        threads: int = 0,
        seed: int = 0,
    ) -> None:
        if (ckpt is None) == (model_dir is None):
            raise ValueError("give a checkpoint (CKPT) or an export (--model DIR), one of them")
        if ckpt is not None:
            self.backend, self.path = "torch", Path(ckpt)
            self.model: Any = CheckpointModel(ckpt, device, seed)
        else:
            from seq2seq.exported import ExportedModel, read_export  # CTranslate2: an extra

            self.backend, self.path = "ctranslate2", Path(model_dir)
            threads = threads or torch.get_num_threads()
            self.model = ExportedModel(model_dir, device, compute_type or "default", threads, seed)
        self.max_positions: int = self.model.max_positions
        # The network's sizes, for what a search costs (search_bytes): the checkpoint's
        # ModelConfig, or what the export recorded of it.
        self.net: dict[str, Any] = (
            self.model.module.config.to_dict()
            if self.backend == "torch"
            else read_export(self.path)["model"]
        )

    # --- a request, checked before it queues ----------------------------------------------

    def search(self, settings: Any, spell: Callable[[str], str] = http_name) -> Search:
        """The Search the settings ask for, or a one-line RequestError (in spell's words)."""
        check(settings, spell)
        if settings.prefix is not None and settings.heal and self.backend != "torch":
            raise RequestError(
                f"the CTranslate2 export forces a prefix's tokens as the tokenizer splits them "
                f"and cannot heal its last one: {_ask(spell, 'heal', False)}, or serve the "
                "checkpoint", status=501,
            )  # fmt: skip
        off = heads_off(settings.head_mask, spell)
        if off and self.backend != "torch":
            raise RequestError(
                f"the CTranslate2 export cannot switch heads off: drop {spell('head_mask')}, or "
                "serve the checkpoint", status=501,
            )  # fmt: skip
        if off:
            try:
                self.model.module.model.head_masks(off)
            except ValueError as error:
                raise RequestError(f"{spell('head_mask')}: {error}") from None
        return search_for(settings, self.model.decoding)

    def encode(
        self,
        texts: list[str],
        settings: Any,
        search: Search,
        where: Callable[[int], str] = lambda i: f"src[{i}]",
        spell: Callable[[str], str] = http_name,
    ) -> list[Sentence]:
        """Each text as token ids, with its output's limit and its prefix's tokens; too long
        for the model: an error naming the sentence (`where`) and the limit, or cut with
        truncate."""
        prefixes = self._prefixes(settings.prefix, len(texts), spell)
        sentences = []
        for index, text in enumerate(texts):
            ids = self._ids(self.model.src_vocab, text, where(index))
            if len(ids) > self.max_positions:
                if not settings.truncate:
                    raise RequestError(
                        f"{where(index)} has {len(ids)} tokens, more than the model's "
                        f"{self.max_positions}: shorten it, or {_ask(spell, 'truncate', True)} "
                        "to cut it"
                    )
                ids = ids[: self.max_positions]
            limit = output_limit(len(ids), search, self.max_positions, settings.max_len)
            unknown = sum(i == self.model.src_vocab.unk_id for i in ids)
            sentence = Sentence(ids, limit, unknown)
            if prefixes[index] and ids:
                self._add_prefix(sentence, prefixes[index], settings.heal, spell, index)
            sentences.append(sentence)
        return sentences

    def _prefixes(self, prefix: Any, count: int, spell: Callable[[str], str]) -> list[str]:
        """One prefix text a sentence ("" for none): one for all, or a list of one each."""
        if prefix is None:
            return [""] * count
        if isinstance(prefix, str):
            return [prefix] * count
        if len(prefix) != count:
            raise RequestError(
                f"{spell('prefix')} has {len(prefix)} prefixes for {count} sentences: send one "
                'a sentence ("" for none), or one text for all'
            )
        return list(prefix)

    @staticmethod
    def _ids(vocab: Any, text: str, name: str) -> list[int]:
        """A text's token ids, as translate encodes an input line; a text no UTF-8 holds (JSON's
        "\ud800", a lone surrogate) fails naming it."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise RequestError(
                f"{name} is not valid text: character {error.start} is a lone "
                f"surrogate ({text[error.start]!a}), which no UTF-8 text holds: send the "
                "whole character (both halves of its pair) or drop it"
            ) from None
        cleaned = clean(text)
        return vocab.encode(cleaned) if cleaned else []

    def _add_prefix(
        self, sentence: Sentence, text: str, heal: bool, spell: Callable[[str], str], index: int
    ) -> None:
        """The prefix's tokens, forced. Healed, the tokens of its last word (at most
        HEAL_TOKENS, those after its last space) are freed: the tokens after the rest may be any
        that spell the same text. The tokenizer alone splits "trois cent d" as "trois", " cent",
        " ", "d", a split the model never makes; healed, the output goes on as the model spells
        " deux" or " douze". The forced tokens count in the output's limit, which grows to hold
        them and one more."""
        name = f"{spell('prefix')}[{index}]" if index else spell("prefix")
        ids = self._ids(self.model.tgt_vocab, text, name)
        if not ids:
            return
        if len(ids) >= self.max_positions:
            raise RequestError(
                f"{name} has {len(ids)} tokens, the model's limit is {self.max_positions - 1}: "
                "send a shorter prefix"
            )
        if self.model.tgt_vocab.unk_id in ids:
            raise RequestError(
                f"{name} has a token the model's target vocabulary lacks (<unk>): the output "
                "cannot begin with it; send a prefix in the model's own tokens"
            )
        if heal:
            texts = self.model.token_texts()
            # Where the tokens' texts make the text (byte-level BPE, characters), the last
            # word's; where a tokenizer joins its tokens with spaces (words, symbols), the last
            # token, which its own text must begin.
            joined = "".join(texts[i] for i in ids) == self.text(ids)
            freed = 1
            while (
                joined and freed < min(HEAL_TOKENS, len(ids))
                and not any(c.isspace() for c in "".join(texts[i] for i in ids[-freed - 1 :])[1:])
            ):  # fmt: skip
                freed += 1
            sentence.spell = "".join(texts[i] for i in ids[-freed:])
            ids = ids[:-freed]
        sentence.prefix = ids
        sentence.limit = min(max(sentence.limit, len(ids) + 1), self.max_positions)

    def search_bytes(self, sentences: list[Sentence], search: Search) -> int:
        """About the most memory one search of these sentences holds at once, in bytes: per
        row (sentence x beam) the decoder's key/value cache over the output's steps and over
        the source, the encoder's output, a few copies of the next token's scores, and the
        tokens so far; per sentence the encoder's activations and attention weights. An upper
        bound's shape, not a measurement: what a server compares with --max-search-mb before
        any work starts (seq2seq/serve/app.py), and the batcher before it searches requests
        together."""
        todo = [s for s in sentences if s.ids]
        if not todo:
            return 0
        if search.sampling is not None:
            todo = todo[:TRANSLATE_BATCH]  # drawn in translate's batches, one at a time
        net = self.net
        d_model, d_ff, heads = net["d_model"], net["d_ff"], net["num_heads"]
        layers = net["num_decoder_layers"]
        source = max(len(s.ids) for s in todo)
        steps = max(s.limit for s in todo)
        sentences_count = len(todo)
        rows = sentences_count * (search.decoding.beam_size if search.sampling is None else 1)
        vocab = len(self.model.tgt_vocab)
        per_row = (
            2 * layers * (steps + source) * d_model  # the cache: keys and values
            + 2 * source * d_model  # the encoder's output, and its copy for each beam
            + 6 * vocab  # the next token's logits, log-probabilities and candidates
            + heads * (steps + source)
            + d_ff  # a step's attention weights and hidden layer
        )
        per_sentence = source * (6 * d_model + d_ff) + 2 * heads * source * source
        return 4 * (rows * per_row + sentences_count * per_sentence) + 16 * rows * steps

    def score_bytes(self, sentences: list[Sentence], targets: list[list[int]]) -> int:
        """About the most memory one scoring of these pairs holds, in bytes: every target
        position's logits over the vocabulary (and their log-probabilities) at once, and the
        encoder's and decoder's activations."""
        if not targets:
            return 0
        net, vocab = self.net, len(self.model.tgt_vocab)
        width = max(len(t) for t in targets) + 1
        source = max(len(s.ids) for s in sentences)
        per_position = 3 * vocab + 2 * net["num_decoder_layers"] * net["d_model"] + net["d_ff"]
        per_source = source * (6 * net["d_model"] + net["d_ff"]) + 2 * net["num_heads"] * source**2
        return 4 * len(targets) * (width * per_position + per_source)

    # --- the worker's side -----------------------------------------------------------------

    def generate(
        self,
        sentences: list[Sentence],
        search: Search,
        seed: int | None = None,
        stop: Callable[[], bool] | None = None,
        batch_size: int | None = None,
    ) -> list[list[tuple[float, list[int]]]]:
        """Per sentence, (score, token ids) pairs, best first; blank sentences get an empty
        output. Searched batch_size sentences at a time (default: all at once; sampling:
        translate's batches, so that a seed gives translate's draw). With sampling, seed starts
        a new draw. stop is asked between the search's steps: True ends it with SearchStopped."""
        out: list[list[tuple[float, list[int]]]] = [
            [(math.nan, [])] * search.n_best for _ in sentences
        ]
        todo = [i for i, sentence in enumerate(sentences) if sentence.ids]
        if search.sampling is not None and seed is not None:
            self._reseed(seed)
        if batch_size is None:
            batch_size = TRANSLATE_BATCH if search.sampling is not None else max(len(todo), 1)
        with torch.inference_mode():
            for start in range(0, len(todo), batch_size):
                part = [sentences[i] for i in todo[start : start + batch_size]]
                more = {}
                if any(s.prefix or s.spell for s in part):
                    more = {"prefixes": [s.prefix for s in part],
                            "spell": [s.spell for s in part]}  # fmt: skip
                found = self.model.generate(
                    [s.ids for s in part], [s.limit for s in part], search, stop, **more
                )
                for i, hyps in zip(todo[start : start + batch_size], found, strict=True):
                    out[i] = hyps
        return out

    def targets(
        self,
        texts: list[str],
        sources: list[Sentence],
        spell: Callable[[str], str] = http_name,
        where: Callable[[int], str] = lambda i: f"tgt[{i}]",
    ) -> list[list[int]]:
        """The translations to score, as target token ids: one a source, none blank, each
        within the model's positions (its tokens and EOS)."""
        if len(texts) != len(sources):
            raise RequestError(
                f"{spell('src')} has {len(sources)} sentence(s) and {spell('tgt')} "
                f"{len(texts)}: send one translation a sentence"
            )
        targets = []
        for index, text in enumerate(texts):
            ids = self._ids(self.model.tgt_vocab, text, where(index))
            if not ids:
                raise RequestError(f"{where(index)} is blank: send the translation to score")
            if not sources[index].ids:
                raise RequestError(
                    f"the source of {where(index)} is blank: send the sentence it translates"
                )
            if len(ids) + 1 > self.max_positions:
                raise RequestError(
                    f"{where(index)} has {len(ids)} tokens, more than the model's "
                    f"{self.max_positions - 1} (one position holds the end of the sentence): "
                    "score a shorter translation"
                )
            targets.append(ids)
        return targets

    def score(
        self,
        sentences: list[Sentence],
        targets: list[list[int]],
        search: Search,
        stop: Callable[[], bool] | None = None,
        batch_size: int = TRANSLATE_BATCH,
    ) -> list[dict[str, Any]]:
        """Forced decoding: per (sentence, target) pair, the total log-probability of the
        target and its EOS, the per-token mean, the score as the search ranks it
        (log-probability / length ** its length penalty, EOS counted as beam search counts it)
        and each token with its log-probability."""
        penalty = search.decoding.length_penalty
        vocab = self.model.tgt_vocab
        out = []
        with torch.inference_mode():
            for start in range(0, len(targets), batch_size):
                if stop is not None and stop():
                    from seq2seq.core.decoding import SearchStopped

                    raise SearchStopped("the scoring was stopped between its batches")
                rows = [s.ids for s in sentences[start : start + batch_size]]
                part = targets[start : start + batch_size]
                found = self.model.score(rows, part, search.heads_off)
                for ids, logprobs in zip(part, found, strict=True):
                    total = float(sum(logprobs))
                    out.append({
                        "score": total / len(logprobs) ** penalty,
                        "logprob": total,
                        "mean": total / len(logprobs),
                        "tokens": [
                            {"token": vocab.token_label(i), "id": i, "logprob": lp}
                            for i, lp in zip([*ids, vocab.eos_id], logprobs, strict=True)
                        ],
                    })  # fmt: skip
        return out

    def trace(
        self,
        sentence: Sentence,
        search: Search,
        top_k: int,
        stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """The beam search of one sentence as it ran: at every step each live hypothesis (its
        slot in the beam, the slot it grew from, its last token, log-probability and
        length-penalised score, whether the best output goes through it) with its top_k
        next tokens (probability, the score the
        candidate would have, kept or pruned, the slot a kept one takes, and the text the output
        would begin with: a prefix to continue from), and at the end
        the hypotheses the search finished with, best first. Greedy search is a beam of 1."""
        if self.backend != "torch":
            raise RequestError(
                "the search as a tree needs the checkpoint: serve it with python -m "
                "seq2seq.serve CKPT (CTranslate2 reports no search's steps)", status=501,
            )  # fmt: skip
        vocab, penalty = self.model.tgt_vocab, search.decoding.length_penalty
        steps: list[dict[str, Any]] = []
        parents: list[int] = [0]  # slot -> the slot it grew from, at the step before
        paths: list[tuple[dict[str, Any], list[int]]] = []  # each hypothesis and its tokens

        def observe(view: BeamStep) -> None:
            beam, size = view.log_prob.size(1), view.step.size(-1)
            scores = view.score[0].view(beam, size)
            kept = {int(c): slot for slot, c in enumerate(view.best[0].tolist())}
            hypotheses = []
            for slot in range(beam):
                logprob = float(view.log_prob[0, slot])
                if logprob == -math.inf:
                    continue  # an empty slot: one live beam at the start, or after a prefix
                own = view.tokens[slot]  # one source: its beams are the rows
                last = int(own[-1]) if own.numel() else None
                path = own.tolist()
                length = max(float(view.length[0, slot]), 1.0)
                shown = view.step[0, slot].topk(min(top_k, size)).indices.tolist()
                shown += [c % size for c in kept if c // size == slot and c % size not in shown]
                hypotheses.append({
                    "slot": slot, "parent": parents[slot] if slot < len(parents) else None,
                    "token": None if last is None else vocab.token_label(last), "id": last,
                    "logprob": logprob, "score": logprob / length**penalty,
                    "finished": bool(view.finished[0, slot]),
                    "next": [
                        {"token": vocab.token_label(i), "id": i,
                         "prob": math.exp(float(view.step[0, slot, i])),
                         "score": float(scores[slot, i]),
                         "kept": slot * size + i in kept,
                         "slot": kept.get(slot * size + i),
                         "prefix": self.text([*path, i])}
                        for i in shown if float(view.step[0, slot, i]) > -math.inf
                    ],
                })  # fmt: skip
                paths.append((hypotheses[-1], path))
            steps.append({"step": view.produced, "hypotheses": hypotheses})
            parents[:] = [c // size for c in view.best[0].tolist()]

        every = replace(search, n_best=search.decoding.beam_size, sampling=None)
        more = {"prefixes": [sentence.prefix], "spell": [sentence.spell]}
        with torch.inference_mode():
            found = self.model.generate(
                [sentence.ids], sentence.limit, every, stop, observe=observe, **more
            )[0]
        pad = self.model.module.config.pad_id
        best = self.model.module.output_ids(found[0][1])
        for hypothesis, path in paths:  # on the best output's way: a prefix of it
            own = [i for i in path if i != pad]
            hypothesis["best"] = own == best[: len(own)]
        finished = [
            {"tgt": self.text(ids), "score": score,
             "tokens": [vocab.token_label(i) for i in self.model.module.output_ids(ids)]}
            for score, ids in found if score > -math.inf
        ]  # fmt: skip
        return {
            "src_tokens": [self.model.src_vocab.token_label(i) for i in sentence.ids],
            "beam": search.decoding.beam_size, "length_penalty": penalty,
            "prefix": [vocab.token_label(i) for i in sentence.prefix],
            "steps": steps, "finished": finished,
        }  # fmt: skip

    def what_if(
        self,
        sentence: Sentence,
        search: Search,
        step: int,
        layer: int,
        source: int,
        head: int | None = None,
        weights: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Seq2Seq-Vis's attention what-if: the greedy output, then the same with output step
        `step`'s cross-attention in `layer` (all heads, or `head`) forced onto source token
        `source` (or onto `weights`, (S,)), and greedy search going on from the token that
        step then takes. Both outputs with their scores (the model's, forced decoding)."""
        if self.backend != "torch":
            raise RequestError(
                "the attention what-if needs the checkpoint: serve it with python -m "
                "seq2seq.serve CKPT (CTranslate2 cannot change a step's attention)", status=501,
            )  # fmt: skip
        module, net = self.model.module, self.model.module.model
        config = net.config
        greedy = replace(search, decoding=replace(search.decoding, beam_size=1), n_best=1)
        before = module.output_ids(self.generate([sentence], greedy)[0][0][1])
        name = f"cross attention layer {layer}"
        try:
            attention = dict(net.named_modules())[net.attention_module("cross", layer)]
        except ValueError as error:
            raise RequestError(f"layer: {error}") from None
        bounds = (("step", step, len(before)), ("source", source, len(sentence.ids)),
                  ("head", head, config.num_heads))  # fmt: skip
        for what, value, size in bounds:
            if value is not None and not 0 <= value < size:
                raise RequestError(
                    f"{what} must be in 0-{size - 1} (the {name}'s output has {len(before)} "
                    f"steps, the source {len(sentence.ids)} tokens, the layer "
                    f"{config.num_heads} heads), got {value}"
                )
        device = self.model.device
        heads = torch.zeros(config.num_heads, dtype=torch.bool, device=device)
        heads[slice(None) if head is None else head] = True
        if weights is None:
            weights = torch.zeros(len(sentence.ids), device=device)
            weights[source] = 1.0
        src = torch.tensor([sentence.ids], device=device)
        tgt_in = torch.tensor([[config.bos_id, *before[:step]]], device=device)
        with torch.inference_mode(), self.model.heads(search.heads_off):
            with force_attention(attention, heads, weights):
                logits = net(src, tgt_in)[0, -1]
            logits[[config.pad_id, config.bos_id]] = -math.inf
            token = int(logits.argmax())
        forced = replace(sentence, prefix=[*before[:step], token], spell="",
                         limit=min(max(sentence.limit, step + 2), self.max_positions))  # fmt: skip
        after = module.output_ids(self.generate([forced], greedy)[0][0][1])
        vocab = self.model.tgt_vocab
        texts = [vocab.decode(before), vocab.decode(after)]
        scores = [
            self.score([sentence], [vocab.encode(t)], search)[0]["score"] if t.strip() else None
            for t in texts
        ]
        return {
            "tgt": texts[1], "score": scores[1], "before": texts[0], "before_score": scores[0],
            "step": step, "layer": layer, "head": head, "source": source,
            "source_token": self.model.src_vocab.token_label(sentence.ids[source]),
            "was": vocab.token_label(before[step]), "token": vocab.token_label(token),
        }  # fmt: skip

    def _reseed(self, seed: int) -> None:
        if self.backend == "torch":
            self.model.generator.manual_seed(seed)
        else:
            from seq2seq.export import import_ctranslate2

            import_ctranslate2().set_random_seed(seed)

    def text(self, ids: list[int]) -> str:
        return self.model.tgt_vocab.decode(ids)

    def attention(
        self, sentence: Sentence, search: Search, stop: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """The best output for one sentence and every layer's and head's attention while the
        model produces it: the data `inspect --attention` draws, as lists of numbers. stop:
        as generate's."""
        if self.backend != "torch":
            raise RequestError(
                "attention needs the checkpoint: serve it with python -m seq2seq.serve CKPT "
                "(a CTranslate2 export keeps no attention)",
                status=501,
            )
        module = self.model.module
        (_, best), *_ = self.generate([sentence], search, stop=stop)[0]
        output = module.output_ids(best)
        with self.model.heads(search.heads_off):
            maps = module.attention(sentence.ids, output) if sentence.ids else None
        src_vocab, tgt_vocab = self.model.src_vocab, self.model.tgt_vocab
        return {
            "src_tokens": [src_vocab.token_label(i) for i in sentence.ids],
            "tgt_tokens": [tgt_vocab.token_label(i) for i in output],
            "tgt": tgt_vocab.decode(output),
            **{
                kind: [layer.double().round(decimals=4).tolist() for layer in layers]
                for kind, layers in (maps or {"cross": [], "self": [], "encoder": []}).items()
            },
        }

    # --- /info ------------------------------------------------------------------------------

    def atlas(self) -> dict[str, Any]:
        """The head atlas `inspect CKPT --heads` wrote for this checkpoint (RUN/heads.json),
        or a one-line RequestError (404) saying how to make it."""
        from seq2seq.run_dir import RunDir

        run = RunDir.of_checkpoint(self.path) if self.backend == "torch" else None
        path = run.path / "heads.json" if run is not None else None
        how = f"python -m seq2seq.inspect {self.path} --heads"
        if path is None or not path.is_file():
            raise RequestError(f"no head atlas beside this checkpoint's run yet: {how}", 404)
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RequestError(f"{path} is not readable ({error}): {how} again", 404) from None
        if Path(found.get("checkpoint", "")).resolve() != self.path.resolve():
            raise RequestError(
                f"{path} is the atlas of {found.get('checkpoint')}, not of this checkpoint: "
                f"{how}", 404,
            )  # fmt: skip
        return found

    def info(self) -> dict[str, Any]:
        """What is loaded: the file and its hash, sizes, the languages or task, the tokenizer,
        the decoding defaults, the backend, and the run's test score with its signatures
        where the run recorded one (its summary.json beside the checkpoint's run)."""
        model = self.model
        if self.backend == "torch":
            weights, checkpoint = self.path, self.path
            config = model.module.config.to_dict()
            parameters = sum(p.numel() for p in model.module.model.parameters())
            run_config = _run_config(self.path)
        else:
            weights = self.path / "model.bin"
            about = json.loads((self.path / "seq2seq.json").read_text(encoding="utf-8"))
            config, checkpoint = about["model"], about.get("checkpoint")
            parameters = None
            run_config = _run_config(Path(checkpoint)) if checkpoint else {}
        corpus = run_config.get("data", {}).get("corpus", {})
        return {
            "backend": self.backend,
            "path": str(self.path.resolve()),
            "sha256": _sha256(weights),
            "seq2seq_version": __version__,
            "parameters": parameters,
            "model": config,
            "task": run_config.get("task_name"),
            "languages": _languages(corpus),
            "tokenizer": {
                "kind": model.src_vocab.kind,
                "src_vocab_size": len(model.src_vocab),
                "tgt_vocab_size": len(model.tgt_vocab),
            },
            "decoding": model.decoding.to_dict(),
            "max_positions": self.max_positions,
            **_tested(Path(checkpoint) if checkpoint else None),
        }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run_config(ckpt: Path) -> dict[str, Any]:
    """The run config a checkpoint saved ({} for one without, or one no longer there)."""
    from seq2seq.checkpoint import CheckpointError, load_checkpoint, run_record

    try:
        return run_record(load_checkpoint(ckpt, mmap=True))["run_config"] or {}
    except (CheckpointError, OSError, ValueError):
        return {}


def _languages(corpus: dict[str, Any]) -> dict[str, str] | None:
    """Source and target as the corpus names them (columns, languages), where it does."""
    for src, tgt in (("src_column", "tgt_column"), ("src_lang", "tgt_lang")):
        if corpus.get(src) and corpus.get(tgt):
            return {"src": corpus[src], "tgt": corpus[tgt]}
    return None


def _tested(ckpt: Path | None) -> dict[str, Any]:
    """The test metrics and sacreBLEU signatures of the run that tested this checkpoint
    (RUN/summary.json, where its tested checkpoint is this file), else none."""
    summary_path = ckpt.parent.parent / "summary.json" if ckpt else None
    if summary_path is None or not summary_path.is_file():
        return {"test": None, "signatures": None}
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        tested = summary.get("averaged_checkpoint") or summary.get("best_checkpoint")
        if tested and Path(tested).resolve() == ckpt.resolve():
            return {"test": summary["test"], "signatures": summary["signatures"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return {"test": None, "signatures": None}


class RunHistory:
    """Every checkpoint a run kept (RunDir.history: the best, the last, the weights at each
    recent validation), for `python -m seq2seq.serve RUN`: each loaded on first use, the `keep`
    most recently used kept in memory."""

    def __init__(self, run_dir: str | Path, device: str = "cpu", keep: int = 4) -> None:
        import collections

        from seq2seq.curves import kept_checkpoints

        kept = kept_checkpoints(run_dir)
        self.checkpoints = [
            {"name": path.name, "step": step, "val_bleu": bleu} for step, path, bleu in kept
        ]
        self.paths: dict[str, Path] = {path.name: path for _, path, _ in kept}
        tested = _tested_path(Path(run_dir))
        ran_test = tested is not None and tested.name in self.paths
        self.default = tested.name if ran_test else kept[-1][1].name  # else the last
        self.device, self.keep = device, keep
        self._engines: collections.OrderedDict[str, Engine] = collections.OrderedDict()
        self._lock = threading.Lock()  # the server loads in a thread, and looks up on its loop

    def holds(self, name: str) -> bool:
        """Whether checkpoint `name` is in memory now."""
        return name in self._engines

    def engine(self, name: str | None = None) -> Engine:
        """The Engine of checkpoint `name` (default: the run's tested checkpoint, else the
        last), or a one-line RequestError for a name the run lacks."""
        name = name or self.default
        if name not in self.paths:
            raise RequestError(
                f"checkpoint {name!r} is not one of this run's: {', '.join(self.paths)}"
            )
        with self._lock:  # held for lookups only: a load never holds up the event loop
            if name in self._engines:
                self._engines.move_to_end(name)
                return self._engines[name]
        engine = Engine(str(self.paths[name]), device=self.device)
        with self._lock:  # two loads of one checkpoint at once: the first kept
            engine = self._engines.setdefault(name, engine)
            self._engines.move_to_end(name)
            while len(self._engines) > self.keep:
                self._engines.popitem(last=False)
            return engine


def _tested_path(run: Path) -> Path | None:
    """The checkpoint a run's summary.json says it tested, or None."""
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        tested = summary.get("averaged_checkpoint") or summary.get("best_checkpoint")
        return Path(tested) if tested else None
    except (OSError, ValueError, AttributeError):
        return None
