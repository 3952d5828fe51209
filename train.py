"""Train the seq2seq Transformer: `python train.py [overrides...]`.

    python train.py                                   # copy task, tiny model, CPU
    python train.py data=reverse model=small trainer=gpu
    python train.py -m model.net.num_heads=1,2,4 seed=0,1,2   # a sweep
    python train.py resume=outputs/train/runs/<run>         # continue a stopped run, in place
    python train.py replay=outputs/train/runs/<run>         # a budgeted run again, exactly

`train(cfg)` does the work and is what the tests call; `main` is the thin Hydra wrapper that
composes the config and turns bad input into a one-line error, and `cli` checks a plain
command line before Hydra makes a run directory (seq2seq/training/launch.py).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seq2seq.run_dir import RunDir
from seq2seq.score import signatures

# Importing seq2seq.training.launch registers the configs' resolvers.
from seq2seq.training.launch import (
    check_command_line,
    command_line_keys,
    root_cause,
    with_run_overrides,
)
from seq2seq.training.preflight import (
    check_config,
    check_output_dir,
    check_same_model,
    evaluation_config,
)
from seq2seq.training.report import report

log = logging.getLogger("train")
# Absolute, so Hydra finds it when train.py is imported (tests call cli() and main() in-process).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def instantiate_group(group: DictConfig | None, kind: str) -> list[Any]:
    """Instantiate every entry of a config group that maps names to `_target_` configs."""
    objects = []
    for name, conf in (group or {}).items():
        if conf is not None and "_target_" in conf:
            log.info("Instantiating %s %s <%s>", kind, name, conf._target_)
            objects.append(instantiate(conf))
    return objects


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, then test the best checkpoint; returns (and writes) the run's summary.

    With train=false, only tests the checkpoint at ckpt_path: on the data its run was made
    with and with its model and decoding settings, but for the data.* and model.decoding.*
    keys the command line gives (preflight.evaluation_config).
    """
    import lightning as L

    from seq2seq.average import average_last_validations
    from seq2seq.training.callbacks import (
        FinalCheckpoint,
        SaveRunConfig,
        TimeBudget,
        best_checkpoint,
        clocked_validation,
        without_weight_averaging,
    )
    from seq2seq.training.memory import keep_freed_memory
    from seq2seq.training.pick import pick_search, record_in_checkpoint

    if logging.getLogger().handlers:
        # `import lightning` adds its own console handler, and its records also reach the
        # root logger Hydra set up: without this every Lightning line would print twice.
        logging.getLogger("lightning").handlers.clear()
    L.seed_everything(cfg.seed, workers=True)
    keep_freed_memory()  # a step's largest tensors are reused, not mapped anew each step
    if not cfg.train and cfg.get("ckpt_path"):
        evaluation_config(cfg, command_line_keys())  # the checkpoint's data, unless given
    log.info("Instantiating data <%s>", cfg.data._target_)
    # Before the data is made: bad values fail at once.
    datamodule, resume_from, replayed, grid, init_from = check_config(cfg, command_line_keys())
    module = build_module(cfg, *datamodule.tokenizers())
    if init_from and not resume_from:  # a resume's checkpoint holds the weights it reached
        from seq2seq.training.module import start_from

        start_from(module, init_from)
    if resume_from:
        check_same_model(resume_from, module)
    if cfg.train:
        resuming = resume_from is not None
        check_output_dir(Path(cfg.paths.output_dir), module, resuming, cfg.average_last)

    callbacks = instantiate_group(cfg.get("callbacks"), "callback")
    if replayed is not None:
        budget = next((c for c in callbacks if isinstance(c, TimeBudget)), None)
        if budget is None:
            raise ValueError(
                f"replay={cfg.replay} needs the time budget's callback "
                "(callbacks.time_budget), which this config has not: use callbacks=default"
            )
        budget.replay(replayed)
    callbacks.append(SaveRunConfig(OmegaConf.to_container(cfg, resolve=True)))
    if cfg.train:  # first: its on_train_end must run before a moving average's (its docstring)
        callbacks.insert(0, FinalCheckpoint(RunDir(cfg.paths.output_dir).last))
    loggers = instantiate_group(cfg.get("logger"), "logger")
    if not loggers:  # the learning-rate monitor refuses to run without a logger
        callbacks = [
            c for c in callbacks if not isinstance(c, L.pytorch.callbacks.LearningRateMonitor)
        ]
    log.info("Instantiating trainer <%s>", cfg.trainer._target_)
    clocked = clocked_validation(cfg.trainer.max_time, cfg.get("validations"))
    if clocked and "trainer.val_check_interval" in command_line_keys():
        log.warning(
            "trainer.val_check_interval is not used: validations=%s validates by the clock "
            "under trainer.max_time; add validations=null to validate at the interval",
            cfg.validations,
        )  # fmt: skip
    if cfg.get("validations") is not None and cfg.trainer.max_time is None:
        # An experiment may set validations for when a budget is given (parallel_bpe does);
        # typed on the command line without one, it is a mistake worth a line.
        level = logging.WARNING if "validations" in command_line_keys() else logging.INFO
        log.log(
            level,
            "validations=%s is not used: it spreads validations over a time budget, and "
            "trainer.max_time is not set; validating %s instead (add "
            "trainer.max_time=DD:HH:MM:SS to validate by the clock)",
            cfg.validations, at_interval(cfg.trainer.get("val_check_interval")),
        )  # fmt: skip
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **clocked)

    try:
        test_metrics: dict[str, float] = {}
        best = last = tested = averaged = picked = None
        if cfg.train:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
            without_weight_averaging(trainer)  # what is tested is the checkpoint's state_dict
            # Read now: testing restores the callbacks' state as the best checkpoint saved it.
            best = best_checkpoint(trainer)
            if cfg.average_last:
                run_dir = Path(cfg.paths.output_dir)
                averaged = average_last_validations(run_dir, cfg.average_last, trainer)
            last_file = RunDir(cfg.paths.output_dir).last
            last = str(last_file) if last_file.is_file() else None
            tested = averaged or best or last
            if best is None and last is not None:
                log.warning(
                    "No validation ranked a checkpoint best (none ran, or none logged %s); "
                    "testing the last one, %s",
                    OmegaConf.select(cfg, "callbacks.model_checkpoint.monitor"), last,
                )  # fmt: skip
            elif tested is None:
                log.warning("No checkpoint was saved; testing the weights in memory")
        if grid.active:
            monitor = OmegaConf.select(cfg, "callbacks.model_checkpoint.monitor")
            picked = pick_search(trainer, module, datamodule, grid, monitor, weights=tested)
            if tested is not None and trainer.is_global_zero:
                record_in_checkpoint(tested, picked)  # this run's checkpoint, never ckpt_path's
        if cfg.test:
            results = trainer.test(module, datamodule=datamodule, ckpt_path=tested)
            test_metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    finally:
        for logger in loggers:
            logger.finalize("success")

    summary = {
        "run_dir": str(Path(cfg.paths.output_dir)),
        "best_checkpoint": best if cfg.train else cfg.ckpt_path,
        "last_checkpoint": last,
        "averaged_checkpoint": averaged,  # with average_last: the checkpoint tested
        "picked_search": picked,  # with pick_search: each candidate's scores and the pick
        "test": test_metrics,
        # How the BLEU and chrF here and in the metrics CSV were computed (sacreBLEU signatures).
        "signatures": signatures(module.settings.bleu_tokenize),
    }
    if trainer.is_global_zero:
        report(summary, datamodule, module.config)
    return summary


def at_interval(interval: float | int | None) -> str:
    """Where trainer.val_check_interval validates, in words."""
    if interval is None or interval == 1.0:
        return "at every epoch's end"
    if isinstance(interval, float):
        return f"every {interval:g} of an epoch (trainer.val_check_interval={interval:g})"
    return f"every {interval} batches (trainer.val_check_interval={interval})"


def build_module(cfg: DictConfig, src_vocab: Any, tgt_vocab: Any) -> Any:
    """A new module sized by the data's tokenizers, or (train=false) the checkpoint's."""
    if cfg.train:
        log.info("Instantiating model <%s>", cfg.model._target_)
        return instantiate(cfg.model, src_vocab=src_vocab.to_dict(), tgt_vocab=tgt_vocab.to_dict())
    from seq2seq.training.module import load_for_evaluation

    log.info("Loading model from %s", cfg.ckpt_path)
    given = {key.rsplit(".", 1)[-1] for key in command_line_keys()
             if key.startswith("model.decoding.")}  # fmt: skip
    decoding = {name: cfg.model.decoding[name] for name in given if name in cfg.model.decoding}
    return load_for_evaluation(cfg.ckpt_path, (src_vocab, tgt_vocab), decoding)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        summary = train(cfg)
    except (ValueError, InstantiationException, MisconfigurationException) as error:
        # MisconfigurationException: Lightning's word on settings it cannot run with (e.g.
        # debug=limit's share of a split too small to hold a batch), which names the fix.
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {' '.join(str(root_cause(error)).split())}", file=sys.stderr)
        sys.exit(1)
    except SIGTERMException:
        sys.exit(128 + 15)  # as a process killed by SIGTERM; last.ckpt is saved (see the log)
    except SystemExit as stop:
        if isinstance(stop.__context__, KeyboardInterrupt):
            sys.exit(128 + 2)  # Ctrl-C, as the tools and a shell say it (Lightning exits 1)
        raise
    return optimized_value(cfg, summary)


def optimized_value(cfg: DictConfig, summary: dict) -> float | None:
    """What a sweeper (e.g. Optuna) optimises: the test split's value of the metric the
    checkpoints are ranked by (callbacks.model_checkpoint.monitor: val/exact_match by default,
    val/chrf for real text), so the search and the choice of checkpoint agree."""
    from seq2seq import metric_names

    monitor = OmegaConf.select(cfg, "callbacks.model_checkpoint.monitor")
    return summary["test"].get(metric_names.on_test(monitor or metric_names.DEFAULT_MONITOR))


def cli() -> None:
    """`python train.py ...`: a resume's command line gets the run's own overrides first; one
    line for a plain command line that does not compose or check out; then Hydra's main."""
    sys.argv[1:] = with_run_overrides(sys.argv[1:])
    check_command_line(sys.argv[1:], CONFIG_DIR)
    main()


if __name__ == "__main__":
    cli()
