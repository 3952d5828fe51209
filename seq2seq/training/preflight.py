"""Checks of a composed run config, before anything is written or trained.

`python train.py` runs them on the composed config before Hydra makes the run directory, so a
typo on the command line fails with one line and leaves nothing behind; train(cfg) runs them
again for callers that compose the config themselves (tests, notebooks). Each check names the
setting, the value it got and what it needs (seq2seq.checks). check_same_model and
check_output_dir need the module (its weights and vocabularies): train(cfg) runs them once it
has one, still before anything is trained or written.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from seq2seq import checks
from seq2seq.run_dir import RunDir
from seq2seq.training.pick import SearchGrid

log = logging.getLogger(__name__)

# What Lightning's Trainer takes as precision (lightning.fabric.connector's _PRECISION_INPUT,
# a private name, so listed here).
PRECISIONS = (
    "32-true", "32", 32, "16-mixed", "16", 16, "bf16-mixed", "bf16", "16-true", "bf16-true",
    "64-true", "64", 64, "transformer-engine", "transformer-engine-float16",
)  # fmt: skip
MAX_TIME = re.compile(r"^\d+:\d\d:\d\d:\d\d$")  # DD:HH:MM:SS, as Lightning parses it


class Checked(NamedTuple):
    """What checking a run config found, for train() to use rather than find again: the (not
    yet set up) data module, the checkpoint a resume starts from, the clock record a replay
    repeats (None: neither), and the searches pick_search tries after training."""

    datamodule: Any
    resume_from: str | None
    replayed: Any
    grid: SearchGrid
    init_from: str | None  # the checkpoint a new run starts from (fine-tuning), None: from scratch


def check_config(cfg: DictConfig, given: set[str] = frozenset()) -> Checked:
    """Every value of the run config that can be checked without reading data, a bad data
    value failing to construct the data module. given: the keys the command line sets (a
    resume or replay reads the settings its run lacks as off, but for these)."""
    initial = initial_model(cfg, given)  # init_from: its network settings set before the checks
    check_model_config(cfg.model)
    check_settings_known(cfg)
    check_trainer_config(cfg.trainer)
    if OmegaConf.select(cfg, "data.corpus.streaming") is True and cfg.train:
        check_streaming_trainer(cfg, given)  # before a resume compares: it may set a key
    resume_from = checkpoint_to_resume(cfg)
    if resume_from and cfg.train:
        check_resume(cfg, resume_from, given)
    replayed = replay_record(cfg, given)
    checks.integer("average_last", cfg.get("average_last", 0), minimum=0)
    # Its values, before the data is made; plain, so the config goes no further than here.
    grid = SearchGrid.from_config(
        OmegaConf.to_container(cfg.get("pick_search") or {}, resolve=True)
    )
    if cfg.get("validations") is not None:
        checks.integer("validations", cfg.validations, minimum=1)
    ema = OmegaConf.select(cfg, "callbacks.ema")
    if ema is not None and "decay" in ema:  # 1 would never move, 0 is no average: callbacks=ema
        checks.number("callbacks.ema.decay", ema.decay, 0, 1, low_open=True, high_open=True)
    if ema is not None and cfg.get("average_last", 0):  # its files are weights-only: no average
        raise ValueError(
            f"average_last={cfg.average_last} would average the trained weights of the last "
            "validations, not callbacks=ema's average: set average_last=0 with callbacks=ema"
        )
    if not cfg.train and not cfg.get("ckpt_path"):
        raise ValueError("train=false needs a checkpoint to evaluate: add ckpt_path=PATH")
    datamodule = instantiate(cfg.data)
    if initial is not None:
        # The checkpoint's tokenizers, not ones fitted on this corpus (a resume's are its own).
        datamodule.kept_tokenizers = initial
    if cfg.train:
        check_model_fits_data(cfg.model.net.max_positions, datamodule)
    init_from = cfg.get("init_from") if initial is not None else None
    return Checked(datamodule, resume_from if cfg.train else None, replayed, grid, init_from)


# What fine-tuning (init_from=CKPT) may set otherwise than the checkpoint's network: its
# regularisation. Every other model.net setting is the checkpoint's: the weights fit no other.
INIT_MAY_CHANGE = ("dropout",)


def initial_model(cfg: DictConfig, given: set[str] = frozenset()) -> tuple[Any, Any] | None:
    """With init_from=CKPT: the run's model.net set to CKPT's (a setting the command line gives
    otherwise refused in one line, INIT_MAY_CHANGE aside) and CKPT's tokenizers, which the run
    keeps; None without init_from."""
    from seq2seq.checkpoint import CheckpointError, load_checkpoint
    from seq2seq.data.tokenizer import tokenizer_from_dict
    from seq2seq.hparams import NET_KEYS, complete_hparams

    path = cfg.get("init_from")
    if not path:
        return None
    if not cfg.train:
        raise ValueError(
            f"init_from={path} starts a new training run: drop train=false (to test a "
            "checkpoint, give ckpt_path=PATH alone)"
        )
    if cfg.get("ckpt_path"):
        raise ValueError(
            f"init_from={path} starts a new run from its weights and ckpt_path={cfg.ckpt_path} "
            "continues a run from its own: give one of them"
        )
    try:
        # A resume reads them from its own checkpoint, the same: CKPT may be gone since.
        saved = load_checkpoint(checkpoint_to_resume(cfg) or path, mmap=True)["hyper_parameters"]
        complete_hparams(saved.get("net"), saved.get("training"), saved.get("decoding"))
        defaults = _net_defaults()  # an option newer than CKPT: it had it off
        net = {name: saved["net"].get(name, defaults.get(name)) for name in NET_KEYS}
        tokenizers = (tokenizer_from_dict(saved["src_vocab"]),
                      tokenizer_from_dict(saved["tgt_vocab"]))  # fmt: skip
    except CheckpointError as error:
        raise ValueError(f"init_from={path}: {error}") from None
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"init_from={path} holds no model this version can start from ({error}): give a "
            "checkpoint a training run wrote"
        ) from None
    tokenizer_keys = sorted(k for k in given if k.startswith(("data.tokenizer.", "data.bpe_")))
    if tokenizer_keys:
        raise ValueError(
            f"{tokenizer_keys[0]} would fit new tokenizers, but fine-tuning keeps {path}'s (the "
            "weights know no other tokens): drop it"
        )
    with open_dict(cfg):
        for name, value in net.items():
            key = f"model.net.{name}"
            now = OmegaConf.select(cfg, key)
            if key in given and name in INIT_MAY_CHANGE:
                continue
            if key in given and now != value:
                may = ", ".join(f"model.net.{n}" for n in INIT_MAY_CHANGE)
                raise ValueError(
                    f"{key}={now} cannot change when fine-tuning from {path} (its {name} is "
                    f"{value}): drop it (only {may} may)"
                )
            OmegaConf.update(cfg, key, value, merge=False)
    return tokenizers


def evaluation_config(cfg: DictConfig, given: set[str]) -> None:
    """train=false ckpt_path=CKPT: evaluate on the data the checkpoint's run was made with (its
    run config's data group), with the data.* keys the command line gives on top (another test
    file, say) and this run's data cache (data.data_dir). A command line that names other data
    (data=..., experiment=...) keeps it; a checkpoint saved before runs kept their config is
    evaluated on the configured data. The model and its decoding are the checkpoint's
    (training.module.load_for_evaluation)."""
    from seq2seq.checkpoint import load_checkpoint, run_record

    saved = run_record(load_checkpoint(cfg.ckpt_path, mmap=True))["run_config"] or {}
    if "data" not in saved or given & {"data", "experiment"}:
        return
    data = OmegaConf.create(saved["data"])
    data.data_dir = cfg.data.get("data_dir")
    data._target_ = current_target(data.get("_target_"))
    for key in sorted(k for k in given if k.startswith("data.")):
        OmegaConf.update(data, key[len("data.") :], OmegaConf.select(cfg, key), force_add=True)
    with open_dict(cfg):
        cfg.data = data  # its seed, resolved when the run saved it: the run's split


def check_streaming_trainer(cfg: DictConfig, given: set[str] = frozenset()) -> None:
    """A streamed corpus has no epoch end (seq2seq/data/stream.py): something else must end the
    run, and validate within it. Late dropout counts epochs: asked for on the command line it is
    refused; set by an experiment (the recipe's), it gives way to dropout throughout, as the
    recipe had it on a stream before late dropout, and the log says so."""
    trainer = cfg.trainer
    if trainer.get("max_steps", -1) in (-1, None) and trainer.get("max_time") is None:
        raise ValueError(
            "data.corpus.streaming=true trains without an epoch end: give trainer.max_steps=N "
            "or trainer.max_time=DD:HH:MM:SS to end the run"
        )
    clocked = trainer.get("max_time") is not None and cfg.get("validations") is not None
    interval = trainer.get("val_check_interval")
    if not clocked and not (checks.is_integer(interval) and interval >= 1):
        raise ValueError(
            "data.corpus.streaming=true has no epoch end to validate at, got "
            f"trainer.val_check_interval={checks.describe(interval)}: give "
            "trainer.val_check_interval=N (batches), or validations=N with trainer.max_time"
        )
    key = "model.training.dropout_from_epoch"
    start = OmegaConf.select(cfg, key)
    if start is not None and key in given:
        raise ValueError(
            f"{key}={start} counts epochs, which data.corpus.streaming=true does not have: "
            f"set {key}=null"
        )
    if start is not None:
        log.warning(
            "%s=%s counts epochs, which data.corpus.streaming=true does not have: dropout is "
            "model.net.dropout throughout (%s=null says so on the command line)", key, start, key
        )  # fmt: skip
        OmegaConf.update(cfg, key, None)


def check_model_config(model: DictConfig) -> None:
    """The module's and the model's checks, on the config alone (vocabulary sizes aside)."""
    from seq2seq.core.model import ModelConfig
    from seq2seq.hparams import check_groups, complete_hparams

    given = OmegaConf.to_container(model, resolve=True)
    settings = {k: v for k, v in given.items() if not k.startswith("_")}
    check_groups(settings)
    groups = complete_hparams(*(settings.get(k) for k in ("net", "training", "decoding")))
    ModelConfig(src_vocab_size=8, tgt_vocab_size=8, **groups["net"])


# Keys of a `_target_` node that are Hydra's own, not the target's arguments.
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def check_settings_known(cfg: DictConfig) -> None:
    """Every setting of a node that builds an object (`_target_`: the data module, its corpus,
    the Trainer, each callback and logger) is an argument of what it builds: an unknown one,
    added with `+` or a typo in a YAML file, is refused in one line that names it and the
    nearest real names, instead of a TypeError from deep inside instantiate. The model's
    groups are check_model_config's."""
    import inspect

    from hydra.utils import get_object

    def walk(node: Any, path: str) -> None:
        if isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{path}[{index}]")
        if not isinstance(node, dict):
            return
        target = node.get("_target_")
        if isinstance(target, str) and path != "model":
            try:
                parameters = inspect.signature(get_object(target)).parameters.values()
            except (ImportError, AttributeError, TypeError, ValueError):
                parameters = None  # instantiate says what is wrong with the target itself
            if parameters is not None and all(p.kind != p.VAR_KEYWORD for p in parameters):
                known = [p.name for p in parameters if p.kind != p.VAR_POSITIONAL]
                unknown = sorted(set(node) - set(known) - HYDRA_KEYS)
                if unknown:
                    name = target.rsplit(".", 1)[-1]
                    raise ValueError(
                        f"{path}.{unknown[0]} is not a setting of {name}; "
                        f"{checks.nearest(unknown[0], known)}"
                    )
        for key, value in node.items():
            walk(value, f"{path}.{key}" if path else str(key))

    settings = OmegaConf.to_container(cfg, resolve=False)  # the keys alone: nothing resolved
    walk({k: v for k, v in settings.items() if k != "hydra"}, "")


def check_model_fits_data(max_positions: Any, datamodule: Any) -> None:
    needed = datamodule.longest_sequence
    if max_positions < needed:
        raise ValueError(
            f"model.net.max_positions={max_positions} is below the {needed} positions the "
            f"data needs (max_length {datamodule.max_length} + <bos>/<eos>): raise "
            "model.net.max_positions or lower the data's max length"
        )


def check_trainer_config(trainer: DictConfig) -> None:
    """The Trainer settings a user types most, checked as the model's and data's are
    (Lightning itself would fail on most of them with a traceback, some only mid-run)."""

    def value(key: str) -> Any:
        return trainer.get(key)  # resolves this key alone (default_root_dir needs Hydra's run)

    for key in ("max_epochs", "max_steps"):
        steps = value(key)
        if steps is not None and not (checks.is_integer(steps) and (steps >= 1 or steps == -1)):
            raise ValueError(
                f"trainer.{key} must be a positive integer, or -1 for no limit, got "
                f"{checks.describe(steps)}"
            )
    for key in ("min_epochs", "min_steps"):
        if value(key) is not None:
            checks.integer(f"trainer.{key}", value(key), minimum=0)
    max_time = value("max_time")
    is_duration = isinstance(max_time, str) and MAX_TIME.match(max_time)
    if max_time is not None and not (is_duration and set(max_time) != {"0", ":"}):
        raise ValueError(
            "trainer.max_time must be a duration DD:HH:MM:SS longer than 0 (e.g. 00:00:30:00 "
            f"for 30 minutes; null for no time limit), got {checks.describe(max_time)}"
        )
    _check_devices(value("devices"))
    if value("precision") not in PRECISIONS:
        raise ValueError(
            "trainer.precision must be one of 32-true, 16-mixed, bf16-mixed, 16-true, "
            f"bf16-true, 64-true, got {checks.describe(value('precision'))}"
        )
    for key in ("accumulate_grad_batches", "log_every_n_steps", "num_nodes"):
        if value(key) is not None:
            checks.integer(f"trainer.{key}", value(key), minimum=1)
    if value("check_val_every_n_epoch") is not None:
        checks.integer("trainer.check_val_every_n_epoch", value("check_val_every_n_epoch"), 1)
    if value("gradient_clip_val") is not None:
        checks.number("trainer.gradient_clip_val", value("gradient_clip_val"), low=0)
    interval = value("val_check_interval")
    if interval is not None and not _batches_or_fraction(interval, zero=False):
        raise ValueError(
            "trainer.val_check_interval must be a fraction of an epoch in (0, 1] or a "
            f"number of batches >= 1, got {checks.describe(interval)}"
        )
    for stage in ("train", "val", "test"):
        limit = value(f"limit_{stage}_batches")
        if limit is not None and not _batches_or_fraction(limit, zero=True):
            raise ValueError(
                f"trainer.limit_{stage}_batches must be a fraction of the batches in [0, 1] or "
                f"a number of batches >= 0, got {checks.describe(limit)}"
            )


def checkpoint_to_resume(cfg: DictConfig) -> str | None:
    """ckpt_path, or the last checkpoint of the run directory given as resume."""
    path = cfg.get("ckpt_path")
    if cfg.get("resume"):
        if path:
            raise ValueError("give resume=RUN_DIR or ckpt_path=PATH, not both")
        path = str(RunDir(cfg.resume).last)
    if path and not Path(path).is_file():
        raise ValueError(f"checkpoint {path} does not exist: check ckpt_path or resume")
    return path


# What a resume may change: limits that extend (or end) the run, the devices it runs on, and
# what is logged, loaded in parallel or tested at the end. Anything else the run's checkpoint
# recorded (data, model, seed, optimizer, schedule, the other trainer settings) is refused.
RESUME_MAY_CHANGE = (
    "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.devices",
    "trainer.num_nodes", "trainer.log_every_n_steps", "trainer.enable_progress_bar",
    "trainer.enable_model_summary", "trainer.profiler", "data.num_workers", "data.pin_memory",
    "model.training.log_examples", "callbacks.progress_bar", "callbacks.lr_monitor", "test",
    "average_last", "callbacks.recent_checkpoints.save_top_k", "callbacks.time_budget.test",
    "pick_search", "callbacks.time_budget.pick_search",
    # Added since runs were made, and what they did before (their Trainers validated at epoch
    # ends, where both checks come after the validation): a run made before them resumes.
    "callbacks.early_stopping.check_on_train_epoch_end",
)  # fmt: skip
# What a replay may change: what is logged, shown, loaded in parallel, kept or tested; nothing
# that changes what is trained, or when.
REPLAY_MAY_CHANGE = (
    "trainer.log_every_n_steps", "trainer.enable_progress_bar", "trainer.enable_model_summary",
    "trainer.profiler", "data.num_workers", "data.pin_memory", "model.training.log_examples",
    "callbacks.progress_bar", "callbacks.lr_monitor", "test", "average_last",
    "callbacks.recent_checkpoints.save_top_k", "callbacks.time_budget.test", "pick_search",
    "callbacks.time_budget.pick_search",
)  # fmt: skip
# Where the run is and what it logs to: a moved run directory or another logger is no change.
RESUME_IGNORES = ("paths", "logger", "hydra", "resume", "ckpt_path", "task_name", "replay")
PATH_KEYS = ("dirpath", "save_dir", "default_root_dir", "data_dir")


def _net_defaults() -> dict[str, Any]:
    """ModelConfig's defaults: what a network option means in a run saved before it existed."""
    from dataclasses import MISSING, fields

    from seq2seq.core.model import ModelConfig

    return {f.name: f.default for f in fields(ModelConfig) if f.default is not MISSING}


# Every setting added since a resume began to compare the run's config (commit 9855e30), with
# the value that means what a run made before it did ("off"): a resumed or replayed run whose
# config lacks one takes this value, unless the command line gives it (a change like any other,
# then). The network's options (model.net.*) are ModelConfig's defaults. A setting added without
# its line here fails tests/test_resume.py (every key of every experiment removed in turn).
ADDED_SETTINGS: dict[str, Any] = {
    # At most a million pairs, as every run before it fitted on (the largest corpus then: 200k).
    "data.tokenizer.sample": 1_000_000,
    "data.bpe_dropout": 0.0,  # no BPE-dropout
    "data.corpus.streaming": False,  # the corpus cached whole
    "model.training.optimizer": "adamw",
    "model.training.cooldown_share": None,  # the schedule's own end (wsd's default cooldown)
    "model.training.dropout_min_epochs": None,  # dropout kept however few epochs the budget buys
    "model.training.dropout_from_epoch": None,  # dropout from the first step
    "model.training.muon_steps": 5,  # torch's Muon: 5 of Jordan's iterations in bf16
    "model.training.muon_coefficients": "jordan",
    "model.training.muon_precision": "bf16",
    "model.training.warmup_share": None,  # a warmup of warmup_steps, whatever the budget
    "validations": None,  # validations at trainer.val_check_interval, not by the clock
    "pick_search.beam_sizes": None,  # no search picked after fit
    "pick_search.length_penalties": None,
    "pick_search.metric": None,
    "callbacks.time_budget.test": True,  # time kept for the test, as before test=false existed
    "callbacks.time_budget.pick_search": None,
    # Its settings reach it as plain values; before, as config nodes it made plain itself.
    "callbacks.time_budget._convert_": "all",
    "init_from": None,  # a run from scratch
    # Validations at epoch ends, where both checks follow the validation: checked after it.
    "callbacks.early_stopping.check_on_train_epoch_end": False,
}


def has_off_value(key: str) -> bool:
    prefix, _, name = key.rpartition(".")
    return key in ADDED_SETTINGS or (prefix == "model.net" and name in _net_defaults())


def _off_value(key: str) -> Any:
    """What a setting newer than a run must be for the run to mean what it meant: a network
    option (model.net.norm, ...) its ModelConfig default, one of ADDED_SETTINGS its value there,
    anything else None."""
    prefix, _, name = key.rpartition(".")
    return _net_defaults().get(name) if prefix == "model.net" else ADDED_SETTINGS.get(key)


def read_as_made(
    cfg: DictConfig, saved: dict[str, Any], may_change: tuple[str, ...], given: set[str]
) -> None:
    """Every setting of cfg that the run's saved config lacks (one newer than the run) and that
    has an off value takes it, unless the command line gives it (given: its keys, a group such
    as data counting for its keys) or it may change anyway: the run goes on as it was made."""
    recorded = checks.flatten(saved)

    def set_by_hand(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") for g in given)

    current = checks.flatten(OmegaConf.to_container(cfg, resolve=False))
    newer = [
        key
        for key in current
        if key not in recorded
        and has_off_value(key)
        and not set_by_hand(key)
        and not _ignored(key, may_change)
    ]
    with open_dict(cfg):
        for key in newer:
            OmegaConf.update(cfg, key, _off_value(key), merge=False)


def check_resume(cfg: DictConfig, path: str, given: set[str] = frozenset()) -> None:
    """A checkpoint to resume must hold a training state, and the config must be the run's
    own (RESUME_MAY_CHANGE aside), as the checkpoint recorded it; the settings the run lacks
    read as off (read_as_made)."""
    from seq2seq.checkpoint import CheckpointError, load_checkpoint, run_record

    run_dir = Path(path).parent.parent
    try:
        checkpoint = load_checkpoint(path, mmap=True)  # its keys and config, not its weights
    except CheckpointError as error:
        others = sorted(p.name for p in Path(path).parent.glob("*.ckpt") if str(p) != path)
        hint = f"; the run's other checkpoints: {', '.join(others)}" if others else ""
        raise CheckpointError(
            f"{error}: resume from another checkpoint with ckpt_path=PATH{hint}"
        ) from None
    if not checkpoint.get("optimizer_states") or "loops" not in checkpoint:
        what = "an average of checkpoints" if "averaged_from" in checkpoint else "weights only"
        raise CheckpointError(
            f"{path} cannot be resumed: it holds no optimizer state or training position "
            f"({what}); resume from the run's last.ckpt, or test it with train=false "
            f"ckpt_path={path}"
        )
    saved = run_record(checkpoint)["run_config"]
    if saved is None:
        return  # a checkpoint written before runs saved their config: the model check remains
    read_as_made(cfg, saved, RESUME_MAY_CHANGE, given)
    difference = first_difference(cfg, saved, RESUME_MAY_CHANGE)
    if difference is not None:
        key, now, then = difference
        raise ValueError(
            f"{key}={now} differs from the run being resumed ({key}={then} in {path}): a "
            "resume continues the run as configured and may change only "
            f"{', '.join(RESUME_MAY_CHANGE[:5])} and logging; start a new run for other "
            f"settings (the run's own overrides: {run_dir}/.hydra/overrides.yaml)"
        )


def first_difference(
    cfg: DictConfig, saved: dict[str, Any], may_change: tuple[str, ...]
) -> tuple[str, Any, Any] | None:
    """The first setting (shallowest first) whose value in cfg differs from a run's saved
    config, as (key, now, then); None if none does. Keys under may_change or RESUME_IGNORES,
    and path keys, are not compared; a setting newer than the run counts as unchanged at its
    off value."""
    recorded = {
        k: current_target(v) if k.endswith("_target_") else v
        for k, v in checks.flatten(saved).items()
    }
    given = checks.flatten(OmegaConf.to_container(cfg, resolve=False))
    # Shallow keys first: seed=1 is reported as seed, not as the data.seed it also sets.
    for key in sorted(set(recorded) | set(given), key=lambda k: (k.count("."), k)):
        if _ignored(key, may_change):
            continue
        now = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        now = OmegaConf.to_container(now, resolve=True) if OmegaConf.is_config(now) else now
        if key in recorded and now == recorded[key]:
            continue
        if key not in recorded and now == _off_value(key):
            continue  # a setting newer than the run, at its default (off): nothing changes
        return key, now, recorded.get(key, "<not set>")
    return None


def replay_record(cfg: DictConfig, given: set[str] = frozenset()) -> Any:
    """With replay=RUN: RUN's clock record (seq2seq.training.clock), once the config is
    checked to be RUN's own (REPLAY_MAY_CHANGE aside) as its last checkpoint recorded it, the
    settings RUN lacks read as off (read_as_made); None without replay."""
    from seq2seq.checkpoint import CheckpointError, load_checkpoint, run_record
    from seq2seq.training.clock import read_record

    replay = cfg.get("replay")
    if not replay:
        return None
    if not cfg.train:
        raise ValueError(f"replay={replay} trains the run's config again: drop train=false")
    record = read_record(replay)
    last = RunDir(replay).last
    try:
        saved = run_record(load_checkpoint(last, mmap=True))["run_config"]
    except CheckpointError as error:
        raise ValueError(f"replay={replay}: {error}: the run's config is read from it") from None
    read_as_made(cfg, saved or {}, REPLAY_MAY_CHANGE, given)
    difference = first_difference(cfg, saved or {}, REPLAY_MAY_CHANGE)
    if difference is not None:
        key, now, then = difference
        commit = f" ({record.commit})" if record.commit else ""
        raise ValueError(
            f"{key}={now} differs from the replayed run ({key}={then} in {last}): a replay "
            "trains the run's own config and may change only logging, data.num_workers and "
            f"test; drop {key} from the command line, or, if this code's defaults changed "
            f"since, check out the commit the run was made at{commit}"
        )
    return record


# The modules that moved into the package's layers (seq2seq/core, seq2seq/training): a run
# saved before names its classes (model._target_, callbacks' _target_) at the old paths.
MOVED_MODULES = {
    **{name: "core" for name in ("attention", "kv_cache", "model", "decoding")},
    **{name: "training" for name in ("module", "optim", "metrics", "doctor", "callbacks",
                                     "launch", "preflight", "report", "sweep")},
}  # fmt: skip


def current_target(target: Any) -> Any:
    """A class's import path as the package spells it now (seq2seq.module.X, in a run saved
    before the layers, is seq2seq.training.module.X)."""
    if not isinstance(target, str):
        return target
    parts = target.split(".")
    if len(parts) > 2 and parts[0] == "seq2seq" and parts[1] in MOVED_MODULES:
        return ".".join(["seq2seq", MOVED_MODULES[parts[1]], *parts[1:]])
    return target


def _ignored(key: str, may_change: tuple[str, ...]) -> bool:
    def under(prefix: str) -> bool:
        return key == prefix or key.startswith(prefix + ".")

    if any(map(under, RESUME_IGNORES)) or any(map(under, may_change)):
        return True
    return key.rsplit(".", 1)[-1] in PATH_KEYS


def check_run_dir_is_new(run_dir: Path, resuming: bool) -> None:
    """A run never overwrites, or silently continues, another run's checkpoints."""
    earlier = sorted(RunDir(run_dir).checkpoints.glob("*.ckpt"))
    if earlier and not resuming:
        raise ValueError(
            f"the output directory {run_dir} already holds checkpoints of a run "
            f"({', '.join(p.name for p in earlier)}): continue it with resume={run_dir}, "
            "or start a new run in another directory (hydra.run.dir=PATH)"
        )


def _check_devices(devices: Any) -> None:
    ok = devices == "auto" or (checks.is_integer(devices) and (devices >= 1 or devices == -1))
    if isinstance(devices, str) and re.fullmatch(r"\d+(,\d+)*,?", devices.replace(" ", "")):
        ok = True  # "0,1": those GPU indices
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        ok = len(devices) > 0 and all(checks.is_integer(d) and d >= 0 for d in devices)
    if not ok:
        raise ValueError(
            "trainer.devices must be a positive integer, -1 (all), auto, or a list of device "
            f"indices such as [0,1], got {checks.describe(devices)}"
        )


def _batches_or_fraction(value: Any, zero: bool) -> bool:
    if checks.is_integer(value):
        return value >= (0 if zero else 1)
    if isinstance(value, float):
        return (value >= 0 if zero else value > 0) and value <= 1
    return False


def check_same_model(path: str, module: Any) -> None:
    """A checkpoint to resume must be of the configured model and vocabularies."""
    from seq2seq.checkpoint import load_checkpoint

    saved = load_checkpoint(path, mmap=True)["hyper_parameters"]
    saved_net = {**_net_defaults(), **saved.get("net", {})}  # options newer than the file: off
    for key, value in module.hparams["net"].items():
        if saved_net.get(key) != value:
            raise ValueError(
                f"{path} was trained with model.net.{key}={saved_net.get(key)}, the "
                f"config says {value}: resume with the config it was trained with (its run's "
                ".hydra/config.yaml), or start a new run without ckpt_path/resume"
            )
    for side in ("src_vocab", "tgt_vocab"):
        if saved.get(side) != module.hparams[side]:
            raise ValueError(
                f"{path} was trained on other data (its {side} differs from the configured "
                "data's): resume with the data config it was trained with"
            )


def check_output_dir(output_dir: Path, module: Any, resuming: bool, average_last: int) -> None:
    """Fail before training, not at the first checkpoint, when checkpoints cannot be written
    or would overwrite another run's."""
    check_run_dir_is_new(output_dir, resuming)

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"0")
        probe.unlink()
    except OSError as error:
        raise ValueError(
            f"cannot write to the output directory {output_dir} ({error.strerror or error}): "
            "make it writable or choose another with hydra.run.dir=PATH"
        ) from None
    # A checkpoint holds the weights and AdamW's two moments; best and last are kept, and a
    # third is written beside one of them before it replaces it. average_last keeps that many
    # more of the weights alone, one more while it replaces the oldest, and their average.
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    need = (9 + (average_last + 2 if average_last else 0)) * weights + 16 * 2**20
    free = shutil.disk_usage(output_dir).free
    if free < need:
        raise ValueError(
            f"only {free / 2**20:.1f} MiB free on the disk of {output_dir}; its checkpoints "
            f"need about {need / 2**20:.1f} MiB: free some space or choose another directory "
            "with hydra.run.dir=PATH"
        )
