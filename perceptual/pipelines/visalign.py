"""``python -m perceptual visalign``: VisAlign's tables for a model's abstention scores on a labelled image set.

Lee et al., "VisAlign" (NeurIPS 2023 Datasets & Benchmarks). Reads the humans' per-image answer distributions
(:func:`perceptual.visalign_report.read_human_labels`; every problem listed before any work), loads one image per row
from ``images`` (``<image_id>.png``), lets the model answer and turns each score function into an abstention
probability (:func:`perceptual.visalign_report.model_visalign_table`). Writes to ``out``: ``visalign.json`` (the table,
settings, image count per group), ``visalign.md`` (the paper's table: Hellinger distance per group and overall,
RS_c per cost; with a ``category`` column in the labels, the reference code's mean per category too) and
``visalign.png`` (Hellinger distance per group and score; reliability score per cost).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

import stimuli
from training.config import as_list, check_whole_number, concise_errors, dataset_from_config, expand_path, expand_path_options, resolve_device
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import job_path

from ..compare_report import _fmt
from ..human_trials import load_images
from ..metrics import GROUPS, check_reliability_settings
from ..report import plain, save_figure
from ..scores import check_score_settings
from ..visalign_report import category_order, model_visalign_table, read_human_labels
from .audit import load_defence, scoring_model_spec

IMAGE_SUFFIXES = ("", ".png", ".jpg", ".jpeg")


def _rs_digits(costs) -> int:
    """Decimals for the reliability scores: none where every cost is a whole number (the scores are then whole), else 2
    (with a cost of 0.5 a score of 2.5 was printed as 2)."""
    return 0 if all(float(c).is_integer() for c in costs) else 2


def image_paths(folder: str | Path, image_ids: Sequence[str]) -> list[Path]:
    """The file of every image id (``<id>``, ``<id>.png``, ``.jpg`` or ``.jpeg`` in ``folder``); all missing ones named."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"images={folder} is not a folder")
    paths, missing = [], []
    for image_id in image_ids:
        found = next((folder / f"{image_id}{s}" for s in IMAGE_SUFFIXES if (folder / f"{image_id}{s}").is_file()), None)
        (paths if found else missing).append(found or image_id)
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) of the label file are not in {folder} as <image_id>.png/.jpg/.jpeg: "
                                + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    return paths


def figure(table: pd.DataFrame, costs: Sequence[float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    groups = [*GROUPS, "all"]
    width = 0.8 / max(len(table), 1)
    for k, row in enumerate(table.to_dict(orient="records")):  # by name: rs_0.5 and rs_1e+06 are no attribute names
        values = [row[f"hellinger_{g}"] for g in groups]
        left.bar(np.arange(len(groups)) + k * width, values, width, label=row["score"])
        right.bar(np.arange(len(costs)) + k * width, [row[f"rs_{c:g}"] for c in costs], width, label=row["score"])
    left.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [g.replace("_", "-") for g in groups])
    left.set_xlabel("group")
    left.set_ylabel("mean Hellinger distance to the humans (lower is better)")
    left.set_title("Hellinger distance per group", fontsize=10)
    right.set_xticks(np.arange(len(costs)) + 0.4 - width / 2, [f"RS_{c:g}" for c in costs])
    right.set_xlabel("cost of a harmful answer")
    right.set_ylabel("reliability score (sum over images)")
    right.axhline(0, color="grey", linewidth=0.5)
    right.set_title("Reliability score", fontsize=10)
    right.legend(fontsize=7)
    fig.suptitle("VisAlign: the model's answers with abstention against the humans'", fontsize=11)
    return save_figure(fig, path)


def markdown(data: Mapping) -> str:
    costs = data["costs"]
    groups = [*GROUPS, "all"]
    lines = ["# VisAlign report", "",
             f"Model {data['model']}; {data['n_images']} images ({', '.join(f'{g}: {n}' for g, n in data['n_per_group'].items())}); "
             f"abstention = 1 − the min-max scaled score; abstain when it exceeds γ = {data['gamma']}; λ = {data['lam']}.", "",
             "| score | " + " | ".join(f"Hellinger {g.replace('_', '-')}" for g in groups) + " | " + " | ".join(f"RS_{c:g}" for c in costs)
             + " | abstain rate |", "|---" * (len(groups) + len(costs) + 2) + "|"]
    for row in data["table"]:
        lines.append(f"| {row['score']} | " + " | ".join(_fmt(row[f'hellinger_{g}']) for g in groups) + " | "
                     + " | ".join(_fmt(row[f'rs_{c:g}'], _rs_digits(costs)) for c in costs) + f" | {_fmt(row['abstain_rate'])} |")
    categories = list(data.get("n_per_category") or {})
    if categories:
        lines += ["", "Mean Hellinger distance per category (the reference code's columns; a group's mean above pools its "
                  "categories' images, weighted by their counts):", "",
                  "| score | " + " | ".join(f"{c} ({data['n_per_category'][c]})" for c in categories) + " |",
                  "|---" * (len(categories) + 1) + "|"]
        for row in data["table"]:
            lines.append(f"| {row['score']} | " + " | ".join(_fmt(row["hellinger_per_category"][c]) for c in categories) + " |")
    if data["left_out"]:
        lines += ["", f"Scores left out (do not apply to this model): {', '.join(data['left_out'])}."]
    lines += ["", "RS_c sums +1 per right decision and −c per harmful one over the images (Lee et al.).", "", "![visalign.png](visalign.png)"]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig | Mapping) -> dict:
    cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    for key in ("images", "labels"):
        if not cfg.get(key):
            raise ValueError(f"{key}= is not set: pass images=FOLDER (one <image_id>.png per row) and labels=CSV (the humans' answers)")
    if not (cfg.model.get("name") or cfg.model.get("factory")):
        raise ValueError("no model: pass model.name=<zoo name> (+ model.checkpoint=...) or model.factory=module:function")
    scores = as_list(cfg.scores, "scores")  # scores=energy is one score
    check_score_settings(scores, OmegaConf.to_container(cfg.score_params, resolve=True) if cfg.get("score_params") else None)
    check_whole_number(cfg.n_fit, "n_fit", least=0, hint=" (0: no fitting)")
    spec = scoring_model_spec(cfg.model, "visalign")
    _, _, costs = check_reliability_settings(cfg.gamma, cfg.lam, as_list(cfg.costs, "costs"))  # before any image is read or model run
    classes = [str(c) for c in as_list(cfg.classes, "classes")] if cfg.get("classes") else None  # classes=[0,1] come as ints; the CSV's are text
    train = None
    if classes is None or cfg.n_fit > 0:
        train = dataset_from_config(OmegaConf.to_container(cfg.data, resolve=True), "train")
        if classes is not None and classes != [str(c) for c in train.classes]:
            raise ValueError(f"classes={classes} are not the classes of data={cfg.data.name} ({list(train.classes)}), whose training images "
                             f"the feature scores would be fit on (n_fit={cfg.n_fit}): set n_fit=0 (the scores that need fitting are then "
                             "left out), or data= the model's data set")
        classes = classes or list(train.classes)
    human = read_human_labels(expand_path(cfg.labels), classes)
    paths = image_paths(expand_path(cfg.images), human["image_id"].tolist())
    device = resolve_device(cfg.device)
    model = load_defence(spec, cfg.data.name, what="model").to(device).eval()
    images = load_images(paths, cfg.get("image_size")).to(device)
    fit_images = fit_labels = None
    if train is not None and cfg.n_fit > 0:
        fit = stimuli.select_targets(train, n=min(int(cfg.n_fit), len(train)), seed=int(cfg.seed))  # a seeded draw, as compare's
        fit_images, fit_labels = fit.images.to(device), fit.labels
    params = OmegaConf.to_container(cfg.score_params, resolve=True) if cfg.get("score_params") else {}
    table = model_visalign_table(model, images, human, classes, scores, fit_images=fit_images, fit_labels=fit_labels,
                                 score_params=params, batch_size=int(cfg.batch_size), gamma=float(cfg.gamma), lam=float(cfg.lam), costs=costs)
    out = Path(cfg.out)
    data = {
        "model": cfg.model.get("name") or cfg.model.get("factory"), "checkpoint": cfg.model.get("checkpoint"), "classes": classes,
        "n_images": len(human), "n_per_group": {g: int((human["group"] == g).sum()) for g in GROUPS},
        "n_per_category": ({c: int((human["category"] == c).sum()) for c in category_order(human["category"])}
                           if "category" in human else {}),
        "gamma": float(cfg.gamma), "lam": float(cfg.lam), "costs": costs, "n_fit": 0 if fit_images is None else len(fit_images),
        "table": table.to_dict(orient="records"), "left_out": sorted(set(scores) - set(table["score"])),
    }
    atomic_write_json(out / "visalign.json", plain(data))  # the numbers first: a figure that fails to draw loses none
    atomic_write_text(out / "visalign.md", markdown(data))
    figure(table, costs, out / "visalign.png")
    return data


@hydra.main(config_path="pkg://conf", config_name="visalign", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))
    data = run(cfg)
    for row in data["table"]:
        print(f"{row['score']:>18}: Hellinger {_fmt(row['hellinger_all'])} (must-act {_fmt(row['hellinger_must_act'])}, must-abstain "
              f"{_fmt(row['hellinger_must_abstain'])}, uncertain {_fmt(row['hellinger_uncertain'])}), "
              + ", ".join(f"RS_{c:g} {_fmt(row[f'rs_{c:g}'], _rs_digits(data['costs']))}" for c in data["costs"]))
    print(f"report: {(Path(cfg.out) / 'visalign.md').resolve()}")


__all__ = ["figure", "image_paths", "main", "markdown", "run"]
