"""A standard and a PGD-trained model with the same architecture and schedule, trained with the toolkit's
recipes (``training.trainer.train``): the demo's model pair and the audit's reference models.

A finished run (``summary.json`` says completed and ``model.safetensors`` is there) is reused as it is (the trainer
returns it without retraining or re-evaluating); an interrupted one resumes from its last checkpoint.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from omegaconf import DictConfig, OmegaConf

from training.config import flat_items

from .training_runs import train_models, training_config

PAIR_RECIPES = (("standard", "standard"), ("robust", "pgd"))


def pair_configs(cfg: DictConfig, runs_dir: str | Path) -> dict[str, DictConfig]:
    """The training configs of the standard and the PGD model (same architecture and schedule), checked.

    ``cfg`` holds ``model`` and ``model_kwargs`` (zoo architecture), ``data`` (a data config), ``schedule``
    (keys of conf/train/standard.yaml), ``attack`` (keys of conf/train/pgd.yaml's attack), ``seed``, ``device``
    and ``progress``; the runs go to ``runs_dir/standard`` and ``runs_dir/robust``."""
    configs = {}
    for label, recipe in PAIR_RECIPES:
        overrides = flat_items(cfg.schedule)
        if recipe == "pgd":
            overrides.update(flat_items(cfg.attack, "attack."))
        configs[label] = training_config(model=cfg.model, model_kwargs=cfg.model_kwargs, data=cfg.data, recipe=recipe,
                                         run_dir=Path(runs_dir) / label, seed=cfg.seed, device=cfg.device, progress=cfg.progress,
                                         train_overrides=overrides)
    return configs


def train_pair(configs: Mapping[str, DictConfig]) -> dict[str, Path]:
    """Train (or resume) each model; a completed run is reused untouched (see :func:`training.train`)."""
    return train_models(configs)


def pair_key(cfg: DictConfig) -> str:
    """A short name for a training setup (data set, architecture, schedule, attack, seed): the cache folder of
    its pair, so another audit with the same setup finds it."""
    fields = {key: OmegaConf.to_container(cfg[key], resolve=True) if isinstance(cfg[key], DictConfig) else cfg[key]
              for key in ("model", "model_kwargs", "seed")}
    # the schedule as the dotted keys it becomes: written nested or dotted, one setup keeps one cache folder
    fields |= {"schedule": flat_items(cfg.schedule), "attack": flat_items(cfg.attack)}
    fields["data"] = {"name": cfg.data.name, "root": cfg.data.get("root")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{cfg.data.name}-{cfg.model}-{digest}"
