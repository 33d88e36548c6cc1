"""The compare metric suite with the model-vs-human benchmark's real human trials as the human rows.

``compare`` scores models against simulated observers that all classify the same images. Here the observers are
the benchmark's subjects (Geirhos et al., NeurIPS 2021) and models that decided on its images, perhaps on part of them,
so two observers are compared on the source images they share, as the benchmark's ``analyses.py`` does
(:func:`perceptual.mvh_analysis.pairwise_consistency`; in the shared data every subject of a condition saw the same
images). Every pair metric of :mod:`perceptual.pair_metrics` is computed pair by pair on the shared source images of
each (experiment, condition) cell, which gives the same condition-averaged matrices, model-vs-human ranking and
Spearman table between metrics as ``compare`` reports for its panel.

The benchmark numbers subjects per experiment, so ``subject-01`` of one experiment is not the person of another. The
models' values are therefore nested as the benchmark nests its own three: mean over an experiment's conditions, then
over that experiment's humans, then over experiments (:func:`perceptual.metrics.aggregate_trials`; the other metrics
the same way). ``exclude`` leaves conditions out of the ranking and the mean matrices, as the benchmark's table leaves
out :data:`perceptual.metrics.MVH_EXCLUDED_CONDITIONS` (``compare humans=`` does by default); the per-condition
matrices and accuracies keep every cell.

What differs from the panel, deliberately:

* An observer's answer distribution is one-hot on its response (people, and decisions read from CSVs, give no
  softmax), so SOC and SOCE measure agreement of answers rather than of distributions.
* An unanswered trial (``na``) is answered with an extra 17th "no answer" class: wrong, as in the benchmark, and
  never agreeing with a wrong class answer of another observer (MA, CLES), nor with another observer's ``na`` on the
  same image: leaving an image unanswered is not naming the same wrong class (the second observer's ``na`` is then an
  18th class). CLES smooths over 16 classes (Xu et al.'s k for model-vs-human), plus one per extra class used.
* CKA is left out: no observer here has a feature space.

Rows are labelled by kind: ``human:subject-01`` and ``model:<name>`` (:func:`system_label`).
"""
from __future__ import annotations

import logging
from collections import defaultdict
from itertools import combinations
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .human_trials import NO_ANSWER
from .metrics import SIXTEEN_CLASS_NAMES, is_excluded
from .metrics._validation import nanmean
from .mvh_analysis import condition_order
from .pair_metrics import NESTED_METRICS, PAIR_METRIC_REGISTRY, MetricContext, Responses, metric_correlations, nanmean_matrices, rankings
from .tasks import panel_summary

log = logging.getLogger(__name__)

HUMAN_PREFIX, MODEL_PREFIX = "human:", "model:"
FEATURE_METRICS = ("cka",)  # need a feature space, which observers read from trials do not have


def trial_pair_metrics() -> tuple[str, ...]:
    """Every registered pair metric that needs no feature space (read at call time, so later registrations count)."""
    return tuple(name for name in PAIR_METRIC_REGISTRY if name not in FEATURE_METRICS)


def system_label(subject: str, is_human: bool) -> str:
    """``human:subject-01`` or ``model:resnet50``: the row names of the report."""
    return (HUMAN_PREFIX if is_human else MODEL_PREFIX) + str(subject)


def check_shared_images(humans: pd.DataFrame, models: pd.DataFrame) -> None:
    """Refuse model trials that share no source image with the humans in some (experiment, condition) cell: their
    consistencies would be undefined (NaN), and the run would look fine."""
    human_images = humans.groupby(["dataset", "condition"])["image_id"].agg(set).to_dict()
    unmatched = []
    for (dataset, condition, subject), cell in models.groupby(["dataset", "condition", "subject"]):
        if not set(cell["image_id"]) & human_images.get((dataset, condition), set()):
            unmatched.append(f"{subject} in {dataset}/{condition}")
    if unmatched:
        raise ValueError(f"model decisions share no source image with the human trials in {len(unmatched)} cell(s): "
                         + ", ".join(unmatched[:8]) + ". Trials are matched by the source image (the last '_' field of "
                         "imagename, or ImageNet's n0…_… pair, as model-vs-human matches them): were the decisions made on the benchmark's images?")


def labelled_trials(humans: pd.DataFrame, models: pd.DataFrame) -> pd.DataFrame:
    """Human and model trial tables as one, with subjects renamed by :func:`system_label`.

    Errors, before any work: a model named like a human subject, a model deciding one image twice (two models under
    one name), model trials in an experiment the humans did not do, or model trials that share no source image with
    the humans in some (experiment, condition) cell.
    """
    clash = sorted(set(models["subject"]) & set(humans["subject"]))
    if clash:
        raise ValueError(f"model decisions use subject name(s) {clash} of the human trials; give the models names of their own")
    missing = sorted(set(models["dataset"]) - set(humans["dataset"]))
    if missing:
        raise ValueError(f"model decisions for experiment(s) {missing} that have no human trials; drop them or add those human trials")
    repeated = models[models.duplicated(["dataset", "condition", "subject", "image_id"], keep=False)]
    if len(repeated):
        first = repeated.iloc[0]
        raise ValueError(f"model {first['subject']!r} decided image {first['image_id']!r} of {first['dataset']}/{first['condition']} more than "
                         f"once ({len(repeated)} such decisions): are two models labelled alike (give each a label), or one model_trials "
                         "file given twice?")
    check_shared_images(humans, models)
    humans = humans.assign(subject=[system_label(s, True) for s in humans["subject"]])
    models = models.assign(subject=[system_label(s, False) for s in models["subject"]])
    return pd.concat([humans, models], ignore_index=True)


def _responses(cell: pd.DataFrame, classes: Sequence[str]) -> tuple[pd.Series, pd.Series]:
    """(answer index, label index) per source image; ``na`` is the extra class ``len(classes)``."""
    index = {c: i for i, c in enumerate(classes)} | {NO_ANSWER: len(classes)}
    cell = cell.set_index("image_id")
    return cell["response"].map(index).astype(int), cell["category"].map(index).astype(int)


def pair_matrices_on_trials(trials: pd.DataFrame, systems: Sequence[str], *, classes: Sequence[str] = SIXTEEN_CLASS_NAMES,
                            metrics: Sequence[str] | None = None, cles_variant: str = "paper",
                            on_undefined: str = "nan") -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """{(experiment, condition): {metric: (S, S) matrix}}: each pair of ``systems`` on the source images both saw.

    A pair that shares no image in a cell is NaN there; the diagonal is a system against itself on all its images.
    ``metrics``: names in :data:`perceptual.pair_metrics.PAIR_METRIC_REGISTRY` (default: :func:`trial_pair_metrics`).
    """
    metrics = trial_pair_metrics() if metrics is None else tuple(metrics)
    unknown = [m for m in metrics if m not in PAIR_METRIC_REGISTRY]
    if unknown:
        raise ValueError(f"unknown pair metric(s) {unknown}: use any of {list(PAIR_METRIC_REGISTRY)}")
    no_answer, second_no_answer = len(classes), len(classes) + 1
    eye = np.eye(len(classes) + 2)

    def context(labels: np.ndarray, *answers: np.ndarray) -> MetricContext:
        extra = sum(int((a >= no_answer).any()) for a in answers)  # the extra classes only where they are used
        return MetricContext(labels, len(classes) + extra, cles_variant, on_undefined)

    out = {}
    cells = dict(list(trials.groupby(["dataset", "condition"], sort=True)))
    ordered = [(d, c) for d in sorted({d for d, _ in cells}) for c in condition_order([c for dd, c in cells if dd == d], d)]
    for dataset, condition in ordered:  # the benchmark's condition order, so families and tables read in order
        cell = cells[(dataset, condition)]
        answers = {s: _responses(g, classes) for s, g in cell.groupby("subject")}
        matrices = {m: np.full((len(systems), len(systems)), np.nan) for m in metrics}
        for (i, a), (j, b) in combinations(enumerate(systems), 2):
            if a not in answers or b not in answers:
                continue
            shared = answers[a][0].index.intersection(answers[b][0].index)
            if not len(shared):
                continue
            labels = answers[a][1].loc[shared].to_numpy()
            pa, pb = (answers[s][0].loc[shared].to_numpy() for s in (a, b))
            if (pa == no_answer).any():  # two observers' no-answers to one image are not one answer
                pb = np.where(pb == no_answer, second_no_answer, pb)
            ra, rb = Responses(pa, eye[pa]), Responses(pb, eye[pb])
            pair = context(labels, pa, pb)
            for m in metrics:
                matrices[m][i, j] = matrices[m][j, i] = PAIR_METRIC_REGISTRY[m].fn(ra, rb, pair)
        for i, s in enumerate(systems):
            if s in answers:
                predictions, labels = (x.to_numpy() for x in answers[s])
                r = Responses(predictions, eye[predictions])
                own = context(labels, predictions)
                for m in metrics:
                    matrices[m][i, i] = PAIR_METRIC_REGISTRY[m].fn(r, r, own)
        out[(dataset, condition)] = matrices
    return out


def compare_on_trials(trials: pd.DataFrame, *, cles_variant: str = "paper", on_undefined: str = "nan",
                      exclude: Mapping[str, Sequence[str]] | None = None) -> dict:
    """``compare``'s behaviour report on labelled trials (:func:`labelled_trials`): the same keys as the panel's.

    ``accuracy`` per ``experiment/condition`` cell and system, and ``accuracy_mean`` (mean over an experiment's ranked
    conditions, then over experiments); ``per_condition`` and ``aggregated`` pair matrices (aggregated: mean over each
    experiment's ranked conditions, then over experiments, NaN skipped); ``ranking``: every metric in the
    model-vs-human nesting (conditions, then the experiment's humans, then experiments;
    :func:`perceptual.metrics.aggregate_trials` for accuracy difference, observed and error consistency) and the mean
    ranks (consistencies on the images both observers saw, like the matrices); ``spearman_between_metrics`` over the
    distinct system pairs (Xu et al.). ``exclude`` ({experiment: [condition, ...]}, e.g.
    :func:`perceptual.metrics.mvh_exclusions`): conditions left out of everything but the per-condition entries.

    As in the reference (one list of experiments for every model) and ``humans-mvh``, everything is computed on the
    experiments every model has decisions for: a model's other experiments are named in ``left_out`` and human
    experiments no model did in ``without_models``. Otherwise a model would be ranked on its own, perhaps easier, mix.
    """
    subjects = sorted(s for s in trials["subject"].unique() if s.startswith(HUMAN_PREFIX))
    models = sorted(s for s in trials["subject"].unique() if s.startswith(MODEL_PREFIX))
    if not subjects or not models:
        raise ValueError(f"need human and model trials, got {len(subjects)} human and {len(models)} model subject(s); subjects must be "
                         f"labelled {HUMAN_PREFIX!r}/{MODEL_PREFIX!r} (labelled_trials does that)")
    covered = {m: set(trials.loc[trials["subject"] == m, "dataset"]) for m in models}
    common = set.intersection(*covered.values())
    left_out = {m: sorted(covered[m] - common) for m in models if covered[m] - common}
    without_models = sorted(set(trials["dataset"]) - set.union(*covered.values()))
    if not common:
        raise ValueError(f"the models share no experiment ({ {m: sorted(c) for m, c in covered.items()} }): a ranking would compare "
                         "each on different images; compare them separately, or give every model the same experiments")
    if left_out:
        log.warning("the models are compared on the experiments they all have, %s; left out: %s", sorted(common), left_out)
    trials = trials[trials["dataset"].isin(common)]
    systems = models + subjects
    metrics = trial_pair_metrics()
    per_cell = pair_matrices_on_trials(trials, systems, metrics=metrics, cles_variant=cles_variant, on_undefined=on_undefined)
    per_condition = {f"{d}/{c}": m for (d, c), m in per_cell.items()}
    ranked = {(d, c): m for (d, c), m in per_cell.items() if not is_excluded(d, c, exclude)}
    if not ranked:
        raise ValueError(f"every condition of the experiments {sorted({d for d, _ in per_cell})} is excluded ({dict(exclude or {})}): "
                         "nothing is left to rank; keep them (compare humans_benchmark_exclusions=false) or add other experiments")
    per_experiment = defaultdict(list)
    for (dataset, _), matrices in ranked.items():
        per_experiment[dataset].append(matrices)
    by_experiment = {d: {m: nanmean_matrices([cell[m] for cell in cells]) for m in metrics} for d, cells in per_experiment.items()}
    aggregated = {m: nanmean_matrices([matrices[m] for matrices in by_experiment.values()]) for m in metrics}
    humans_of = trials.groupby("dataset")["subject"].agg(lambda s: sorted(x for x in set(s) if x.startswith(HUMAN_PREFIX))).to_dict()
    panel_metrics = [m for m in metrics if m not in NESTED_METRICS]  # the nested three come from aggregate_trials
    panel_values = {model: {m: nanmean([nanmean([matrices[m][systems.index(model), systems.index(h)] for h in humans_of[d]])
                                         for d, matrices in by_experiment.items()]) for m in panel_metrics} for model in models}
    accuracy, accuracy_by_experiment = {}, defaultdict(lambda: defaultdict(list))
    for dataset, experiment in trials.groupby("dataset", sort=True):
        cells = dict(list(experiment.groupby("condition")))
        for condition in condition_order(cells, dataset):  # the benchmark's order: undistorted first
            accuracy[f"{dataset}/{condition}"] = cells[condition].groupby("subject")["correct"].mean().to_dict()
            if (dataset, condition) in ranked:
                for system, value in accuracy[f"{dataset}/{condition}"].items():
                    accuracy_by_experiment[system][dataset].append(value)
    accuracy_mean = {s: nanmean([np.mean(v) for v in accuracy_by_experiment[s].values()]) for s in systems}
    return {
        "systems": systems, "models": models, "subjects": subjects,
        "experiments": sorted({d for d, _ in per_cell}), "left_out": left_out, "without_models": without_models,
        "excluded_conditions": {d: list(c) for d, c in (exclude or {}).items()},
        "accuracy": accuracy, "accuracy_mean": accuracy_mean,
        "per_condition": per_condition, "aggregated": aggregated,
        "ranked_conditions": [f"{d}/{c}" for d, c in ranked],  # what the averages and the ranking take (the panel's key)
        "diagonal": {name: PAIR_METRIC_REGISTRY[name].diagonal for name in metrics},
        "ranking": rankings(trials, aggregated, systems, models, subjects, on_undefined, images="shared", exclude=exclude,
                            panel_values=panel_values),
        "spearman_between_metrics": metric_correlations(aggregated),
    }


def _exclusion_sentence(excluded: Mapping[str, Sequence[str]]) -> str:
    if not excluded:
        return "Every condition is ranked (the benchmark's table would leave out its controls and conditions where humans score under 20 %)."
    cells = "; ".join(f"{d}: {', '.join(map(str, c))}" for d, c in excluded.items())
    return (f"As in the benchmark's table, the ranking, the accuracy and the mean matrices leave out its controls and conditions "
            f"where humans score under 20 % ({cells}); the per-condition table below keeps them.")


def _coverage_lines(data: Mapping) -> list[str]:
    lines = []
    if data.get("left_out"):
        named = "; ".join(f"{m}: {', '.join(e)}" for m, e in data["left_out"].items())
        lines.append(f"Every model is compared on the experiments all models have; left out: {named}.")
    if data.get("without_models"):
        lines.append(f"Human experiments without model decisions, left out: {', '.join(data['without_models'])}.")
    return lines + [""] if lines else []


def summary_markdown(data: Mapping, figures: Sequence[str] = ()) -> str:
    """The human section of the compare report."""
    from .compare_report import _fmt, metric_correlation_lines

    models, subjects, ranking = data["models"], data["subjects"], data["ranking"]
    metrics = ranking["ranked_metrics"]["all"] + ["soc"]
    lines = ["# Compare report: models against the model-vs-human benchmark's human trials", "",
             f"Experiments: {', '.join(data['experiments'])}; {len(subjects)} human subject ids (the benchmark numbers subjects per "
             f"experiment, so one id is different people in different experiments; the ranking never mixes them); models: {', '.join(models)}. "
             "Observers are compared on the source images both saw in each experiment and condition (one-hot answers: "
             "SOC and SOCE measure answer agreement; no CKA).", "",
             "## Models against the humans", "",
             "Every metric in model-vs-human's nesting: mean over an experiment's conditions, then over its humans, then over "
             "experiments; accuracy: mean over an experiment's conditions, then over experiments. Mean rank 1 is the most human-like.",
             "", _exclusion_sentence(data.get("excluded_conditions") or {}), "", *_coverage_lines(data),
             "| Model | accuracy | " + " | ".join(metrics) + " | mean rank (mvh) | mean rank (all) |", "|---" * (len(metrics) + 4) + "|"]
    for m in models:
        lines.append(f"| {m} | {_fmt(data['accuracy_mean'][m])} | " + " | ".join(_fmt(ranking["values"][m].get(k)) for k in metrics)
                     + f" | {_fmt(ranking['mean_rank_mvh'][m], 2)} | {_fmt(ranking['mean_rank_all'][m], 2)} |")
    among = ranking["observers_among_themselves"]
    lines += ["", "Humans among themselves (the ceiling): " + ", ".join(f"{k} {_fmt(v)}" for k, v in among.items()) + ".", ""]
    lines += metric_correlation_lines(data)
    lines += ["", "## Accuracy per condition", "", "| experiment/condition | " + " | ".join(models) + " | humans (mean ± sample std) |",
              "|---" * (len(models) + 2) + "|"]
    for cell, acc in data["accuracy"].items():
        human = panel_summary({s: acc[s] for s in subjects if s in acc})  # the sample std, as humans-mvh and compare print
        lines.append(f"| {cell} | " + " | ".join(_fmt(acc.get(m)) for m in models) + f" | {_fmt(human['mean'])} ± {_fmt(human['std'])} |")
    if figures:
        lines += ["", "## Figures", ""] + [f"- ![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


__all__ = ["FEATURE_METRICS", "HUMAN_PREFIX", "MODEL_PREFIX", "check_shared_images", "compare_on_trials", "labelled_trials", "pair_matrices_on_trials",
           "summary_markdown", "system_label", "trial_pair_metrics"]
