"""Helpers the test files share (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

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
