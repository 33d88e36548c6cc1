"""Error consistency, misclassification agreement, class-level error similarity, softmax similarity."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy
from sklearn.metrics import cohen_kappa_score

from perceptual.metrics import (
    accuracy_difference,
    class_level_error_divergence,
    class_level_error_similarity,
    error_consistency,
    expected_consistency,
    jensen_shannon_divergence,
    joint_error_mask,
    misclassification_agreement,
    observed_consistency,
    softmax_output_similarity,
)

A = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 1], dtype=bool)
B = np.array([1, 1, 0, 0, 1, 0, 1, 1, 1, 0], dtype=bool)


# ---------- error consistency (Geirhos et al. 2020) ----------

def test_error_consistency_hand_computed():
    # p_a = p_b = 0.6 -> c_exp = 0.36 + 0.16 = 0.52; 6 of 10 trials agree -> c_obs = 0.6
    assert observed_consistency(A, B) == pytest.approx(0.6)
    assert expected_consistency(A, B) == pytest.approx(0.52)
    assert error_consistency(A, B) == pytest.approx((0.6 - 0.52) / 0.48)
    assert error_consistency(A, B) == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    "a, b, kappa",
    [
        ([1, 0, 1, 0], [1, 0, 1, 0], 1.0),  # identical, non-degenerate: perfect agreement
        ([1, 0], [0, 1], -1.0),  # c_exp = 0.5, c_obs = 0
        ([1, 1, 1], [0, 0, 0], 0.0),  # c_exp = 0 and c_obs = 0
        ([1], [0], 0.0),  # single trial, disagreeing
    ],
)
def test_error_consistency_extremes(a, b, kappa):
    assert error_consistency(a, b) == pytest.approx(kappa)


@pytest.mark.parametrize("a, b", [([1, 1, 1], [1, 1, 1]), ([0, 0], [0, 0]), ([1], [1])])
def test_error_consistency_undefined_when_expected_is_one(a, b):
    assert math.isnan(error_consistency(a, b))
    assert error_consistency(a, b, on_undefined="one") == 1.0


def test_error_consistency_agrees_with_sklearn_and_is_symmetric():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 40))
        a, b = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        value = error_consistency(a, b)
        if math.isnan(value):
            assert a.all() and b.all() or (~a).all() and (~b).all()
            continue
        assert value == pytest.approx(cohen_kappa_score(a, b))
        assert error_consistency(b, a) == pytest.approx(value)


def _model_vs_human_error_consistency(a, b):
    """ErrorConsistency.analysis/error_consistency from bethgelab/model-vs-human, restated."""
    p1, p2 = a.mean(), b.mean()
    expected = p1 * p2 + (1 - p1) * (1 - p2)
    observed = (a == b).sum() / len(a)
    return 1.0 if observed == 1.0 else (observed - expected) / (1.0 - expected)


def test_on_undefined_one_reproduces_model_vs_human():
    rng = np.random.default_rng(1)
    cases = [(np.ones(5, bool), np.ones(5, bool)), (np.zeros(3, bool), np.zeros(3, bool))]
    cases += [(rng.random(12) < 0.7, rng.random(12) < 0.7) for _ in range(30)]
    for a, b in cases:
        assert error_consistency(a, b, on_undefined="one") == pytest.approx(_model_vs_human_error_consistency(a, b))


def test_error_consistency_accepts_tensors_and_ints():
    assert error_consistency(torch.tensor(A), torch.tensor(B.astype(int))) == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    "a, b, match",
    [
        ([1, 0, 1], [1, 0], "equal lengths"),
        ([1, 2, 0], [1, 0, 1], "0/1"),
        ([], [], "empty"),
        ([[1, 0]], [[1, 0]], "1-D"),
    ],
)
def test_error_consistency_rejects_bad_input(a, b, match):
    with pytest.raises(ValueError, match=match):
        error_consistency(a, b)


def test_error_consistency_rejects_bad_option():
    with pytest.raises(ValueError, match="on_undefined"):
        error_consistency(A, B, on_undefined="zero")


def test_accuracy_difference():
    assert accuracy_difference(0.8, 0.5) == pytest.approx(0.09)
    assert accuracy_difference(0.5, 0.8) == pytest.approx(0.09)
    np.testing.assert_allclose(accuracy_difference(np.array([1.0, 0.2]), np.array([0.0, 0.2])), [1.0, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        accuracy_difference(1.2, 0.5)
    with pytest.raises(ValueError, match="same shape"):
        accuracy_difference(np.array([0.1, 0.2]), 0.3)


# ---------- misclassification agreement (Xu et al.) ----------

Y = np.array([0, 0, 0, 0, 0, 0, 1, 2])
PRED_A = np.array([1, 1, 2, 2, 0, 1, 1, 0])
PRED_B = np.array([1, 2, 2, 1, 1, 1, 0, 2])


def test_misclassification_agreement_hand_computed():
    # joint errors: items 0,1,2,3,5 -> pairs (1,1) (1,2) (2,2) (2,1) (1,1): c_obs = 3/5
    # margins a: {1: 3, 2: 2}, b: {1: 3, 2: 2} -> c_exp = (9 + 4) / 25 = 0.52
    np.testing.assert_array_equal(joint_error_mask(Y, PRED_A, PRED_B), [1, 1, 1, 1, 0, 1, 0, 0])
    assert misclassification_agreement(Y, PRED_A, PRED_B) == pytest.approx((0.6 - 0.52) / 0.48)


def _authors_ma(true_cls, pred_1, pred_2, k):
    """get_ma from xubinxia/error_align (error-agreement matrix, NaN -> 1 as in get_ma_for_all_pair)."""
    a_mat = np.zeros((k, k))
    for n, (i, j) in enumerate(zip(pred_1, pred_2)):
        if i != true_cls[n] and j != true_cls[n]:
            a_mat[i, j] += 1
    total = a_mat.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        pis, pjs = a_mat.sum(axis=1) / total, a_mat.sum(axis=0) / total
        cexp = np.sum(pis * pjs)
        ma = (np.trace(a_mat) / total - cexp) / (1 - cexp)
    return 1.0 if np.isnan(ma) else ma


def test_misclassification_agreement_matches_sklearn_and_authors_code():
    rng = np.random.default_rng(2)
    for _ in range(40):
        k, n = int(rng.integers(2, 6)), int(rng.integers(5, 40))
        y = rng.integers(0, k, n)
        a = np.where(rng.random(n) < 0.5, y, rng.integers(0, k, n))
        b = np.where(rng.random(n) < 0.5, y, rng.integers(0, k, n))
        value = misclassification_agreement(y, a, b, on_undefined="one")
        assert value == pytest.approx(_authors_ma(y, a, b, k))
        assert misclassification_agreement(y, b, a, on_undefined="one") == pytest.approx(value)
        mask = joint_error_mask(y, a, b)
        if not math.isnan(misclassification_agreement(y, a, b)):
            assert value == pytest.approx(cohen_kappa_score(a[mask], b[mask]))


def test_misclassification_agreement_undefined_cases():
    y = np.array([0, 1, 2])
    assert math.isnan(misclassification_agreement(y, y, y))  # no errors at all
    assert misclassification_agreement(y, y, y, on_undefined="one") == 1.0
    # both always give the same single wrong label: c_exp = 1
    assert math.isnan(misclassification_agreement([0, 0], [1, 1], [1, 1]))
    # joint errors with different but constant labels: c_exp = 0, c_obs = 0 -> kappa 0
    assert misclassification_agreement([0, 0], [1, 1], [2, 2]) == 0.0


def test_misclassification_agreement_rejects_bad_labels():
    with pytest.raises(ValueError, match="equal lengths"):
        misclassification_agreement([0, 1], [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="class indices"):
        misclassification_agreement([0, -1], [0, 1], [0, 1])
    with pytest.raises(ValueError, match="non-integer"):
        misclassification_agreement([0, 1.5], [0, 1], [0, 1])
    with pytest.raises(TypeError, match="integer class indices"):
        misclassification_agreement([True, False], [0, 1], [0, 1])


# ---------- class-level error similarity (Xu et al.) ----------

# class 0: A errs 0->1 twice, B errs 0->2 twice; class 1: only B errs (1->0); class 2: no errors
Y_C = np.array([0, 0, 0, 0, 1, 2])
A_C = np.array([1, 1, 0, 0, 1, 2])
B_C = np.array([0, 0, 2, 2, 0, 2])


def test_cled_paper_variant_hand_computed():
    # row 0: p_a = (5/6, 1/6), p_b = (1/6, 5/6), pooled p_0 = (2.5, 2.5) / 5 = (1/2, 1/2)
    row0 = 5 / 6 * math.log(5 / 3) + 1 / 6 * math.log(1 / 3)
    # row 1: p_a = (1/2, 1/2) (no errors, smoothing only), p_b = p_0 = (3/4, 1/4)
    row1 = 0.5 * (0.5 * math.log(2 / 3) + 0.5 * math.log(2))
    expected = 0.8 * row0 + 0.2 * row1  # weights: 4 and 1 of 5 errors
    assert class_level_error_divergence(Y_C, A_C, B_C, num_classes=3) == pytest.approx(expected)
    assert class_level_error_similarity(Y_C, A_C, B_C, num_classes=3) == pytest.approx(1 / (1 + expected))


def test_cled_jsd_variant_hand_computed():
    row0 = 5 / 6 * math.log(5 / 3) + 1 / 6 * math.log(1 / 3)  # mixture is (1/2, 1/2) here too
    row1 = jensenshannon([0.5, 0.5], [0.75, 0.25]) ** 2
    expected = 0.8 * row0 + 0.2 * row1
    assert class_level_error_divergence(Y_C, A_C, B_C, 3, variant="jsd") == pytest.approx(expected)


def _authors_cled(y, a, b, k, alpha=0.5):
    """get_row_wise_div (unweighted) from xubinxia/error_align, with scipy's KL instead of torchmetrics'."""
    def errors(pred):
        c = np.zeros((k, k))
        np.add.at(c, (y, pred), 1)
        return c - np.diag(np.diag(c))

    n_0, divs = [], []
    for i, (ra, rb) in enumerate(zip(errors(a), errors(b))):
        ai, bi = np.delete(ra, i), np.delete(rb, i)
        pa = (ai + alpha) / (ai.sum() + (k - 1) * alpha)
        pb = (bi + alpha) / (bi.sum() + (k - 1) * alpha)
        p0 = (ai + bi + alpha) / (ai.sum() + bi.sum() + (k - 1) * alpha)
        n = ai.sum() + bi.sum()
        divs.append(0 if n == 0 else 0.5 * entropy(pa, p0) + 0.5 * entropy(pb, p0))
        n_0.append(n)
    n_0 = np.array(n_0)
    return float(np.sum(n_0 / n_0.sum() * np.array(divs)))


def test_cled_matches_authors_code_and_is_symmetric():
    rng = np.random.default_rng(3)
    for _ in range(30):
        k, n = int(rng.integers(2, 7)), int(rng.integers(10, 60))
        y = rng.integers(0, k, n)
        a = np.where(rng.random(n) < 0.6, y, rng.integers(0, k, n))
        b = np.where(rng.random(n) < 0.6, y, rng.integers(0, k, n))
        if np.all(a == y) and np.all(b == y):
            continue
        alpha = float(rng.choice([0.1, 0.5, 1.0]))
        value = class_level_error_divergence(y, a, b, k, alpha=alpha)
        assert value == pytest.approx(_authors_cled(y, a, b, k, alpha))
        assert class_level_error_divergence(y, b, a, k, alpha=alpha) == pytest.approx(value)
        jsd = class_level_error_divergence(y, a, b, k, alpha=alpha, variant="jsd")
        assert class_level_error_divergence(y, b, a, k, alpha=alpha, variant="jsd") == pytest.approx(jsd)
        assert 0.0 <= jsd <= math.log(2) + 1e-12


def test_cled_degenerate_cases():
    y = np.array([0, 1, 2, 1])
    assert math.isnan(class_level_error_divergence(y, y, y, 3))  # neither system errs
    assert math.isnan(class_level_error_similarity(y, y, y, 3))
    a = np.array([1, 1, 2, 1])
    # identical errors: the textbook JSD is 0, the paper's pooled p_0 is not p_a, so its CLES stays below 1
    assert class_level_error_similarity(y, a, a, 3, variant="jsd") == pytest.approx(1.0)
    assert class_level_error_similarity(y, a, a, 3, variant="paper") < 1.0
    # two classes: each row has a single off-diagonal entry, so every distribution is (1,) and CLED = 0
    assert class_level_error_divergence([0, 1, 0], [1, 0, 0], [1, 1, 0], 2) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_classes=1), ValueError, "num_classes"),
        (dict(num_classes=2), ValueError, r"\[0, 2\)"),
        (dict(num_classes=3, alpha=0.0), ValueError, "alpha"),
        (dict(num_classes=3, variant="kl"), ValueError, "variant"),
        (dict(num_classes=3.0), TypeError, "num_classes"),
    ],
)
def test_cled_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        class_level_error_divergence(Y_C, A_C, B_C, **kwargs)


# ---------- softmax output similarity / SOCE ----------

def test_jensen_shannon_divergence_hand_and_scipy():
    assert jensen_shannon_divergence([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2))
    assert jensen_shannon_divergence([0.3, 0.7], [0.3, 0.7]) == 0.0
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.ones(5), 8), rng.dirichlet(np.ones(5), 8)
    np.testing.assert_allclose(jensen_shannon_divergence(p, q), jensenshannon(p, q, axis=1) ** 2, rtol=1e-10)


def test_softmax_output_similarity_hand_computed():
    p = np.array([[1.0, 0.0], [0.5, 0.5]])
    q = np.array([[0.0, 1.0], [0.5, 0.5]])
    assert softmax_output_similarity(p, q) == pytest.approx(1 / (1 + math.log(2) / 2))
    assert softmax_output_similarity(p, q, mask=[True, False]) == pytest.approx(1 / (1 + math.log(2)))
    assert softmax_output_similarity(p, q, mask=[False, True]) == pytest.approx(1.0)
    assert math.isnan(softmax_output_similarity(p, q, mask=[False, False]))
    assert softmax_output_similarity(q, p) == softmax_output_similarity(p, q)


def test_soce_uses_the_joint_error_mask():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(3), 6), rng.dirichlet(np.ones(3), 6)
    y = np.zeros(6, dtype=int)
    mask = joint_error_mask(y, p.argmax(1), q.argmax(1))
    expected = 1 / (1 + np.mean(jensenshannon(p[mask], q[mask], axis=1) ** 2)) if mask.any() else float("nan")
    np.testing.assert_allclose(softmax_output_similarity(p, q, mask=mask), expected)


def test_softmax_output_similarity_rejects_bad_input():
    with pytest.raises(ValueError, match="sum to 1"):
        softmax_output_similarity([[0.5, 0.6]], [[0.5, 0.5]])
    with pytest.raises(ValueError, match="negative"):
        softmax_output_similarity([[1.5, -0.5]], [[0.5, 0.5]])
    with pytest.raises(ValueError, match="same shape"):
        softmax_output_similarity([[0.5, 0.5]], [[0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="equal lengths"):
        softmax_output_similarity([[0.5, 0.5]], [[0.5, 0.5]], mask=[True, False])
    with pytest.raises(ValueError, match="NaN"):
        softmax_output_similarity([[np.nan, 0.5]], [[0.5, 0.5]])
