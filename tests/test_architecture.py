"""The architecture holds: the package's layers (seq2seq/core, seq2seq/data, the tools and
the checkpoint at the top, seq2seq/training) import one way, with no cycle (lazy imports inside
functions included); the core is plain PyTorch; the tools and the checkpoint never import the
training shell (Lightning, Hydra, OmegaConf, torchmetrics, seq2seq.training), not even lazily.

Read from the source with `ast`, so every import counts, whichever branch runs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT, TRAINING_SHELL

PACKAGE = ROOT / "seq2seq"
SHELL = set(TRAINING_SHELL)
# What translate, inspect, export, average and score need to read a checkpoint and use it.
TOOLS = ["translate", "inspect", "export", "exported", "average", "score", "checkpoint", "hparams",
         "cli", "files", "curves", "plots", "run_dir", "metric_names", "data.tokenizer", "serve",
         "serve.cli", "serve.app", "inference", "serve.batcher"]  # fmt: skip
# What the core may import from outside itself: torch and a few of Python's own modules
# (difflib: seq2seq.checks.nearest, on an error).
CORE_OUTSIDE = {"torch", "math", "dataclasses", "typing", "collections", "contextlib",
                "__future__", "functools", "difflib"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """What importing module `name` may import: every import statement in it (at the top or
    inside a function), and the packages that hold it."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .corpora import y
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:  # from seq2seq import checks: the module, if it is one
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return (found | parents) - {name}


GRAPH = {name: {i for i in imports(name) if i in MODULES} for name in MODULES}


def test_the_package_has_no_import_cycle() -> None:
    """Depth-first search over the package's imports; a module met again on the current path
    closes a cycle, reported as the chain of modules."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for imported in sorted(GRAPH[name] - {name}):
            if imported.startswith(name + ".") and MODULES[name].name == "__init__.py":
                continue  # a package's lazy __getattr__ names its modules: not an import
            visit(imported, [*path, name])
        done.add(name)

    for name in sorted(MODULES):
        visit(name, [])


def reachable(name: str) -> set[str]:
    """Every module importing `name` may import, transitively (the package's own modules and
    the top-level names of everything else)."""
    seen, todo, outside = set(), [name], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for imported in imports(current):
            if imported in MODULES:
                todo.append(imported)
            else:
                outside.add(imported.split(".")[0])
    return seen | outside


def layer(prefix: str) -> list[str]:
    names = sorted(n for n in MODULES if n == prefix or n.startswith(prefix + "."))
    assert names, f"no modules under {prefix}"
    return names


CORE = layer("seq2seq.core")
TRAINING = layer("seq2seq.training")


@pytest.mark.parametrize("name", [*CORE, *(f"seq2seq.{tool}" for tool in TOOLS)])
def test_the_core_and_the_tools_never_import_the_training_shell(name: str) -> None:
    found = reachable(name)
    assert not found & SHELL, f"{name} may import {sorted(found & SHELL)}"
    assert not found & set(TRAINING), f"{name} may import {sorted(found & set(TRAINING))}"


@pytest.mark.parametrize("name", CORE)
def test_the_core_imports_only_torch_and_itself(name: str) -> None:
    found = reachable(name)
    outside = {m for m in found if not m.startswith("seq2seq")}
    assert outside <= CORE_OUTSIDE, f"{name} may import {sorted(outside - CORE_OUTSIDE)}"
    ours = {m for m in found if m.startswith("seq2seq.")} - set(CORE) - {"seq2seq.checks"}
    assert not ours, f"{name} may import {sorted(ours)}: the core stands on torch alone"


def test_the_web_framework_is_imported_by_the_serve_tool_alone() -> None:
    """FastAPI and uvicorn (the extra `serve`) only under seq2seq/serve, so nothing else
    needs them installed."""
    for name in MODULES:
        outside = {m.split(".")[0] for m in imports(name)} & {"fastapi", "uvicorn", "starlette"}
        assert not outside or name.startswith("seq2seq.serve"), f"{name} imports {outside}"


def test_only_the_command_line_tools_import_cli() -> None:
    """seq2seq.cli is how a tool meets its command line (one-line errors, exit codes, SIGTERM);
    data, training and the library never need it (files have their home in seq2seq.files)."""
    tools = {"seq2seq.translate", "seq2seq.inspect", "seq2seq.export", "seq2seq.average",
             "seq2seq.score", "seq2seq.serve.cli"}  # fmt: skip
    importers = {name for name, imported in GRAPH.items() if "seq2seq.cli" in imported}
    assert importers <= tools, f"{sorted(importers - tools)} import seq2seq.cli"
    assert importers, "the graph found no importer of seq2seq.cli at all"


def test_the_run_config_is_read_at_the_door_alone() -> None:
    """The run config (OmegaConf nodes) is read by train.py, its command-line check (launch)
    and preflight; everything past them gets plain values (Hydra's _convert_ for what it
    instantiates), so following a setting ends there."""
    readers = {name for name in MODULES if "omegaconf" in {m.split(".")[0] for m in imports(name)}}
    assert readers == {"seq2seq.training.launch", "seq2seq.training.preflight"}, sorted(readers)


def test_nothing_in_the_package_imports_the_training_shell_but_itself() -> None:
    for name in sorted(set(MODULES) - set(TRAINING)):
        found = GRAPH[name] & set(TRAINING)
        assert not found, f"{name} imports {sorted(found)}: only train.py and seq2seq.training may"


def test_the_graph_sees_lazy_imports() -> None:
    """The check above would pass vacuously if function-level imports were missed."""
    assert "seq2seq.exported" in imports("seq2seq.inference")  # imported inside a function
    assert "lightning" in reachable("seq2seq.training.module")


# --- one source of every default ----------------------------------------------------------------

MODEL_CONFIGS = ROOT / "configs" / "model"


def dataclass_defaults() -> dict:
    """Every module setting's default as the dataclasses hold it, shaped like the config:
    {group: {name: default}} for net, training and decoding."""
    from dataclasses import MISSING, asdict, fields

    from seq2seq.core.decoding import DecodingConfig
    from seq2seq.core.model import ModelConfig
    from seq2seq.hparams import TrainingConfig

    data_given = {"src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"}
    net = {f.name: f.default for f in fields(ModelConfig) if f.name not in data_given}
    assert MISSING not in net.values()
    training = {
        k: list(v) if isinstance(v, tuple) else v for k, v in asdict(TrainingConfig()).items()
    }
    return {"net": net, "training": training, "decoding": asdict(DecodingConfig())}


def test_the_shared_model_config_states_the_dataclasses_defaults() -> None:
    from omegaconf import OmegaConf

    stated = OmegaConf.to_container(OmegaConf.load(MODEL_CONFIGS / "shared" / "module.yaml"))
    stated = {k: v for k, v in stated.items() if not k.startswith("_")}
    defaults = dataclass_defaults()
    assert set(stated) == set(defaults), "model's groups differ from net, training, decoding"
    for group, settings in defaults.items():
        assert set(stated[group]) == set(settings), f"model.{group} keys differ from its class's"
        for key, value in settings.items():
            here = stated[group][key]
            assert here == value and type(here) is type(value), (
                f"configs/model/shared/module.yaml says model.{group}.{key}={here!r}, the "
                f"dataclass default is {value!r}: one of them is wrong"
            )


@pytest.mark.parametrize("preset", sorted(p.stem for p in MODEL_CONFIGS.glob("*.yaml")))
def test_a_model_preset_sets_only_what_it_changes(preset: str) -> None:
    """A preset starts from the defaults and sets a key only to another value."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(MODEL_CONFIGS / f"{preset}.yaml")
    assert list(config.defaults) == ["shared/module", "_self_"]
    set_here = {k: v for k, v in OmegaConf.to_container(config).items() if k != "defaults"}
    defaults = dataclass_defaults()
    assert set(set_here) <= set(defaults), f"configs/model/{preset}.yaml sets {set(set_here)}"
    same = [
        f"{group}.{key}"
        for group, settings in set_here.items()
        for key, value in settings.items()
        if defaults[group][key] == value
    ]
    assert not same, f"configs/model/{preset}.yaml restates the defaults of {same}"


# --- the run directory's layout, named once ------------------------------------------------------


def test_the_configs_place_a_runs_files_where_run_dir_says() -> None:
    from omegaconf import OmegaConf

    from seq2seq.run_dir import RunDir

    def raw(group: str, option: str) -> dict:  # interpolations left as written
        return OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / group / f"{option}.yaml"))

    named = raw("callbacks", "default")
    callbacks = named.values()
    # The checkpoints go to checkpoints/; the time budget's clock record to the run's top.
    assert named["time_budget"]["dirpath"] == "${paths.output_dir}"
    dirpaths = {
        c["dirpath"] for name, c in named.items() if "dirpath" in c and name != "time_budget"
    }
    assert dirpaths == {f"${{paths.output_dir}}/{RunDir.CHECKPOINTS}"}
    assert {c["filename"] for c in callbacks if c.get("monitor", "") is None} == {"last"}
    csv = raw("logger", "csv")["csv"]
    assert (csv["save_dir"], csv["name"]) == ("${paths.output_dir}", RunDir.CSV)


def test_run_dir_finds_a_runs_files_in_their_order(tmp_path: Path) -> None:
    from seq2seq.run_dir import RunDir

    run = RunDir(tmp_path)
    for version in (0, 2, 10):  # version_10 after version_2, not between 0 and 2
        (tmp_path / "csv" / f"version_{version}").mkdir(parents=True)
        (tmp_path / "csv" / f"version_{version}" / "metrics.csv").write_text("step\n")
    assert [p.parent.name for p in run.metrics_files()] == ["version_0", "version_2", "version_10"]
    assert run.overrides() == []
    for folder in ("resume-2026-12-02_10-00-00", "resume-2026-12-01_10-00-00", ""):
        (tmp_path / ".hydra" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / ".hydra" / folder / "overrides.yaml").write_text("[]\n")
    assert [p.parent.name for p in run.overrides()] == [
        ".hydra",
        "resume-2026-12-01_10-00-00",
        "resume-2026-12-02_10-00-00",
    ]
    assert RunDir.of_checkpoint(run.last) == run
    assert RunDir.of_checkpoint(tmp_path / "model.ckpt") is None
    assert run.average(3) == tmp_path / "checkpoints" / "average-last3.ckpt"


# --- metric names, defined once -------------------------------------------------------------------


def monitors(node: object) -> list[str]:
    """Every metric a config ranks checkpoints or stops early by (monitor: NAME)."""
    if isinstance(node, dict):
        # "${callbacks.model_checkpoint.monitor}": the metric of a config checked here too.
        follows = "${callbacks.model_checkpoint.monitor}"
        found = [v for k, v in node.items() if k == "monitor" and v not in (None, "step", follows)]
        return found + [m for value in node.values() for m in monitors(value)]
    if isinstance(node, list):
        return [m for value in node for m in monitors(value)]
    return []


def test_every_metric_a_config_ranks_by_is_one_the_module_logs() -> None:
    from omegaconf import OmegaConf

    from seq2seq import metric_names

    ranked = {
        str(path.relative_to(ROOT)): monitor
        for path in sorted((ROOT / "configs").rglob("*.yaml"))
        for monitor in monitors(OmegaConf.to_container(OmegaConf.load(path)))
    }
    assert ranked, "no config ranks checkpoints: the test reads the wrong key"
    for path, monitor in ranked.items():
        assert monitor in metric_names.logged("val"), f"{path} ranks by {monitor}, never logged"
    assert metric_names.DEFAULT_MONITOR in metric_names.logged("val")
    assert metric_names.on_test("val/chrf") == "test/chrf"
