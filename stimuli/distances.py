"""Distances between a set's targets, for hard clustering triplets, and trials built from a set.

``stimuli`` may not import ``perceptual`` (the LPIPS observer lives there), so the distance is
pluggable: a callable ``distance(images) -> (n, n)`` on [0, 1] images (n, C, H, W), or a name:
``pixel_l2`` (the default here) or ``"package.module:function"`` imported when asked for (e.g. an
LPIPS distance-matrix function from ``perceptual``, which the command line can name).

People's own similarity judgements can choose the hard triplets instead (``distance="human:PATH"``): a square
CSV of similarities between image ids, as Roads & Love (2021) collected for ImageNet, read with
:func:`load_similarity_matrix`. Nanda et al. (AAAI 2023, Section 2.5) built hard clustering triplets from the
"2 most similar images" of each anchor by such human judgements; choosing them with the simulated observer
itself (``distance=perceptual.observers:lpips_distance_matrix``) is circular: the judge picks its own hard trials.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, Union

import numpy as np
import pandas as pd
from torch import Tensor

from training.config import check_whole_number, expand_path

from .sets import StimulusSet
from .trials import TASKS, make_trials

DistanceMatrix = Callable[[Tensor], Union[Tensor, np.ndarray]]


def pixel_l2_distances(images: Tensor) -> Tensor:
    """Euclidean distances between the flattened [0, 1] images: (n, n), zero diagonal."""
    flat = images.detach().double().flatten(1)
    squared = (flat * flat).sum(1)
    # |a - b|^2 = |a|^2 + |b|^2 - 2ab in float64: equal images in different rows come out ~1e-6 apart, not 0 (exact
    # differences, torch.cdist's donot_use_mm mode, cost 18x the time at 1,000 CIFAR images); the diagonal is exactly 0
    d2 = (squared[:, None] + squared[None, :] - 2 * flat @ flat.T).clamp_min_(0)
    d2.fill_diagonal_(0)
    return d2.sqrt().float()


DISTANCES: dict[str, DistanceMatrix] = {"pixel_l2": pixel_l2_distances}


def resolve_distance(distance: str | DistanceMatrix) -> DistanceMatrix:
    """A distance-matrix function from a callable, a known name or ``"module:function"``."""
    if callable(distance):
        return distance
    if not isinstance(distance, str):
        raise TypeError(f"distance must be a callable or a name, got {type(distance).__name__}")
    if distance in DISTANCES:
        return DISTANCES[distance]
    if ":" in distance:
        module_name, _, attribute = distance.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot import the distance {distance!r} ({err}): give 'package.module:function'") from err
        if not callable(function):
            raise ValueError(f"{distance!r} is not callable")
        return function
    raise ValueError(f"unknown distance {distance!r}: use one of {sorted(DISTANCES)} or 'package.module:function'")


def load_similarity_matrix(path: str | Path) -> pd.DataFrame:
    """A square CSV of similarities (higher = more alike): the first row and the first column hold the same image
    ids in the same order. Refused with a message naming the problem: not square, ids that differ between rows
    and columns, duplicate ids, missing or non-numeric values."""
    path = expand_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"similarity matrix not found: {path}")
    table = pd.read_csv(path, index_col=0, dtype=str)  # ids as written: 00012 stays 00012 (the header keeps it so)
    table.columns = table.columns.map(str)
    if table.shape[0] != table.shape[1]:
        raise ValueError(f"{path}: a similarity matrix must be square (ids in the first row and column), got {table.shape}")
    if table.index.duplicated().any():  # first: pandas renames a repeated column id (a -> a.1), so the rows tell
        raise ValueError(f"{path}: duplicate ids {sorted(set(table.index[table.index.duplicated()]))[:5]}")
    if list(table.index) != list(table.columns):
        raise ValueError(f"{path}: the row ids and the column ids must be the same ids in the same order")
    values = table.apply(pd.to_numeric, errors="coerce")
    if values.isna().to_numpy().any():
        raise ValueError(f"{path}: {int(values.isna().to_numpy().sum())} missing or non-numeric similarities")
    return values.astype(np.float64)


def human_target_distances(stimulus_set: StimulusSet, similarity: pd.DataFrame) -> pd.DataFrame:
    """The set's targets' distances from a human similarity matrix (distance = -similarity, so the most similar
    targets are the nearest). A target is looked up by its set id, else by its source index in the data split."""
    rows, _ = stimulus_set.role("target")
    keys = []
    for row in rows.itertuples():
        if row.id in similarity.index:
            keys.append(row.id)
        elif getattr(row, "source_index", None) is not None and str(row.source_index) in similarity.index:
            keys.append(str(row.source_index))
        else:
            raise KeyError(f"target {row.id!r} (source index {getattr(row, 'source_index', None)}) is not in the similarity matrix")
    block = -similarity.loc[keys, keys].to_numpy()
    ids = list(rows["id"])
    return pd.DataFrame(block, index=ids, columns=ids)


def target_distances(stimulus_set: StimulusSet, distance: str | DistanceMatrix = "pixel_l2") -> pd.DataFrame:
    """Square table of distances between the set's targets, indexed by target id both ways
    (``distance="human:PATH"``: from a human similarity matrix, :func:`human_target_distances`)."""
    if isinstance(distance, str) and distance.startswith("human:"):
        return human_target_distances(stimulus_set, load_similarity_matrix(distance[len("human:"):]))
    rows, images = stimulus_set.role("target")
    if rows.empty:
        raise ValueError(f"the set ({stimulus_set.kind}) has no targets to measure distances between")
    matrix = resolve_distance(distance)(images)
    matrix = matrix.detach().cpu().numpy() if isinstance(matrix, Tensor) else np.asarray(matrix)
    n = len(rows)
    if matrix.shape != (n, n):
        raise ValueError(f"the distance function returned shape {matrix.shape}, expected ({n}, {n}) for {n} targets")
    if not np.isfinite(matrix).all():
        raise ValueError("the distance function returned NaN or Inf")
    ids = list(rows["id"])
    return pd.DataFrame(matrix.astype(np.float64), index=ids, columns=ids)


def set_trials(
    stimulus_set: StimulusSet,
    task: str,
    seed: int = 0,
    attention_rate: float = 0.0,
    n_trials: int | None = None,
    distance: str | DistanceMatrix = "pixel_l2",
) -> pd.DataFrame:
    """Trials (:mod:`stimuli.trials`) from an inversion set; ``clustering_hard`` measures the
    targets with ``distance``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: use one of {TASKS}")
    check_whole_number(seed, "seed", least=0)  # 1.5 reached numpy's SeedSequence as a traceback
    if stimulus_set.kind != "inversion":
        raise ValueError(
            f"trials are built from inversion sets (targets, seeds, results); this is a {stimulus_set.kind} set, "
            "which the observer scores by pairwise distances instead"
        )
    distances = target_distances(stimulus_set, distance) if task == "clustering_hard" else None
    return make_trials(stimulus_set.manifest, task, seed=seed, attention_rate=attention_rate, target_distances=distances, n_trials=n_trials)


__all__ = [
    "DISTANCES", "human_target_distances", "load_similarity_matrix", "pixel_l2_distances", "resolve_distance", "set_trials",
    "target_distances",
]
