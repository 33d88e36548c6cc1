"""Hydra commands behind ``python -m stimuli {invert,controversial,trials,merge,survey}``.

Each ``*_command(cfg)`` does the work for a composed config (``conf/stimuli_<name>.yaml``) and is
what the tests call; the ``*_main`` functions are the Hydra entry points that
:mod:`stimuli.__main__` dispatches to.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from training.config import (
    as_list,
    check_whole_number,
    concise_errors,
    dataset_from_config,
    expand_path,
    expand_path_options,
    model_from_config,
    representation_from_config,
    resolve_device,
)
from training.io import atomic_write_text
from training.sweeps import job_path

from .distances import set_trials
from .generate import ModelRef, make_controversial_set, make_inversion_set
from .sets import TRIALS_DIR, StimulusSet, find_shards, load_set, merge_sets, sha256_file, shard_path
from .sources import Targets, gaussian_targets, select_targets, stream_seed
from .survey import build_survey

logger = logging.getLogger("stimuli")

# Keys that say where and how a run executes, not what it makes: left out of the recorded config
# so that shards, resumptions and the unsharded run record the same config.
RUN_KEYS = ("out", "shard", "n_shards", "device", "overwrite", "keep_parts", "preview")


def recorded_config(cfg: DictConfig) -> dict:
    values = OmegaConf.to_container(cfg, resolve=True)
    return {k: v for k, v in values.items() if k not in RUN_KEYS}


def _out(cfg: DictConfig, default: str) -> Path:
    base = job_path(Path(cfg.out) if cfg.out else Path("sets") / default)  # in a multirun, a folder per job
    return shard_path(base, cfg.shard, cfg.n_shards) if cfg.n_shards > 1 else base


def _image_size(dataset: Any) -> tuple[int, int, int]:
    if hasattr(dataset, "images"):
        return tuple(dataset.images.shape[1:])
    image, _ = dataset[0]
    return tuple(image.shape)


def _targets(cfg: DictConfig, kind: str, n: int, test: Any, role: str = "targets") -> Targets:
    """The set's targets (or, ``role="origins"``, a controversial set's origins): refusals name ``role`` and ``n_<role>``."""
    if kind not in ("data", "gaussian"):
        raise ValueError(f"{role} must be data or gaussian, got {kind!r}")
    check_whole_number(n, f"n_{role}")
    if kind == "data":
        return select_targets(test, n, seed=cfg.seed, split="test", name=cfg.data.name, key=f"n_{role}")
    gaussians = OmegaConf.to_container(cfg.gaussians, resolve=True)
    return gaussian_targets(n, _image_size(test), gaussians, seed=cfg.seed)


def _model(model_cfg: DictConfig, data_name: str, device, seed: int, role: str) -> ModelRef:
    # Seed the initialisation, so that a model without a checkpoint is the same in every shard and
    # on every resumption (its weights are part of the set's fingerprint).
    torch.manual_seed(stream_seed(seed, f"model_init:{role}"))
    classifier = model_from_config(model_cfg, data_name).to(device)
    representation = representation_from_config(classifier, model_cfg)
    checkpoint = model_cfg.get("checkpoint")
    settings = OmegaConf.to_container(model_cfg.kwargs, resolve=True) if model_cfg.get("kwargs") else None  # e.g. a k-WTA ratio
    return ModelRef(model_cfg.name, representation, classifier, checkpoint=str(checkpoint) if checkpoint else None, layer=representation.layer,
                    settings=settings)


def _summary(stimulus_set: StimulusSet) -> str:
    results = stimulus_set.manifest[stimulus_set.manifest["role"] == "result"]
    loss = results["final_loss"]
    shard = f", shard {stimulus_set.shard['index']} of {stimulus_set.shard['count']}" if stimulus_set.shard else ""
    return (
        f"{stimulus_set.kind} set at {stimulus_set.path}{shard}: {len(stimulus_set)} images, {len(results)} results, "
        f"final loss median {loss.median():.4g} (min {loss.min():.4g}, max {loss.max():.4g})"
    )


def invert_command(cfg: DictConfig) -> StimulusSet:
    device = resolve_device(cfg.device)
    test = dataset_from_config(cfg.data, "test")
    targets = _targets(cfg, cfg.targets, cfg.n_targets, test)
    seeds = as_list(cfg.seeds, "seeds")  # seeds=noise is one seed type
    train = dataset_from_config(cfg.data, "train") if "train" in seeds else None
    model = _model(cfg.model, cfg.data.name, device, cfg.seed, "model")
    suffix = "-ood" if cfg.targets == "gaussian" else ""
    out = _out(cfg, f"inversion-{cfg.model.name}-{cfg.data.name}{suffix}")
    result = make_inversion_set(
        out, model, targets, seed_types=seeds, train_set=train, shared_noise=cfg.shared_noise, noise_channels=cfg.noise_channels,
        noise_kind=cfg.noise_kind, seed=cfg.seed,
        engine=cfg.invert, chunk_size=cfg.chunk_size, shard=cfg.shard, n_shards=cfg.n_shards, device=device,
        config=recorded_config(cfg), overwrite=cfg.overwrite, keep_parts=cfg.keep_parts, preview=cfg.preview,
    )
    logger.info(_summary(result))
    return result


def controversial_command(cfg: DictConfig) -> StimulusSet:
    device = resolve_device(cfg.device)
    test = dataset_from_config(cfg.data, "test")
    origins = _targets(cfg, cfg.origins, cfg.n_origins, test, role="origins")
    model_a = _model(cfg.model_a, cfg.data.name, device, cfg.seed, "model_a")
    model_b = _model(cfg.model_b, cfg.data.name, device, cfg.seed, "model_b")
    suffix = "-ood" if cfg.origins == "gaussian" else ""
    out = _out(cfg, f"{cfg.objective}-{cfg.model_a.name}-{cfg.model_b.name}-{cfg.data.name}{suffix}")
    result = make_controversial_set(
        out, model_a, model_b, origins, objective=cfg.objective, lam=cfg.lambda_, alpha=cfg.alpha,
        restarts=cfg.restarts, directions=as_list(cfg.directions, "directions"), start=cfg.start, start_sigma=cfg.start_sigma, seed=cfg.seed, engine=cfg.invert,
        chunk_size=cfg.chunk_size, shard=cfg.shard, n_shards=cfg.n_shards, device=device, config=recorded_config(cfg),
        overwrite=cfg.overwrite, keep_parts=cfg.keep_parts, preview=cfg.preview,
    )
    logger.info(_summary(result))
    return result


def trials_file_name(cfg: DictConfig) -> str:
    """``<task>-seed<seed>.csv``, with every setting that changes the table and is not its default, so that tables
    made with other settings sit side by side: ``-attention0.1``, ``-n50``, and hard clustering's distance
    (``-perceptual.observers.lpips_distance_matrix`` for ``perceptual.observers:lpips_distance_matrix``: the whole import
    path, as two modules may each have an ``lpips``; ``-human-similarity-<hash of its content>`` for
    ``human:similarity.csv``, as two labs' matrices may share a file name)."""
    name = f"{cfg.task}-seed{cfg.seed}"
    if cfg.attention_rate:
        name += f"-attention{cfg.attention_rate:g}"
    if cfg.n_trials is not None:
        name += f"-n{cfg.n_trials}"
    if cfg.task == "clustering_hard" and cfg.distance != "pixel_l2":
        distance = str(cfg.distance)
        if distance.startswith("human:"):
            matrix = expand_path(distance[len("human:"):])  # as load_similarity_matrix reads it: ~/a.csv hashes its content
            content = sha256_file(matrix)[:8] if matrix.is_file() else None
            label = "-".join(["human", matrix.stem] + ([content] if content else []))
        else:
            label = distance.replace(":", ".")
        name += "-" + re.sub(r"[^A-Za-z0-9_.]+", "-", label).strip("-.")
    return f"{name}.csv"


def trials_command(cfg: DictConfig) -> tuple[Path, pd.DataFrame]:
    check_whole_number(cfg.seed, "seed", least=0)  # before the set loads
    if cfg.out and Path(cfg.out).is_dir():
        raise ValueError(f"out={cfg.out} is a folder: out names the trial table's CSV file (or null for <set>/trials/...)")
    if cfg.out and Path(cfg.out).is_file() and not _is_trial_table(Path(cfg.out)):
        raise FileExistsError(f"out={cfg.out} exists and is not a trial table: choose another out (a table written before is replaced)")
    stimulus_set = load_set(cfg.set)
    table = set_trials(stimulus_set, cfg.task, seed=cfg.seed, attention_rate=cfg.attention_rate, n_trials=cfg.n_trials, distance=cfg.distance)
    out = Path(cfg.out) if cfg.out else Path(cfg.set) / TRIALS_DIR / trials_file_name(cfg)
    out = job_path(out.parent) / out.name
    atomic_write_text(out, table.to_csv(index=False))
    n_trials = table["trial"].nunique()
    checks = table.drop_duplicates("trial")["attention_check"].sum()
    logger.info("%d %s trials (%d attention checks) from %s written to %s", n_trials, cfg.task, checks, cfg.set, out)
    return out, table


def _is_trial_table(path: Path) -> bool:
    """Whether ``path`` is a CSV this command wrote (its header starts with the trial tables' columns)."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.readline().startswith("trial,")
    except (OSError, UnicodeDecodeError):
        return False


def merge_command(cfg: DictConfig) -> StimulusSet:
    inputs = [Path(p) for p in as_list(cfg.inputs, "inputs")] if cfg.inputs else find_shards(cfg.out)
    if not inputs:
        raise FileNotFoundError(f"no shards found under {Path(cfg.out) / 'shards'}: run the sharded commands first, or pass inputs=[...]")
    result = merge_sets(inputs, cfg.out, overwrite=cfg.overwrite, preview=cfg.preview)
    logger.info("merged %d shards: %s", len(inputs), _summary(result))
    return result


def survey_command(cfg: DictConfig) -> dict:
    sets = [str(s) for s in as_list(cfg.sets, "sets")]
    # labels=[0.5,1.0] reads as numbers: as text they match the measure report's labels
    labels = ([str(label) for label in as_list(cfg.labels, "labels")] if cfg.labels
              else [load_set(s).parameters.get("model", {}).get("name") or Path(s).name for s in sets])
    if len(labels) != len(sets) or len(set(labels)) != len(labels):
        raise ValueError(f"labels {labels} must name each of the {len(sets)} sets once: pass labels=[...] with distinct names")
    out = job_path(cfg.out)  # in a multirun, a package per job
    manifest = build_survey(
        dict(zip(labels, sets)), out, tasks=[str(t) for t in as_list(cfg.tasks, "tasks")], trials_per_survey=cfg.trials_per_survey,
        attention_rate=cfg.attention_rate,
        seed=cfg.seed, distance=cfg.distance, title=cfg.title, base_url=cfg.base_url, minutes=cfg.minutes,
        trial_order=cfg.trial_order, overwrite=cfg.overwrite,
    )
    logger.info("%d surveys, %d trials, package %s at %s (serve it and put input.csv on the platform; keep manifest.json private)",
                len(manifest["surveys"]), len(manifest["trials"]), manifest["fingerprint"], out)
    return manifest


@hydra.main(config_path="pkg://conf", config_name="stimuli_invert", version_base=None)
@concise_errors
def invert_main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    invert_command(cfg)


@hydra.main(config_path="pkg://conf", config_name="stimuli_controversial", version_base=None)
@concise_errors
def controversial_main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    controversial_command(cfg)


@hydra.main(config_path="pkg://conf", config_name="stimuli_trials", version_base=None)
@concise_errors
def trials_main(cfg: DictConfig) -> None:
    expand_path_options(cfg, folders=())  # out='~/x', $VARS: before any path is used; out is a CSV path here
    trials_command(cfg)


@hydra.main(config_path="pkg://conf", config_name="stimuli_merge", version_base=None)
@concise_errors
def merge_main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    merge_command(cfg)


@hydra.main(config_path="pkg://conf", config_name="stimuli_survey", version_base=None)
@concise_errors
def survey_main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    survey_command(cfg)


COMMANDS = {"invert": invert_main, "controversial": controversial_main, "trials": trials_main, "merge": merge_main, "survey": survey_main}
