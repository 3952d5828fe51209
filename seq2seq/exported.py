"""A model directory written by seq2seq.export, translating with CTranslate2.

translate's --model path: the same tokenizers, length rule and decoding defaults as the
checkpoint it came from, with CTranslate2's search in place of seq2seq.core.decoding. Token ids go
in and come out (mapped to and from CTranslate2's token strings), so tokenizing, detokenizing
and the <unk> warnings are the PyTorch path's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seq2seq import checks
from seq2seq.core.decoding import DecodingConfig, Search, SearchStopped
from seq2seq.data.tokenizer import load_tokenizer
from seq2seq.export import EXPORT_FILE, EXPORT_FORMAT, import_ctranslate2, token_strings

__all__ = ["ExportedModel"]


class ExportedModel:
    """Loads DIR (model.bin, the vocabularies, the tokenizers, seq2seq.json).

    Args:
        path: the directory seq2seq.export wrote.
        device: "cpu", "cuda" or "cuda:N".
        compute_type: CTranslate2's type to compute in ("default": the exported weights' type;
            "int8" quantizes a float32 export as it loads).
        threads: CTranslate2's intra_threads (0: its default).
        seed: for sampling.
    """

    def __init__(
        self,
        path: str | Path,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
        seed: int = 0,
    ) -> None:
        ctranslate2 = import_ctranslate2()
        path = Path(path)
        about = read_export(path)
        self.src_vocab = _tokenizer(path / "src_tokenizer.json")
        self.tgt_vocab = _tokenizer(path / "tgt_tokenizer.json")
        self.max_positions: int = about["model"]["max_positions"]
        try:
            self.decoding = DecodingConfig(**about["decoding"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path / EXPORT_FILE} has bad decoding settings: {error}") from None
        self._src_tokens = token_strings(self.src_vocab)
        tgt_tokens = token_strings(self.tgt_vocab)
        _check_matches_model(path, "src", self._src_tokens)
        _check_matches_model(path, "tgt", tgt_tokens)
        self._tgt_tokens = tgt_tokens
        self._tgt_ids = {token: i for i, token in enumerate(tgt_tokens)}
        kind, _, index = device.partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise ValueError(
                f"--device for a CTranslate2 model is cpu, cuda or cuda:N, got {device}"
            )
        try:
            self.translator = ctranslate2.Translator(
                str(path), device=kind, device_index=int(index or 0),
                compute_type=compute_type, intra_threads=threads,
            )  # fmt: skip
        except (RuntimeError, ValueError) as error:
            detail = " ".join(str(error).split())
            raise ValueError(f"CTranslate2 cannot load {path}: {detail}") from None
        ctranslate2.set_random_seed(seed)

    def generate(
        self,
        rows: list[list[int]],
        max_len: int | list[int],
        search: Search,
        stop: Callable[[], bool] | None = None,
        prefixes: list[list[int]] | None = None,
        spell: list[str] | None = None,
    ) -> list[list[tuple]]:
        """Per source row of token ids, a list of (score, token ids) pairs, best first: the
        search translate asks for, as CTranslate2's options. max_len: one for every row, or one
        a row (CTranslate2 takes one a call: the rows are searched in a call a limit). stop is
        asked before each call, and after every token of a greedy or sampled one (CTranslate2
        asks no callback within a beam search): True raises SearchStopped. prefixes: the
        tokens each output begins with (CTranslate2's target_prefix); `spell` (a healed
        prefix's last word) it cannot take."""
        if spell is not None and any(spell):
            raise ValueError("CTranslate2 cannot restrict a step's tokens: send heal false")
        if search.heads_off:
            raise ValueError("CTranslate2 cannot switch heads off: serve the checkpoint")
        if stop is not None and stop():
            raise SearchStopped("the search was stopped before CTranslate2's call")
        if isinstance(max_len, list):
            out: list[list[tuple]] = [[] for _ in rows]
            for limit in sorted(set(max_len)):
                indices = [i for i, own in enumerate(max_len) if own == limit]
                found = self.generate(
                    [rows[i] for i in indices], limit, search, stop,
                    None if prefixes is None else [prefixes[i] for i in indices],
                )  # fmt: skip
                for i, hyps in zip(indices, found, strict=True):
                    out[i] = hyps
            return out
        source = [[self._src_tokens[i] for i in row] for row in rows]
        options: dict[str, Any] = {
            "max_decoding_length": max_len,
            # Ours lets EOS come first (an empty output); CTranslate2's default min is 1.
            "min_decoding_length": 0,
            "return_scores": True,
        }
        if search.sampling is not None:
            s = search.sampling
            options.update(
                beam_size=1, sampling_topk=s.top_k, sampling_topp=s.top_p,
                sampling_temperature=s.temperature,
            )  # fmt: skip
        else:
            options.update(
                beam_size=search.decoding.beam_size, num_hypotheses=search.n_best,
                length_penalty=search.decoding.length_penalty,
            )  # fmt: skip
        if stop is not None and options.get("beam_size", 1) == 1:
            # CTranslate2 asks this after every token of a greedy or sampled search (not of a
            # beam search); True ends that sentence's search, and the call raises below.
            options["callback"] = lambda step: stop()
        if prefixes is not None and any(prefixes):
            options["target_prefix"] = [[self._tgt_tokens[i] for i in row] for row in prefixes]
        results = self.translator.translate_batch(source, **options)
        if stop is not None and stop():
            raise SearchStopped("the search was stopped during CTranslate2's call")
        found = [
            [
                (score, [self._tgt_ids[token] for token in tokens])
                for score, tokens in zip(result.scores, result.hypotheses, strict=True)
            ]
            for result in results
        ]
        if "target_prefix" in options and search.sampling is None:
            found = self._whole_scores(rows, found, max_len, search.decoding.length_penalty)
        return found

    def _whole_scores(self, rows: list, found: list, max_len: int, penalty: float) -> list:
        """CTranslate2 scores a search from a target_prefix by the tokens after the prefix
        alone; ours, and what is reported, counts the whole output (the prefix's tokens too),
        as forced decoding of it does: each hypothesis scored again so, with score_batch."""
        pairs = [(row, ids) for row, hyps in zip(rows, found, strict=True) for _, ids in hyps]
        whole = iter(self.score([row for row, _ in pairs], [ids for _, ids in pairs]))
        out = []
        for hyps in found:
            rescored = []
            for _, ids in hyps:
                logprobs = next(whole)
                if len(ids) >= max_len:  # cut at the limit: no EOS
                    logprobs = logprobs[: len(ids)]
                rescored.append((sum(logprobs) / max(len(logprobs), 1) ** penalty, ids))
            out.append(rescored)
        return out

    def score(
        self, rows: list[list[int]], targets: list[list[int]], heads_off: tuple = ()
    ) -> list[list[float]]:
        """Per (source, target) pair, the log-probability of each target token and of the
        EOS after them: CTranslate2's score_batch (which cannot switch heads off)."""
        if heads_off:
            raise ValueError("CTranslate2 cannot switch heads off: serve the checkpoint")
        results = self.translator.score_batch(
            [[self._src_tokens[i] for i in row] for row in rows],
            [[self._tgt_tokens[i] for i in target] for target in targets],
            max_input_length=0,
        )
        return [list(result.log_probs) for result in results]


def read_export(path: Path) -> dict[str, Any]:
    """seq2seq.json of an export, with one-line errors for a directory that is not one."""
    hint = f"export a checkpoint with: python -m seq2seq.export CKPT --out {path}"
    if not path.is_dir():
        raise ValueError(f"--model {path} is not a directory; {hint}")
    about_path = path / EXPORT_FILE
    if not about_path.is_file():
        raise ValueError(
            f"--model {path} is not a seq2seq export (it has no {EXPORT_FILE}); {hint}"
        )
    try:
        about = json.loads(about_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{about_path} is not valid JSON ({error}); {hint}") from None
    found = about.get("format") if isinstance(about, dict) else None
    if found != EXPORT_FORMAT:
        raise ValueError(
            f"{path} is export format {found!r}; this version reads format {EXPORT_FORMAT}: {hint}"
        )
    model, decoding = about.get("model"), about.get("decoding")
    if not (isinstance(model, dict) and checks.is_integer(model.get("max_positions"))):
        raise ValueError(f"{about_path} lacks model.max_positions (an integer): {hint} again")
    if not isinstance(decoding, dict):
        raise ValueError(f"{about_path} lacks its decoding settings: {hint} again")
    return about


def _check_matches_model(path: Path, side: str, tokens: list[str]) -> None:
    """The tokenizer's tokens, id for id, are those CTranslate2's model was saved with (its
    {shared,source,target}_vocabulary.json): a tokenizer file of another model would give
    other ids, or ids the model lacks."""
    name = "source" if side == "src" else "target"
    vocabulary = path / f"{name}_vocabulary.json"
    if not vocabulary.is_file():
        vocabulary = path / "shared_vocabulary.json"
    tokenizer = path / f"{side}_tokenizer.json"
    hint = f"export the checkpoint again (python -m seq2seq.export CKPT --out {path})"
    try:
        model_tokens = json.loads(vocabulary.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        detail = " ".join(str(error).split())[:200]
        raise ValueError(f"{vocabulary} is not readable ({detail}): {hint}") from None
    if model_tokens != tokens:
        if not isinstance(model_tokens, list):
            raise ValueError(f"{vocabulary} is not a list of tokens: {hint}")
        differ = next(
            (i for i, (a, b) in enumerate(zip(tokens, model_tokens, strict=False)) if a != b),
            min(len(tokens), len(model_tokens)),
        )
        raise ValueError(
            f"{tokenizer} is not the tokenizer of this model: {len(tokens):,} tokens against "
            f"the {len(model_tokens):,} of {vocabulary.name}, first different at id {differ}; "
            f"{hint}"
        )


def _tokenizer(path: Path) -> Any:
    """A tokenizer file of the export, with one-line errors naming it."""
    hint = f"export the checkpoint again (python -m seq2seq.export CKPT --out {path.parent})"
    if not path.is_file():
        raise ValueError(f"{path} is missing: {hint}")
    try:
        return load_tokenizer(path)
    except Exception as error:  # bad JSON, missing keys, the tokenizers library's own errors
        detail = " ".join(str(error).split())[:200]
        raise ValueError(f"{path} is not a readable tokenizer ({detail}): {hint}") from None
