"""Unknown detection: misclassification and out-of-distribution detection, selective risk, calibration.

Follows Kim et al., "A Unified Benchmark for the Unknown Detection Capability of Deep Neural Networks"
(Expert Systems with Applications 2023; code: daintlab/unknown-detection-benchmarks, ``metrics_md.py`` and
``metrics_ood.py``), Geifman, Uziel & El-Yaniv, "Bias-Reduced Uncertainty Estimation for Deep Neural
Classifiers" (ICLR 2019) for AURC/E-AURC, Hendrycks & Gimpel (ICLR 2017) for AUROC/AUPR/FPR@TPR, and Guo et al.,
"On Calibration of Modern Neural Networks" (ICML 2017) for ECE. Scores are "higher = more confident / more
in-distribution" throughout; negate a score whose direction is the other way.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._validation import (
    as_binary,
    as_distributions,
    as_labels,
    as_vector,
    check_choice,
    check_positive_int,
    check_same_length,
    check_scalar,
)


def _confidence_and_correct(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    conf = as_vector(confidence, "confidence")
    ok = as_binary(correct, "correct")
    check_same_length(confidence=conf, correct=ok)
    return conf, ok


def risk_coverage_curve(confidence: Any, correct: Any, ties: str = "expected") -> tuple[np.ndarray, np.ndarray]:
    """Selective risk at each coverage j/N (j = 1..N), accepting the most confident items first.

    Returns ``(coverage, risk)``; risk[j−1] is the error rate among the j most confident items. ``ties``:
    ``"expected"`` averages the risk over all orders of tied confidences (exact: within a tie group of m items
    with e errors, the k-th accepted adds e/m expected errors), so the curve does not depend on input order;
    ``"stable"`` keeps tied items in input order, as the reference code's stable ``sorted(..., reverse=True)``.
    """
    check_choice(ties, "ties", ("expected", "stable"))
    conf, ok = _confidence_and_correct(confidence, correct)
    n = conf.size
    order = np.argsort(-conf, kind="stable")
    errors = (~ok[order]).astype(np.float64)
    cumulative = np.cumsum(errors)
    if ties == "expected":
        _, starts, sizes = np.unique(-conf[order], return_index=True, return_counts=True)
        group = np.repeat(np.arange(starts.size), sizes)
        before = np.concatenate([[0.0], cumulative])[starts]  # errors ranked above each tie group
        in_group = cumulative[starts + sizes - 1] - before
        position = np.arange(n) - starts[group] + 1
        cumulative = before[group] + position * in_group[group] / sizes[group]
    coverage = np.arange(1, n + 1) / n
    return coverage, cumulative / np.arange(1, n + 1)


def aurc(confidence: Any, correct: Any, ties: str = "expected") -> float:
    """Area under the risk–coverage curve: the mean selective risk over coverages j/N, j = 1..N (lower is better).

    Geifman et al. (ICLR 2019); Kim et al.'s ``aurc_eaurc`` in daintlab/unknown-detection-benchmarks
    (``metrics_md.py``), which reports it ×1000. ``confidence``: 1-D scores, higher = more confident;
    ``correct``: 1-D booleans. ``ties="expected"`` (default) averages over the orders of tied confidences and is
    order-independent; ``ties="stable"`` keeps input order within ties, reproducing the reference code.
    """
    return float(np.mean(risk_coverage_curve(confidence, correct, ties)[1]))


def optimal_aurc(error_rate: float) -> float:
    """The reference's optimum AURC for full-coverage error rate r: r + (1 − r)·ln(1 − r); 1 when r = 1.

    This is the continuous approximation used by Geifman et al. and the reference ``aurc_eaurc``; the exact
    optimum over N discrete coverages is slightly larger, so E-AURC is never negative.
    """
    from scipy.special import xlogy

    r = check_scalar(error_rate, "error_rate", low=0.0, high=1.0)
    return float(r + xlogy(1.0 - r, 1.0 - r))


def eaurc(confidence: Any, correct: Any, ties: str = "expected") -> float:
    """Excess AURC: AURC − (r + (1 − r)·ln(1 − r)), r the error rate at full coverage (lower is better).

    Geifman et al. (ICLR 2019); reference ``aurc_eaurc`` in daintlab/unknown-detection-benchmarks. At r = 1 the
    optimum is 1 (x·ln x → 0), where the reference code computes 0·log 0 = NaN. See :func:`aurc` for ``ties``.
    """
    _, ok = _confidence_and_correct(confidence, correct)
    return aurc(confidence, correct, ties) - optimal_aurc(1.0 - ok.mean())


def _ood_sets(ood_confidences: Any) -> list[np.ndarray]:
    if isinstance(ood_confidences, Mapping):
        named = list(ood_confidences.items())
    elif isinstance(ood_confidences, (list, tuple)) and ood_confidences and all(
        hasattr(s, "__len__") or hasattr(s, "detach") for s in ood_confidences
    ):
        named = [(f"ood_confidences[{i}]", s) for i, s in enumerate(ood_confidences)]
    else:  # one set given as a single array
        named = [("ood_confidences", ood_confidences)]
    if not named:
        raise ValueError("ood_confidences is empty: pass at least one out-of-distribution set")
    return [as_vector(values, str(name)) for name, values in named]


def unknown_detection_aurc(id_confidence: Any, id_correct: Any, ood_confidences: Any, ties: str = "expected") -> float:
    """AURC of the unified unknown-detection task: ID and OOD samples pooled, every OOD sample counted wrong.

    Kim et al., unified benchmark: a good detector ranks correctly classified in-distribution samples above
    both misclassified ID samples and all out-of-distribution samples. ``id_confidence``/``id_correct`` are the
    ID scores and correctness (right label); ``ood_confidences`` is one OOD score array, a list of them, or a
    mapping name → array (all sets are pooled). See :func:`aurc` for ``ties``.
    """
    conf, ok = _confidence_and_correct(id_confidence, id_correct)
    ood = np.concatenate(_ood_sets(ood_confidences))
    pooled_conf = np.concatenate([conf, ood])
    pooled_correct = np.concatenate([ok, np.zeros(ood.size, dtype=bool)])
    return aurc(pooled_conf, pooled_correct, ties)


def _id_ood(id_scores: Any, ood_scores: Any) -> tuple[np.ndarray, np.ndarray]:
    return as_vector(id_scores, "id_scores"), as_vector(ood_scores, "ood_scores")


def auroc(id_scores: Any, ood_scores: Any, ties: str = "half") -> float:
    """Area under the ROC curve for telling ID (positive) from OOD by score (higher = more in-distribution).

    Equals the probability that a random ID sample scores above a random OOD sample. ``ties="half"`` counts a
    tied pair as ½ (Mann–Whitney; computed by ``sklearn.metrics.roc_auc_score``); ``ties="strict"`` counts it
    as 0, which is what the reference ``get_curve`` + trapezoid in daintlab/unknown-detection-benchmarks
    (``metrics_ood.py``) computes, since it lowers the ID count first at equal scores.
    """
    check_choice(ties, "ties", ("half", "strict"))
    id_s, ood_s = _id_ood(id_scores, ood_scores)
    if ties == "half":
        from sklearn.metrics import roc_auc_score

        labels = np.concatenate([np.ones(id_s.size), np.zeros(ood_s.size)])
        return float(roc_auc_score(labels, np.concatenate([id_s, ood_s])))
    ood_below = np.searchsorted(np.sort(ood_s), id_s, side="left")  # OOD scores strictly below each ID score
    return float(ood_below.sum() / (id_s.size * ood_s.size))


def fpr_at_tpr(id_scores: Any, ood_scores: Any, tpr: float = 0.95) -> float:
    """False-positive rate (OOD accepted as ID) at the highest threshold whose TPR reaches ``tpr``.

    Samples with score >= threshold are called ID. The threshold is the k-th highest ID score with
    k = ⌈tpr·N_id⌉, the same point as the first ``sklearn.metrics.roc_curve`` point with TPR >= tpr.
    Deliberate difference: the reference ``get_curve`` (daintlab/unknown-detection-benchmarks, ``metrics_ood.py``)
    takes the curve point whose TPR is CLOSEST to 0.95, which may lie below it, and where TPR equals 0.95 exactly over a
    stretch of its sweep (from low scores up) it takes the stretch's first point: the lowest threshold with that TPR,
    just above the next lower ID score. It then also counts the OOD scores between that ID score and ours as
    accepted, so its FPR is at least ours whenever 0.95·N_id is a whole number, and well above it with few ID
    samples (20 ID scores, 3 of 6 OOD scores between the two lowest of them: 0.67 there, 0.17 here).
    """
    target = check_scalar(tpr, "tpr", low=0.0, high=1.0, low_open=True)
    id_s, ood_s = _id_ood(id_scores, ood_scores)
    k = max(int(np.ceil(round(target * id_s.size, 9))), 1)  # round() keeps 0.95·20 = 19.000000000000004 at 19; k >= 1: the top score
    threshold = np.sort(id_s)[::-1][k - 1]
    return float(np.mean(ood_s >= threshold))


def aupr_in(id_scores: Any, ood_scores: Any) -> float:
    """Area under the precision–recall curve with ID as the positive class (``average_precision_score``).

    Hendrycks & Gimpel (ICLR 2017) "AUPR-In"; computed by ``sklearn.metrics.average_precision_score`` (step-wise
    average precision, no trapezoidal interpolation).
    """
    from sklearn.metrics import average_precision_score

    id_s, ood_s = _id_ood(id_scores, ood_scores)
    labels = np.concatenate([np.ones(id_s.size), np.zeros(ood_s.size)])
    return float(average_precision_score(labels, np.concatenate([id_s, ood_s])))


def aupr_out(id_scores: Any, ood_scores: Any) -> float:
    """Area under the precision–recall curve with OOD as the positive class and the scores negated.

    Hendrycks & Gimpel (ICLR 2017) "AUPR-Out"; ``sklearn.metrics.average_precision_score``.
    """
    id_s, ood_s = _id_ood(id_scores, ood_scores)
    return aupr_in(-ood_s, -id_s)


def _probs_and_labels(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    p = as_distributions(probs, "probs", ndim=(2,))
    y = as_labels(labels, "labels", num_classes=p.shape[1])
    check_same_length(probs=p, labels=y)
    return p, y


def expected_calibration_error(probs: Any, labels: Any, n_bins: int = 15) -> float:
    """Expected calibration error: Σ_b |B_b|/N · |accuracy(B_b) − mean confidence(B_b)|.

    Guo et al. (ICML 2017): confidence = max class probability, prediction = its argmax (first index on ties),
    ``n_bins`` equal-width bins over [0, 1], bin b holding confidences in (b/n, (b+1)/n] (the convention of
    their ``_ECELoss``; the lowest bin also takes 0). ``probs`` is (N, K) with rows summing to 1.
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    p, y = _probs_and_labels(probs, labels)
    confidence = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    inner_edges = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    bins = np.searchsorted(inner_edges, confidence, side="left")
    gap = np.bincount(bins, weights=correct - confidence, minlength=n_bins)  # Σ (acc − conf) per bin
    return float(np.sum(np.abs(gap)) / confidence.size)


def negative_log_likelihood(probs: Any, labels: Any) -> float:
    """Mean negative log-probability of the true class, in nats.

    Probabilities are clipped below at float64 machine epsilon before the log, as
    ``sklearn.metrics.log_loss`` does, so a zero probability costs ~36 nats instead of infinity.
    """
    p, y = _probs_and_labels(probs, labels)
    true_class = p[np.arange(y.size), y]
    return float(-np.mean(np.log(np.clip(true_class, np.finfo(np.float64).eps, 1.0))))


def brier_score(probs: Any, labels: Any) -> float:
    """Multi-class Brier score: mean over items of Σ_k (p_k − 1[k = label])², in [0, 2] (Brier 1950).

    The original definition sums over classes; for two classes it is twice the binary
    ``sklearn.metrics.brier_score_loss`` (which scores the positive class only).
    """
    p, y = _probs_and_labels(probs, labels)
    one_hot = np.zeros_like(p)
    one_hot[np.arange(y.size), y] = 1.0
    return float(np.mean(np.sum((p - one_hot) ** 2, axis=1)))
