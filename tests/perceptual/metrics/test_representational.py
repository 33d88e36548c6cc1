"""Linear CKA: hand case, HSIC definition, invariances, degenerate inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from perceptual.metrics import linear_cka


def _hsic_cka(x, y):
    """Kornblith et al. (2019) definition with an explicit centring matrix H: HSIC(K, L) = tr(K H L H)."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T
    hsic = lambda a, b: np.trace(a @ h @ b @ h)  # noqa: E731
    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def test_linear_cka_hand_computed():
    # one feature each: CKA is the squared Pearson correlation; centred x = (-1, 0, 1), y = (0, -1, 1) -> r = 1/2
    assert linear_cka([[1.0], [2.0], [3.0]], [[1.0], [0.0], [2.0]]) == pytest.approx(0.25)


@pytest.mark.parametrize("n, d_a, d_b", [(50, 3, 4), (6, 40, 30)])  # feature-space and Gram-space branches
def test_linear_cka_matches_hsic_definition(n, d_a, d_b):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d_a))
    y = x[:, :1] @ rng.normal(size=(1, d_b)) + rng.normal(size=(n, d_b))
    assert linear_cka(x, y) == pytest.approx(_hsic_cka(x, y), rel=1e-10)


def test_linear_cka_invariances():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 5))
    y = np.tanh(x @ rng.normal(size=(5, 7))) + 0.3 * rng.normal(size=(30, 7))
    base = linear_cka(x, y)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=1e-10)  # orthogonal transform
    assert linear_cka(3.7 * x, y) == pytest.approx(base, rel=1e-10)  # isotropic scaling
    assert linear_cka(x + 5.0, y - 2.0) == pytest.approx(base, rel=1e-10)  # translation (centring)
    assert linear_cka(y, x) == pytest.approx(base, rel=1e-12)  # symmetry
    # an anisotropic scaling is NOT an invariance of linear CKA
    assert linear_cka(x * np.array([10.0, 1, 1, 1, 0.1]), y) != pytest.approx(base, rel=1e-3)


def test_linear_cka_identity_and_range():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(20, 4))
    assert linear_cka(x, x) == pytest.approx(1.0)
    value = linear_cka(x, rng.normal(size=(20, 6)))
    assert 0.0 <= value <= 1.0


def test_linear_cka_accepts_tensors():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 2))
    tx = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    assert linear_cka(tx, torch.tensor(y)) == pytest.approx(linear_cka(x, y), rel=1e-5)


def test_linear_cka_constant_representation_is_nan():
    assert math.isnan(linear_cka(np.ones((5, 3)), np.arange(10.0).reshape(5, 2)))
    # a constant the mean does not reproduce exactly (0.1) left 1e-17 residues and a CKA of ~1e-33, not NaN
    rng = np.random.default_rng(0)
    assert math.isnan(linear_cka(np.full((10, 3), 0.1), rng.normal(size=(10, 4))))
    assert math.isnan(linear_cka(np.tile(rng.normal(size=(1, 50)), (5, 1)), rng.normal(size=(5, 60))))  # the wide (Gram) branch


@pytest.mark.parametrize(
    "x, y, error, match",
    [
        (np.zeros((4, 2)), np.zeros((5, 2)), ValueError, "equal lengths"),
        (np.arange(4.0), np.zeros((4, 2)), ValueError, "reshape"),
        (np.ones((1, 3)), np.ones((1, 3)), ValueError, "at least 2"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), np.ones((2, 2)), ValueError, "infinite"),
        (np.array([["a"], ["b"]]), np.ones((2, 1)), TypeError, "numbers"),
    ],
)
def test_linear_cka_rejects_bad_input(x, y, error, match):
    with pytest.raises(error, match=match):
        linear_cka(x, y)
