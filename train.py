"""Train the seq2seq Transformer: `python train.py [overrides...]`.

    python train.py                                   # copy task, tiny model, CPU
    python train.py data=reverse model=small trainer=gpu
    python train.py -m model.net.num_heads=1,2,4 seed=0,1,2   # a sweep
    python train.py resume=outputs/train/runs/<run>         # continue a stopped run, in place

`train(cfg)` does the work and is what the tests call; `main` is the thin Hydra wrapper that
composes the config and turns bad input into a one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seq2seq.preflight import check_config, check_run_dir_is_new, checkpoint_to_resume
from seq2seq.score import signatures

log = logging.getLogger("train")
# Absolute, so Hydra finds it when train.py is imported (tests call cli() and main() in-process).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def resumed_run(train: bool, resume: str | None, ckpt_path: str | None) -> Path | None:
    """The run directory a training start continues in, or None for a new run."""
    if not train:
        return None  # evaluating a checkpoint never writes into its run
    if resume:
        return Path(resume)
    if ckpt_path and Path(ckpt_path).parent.name == "checkpoints":
        return Path(ckpt_path).parent.parent
    return None


# Used by configs/hydra/default.yaml. ${pid:} in run directory names: two runs started in the
# same microsecond still differ. A resumed run keeps its directory, and the config of each
# resume goes beside the first start's instead of over it.
OmegaConf.register_new_resolver("pid", lambda: os.getpid(), replace=True)
OmegaConf.register_new_resolver(
    "run_dir", lambda train, resume, ckpt, new: str(resumed_run(train, resume, ckpt) or new)
)
OmegaConf.register_new_resolver(
    "config_subdir",
    lambda train, resume, ckpt, now: (
        ".hydra" if resumed_run(train, resume, ckpt) is None else f".hydra/resume-{now}"
    ),
)


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

    With train=false, only tests the checkpoint at ckpt_path (decoding settings such as
    model.beam_size come from the config, everything else from the checkpoint).
    """
    import lightning as L

    if logging.getLogger().handlers:
        # `import lightning` adds its own console handler, and its records also reach the
        # root logger Hydra set up: without this every Lightning line would print twice.
        logging.getLogger("lightning").handlers.clear()
    L.seed_everything(cfg.seed, workers=True)
    log.info("Instantiating data <%s>", cfg.data._target_)
    datamodule = check_config(cfg)  # before the data is made: bad values fail at once
    # The vocabularies are needed to size the model; setup() is idempotent for Lightning.
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = build_module(cfg, datamodule)
    resume_from = checkpoint_to_resume(cfg) if cfg.train else None
    if resume_from:
        check_same_model(resume_from, module)
    if cfg.train:
        resuming = resume_from is not None
        check_output_dir(Path(cfg.paths.output_dir), module, resuming, cfg.average_last)

    callbacks = instantiate_group(cfg.get("callbacks"), "callback")
    loggers = instantiate_group(cfg.get("logger"), "logger")
    if not loggers:  # the learning-rate monitor refuses to run without a logger
        callbacks = [
            c for c in callbacks if not isinstance(c, L.pytorch.callbacks.LearningRateMonitor)
        ]
    log.info("Instantiating trainer <%s>", cfg.trainer._target_)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    try:
        test_metrics: dict[str, float] = {}
        best = last = tested = averaged = None
        if cfg.train:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
            # Read now: testing restores the callbacks' state as the best checkpoint saved it.
            best = _best_checkpoint(trainer)
            if cfg.average_last:
                run_dir = Path(cfg.paths.output_dir)
                averaged = average_last_checkpoints(run_dir, cfg.average_last, trainer)
            last_file = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
            last = str(last_file) if last_file.is_file() else None
            tested = averaged or best
            if best is None:
                log.warning("No checkpoint was saved; testing the weights in memory")
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
        "test": test_metrics,
        # How the BLEU and chrF here and in the metrics CSV were computed (sacreBLEU signatures).
        "signatures": signatures(module.hparams.bleu_tokenize),
    }
    if trainer.is_global_zero:
        _report(summary, datamodule)
    return summary


def check_same_model(path: str, module: Any) -> None:
    """A checkpoint to resume must be of the configured model and vocabularies."""
    from seq2seq.checkpoint import load_checkpoint

    saved = load_checkpoint(path)["hyper_parameters"]
    for key, value in module.hparams["net"].items():
        if saved.get("net", {}).get(key) != value:
            raise ValueError(
                f"{path} was trained with model.net.{key}={saved.get('net', {}).get(key)}, the "
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
    import shutil

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


def build_module(cfg: DictConfig, datamodule: Any) -> Any:
    """A new module sized by the data's vocabularies, or (train=false) the checkpoint's."""
    if cfg.train:
        log.info("Instantiating model <%s>", cfg.model._target_)
        module = instantiate(
            cfg.model,
            src_vocab=datamodule.src_vocab.to_dict(),
            tgt_vocab=datamodule.tgt_vocab.to_dict(),
        )
        module.run_config = OmegaConf.to_container(cfg, resolve=True)
        return module
    from seq2seq.checkpoint import load_module

    log.info("Loading model from %s", cfg.ckpt_path)
    module = load_module(cfg.ckpt_path)
    if (module.src_vocab, module.tgt_vocab) != (datamodule.src_vocab, datamodule.tgt_vocab):
        raise ValueError(
            f"the vocabulary of {cfg.ckpt_path} differs from the configured data's; "
            "evaluate with the data config the checkpoint was trained on"
        )
    for name in ("beam_size", "length_penalty", "max_len_a", "max_len_b"):
        module.hparams[name] = cfg.model[name]  # decoding settings may differ from training
    return module


def _report(summary: dict[str, Any], datamodule: Any) -> None:
    """Write summary.json and print where things are and how to use them."""
    run_dir = Path(summary["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    log.info("Run directory:   %s", run_dir)
    log.info("Best checkpoint: %s", summary["best_checkpoint"])
    for name, value in summary["test"].items():
        signature = summary["signatures"].get(name.split("/")[-1])
        log.info("%-16s %.4f%s", name + ":", value, f"  ({signature})" if signature else "")
    ckpt = summary["best_checkpoint"] or summary["last_checkpoint"]
    if ckpt:
        example = datamodule.src_vocab.decode(datamodule.splits["test"][0]["src_ids"])
        log.info('Translate with:  python -m seq2seq.translate --ckpt %s "%s"', ckpt, example)
        log.info("Inspect with:    python -m seq2seq.inspect %s", ckpt)
    if (run_dir / "csv").is_dir():
        from seq2seq.curves import write_curves

        log.info("Curves:          %s", write_curves(run_dir))
    hypotheses = run_dir / "test_hypotheses.txt"
    if hypotheses.is_file():
        log.info(
            "Re-score with:   python -m seq2seq.score %s %s", hypotheses,
            run_dir / "test_references.txt",
        )  # fmt: skip


def average_last_checkpoints(run_dir: Path, n: int, trainer: Any) -> str | None:
    """The average of the run's last n validation checkpoints (fewer if it validated fewer
    times), written beside them by rank 0; None if there are none."""
    from seq2seq.average import newest_recent, write_average

    paths = newest_recent(run_dir, n)
    if not paths:
        log.warning("average_last=%d: no validation checkpoints; testing the best one", n)
        return None
    if len(paths) < n:
        log.warning("average_last=%d: only %d validations; averaging those", n, len(paths))
    out = run_dir / "checkpoints" / f"average-last{len(paths)}.ckpt"
    if trainer.is_global_zero:
        write_average(paths, out)
        log.info("Averaged the last %d validation checkpoints into %s", len(paths), out)
    trainer.strategy.barrier()
    return str(out)


def _best_checkpoint(trainer: Any) -> str | None:
    """The best checkpoint of the callback that ranks by a metric (the others keep last.ckpt,
    or the most recent by step)."""
    ranked = [
        c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None) not in (None, "step")
    ]
    return next((c.best_model_path for c in ranked if c.best_model_path), None)


def _root_cause(error: BaseException) -> BaseException:
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def command_line_error(overrides: list[str]) -> str | None:
    """What is wrong with a command line, in one line; None if it composes and checks out.

    Runs before Hydra's main, which makes the run directory and its log: a bad command line
    leaves nothing behind. Hydra reports overrides it cannot compose over several lines (with
    its search path); composing once up front with the same overrides gives the same verdict
    with a message we can shape. Then the config's values get the checks train(cfg) starts
    with (seq2seq.preflight).
    """
    import hydra.errors
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
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
            return (
                f"{key} is not a setting of this config; check the spelling "
                f"(python train.py --cfg job lists them), or add a new key with +{key}=..."
            )
        return " ".join(message.split())
    except Exception:  # a run directory only Hydra itself can resolve: Hydra will judge it
        return None
    try:
        check_config(cfg)
        if cfg.train:
            check_run_dir_is_new(run_dir, resuming=checkpoint_to_resume(cfg) is not None)
    except (ValueError, InstantiationException) as error:
        return str(_root_cause(error))
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


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        summary = train(cfg)
    except (ValueError, InstantiationException) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {_root_cause(error)}", file=sys.stderr)
        sys.exit(1)
    except SIGTERMException:
        sys.exit(128 + 15)  # as a process killed by SIGTERM; last.ckpt is saved (see the log)
    # A sweeper (e.g. Optuna) optimises the returned value.
    return summary["test"].get("test/exact_match")


def cli() -> None:
    """`python train.py ...`: one line for a command line that does not compose or check out,
    then Hydra's main.

    Plain runs only: with Hydra's own flags (-m, --cfg, -cp, ...) or HYDRA_FULL_ERROR=1,
    Hydra reports as it does, and the checks run in train(cfg), after the run directory is made.
    """
    args = sys.argv[1:]
    plain = not any(arg.startswith("-") for arg in args)
    if plain and os.environ.get("HYDRA_FULL_ERROR") != "1":
        message = command_line_error(args)
        if message:
            print(f"error: {message}", file=sys.stderr)
            sys.exit(1)
    main()


if __name__ == "__main__":
    cli()
