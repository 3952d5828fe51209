"""The model a server answers from, and what it answers: a request's search settings checked as
translate checks its options, its sentences encoded as translate encodes them, searches run as
translate runs them, attention read from the checkpoint, and what /info says.

No web framework here: the batcher calls it from its worker thread, the app only to check a
request before it queues (seq2seq/serve/app.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from seq2seq import __version__
from seq2seq.core.decoding import Search
from seq2seq.data.tokenizer import clean
from seq2seq.translate import CheckpointModel, option_error, output_limit, search_for

__all__ = ["Engine", "RequestError", "Sentence", "Settings"]

# translate decodes its inputs in batches of this many (its --batch-size default): a sampling
# request is drawn in the same batches, so that its seed gives the same outputs.
TRANSLATE_BATCH = 64


class RequestError(ValueError):
    """A request the server cannot answer as asked: one line naming the field and the fix,
    and the HTTP status it answers with (422 by default)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Settings:
    """What a request may set: translate's search options, by the same names (n_best for
    --n-best). None: the model's own, as translate leaves it."""

    beam: int | None = None
    n_best: int = 1
    length_penalty: float | None = None
    max_len: int | None = None
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    truncate: bool = False


@dataclass
class Sentence:
    """One sentence of a request, encoded: its token ids (none for a blank one, which gets an
    empty output as in translate) and the most tokens its output may have."""

    ids: list[int]
    limit: int
    unknown: int


class Engine:
    """A checkpoint (our search) or a CTranslate2 export, loaded once."""

    def __init__(
        self,
        ckpt: str | None = None,
        model_dir: str | None = None,
        device: str = "cpu",
        compute_type: str | None = None,
        threads: int = 0,
    ) -> None:
        if (ckpt is None) == (model_dir is None):
            raise ValueError("serve needs a checkpoint (CKPT) or an export (--model DIR), one")
        if ckpt is not None:
            self.backend, self.path = "torch", Path(ckpt)
            self.model: Any = CheckpointModel(ckpt, device)
        else:
            from seq2seq.exported import ExportedModel, read_export  # CTranslate2: an extra

            self.backend, self.path = "ctranslate2", Path(model_dir)
            threads = threads or torch.get_num_threads()
            self.model = ExportedModel(model_dir, device, compute_type or "default", threads)
        self.max_positions: int = self.model.max_positions
        # The network's sizes, for what a search costs (search_bytes): the checkpoint's
        # ModelConfig, or what the export recorded of it.
        self.net: dict[str, Any] = (
            self.model.module.config.to_dict()
            if self.backend == "torch"
            else read_export(self.path)["model"]
        )

    # --- a request, checked before it queues ----------------------------------------------

    def search(self, settings: Settings) -> Search:
        """The Search translate would run for these options, or a one-line RequestError."""
        args = argparse.Namespace(
            **{k: v for k, v in asdict(settings).items() if k != "truncate"},
            batch_size=1, compute_type=None, ckpt=self.backend == "torch",
        )  # fmt: skip
        problem = option_error(args)
        if problem:
            # translate's words for its options, as the request's fields: --n-best -> n_best
            raise RequestError(re.sub(r"--([a-z-]+)", lambda m: m[1].replace("-", "_"), problem))
        return search_for(args, self.model.decoding)

    def encode(self, texts: list[str], settings: Settings, search: Search) -> list[Sentence]:
        """Each text as translate encodes an input line; too long for the model: an error
        naming the sentence and the limit, or cut with truncate."""
        sentences = []
        for index, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:  # JSON's "\ud800": a lone surrogate
                raise RequestError(
                    f"src[{index}] is not valid text: character {error.start} is a lone "
                    f"surrogate ({text[error.start]!a}), which no UTF-8 text holds: send the "
                    "whole character (both halves of its pair) or drop it"
                ) from None
            cleaned = clean(text)
            ids = self.model.src_vocab.encode(cleaned) if cleaned else []
            if len(ids) > self.max_positions:
                if not settings.truncate:
                    raise RequestError(
                        f"src[{index}] has {len(ids)} tokens, more than the model's "
                        f'{self.max_positions}: shorten it, or send "truncate": true to cut it'
                    )
                ids = ids[: self.max_positions]
            limit = output_limit(len(ids), search, self.max_positions, settings.max_len)
            unknown = sum(i == self.model.src_vocab.unk_id for i in ids)
            sentences.append(Sentence(ids, limit, unknown))
        return sentences

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

    # --- the worker's side -----------------------------------------------------------------

    def generate(
        self,
        sentences: list[Sentence],
        search: Search,
        seed: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[list[tuple[float, list[int]]]]:
        """Per sentence, (score, token ids) pairs, best first; blank sentences get an empty
        output. With sampling, seed starts a new draw, made in translate's batches. stop is
        asked between the search's steps: True ends it with SearchStopped."""
        out: list[list[tuple[float, list[int]]]] = [
            [(math.nan, [])] * search.n_best for _ in sentences
        ]
        todo = [i for i, sentence in enumerate(sentences) if sentence.ids]
        if search.sampling is not None and seed is not None:
            self._reseed(seed)
        size = TRANSLATE_BATCH if search.sampling is not None else max(len(todo), 1)
        with torch.inference_mode():
            for start in range(0, len(todo), size):
                part = todo[start : start + size]
                rows = [sentences[i].ids for i in part]
                limits = [sentences[i].limit for i in part]
                found = self.model.generate(rows, limits, search, stop)
                for i, hyps in zip(part, found, strict=True):
                    out[i] = hyps
        return out

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
