"""Kim et al.'s unified unknown-detection benchmark: known / near-unknown class splits, far-unknown folders, the table.

Kim et al., "A Unified Benchmark for the Unknown Detection Capability of Deep Neural Networks" (Expert Systems with
Applications 2023; code and data daintlab/unknown-detection-benchmarks). Its CIFAR benchmark trains on 40 CIFAR-100
classes (CIFAR-40, in-distribution), treats the other 60 as near-unknown (CIFAR-60), and takes SVHN, LSUN-FIX and
the Describable Textures as far-unknown image folders (resized to 32 × 32, as its ``dataloader.py`` does for the
textures). The reference ships the split as image folders, not as a class list in code, so the known classes are an
argument here (:func:`cifar_benchmark`): pass the 40 folder names of its ``cifar-bench/train/cifar40``.

The table (:func:`unknown_table`) has, per score function, the paper's columns: accuracy on the known test images,
the unified unknown-detection AURC (its headline number: known and unknown test images pooled, every unknown image
counted as an error), AURC for misclassification detection on the known images, and AUROC and FPR at 95 % TPR per
unknown set. Two columns are ours: E-AURC, and ECE where the score has a predictive distribution. Every column is a
fraction (the paper prints AURC × 1000 and FPR in %). The last column is each one's improvement ratio over max-softmax. The ratio is our definition (the paper
compares methods to the baseline in its text, not by one formula): (baseline − method) / baseline for lower-is-better
columns and (method − baseline) / baseline for AUROC, so a positive ratio is an improvement in every column.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from training import load_dataset
from training.config import check_whole_number
from training.data import ImageSet

log = logging.getLogger(__name__)

LOWER_IS_BETTER = ("unknown_aurc", "aurc", "eaurc", "fpr_at_95_tpr", "ece")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def known_unknown_split(images: ImageSet, known_classes: Sequence[str]) -> tuple[ImageSet, ImageSet]:
    """(known, unknown): the images of ``known_classes``, relabelled 0..K−1 in the given order, and all the others
    (their labels kept, their ``classes`` the unknown class names in the original order, labels re-indexed to them)."""
    known = list(known_classes)
    if not known:
        raise ValueError("known_classes is empty")
    repeated = sorted({c for c in known if known.count(c) > 1})
    if repeated:
        raise ValueError(f"known_classes repeats {repeated}")
    missing = [c for c in known if c not in images.classes]
    if missing:
        raise ValueError(f"known classes {missing} are not classes of {images.name} (e.g. {images.classes[:5]})")
    if len(known) == len(images.classes):
        raise ValueError("every class is known: leave some out as the near-unknown classes")
    old_known = torch.tensor([images.classes.index(c) for c in known])
    unknown_names = [c for c in images.classes if c not in set(known)]
    old_unknown = torch.tensor([images.classes.index(c) for c in unknown_names])
    to_known = torch.full((len(images.classes),), -1, dtype=torch.long)
    to_known[old_known] = torch.arange(len(known))
    to_unknown = torch.full((len(images.classes),), -1, dtype=torch.long)
    to_unknown[old_unknown] = torch.arange(len(unknown_names))
    is_known = to_known[images.labels] >= 0
    meta = {**images.meta, "split_of": images.name}
    known_set = ImageSet(f"{images.name}-known{len(known)}", images.split, images.images[is_known], to_known[images.labels[is_known]], known, meta)
    unknown_set = ImageSet(f"{images.name}-unknown{len(unknown_names)}", images.split, images.images[~is_known],
                           to_unknown[images.labels[~is_known]], unknown_names, meta)
    return known_set, unknown_set


def cifar_benchmark(root: str | Path, known_classes: Sequence[str], split: str = "test") -> tuple[ImageSet, ImageSet]:
    """CIFAR-100's ``split`` from its python-pickle folder under ``root``, split into known (e.g. CIFAR-40) and
    near-unknown (CIFAR-60) classes (:func:`known_unknown_split`)."""
    return known_unknown_split(load_dataset("cifar100", split, root=root), known_classes)


def read_far_unknown(folder: str | Path, size: int = 32, limit: int | None = None, seed: int = 0) -> torch.Tensor:
    """uint8 (N, 3, size, size) images of every image file under ``folder`` (recursively, sorted by path), resized
    (bilinear) where they differ. The benchmark's far-unknown sets are image folders the user provides. ``limit``: a
    seeded random draw of that many files (in path order), not the first ones, which in a folder per class (DTD's
    textures) would be a few classes only."""
    from PIL import Image

    if limit is not None:
        check_whole_number(limit, "far_limit", hint=" (or None for every image)")
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"no far-unknown image folder at {root}")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    if limit is not None and limit < len(files):
        picks = np.random.default_rng(seed).choice(len(files), size=limit, replace=False)
        files = [files[i] for i in sorted(picks)]
    images, unreadable = [], []
    for path in files:
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
                if image.size != (size, size):
                    image = image.resize((size, size), Image.BILINEAR)
                images.append(torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1))
        except OSError as err:
            unreadable.append(f"{path.name} ({err})")
    if unreadable:
        raise ValueError(f"{len(unreadable)} unreadable image(s) in {root}: " + "; ".join(unreadable[:5]))
    return torch.stack(images)


def evaluate_scores(model, known: ImageSet, unknown_sets: Mapping[str, torch.Tensor], score_names: Sequence[str], *, fit: ImageSet | None = None,
                    score_params: Mapping[str, Mapping] | None = None, batch_size: int = 256, required: Sequence[str] = ()) -> dict[str, dict]:
    """Score name → :func:`perceptual.compare_report.unknown_metrics` (AURC, E-AURC, AUROC and FPR@95 per unknown set,
    ECE/NLL/Brier) of ``model`` on the known test images against each unknown set (uint8 or [0, 1] images).
    ``fit``: known training images for the scores that need them (Mahalanobis, k-NN, ReAct). A score that does not
    apply to the model is reported as ``{"error": reason}``, except the ``required`` ones (the baseline of the
    improvement ratios): one of those that does not apply, or no score at all, is an error, before any image is scored
    where the model's layers tell."""
    from .compare_report import unknown_metrics
    from .scores import feature_representation, make_score, model_outputs

    scores = {name: make_score(name, **dict((score_params or {}).get(name) or {})) for name in score_names}
    representation, inapplicable = feature_representation(model, scores)  # a penultimate layer only where a score uses it
    results: dict[str, dict] = {name: {"error": reason} for name, reason in inapplicable.items()}
    _check_applicable(results, score_names, required)
    scores = {name: score for name, score in scores.items() if name not in inapplicable}
    options = dict(batch_size=batch_size, features=representation is not None, representation=representation)
    as_float = lambda x: x.float() / 255 if x.dtype == torch.uint8 else x  # noqa: E731
    id_outputs = model_outputs(model, as_float(known.images), **options)
    ood_outputs = {n: model_outputs(model, as_float(x), **options) for n, x in unknown_sets.items()}
    fit_outputs = model_outputs(model, as_float(fit.images), **options) if fit is not None else None
    labels = known.labels.numpy()
    for name, score in scores.items():
        try:
            if fit is not None:
                score.fit(model, as_float(fit.images), fit.labels, batch_size=batch_size, outputs=fit_outputs)
            id_scores = score.score(model, as_float(known.images), batch_size=batch_size, outputs=id_outputs)
            ood = {n: score.score(model, as_float(x), batch_size=batch_size, outputs=ood_outputs[n]).scores for n, x in unknown_sets.items()}
        except (ValueError, RuntimeError) as err:
            results[name] = {"error": str(err)}
            continue
        results[name] = unknown_metrics(id_scores, id_outputs.logits, ood, labels)
    _check_applicable(results, score_names, required)
    return {name: results[name] for name in score_names}  # in the order asked


def _check_applicable(results: Mapping[str, Mapping], score_names: Sequence[str], required: Sequence[str]) -> None:
    failed = {name: result["error"] for name, result in results.items() if "error" in result}
    reasons = "; ".join(f"{name}: {reason}" for name, reason in failed.items())
    if score_names and set(failed) >= set(score_names):
        raise ValueError(f"none of the scores {list(score_names)} applies to this model ({reasons}): add max_softmax, energy or another "
                         "logit score to scores=[...]")
    for name in required:
        if name in failed:
            raise ValueError(f"{name}, the baseline of the improvement ratios, does not apply to this model ({failed[name]}): choose "
                             "a baseline that does, e.g. baseline=max_softmax")


def unknown_table(results: Mapping[str, Mapping], baseline: str = "max_softmax") -> pd.DataFrame:
    """The paper's table: one row per score function with accuracy, unknown_aurc, aurc, eaurc, auroc_<set>,
    fpr_at_95_tpr_<set>, ece, and
    ``<column>_improvement`` over ``baseline`` (module docstring; NaN where either value is missing or the baseline is
    0). Scores reported with an error are rows of NaN with the reason in ``error``."""
    rows = []
    for name, result in results.items():
        row = {"score": name, "error": result.get("error")}
        if "error" not in result:
            row.update({"accuracy": result["accuracy"], "unknown_aurc": result["unknown_aurc"], "aurc": result["aurc"],
                        "eaurc": result["eaurc"], "ece": result.get("ece")})
            for metric in ("auroc", "fpr_at_95_tpr"):
                row.update({f"{metric}_{s}": v for s, v in result[metric].items()})
        rows.append(row)
    table = pd.DataFrame(rows).set_index("score")
    if baseline not in table.index:
        raise ValueError(f"the baseline {baseline!r} is not among the scores {list(table.index)}")
    columns = [c for c in table.columns if c != "error"]
    table[columns] = table[columns].astype(float)
    base = table.loc[baseline, columns]
    for column in columns:
        lower = column.startswith(LOWER_IS_BETTER)
        with np.errstate(divide="ignore", invalid="ignore"):
            change = (base[column] - table[column]) if lower else (table[column] - base[column])
            table[f"{column}_improvement"] = np.where(base[column] != 0, change / base[column], np.nan)
    return table.reset_index()


__all__ = ["cifar_benchmark", "evaluate_scores", "known_unknown_split", "read_far_unknown", "unknown_table"]
