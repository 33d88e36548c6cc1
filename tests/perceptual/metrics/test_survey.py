"""Fleiss' kappa, Cronbach's alpha, VisAlign's survey sample size."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perceptual.metrics import cronbach_alpha, fleiss_kappa, survey_sample_size

# Fleiss (1971)-style worked example (10 items, 5 categories, 14 raters): P-bar = 0.378, P_e = 0.213, kappa = 0.210
WORKED = np.array([
    [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
])


def test_fleiss_kappa_worked_example():
    p_bar = ((WORKED**2).sum(1) - 14).sum() / (10 * 14 * 13)
    p_e = ((WORKED.sum(0) / 140) ** 2).sum()
    assert p_bar == pytest.approx(0.378, abs=5e-4) and p_e == pytest.approx(0.213, abs=5e-4)
    assert fleiss_kappa(WORKED) == pytest.approx(0.210, abs=5e-4)
    assert fleiss_kappa(WORKED) == pytest.approx((p_bar - p_e) / (1 - p_e))


def test_fleiss_kappa_extremes():
    assert fleiss_kappa([[2, 0], [0, 2]]) == pytest.approx(1.0)  # full agreement, balanced categories
    assert fleiss_kappa([[1, 1], [1, 1]]) == pytest.approx(-1.0)  # P-bar 0, chance 1/2
    assert math.isnan(fleiss_kappa([[3, 0], [3, 0]]))  # a single category used: chance agreement is 1
    assert fleiss_kappa(WORKED[:, ::-1]) == pytest.approx(fleiss_kappa(WORKED))  # category order is irrelevant


def test_fleiss_kappa_matches_statsmodels():
    inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
    rng = np.random.default_rng(0)
    table = rng.multinomial(6, [0.5, 0.3, 0.2], size=12)
    assert fleiss_kappa(table) == pytest.approx(inter_rater.fleiss_kappa(table, method="fleiss"))


@pytest.mark.parametrize(
    "counts, match",
    [([[1, 2], [3, 1]], "same number of raters"), ([[1, 0], [0, 1]], "at least 2 raters"),
     ([[1.5, 0.5]], "non-negative integers"), ([[-1, 3]], "non-negative integers"), ([1, 2], "2-D")],
)
def test_fleiss_kappa_rejects_bad_tables(counts, match):
    with pytest.raises(ValueError, match=match):
        fleiss_kappa(counts)


def test_cronbach_alpha_hand_computed():
    assert cronbach_alpha([[1, 2], [2, 3], [3, 4]]) == pytest.approx(1.0)  # parallel items
    # item variances 1 and 1, totals (2, 5, 5) with variance 3: alpha = 2 * (1 - 2/3)
    assert cronbach_alpha([[1, 1], [2, 3], [3, 2]]) == pytest.approx(2 / 3)
    assert math.isnan(cronbach_alpha([[1, 3], [2, 2], [3, 1]]))  # constant total score


def test_cronbach_alpha_rejects_bad_shapes():
    with pytest.raises(ValueError, match="transpose"):
        cronbach_alpha([[1, 2, 3]])
    with pytest.raises(ValueError, match="2-D"):
        cronbach_alpha([1, 2, 3])


def test_survey_sample_size():
    assert survey_sample_size(0.05, 0.5) == pytest.approx(401.0)  # 4 * 0.25 / 0.0025 + 1
    assert survey_sample_size(0.1, 0.2, z=1.96) == pytest.approx(1.96**2 * 0.16 / 0.01 + 1)
    assert survey_sample_size(0.1, 0.0) == 1.0
    for kwargs, match in [(dict(margin=0.0, p=0.5), "margin"), (dict(margin=0.1, p=1.2), "p"),
                          (dict(margin=0.1, p=0.5, z=0), "z")]:
        with pytest.raises(ValueError, match=match):
            survey_sample_size(**kwargs)
    with pytest.raises(TypeError, match="margin"):
        survey_sample_size("5%", 0.5)
