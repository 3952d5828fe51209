"""Helpers the test files share (fixtures live in conftest.py)."""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"


def compose_train(tmp_path: Path, data_dir: Path, overrides: list[str]) -> DictConfig:
    """The real train.yaml with the given overrides, writing under tmp_path."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.root_dir = str(tmp_path)
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.log_dir = str(tmp_path)
        cfg.paths.data_dir = str(data_dir)
        del cfg.hydra
    return cfg


SYMBOL_TASKS = ("copy", "reverse", "sort")
# The training shell's packages, which the model, its search and the tools never import.
TRAINING_SHELL = ("lightning", "lightning_fabric", "pytorch_lightning", "hydra", "omegaconf",
                  "torchmetrics")  # fmt: skip


def same_scores(got: dict[str, float], expected: dict[str, float]) -> bool:
    """Two runs' test metrics are the same weights' scores: the same names, each value equal to
    1e-5 of itself (the same weights read into another process's memory may round their last
    bits otherwise; the wrong weights, or another search, differ by far more)."""
    return set(got) == set(expected) and all(
        got[name] == pytest.approx(value, rel=1e-5, abs=1e-9) for name, value in expected.items()
    )


def small_data(option: str, tmp_path: Path) -> list[str]:
    """Overrides that make data option `option` small enough for a test run."""
    if option in (*SYMBOL_TASKS, "numbers", "dates"):  # generated: the corpus has the sizes
        return ["data.corpus.train_size=256", "data.corpus.val_size=32", "data.corpus.test_size=32"]
    if option == "parallel_files":
        path = tmp_path / "pairs.tsv"
        rows = [f"{i} {i + 1}\t{i + 1} {i}" for i in range(300)]
        path.write_text("src\ttgt\n" + "\n".join(rows) + "\n", encoding="utf-8")
        return [f"data.corpus.train.file={path}", "data.corpus.src_column=src",
                "data.corpus.tgt_column=tgt", "data.val_size=32", "data.test_size=32",
                "data.tokenizer.vocab_size=300", "data.max_length=60"]  # fmt: skip
    if option == "hub":
        return ["data.corpus.name=nobody/no-such-dataset"]
    raise ValueError(f"no small settings for data={option}")


def experiment_data(experiment: str) -> str:
    """The data option an experiment config selects (its `override /data:` line, or that of
    the experiment it starts from: `defaults: [- other]`)."""
    text = (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()
    if "override /data:" in text:
        return text.split("override /data:")[1].split()[0]
    return experiment_data(text.split("defaults:")[1].split("- ")[1].split()[0])


def run_train_cli(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """`python train.py ARGS` started in cwd, run in this process (no interpreter start-up
    and imports to pay); returns the exit code. Output goes to capsys/capfd as usual."""
    import train as entry

    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    try:
        entry.cli()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    return 0


def budgeted_run(seconds: int, validations: int, share: float = 0.2) -> list[str]:
    """Overrides of a copy-task run that spends a time budget of `seconds` as the real-text
    recipe does: a warmup that 100,000 steps would end but `share` of the time ends first, the
    cosine to the budget's end, `validations` by the clock, and dropout 0.1 that the first
    validation turns off (1,000 epochs are never bought: 600 pairs make dozens)."""
    return [
        "data.corpus.train_size=600", "data.corpus.val_size=200", "data.corpus.test_size=200",
        f"trainer.max_time=00:00:00:{seconds:02d}", "trainer.max_epochs=-1",
        "trainer.log_every_n_steps=1", "model.training.schedule=cosine",
        "model.training.min_lr_ratio=0.1", "model.training.warmup_steps=100000",
        f"model.training.warmup_share={share}", f"validations={validations}",
        "model.net.dropout=0.1", "model.training.dropout_min_epochs=1000",
    ]  # fmt: skip


def clocked_budget(seconds: float, clock: dict[str, float]):
    """A TimeBudget callback of `seconds` whose training time is clock["elapsed"], as if
    trainer.max_time had set it (no Trainer): for driving the schedule by hand."""
    from types import SimpleNamespace

    from seq2seq.training.callbacks import TimeBudget
    from seq2seq.training.lightning_fields import LightningTimer

    budget = TimeBudget()
    timer = SimpleNamespace(time_elapsed=lambda stage: clock["elapsed"], _duration=seconds)
    budget.start(LightningTimer(timer))
    return budget


# Debian's chromium as root, headless, with no network of its own to reach for.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]  # fmt: skip


def drive_page(
    url: str, text: str, out: Path, kind: str = "cross", layer: int | None = None,
    head: int | str | None = None, size: tuple[int, int] = (1280, 800), beam: int | None = None,
) -> dict:  # fmt: skip
    """Open the server's page in chromium (Playwright, through its executable path), type
    text, click Translate, choose the heat map's kind, layer and head, save a screenshot to
    out; returns what the page shows: the output, the error, the table's kind, layer and head,
    its row and column labels, and its cells' values."""
    with translated_page(url, text, size, beam) as page:
        page.select_option("#kind", value=kind)
        # By position: Playwright matches a string against values and labels alike, and
        # the page labels layer i and head i as i + 1 (the head's first option: the mean).
        if layer is not None:
            page.select_option("#layer", index=layer)
        if head is not None:
            page.select_option("#head", index=0 if head == "mean" else int(head) + 1)
        page.screenshot(path=str(out), full_page=True)
        table = page.locator("#heatmap-table")
        return {
            "tgt": page.inner_text("#tgt"),
            "error": page.inner_text("#error").strip(),
            "table": {k: table.get_attribute(f"data-{k}") for k in ("kind", "layer", "head")},
            "rows": page.locator("#heatmap-table tbody th").all_inner_texts(),
            "cols": page.locator("#heatmap-table thead th span").all_inner_texts(),
            "cells": [
                row.locator("td").evaluate_all("cells => cells.map(c => c.dataset.value)")
                for row in page.locator("#heatmap-table tbody tr").all()
            ],
        }


def need_chromium() -> None:
    """Skip a browser test where chromium is missing; in CI (which installs it), fail."""
    import os
    import shutil

    import pytest

    if not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")


@contextmanager
def translated_page(
    url: str, text: str, size: tuple[int, int] = (1280, 1000), beam: int | None = None
) -> Iterator[Any]:
    """The server's page in chromium (Playwright, through its executable path) with text
    translated (at this beam, or the page's default) and its heat map drawn: a Playwright
    Page, closed on exit."""
    import shutil

    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS
        )
        try:
            page = browser.new_page(viewport={"width": size[0], "height": size[1]})
            page.goto(f"{url}/")
            page.wait_for_selector("#beam")  # the controls /info's settings make
            page.fill("#src", text)
            if beam is not None:
                page.fill("#beam", str(beam))
            page.click("#go")
            page.wait_for_selector("#heatmap-table", timeout=60_000)
            yield page
        finally:
            browser.close()


def drive_explore(
    url: str, text: str, own: str, out: Path, beam: int = 3, step: int = 1,
    size: tuple[int, int] = (1280, 1000), top_k: int | None = None, word: str | None = None,
) -> dict:  # fmt: skip
    """Open the page in chromium, translate text at this beam, show the search as a tree,
    click the first pruned alternative at `step` (0: the first word; or the alternative
    `word` there), then score `own` as your translation; save a screenshot to out. Returns
    the prefix clicked, the output it gave, the score shown for `own`, and the page's error
    line."""
    with translated_page(url, text, size, beam) as page:
        if top_k is not None:
            page.fill("#tree-top-k", str(top_k))
        page.click("#tree-go")
        page.wait_for_selector("#tree-svg", timeout=60_000)
        which = f'[data-token="{word}"]' if word is not None else ":not(.kept)"
        alternative = page.locator(f'#tree-svg .alt[data-step="{step}"]{which}').first
        prefix = alternative.get_attribute("data-prefix")
        alternative.click()
        page.wait_for_selector("#branch-tgt", timeout=60_000)
        page.fill("#own", own)
        page.click("#score-own")
        page.wait_for_selector("#own-score", timeout=60_000)
        page.screenshot(path=str(out), full_page=True)
        return {
            "prefix": prefix,
            "branched": page.inner_text("#branch-tgt"),
            "own_score": float(page.get_attribute("#own-score", "data-score")),
            "error": page.inner_text("#error").strip(),
        }


class ServeProcess:
    """`python -m seq2seq.serve ARGS --port 0` in its own process on 127.0.0.1 (the serve
    tests, bench/serve_http.py and docs/page_picture.py start servers this way). Its output is
    kept in `output`; ready() returns once it listens and answers /health."""

    def __init__(self, *args: str) -> None:
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, "-m", "seq2seq.serve", *args, "--port", "0"], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.output: list[str] = []
        self.url = ""

    def ready(self, seconds: float = 120) -> ServeProcess:
        import re
        import threading
        import time

        import httpx

        deadline = time.monotonic() + seconds
        while not self.url:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the server ended: {''.join(self.output)[-3000:]}")
            self.output.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
            self.url = found[1] if found else ""
        threading.Thread(
            target=self.output.extend, args=(self.process.stdout,), daemon=True
        ).start()
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.url} never answered /health")

    def _keep_output(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)

    def stop(self) -> int:
        """SIGTERM (it drains what is in flight), then its exit code."""
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def need(module: str):
    """The module, or a skip of the test module where it is not installed (a failure in CI)."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(
            f"{module} is not installed (pip install -e '.[serve]')", allow_module_level=True
        )


def one_line_error(response, status: int) -> str:
    """The one-line error a response with this status holds."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"], body
    return body["error"]


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


def refused(args: list[str], run_dir: Path, monkeypatch, capsys) -> str:
    """Run `python train.py ARGS` in run_dir's parent; it must exit 1 with one line and leave
    every file where and as it was."""
    before = snapshot(run_dir.parent)
    assert run_train_cli(args, run_dir.parent, monkeypatch) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert snapshot(run_dir.parent) == before
    return err[0]


def metrics_without_time(run_dir: Path) -> list[dict[str, str]]:
    """Every row of every start's metrics.csv, with the training time's column left out."""
    from seq2seq import metric_names
    from seq2seq.run_dir import RunDir

    rows = []
    for path in RunDir(run_dir).metrics_files():
        with open(path) as f:
            rows += [
                {k: v for k, v in row.items() if k != metric_names.TIME and v != ""}
                for row in csv.DictReader(f)
            ]
    return rows


class SlowFirstInterval:
    """Test-only callback (`+callbacks.slow._target_=helpers.SlowFirstInterval`): sleeps
    `seconds` after every training step until the first validation, as a machine shared with
    other work for a run's first minutes is slow."""

    def __new__(cls, seconds: float):  # a Lightning Callback, imported only when a run makes one
        import time

        from lightning.pytorch.callbacks import Callback

        class Slow(Callback):
            validated = False

            def on_train_batch_end(self, *args: Any) -> None:
                if not self.validated:
                    time.sleep(seconds)

            def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
                self.validated = self.validated or not trainer.sanity_checking

        return Slow()
