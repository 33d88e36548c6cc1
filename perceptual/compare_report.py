"""The compare report: heatmaps of the pairwise matrices, accuracy per condition, the unknown-detection figure,
``metrics.json`` / ``unknown.json`` and ``summary.md`` (see :mod:`perceptual.pipelines.compare`)."""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from stimuli.distortions import GENERATORS, Distortion, in_grid_order
from training.io import atomic_write_json, atomic_write_text

from . import metrics as M
from .observers import offline_variants
from .pair_metrics import PAIR_METRIC_REGISTRY
from .report import format_number, markdown_text, plain, save_figure
from .scores import Scores
from .tasks import panel_summary


def heatmap(matrix: np.ndarray, labels: Sequence[str], path: Path, title: str, *, vmin: float | None = None,
            vmax: float | None = None, cmap: str = "viridis", axis_label: str = "system") -> Path:
    """A square heatmap with values written in the cells (NaN cells grey); both axes are ``axis_label``s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 0.9 + 0.5 * n))
    cmap_obj = matplotlib.colormaps[cmap].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap_obj, vmin=vmin, vmax=vmax)
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    lo, hi = image.get_clim()
    if n <= 16:
        for i in range(n):
            for j in range(n):
                if not math.isnan(matrix[i, j]):
                    red, green, blue, _ = image.cmap(image.norm(matrix[i, j]))  # light text on a dark cell, whatever the map
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color="white" if dark else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel(axis_label, fontsize=8)
    ax.set_ylabel(axis_label, fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def panel_accuracy(accuracy: Mapping[str, Mapping[str, float]], subjects: Sequence[str]) -> dict[str, dict]:
    """Per condition, the simulated subjects' accuracy as mean ± sample std (:func:`perceptual.tasks.panel_summary`)."""
    return {condition: {k: v for k, v in panel_summary({s: acc[s] for s in subjects}).items() if k != "observers"}
            for condition, acc in accuracy.items()}


def accuracy_figure(accuracy: Mapping[str, Mapping[str, float]], conditions: Sequence[Distortion], models: Sequence[str],
                    subjects: Sequence[str], path: Path, generator: str, num_classes: int | None = None) -> Path:
    """Accuracy against the generator's parameter, from undistorted to most distorted: one line per model, the subjects'
    mean ± sample std as a band, chance (1 / classes) where ``num_classes`` is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = in_grid_order([c for c in conditions if c.generator == generator])  # command-line order drew a zig-zag
    x = np.arange(len(chosen))
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for m in models:
        ax.plot(x, [accuracy[c.name][m] for c in chosen], marker="o", label=m)
    panel = panel_accuracy({c.name: accuracy[c.name] for c in chosen}, subjects)
    mean, std = (np.array([panel[c.name][k] for c in chosen]) for k in ("mean", "std"))
    ax.plot(x, mean, color="black", ls="--", marker="s", label=f"observers (n={len(subjects)})")
    ax.fill_between(x, mean - std, mean + std, color="grey", alpha=0.25, label="observers ± std")
    if num_classes:
        ax.axhline(1 / num_classes, color="grey", lw=0.8, ls=":", label=f"chance (1/{num_classes})")
    ax.set_xticks(x, [c.name.split("=", 1)[1] for c in chosen])
    ax.set_xlabel(GENERATORS[generator].description if generator in GENERATORS else generator)
    ax.set_ylabel("accuracy")
    ax.set_title(f"Accuracy against {generator}: models and simulated observers", fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def unknown_metrics(id_scores: Scores, id_logits: torch.Tensor | None, ood_scores: Mapping[str, np.ndarray], labels: np.ndarray) -> dict:
    """AURC, E-AURC, unified AURC, AUROC and FPR@95 per OOD set, and calibration where there is a distribution."""
    probs = id_scores.probs
    if probs is not None:
        probs = probs / probs.sum(axis=1, keepdims=True)  # float rounding only
        predictions = probs.argmax(1)
    else:
        predictions = id_logits.argmax(1).numpy()
    correct = predictions == labels
    out = {
        "accuracy": float(correct.mean()),
        "aurc": M.aurc(id_scores.scores, correct),
        "eaurc": M.eaurc(id_scores.scores, correct),
        "unknown_aurc": M.unknown_detection_aurc(id_scores.scores, correct, dict(ood_scores)),
        "auroc": {name: M.auroc(id_scores.scores, s) for name, s in ood_scores.items()},
        "fpr_at_95_tpr": {name: M.fpr_at_tpr(id_scores.scores, s, 0.95) for name, s in ood_scores.items()},
    }
    if probs is not None:
        out["ece"] = M.expected_calibration_error(probs, labels)
        out["nll"] = M.negative_log_likelihood(probs, labels)
        out["brier"] = M.brier_score(probs, labels)
    else:
        out["ece"] = out["nll"] = out["brier"] = None
        out["calibration"] = "not a probability: this score has no predictive distribution"
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    return format_number(value, f".{digits}f")


def write_outputs(data: dict, unknown: dict | None, out: Path, conditions: Sequence[Distortion], per_condition_figures: bool = False) -> None:
    """metrics.json and unknown.json first (a figure that fails to draw loses no number), then figures/*.png and summary.md."""
    figures_dir = out / "figures"
    systems, models, subjects = data["systems"], data["models"], data["subjects"]
    data["accuracy_panel"] = panel_accuracy(data["accuracy"], subjects)
    atomic_write_json(out / "metrics.json", plain(data))
    if unknown is not None:
        atomic_write_json(out / "unknown.json", plain(unknown))
    else:  # an earlier run's unknown report would describe other models next to this run's metrics
        for stale in (out / "unknown.json", figures_dir / "unknown_auroc.png"):
            stale.unlink(missing_ok=True)
    generators = dict.fromkeys(c.generator for c in conditions)
    for figure in figures_dir.glob("accuracy_*.png"):  # generators an earlier run into this folder had and this one has not
        if figure.stem.removeprefix("accuracy_") not in generators:
            figure.unlink()
    figures = []
    ranges = {name: metric.value_range for name, metric in PAIR_METRIC_REGISTRY.items()}
    for metric, matrix in data["aggregated"].items():
        lo, hi = ranges.get(metric, (0, 1))
        figures.append(heatmap(matrix, systems, figures_dir / f"heatmap_{metric}.png", f"{metric} (mean over generators)", vmin=lo, vmax=hi))
    conditions_dir = figures_dir / "conditions"
    if conditions_dir.is_dir():  # an earlier run's per-condition heatmaps: of other conditions, or not asked for now
        for folder in conditions_dir.iterdir():
            if folder.is_dir() and (not per_condition_figures or folder.name not in data["per_condition"]):
                shutil.rmtree(folder)
    if per_condition_figures:
        for condition, matrices in data["per_condition"].items():
            for metric, matrix in matrices.items():
                lo, hi = ranges.get(metric, (0, 1))
                heatmap(matrix, systems, figures_dir / "conditions" / condition / f"heatmap_{metric}.png", f"{metric}, {condition}", vmin=lo, vmax=hi)
    for generator in generators:
        figures.append(accuracy_figure(data["accuracy"], conditions, models, subjects, figures_dir / f"accuracy_{generator}.png", generator,
                                       num_classes=len(data["classes"]) if data.get("classes") else None))
    spearman = data["spearman_between_metrics"]
    figures.append(heatmap(spearman["rho"], spearman["metrics"], figures_dir / "spearman_between_metrics.png",
                           "Spearman's rho between metrics over system pairs", vmin=-1, vmax=1, cmap="coolwarm", axis_label="metric"))
    if unknown:
        figures.append(_unknown_figure(unknown, figures_dir / "unknown_auroc.png"))
    atomic_write_text(out / "summary.md", summary_markdown(data, unknown, [f.relative_to(out).as_posix() for f in figures]))


def _unknown_figure(unknown: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, values = [], []
    for system, scores in unknown["systems"].items():
        for score, result in scores.items():
            rows.append(f"{system} / {score}")
            values.append([math.nan if "error" in result else result["auroc"][o] for o in unknown["ood_sets"]])
    matrix = np.array(values, dtype=float).reshape(len(rows), len(unknown["ood_sets"]))
    fig, ax = plt.subplots(figsize=(2.5 + 1.1 * len(unknown["ood_sets"]), 0.8 + 0.32 * len(rows)))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(unknown["ood_sets"])), unknown["ood_sets"], rotation=30, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    for i in range(len(rows)):
        for j in range(matrix.shape[1]):
            if not math.isnan(matrix[i, j]):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color="white" if matrix[i, j] < 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel("OOD set", fontsize=8)
    ax.set_ylabel("system / score function", fontsize=8)
    ax.set_title("AUROC (ID: clean test images)", fontsize=9)
    return save_figure(fig, path)


def summary_markdown(data: dict, unknown: dict | None, figures: Sequence[str]) -> str:
    models, subjects = data["models"], data["subjects"]
    lines = [
        "# Compare report", "",
        f"Data set {data['data']}, {data['n_images']} test images in {len(data['conditions'])} conditions; models: {', '.join(models)}; "
        f"{len(subjects)} simulated subjects (observers × seeds: {', '.join(data['observers'])}; k = {data['decisions']['k']}, "
        f"lapse {data['decisions']['lapse']}, decision noise {data['decisions']['noise']}, "
        f"{data['decisions']['exemplars_per_class']} exemplars per class).", "",
    ]
    variants = offline_variants(data["observers"].values())
    if variants:
        lines += [f"LPIPS runs as its labelled offline variant(s) ({'; '.join(variants)}): the AlexNet weights were not available.", ""]
    lines += ["## Accuracy per condition", "", "| Condition | " + " | ".join(map(markdown_text, models)) + " | observers (mean ± sample std) |",
              "|---" * (len(models) + 2) + "|"]
    panel = data.get("accuracy_panel") or panel_accuracy(data["accuracy"], subjects)
    for condition, acc in data["accuracy"].items():
        lines.append(f"| {condition} | " + " | ".join(_fmt(acc[m]) for m in models)
                     + f" | {_fmt(panel[condition]['mean'])} ± {_fmt(panel[condition]['std'])} |")
    ranking = data["ranking"]
    metrics = ranking["ranked_metrics"]["all"] + ["soc"]
    lines += ["", "## Models against the observer panel", "",
              "Accuracy difference, observed and error consistency in model-vs-human's nesting (subjects as the humans); "
              "the other metrics are the panel mean of the condition-averaged pairwise values (each generator's conditions "
              "averaged, then the generators). Mean rank 1 is the most observer-like (model-vs-human's ranking: accuracy "
              "difference, observed and error consistency).", "",
              *(["Left out of the averages and the ranking, as model-vs-human's table leaves them out (controls, humans under 20 %): "
                 + ", ".join(name for names in data["excluded"].values() for name in names) + " (metrics.benchmark_exclusions=false keeps them).", ""]
                if data.get("excluded") else []),
              *([f"Left out too, whatever metrics.benchmark_exclusions says: {', '.join(data['below_resolution'])}, where every image is one "
                 "flat grey at this image size (below its resolution): every system answers one class there, and any two would agree "
                 "perfectly.", ""] if data.get("below_resolution") else []),
              "| Model | " + " | ".join(metrics) + " | mean rank (mvh) | mean rank (all) |", "|---" * (len(metrics) + 3) + "|"]
    for m in models:
        lines.append(f"| {markdown_text(m)} | " + " | ".join(_fmt(ranking["values"][m].get(k)) for k in metrics)
                     + f" | {_fmt(ranking['mean_rank_mvh'][m], 2)} | {_fmt(ranking['mean_rank_all'][m], 2)} |")
    among = ranking["observers_among_themselves"]
    lines += ["", "Observers among themselves: " + ", ".join(f"{k} {_fmt(v)}" for k, v in among.items()) + ".", ""]
    lines += metric_correlation_lines(data)
    lines += ["", "Diagonals of the pairwise matrices (a system against itself):", ""]
    lines += [f"- {metric}: {text}" for metric, text in data["diagonal"].items()]
    if unknown:
        ood = unknown["ood_sets"]
        lines += ["", "## Unknown detection", "",
                  f"ID: the {unknown['n_id']} clean test images; OOD: {', '.join(ood)}; scores fit on {unknown['n_fit']} training images.", "",
                  "| System | Score | AURC | E-AURC | unknown AURC | " + " | ".join(f"AUROC {o} | FPR@95 {o}" for o in ood) + " | ECE | NLL | Brier |",
                  "|---" * (8 + 2 * len(ood)) + "|"]
        not_applicable = []
        for system, scores in unknown["systems"].items():
            for score, r in scores.items():
                if "error" in r:
                    not_applicable.append(f"- {system} / {score}: {r['error']}")
                    lines.append(f"| {system} | {score} | n/a (below) |" + " |" * (5 + 2 * len(ood)))
                    continue
                cells = [_fmt(r["aurc"]), _fmt(r["eaurc"]), _fmt(r["unknown_aurc"])]
                cells += [x for o in ood for x in (_fmt(r["auroc"][o]), _fmt(r["fpr_at_95_tpr"][o]))]
                cells += [_fmt(r.get("ece")), _fmt(r.get("nll")), _fmt(r.get("brier"))]
                lines.append(f"| {system} | {score} | " + " | ".join(cells) + " |")
        if not_applicable:
            lines += ["", "Not applicable:", ""] + not_applicable
        if any("odin" in scores for scores in unknown["systems"].values()):
            lines += ["", "ODIN has no calibration numbers: its tempered softmax of a perturbed input is a score, not the model's "
                      "predictive distribution."]
    lines += ["", "## Figures", ""] + [f"- ![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def metric_correlation_lines(data: Mapping) -> list[str]:
    """The Spearman table between metrics over system pairs, then the error-alignment summary (Xu et al.) when present."""
    spearman = data["spearman_between_metrics"]
    names = spearman["metrics"]
    lines = ["## Spearman's rho between metrics over system pairs", "", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, a in enumerate(names):
        lines.append(f"| {a} | " + " | ".join(_fmt(float(spearman["rho"][i][j]), 2) for j in range(len(names))) + " |")
    if data.get("error_alignment"):
        from .error_alignment import summary_lines

        lines += [""] + summary_lines(data["error_alignment"])
    return lines


__all__ = ["accuracy_figure", "heatmap", "metric_correlation_lines", "panel_accuracy", "plain", "summary_markdown", "unknown_metrics", "write_outputs"]
