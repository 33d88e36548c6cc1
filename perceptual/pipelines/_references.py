"""A standard and a PGD-trained model with the same architecture and schedule, trained with the toolkit's
recipes (``training.trainer.train``): the demo's model pair and the audit's reference models.

A finished run (``summary.json`` says completed and ``model.safetensors`` is there) is reused as it is; an
interrupted one resumes from its last checkpoint.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from omegaconf import DictConfig, OmegaConf

from training.config import check_overrides, check_train_config
from training.run import RunDirectory
from training.trainer import train

PAIR_RECIPES = (("standard", "standard"), ("robust", "pgd"))


def pair_configs(cfg: DictConfig, runs_dir: str | Path) -> dict[str, DictConfig]:
    """The training configs of the standard and the PGD model (same architecture and schedule), checked.

    ``cfg`` holds ``model`` and ``model_kwargs`` (zoo architecture), ``data`` (a data config), ``schedule``
    (keys of conf/train/standard.yaml), ``attack`` (keys of conf/train/pgd.yaml's attack), ``seed``, ``device``
    and ``progress``; the runs go to ``runs_dir/standard`` and ``runs_dir/robust``."""
    configs = {}
    for label, recipe in PAIR_RECIPES:
        overrides = [
            f"model={cfg.model}",
            *[f"+model.kwargs.{key}={value}" for key, value in cfg.model_kwargs.items()],
            f"data={cfg.data.name}",
            *([f"data.root={cfg.data.root}"] if cfg.data.get("root") else []),
            f"train={recipe}",
            f"run_dir={Path(runs_dir) / label}",
            "resume=true",
            f"seed={cfg.seed}",
            f"device={cfg.device}",
            f"progress={str(cfg.progress).lower()}",
        ] + [f"train.{key}={value}" for key, value in cfg.schedule.items()]
        if recipe == "pgd":
            overrides += [f"train.attack.{key}={value}" for key, value in cfg.attack.items()]
        configs[label] = check_overrides("train", overrides)  # a misspelt schedule key is named, not appended
        check_train_config(configs[label])
    return configs


def finished_weights(run_dir: str | Path) -> Path | None:
    """The final weights of a completed run, or None when the run is missing or unfinished."""
    run = RunDirectory(run_dir)
    if not (run.model_path.is_file() and run.summary_path.is_file()):
        return None
    return run.model_path if json.loads(run.summary_path.read_text()).get("status") == "completed" else None


def train_pair(configs: Mapping[str, DictConfig]) -> dict[str, Path]:
    """Train (or resume) each model, reusing a completed run untouched; returns their weight files."""
    weights = {}
    for label, train_cfg in configs.items():
        done = finished_weights(train_cfg.run_dir)
        if done is not None:
            weights[label] = done
            print(f"{label:>8}: reusing {train_cfg.run_dir}")
            continue
        result = train(train_cfg)
        weights[label] = result.run_dir / "model.safetensors"
        print(f"{label:>8}: {result.summary.get('clean_accuracy', float('nan')):.3f} clean accuracy ({result.run_dir})")
    return weights


def pair_key(cfg: DictConfig) -> str:
    """A short name for a training setup (data set, architecture, schedule, attack, seed): the cache folder of
    its pair, so another audit with the same setup finds it."""
    fields = {key: OmegaConf.to_container(cfg[key], resolve=True) if isinstance(cfg[key], DictConfig) else cfg[key]
              for key in ("model", "model_kwargs", "schedule", "attack", "seed")}
    fields["data"] = {"name": cfg.data.name, "root": cfg.data.get("root")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{cfg.data.name}-{cfg.model}-{digest}"
