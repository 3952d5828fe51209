"""The README and docs/ stay true: the README is a front door (short, the code map and the
how-tos early), every link resolves, the configs table is what configs/ holds, and every
command they show runs as written (docs/guarantees.md, "How the commands in these pages are
checked", says how each kind is checked)."""

from __future__ import annotations

import argparse
import gzip
import importlib
import io
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CONFIG_DIR, ROOT, run_train_cli

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
TOOLS = ("translate", "inspect", "average", "score", "export")

# Commands shown as what goes wrong: they must fail with this line.
FAILING = {
    "python train.py model.net.num_heads=0": "num_heads must be a positive integer, got 0",
}
# Commands not run here, and why (each kind is listed in docs/guarantees.md).
NOT_RUN = (
    "python -m venv",  # the set-up command: CI runs it (.ci/run)
    "pip install",  # CI runs the set-up command (.ci/run)
    "pytest",  # is this suite
    "srun ",  # needs a SLURM cluster
    "python train.py trainer=gpu",  # needs a GPU
    "tensorboard ",
    "curl ",  # needs a running server: tests/test_serve.py sends the same requests
)


def commands(page: Path) -> Iterator[str]:
    """The shell commands of a page: every line of its bash blocks (continuations joined) and
    every inline code span that starts with `python `."""
    text = page.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                yield shlex.join(shlex.split(line, comments=True))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`(python [^`]+)`", prose):
        # A tool named (`python -m seq2seq.score`) or a pattern (`python bench/*.py ...`) in the
        # prose is not a command.
        if not re.fullmatch(r"python -m seq2seq\.\w+", span) and not re.search(
            r"\.\.\.|\*|TOOL", span
        ):
            yield shlex.join(shlex.split(span.replace("\\|", "|"), comments=True))


def all_commands() -> list[str]:
    seen: dict[str, None] = {}
    for page in PAGES:
        for command in commands(page):
            seen.setdefault(command)
    return list(seen)


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/"
    headings = {line: n for n, line in enumerate(lines, 1) if line.startswith("## ")}
    for heading, by in (("## Set up, run, test", 40), ("## Real text in one command", 70),
                        ("## The code, and where to start reading", 110),
                        ("## How to change it", 150)):  # fmt: skip
        assert headings.get(heading, 10**6) <= by, f"{heading!r} should start by line {by}"
    text = "\n".join(lines)
    for how in ("hyperparameter", "decoding option", "corpus", "metric", "callback"):
        assert f"**A {how}" in text, how
    assert "../shared" not in text  # a user's clone has no ../shared


def test_the_readmes_line_counts_are_the_codes() -> None:
    """ "about N lines ... (about M)": the package and train.py, and the core, within 5%."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"about ([\d,]+) lines of .*?\(about ([\d,]+)\)", text, re.S)
    assert found, "the README's opening no longer states its line counts"

    def lines(paths: list[Path]) -> int:
        return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)

    package = [*(ROOT / "seq2seq").rglob("*.py"), ROOT / "train.py"]
    core = list((ROOT / "seq2seq" / "core").rglob("*.py"))
    for said, counted in ((found[1], lines(package)), (found[2], lines(core))):
        assert abs(int(said.replace(",", "")) - counted) <= 0.05 * counted, (said, counted)


# Settings docs/guarantees.md shows misspelled, as the refusals they get.
SHOWN_REFUSED = ("model.net.n_layers", "data.corpus.train_siz", "trainer.max_epoch")


def test_every_setting_the_docs_name_exists() -> None:
    """Every model.*, data.*, trainer.* and callbacks.* key the pages name is one a config
    composes (any group's choice) or one a resume may change; NAME is a placeholder."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from seq2seq.training.preflight import RESUME_MAY_CHANGE

    known: set[str] = set(RESUME_MAY_CHANGE)

    def walk(prefix: str, node: object) -> None:
        known.add(prefix)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for group in ("data", "experiment", "trainer", "callbacks", "model"):
            for choice in sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")):
                config = compose("train", overrides=[f"{group}={choice}"])
                walk("", OmegaConf.to_container(config, resolve=False))
    # Keys in lower case: callbacks.TimeBudget (a class) and data.load( (a call) are no settings.
    named = re.compile(r"(?<![\w./+-])((?:model\.(?:net|training|decoding)|data|trainer|callbacks)"
                       r"\.[a-z_][\w.]*[a-z_0-9])\b(?!\()")  # fmt: skip
    guarantees = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    assert all(f"+{key}" in guarantees for key in SHOWN_REFUSED)
    unknown = {
        (page.name, key)
        for page in PAGES
        for key in named.findall(page.read_text(encoding="utf-8"))
        if key not in {*known, *SHOWN_REFUSED} and not key.endswith(("NAME", ".py", ".md"))
    }
    assert not unknown, f"settings the docs name that no config has: {sorted(unknown)}"


def test_run_paths_in_commands_are_where_their_experiment_writes() -> None:
    """`experiment=E ... outputs/X/runs`: X is E's task_name (a real-text run goes to
    outputs/tatoeba_en_fr/..., not outputs/train/...); every outputs/X/runs is some config's."""
    task_names = {"train"}
    of = {}
    for path in (CONFIG_DIR / "experiment").glob("*.yaml"):
        found = re.search(r"^task_name: (\S+)", path.read_text(encoding="utf-8"), re.M)
        of[path.stem] = found[1] if found else "train"
        task_names.add(of[path.stem])
    for command in all_commands():
        where = re.findall(r"outputs/([\w<>-]+)/runs", command)
        experiment = re.search(r"\bexperiment=(\w+)", command)
        for name in where:
            assert name in task_names, f"{command}: no config writes outputs/{name}/runs"
            if experiment and experiment[1] in of:
                assert name == of[experiment[1]], (
                    f"{command}: writes to outputs/{of[experiment[1]]}"
                )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_picture_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "../shared" not in text, page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name} links to {target}"
    for anchor_page, anchor in re.findall(r"\]\(([^)#\s]*)#([^)]+)\)", text):
        linked = (page.parent / anchor_page) if anchor_page else page
        slugs = {slug(h) for h in re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)}
        assert anchor in slugs, f"{page.name} links to {anchor_page}#{anchor}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_configs_table_is_what_configs_holds() -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    import configs_table

    assert configs_table.main(["--check"]) == 0, "run python docs/configs_table.py"
    page = configs_table.PAGE.read_text(encoding="utf-8")
    for path in CONFIG_DIR.glob("*/*.yaml"):
        if path.parent.name not in ("paths", "hydra"):
            assert f"`{path.parent.name}={path.stem}`" in page, path


def test_the_tests_table_is_what_tests_holds() -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    import tests_table

    assert tests_table.main(["--check"]) == 0, "run python docs/tests_table.py"
    assert len(tests_table.rows()) == len(list((ROOT / "tests").glob("test_*.py")))
    assert all(proves for _, proves, _ in tests_table.rows()), "a test file without a docstring"


MACHINES = ROOT / "docs" / "machines.md"
# How a figure names its machine: the names of docs/machines.md's table, nothing vaguer.
MACHINE_WORDS = re.compile(r"\b(Xeon|Zen \d|EPYC \d GHz)\b")
VAGUE_MACHINES = (
    "this project's 2-core", "this project's machine", "the development machine",
    "a third 2-core machine", "a fourth 2-core machine", "a fifth 2-core machine",
)  # fmt: skip


def machine_names() -> list[str]:
    """The first column of docs/machines.md's table."""
    rows = [line for line in MACHINES.read_text(encoding="utf-8").splitlines() if line[:2] == "| "]
    return [row.split("|")[1].strip() for row in rows[1:]]  # the header row aside


def test_every_machine_a_figure_names_is_in_the_machines_table() -> None:
    names = machine_names()
    assert {"Xeon", "Zen 3"} <= set(names), names
    header = MACHINES.read_text(encoding="utf-8").split("\n| name |")[1].split("\n")[0]
    for column in ("CPU", "vector width", "matmul peak", "pace of a training step"):
        assert column in header, column
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for vague in VAGUE_MACHINES:
            assert vague not in text, f"{page.name} says {vague!r}: name the machine (machines.md)"
        for found in MACHINE_WORDS.finditer(text):
            line = text[: found.start()].count("\n") + 1
            assert found[1] in names, f"{page.name}:{line}: {found[1]} is not in machines.md"


def results_tables(text: str) -> Iterator[tuple[int, str]]:
    """(line number, the line before the blank line above it) of each table's header row."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        starts = line.startswith("|") and re.fullmatch(r"\|[-| :]+\|", lines[i + 1])
        if starts and not lines[i - 1].startswith("|"):
            yield i + 1, lines[i - 2] if i >= 2 else ""


def test_every_results_table_names_its_commit_and_machine() -> None:
    """docs/results.md: above each table, the commit it ran at (one that exists, where the clone
    has its history) and its machine's name from docs/machines.md."""
    import subprocess

    names = machine_names()
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    tables = list(results_tables(text))
    assert len(tables) > 10
    full_history = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True, text=True,
    ).stdout.strip() == "false"  # fmt: skip
    for line, note in tables:
        if text.splitlines()[line - 1].startswith(
            ("| setting | value | why | evidence |", "| question | answer | section |")
        ):
            continue  # the decisions and the index: each links to the section whose table it cites
        named = re.fullmatch(
            r"Ran at commit `([0-9a-f]{7,40})` on the \[([^]]+)\]\(machines\.md\).*", note
        )
        assert named, f"results.md:{line}: the table does not name its commit and machine: {note!r}"
        commit, machine = named.groups()
        assert machine in names, f"results.md:{line}: {machine} is not in machines.md"
        if full_history:
            known = subprocess.run(
                ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"]
            )
            assert known.returncode == 0, f"results.md:{line}: no commit {commit}"


def test_every_command_is_of_a_kind_this_suite_checks() -> None:
    kinds = {command: kind(command) for command in all_commands()}
    assert "unknown" not in kinds.values(), [c for c, k in kinds.items() if k == "unknown"]
    assert list(kinds.values()).count("run") > 40  # the extraction found the pages' commands


def kind(command: str) -> str:
    if command.startswith(NOT_RUN):
        return "not run"
    if command.startswith(("python -m seq2seq.serve", "seq2seq-serve")):
        return "served"  # a server runs until stopped: its command line is parsed here
    if command.startswith(("python train.py", "python -m seq2seq.", "cat ")):
        return "run"
    if command.startswith(("python bench/", "python docs/")):
        return "parsed"
    return "unknown"


# --- train.py: composed and checked as `python train.py` checks a command line -------------


def train_commands() -> list[str]:
    return [c for c in all_commands() if c.startswith("python train.py") and kind(c) == "run"]


def user_files(args: list[str], where: Path) -> None:
    """Make the corpus files a command names (train.en, pairs.tsv, ...) as a user would have."""
    columns = dict(a.split("=", 1) for a in args if a.startswith("data.corpus.") and "=" in a)
    src = columns.get("data.corpus.src_column", "src")
    tgt = columns.get("data.corpus.tgt_column", "tgt")
    for arg in args:
        key, _, value = arg.partition("=")
        if not re.fullmatch(r"data\.corpus\.\w+\.(src|tgt|file)", key) or "$" in value:
            continue
        path = where / value.replace("**/", "").replace("*", "part-1")  # a glob: a match
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [f"{i} {i + 1}" for i in range(50)]
        if key.endswith(".file"):
            text = f"{src}\t{tgt}\n" + "".join(f"{r}\t{r}\n" for r in rows)
        else:
            text = "".join(f"{r}\n" for r in rows)
        data = text.encode()
        path.write_bytes(gzip.compress(data) if value.endswith(".gz") else data)


def as_plain_run(command: str, run: Path) -> list[str]:
    """The overrides of a command, a sweep's first job's (-m a=1,2 -> a=1), placeholders
    (outputs/TASK/runs/<run>, <best.ckpt>) given a finished run."""
    args = [a for a in shlex.split(command)[2:] if a not in ("--cfg", "job")]  # prints, no more
    if "-m" in args:
        args.remove("-m")
        args = [a if "[" in a else re.sub(r"=([^,]*),.*", r"=\1", a) for a in args]
    best = str(next((run / "checkpoints").glob("epoch*.ckpt")))
    names = {"<best.ckpt>": best, "CKPT": best}
    args = [re.sub(r"outputs/\w+/runs/<run>", lambda m: str(run), a) for a in args]  # any task's
    return [re.sub("|".join(map(re.escape, names)), lambda m: names[m[0]], a) for a in args]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished `python train.py` run, started from the command line (so it can be resumed
    with resume=RUN alone), as small as a run can be."""
    where = tmp_path_factory.mktemp("cli_run")
    # One epoch of five steps, validated after each: five checkpoints for average_last to keep.
    # A budget it never reaches (the epoch ends it) makes it record its clock, for replay=RUN.
    args = ["data.corpus.train_size=320", "data.corpus.val_size=16", "data.corpus.test_size=16",
            "trainer.max_epochs=1", "trainer.val_check_interval=1", "average_last=5",
            "trainer.max_time=00:00:10:00",
            f"hydra.run.dir={where / 'run'}", f"paths.data_dir={where / 'data'}"]  # fmt: skip
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert run_train_cli(args, where, monkeypatch) == 0
    return where / "run"


@pytest.mark.parametrize("command", train_commands())
def test_train_commands_in_the_docs_check_out(
    command: str, cli_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What train.py does with the command line before it trains: the run's overrides for a
    resume, then compose and check every value (seq2seq.training.launch)."""
    from seq2seq.training.launch import command_line_error, with_run_overrides

    monkeypatch.chdir(tmp_path)
    args = as_plain_run(command, cli_run)
    user_files(args, tmp_path)
    plain = [a for a in args if not a.startswith("-")]
    if any(a.startswith(("-cp", "-cn")) for a in args):
        pytest.skip("a rerun from a run's .hydra: tests/test_reproduce.py runs it")
    error = command_line_error(with_run_overrides(plain), CONFIG_DIR)
    if command in FAILING:
        assert error is not None and FAILING[command] in error
    else:
        assert error is None, f"{command}: {error}"


# --- the tools: run in this process, on a finished run's files ---------------------------


def tool_commands() -> list[str]:
    return [c for c in all_commands() if "python -m seq2seq." in c and kind(c) == "run"]


def with_files(command: str, run: Path, where: Path) -> tuple[str, list[str], str | None]:
    """(tool, arguments, standard input) of a tool command, its placeholders given the run's
    files: <best.ckpt>/CKPT/a.ckpt the best checkpoint, b.ckpt/c.ckpt others, RUN the run,
    HYP/REF its test texts, DIR a new directory; sources.txt a file of inputs, refs.txt their
    targets, gold.txt their word alignments."""
    (where / "sources.txt").write_text("3 1 4 1 5\n2 7\n", encoding="utf-8")
    (where / "refs.txt").write_text("3 1 4 1 5\n2 7\n", encoding="utf-8")
    (where / "gold.txt").write_text("0-0 1-1 2-2 3-3 4-4\n0-0 1?1\n", encoding="utf-8")
    best = str(next((run / "checkpoints").glob("epoch*.ckpt")))
    recent = sorted(str(p) for p in (run / "checkpoints").glob("recent-*.ckpt"))
    names = {"<best.ckpt>": best, "CKPT": best, "a.ckpt": best, "b.ckpt": recent[0],
             "c.ckpt": recent[1], "RUN": str(run), "outputs/train/runs/<run>": str(run),
             "HYP": str(run / "test_hypotheses.txt"), "REF": str(run / "test_references.txt"),
             "test_hypotheses.txt": str(run / "test_hypotheses.txt"),
             "test_references.txt": str(run / "test_references.txt"),
             "DIR": str(where / "export")}  # fmt: skip
    stdin, args = None, shlex.split(command)
    if args[0] == "cat":  # cat FILE | python -m ...
        stdin = (where / args[1]).read_text(encoding="utf-8")
        args = args[args.index("|") + 1 :]
    if ">" in args:  # standard output to a file: what the tool prints is read below
        args = args[: args.index(">")]
    tool = args[2].removeprefix("seq2seq.")
    return tool, [names.get(a, a) for a in args[3:]], stdin


def test_tool_commands_in_the_docs_run_as_written(
    cli_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """In the order the pages show them (an export before the translate that reads it)."""
    monkeypatch.chdir(tmp_path)
    ran = set()
    for command in tool_commands():
        tool, args, stdin = with_files(command, cli_run, tmp_path)
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        main = importlib.import_module(f"seq2seq.{tool}").main
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 0, f"{command}: exit {code}: {err[-500:]}"
        assert out or tool in ("export", "average"), command
        ran.add(tool)
    assert ran == set(TOOLS)


def test_serve_commands_in_the_docs_parse(cli_run: Path, tmp_path: Path) -> None:
    """`python -m seq2seq.serve ...` runs until it is stopped: here its command line parses
    with the run's files; tests/test_serve.py starts real servers the same way."""
    from seq2seq.serve.cli import parse_args

    served = [c for c in all_commands() if kind(c) == "served"]
    assert served, "the docs show no serve command"
    for command in served:
        _, args, _ = with_files(command.replace("seq2seq-serve", "python -m seq2seq.serve"),
                                cli_run, tmp_path)  # fmt: skip
        parse_args(args)


# --- bench/ and docs/ scripts: their command lines parse ---------------------------------


class Parsed(Exception):
    """Raised in place of running a script once its command line parsed."""


def script_commands() -> list[str]:
    return [c for c in all_commands() if kind(c) == "parsed"]


@pytest.mark.parametrize("command", script_commands())
def test_script_commands_in_the_docs_parse(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args = shlex.split(command)[1:]
    path = ROOT / args[0]
    if "ArgumentParser" not in path.read_text(encoding="utf-8"):
        assert args == [args[0]], f"{path.name} takes no arguments"
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
        return
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **k):
        parse(self, *a, **k)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(path), *args[1:]])
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"doc_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(Parsed):
        module.main()


def test_the_pictures_script_draws_from_the_projects_code(tmp_path: Path) -> None:
    """The pictures that need no training (attention.png and curves.png come from a run made
    by train(), which tests/test_cli.py and tests/test_curves.py cover)."""
    sys.path.insert(0, str(ROOT / "docs"))
    import pictures

    assert pictures.main(["masks", "positions", "schedule", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "masks.png",
        "positions.png",
        "schedule.png",
    ]
    with pytest.raises(SystemExit):
        pictures.main(["nonsense"])
    for name in pictures.PICTURES:
        assert f"pictures/{name}.png" in "".join(p.read_text() for p in PAGES)
