"""Training the models a command needs with the toolkit's recipes: one checked ``conf/train.yaml`` config per model,
trained (or resumed: a finished run returns at once) in its own run directory. Shared by ``demo`` and ``reproduce``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from omegaconf import DictConfig

from training.config import check_overrides, check_train_config, override_value, quoted
from training.run import RunDirectory
from training.trainer import check_same_run, train


def training_config(*, model: str, model_kwargs: Mapping, data: Mapping, recipe: str, run_dir: str | Path, seed: int, device: str,
                    progress: bool, train_overrides: Mapping | None = None) -> DictConfig:
    """The ``python -m training`` config of one model, checked: a misspelt key is named before anything trains.
    ``train_overrides`` are keys of ``conf/train/<recipe>.yaml`` (dotted, e.g. ``attack.eps``)."""
    overrides = [
        f"model={model}",
        *[f"++model.kwargs.{key}={override_value(value)}" for key, value in model_kwargs.items()],  # None as null, "a,b" whole
        f"data={data['name']}",
        *([f"data.root={quoted(data['root'])}"] if data.get("root") else []),  # paths verbatim: '=', ',' or '~' in them
        f"train={recipe}",
        f"run_dir={quoted(run_dir)}",
        "resume=true",
        f"seed={seed}",
        f"device={device}",
        f"progress={str(progress).lower()}",
    ] + [f"train.{key}={override_value(value)}" for key, value in (train_overrides or {}).items()]
    config = check_overrides("train", overrides)
    check_train_config(config)
    return config


def finished_weights(run_dir: str | Path) -> Path | None:
    """The final weights of a completed run, or None when the run is missing or unfinished."""
    run = RunDirectory(run_dir)
    if not (run.model_path.is_file() and run.summary_path.is_file()):
        return None
    return run.model_path if json.loads(run.summary_path.read_text()).get("status") == "completed" else None


def train_models(configs: Mapping[str, DictConfig], log=print) -> dict[str, Path]:
    """Train (or resume) each model, reusing a completed run untouched; returns label -> its weight file.

    A completed run trained under other settings (model, data, recipe, seed) is refused, not reused, as the
    trainer refuses to resume one."""
    weights = {}
    for label, config in configs.items():
        done = finished_weights(config.run_dir)
        if done is not None:
            check_same_run(RunDirectory(config.run_dir).read_config_text(), config, Path(config.run_dir))
            weights[label] = done
            log(f"{label:>8}: reusing {config.run_dir}")
            continue
        result = train(config)
        weights[label] = result.run_dir / "model.safetensors"
        log(f"{label:>8}: {result.summary.get('clean_accuracy', float('nan')):.3f} clean accuracy ({result.run_dir})")
    return weights


__all__ = ["finished_weights", "train_models", "training_config"]
