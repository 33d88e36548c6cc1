"""Pair metrics over systems' answers on one image set, as one registry: each metric is a :class:`PairMetric`
record (its function, what its diagonal is, its range, whether higher is better and whether it ranks models).

Adding a metric is one function and one :func:`register_pair_metric` call next to it; ``compare``'s matrices,
heatmaps, rankings and report pick it up. The metrics are those of model-vs-human (Geirhos et al., NeurIPS 2020:
observed and error consistency) and of Xu et al., "Measuring Error Alignment" (misclassification agreement, CLES,
SOC, SOCE), plus linear CKA (Kornblith et al., ICML 2019) between models' penultimate features.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from . import metrics as M
from .metrics._validation import nanmean


@dataclass
class Responses:
    """One system's answers on one image set: predicted labels (N,), answer distributions (N, K), features or None."""

    predictions: np.ndarray
    probabilities: np.ndarray
    features: np.ndarray | None = None


@dataclass(frozen=True)
class MetricContext:
    """What a pair metric may need besides the two systems' answers: the true labels and the settings."""

    labels: np.ndarray
    num_classes: int
    cles_variant: str = "paper"
    on_undefined: str = "nan"


@dataclass(frozen=True)
class PairMetric:
    """One pair metric: ``fn(a, b, context) -> float``, the text of its diagonal (a system against itself), its
    range (for heatmap colours), whether higher means more alike, and whether it enters the models' mean rank."""

    name: str
    fn: Callable[[Responses, Responses, MetricContext], float]
    diagonal: str
    value_range: tuple[float, float] = (0.0, 1.0)
    higher_is_better: bool = True
    ranked: bool = True


PAIR_METRIC_REGISTRY: dict[str, PairMetric] = {}


def register_pair_metric(metric: PairMetric) -> PairMetric:
    """Add ``metric`` to the registry (its name must be new); returns it."""
    if metric.name in PAIR_METRIC_REGISTRY and PAIR_METRIC_REGISTRY[metric.name] is not metric:
        raise ValueError(f"a pair metric named {metric.name!r} is already registered")
    PAIR_METRIC_REGISTRY[metric.name] = metric
    return metric


def _correct(r: Responses, c: MetricContext) -> np.ndarray:
    return r.predictions == c.labels


register_pair_metric(PairMetric(
    "observed_consistency", lambda a, b, c: M.observed_consistency(_correct(a, c), _correct(b, c)), "1"))
register_pair_metric(PairMetric(
    "error_consistency", lambda a, b, c: M.error_consistency(_correct(a, c), _correct(b, c), on_undefined=c.on_undefined),
    "1; NaN where the system is right on every image or wrong on every image", (-1.0, 1.0)))
register_pair_metric(PairMetric(
    "misclassification_agreement",
    lambda a, b, c: M.misclassification_agreement(c.labels, a.predictions, b.predictions, on_undefined=c.on_undefined),
    "1; NaN without errors or when all errors carry one wrong label", (-1.0, 1.0)))
register_pair_metric(PairMetric(
    "cles", lambda a, b, c: M.class_level_error_similarity(c.labels, a.predictions, b.predictions, c.num_classes, variant=c.cles_variant),
    "below 1 with the paper variant (pooled smoothing); 1 with jsd; NaN without errors"))
register_pair_metric(PairMetric(
    "soc", lambda a, b, c: M.softmax_output_similarity(a.probabilities, b.probabilities), "1", ranked=False))
register_pair_metric(PairMetric(
    "soce", lambda a, b, c: M.softmax_output_similarity(a.probabilities, b.probabilities, M.joint_error_mask(c.labels, a.predictions, b.predictions)),
    "1; NaN without errors"))
register_pair_metric(PairMetric(
    "cka", lambda a, b, c: M.linear_cka(a.features, b.features) if a.features is not None and b.features is not None else math.nan,
    "1 for models; NaN for subjects (no feature space)", ranked=False))


def pair_metric_names() -> tuple[str, ...]:
    return tuple(PAIR_METRIC_REGISTRY)


# model-vs-human's benchmark ranking: accuracy difference (lower is better), observed and error consistency.
MVH_RANKING = (("accuracy_difference", False), ("observed_consistency", True), ("error_consistency", True))
# Model-vs-observer values computed in model-vs-human's nesting of trials (the others: panel means of the matrices).
NESTED_METRICS = ("accuracy_difference", "observed_consistency", "error_consistency")


def pairwise_matrices(responses: Mapping[str, Responses], labels: np.ndarray, num_classes: int, *, cles_variant: str = "paper",
                      on_undefined: str = "nan", metrics: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """{metric: (S, S) symmetric matrix} over the systems of one condition (rows in ``responses`` order)."""
    context = MetricContext(labels, num_classes, cles_variant, on_undefined)
    systems = list(responses.values())
    names = list(metrics) if metrics is not None else list(PAIR_METRIC_REGISTRY)
    unknown = [n for n in names if n not in PAIR_METRIC_REGISTRY]
    if unknown:
        raise ValueError(f"unknown pair metric(s) {unknown}: use any of {list(PAIR_METRIC_REGISTRY)}")
    return {name: M.pairwise_matrix(lambda a, b, f=PAIR_METRIC_REGISTRY[name].fn: f(a, b, context), systems) for name in names}


def nanmean_matrices(matrices: Sequence[np.ndarray]) -> np.ndarray:
    """Entry-wise mean over conditions, skipping NaN (NaN where every condition is NaN)."""
    if not len(matrices):
        raise ValueError("no per-condition matrices to average: the run has no conditions")
    stack = np.stack(matrices)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN entries: NaN is the documented answer
        return np.nanmean(stack, axis=0)


def metric_correlations(matrices: Mapping[str, np.ndarray]) -> dict:
    """Spearman's rho between every two metrics over the distinct system pairs (NaN pairs omitted)."""
    names = list(matrices)
    if not names:
        raise ValueError("no metric matrices to correlate: pass at least one {name: (systems, systems) matrix}")
    size = next(iter(matrices.values())).shape[0]
    rho = np.full((len(names), len(names)), np.nan)
    pairs = np.zeros((len(names), len(names)), dtype=int)
    upper = np.triu_indices(size, k=1)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            both = ~np.isnan(matrices[a][upper]) & ~np.isnan(matrices[b][upper])
            pairs[i, j] = int(both.sum())
            if size >= 3 and pairs[i, j] >= 3:
                rho[i, j] = M.spearman_between(matrices[a], matrices[b], nan_policy="omit")
    return {"metrics": names, "rho": rho, "pairs": pairs}


def rankings(trials: pd.DataFrame, aggregated: Mapping[str, np.ndarray], systems: Sequence[str], models: Sequence[str],
             subjects: Sequence[str], on_undefined: str, images: str = "same", exclude: Mapping | None = None,
             panel_values: Mapping[str, Mapping[str, float]] | None = None) -> dict:
    """Model-vs-observer values (model-vs-human nesting for its three metrics, the panel mean of the aggregated
    matrices for the other registered metrics) and mean ranks (model-vs-human's three metrics; every ranked metric).
    ``images``: how :func:`perceptual.metrics.aggregate_trials` matches two observers' trials (``same`` or ``shared``);
    ``exclude``: conditions left out of the three nested metrics (its argument of that name); ``panel_values`` (model ->
    metric -> value): the other metrics' values where the caller nests them itself (real subjects per experiment)."""
    if not models or not subjects:
        raise ValueError(f"ranking models against observers needs at least one of each: got {len(models)} model(s) and {len(subjects)} subject(s)")
    values: dict[str, dict[str, float]] = {m: {} for m in models}
    observers_among_themselves = {}
    for metric in NESTED_METRICS:
        result = M.aggregate_trials(trials, metric, humans=list(subjects), on_undefined=on_undefined, images=images, exclude=exclude)
        for m in models:
            values[m][metric] = result.models.get(m, math.nan)  # absent: no trials left after the exclusions
        observers_among_themselves[metric] = result.humans
    rows = [systems.index(m) for m in models]
    columns = [systems.index(s) for s in subjects]
    panel_metrics = [n for n in aggregated if n not in NESTED_METRICS and n != "cka"]  # CKA: subjects have no features
    for metric in panel_metrics:
        block = aggregated[metric][np.ix_(rows, columns)]
        for m, row in zip(models, block):
            values[m][metric] = panel_values[m][metric] if panel_values is not None else nanmean(row)
    out = {"values": values, "observers_among_themselves": observers_among_themselves}
    table = np.array([[values[m][name] for name, _ in MVH_RANKING] for m in models], dtype=float)
    out["mean_rank_mvh"] = dict(zip(models, _mean_rank(table, [hib for _, hib in MVH_RANKING])))
    extra = [n for n in panel_metrics if PAIR_METRIC_REGISTRY[n].ranked]
    all_metrics = [name for name, _ in MVH_RANKING] + extra
    directions = [hib for _, hib in MVH_RANKING] + [PAIR_METRIC_REGISTRY[n].higher_is_better for n in extra]
    table = np.array([[values[m][name] for name in all_metrics] for m in models], dtype=float)
    out["mean_rank_all"] = dict(zip(models, _mean_rank(table, directions)))
    out["ranked_metrics"] = {"mvh": [n for n, _ in MVH_RANKING], "all": all_metrics}
    return out


def _mean_rank(table: np.ndarray, higher_is_better: Sequence[bool]) -> list[float]:
    """Mean rank per model: each metric column ranks the models whose value is defined (pandas ``rank``, as model-vs-human;
    NaN stays unranked), and each model's mean is over its defined ranks (NaN when it has none). So one model's undefined
    metric changes no other model's rank in that metric, and is not dropped for everyone.

    Deliberately differs from model-vs-human, whose mean rank is the sum of the three ranks over 3
    (``plotting/plot.py``, ``print_benchmark_table_humanlike_to_latex``): there a model with an undefined metric has
    no mean rank. Its own data never has one (an undefined error consistency is set to 1 there); here
    ``on_undefined="nan"`` can leave one, and such a model is ranked on the metrics it has."""
    ranks = np.full(table.shape, math.nan)
    for column, higher in enumerate(higher_is_better):
        defined = ~np.isnan(table[:, column])
        if defined.any():
            ranks[defined, column] = M.mean_rank(table[defined, column:column + 1], [bool(higher)])
    return [nanmean(row) for row in ranks]


__all__ = [
    "MVH_RANKING", "MetricContext", "NESTED_METRICS", "PAIR_METRIC_REGISTRY", "PairMetric", "Responses", "metric_correlations",
    "nanmean_matrices", "pair_metric_names", "pairwise_matrices", "rankings", "register_pair_metric",
]
