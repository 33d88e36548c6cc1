"""The paper's results as tables and figures, from a ``measure`` report of the models a preset trained.

Nanda et al. (AAAI 2023) report their findings as Table 1 (architectures x standard / adversarial training),
Table 3 (in-distribution vs Gaussian-noise targets), Fig. 4 (alignment against robust accuracy across defences)
and Figs. 5-7 (one factor against another: loss x architecture, augmentation, contrastive vs supervised). Each
function here turns the report dict of :func:`perceptual.measure.measure_models` plus the preset's
:class:`Variant` list into that result, with the statistics a reviewer asks for:

* paired bootstrap intervals of the difference between two models measured on the same targets by the same
  observers (:func:`perceptual.statistics.paired_difference`: observers and targets resampled, pairs kept);
* for Fig. 4, Spearman's and Pearson's correlation between alignment and robust accuracy over the models, with a
  percentile-bootstrap interval that resamples models. Degenerate draws (fewer than three distinct models, or a
  constant column) have no correlation and are dropped rather than counted, which is why this is a small loop
  and not ``scipy.stats.bootstrap`` (that one propagates the NaN into the interval).

The paper reports humans and LPIPS; the authors' code averages four LPIPS variants (AlexNet and VGG16 with their
trained heads, VGG16 without heads twice) and shows their spread as error bars. Here every number is the observer
panel's mean (by default LPIPS with and without heads, SSIM, MS-SSIM and pixel L2), its spread across observers shown as
error bars, and a model whose inversions did not converge is marked with †.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr

from .report import TASK_TITLES, alignment_scatter, format_score, markdown_table, save_figure, scatter_points, spread
from .statistics import check_level, check_n_boot, model_difference, percentile_interval

RESULTS = ("table", "gaussian", "scatter", "grid")


@dataclass(frozen=True)
class Variant:
    """One model of a preset: an architecture of the scale trained with an entry of the training catalogue."""

    architecture: str
    training: str
    model: str
    kwargs: dict = field(default_factory=dict)
    recipe: str = "standard"
    adversarial: bool = False
    overrides: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.architecture}-{self.training}"


def _mark(label: str, result: Mapping) -> str:
    return f"{label} †" if not result.get("converged", True) else label


def _mean(result: Mapping, task: str) -> float:
    entry = result.get(task) or {}
    value = entry.get("mean") if isinstance(entry, Mapping) else None
    return math.nan if value is None else float(value)


def _interval(diff: Mapping) -> str:
    marker = " *" if diff["separated"] else ""
    return f"{100 * diff['difference']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}]{marker}"


def paired_against(models: Mapping[str, Mapping], pairs: Sequence[tuple[str, str]], tasks: Sequence[str], *, n_boot: int = 2000,
                   seed: int = 0) -> dict[str, dict[str, dict]]:
    """``{"a - b": {task: paired_difference}}`` for each ``(a, b)`` of ``pairs`` (labels of ``models``)."""
    check_n_boot(n_boot)  # not one of the undefined comparisons skipped below
    out: dict[str, dict[str, dict]] = {}
    for a, b in pairs:
        for task in tasks:
            try:
                out.setdefault(f"{a} - {b}", {})[task] = model_difference(models[a], models[b], task, n_boot=n_boot, seed=seed)
            except (ValueError, KeyError):
                continue  # a task the report does not have, or no shared targets: no interval rather than a wrong one
    return out


def _difference_table(differences: Mapping[str, Mapping[str, dict]], tasks: Sequence[str]) -> list[str]:
    if not differences:
        return []
    lines = ["", "Paired differences (percentage points, mean [95% bootstrap interval] over targets and observers; * = the interval"
             " excludes 0):", "",
             "| difference | " + " | ".join(TASK_TITLES.get(t, t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for name, per_task in differences.items():
        lines.append(f"| {name} | " + " | ".join(_interval(per_task[t]) if t in per_task else "n/a" for t in tasks) + " |")
    return lines


def baseline_pairs(variants: Sequence[Variant]) -> list[tuple[str, str]]:
    """Within each architecture, every training against the architecture's first training (its baseline)."""
    first: dict[str, str] = {}
    pairs = []
    for v in variants:
        if v.architecture not in first:
            first[v.architecture] = v.label
        else:
            pairs.append((v.label, first[v.architecture]))
    return pairs


def comparison_pairs(variants: Sequence[Variant], comparisons: Sequence[Sequence[str]] | None = None) -> list[tuple[str, str]]:
    """The model pairs whose paired differences a result reports: with ``comparisons`` (a preset's list of
    ``[training, baseline training]``), each of them within every architecture that has both (Fig. 6 asks about
    augmentation under each loss: ``[pgd_aug, pgd_noaug]``, not ``pgd_aug`` against ``standard_noaug``); without,
    :func:`baseline_pairs`."""
    if comparisons is None:
        return baseline_pairs(variants)
    trainings = list(dict.fromkeys(v.training for v in variants))
    for comparison in comparisons:
        if isinstance(comparison, str) or not isinstance(comparison, Sequence) or len(comparison) != 2 or comparison[0] == comparison[1]:
            raise ValueError(f"a comparison is [training, baseline training] of two different trainings, got {comparison!r}")
        unknown = [t for t in comparison if t not in trainings]
        if unknown:
            raise ValueError(f"comparison {list(comparison)} names {unknown}, not trainings of this experiment: use some of {trainings}")
    by_cell = {(v.architecture, v.training): v.label for v in variants}
    pairs = [(by_cell[arch, a], by_cell[arch, b]) for arch in dict.fromkeys(v.architecture for v in variants) for a, b in comparisons
             if (arch, a) in by_cell and (arch, b) in by_cell]
    if not pairs:
        raise ValueError(f"no architecture has both trainings of any comparison {[list(c) for c in comparisons]}: nothing to compare")
    return pairs


def table_result(data: Mapping, variants: Sequence[Variant], tasks: Sequence[str], title: str, *, n_boot: int = 2000, seed: int = 0,
                 comparisons: Sequence[Sequence[str]] | None = None) -> dict:
    """Table 1: one row per model (observer tasks, clean and robust accuracy), then each architecture's
    adversarial - standard difference (or the ``comparisons``, :func:`comparison_pairs`) with its paired interval."""
    models = data["models"]
    differences = paired_against(models, comparison_pairs(variants, comparisons), tasks, n_boot=n_boot, seed=seed)
    rows = {_mark(v.label, models[v.label]): models[v.label] for v in variants}
    lines = [markdown_table(rows, f"**{title}** (panel mean ± std over observers; † = inversions did not converge)").rstrip()]
    lines += _difference_table(differences, tasks)
    return {"markdown": "\n".join(lines) + "\n", "differences": differences}


def gaussian_result(data: Mapping, variants: Sequence[Variant], tasks: Sequence[str], title: str) -> dict:
    """Table 3: each observer task on test-image targets beside the same task on the Gaussian-noise targets."""
    models = data["models"]
    header = ["model"] + [f"{TASK_TITLES.get(t, t)}: {kind}" for t in tasks for kind in ("test images", "Gaussian")]
    lines = [f"**{title}** (panel mean ± std over observers; Gaussian = both of the authors' noise distributions pooled)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table = {}
    for v in variants:
        result = models[v.label]
        gaussian = result.get("gaussian")
        if gaussian is None:
            raise ValueError(f"model {v.label} has no Gaussian-target scores: the preset needs gaussian_targets: true")
        cells = []
        for task in tasks:
            for entry in (result.get(task) or {}, gaussian.get(task) or {}):
                cells.append(format_score(entry.get("mean"), entry.get("std")))
        table[v.label] = {t: {"test": _mean(result, t), "gaussian": _mean(gaussian, t)} for t in tasks}
        lines.append(f"| {_mark(v.label, result)} | " + " | ".join(cells) + " |")
    return {"markdown": "\n".join(lines) + "\n", "table": table}


# Fewer models give no bootstrap interval: of three, every draw that has a correlation is a reordering of the three
# (the interval is the estimate itself, zero wide); of four, most are.
MIN_MODELS_FOR_INTERVAL = 5


def correlation_with_interval(x: Sequence[float], y: Sequence[float], *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Spearman's rho and Pearson's r between ``x`` and ``y`` over models, each with a percentile-bootstrap interval
    resampling models (draws where the correlation is undefined are dropped; see the module docstring); the interval
    is NaN below :data:`MIN_MODELS_FOR_INTERVAL` models."""
    check_level(level)
    check_n_boot(n_boot)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    out = {"n_models": int(n)}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n)) if n >= MIN_MODELS_FOR_INTERVAL else np.empty((0, 0), dtype=int)
    for name, fn in (("spearman", lambda a, b: spearmanr(a, b)[0]), ("pearson", lambda a, b: pearsonr(a, b)[0])):
        defined = n >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0
        value = float(fn(x, y)) if defined else math.nan
        boots = []
        for index in draws:
            a, b = x[index], y[index]
            if len(np.unique(index)) >= 3 and np.ptp(a) > 0 and np.ptp(b) > 0:
                boots.append(float(fn(a, b)))
        low, high = percentile_interval(boots, level)
        out[name] = {"value": value, "ci_low": low, "ci_high": high, "valid_draws": len(boots)}
    return out


def scatter_result(data: Mapping, variants: Sequence[Variant], tasks: Sequence[str], title: str, out: Path, *, n_boot: int = 2000,
                   seed: int = 0) -> dict:
    """Fig. 4: each task against robust accuracy over the defences, the correlations with intervals, one figure per task."""
    models = data["models"]
    robust = [models[v.label].get("robust_accuracy") for v in variants]
    if any(r is None for r in robust):
        raise ValueError("Fig. 4 needs every model's robust accuracy: the scale's measure.threat must not be null")
    correlations, figures = {}, []
    lines = [f"**{title}** (correlation over the models; 95% bootstrap intervals resampling models, from {MIN_MODELS_FOR_INTERVAL} models)", "",
             "| task | models | Spearman rho | Pearson r |", "|---|---|---|---|"]
    for task in tasks:
        alignment = [_mean(models[v.label], task) for v in variants]
        corr = correlation_with_interval(robust, alignment, n_boot=n_boot, seed=seed)
        correlations[task] = corr
        cells = [str(corr["n_models"])]
        for c in (corr["spearman"], corr["pearson"]):
            if not math.isfinite(c["value"]):
                cells.append("undefined (a constant column)" if corr["n_models"] >= 3 else "undefined (fewer than 3 models)")
            elif math.isfinite(c["ci_low"]):
                cells.append(f"{c['value']:+.2f} [{c['ci_low']:+.2f}, {c['ci_high']:+.2f}]")
            else:
                cells.append(f"{c['value']:+.2f} (no interval from {corr['n_models']} models)")
        lines.append(f"| {TASK_TITLES.get(task, task)} | " + " | ".join(cells) + " |")
        marked = {_mark(v.label, models[v.label]): models[v.label] for v in variants}
        if scatter_points(marked, task):
            figures.append(alignment_scatter(marked, out / f"scatter_{task}.png", task=task).name)
    rows = {_mark(v.label, models[v.label]): models[v.label] for v in variants}
    lines += ["", markdown_table(rows).rstrip()]
    return {"markdown": "\n".join(lines) + "\n", "correlations": correlations, "figures": figures}


def grid_result(data: Mapping, variants: Sequence[Variant], tasks: Sequence[str], title: str, out: Path, *, n_boot: int = 2000,
                seed: int = 0, comparisons: Sequence[Sequence[str]] | None = None) -> dict:
    """Figs. 5-7: one panel per task, architectures on the x axis, one bar per training (panel mean, error bar = std
    over observers), and every training against its architecture's first training (or the ``comparisons``,
    :func:`comparison_pairs`) as a paired interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data["models"]
    architectures = list(dict.fromkeys(v.architecture for v in variants))
    trainings = list(dict.fromkeys(v.training for v in variants))
    by_cell = {(v.architecture, v.training): v for v in variants}
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False, layout="constrained")  # room for the two-line title
    width = 0.8 / len(trainings)
    for ax, task in zip(axes[0], tasks):
        for j, training in enumerate(trainings):
            xs, means, stds = [], [], []
            for i, arch in enumerate(architectures):
                v = by_cell.get((arch, training))
                if v is None:
                    continue
                entry = models[v.label].get(task) or {}
                xs.append(i + (j - (len(trainings) - 1) / 2) * width)
                means.append(100 * (entry.get("mean") if entry.get("mean") is not None else math.nan))
                stds.append(100 * spread(entry))
            ax.bar(xs, means, width, yerr=stds, capsize=2, label=training)
        ax.axhline(100 / 3 if task.startswith("clustering") else 50, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(architectures)), architectures)
        ax.set_xlabel("architecture")
        ax.set_ylabel(f"observer {TASK_TITLES.get(task, task)} accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(TASK_TITLES.get(task, task))
    axes[0][0].legend(fontsize=7, title="training", title_fontsize=7)
    fig.suptitle(f"{title}\n(bars: observer-panel mean; error bars: ± std over observers; dashed: chance)", fontsize=9)
    figure = save_figure(fig, out / "grid.png").name
    differences = paired_against(models, comparison_pairs(variants, comparisons), tasks, n_boot=n_boot, seed=seed)
    rows = {_mark(v.label, models[v.label]): models[v.label] for v in variants}
    lines = [markdown_table(rows, f"**{title}** (panel mean ± std over observers; † = inversions did not converge)").rstrip()]
    lines += _difference_table(differences, tasks)
    return {"markdown": "\n".join(lines) + "\n", "differences": differences, "figures": [figure]}


def experiment_result(kind: str, data: Mapping, variants: Sequence[Variant], tasks: Sequence[str], title: str, out: str | Path, *,
                      n_boot: int = 2000, seed: int = 0, comparisons: Sequence[Sequence[str]] | None = None) -> dict:
    """The preset's result (``kind`` one of :data:`RESULTS`) as ``{"markdown", ...numbers, "figures"}``; figures go to ``out``;
    ``comparisons`` names the paired differences of a table or grid (:func:`comparison_pairs`)."""
    out = Path(out)
    if kind == "table":
        result = table_result(data, variants, tasks, title, n_boot=n_boot, seed=seed, comparisons=comparisons)
    elif kind == "gaussian":
        result = gaussian_result(data, variants, tasks, title)
    elif kind == "scatter":
        result = scatter_result(data, variants, tasks, title, out, n_boot=n_boot, seed=seed)
    elif kind == "grid":
        result = grid_result(data, variants, tasks, title, out, n_boot=n_boot, seed=seed, comparisons=comparisons)
    else:
        raise ValueError(f"unknown experiment result {kind!r}: use one of {RESULTS}")
    result.setdefault("figures", [])
    result["variants"] = [{**asdict(v), "label": v.label} for v in variants]
    return result


__all__ = ["RESULTS", "Variant", "baseline_pairs", "comparison_pairs", "correlation_with_interval", "experiment_result", "gaussian_result", "grid_result",
           "paired_against", "scatter_result", "table_result"]
