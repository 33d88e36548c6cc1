"""VisAlign's report from a model's abstention scores: Hellinger distance to the humans per group, reliability scores.

Lee et al., "VisAlign: Dataset for Measuring the Degree of Alignment between AI and Humans in Visual Perception"
(NeurIPS 2023 Datasets & Benchmarks; code jiyounglee-0523/VisAlign, ``evaluate_visual_alignment.py``). Every image
belongs to a group (Must-Act, Must-Abstain, Uncertain) and carries the humans' answer distribution over the K classes
plus "abstain". A model answers with its softmax and an abstention probability made from one of the toolkit's
abstention scores (:data:`perceptual.scores.SCORE_FUNCTIONS`, higher = more known) by min-max scaling
(:class:`perceptual.metrics.MinMaxAbstentionCalibrator`, abstention = 1 − scaled score); the table gives the mean
Hellinger distance between the two distributions per group and overall, and the reliability score RS_c
(:func:`perceptual.metrics.reliability_score`). The reference code reports the mean Hellinger distance per category
of the data set (``category1`` to ``category8``, each inside one group): with a ``category`` column in the labels the
table has those means too (``hellinger_per_category``). A group's mean pools its categories' images, so it weighs
them by their image counts and is not the mean of the reference's category columns.

Human labels come from a CSV (:func:`read_human_labels`): ``image_id, group, label``, optionally ``category``, and one
column per class name plus ``abstain`` holding the humans' answer counts (or probabilities) for that image; any other
numeric column is refused, since answers outside the classes would silently renormalise the rest. Deliberate
difference from the reference: the min-max range is fitted on the scored set itself by default (as the reference does)
but can come from a separate reference set (``calibration=``); its direction is explicit (see the calibrator's
docstring).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .metrics import GROUPS, MinMaxAbstentionCalibrator, abstention_distribution, hellinger, reliability_score

log = logging.getLogger(__name__)

ABSTAIN = "abstain"


def read_human_labels(path: str | Path, classes: Sequence[str]) -> pd.DataFrame:
    """Read and check VisAlign's per-image human labels; every problem is listed with its count before anything runs.

    Returns the table with ``group`` normalised (``Must-Act`` → ``must_act``), ``label_index`` (−1 for a
    must-abstain image without a class), the class and ``abstain`` columns as probabilities (rows normalised) and,
    where the file has one, ``category`` as text (the reference's ``category1`` ... ``category8``, or any names).
    """
    classes = [str(c) for c in classes]  # the CSV's column names are text: class 0 is column "0"
    table = pd.read_csv(path, dtype={"image_id": str, "group": str, "label": str, "category": str}, keep_default_na=False)
    needed = ["image_id", "group", "label", *classes, ABSTAIN]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; needed: image_id, group, label, one column per class {classes} and '{ABSTAIN}'")
    problems: list[str] = []

    def report(what: str, mask: pd.Series) -> None:
        if mask.any():
            rows = (np.flatnonzero(mask.to_numpy()) + 2).tolist()  # file line numbers (header is line 1)
            problems.append(f"{what} × {int(mask.sum())} (lines {rows[:5]}{' ...' if len(rows) > 5 else ''})")

    table["group"] = table["group"].str.strip().str.lower().str.replace("-", "_").str.replace(" ", "_")
    report("unknown group (must_act, must_abstain, uncertain)", ~table["group"].isin(GROUPS))
    no_class = table["label"].isin(["", "-1"])
    report("unknown label", ~no_class & ~table["label"].isin(classes))
    report("must_act or uncertain image without a label", no_class & table["group"].isin(["must_act", "uncertain"]))
    report("duplicate image_id", table["image_id"].duplicated(keep=False))
    other_numbers = [c for c in table.columns if c not in {*needed, "category"} and pd.api.types.is_numeric_dtype(table[c])]
    if other_numbers:  # answers for a class outside ``classes`` would be dropped and the rest renormalised
        problems.append(f"numeric column(s) {other_numbers} are neither a class of classes={classes} nor '{ABSTAIN}': if they hold "
                        "human answers, add their classes to classes=; otherwise remove them from the file")
    if "category" in table.columns:
        table["category"] = table["category"].str.strip()
        report("empty category (the column is optional, but where it is given every image needs one)", table["category"] == "")
        spread = table[table["group"].isin(GROUPS) & (table["category"] != "")].groupby("category")["group"].nunique()
        report(f"category in more than one group ({', '.join(spread.index[spread > 1])})", table["category"].isin(spread.index[spread > 1]))
    counts = table[classes + [ABSTAIN]].apply(pd.to_numeric, errors="coerce")
    invalid = (~np.isfinite(counts) | (counts < 0)).any(axis=1)
    report("non-numeric, infinite or negative human answer", invalid)
    report("no human answers (row sums to 0)", ~invalid & (counts.sum(axis=1) == 0))
    if problems:
        raise ValueError(f"{path}: {len(problems)} kind(s) of problem in the human labels:\n  " + "\n  ".join(problems))
    table[classes + [ABSTAIN]] = counts.div(counts.sum(axis=1), axis=0)
    index = {c: i for i, c in enumerate(classes)}
    table["label_index"] = [index.get(label, -1) for label in table["label"]]
    return table


def category_order(categories) -> list[str]:
    """The distinct categories, numbers in numeric order (``category2`` before ``category10``), then text."""
    def key(name: str) -> tuple:
        numbered = re.fullmatch(r"(.*?)(\d+)", name)
        return (numbered[1], int(numbered[2]), name) if numbered else (name, -1, name)

    return sorted({str(c) for c in categories}, key=key)


def visalign_table(human: pd.DataFrame, classes: Sequence[str], class_probs, known_scores: Mapping[str, np.ndarray], *,
                   calibration: Mapping[str, np.ndarray] | None = None, gamma: float = 0.5, lam: float = 0.5,
                   costs: Sequence[float] = (0, 450, 900)) -> pd.DataFrame:
    """One row per score function: mean Hellinger distance per group and overall, reliability scores and their counts.

    ``human``: :func:`read_human_labels`. ``class_probs``: the model's (N, K) softmax on the same images in the same
    order. ``known_scores``: score name → (N,) scores, higher = more known (:mod:`perceptual.scores`).
    ``calibration``: score name → reference scores to fit the min-max range on (default: the scored set itself, as
    the reference code does). Columns: score, hellinger_<group> (NaN for a group without images), hellinger_all,
    hellinger_per_category ({category: mean} in :func:`category_order`, where ``human`` has a ``category`` column; else
    empty), rs_<c> per cost, the reliability counts, abstain_rate (fraction with abstention > ``gamma``).
    """
    classes = list(classes)
    probs = np.asarray(class_probs, dtype=np.float64)
    if probs.shape != (len(human), len(classes)):
        raise ValueError(f"class_probs must be (images = {len(human)}, classes = {len(classes)}), got {probs.shape}")
    humans = human[classes + [ABSTAIN]].to_numpy(dtype=np.float64)
    groups = human["group"].to_numpy()
    categories = human["category"].to_numpy(dtype=str) if "category" in human else np.array([], dtype=str)
    rows = []
    for name, scores in known_scores.items():
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != (len(human),):
            raise ValueError(f"scores of {name!r} must be one per image ({len(human)}), got shape {scores.shape}")
        calibrator = MinMaxAbstentionCalibrator(higher_means_abstain=False)  # scores: higher = more known
        try:
            calibrator.fit((calibration or {}).get(name, scores))
        except ValueError as err:  # e.g. max-softmax saturated at 1.0 on every image: no abstention can be read from it
            log.warning("score %s left out: %s", name, err)
            continue
        abstain = calibrator.transform(scores)
        dist = abstention_distribution(probs, abstain)
        distances = hellinger(dist, humans)
        reliability = reliability_score(dist, groups, human["label_index"].to_numpy(), human_label_prob=humans[:, :-1], gamma=gamma,
                                        lam=lam, costs=costs)
        row = {"score": name}
        for group in GROUPS:
            chosen = groups == group
            row[f"hellinger_{group}"] = float(distances[chosen].mean()) if chosen.any() else float("nan")
        row["hellinger_all"] = float(distances.mean())
        row["hellinger_per_category"] = {c: float(distances[categories == c].mean()) for c in category_order(categories)}
        row.update({f"rs_{c:g}": v for c, v in reliability.scores.items()})
        row.update({k: v for k, v in reliability.to_dict().items() if k not in ("scores", "n_items")})
        row["abstain_rate"] = float(np.mean(abstain > gamma))
        rows.append(row)
    if not rows:
        raise ValueError(f"none of the scores {list(known_scores)} gives an abstention on these images (each is constant)")
    return pd.DataFrame(rows)


def check_model_classes(model, images, classes: Sequence[str]) -> None:
    """Refuse a model whose outputs are not one per class of the labels, from one image, before the whole set runs."""
    import torch

    from invert.modules import evaluation

    with torch.no_grad(), evaluation(model):
        outputs = model(images[:1]).shape[-1]
    if outputs != len(classes):
        raise ValueError(f"the model has {outputs} outputs but the labels name {len(classes)} classes ({list(classes)[:5]} ...): "
                         "pass classes=[...] in the model's output order")


def model_visalign_table(model, images, human: pd.DataFrame, classes: Sequence[str], score_names: Sequence[str], *, fit_images=None,
                         fit_labels=None, score_params: Mapping[str, Mapping] | None = None, batch_size: int = 256, **table_kwargs) -> pd.DataFrame:
    """:func:`visalign_table` for a model and the toolkit's score functions (fit on ``fit_images``/``fit_labels`` where a
    score needs in-distribution data: Mahalanobis, k-NN, ReAct). ``images``: [0, 1] (N, 3, H, W) in ``human``'s order.
    A score that does not apply to the model is left out with a warning that names the reason."""
    from .scores import feature_representation, make_score, model_outputs

    if len(images) != len(human):
        raise ValueError(f"{len(images)} images for {len(human)} human label rows")
    check_model_classes(model, images, classes)
    scores = {name: make_score(name, **dict((score_params or {}).get(name) or {})) for name in score_names}
    representation, inapplicable = feature_representation(model, scores)  # a penultimate layer only where a score uses it
    for name, reason in inapplicable.items():
        log.warning("score %s left out: %s", name, reason)
        del scores[name]
    features = representation is not None
    outputs = model_outputs(model, images, batch_size=batch_size, features=features, representation=representation)
    probs = outputs.logits.double().softmax(dim=1).numpy()
    fit_outputs = (model_outputs(model, fit_images, batch_size=batch_size, features=features, representation=representation)
                   if fit_images is not None else None)
    known = {}
    for name, score in scores.items():
        try:
            if fit_images is not None:
                score.fit(model, fit_images, fit_labels, batch_size=batch_size, outputs=fit_outputs)
            known[name] = score.score(model, images, batch_size=batch_size, outputs=outputs).scores
        except (ValueError, RuntimeError) as err:
            log.warning("score %s left out: %s", name, err)
    if not known:
        raise ValueError(f"none of the scores {list(score_names)} applies to this model")
    return visalign_table(human, classes, probs, known, **table_kwargs)


__all__ = ["ABSTAIN", "category_order", "model_visalign_table", "read_human_labels", "visalign_table"]
