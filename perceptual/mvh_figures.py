"""The model-vs-human benchmark's figures from :mod:`perceptual.mvh_analysis` tables (matplotlib, Agg, PNG).

After Geirhos et al. (NeurIPS 2021) and bethgelab/model-vs-human (``plotting/plot.py``): accuracy against condition
per experiment (the human subjects as a band from the lowest to the highest subject, their mean as a line, models
as lines), error consistency against condition (human-human pairs as a band and mean; each model's mean over the
humans as a line), a subject × subject error-consistency matrix per experiment (the mean of per-condition kappas, not
the benchmark's pooled kappa: :func:`perceptual.mvh_analysis.consistency_matrix`), and the shape-bias plot (shape
bias per category; the benchmark draws the fraction of shape decisions on the x axis, categories on the y axis).
Each function writes its PNG atomically (:func:`perceptual.report.save_figure`) and returns the path. A model keeps one
colour in every panel and the panels share one legend, as the benchmark gives each decision maker a fixed colour (a model
without data in one experiment would otherwise shift the others' colours there).
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .mvh_analysis import condition_order
from .report import save_figure

HUMAN_COLOUR = "#a51c30"  # the benchmark draws humans in red
CHANCE = 1 / 16  # 16-class guessing rate, drawn as in the benchmark's accuracy plots
# The benchmark's x-axis labels (``xlabel`` in model-vs-human's ``datasets/experiments.py``); eidolon ticks are the reach.
AXIS_LABELS = {
    "colour": "colour", "contrast": "contrast in percent", "high-pass": "filter standard deviation",
    "low-pass": "filter standard deviation", "phase-scrambling": "phase noise width [°]", "power-equalisation": "power spectrum",
    "false-colour": "colour", "rotation": "rotation angle [°]", "uniform-noise": "uniform noise width",
    "eidolonI": "reach (coherence 1.0)", "eidolonII": "reach (coherence 0.3)", "eidolonIII": "reach (coherence 0.0)",
}


# The benchmark's ``plotting_conditions`` for the experiments whose conditions are names (matched in any case: True/true).
NAMED_TICKS = {
    "colour": {"cr": "colour", "bw": "greyscale"},
    "power-equalisation": {"0": "original", "pow": "equalised"},
    "false-colour": {"true": "true", "false": "opponent"},
}


def _tick_labels(dataset: str, conditions: Sequence[str]) -> list[str]:
    """The benchmark's tick labels: named conditions as it names them (``bw`` → greyscale), contrast in percent
    (``c05`` → 5); eidolon by its reach (``16-10-10`` → 16), where the benchmark writes log2 of it (4): the reach reads
    without a conversion, and the axis label says which it is."""
    if dataset in NAMED_TICKS:
        return [NAMED_TICKS[dataset].get(str(c).lower(), str(c)) for c in conditions]
    if dataset == "contrast":
        return [str(int(c[1:])) if str(c)[1:].isdigit() else str(c) for c in conditions]
    if dataset.startswith("eidolon"):
        return [str(c).split("-")[0] for c in conditions]
    return [str(c) for c in conditions]


def _condition_axis(ax, dataset: str, order: Sequence[str]) -> None:
    ax.set_xticks(np.arange(len(order)), _tick_labels(dataset, order), rotation=45 if len(order) > 4 else 0, fontsize=7)
    ax.set_xlabel(AXIS_LABELS.get(dataset, "condition"), fontsize=8)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int):
    plt = _pyplot()
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows + 0.6), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _model_colours(models) -> dict[str, str]:
    """One colour per model for every panel, from matplotlib's tab10 without its red (the humans' colour is red)."""
    palette = [colour for i, colour in enumerate(_pyplot().get_cmap("tab10").colors) if i != 3]
    return {model: palette[i % len(palette)] for i, model in enumerate(sorted(models))}


def _shared_legend(fig, axes) -> None:
    """One legend below the panels with every label any panel drew (a model missing from the first panel is still named)."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(4, len(handles)), fontsize=7)


def _band(ax, x, low, mean, high, label):
    if len(x) == 1:  # one condition: the range as an error bar (a band of one point is invisible)
        mean_value = float(np.asarray(mean)[0])
        spread = [[mean_value - float(np.asarray(low)[0])], [float(np.asarray(high)[0]) - mean_value]]
        ax.errorbar(x, [mean_value], yerr=spread, fmt="o", color=HUMAN_COLOUR, capsize=4, label=f"{label} (mean, range)")
        return
    ax.fill_between(x, low, high, color=HUMAN_COLOUR, alpha=0.2, linewidth=0, label=f"{label} (range)")
    ax.plot(x, mean, "o-", color=HUMAN_COLOUR, markersize=4, label=f"{label} (mean)")


def accuracy_figure(per_subject: pd.DataFrame, path: str | Path, title: str = "Accuracy against condition",
                    models: Sequence[str] | None = None) -> Path:
    """One panel per experiment: human accuracy band (min–max over subjects) and mean; models as lines.

    ``per_subject``: :func:`perceptual.mvh_analysis.accuracy_per_subject`. ``models``: every model of the report, so
    that each keeps one colour across its figures (default: those in this table).
    """
    datasets = sorted(per_subject["dataset"].unique())
    fig, axes = _grid(len(datasets))
    colours = _model_colours(models if models is not None else per_subject.loc[~per_subject["is_human"], "subject"].unique())
    for ax, dataset in zip(axes, datasets):
        rows = per_subject[per_subject["dataset"] == dataset]
        order = condition_order(rows["condition"].unique(), dataset)
        x = np.arange(len(order))
        humans = rows[rows["is_human"]].groupby("condition")["accuracy"]
        n_humans = rows.loc[rows["is_human"], "subject"].nunique()
        if n_humans:
            stats = humans.agg(["min", "mean", "max"]).reindex(order)
            _band(ax, x, stats["min"], stats["mean"], stats["max"], "humans")
        for model, group in rows[~rows["is_human"]].groupby("subject"):
            ax.plot(x, group.set_index("condition")["accuracy"].reindex(order), "s--", markersize=3, color=colours[model], label=model)
        ax.axhline(CHANCE, color="grey", linestyle=":", linewidth=0.8, label="chance (1/16)")
        _condition_axis(ax, dataset, order)
        ax.set_ylim(0, 1)
        ax.set_title(f"{dataset} ({n_humans} human subjects)", fontsize=9)
        ax.set_ylabel("16-class accuracy", fontsize=8)
    _shared_legend(fig, axes)
    fig.suptitle(title)
    return save_figure(fig, Path(path))


def error_consistency_figure(pairs: pd.DataFrame, path: str | Path, title: str = "Error consistency against condition",
                             models: Sequence[str] | None = None) -> Path:
    """One panel per experiment: human-human error consistency band (min–max over pairs) and mean; for each model its
    mean error consistency with the humans. ``pairs``: :func:`perceptual.mvh_analysis.pairwise_consistency`;
    ``models`` as in :func:`accuracy_figure`."""
    datasets = sorted(pairs["dataset"].unique())
    fig, axes = _grid(len(datasets))
    colours = _model_colours(models if models is not None else pairs.loc[pairs["kind"] == "model-human", "subject_a"].unique())
    for ax, dataset in zip(axes, datasets):
        rows = pairs[pairs["dataset"] == dataset]
        order = condition_order(rows["condition"].unique(), dataset)
        x = np.arange(len(order))
        human = rows[rows["kind"] == "human-human"]
        n_pairs = len(human) // len(order)
        if len(human):
            stats = human.groupby("condition")["error_consistency"].agg(["min", "mean", "max"]).reindex(order)
            _band(ax, x, stats["min"], stats["mean"], stats["max"], "human-human")
        for model, group in rows[rows["kind"] == "model-human"].groupby("subject_a"):
            ax.plot(x, group.groupby("condition")["error_consistency"].mean().reindex(order), "s--", markersize=3, color=colours[model],
                    label=f"{model} vs humans")
        ax.axhline(0, color="grey", linewidth=0.6)
        _condition_axis(ax, dataset, order)
        ax.set_ylim(-0.2, 1)
        ax.set_title(f"{dataset} ({n_pairs} human pairs)", fontsize=9)
        ax.set_ylabel("error consistency (kappa)", fontsize=8)
    _shared_legend(fig, axes)
    fig.suptitle(title + " (0: independent errors, 1: the same errors)")
    return save_figure(fig, Path(path))


def consistency_matrix_figure(matrix: pd.DataFrame, path: str | Path, title: str) -> Path:
    """A subjects × subjects heatmap (:func:`perceptual.mvh_analysis.consistency_matrix`), values written in the cells."""
    plt = _pyplot()
    n = len(matrix)
    # At least 5.5 x 4.5 inches: with 4 subjects the heatmap was 1.3 inches wide, under a title and a colourbar label longer
    # than itself.
    fig, ax = plt.subplots(figsize=(max(5.5, 2.4 + 0.55 * n), max(4.5, 1.8 + 0.5 * n)))
    image = ax.imshow(matrix.to_numpy(dtype=float), cmap="viridis", vmin=-0.2, vmax=1)
    for i in range(n):
        for j in range(n):
            value = matrix.iat[i, j]
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color="white" if value < 0.5 else "black")
    ax.set_xticks(range(n), matrix.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(n), matrix.index, fontsize=7)
    ax.set_xlabel("observer")
    ax.set_ylabel("observer")
    fig.colorbar(image, ax=ax, label="error consistency (kappa)")
    ax.set_title(textwrap.fill(title, 48), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, Path(path))


def shape_bias_figure(per_category: pd.DataFrame, overall: pd.DataFrame, path: str | Path,
                      title: str = "Shape bias on cue-conflict images", models: Sequence[str] | None = None) -> Path:
    """Shape bias per shape category (rows) for every subject (grey dots), the mean of the human subjects (red diamonds,
    as the benchmark's ``plot_shape_bias_boxplot``; its matrix plot pools the human trials instead) and each model
    (squares, in its colour of the other figures); the overall values in the legend, beside the axes so that no
    marker is hidden. ``per_category``:
    :func:`perceptual.mvh_analysis.shape_bias_per_category`, ``overall``: :func:`perceptual.mvh_analysis.shape_bias_table`,
    ``models`` as in :func:`accuracy_figure`."""
    plt = _pyplot()
    categories = sorted(per_category["category"].unique())
    y = np.arange(len(categories))
    fig, ax = plt.subplots(figsize=(8.5, 0.35 * len(categories) + 1.5))
    totals = overall.set_index("subject")["shape_bias"]
    subjects = [s for s in per_category["subject"].unique() if s not in ("all humans", "mean of humans")]
    human_subjects = set(overall.loc[(overall["scope"] == "subject") & overall["is_human"], "subject"])
    colours = _model_colours(models if models is not None else overall.loc[(overall["scope"] == "subject") & ~overall["is_human"], "subject"])
    shown_subject_label = False
    for subject in subjects:
        values = per_category[per_category["subject"] == subject].set_index("category")["shape_bias"].reindex(categories)
        if subject in human_subjects:
            ax.plot(values, y, "o", color="grey", alpha=0.35, markersize=3, label=None if shown_subject_label else "human subjects")
            shown_subject_label = True
        else:
            ax.plot(values, y, "s", markersize=5, color=colours[subject], label=f"{subject} ({totals.get(subject, np.nan):.2f})")
    if "mean of humans" in set(per_category["subject"]):  # the benchmark's human marker: the mean over subjects
        mean = per_category[per_category["subject"] == "mean of humans"].set_index("category")["shape_bias"].reindex(categories)
        ax.plot(mean, y, "D", color=HUMAN_COLOUR, markersize=6, label=f"humans, mean of subjects ({totals.get('mean of humans', np.nan):.2f})")
    ax.set_yticks(y, categories, fontsize=8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("fraction of shape decisions (1 − fraction of texture decisions)")
    ax.set_ylabel("shape category")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_title(title + "\n(shape bias = shape / (shape + texture) decisions; same-class images excluded)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, Path(path))


__all__ = ["accuracy_figure", "consistency_matrix_figure", "error_consistency_figure", "shape_bias_figure"]
