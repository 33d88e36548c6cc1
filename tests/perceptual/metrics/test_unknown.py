"""AURC/E-AURC (ties), unified unknown-detection AURC, AUROC, FPR@TPR, AUPR, ECE, NLL, Brier."""
from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, brier_score_loss, log_loss, roc_auc_score, roc_curve

from perceptual.metrics import (
    aupr_in,
    aupr_out,
    aurc,
    auroc,
    brier_score,
    eaurc,
    expected_calibration_error,
    fpr_at_tpr,
    negative_log_likelihood,
    optimal_aurc,
    risk_coverage_curve,
    unknown_detection_aurc,
)

# ---------- AURC / E-AURC ----------


def test_aurc_hand_computed():
    # risks at coverage 1/4..4/4: 0, 1/2, 1/3, 1/2
    coverage, risk = risk_coverage_curve([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0])
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 1 / 2, 1 / 3, 1 / 2])
    assert aurc([0.6, 0.9, 0.7, 0.8], [0, 1, 1, 0]) == pytest.approx(1 / 3)  # input order is irrelevant


def test_aurc_ties_expected_versus_stable():
    # one tie of a right and a wrong item: stable order gives 1/4 or 3/4, the expectation over orders 1/2
    assert aurc([0.5, 0.5], [1, 0], ties="stable") == pytest.approx(0.25)
    assert aurc([0.5, 0.5], [0, 1], ties="stable") == pytest.approx(0.75)
    assert aurc([0.5, 0.5], [1, 0]) == pytest.approx(0.5) == aurc([0.5, 0.5], [0, 1])


def test_aurc_expected_ties_is_the_mean_over_all_tie_orders():
    conf = np.array([0.9, 0.5, 0.5, 0.5, 0.2, 0.2, 0.1])
    correct = np.array([1, 0, 1, 1, 0, 1, 0], dtype=bool)
    values = []
    for perm in set(permutations(range(7))):
        if np.all(np.diff(conf[list(perm)]) <= 0):  # orders that only shuffle within tie groups
            values.append(aurc(conf[list(perm)], correct[list(perm)], ties="stable"))
    assert len(values) == 3 * 2 * 1 * 2  # 3! * 2!
    assert aurc(conf, correct) == pytest.approx(np.mean(values))


def _reference_aurc_eaurc(scores, correct):
    """aurc_eaurc from daintlab/unknown-detection-benchmarks (metrics_md.py), restated."""
    ranked = sorted(zip(scores, correct), key=lambda x: x[0], reverse=True)
    risk, risks = 0, []
    for i, (_, ok) in enumerate(ranked):
        risk += ok == 0
        risks.append(risk / (i + 1))
    r = risks[-1]
    area = sum(v / len(risks) for v in risks)
    return area, area - (r + (1 - r) * np.log(1 - r))


def test_stable_ties_reproduce_reference_code():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(3, 40))
        conf = rng.integers(0, 5, n) / 4  # many ties
        correct = (rng.random(n) < 0.7).astype(int)
        if correct.all() or not correct.any():
            continue
        ref_aurc, ref_eaurc = _reference_aurc_eaurc(conf.tolist(), correct.tolist())
        assert aurc(conf, correct, ties="stable") == pytest.approx(ref_aurc)
        assert eaurc(conf, correct, ties="stable") == pytest.approx(ref_eaurc)


def test_aurc_and_eaurc_degenerate_cases():
    assert aurc([0.3, 0.2, 0.9], [1, 1, 1]) == 0.0  # no errors
    assert eaurc([0.3, 0.2, 0.9], [1, 1, 1]) == 0.0
    assert aurc([0.3, 0.2, 0.9], [0, 0, 0]) == 1.0  # all wrong: optimum is 1 too
    assert eaurc([0.3, 0.2, 0.9], [0, 0, 0]) == pytest.approx(0.0)
    assert optimal_aurc(1.0) == 1.0 and optimal_aurc(0.0) == 0.0
    assert aurc([0.7], [0]) == 1.0  # a single item


def test_eaurc_never_negative_for_a_perfect_ranking():
    # perfect ranking: the exact discrete optimum, which exceeds the continuous r + (1-r) ln(1-r)
    for n_errors in range(1, 10):
        correct = np.r_[np.ones(10 - n_errors), np.zeros(n_errors)]
        conf = np.linspace(1, 0, 10)
        r = n_errors / 10
        optimum = r + (1 - r) * math.log1p(-r) if r < 1 else 1.0
        assert eaurc(conf, correct) == pytest.approx(aurc(conf, correct) - optimum)
        assert eaurc(conf, correct) >= 0


def test_aurc_rejects_bad_input():
    with pytest.raises(ValueError, match="equal lengths"):
        aurc([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="NaN"):
        aurc([0.1, np.nan], [1, 0])
    with pytest.raises(ValueError, match="ties"):
        aurc([0.1, 0.2], [1, 0], ties="random")
    with pytest.raises(ValueError, match="0/1"):
        aurc([0.1, 0.2], [0.5, 1])


# ---------- unified unknown-detection AURC (Kim et al.) ----------

def test_unknown_detection_aurc_hand_computed():
    # pooled ranking: 0.9 right, 0.8 OOD, 0.4 wrong, 0.1 OOD -> risks 0, 1/2, 2/3, 3/4
    expected = (0 + 1 / 2 + 2 / 3 + 3 / 4) / 4
    assert unknown_detection_aurc([0.9, 0.4], [1, 0], [[0.8], [0.1]]) == pytest.approx(expected)
    by_name = {"svhn": [0.8], "lsun": np.array([0.1])}
    assert unknown_detection_aurc([0.9, 0.4], [1, 0], by_name) == pytest.approx(expected)
    assert unknown_detection_aurc([0.9, 0.4], [1, 0], np.array([0.8, 0.1])) == pytest.approx(expected)
    assert unknown_detection_aurc([0.9, 0.4], [1, 0], [0.8, 0.1]) == pytest.approx(expected)


def test_unknown_detection_aurc_rejects_empty_sets():
    with pytest.raises(ValueError, match="empty"):
        unknown_detection_aurc([0.9], [1], [])
    with pytest.raises(ValueError, match="empty"):
        unknown_detection_aurc([0.9], [1], {"a": []})


# ---------- OOD detection: AUROC, FPR@TPR, AUPR ----------

def test_auroc_hand_computed_with_a_tie():
    # pairs (id, ood): 3>2, 3>0, 2=2 (tie), 2>0, 1<2, 1>0 -> strict 4/6, half 4.5/6
    assert auroc([3, 2, 1], [2, 0], ties="strict") == pytest.approx(4 / 6)
    assert auroc([3, 2, 1], [2, 0]) == pytest.approx(4.5 / 6)
    assert auroc([1, 2], [3, 4]) == 0.0 and auroc([3, 4], [1, 2]) == 1.0


def _reference_auroc(known, novel):
    """get_curve + trapezoid from daintlab/unknown-detection-benchmarks (metrics_ood.py), restated."""
    known, novel = np.sort(known), np.sort(novel)
    nk, nn = len(known), len(novel)
    tp, fp = [nk], [nn]
    k = n = 0
    while k < nk or n < nn:
        if k < nk and (n == nn or not novel[n] < known[k]):
            k += 1
            tp.append(tp[-1] - 1)
            fp.append(fp[-1])
        else:
            n += 1
            tp.append(tp[-1])
            fp.append(fp[-1] - 1)
    tpr = np.concatenate([[1.0], np.array(tp) / nk, [0.0]])
    fpr = np.concatenate([[1.0], np.array(fp) / nn, [0.0]])
    return -np.trapezoid(1.0 - fpr, tpr)


def test_auroc_half_matches_sklearn_and_strict_matches_reference():
    rng = np.random.default_rng(1)
    for _ in range(20):
        id_s, ood_s = rng.integers(0, 6, 15).astype(float), rng.integers(0, 5, 9).astype(float)
        labels = np.r_[np.ones(15), np.zeros(9)]
        assert auroc(id_s, ood_s) == pytest.approx(roc_auc_score(labels, np.r_[id_s, ood_s]))
        assert auroc(id_s, ood_s, ties="strict") == pytest.approx(_reference_auroc(id_s, ood_s))
    id_s, ood_s = rng.normal(1, 1, 30), rng.normal(0, 1, 20)  # no ties: both conventions agree
    assert auroc(id_s, ood_s, ties="strict") == pytest.approx(auroc(id_s, ood_s))


def test_fpr_at_tpr_hand_computed():
    id_s = np.arange(1.0, 11.0)  # 1..10
    ood_s = [9.5, 5.0, 0.5]
    assert fpr_at_tpr(id_s, ood_s) == pytest.approx(2 / 3)  # k = 10 -> threshold 1
    assert fpr_at_tpr(id_s, ood_s, tpr=0.9) == pytest.approx(2 / 3)  # k = 9 -> threshold 2
    assert fpr_at_tpr(id_s, ood_s, tpr=0.5) == pytest.approx(1 / 3)  # k = 5 -> threshold 6
    assert fpr_at_tpr(id_s, ood_s, tpr=0.05) == pytest.approx(0.0)  # k = 1 -> threshold 10
    assert fpr_at_tpr(id_s, ood_s, tpr=1e-12) == pytest.approx(0.0)  # k = 0 wrapped round to the lowest threshold (2/3)


def test_fpr_at_tpr_exact_fraction_is_not_rounded_up():
    # 0.95 * 20 = 19.000000000000004 in floating point; k must be 19, threshold 2, so OOD 1.5 is rejected
    assert fpr_at_tpr(np.arange(1.0, 21.0), [1.5]) == 0.0


def test_fpr_at_tpr_matches_sklearn_roc_curve():
    rng = np.random.default_rng(2)
    for _ in range(20):
        id_s, ood_s = rng.integers(0, 8, 23).astype(float), rng.integers(0, 6, 17).astype(float)
        fpr, tpr, _ = roc_curve(np.r_[np.ones(23), np.zeros(17)], np.r_[id_s, ood_s], drop_intermediate=False)
        for target in (0.5, 0.8, 0.95):
            assert fpr_at_tpr(id_s, ood_s, target) == pytest.approx(fpr[np.argmax(tpr >= target - 1e-12)])


def test_aupr_hand_computed_and_sklearn():
    id_s, ood_s = [0.9, 0.8, 0.2], [0.85, 0.1]
    # ID positive, ranked 0.9 (P 1, R 1/3), 0.8 (P 2/3, R 2/3), 0.2 (P 3/4, R 1)
    assert aupr_in(id_s, ood_s) == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    # OOD positive, ranked by -score: 0.1 (P 1, R 1/2), then 0.85 at position 4 (P 2/4, R 1)
    assert aupr_out(id_s, ood_s) == pytest.approx(0.5 * 1 + 0.5 * 0.5)
    labels = np.r_[np.zeros(3), np.ones(2)]
    assert aupr_out(id_s, ood_s) == pytest.approx(average_precision_score(labels, -np.r_[id_s, ood_s]))


def test_ood_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="tpr"):
        fpr_at_tpr([1, 2], [0], tpr=0.0)
    with pytest.raises(ValueError, match="tpr"):
        fpr_at_tpr([1, 2], [0], tpr=1.5)
    with pytest.raises(ValueError, match="empty"):
        auroc([], [1.0])
    with pytest.raises(ValueError, match="1-D"):
        aupr_in([[1.0, 2.0]], [0.0])
    with pytest.raises(ValueError, match="ties"):
        auroc([1.0], [0.0], ties="average")


# ---------- calibration ----------

def test_ece_hand_computed():
    probs = [[0.4, 0.3, 0.3], [0.9, 0.05, 0.05], [0.2, 0.7, 0.1]]
    labels = [0, 1, 1]
    # bin (0, .5]: item 0 (acc 1, conf .4); bin (.5, 1]: items 1, 2 (acc .5, conf .8)
    assert expected_calibration_error(probs, labels, n_bins=2) == pytest.approx(1 / 3 * 0.6 + 2 / 3 * 0.3)


def test_ece_bin_edges_are_right_closed():
    # confidence exactly 0.5 goes to bin (0, 0.5]: gaps 0.5 and 0.9, each weighted 1/2
    assert expected_calibration_error([[0.5, 0.5], [0.9, 0.1]], [0, 1], n_bins=2) == pytest.approx(0.7)


def _guo_ece(probs, labels, n_bins):
    """_ECELoss from Guo et al.'s temperature_scaling code, restated in numpy."""
    conf, pred = probs.max(1), probs.argmax(1)
    acc = pred == labels
    edges = np.linspace(0, 1, n_bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            ece += abs(conf[in_bin].mean() - acc[in_bin].mean()) * in_bin.mean()
    return ece


def test_ece_matches_guo_reference():
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.full(4, 0.5), 200)
    labels = rng.integers(0, 4, 200)
    for n_bins in (1, 10, 15):
        assert expected_calibration_error(probs, labels, n_bins) == pytest.approx(_guo_ece(probs, labels, n_bins))


def test_nll_hand_computed_and_sklearn():
    probs = np.array([[0.5, 0.5], [0.25, 0.75]])
    assert negative_log_likelihood(probs, [0, 1]) == pytest.approx(-(math.log(0.5) + math.log(0.75)) / 2)
    rng = np.random.default_rng(4)
    p, y = rng.dirichlet(np.ones(5), 50), rng.integers(0, 5, 50)
    assert negative_log_likelihood(p, y) == pytest.approx(log_loss(y, p, labels=range(5)))
    assert negative_log_likelihood([[1.0, 0.0]], [1]) == pytest.approx(-math.log(np.finfo(float).eps))


def test_brier_hand_computed_and_sklearn():
    assert brier_score([[1.0, 0.0], [0.5, 0.5]], [0, 0]) == pytest.approx(0.25)
    assert brier_score([[0.0, 1.0]], [0]) == pytest.approx(2.0)  # worst case
    rng = np.random.default_rng(5)
    p1, y = rng.random(30), rng.integers(0, 2, 30)
    probs = np.c_[1 - p1, p1]
    assert brier_score(probs, y) == pytest.approx(2 * brier_score_loss(y, p1))


@pytest.mark.parametrize("fn", [expected_calibration_error, negative_log_likelihood, brier_score])
def test_calibration_metrics_reject_bad_input(fn):
    with pytest.raises(ValueError, match="sum to 1"):
        fn([[0.6, 0.6]], [0])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        fn([[0.5, 0.5]], [2])
    with pytest.raises(ValueError, match="equal lengths"):
        fn([[0.5, 0.5]], [0, 1])
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        fn([0.5, 0.5], [0])


def test_ece_rejects_bad_bins():
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error([[0.5, 0.5]], [0], n_bins=0)
    with pytest.raises(TypeError, match="n_bins"):
        expected_calibration_error([[0.5, 0.5]], [0], n_bins=2.5)
