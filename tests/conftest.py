"""Shared test settings: never touch the network, keep torch to the cores we have."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import compose_train
from omegaconf import DictConfig

COMPILE_TEST = "test_compiled_model_trains_on_the_cpu"
_compile_check: dict = {}


# pytest-xdist runs the suite in one worker per core (pyproject's addopts): each worker and the
# processes it starts get their share of the cores, or the workers' torch threads would fight
# over them (two torch processes with a thread per core each slow each other several times).
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    torch.set_num_threads(max(1, CORES // WORKERS))
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per core, at most four. Each worker trains its own copy of the
    session's shared run and holds a few GiB at its peak; past four the longest test files
    set the suite's time, not the workers."""
    return min(4, CORES)


# The modules with tests that train for tens of seconds, longest first (seconds a module takes,
# summed from `pytest --durations=0`: 80, 75, 61, 59, 24, 20, 16, 7 on the Zen 4). With workers
# they go out first (xdist hands out modules in collection order: pyproject's
# --no-loadscope-reorder), so the suite does not end with one worker on one of them while the
# others idle.
LONG_MODULES = [
    "test_resume.py", "test_clock.py", "test_scale.py", "test_train.py", "test_export.py",
    "test_serve_attacks.py", "test_shipped_corpus.py", "test_tested_checkpoint.py",
]  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if WORKERS > 1:
        rank = {name: i for i, name in enumerate(LONG_MODULES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as is


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without workers (`pytest -n 0`), start tests/compile_check.py in the background as soon
    as the torch.compile test is collected: niced, so the tests in front of it keep their share
    of the CPU, and on one thread. The test collects its result (the compile_check fixture)."""
    if session.config.option.collectonly or WORKERS > 1:
        return  # with a worker per core no core is idle: the fixture runs the check itself
    if any(item.name == COMPILE_TEST for item in session.items):
        start_compile_check(nice=True)


def start_compile_check(nice: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="seq2seq-compile-check-"))
    _compile_check["work"] = work
    _compile_check["process"] = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "compile_check.py"), str(work)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"} if nice else None,
        preexec_fn=(lambda: os.nice(19)) if nice else None,
    )  # fmt: skip


def pytest_sessionfinish(session: pytest.Session) -> None:
    process = _compile_check.get("process")
    if process is not None and process.poll() is None:
        process.kill()
        process.communicate()
    if "work" in _compile_check:
        shutil.rmtree(_compile_check["work"], ignore_errors=True)


@pytest.fixture(scope="session")
def compile_check() -> dict:
    """What tests/compile_check.py found: the first step's loss eager and compiled, and the
    graphs dynamo captured."""
    if "process" not in _compile_check:
        start_compile_check(nice=False)
    process = _compile_check["process"]
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One dataset cache for the whole session, as under data/ for a user."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[dict, DictConfig]:
    """One real training run on the copy task (15-30 s on one core), shared by every test that
    needs a trained checkpoint."""
    from train import train

    tmp_path = tmp_path_factory.mktemp("copy_run")
    overrides = [
        "data.corpus.max_length=6",
        "data.corpus.train_size=4000",
        "data.corpus.val_size=200",
        "data.corpus.test_size=500",
        "trainer.max_epochs=6",
        # The tiny model's recipe of before the defaults were tuned for `python train.py`'s
        # 408 steps: on this smaller, repeated data 5e-3 ends at 97.8% exact match.
        "model.training.lr=3e-3",
        "model.training.warmup_steps=100",
    ]
    cfg = compose_train(tmp_path, data_dir, overrides)
    return train(cfg), cfg


def _untracked(root: Path) -> set[str] | None:
    """The checkout's untracked files that git does not ignore (None outside a git checkout)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    return set(listed.stdout.splitlines()) if listed.returncode == 0 else None


@pytest.fixture(scope="session", autouse=True)
def the_checkout_stays_clean():
    """No test leaves a file in the checkout (a run's output, a validation's pairs): every test
    writes under its tmp_path. Checked once the session's tests are done."""
    root = Path(__file__).resolve().parents[1]
    before = _untracked(root)
    yield
    after = _untracked(root)
    if before is not None and after is not None:
        left = sorted(after - before)
        assert not left, f"the tests left files in the checkout: {left[:5]}"
