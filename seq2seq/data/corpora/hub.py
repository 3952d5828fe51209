"""A HuggingFace hub dataset with a translation column (online the first time)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from datasets import DatasetDict

from seq2seq.data.corpora.common import SPLITS
from seq2seq.data.tokenizer import clean


class HubCorpus:
    """A hub dataset with a translation column ({lang: text}), e.g. name=wmt/wmt14
    subset=de-en src_lang=en tgt_lang=de. Needs the network the first time; offline (or with
    the hub unreachable) it fails at once with a message, never waits.
    """

    def __init__(
        self,
        name: str,
        src_lang: str,
        tgt_lang: str,
        subset: str | None = None,
        column: str = "translation",
        revision: str | None = None,
    ) -> None:
        if not name:
            raise ValueError("data.corpus.name is empty: give a hub dataset, e.g. wmt/wmt14")
        self.name, self.subset, self.revision = name, subset, revision
        self.src_lang, self.tgt_lang, self.column = src_lang, tgt_lang, column

    def load(self, data_dir: Path) -> DatasetDict:
        from datasets import load_dataset

        offline = any(
            os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
            for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        )
        if not offline:
            _check_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        try:
            loaded = load_dataset(
                self.name, self.subset, revision=self.revision, cache_dir=str(data_dir / "hub")
            )
        except Exception as error:  # datasets raises many kinds; all mean "not available"
            reason = "offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set) and not cached"
            raise ValueError(
                f"cannot load hub dataset {self.name!r}: "
                f"{reason if offline else ' '.join(str(error).split())[:200]}; "
                "use data=parallel_files with local files instead"
            ) from None
        out = {}
        for split, dataset in loaded.items():
            name = {"dev": "validation", "valid": "validation"}.get(split, split)
            if name in SPLITS:
                out[name] = dataset.map(
                    _translation_pair, remove_columns=dataset.column_names,
                    fn_kwargs={"column": self.column, "src": self.src_lang, "tgt": self.tgt_lang},
                )  # fmt: skip
        if "train" not in out:
            raise ValueError(f"hub dataset {self.name!r} has no train split: {list(loaded)}")
        return DatasetDict(out)


def _translation_pair(example: dict[str, Any], column: str, src: str, tgt: str):
    pair = example[column]
    return {"src": clean(pair[src]), "tgt": clean(pair[tgt])}


def _check_reachable(endpoint: str, timeout: float = 5.0) -> None:
    url = urlparse(endpoint)
    host, port = url.hostname or endpoint, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        raise ValueError(
            f"cannot reach the hub at {endpoint} ({error}); work offline with "
            "data=parallel_files, or set HF_HUB_OFFLINE=1 to use a cached copy"
        ) from None
