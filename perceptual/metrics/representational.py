"""Representational alignment: linear centred kernel alignment (CKA)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._validation import as_float_array, check_same_length


def linear_cka(features_a: Any, features_b: Any) -> float:
    """Linear CKA between two representations of the same N items, in [0, 1].

    Kornblith, Norouzi, Lee & Hinton, "Similarity of Neural Network Representations Revisited" (ICML 2019),
    HSIC form with linear kernels on column-centred features (the authors' demo code computes the same as
    ``feature_space_linear_cka(x, y)`` and ``cka(gram_linear(x), gram_linear(y))``, both with debiased=False)::

        CKA = ||Yᵀ X||²_F / (||Xᵀ X||_F · ||Yᵀ Y||_F)

    ``features_a`` is (N, D_a), ``features_b`` is (N, D_b); rows are the same items in the same order, the widths
    may differ. The result is invariant to orthogonal transforms and isotropic scaling of either side (not to
    arbitrary invertible linear maps). Computed from the D×D cross-covariances or the N×N Gram matrices,
    whichever is smaller. NaN when either representation is constant over the items (zero after centring).
    """
    x = as_float_array(features_a, "features_a", ndim=2)
    y = as_float_array(features_b, "features_b", ndim=2)
    n = check_same_length(features_a=x, features_b=y)
    if n < 2:
        raise ValueError(f"linear_cka needs at least 2 items (rows) to centre, got {n}")
    if np.ptp(x, axis=0).max() == 0 or np.ptp(y, axis=0).max() == 0:  # before centring: a mean of 0.1s leaves 1e-17 residues
        return float("nan")
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    if x.shape[1] * y.shape[1] <= n * n:
        cross = np.linalg.norm(y.T @ x) ** 2
        norm_x = np.linalg.norm(x.T @ x)
        norm_y = np.linalg.norm(y.T @ y)
    else:  # wide features: the N×N Gram form is cheaper; tr(K L) = ||Yᵀ X||²_F
        gram_x, gram_y = x @ x.T, y @ y.T
        cross = float(np.sum(gram_x * gram_y))
        norm_x = np.linalg.norm(gram_x)
        norm_y = np.linalg.norm(gram_y)
    if norm_x == 0 or norm_y == 0:
        return float("nan")
    return float(cross / (norm_x * norm_y))
