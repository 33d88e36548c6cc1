"""VisAlign: Hellinger distance, abstention distribution, min-max calibrator, reliability score."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from perceptual.metrics import (
    MinMaxAbstentionCalibrator,
    abstention_distribution,
    hellinger,
    reliability_score,
)


def test_hellinger_hand_computed():
    assert hellinger([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert hellinger([1.0, 0.0], [0.0, 1.0]) == pytest.approx(1.0)
    # ||(sqrt .5 - 1, sqrt .5)|| / sqrt 2 = sqrt(1 - sqrt .5)
    assert hellinger([0.5, 0.5], [1.0, 0.0]) == pytest.approx(math.sqrt(1 - math.sqrt(0.5)))


def test_hellinger_rows_symmetry_and_bhattacharyya_identity():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(11), 20), rng.dirichlet(np.ones(11), 20)
    distances = hellinger(p, q)
    assert distances.shape == (20,)
    np.testing.assert_allclose(distances, hellinger(q, p))
    np.testing.assert_allclose(distances, np.sqrt(1 - np.sum(np.sqrt(p * q), axis=1)), atol=1e-12)
    assert np.all((distances >= 0) & (distances <= 1))
    assert hellinger(torch.tensor(p[0]), q[0]) == pytest.approx(distances[0])


def test_hellinger_rejects_non_distributions():
    with pytest.raises(ValueError, match="sum to 1"):
        hellinger([0.2, 0.2], [0.5, 0.5])
    with pytest.raises(ValueError, match="same shape"):
        hellinger([0.5, 0.5], [0.2, 0.3, 0.5])


def test_abstention_distribution():
    np.testing.assert_allclose(abstention_distribution([0.2, 0.8], 0.5), [0.1, 0.4, 0.5])
    out = abstention_distribution([[0.2, 0.8], [1.0, 0.0]], [0.0, 1.0])
    np.testing.assert_allclose(out, [[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(out.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        abstention_distribution([0.2, 0.8], 1.2)
    with pytest.raises(ValueError, match="equal lengths"):
        abstention_distribution([[0.2, 0.8]], [0.1, 0.2])
    with pytest.raises(ValueError, match="one abstain_prob"):
        abstention_distribution([0.2, 0.8], [0.1, 0.2])


def test_min_max_calibrator_fit_on_one_set_apply_to_another():
    calibrator = MinMaxAbstentionCalibrator().fit([0.0, 4.0, 10.0])
    np.testing.assert_allclose(calibrator.transform([5.0, -1.0, 20.0]), [0.5, 0.0, 1.0])
    flipped = MinMaxAbstentionCalibrator(higher_means_abstain=False).fit([0.0, 10.0])
    np.testing.assert_allclose(flipped.transform([5.0, -1.0, 20.0, 2.0]), [0.5, 1.0, 0.0, 0.8])
    np.testing.assert_allclose(MinMaxAbstentionCalibrator().fit_transform([2.0, 3.0, 4.0]), [0.0, 0.5, 1.0])


def test_min_max_calibrator_errors():
    with pytest.raises(ValueError, match="not fitted"):
        MinMaxAbstentionCalibrator().transform([1.0])
    with pytest.raises(ValueError, match="distinct"):
        MinMaxAbstentionCalibrator().fit([3.0, 3.0])
    with pytest.raises(TypeError, match="bool"):
        MinMaxAbstentionCalibrator(higher_means_abstain="yes")


# items: (group, label, human prob of label, dist over [class 0, class 1, abstain]) -> outcome
ITEMS = [
    ("must_act", 0, np.nan, [0.8, 0.1, 0.1]),  # right: +1
    ("must_act", 0, np.nan, [0.1, 0.8, 0.1]),  # wrong: -c
    ("must_act", 1, np.nan, [0.2, 0.2, 0.6]),  # abstains: 0
    ("must_abstain", -1, np.nan, [0.1, 0.1, 0.8]),  # abstains: +1
    ("must_abstain", -1, np.nan, [0.7, 0.2, 0.1]),  # predicts a class: -c
    ("uncertain", 1, 0.9, [0.3, 0.6, 0.1]),  # humans agree (0.9 > lam): must act, right: +1
    ("uncertain", 1, 0.3, [0.3, 0.6, 0.1]),  # must abstain, predicts original label: 0
    ("uncertain", 0, 0.5, [0.1, 0.85, 0.05]),  # 0.5 is not > lam: must abstain, other class: -c
    ("uncertain", 0, 0.2, [0.2, 0.2, 0.6]),  # must abstain, abstains: +1
]


def _unpack(items):
    groups, labels, human, dist = zip(*items)
    return np.array(dist), list(groups), np.array(labels), np.array(human)


def test_reliability_score_hand_computed():
    dist, groups, labels, human = _unpack(ITEMS)
    result = reliability_score(dist, groups, labels, human)
    assert (result.act_correct, result.act_wrong, result.act_abstained) == (2, 1, 1)
    assert (result.abstain_abstained, result.abstain_original_label, result.abstain_wrong) == (2, 1, 2)
    assert (result.uncertain_to_act, result.uncertain_to_abstain) == (1, 3)
    assert result.n_items == 9
    assert result.scores == {0: 4.0, 450: 4.0 - 3 * 450, 900: 4.0 - 3 * 900}
    assert result.to_dict()["scores"][900] == -2696.0


def test_reliability_score_thresholds_are_strict():
    # abstention mass equal to gamma does not abstain: the argmax class (0) is predicted and right
    exact = reliability_score([[0.5, 0.0, 0.5]], ["must_act"], [0], costs=(1,))
    assert exact.act_correct == 1 and exact.scores == {1: 1.0}
    lenient = reliability_score([[0.5, 0.0, 0.5]], ["must_act"], [0], gamma=0.4, costs=(1,))
    assert lenient.act_abstained == 1 and lenient.scores == {1: 0.0}


def test_reliability_score_reads_human_distributions():
    dist, groups, labels, human = _unpack(ITEMS)
    human_dist = np.zeros((len(ITEMS), 3))
    for i, (g, y, h, _) in enumerate(ITEMS):
        if g == "uncertain":
            human_dist[i, y], human_dist[i, 2] = h, 1 - h
        else:
            human_dist[i, 2] = 1.0
    from_dist = reliability_score(dist, groups, labels, human_dist)
    assert from_dist == reliability_score(dist, groups, labels, human)


def test_reliability_score_accepts_hyphenated_groups():
    result = reliability_score([[0.1, 0.1, 0.8]], ["Must-Abstain"], [-1], costs=(5,))
    assert result.scores == {5: 1.0}


@pytest.mark.parametrize(
    "dist, groups, labels, human, match",
    [
        ([[0.1, 0.1, 0.8]], ["uncertain"], [0], None, "human_label_prob"),
        ([[0.1, 0.1, 0.8]], ["uncertain"], [0], [1.5], "human_label_prob"),
        ([[0.1, 0.1, 0.8]], ["maybe"], [0], None, "group entries"),
        ([[0.1, 0.1, 0.8]], ["must_act"], [-1], None, "must-abstain only"),
        ([[0.1, 0.1, 0.8]], ["must_act"], [2], None, r"\[0, 2\)"),
        ([[0.1, 0.1, 0.9]], ["must_act"], [0], None, "sum to 1"),
        ([[0.1, 0.1, 0.8]], ["must_act", "must_act"], [0], None, "one entry per item"),
        ([[1.0]], ["must_act"], [0], None, "K \\+ 1 >= 2"),
    ],
)
def test_reliability_score_rejects_bad_input(dist, groups, labels, human, match):
    with pytest.raises(ValueError, match=match):
        reliability_score(dist, groups, labels, human)


def test_reliability_score_rejects_bad_costs_and_thresholds():
    with pytest.raises(ValueError, match="cost"):
        reliability_score([[0.5, 0.5, 0.0]], ["must_act"], [0], costs=(-1,))
    with pytest.raises(ValueError, match="gamma"):
        reliability_score([[0.5, 0.5, 0.0]], ["must_act"], [0], gamma=1.5)
    with pytest.raises(TypeError, match="strings"):
        reliability_score([[0.5, 0.5, 0.0]], [0], [0])
