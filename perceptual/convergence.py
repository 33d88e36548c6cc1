"""Convergence of inversions: did the optimiser reach the model's invariance set?

Nanda et al.'s method (AAAI 2023, Section 2.4) assumes that each inversion result x satisfies g(x) ≈ g(x_t);
an item whose normalised representation distance ``||g(x) - g(x_t)|| / ||g(x_t)||`` stays large measures the
optimiser, not the model. This module summarises a set's per-item distances (the best one, which the set keeps,
and the last iterate's), their curves over steps, and which items count as converged (best distance at or below
a threshold, 0.05 by default), so that reports show convergence next to every alignment number.

The distance is the set's ``final_task_loss``: the inversion objective alone at the kept image. ``final_loss`` is the
engine's whole objective, which with ``tv_weight``, ``lp_weight`` or ``transform_robust`` adds priors or averages over
transformations, and would call converged items unconverged (or the reverse). The loss curve and ``last_loss`` are
recorded on the whole objective only: with those settings on, the summary says so (``curve_includes_priors``).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from .report import save_figure

logger = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.05
# A model whose converged fraction falls below this is marked in Table 1 and warned about.
MIN_CONVERGED_FRACTION = 0.5


def check_threshold(threshold: float) -> None:
    """A convergence threshold is a positive finite normalised distance."""
    if isinstance(threshold, bool) or not (isinstance(threshold, (int, float)) and threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"the convergence threshold must be a positive number (a normalised distance), got {threshold!r}")


def search_extras(stimulus_set) -> list[str]:
    """The engine settings of ``stimulus_set`` that made its ``final_loss`` more than the inversion distance."""
    engine = (getattr(stimulus_set, "parameters", None) or {}).get("engine") or {}
    return [key for key in ("tv_weight", "lp_weight", "transform_robust") if engine.get(key)]


def result_distances(stimulus_set, results) -> np.ndarray:
    """Each result row's distance at its kept image: ``final_task_loss``, or ``final_loss`` where the set has none
    (made before the column, or from parts saved before it), which is the same number when no prior was on."""
    best = results["final_loss"].to_numpy(dtype=float)
    task = results["final_task_loss"].to_numpy(dtype=float) if "final_task_loss" in results else np.full(len(best), math.nan)
    extras = search_extras(stimulus_set)
    if np.isnan(task).any() and extras:
        logger.warning("%s was made with %s but does not record its inversion distances alone (made before final_task_loss): "
                       "convergence is judged on the whole objective; remake the set for the distances",
                       getattr(stimulus_set, "path", None) or "the set", ", ".join(extras))
    return np.where(np.isnan(task), best, task)


def convergence_summary(stimulus_set, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Per-item convergence of an inversion set's results.

    Returns the median and 90th percentile of the best (``final_task_loss``) and last-iterate (``last_loss``) distances,
    the fraction of items with best distance <= ``threshold``, the converged result ids, and the distance curve
    over steps (median, 10th and 90th percentile of each item's best distance so far, at the set's curve steps).
    """
    check_threshold(threshold)
    manifest = stimulus_set.manifest
    mask = (manifest["role"] == "result").to_numpy(dtype=bool)
    results = manifest[mask]
    if not len(results):
        raise ValueError("the set has no results to judge convergence on")
    best = result_distances(stimulus_set, results)
    last = results["last_loss"].to_numpy(dtype=float) if "last_loss" in results else np.full(len(results), math.nan)
    converged = best <= threshold
    curve = stimulus_set.loss_curve[torch.tensor(mask)].double().numpy() if len(stimulus_set.curve_steps) else np.empty((len(best), 0))

    def quantile(values: np.ndarray, q: float) -> float:
        values = values[np.isfinite(values)]
        return float(np.quantile(values, q)) if values.size else math.nan

    per_seed_type = {}
    if "seed_type" in results:
        for seed_type, rows in results.reset_index(drop=True).groupby("seed_type", sort=True).indices.items():
            values = best[rows]
            per_seed_type[str(seed_type)] = {"median": quantile(values, 0.5), "converged_fraction": float((values <= threshold).mean())}
    return {
        "threshold": float(threshold),
        "n_items": int(len(best)),
        "best_median": quantile(best, 0.5),
        "best_p90": quantile(best, 0.9),
        "last_median": quantile(last, 0.5),
        "last_p90": quantile(last, 0.9),
        "converged_fraction": float(converged.mean()),
        "converged_ids": [str(i) for i in results["id"][converged]],
        "by_seed_type": per_seed_type,
        "curve_includes_priors": bool(search_extras(stimulus_set)),
        "curve": {
            "steps": [int(s) for s in stimulus_set.curve_steps],
            "median": [float(v) for v in np.nanquantile(curve, 0.5, axis=0)] if curve.size else [],
            "p10": [float(v) for v in np.nanquantile(curve, 0.1, axis=0)] if curve.size else [],
            "p90": [float(v) for v in np.nanquantile(curve, 0.9, axis=0)] if curve.size else [],
        },
    }


def is_converged(summary: Mapping, min_fraction: float = MIN_CONVERGED_FRACTION) -> bool:
    """Whether enough of a model's items converged for its alignment numbers to describe the model."""
    return summary["converged_fraction"] >= min_fraction


def convergence_sentence(label: str, summary: Mapping, min_fraction: float = MIN_CONVERGED_FRACTION) -> str:
    """One line of plain words for the report."""
    fraction, threshold = summary["converged_fraction"], summary["threshold"]
    text = (f"{label}: {fraction:.0%} of {summary['n_items']} inversions reached a normalised distance <= {threshold:g} "
            f"(median {summary['best_median']:.3g}, 90th percentile {summary['best_p90']:.3g})")
    if fraction < min_fraction:
        text += (f"; NOT CONVERGED: fewer than {min_fraction:.0%} of its items reached the invariance set, so its alignment numbers "
                 "describe the optimiser as much as the model (more steps, a larger step size or converged_only=true)")
    return text


def convergence_figure(per_model: Mapping[str, Mapping], path: str | Path) -> Path:
    """Median and 10th-90th percentile band of the best normalised distance against steps, one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    threshold, whole_objective = None, False
    for label, summary in per_model.items():
        whole_objective |= bool(summary.get("curve_includes_priors"))
        curve = summary["curve"]
        if not curve["steps"]:
            continue
        steps = np.asarray(curve["steps"])
        line, = ax.plot(steps, curve["median"], label=f"{label} (median)")
        ax.fill_between(steps, curve["p10"], curve["p90"], color=line.get_color(), alpha=0.2)
        threshold = summary["threshold"]
    if threshold is not None:
        ax.axhline(threshold, color="grey", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_xlabel("optimisation step")
    ax.set_ylabel("objective with the priors (best so far)" if whole_objective else "normalised representation distance (best so far)")
    ax.set_title("Convergence of the inversions (band: 10th-90th percentile of items)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save_figure(fig, Path(path))


__all__ = [
    "DEFAULT_THRESHOLD", "MIN_CONVERGED_FRACTION", "convergence_figure", "convergence_sentence", "convergence_summary", "is_converged",
    "result_distances", "search_extras",
]
