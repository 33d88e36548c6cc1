"""``python -m perceptual unknown``: Kim et al.'s unknown-detection table for a model of the known CIFAR-100 classes.

Kim et al., "A Unified Benchmark for the Unknown Detection Capability of Deep Neural Networks" (ESWA 2023). The known
classes (CIFAR-40 in the paper; ``known_classes``) of CIFAR-100's test split are the in-distribution images, its other
classes the near-unknown set (``cifar-near``), and every ``far_unknown`` image folder a far-unknown set
(:mod:`perceptual.unknown_benchmark`). For each score function (:mod:`perceptual.scores`, fit on ``n_fit`` known
training images): accuracy and the unified unknown-detection AURC (known and unknown images pooled), AURC and E-AURC
on the known images, AUROC and FPR at 95 % TPR per unknown set, ECE, and each column's improvement ratio over
``baseline`` (max-softmax). ODIN runs with Liang et al.'s fixed temperature and noise (``conf/unknown.yaml``); Kim et
al. tune both on a validation unknown set, so its row is not the paper's ODIN row. Writes ``unknown.json``, ``unknown.md`` (the paper's table)
and ``unknown.png`` (AUROC per unknown set and score; improvement over the baseline) to ``out``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

import stimuli
from training.config import as_list, check_whole_number, concise_errors, expand_path, expand_path_options, resolve_device
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import job_path

from ..compare_report import _fmt
from ..measure import ModelSpec
from ..report import plain, save_figure
from ..scores import check_score_settings
from ..unknown_benchmark import cifar_benchmark, evaluate_scores, read_far_unknown, unknown_table
from .audit import load_defence, scoring_model_spec

NEAR = "cifar-near"


def known_class_names(value) -> list[str]:
    """A list of names, or a text file with one name a line (blank lines and # comments skipped)."""
    if value is None:
        raise ValueError("known_classes is not set: a list (known_classes=[apple,bear,...]) or a text file with one class name a line")
    if isinstance(value, str):
        path = expand_path(value)
        if not path.is_file():
            raise FileNotFoundError(f"known_classes={value!r} is neither a list nor an existing file")
        return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
    return [str(v) for v in value]


def load_model(spec: ModelSpec, n_classes: int) -> torch.nn.Module:
    """The zoo model for CIFAR with ``n_classes`` outputs, or the factory's model (``spec``: :func:`scoring_model_spec`)."""
    if spec.name:  # the zoo's CIFAR model with one output per known class
        spec.kwargs = {**spec.kwargs, "num_classes": n_classes}
    return load_defence(spec, "cifar100", what="model")


def figure(table: pd.DataFrame, unknown_sets: list[str], baseline: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table[table["error"].isna()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 1.8 + 0.35 * len(unknown_sets) * max(len(rows), 1)), sharey=True,
                                      constrained_layout=True)
    width = 0.8 / len(unknown_sets)
    y = np.arange(len(rows))
    for k, name in enumerate(unknown_sets):
        left.barh(y + k * width, rows[f"auroc_{name}"], width, label=name)
        right.barh(y + k * width, rows[f"auroc_{name}_improvement"].fillna(0), width, label=name)
    left.set_yticks(y + 0.4 - width / 2, rows["score"])
    left.set_ylabel("score function")
    left.invert_yaxis()
    left.set_xlim(0, 1)
    left.set_xlabel("AUROC (known test images vs unknown set)")
    left.set_title("Unknown detection", fontsize=10)
    right.axvline(0, color="grey", linewidth=0.5)
    right.set_xlabel(f"AUROC improvement ratio over {baseline} (no bar: no ratio)")
    right.set_title("Against the baseline (positive = better)", fontsize=10)
    right.legend(title="unknown set", fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Kim et al.'s unknown-detection benchmark", fontsize=11)
    return save_figure(fig, path)


def markdown(data: Mapping) -> str:
    sets = data["unknown_sets"]
    columns = ["accuracy", "unknown_aurc", "aurc", "eaurc"] + [f"{m}_{s}" for s in sets for m in ("auroc", "fpr_at_95_tpr")] + ["ece"]
    heads = ["ACC", "unknown AURC", "AURC", "E-AURC"] + [f"{m} {s}" for s in sets for m in ("AUROC", "FPR@95")] + ["ECE"]
    lines = ["# Unknown detection (Kim et al.)", "",
             f"Known: {data['n_known_classes']} classes, {data['n_known']} test images; unknown sets: "
             + ", ".join(f"{s} ({data['n_unknown'][s]})" for s in sets) + f"; scores fit on {data['n_fit']} known training images.", "",
             "| score | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for row in data["table"]:
        if row.get("error"):
            lines.append(f"| {row['score']} | n/a: {row['error']} |" + " |" * (len(heads) - 1))
            continue
        lines.append(f"| {row['score']} | " + " | ".join(_fmt(row.get(c), 4 if c.endswith('aurc') else 3) for c in columns) + " |")
    lines += ["", f"Improvement ratio over {data['baseline']} (positive = better: (baseline − score) / baseline for the AURCs, "
              "FPR@95 and ECE; (score − baseline) / baseline for accuracy and AUROC):", "",
              "| score | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for row in data["table"]:
        if not row.get("error"):
            lines.append(f"| {row['score']} | " + " | ".join(_fmt(row.get(f"{c}_improvement")) for c in columns) + " |")
    return "\n".join(lines + ["", "![unknown.png](unknown.png)"]) + "\n"


def run(cfg: DictConfig | Mapping) -> dict:
    cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    if not cfg.get("root"):
        raise ValueError("root= is not set: the folder that holds cifar-100-python/")
    if not (cfg.model.get("name") or cfg.model.get("factory")):
        raise ValueError("no model: pass model.name=<zoo name> (+ model.checkpoint=...) or model.factory=module:function")
    cfg.scores = as_list(cfg.scores, "scores")  # scores=energy is one score
    score_params = OmegaConf.to_container(cfg.score_params, resolve=True) if cfg.get("score_params") else {}  # null: the defaults
    check_score_settings(cfg.scores, score_params)
    check_whole_number(cfg.n_fit, "n_fit", least=0, hint=" (0: no fitting)")
    if cfg.get("far_limit") is not None:
        check_whole_number(cfg.far_limit, "far_limit", hint=" (or null for every image)")
    spec = scoring_model_spec(cfg.model, "unknown")  # unknown keys, a missing checkpoint: named before the data sets are read
    if cfg.baseline not in cfg.scores:
        raise ValueError(f"baseline={cfg.baseline!r} is not among scores={list(cfg.scores)}")
    known_names = known_class_names(OmegaConf.to_container(cfg.known_classes) if OmegaConf.is_list(cfg.known_classes) else cfg.known_classes)
    far_given = OmegaConf.to_container(cfg.far_unknown, resolve=True) if cfg.get("far_unknown") else {}
    if not isinstance(far_given, dict):
        raise ValueError(f"far_unknown must name each folder, as far_unknown={{svhn: PATH, textures: PATH}}; got {far_given!r}")
    far = {str(k): expand_path(v) for k, v in far_given.items()}
    if NEAR in far:
        raise ValueError(f"far_unknown may not use the name {NEAR!r}: it is the near-unknown classes")
    root = expand_path(cfg.root)
    known, near = cifar_benchmark(root, known_names)
    far_images = {name: read_far_unknown(folder, size=int(cfg.far_size), limit=cfg.get("far_limit"), seed=int(cfg.seed))
                  for name, folder in far.items()}
    fit = None
    if cfg.n_fit > 0:
        train_known, _ = cifar_benchmark(root, known_names, split="train")
        fit = stimuli.select_targets(train_known, n=min(int(cfg.n_fit), len(train_known)), seed=int(cfg.seed))
    device = resolve_device(cfg.device)
    model = load_model(spec, len(known_names)).to(device).eval()
    with torch.no_grad():
        n_out = model(known.float_images(slice(0, 1), device=device)).shape[-1]
    if n_out != len(known_names):
        raise ValueError(f"the model has {n_out} outputs but there are {len(known_names)} known classes: it must be trained on the known classes only")
    unknown_sets = {NEAR: near.images, **far_images}
    results = evaluate_scores(model, known, unknown_sets, list(cfg.scores), fit=fit,
                              score_params=score_params, batch_size=int(cfg.batch_size),
                              required=[str(cfg.baseline)])
    table = unknown_table(results, baseline=str(cfg.baseline))
    data = {
        "known_classes": known_names, "n_known_classes": len(known_names), "n_known": len(known),
        "unknown_sets": list(unknown_sets), "n_unknown": {k: len(v) for k, v in unknown_sets.items()},
        "n_fit": 0 if fit is None else len(fit.labels), "baseline": str(cfg.baseline),
        "results": results, "table": table.replace({np.nan: None}).to_dict(orient="records"),
    }
    out = Path(cfg.out)
    atomic_write_json(out / "unknown.json", plain(data))  # the numbers first: a figure that fails to draw loses none
    atomic_write_text(out / "unknown.md", markdown(data))
    figure(table, list(unknown_sets), data["baseline"], out / "unknown.png")
    return data


@hydra.main(config_path="pkg://conf", config_name="unknown", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))
    data = run(cfg)
    for row in data["table"]:
        if row.get("error"):
            print(f"{row['score']:>18}: n/a ({row['error']})")
            continue
        print(f"{row['score']:>18}: AURC {_fmt(row['aurc'], 4)}, " + ", ".join(f"AUROC {s} {_fmt(row[f'auroc_{s}'])}" for s in data["unknown_sets"])
              + f", ECE {_fmt(row.get('ece'))}")
    print(f"report: {(Path(cfg.out) / 'unknown.md').resolve()}")


__all__ = ["NEAR", "figure", "known_class_names", "load_model", "main", "markdown", "run"]
