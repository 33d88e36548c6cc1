"""The 16-class mapping (checked against model-vs-human's lists) and shape bias."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perceptual.metrics import SIXTEEN_CLASS_IMAGENET_INDICES, SIXTEEN_CLASS_NAMES, imagenet_to_16_classes, shape_bias

# HumanCategories.<name>_indices, copied from bethgelab/model-vs-human modelvshuman/helper/human_categories.py
TOOLBOX = {
    "airplane": [404], "bear": [294, 295, 296, 297], "bicycle": [444, 671],
    "bird": [8, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 23, 24, 80, 81, 82, 83, 87, 88, 89, 90, 91, 92, 93,
             94, 95, 96, 98, 99, 100, 127, 128, 129, 130, 131, 132, 133, 135, 136, 137, 138, 139, 140, 141, 142,
             143, 144, 145],
    "boat": [472, 554, 625, 814, 914], "bottle": [440, 720, 737, 898, 899, 901, 907], "car": [436, 511, 817],
    "cat": [281, 282, 283, 284, 285, 286], "chair": [423, 559, 765, 857], "clock": [409, 530, 892],
    "dog": [152, 153, 154, 155, 156, 157, 158, 159, 160, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171,
            172, 173, 174, 175, 176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
            193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 205, 206, 207, 208, 209, 210, 211, 212, 213,
            214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 228, 229, 230, 231, 232, 233, 234,
            235, 236, 237, 238, 239, 240, 241, 243, 244, 245, 246, 247, 248, 249, 250, 252, 253, 254, 255, 256,
            257, 259, 261, 262, 263, 265, 266, 267, 268],
    "elephant": [385, 386], "keyboard": [508, 878], "knife": [499], "oven": [766],
    "truck": [555, 569, 656, 675, 717, 734, 864, 867],
}


def test_index_lists_match_the_toolbox():
    assert {k: list(v) for k, v in SIXTEEN_CLASS_IMAGENET_INDICES.items()} == TOOLBOX
    assert SIXTEEN_CLASS_NAMES == tuple(sorted(TOOLBOX))  # the toolbox sorts the category names
    flat = [i for v in TOOLBOX.values() for i in v]
    assert len(flat) == 207 and len(set(flat)) == 207 and max(flat) < 1000


def test_mapping_is_the_mean_over_each_category():
    probs = np.zeros(1000)
    probs[404], probs[152], probs[294] = 0.5, 0.3, 0.2  # airplane, dog, bear
    scores = imagenet_to_16_classes(probs)
    by_name = dict(zip(SIXTEEN_CLASS_NAMES, scores))
    assert by_name["airplane"] == pytest.approx(0.5)
    assert by_name["dog"] == pytest.approx(0.3 / 109)
    assert by_name["bear"] == pytest.approx(0.2 / 4)
    assert sum(v for k, v in by_name.items() if k not in ("airplane", "dog", "bear")) == 0.0
    np.testing.assert_allclose(imagenet_to_16_classes(np.full((2, 1000), 1e-3)), 1e-3)


def test_decision_order_matches_toolbox_mapping():
    """ImageNetProbabilitiesTo16ClassesMapping sorts categories by np.mean of their probabilities."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(1000, 0.05), 5)
    toolbox = np.transpose([np.mean(probs[:, TOOLBOX[c]], axis=-1) for c in sorted(TOOLBOX)])
    np.testing.assert_allclose(imagenet_to_16_classes(probs), toolbox)


def test_mapping_rejects_bad_input():
    with pytest.raises(ValueError, match="1000 ImageNet classes"):
        imagenet_to_16_classes(np.full((2, 999), 1 / 999))
    with pytest.raises(ValueError, match="sum to 1"):
        imagenet_to_16_classes(np.ones((2, 1000)))


def test_shape_bias_hand_computed():
    shape = ["cat", "dog", "cat", "bird"]
    texture = ["dog", "dog", "bird", "car"]
    decisions = ["cat", "dog", "bird", "knife"]
    # trial 1 has no cue conflict (left out); 1 shape hit, 1 texture hit, 1 neither
    assert shape_bias(shape, texture, decisions) == pytest.approx(0.5)
    assert shape_bias([0, 1, 2], [3, 4, 5], [0, 1, 5]) == pytest.approx(2 / 3)
    assert math.isnan(shape_bias([0, 1], [1, 1], [2, 1]))  # no conflict decision matches a cue
    assert shape_bias([0, 1], [2, 3], [2, 3]) == 0.0


def test_shape_bias_rejects_bad_input():
    with pytest.raises(ValueError, match="equal lengths"):
        shape_bias([0, 1], [1, 0], [0])
    with pytest.raises(ValueError, match="1-D"):
        shape_bias([[0, 1]], [[1, 0]], [[0, 1]])
