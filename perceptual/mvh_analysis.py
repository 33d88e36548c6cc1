"""Human baselines of the model-vs-human benchmark from real trial tables: accuracy, error consistency, shape bias.

Geirhos et al., "Partial success in closing the gap between human and machine vision" (NeurIPS 2021) and
"ImageNet-trained CNNs are biased towards texture" (ICLR 2019); reference code bethgelab/model-vs-human
(``plotting/analyses.py``: ``SixteenClassAccuracy``, ``ErrorConsistency``, ``ShapeBias``; ``plotting/plot.py``).

Input is a trial table as :func:`perceptual.human_trials.read_trials` returns it (columns subject, dataset, condition,
image_id, category, response, correct; ``imagename`` for shape bias). Human subjects are those whose name starts with
``subject-`` (the benchmark's convention) unless ``humans=`` says otherwise; every other subject is a model.

* :func:`accuracy_per_subject` / :func:`accuracy_summary`: accuracy per subject, experiment and condition; across the
  humans their mean, standard deviation (ddof 1), minimum and maximum (the band of the benchmark's accuracy plots).
* :func:`pairwise_consistency`: observed and error consistency (Cohen's kappa on correctness) between every pair of
  subjects per experiment and condition, trials matched by source image; :func:`consistency_summary` averages the
  human-human pairs: the benchmark's ceiling for models.
* :func:`shape_bias_table`: shape bias per subject and shape category, over the humans pooled, and as the mean of the
  subjects' values.

Differences from the reference, on purpose: a pair of observers is compared on the source images they BOTH saw in
that condition (the benchmark asserts that they saw the same ones); the counts of images only one of them saw are
columns of the result, so nothing is dropped unseen. Error consistency is NaN where it is undefined (both right on
every trial or both wrong on every trial; the benchmark returns 1.0 whenever observed consistency is 1); pass
``on_undefined="one"`` for the benchmark's numbers. Means over pairs and conditions skip NaN, as pandas does in the
benchmark, and the number of defined values is reported next to them. :func:`consistency_matrix` averages the
per-condition kappas where the benchmark's matrices pool every condition's trials into one kappa (see there).
"""
from __future__ import annotations

import logging
import re
from itertools import combinations
from typing import Any, Collection

import numpy as np
import pandas as pd

from .decisions import TRIAL_TABLE_COLUMNS
from .human_trials import texture_category
from .metrics import SIXTEEN_CLASS_NAMES, error_consistency, observed_consistency, shape_bias
from .metrics._validation import as_binary
from .metrics.trials import human_test as is_human_test

log = logging.getLogger(__name__)

REQUIRED = TRIAL_TABLE_COLUMNS
CUE_CONFLICT = "cue-conflict"


def _check(trials: pd.DataFrame, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    if not isinstance(trials, pd.DataFrame):
        raise TypeError(f"trials must be a pandas DataFrame (perceptual.human_trials.read_trials), got {type(trials).__name__}")
    missing = [c for c in REQUIRED + extra if c not in trials.columns]
    if missing:
        raise ValueError(f"trials lack the column(s) {missing}; required: {REQUIRED + extra}")
    if trials.empty:
        raise ValueError("trials is empty")
    # NaN or the text "False" would read as correct in a boolean cast: refused, as aggregate_trials refuses them
    as_binary(trials["correct"].infer_objects().to_numpy(), "trials' correct column")
    repeated = trials.duplicated(["dataset", "condition", "subject", "image_id"])
    if repeated.any():
        example = trials.loc[repeated, ["dataset", "condition", "subject", "image_id"]].iloc[0].tolist()
        raise ValueError(f"{int(repeated.sum())} trial(s) repeat an image for the same subject and condition (e.g. {example}); "
                         "each subject must see each source image once per condition")
    return trials


def accuracy_per_subject(trials: pd.DataFrame, humans: Any = None) -> pd.DataFrame:
    """One row per (dataset, condition, subject): ``n_trials``, ``accuracy`` and ``is_human``.

    Accuracy is the fraction of trials whose response is the category (the benchmark's ``SixteenClassAccuracy``;
    unanswered trials count wrong).
    """
    trials = _check(trials)
    human = is_human_test(humans)
    table = (trials.groupby(["dataset", "condition", "subject"], sort=True)["correct"]
             .agg(n_trials="size", accuracy="mean").reset_index())
    table["is_human"] = table["subject"].map(human).astype(bool)
    return table


def accuracy_summary(per_subject: pd.DataFrame) -> pd.DataFrame:
    """Across the human subjects, per (dataset, condition): ``n_subjects``, ``mean``, ``std`` (ddof 1), ``min``, ``max``."""
    humans = per_subject.loc[per_subject["is_human"]]
    if humans.empty:
        raise ValueError("no human subjects in the table (names starting with 'subject-', or pass humans=)")
    return (humans.groupby(["dataset", "condition"], sort=True)["accuracy"]
            .agg(n_subjects="size", mean="mean", std="std", min="min", max="max").reset_index())


def pairwise_consistency(trials: pd.DataFrame, humans: Any = None, on_undefined: str = "nan") -> pd.DataFrame:
    """Observed and error consistency between every pair of subjects, per (dataset, condition).

    Columns: dataset, condition, subject_a, subject_b, kind (``human-human``, ``model-human`` or ``model-model``),
    n_shared (source images both saw; the trials compared), n_only_a, n_only_b, observed_consistency,
    error_consistency. Pairs are unordered, ``subject_a`` < ``subject_b`` in name order, except that a model is
    always ``subject_a`` of a model-human pair. A pair with no shared image has NaN values.
    Geirhos et al. (NeurIPS 2020), eq. 1-3; :func:`perceptual.metrics.error_consistency`.
    """
    trials = _check(trials)
    human = is_human_test(humans)
    rows = []
    for (dataset, condition), cell in trials.groupby(["dataset", "condition"], sort=True):
        by_subject = {s: g.set_index("image_id")["correct"].astype(bool) for s, g in cell.groupby("subject", sort=True)}
        for a, b in combinations(sorted(by_subject), 2):
            if human(a) and not human(b):
                a, b = b, a
            kind = {(True, True): "human-human", (False, True): "model-human", (False, False): "model-model"}[(human(a), human(b))]
            series_a, series_b = by_subject[a], by_subject[b]
            shared = series_a.index.intersection(series_b.index)
            row = {"dataset": dataset, "condition": condition, "subject_a": a, "subject_b": b, "kind": kind, "n_shared": len(shared),
                   "n_only_a": len(series_a) - len(shared), "n_only_b": len(series_b) - len(shared)}
            if len(shared):
                correct_a, correct_b = series_a.loc[shared].to_numpy(), series_b.loc[shared].to_numpy()
                row["observed_consistency"] = observed_consistency(correct_a, correct_b)
                row["error_consistency"] = error_consistency(correct_a, correct_b, on_undefined=on_undefined)
            else:
                row["observed_consistency"] = row["error_consistency"] = float("nan")
            rows.append(row)
    columns = ["dataset", "condition", "subject_a", "subject_b", "kind", "n_shared", "n_only_a", "n_only_b", "observed_consistency",
               "error_consistency"]
    pairs = pd.DataFrame(rows, columns=columns)
    unmatched = pairs[(pairs["n_only_a"] > 0) | (pairs["n_only_b"] > 0)]
    if len(unmatched):  # the benchmark asserts equal image ids; the raw data's subjects all saw the same images
        first = unmatched.iloc[0]
        log.warning("%d subject pair(s) saw partly different images and are compared on the images both saw, %d of them on none "
                    "(undefined), e.g. %s vs %s in %s %s: %d shared, %d and %d seen by one only; check those files' image names "
                    "and missing trials (pairs.csv: n_shared, n_only_a, n_only_b)", len(unmatched), int((unmatched["n_shared"] == 0).sum()),
                    first["subject_a"], first["subject_b"], first["dataset"], first["condition"], first["n_shared"], first["n_only_a"],
                    first["n_only_b"])
    return pairs


def consistency_summary(pairs: pd.DataFrame, kind: str = "human-human") -> pd.DataFrame:
    """Per (dataset, condition), over the pairs of ``kind``: ``n_pairs``, ``n_defined`` (pairs with a defined error
    consistency), and mean, std (ddof 1), min, max of error consistency; ``observed_mean`` of observed consistency."""
    chosen = pairs.loc[pairs["kind"] == kind]
    if chosen.empty:
        raise ValueError(f"no {kind} pairs in the table")
    grouped = chosen.groupby(["dataset", "condition"], sort=True)
    summary = grouped["error_consistency"].agg(n_pairs="size", n_defined="count", mean="mean", std="std", min="min", max="max")
    summary["observed_mean"] = grouped["observed_consistency"].mean()
    return summary.reset_index()


def consistency_matrix(pairs: pd.DataFrame, dataset: str, metric: str = "error_consistency") -> pd.DataFrame:
    """(subjects × subjects) matrix of ``metric`` for one data set, averaged over its conditions (NaN skipped);
    the diagonal is NaN (a subject is not compared with itself).

    Deliberately not the benchmark's ``get_raw_matrix``, which computes one kappa over all of a pair's trials pooled
    across conditions: pooling counts agreement that comes only from both finding the easy conditions easy and the
    hard ones hard, and inflates kappa (subject-01 vs subject-02 on high-pass: 0.28 here, 0.58 pooled). These values
    are therefore not comparable with the benchmark's published matrices; they are with its per-condition curves."""
    chosen = pairs.loc[pairs["dataset"] == dataset]
    if chosen.empty:
        raise ValueError(f"no pairs for data set {dataset!r}; found {sorted(pairs['dataset'].unique())}")
    mean = chosen.groupby(["subject_a", "subject_b"])[metric].mean()
    subjects = sorted(set(chosen["subject_a"]) | set(chosen["subject_b"]))
    matrix = pd.DataFrame(np.nan, index=subjects, columns=subjects)
    for (a, b), value in mean.items():
        matrix.loc[a, b] = matrix.loc[b, a] = value
    return matrix


def shape_bias_table(trials: pd.DataFrame, humans: Any = None, dataset: str = CUE_CONFLICT) -> pd.DataFrame:
    """Shape bias per subject on the cue-conflict trials, with the humans pooled and the mean over human subjects.

    Geirhos et al. (ICLR 2019); model-vs-human's ``ShapeBias``: the shape class is ``category``, the texture class
    comes from the image name (:func:`perceptual.human_trials.texture_category`); trials whose shape and texture
    classes agree are left out; shape bias = shape decisions / (shape + texture decisions)
    (:func:`perceptual.metrics.shape_bias`). Rows: one per subject (``scope`` = ``subject``), ``all humans`` (scope
    ``pooled``: every human trial together) and ``mean of humans`` (scope ``mean``: the mean of the subjects' values).
    Columns: subject, scope, is_human, n_trials, n_conflict, shape_decisions, texture_decisions, shape_bias.
    """
    trials = _check(trials, ("imagename",))
    cue = trials.loc[trials["dataset"] == dataset].copy()
    if cue.empty:
        raise ValueError(f"no {dataset!r} trials; data sets present: {sorted(trials['dataset'].unique())}")
    human = is_human_test(humans)
    cue["texture"] = cue["imagename"].map(texture_category)
    unknown = sorted(set(cue["texture"]) - set(SIXTEEN_CLASS_NAMES))
    if unknown:
        raise ValueError(f"texture classes {unknown} from the image names are not among the 16 classes: are these cue-conflict names "
                         "(<...>_<shape><n>-<texture><n>.png)?")

    def row(name: str, scope: str, group: pd.DataFrame, is_human: bool) -> dict:
        conflict = group["category"] != group["texture"]
        return {"subject": name, "scope": scope, "is_human": is_human, "n_trials": len(group), "n_conflict": int(conflict.sum()),
                "shape_decisions": int((conflict & (group["response"] == group["category"])).sum()),
                "texture_decisions": int((conflict & (group["response"] == group["texture"])).sum()),
                "shape_bias": shape_bias(group["category"].to_numpy(), group["texture"].to_numpy(), group["response"].to_numpy())}

    rows = [row(s, "subject", g, bool(human(s))) for s, g in cue.groupby("subject", sort=True)]
    people = cue.loc[cue["subject"].map(human).astype(bool)]
    if len(people):
        rows.append(row("all humans", "pooled", people, True))
        values = [r["shape_bias"] for r in rows if r["scope"] == "subject" and r["is_human"]]
        rows.append({"subject": "mean of humans", "scope": "mean", "is_human": True, "n_trials": len(people),
                     "n_conflict": int((people["category"] != people["texture"]).sum()), "shape_decisions": np.nan,
                     "texture_decisions": np.nan, "shape_bias": float(np.nanmean(values))})
    return pd.DataFrame(rows)


def shape_bias_per_category(trials: pd.DataFrame, humans: Any = None, dataset: str = CUE_CONFLICT) -> pd.DataFrame:
    """Shape bias per subject and SHAPE category, plus two human rows per category: ``mean of humans``, the mean of the
    human subjects' values (the benchmark's shape-bias plot, ``plot_shape_bias_boxplot``), and ``all humans``, every
    human trial pooled (it weights subjects by their conflict trials; up to 2 points off the mean on the real data).

    Columns: subject, category, n_conflict, shape_bias (NaN where no decision matched either cue).
    """
    trials = _check(trials, ("imagename",))
    cue = trials.loc[trials["dataset"] == dataset].copy()
    if cue.empty:
        raise ValueError(f"no {dataset!r} trials; data sets present: {sorted(trials['dataset'].unique())}")
    human = is_human_test(humans)
    cue["texture"] = cue["imagename"].map(texture_category)
    pooled = cue.loc[cue["subject"].map(human).astype(bool)].assign(subject="all humans")
    rows = []
    for (subject, category), group in pd.concat([cue, pooled]).groupby(["subject", "category"], sort=True):
        rows.append({"subject": subject, "category": category, "n_conflict": int((group["category"] != group["texture"]).sum()),
                     "shape_bias": shape_bias(group["category"].to_numpy(), group["texture"].to_numpy(), group["response"].to_numpy())})
    table = pd.DataFrame(rows)
    people = table[table["subject"].map(human).astype(bool) & (table["subject"] != "all humans")]
    if len(people):
        means = people.groupby("category", sort=True).agg(n_conflict=("n_conflict", "sum"), shape_bias=("shape_bias", "mean"))  # NaN skipped
        table = pd.concat([table, means.reset_index().assign(subject="mean of humans")[table.columns]], ignore_index=True)
    return table


# The benchmark's order (``datasets/experiments.py``) for its conditions that are not numbers: colour before greyscale,
# true colour before opponent colour, the original before the equalised power spectrum.
NAMED_CONDITION_ORDER = ("cr", "bw", "true", "false", "0", "pow")  # compared in lower case: the raw CSVs write true/false
# Experiments whose numbers the benchmark lists from the largest down, so that every experiment runs from the undistorted
# condition to the most distorted one: 100 % contrast first, the unfiltered high-pass image (``inf``) first.
DESCENDING_EXPERIMENTS = ("contrast", "high-pass")


def condition_order(conditions: Collection, dataset: str | None = None) -> list:
    """Conditions in the benchmark's plotting order (``data_conditions`` in model-vs-human's ``datasets/experiments.py``).

    Numerically where all are numbers (``0.7`` < ``3``; contrast's ``c05`` by its percentage; eidolon's
    ``<reach>-<coherence>-<grain>`` by reach), ascending except for the :data:`DESCENDING_EXPERIMENTS` (``dataset``:
    contrast from ``c100`` down, high-pass from ``inf`` down); else in the benchmark's order for its named conditions
    (:data:`NAMED_CONDITION_ORDER`) and then as strings."""
    values = [str(c) for c in conditions]

    def number(text: str) -> float | None:
        found = re.fullmatch(r"c(\d+)", text) or re.fullmatch(r"(\d+)-\d+-\d+", text)
        try:
            return float(found.group(1)) if found else float(text)
        except ValueError:
            return None

    if all(number(v) is not None for v in values):
        return sorted(values, key=lambda v: (number(v), v), reverse=dataset in DESCENDING_EXPERIMENTS)
    rank = {name: i for i, name in enumerate(NAMED_CONDITION_ORDER)}
    return sorted(values, key=lambda v: (rank.get(v.lower(), len(rank)), v))


__all__ = [
    "CUE_CONFLICT", "DESCENDING_EXPERIMENTS", "NAMED_CONDITION_ORDER",
    "accuracy_per_subject", "accuracy_summary", "condition_order", "consistency_matrix", "consistency_summary",
    "is_human_test", "pairwise_consistency", "shape_bias_per_category", "shape_bias_table",
]
