"""The architecture holds: imports run one way (no cycle, lazy imports inside functions
included), and the model, its search and the tools that use a trained checkpoint never import
the training shell (Lightning, Hydra, OmegaConf, torchmetrics), not even lazily.

Read from the source with `ast`, so every import counts, whichever branch runs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT, TRAINING_SHELL

PACKAGE = ROOT / "seq2seq"
SHELL = set(TRAINING_SHELL)
# Plain PyTorch: the model and its search, and what translate, inspect, export, average and
# score need to read a checkpoint and use it.
CORE = ["attention", "kv_cache", "model", "decoding"]
TOOLS = ["translate", "inspect", "export", "exported", "average", "score", "checkpoint", "hparams"]


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


@pytest.mark.parametrize("name", CORE + TOOLS)
def test_the_core_and_the_tools_never_import_the_training_shell(name: str) -> None:
    found = reachable(f"seq2seq.{name}")
    assert not found & SHELL, f"seq2seq.{name} may import {sorted(found & SHELL)}"
    assert "seq2seq.module" not in found  # the LightningModule


def test_the_core_imports_only_torch_and_its_own() -> None:
    for name in CORE:
        outside = {m for m in reachable(f"seq2seq.{name}") if not m.startswith("seq2seq")}
        assert outside <= {"torch", "math", "dataclasses", "typing", "collections", "contextlib",
                           "__future__", "functools"}, (name, outside)  # fmt: skip


def test_the_graph_sees_lazy_imports() -> None:
    """The check above would pass vacuously if function-level imports were missed."""
    assert "seq2seq.exported" in imports("seq2seq.translate")  # imported inside a function
    assert "lightning" in reachable("seq2seq.module")
