"""What runs before train(cfg): the resolvers the configs use, and a command line checked and
its errors shaped into one line before Hydra makes a run directory.

train.py imports this module (registering the resolvers) and calls check_command_line in
cli(), then Hydra's main. The message shaping reads Hydra's exceptions (hydra-core 1.3, pinned
in pyproject.toml): a new Hydra that words them differently falls back to its own message.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from seq2seq.run_dir import RunDir
from seq2seq.training.preflight import check_config, check_run_dir_is_new, checkpoint_to_resume

__all__ = [
    "check_command_line",
    "command_line_error",
    "resumed_run",
    "root_cause",
    "with_run_overrides",
]


def resumed_run(train: bool, resume: str | None, ckpt_path: str | None) -> Path | None:
    """The run directory a training start continues in, or None for a new run."""
    if not train:
        return None  # evaluating a checkpoint never writes into its run
    if resume:
        return Path(resume)
    run = RunDir.of_checkpoint(ckpt_path) if ckpt_path else None
    return run.path if run is not None else None


def override_key(override: str) -> str:
    """The key a command-line override sets: "+model.x=1" -> "model.x", "~data.y" -> "data.y"."""
    return override.split("=", 1)[0].lstrip("+~")


def with_run_overrides(args: list[str]) -> list[str]:
    """A resume's command line with the run's own overrides put first.

    `python train.py resume=RUN` continues RUN as it was configured: the overrides its last
    start was given (RUN/.hydra/overrides.yaml, or the newest .hydra/resume-*/overrides.yaml)
    come first, and the command line's own follow them and win. Whether what the command
    line changes may change on a resume is preflight.check_resume's to say. `python train.py
    replay=RUN` gets RUN's overrides first in the same way, in a new run directory
    (preflight.replay_record checks the result). Any other command line comes back as it is.
    """
    import yaml

    given = dict(arg.split("=", 1) for arg in args if "=" in arg and not arg.startswith("-"))
    resume, ckpt_path, replay = (
        None if given.get(key) in ("", "null") else given.get(key)
        for key in ("resume", "ckpt_path", "replay")
    )
    train = given.get("train", "true").lower() != "false"
    run_dir = resumed_run(train, resume, ckpt_path) or (Path(replay) if replay else None)
    if run_dir is None:
        return args
    saved_files = RunDir(run_dir).overrides()
    if not saved_files:
        return args  # a run made without Hydra's files: the command line is the config
    try:
        saved = yaml.safe_load(saved_files[-1].read_text(encoding="utf-8")) or []
    except (OSError, yaml.YAMLError):
        return args  # preflight compares the config with the checkpoint's all the same
    mine = {override_key(arg) for arg in args}
    kept = [
        moved_override(override)
        for override in saved
        if isinstance(override, str)
        and override_key(override) not in {"resume", "ckpt_path", "train", *mine}
    ]
    return [*kept, *args]


@functools.cache  # asked once for each override a resume carries over
def moved_settings() -> dict[str, str]:
    """Every setting that moved, old key -> new key (the module's flat settings moved into
    model.training and model.decoding)."""
    from seq2seq.hparams import MOVED_SETTINGS  # here, not at the top: train.py starts fast

    return {**MOVED, **{f"model.{old}": f"model.{new}" for old, new in MOVED_SETTINGS.items()}}


def moved_override(override: str) -> str:
    """A saved override at the key its setting has now ("model.lr=1" -> "model.training.lr=1")."""
    key = override_key(override)
    new = moved_settings().get(key)
    if new is None:
        return override
    start = override.index(key)
    return override[:start] + new + override[start + len(key) :]


# Used by configs/hydra/default.yaml. ${pid:} in run directory names: two runs started in the
# same microsecond still differ. A resumed run keeps its directory, and the config of each
# resume goes beside the first start's instead of over it.
OmegaConf.register_new_resolver("pid", lambda: os.getpid(), replace=True)
# ${project_dir:}: the clone train.py runs from, wherever it is started (the corpora under
# data/corpora ship with it; paths.root_dir is the working directory, where outputs go).
OmegaConf.register_new_resolver(
    "project_dir", lambda: str(Path(__file__).resolve().parents[2]), replace=True
)
OmegaConf.register_new_resolver(
    "run_dir", lambda train, resume, ckpt, new: str(resumed_run(train, resume, ckpt) or new)
)
OmegaConf.register_new_resolver(
    "config_subdir",
    lambda train, resume, ckpt, now: (
        ".hydra" if resumed_run(train, resume, ckpt) is None else f".hydra/resume-{now}"
    ),
)


# Settings that moved, for command lines written before: the symbol tasks (copy, reverse,
# sort) had their own data module with flat settings; they are a corpus like the others now.
# (The module's flat settings, model.lr and the like, are in moved_settings.)
MOVED = {
    "data.task": "data.corpus.task",
    "data.num_symbols": "data.corpus.num_symbols",
    "data.min_len": "data.corpus.min_length",
    "data.max_len": "data.corpus.max_length",
    "data.train_size": "data.corpus.train_size",
}


def root_cause(error: BaseException) -> BaseException:
    """The error inside Hydra's InstantiationException wrappers (a data module's ValueError)."""
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def command_line_error(overrides: list[str], config_dir: Path) -> str | None:
    """What is wrong with a command line, in one line; None if it composes and checks out.

    Runs before Hydra's main, which makes the run directory and its log: a bad command line
    leaves nothing behind. Hydra reports overrides it cannot compose over several lines (with
    its search path); composing once up front with the same overrides gives the same verdict
    with a message we can shape. Then the config's values get the checks train(cfg) starts
    with (seq2seq.training.preflight).
    """
    import hydra.errors
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(str(config_dir), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        run_dir = Path(OmegaConf.select(cfg, "hydra.run.dir"))
    except hydra.errors.MissingConfigException as error:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        if error.options and group:
            choices = ", ".join(error.options)
            return f"{group}={option} is not an option of {group}; choose one of: {choices}"
        return " ".join(str(error).split("Config search path")[0].split())
    except hydra.errors.OverrideParseException as error:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        bad = ""
        for override in overrides:
            try:
                parser.parse_override(override)
            except hydra.errors.HydraException:
                bad = override
                break
        first = str(error).splitlines()[0]
        return f"cannot parse the override {bad!r}: {first} (see python train.py --help)"
    except hydra.errors.ConfigCompositionException as error:
        message = str(error)
        if message.startswith("Could not override '"):
            key = message.split("'")[1]
            moved = moved_settings()
            if key in moved:
                return f"{key} is now {moved[key]}: write {moved[key]}=... instead"
            return (
                f"{key} is not a setting of this config; check the spelling "
                f"(python train.py --cfg job lists them), or add a new key with +{key}=..."
            )
        return " ".join(message.split())
    except Exception:  # a run directory only Hydra itself can resolve: Hydra will judge it
        return None
    try:
        check_config(cfg, {override_key(override) for override in overrides})
        if cfg.train:
            check_run_dir_is_new(run_dir, resuming=checkpoint_to_resume(cfg) is not None)
    except (ValueError, InstantiationException) as error:
        return str(root_cause(error))
    return unwritable(run_dir)


def unwritable(run_dir: Path) -> str | None:
    """Why Hydra could not create the run directory (it would fail with a traceback)."""
    parent = run_dir
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        reason = "not a directory" if not parent.is_dir() else "not writable"
        return (
            f"cannot write to the output directory {run_dir} ({parent} is {reason}): "
            "choose another with hydra.run.dir=PATH"
        )
    return None


def check_command_line(args: list[str], config_dir: Path) -> None:
    """Exit with one line for a plain command line that does not compose or check out.

    Plain runs only: with Hydra's own flags (-m, --cfg, -cp, ...) or HYDRA_FULL_ERROR=1, Hydra
    reports as it does, and the checks run in train(cfg), after the run directory is made.
    """
    plain = not any(arg.startswith("-") for arg in args)
    if plain and os.environ.get("HYDRA_FULL_ERROR") != "1":
        message = command_line_error(args, config_dir)
        if message:
            print(f"error: {message}", file=sys.stderr)
            sys.exit(1)


def command_line_keys() -> set[str]:
    """The config keys the run's command line sets (Hydra's task overrides, `+`/`~` dropped);
    none outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {override.split("=", 1)[0].lstrip("+~") for override in HydraConfig.get().overrides.task}
