"""Error alignment across families of system pairs: per-family z-scores and global vs average correlation between metrics.

After Xu et al., "Measuring Error Alignment" (AAAI-AIA; code xubinxia/error_align). They compute the pair metrics
(error consistency, misclassification agreement, CLES, SOC, SOCE, CKA) for every pair of systems in each data set, and
correlate the metrics (Spearman) within each data set. Here a *family* is one such group of pairs, e.g. one distortion
condition of ``compare`` or one experiment/condition of the model-vs-human trials.

Why both numbers: pooling every pair of every family into one Spearman correlation (the *global* correlation) mixes
the differences between families (a hard condition lowers every metric at once) with the agreement of the metrics on
which pairs are more alike; the *average* correlation (mean over families of the per-family Spearman) keeps only the
latter. Standardising each metric within its family (z-score: minus the family's mean, over its standard deviation,
ddof 0) before pooling removes the families' offsets and scales, so the *global z-scored* correlation is the pooled
counterpart of the average. Where global and average disagree, a metric tracks the families' difficulty rather than
the pairs' alignment.

Provenance: the authors' public code (``MisclassificationAlignment.ipynb``, ``functional/utils.py``) computes the pair
metrics and the Spearman correlation per data set; the within-family z-scores and the pooled (global) correlation
follow the paper's description as issue #19 states it, not code we could check line by line.

Deliberate choices: NaN values (undefined metrics) are left out pairwise; a family where a metric is constant has no
z-scores for it (NaN) and no correlation with it; a correlation needs at least three pairs with both values.
"""
from __future__ import annotations

import math
import warnings
from itertools import combinations
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .report import save_figure

MIN_PAIRS = 3


def pair_table(per_family: Mapping[str, Mapping[str, np.ndarray]], systems: Sequence[str]) -> pd.DataFrame:
    """One row per family and distinct system pair (``family, system_a, system_b``) and one column per metric, from
    ``{family: {metric: (S, S) symmetric matrix}}`` (the upper triangles; rows and columns in ``systems`` order)."""
    rows = []
    for family, matrices in per_family.items():
        for name, matrix in matrices.items():
            if np.shape(matrix) != (len(systems), len(systems)):
                raise ValueError(f"family {family!r}, metric {name!r}: matrix of shape {np.shape(matrix)}, expected {len(systems)} × {len(systems)}")
        for i, j in combinations(range(len(systems)), 2):
            rows.append({"family": family, "system_a": systems[i], "system_b": systems[j],
                         **{name: float(matrix[i][j]) for name, matrix in matrices.items()}})
    if not rows:
        raise ValueError("no system pairs: need at least two systems and one family")
    return pd.DataFrame(rows)


def _metrics(table: pd.DataFrame, metrics: Sequence[str] | None, family: str) -> list[str]:
    names = [c for c in table.columns if c not in (family, "system_a", "system_b")] if metrics is None else list(metrics)
    missing = [m for m in names if m not in table.columns]
    if missing:
        raise ValueError(f"metric column(s) {missing} not in the table; it has {list(table.columns)}")
    if family not in table.columns:
        raise ValueError(f"no family column {family!r} in the table")
    return names


def family_zscores(table: pd.DataFrame, metrics: Sequence[str] | None = None, family: str = "family") -> pd.DataFrame:
    """The table with each metric standardised within each family (population z-score, NaN omitted; NaN where the
    family's values are constant)."""
    names = _metrics(table, metrics, family)
    out = table.copy()
    if not names:
        return out
    grouped = table.groupby(family, sort=False)[names]
    mean, std = grouped.transform("mean"), grouped.transform(lambda v: v.std(ddof=0))
    spread = grouped.transform("max") - grouped.transform("min")  # not std > 0: rounding leaves [0.1, 0.1, 0.1] a std of 1e-17
    out[names] = (table[names] - mean) / std.where(spread > 0)
    return out


def _spearman(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    return frame[list(names)].corr(method="spearman", min_periods=MIN_PAIRS).to_numpy()


def metric_correlations(table: pd.DataFrame, metrics: Sequence[str] | None = None, family: str = "family") -> dict:
    """Spearman's rho between every two metrics: ``per_family`` ({family: K × K}), ``average`` (their entry-wise
    mean, families without a value skipped), ``global`` (all pairs pooled, raw values) and ``global_z`` (pooled after
    :func:`family_zscores`); ``n_pairs`` per family."""
    names = _metrics(table, metrics, family)
    per_family = {str(f): _spearman(g, names) for f, g in table.groupby(family, sort=False)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an entry no family defines is NaN, as documented
        average = np.nanmean(np.stack(list(per_family.values())), axis=0)
    return {
        "metrics": names,
        "families": list(per_family),
        "n_pairs": {str(f): int(len(g)) for f, g in table.groupby(family, sort=False)},
        "per_family": per_family,
        "average": average,
        "global": _spearman(table, names),
        "global_z": _spearman(family_zscores(table, names, family), names),
    }


def error_alignment(per_family: Mapping[str, Mapping[str, np.ndarray]], systems: Sequence[str], metrics: Sequence[str] | None = None) -> dict:
    """The whole analysis from per-family pair matrices: the pair table with its z-scores and the correlations."""
    table = pair_table(per_family, systems)
    names = _metrics(table, metrics, "family")
    usable = [m for m in names if table[m].notna().sum() >= MIN_PAIRS]  # e.g. CKA, undefined for observers, drops out
    zscores = family_zscores(table, usable)
    return {"table": table, "zscores": zscores, "correlations": metric_correlations(table, usable),
            "left_out": sorted(set(names) - set(usable))}


def correlation_figure(correlations: Mapping, path: str | Path) -> Path:
    """Three heatmaps side by side: global (raw), global (z-scored per family) and average over families."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = correlations["metrics"]
    panels = (("global", "global (all pairs pooled)"), ("global_z", "global, z-scored per family"), ("average", "average over families"))
    size = 1.5 + 0.55 * len(names)
    fig, axes = plt.subplots(1, 3, figsize=(3 * size + 1.5, size), squeeze=False)
    cmap = matplotlib.colormaps["coolwarm"].with_extremes(bad="#dddddd")
    for k, (ax, (key, title)) in enumerate(zip(axes[0], panels)):
        matrix = np.asarray(correlations[key], dtype=float)
        image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=-1, vmax=1)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(names)), names if k == 0 else [], fontsize=7)  # the names once, on the left
        ax.set_xlabel("metric")
        if k == 0:
            ax.set_ylabel("metric")
        for i in range(len(names)):
            for j in range(len(names)):
                if not math.isnan(matrix[i, j]):
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6)
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), fraction=0.02, pad=0.02, label="Spearman's rho")
    fig.suptitle(f"Correlation between metrics over system pairs ({len(correlations['families'])} families; grey: undefined, "
                 "too few pairs or a constant metric)", fontsize=10)
    return save_figure(fig, path)


def zscore_figure(zscores: pd.DataFrame, metrics: Sequence[str], path: str | Path) -> Path:
    """Per metric, each family's z-scored pair values (a strip per family): how the pairs spread within families."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(zscores["family"]))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(5.0, 0.45 * len(families) + 2), 1.9 * len(metrics)), squeeze=False, sharex=True)
    for ax, metric in zip(axes[:, 0], metrics):
        for x, family in enumerate(families):
            values = zscores.loc[zscores["family"] == family, metric].dropna().to_numpy()
            ax.plot(np.full(len(values), x) + np.linspace(-0.15, 0.15, len(values)), values, "o", markersize=3, alpha=0.7)
        if zscores[metric].notna().sum() == 0:  # an empty panel with a meaningless axis said nothing about why
            ax.text(0.5, 0.5, "no z-scores: a family needs two pairs with different values (e.g. more than two systems)",
                    transform=ax.transAxes, ha="center", va="center", fontsize=7, color="grey")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_ylabel(f"{metric}\n(z)", fontsize=8)
    axes[-1, 0].set_xticks(range(len(families)), families, rotation=90, fontsize=7)
    axes[-1, 0].set_xlabel("family")
    axes[0, 0].set_title("Pair metrics z-scored within each family (one point per system pair)", fontsize=9)
    return save_figure(fig, path)


def summary_lines(data: Mapping) -> list[str]:
    """Markdown: the global, z-scored global and average Spearman of every two metrics (from :func:`write_error_alignment`)."""
    names = data["metrics"]

    def cell(value) -> str:
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"

    lines = ["## Error alignment: global vs average correlation between metrics (Xu et al.)", "",
             f"Families: {len(data['families'])} ({', '.join(data['families'][:8])}{' ...' if len(data['families']) > 8 else ''}). "
             "Global: Spearman over all system pairs pooled; z-scored: after standardising each metric within its family; "
             "average: mean of the per-family Spearman." + (f" Left out (too few defined values): {', '.join(data['left_out'])}." if data["left_out"] else ""),
             "", "| metric pair | global | global (z-scored) | average |", "|---|---|---|---|"]
    for i, j in combinations(range(len(names)), 2):
        lines.append(f"| {names[i]} / {names[j]} | {cell(data['global'][i][j])} | {cell(data['global_z'][i][j])} | {cell(data['average'][i][j])} |")
    return lines + [""] + [f"- ![{f}]({f})" for f in data["figures"]] + [""]


def write_error_alignment(analysis: Mapping, out: str | Path) -> dict:
    """``error_alignment.json``, ``error_alignment_pairs.csv`` (raw and z-scored values) and the two figures in ``out``;
    returns what the JSON holds (figure paths relative to ``out``)."""
    from training.io import atomic_write_json, atomic_write_text

    from .report import plain

    out = Path(out)
    correlations = analysis["correlations"]
    figures = []
    if correlations["metrics"]:  # none when every metric has fewer than three defined pairs (e.g. two systems)
        figures.append(correlation_figure(correlations, out / "figures" / "error_alignment_correlations.png"))
        figures.append(zscore_figure(analysis["zscores"], correlations["metrics"], out / "figures" / "error_alignment_zscores.png"))
    zscored = analysis["zscores"].rename(columns={m: f"{m}_z" for m in correlations["metrics"]})
    joined = pd.concat([analysis["table"], zscored[[f"{m}_z" for m in correlations["metrics"]]]], axis=1)
    atomic_write_text(out / "error_alignment_pairs.csv", joined.to_csv(index=False))
    data = {**correlations, "left_out": analysis["left_out"], "figures": [p.relative_to(out).as_posix() for p in figures]}
    atomic_write_json(out / "error_alignment.json", plain(data))
    return data


__all__ = ["correlation_figure", "error_alignment", "family_zscores", "metric_correlations", "pair_table", "summary_lines", "write_error_alignment",
           "zscore_figure"]
