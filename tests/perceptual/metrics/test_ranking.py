"""pairwise_matrix, spearman_between (upper triangle) and mean_rank (ties averaged)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from perceptual.metrics import error_consistency, mean_rank, pairwise_matrix, spearman_between

SYSTEMS = [np.array([1, 1, 0, 0, 1, 0]), np.array([1, 0, 0, 0, 1, 1]), np.array([0, 1, 1, 0, 1, 0])]


def test_pairwise_matrix_entries_and_symmetry():
    matrix = pairwise_matrix(error_consistency, SYSTEMS)
    assert matrix.shape == (3, 3)
    for i in range(3):
        for j in range(3):
            assert matrix[i, j] == pytest.approx(error_consistency(SYSTEMS[i], SYSTEMS[j]))
    np.testing.assert_allclose(np.diag(matrix), 1.0)
    np.testing.assert_array_equal(matrix, matrix.T)


def test_pairwise_matrix_calls_and_directed_metrics():
    calls = []

    def difference(a, b):
        calls.append((a, b))
        return a - b

    assert pairwise_matrix(difference, [1.0, 2.0, 4.0]).tolist() == [[0, -1, -3], [-1, 0, -2], [-3, -2, 0]]
    assert len(calls) == 6  # i <= j only
    calls.clear()
    directed = pairwise_matrix(difference, {"a": 1.0, "b": 2.0, "c": 4.0}, symmetric=False)
    assert directed.tolist() == [[0, -1, -3], [1, 0, -2], [3, 2, 0]]
    assert len(calls) == 9


def test_pairwise_matrix_rejects_bad_input():
    with pytest.raises(TypeError, match="callable"):
        pairwise_matrix("error_consistency", SYSTEMS)
    with pytest.raises(ValueError, match="empty"):
        pairwise_matrix(error_consistency, [])
    with pytest.raises(TypeError, match="symmetric"):
        pairwise_matrix(error_consistency, SYSTEMS, symmetric="yes")


def test_spearman_between_uses_upper_triangle_only():
    a = np.array([[0, 1, 2], [9, 0, 3], [9, 9, 0]], dtype=float)  # upper: 1, 2, 3
    b = np.array([[0, 10, 30], [-5, 0, 20], [7, 1, 0]], dtype=float)  # upper: 10, 30, 20
    # ranks (1, 2, 3) vs (1, 3, 2): rho = 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman_between(a, b) == pytest.approx(0.5)
    b_lower_changed = b.copy()
    b_lower_changed[np.tril_indices(3, -1)] = [100.0, -100.0, 3.0]
    assert spearman_between(a, b_lower_changed) == pytest.approx(0.5)


def test_spearman_between_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 3, (6, 6)).astype(float), rng.normal(size=(6, 6))
    upper = np.triu_indices(6, 1)
    assert spearman_between(a, b) == pytest.approx(spearmanr(a[upper], b[upper]).statistic)


def test_spearman_between_nan_policies():
    a = np.array([[1, 1, 2, 3], [1, 1, np.nan, 4], [2, 0, 1, 5], [3, 4, 5, 1]], dtype=float)
    b = np.array([[1, 2, 1, 4], [2, 1, 3, 5], [1, 3, 1, 6], [4, 5, 6, 1]], dtype=float)
    assert math.isnan(spearman_between(a, b))
    keep = [0, 1, 2, 4, 5]  # upper-triangle pairs without the NaN at (1, 2)
    upper = np.triu_indices(4, 1)
    expected = spearmanr(a[upper][keep], b[upper][keep]).statistic
    assert spearman_between(a, b, nan_policy="omit") == pytest.approx(expected)
    with pytest.raises(ValueError, match="NaN"):
        spearman_between(a, b, nan_policy="raise")


def test_spearman_between_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 3"):
        spearman_between(np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="square"):
        spearman_between(np.ones((3, 4)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="same systems"):
        spearman_between(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="nan_policy"):
        spearman_between(np.eye(3), np.eye(3), nan_policy="drop")


def test_mean_rank_hand_computed_with_ties():
    table = [[0.1, 0.5], [0.2, 0.5], [0.05, 0.9]]
    # column 0, lower is better: ranks 2, 3, 1; column 1, higher is better: 2.5, 2.5, 1 (tie averaged)
    np.testing.assert_allclose(mean_rank(table, [False, True]), [2.25, 2.75, 1.0])
    # all higher-is-better: column 0 ranks 2, 1, 3 -> means (2 + 2.5)/2, (1 + 2.5)/2, (3 + 1)/2
    np.testing.assert_allclose(mean_rank(table, True), [2.25, 1.75, 2.0])


def test_mean_rank_matches_pandas_rank():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    table = rng.integers(0, 4, (7, 3)).astype(float)
    flags = [True, False, True]
    frame = pd.DataFrame(table)
    expected = np.mean([frame[c].rank(ascending=not flag).to_numpy() for c, flag in enumerate(flags)], axis=0)
    np.testing.assert_allclose(mean_rank(table, flags), expected)


def test_mean_rank_rejects_bad_input():
    with pytest.raises(ValueError, match="one flag per metric"):
        mean_rank(np.ones((3, 2)), [True])
    with pytest.raises(TypeError, match="bool"):
        mean_rank(np.ones((3, 2)), ["higher", "lower"])
    with pytest.raises(ValueError, match="NaN"):
        mean_rank([[1.0, np.nan], [2.0, 3.0]], True)
    with pytest.raises(ValueError, match="2-D"):
        mean_rank([1.0, 2.0], True)
