"""VisAlign's tables (perceptual.visalign_report) on a four-image set with hand-computed distances and reliability scores."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from perceptual.visalign_report import model_visalign_table, read_human_labels, visalign_table

CLASSES = ["cat", "dog"]
# a: must-act cat, humans all say cat; b: must-abstain, humans all abstain;
# c: uncertain dog, humans 1 cat / 3 dog (P(dog) = .75 > λ = .5 → must act); d: uncertain cat, humans 1 cat / 3 abstain (→ must abstain)
CSV = """image_id,group,label,cat,dog,abstain
a,Must-Act,cat,4,0,0
b,must_abstain,,0,0,5
c,uncertain,dog,1,3,0
d,Uncertain,cat,1,0,3
"""
PROBS = np.array([[0.8, 0.2], [0.5, 0.5], [0.1, 0.9], [0.6, 0.4]])


@pytest.fixture
def human(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text(CSV)
    return read_human_labels(path, CLASSES)


def test_human_labels_are_normalised(human):
    assert human["group"].tolist() == ["must_act", "must_abstain", "uncertain", "uncertain"]
    assert human["label_index"].tolist() == [0, -1, 1, 0]
    np.testing.assert_allclose(human[["cat", "dog", "abstain"]].to_numpy(), [[1, 0, 0], [0, 0, 1], [0.25, 0.75, 0], [0.25, 0, 0.75]])


def test_hellinger_and_reliability_by_hand(human):
    # s: known scores 3, 1, 2, 1 → min-max scaled 1, 0, .5, 0 → abstention (1 − scaled) 0, 1, .5, 1
    # t: known scores 1, 3, 2, 3 → abstention 1, 0, .5, 0
    table = visalign_table(human, CLASSES, PROBS, {"s": np.array([3.0, 1, 2, 1]), "t": np.array([1.0, 3, 2, 3])}).set_index("score")
    # s's answers: a (.8, .2, 0), b (0, 0, 1), c (.05, .45, .5), d (0, 0, 1)
    h_a = math.sqrt(((math.sqrt(0.8) - 1) ** 2 + 0.2) / 2)
    h_c = math.sqrt(((math.sqrt(0.05) - 0.5) ** 2 + (math.sqrt(0.45) - math.sqrt(0.75)) ** 2 + 0.5) / 2)
    h_d = math.sqrt((0.25 + (1 - math.sqrt(0.75)) ** 2) / 2)
    s = table.loc["s"]
    assert s["hellinger_must_act"] == pytest.approx(h_a)
    assert s["hellinger_must_abstain"] == pytest.approx(0.0)
    assert s["hellinger_uncertain"] == pytest.approx((h_c + h_d) / 2)
    assert s["hellinger_all"] == pytest.approx((h_a + h_c + h_d) / 4)
    # a and c acted on correctly (c's abstention .5 is not above γ = .5), b and d abstained: +4 whatever the cost
    assert (s["act_correct"], s["abstain_abstained"], s["act_wrong"], s["abstain_wrong"]) == (2, 2, 0, 0)
    assert (s["rs_0"], s["rs_450"], s["rs_900"]) == (4.0, 4.0, 4.0)
    assert (s["uncertain_to_act"], s["uncertain_to_abstain"]) == (1, 1) and s["abstain_rate"] == 0.5
    # t: a abstains (0), b answers cat though it must abstain (−c), c right (+1), d answers its original label (0)
    t = table.loc["t"]
    assert (t["act_abstained"], t["abstain_wrong"], t["act_correct"], t["abstain_original_label"]) == (1, 1, 1, 1)
    assert (t["rs_0"], t["rs_450"], t["rs_900"]) == (1.0, -449.0, -899.0)


def test_calibration_on_a_reference_range(human):
    # range [0, 4]: scaled .75, .25, .5, .25 → abstention .25, .75, .5, .75 → b and d abstain
    table = visalign_table(human, CLASSES, PROBS, {"s": np.array([3.0, 1, 2, 1])}, calibration={"s": np.array([0.0, 4.0])})
    assert table["abstain_rate"].iloc[0] == 0.5 and table["rs_0"].iloc[0] == 4.0
    with pytest.raises(ValueError, match="one per image"):
        visalign_table(human, CLASSES, PROBS, {"s": np.array([1.0, 2.0])})
    with pytest.raises(ValueError, match=r"class_probs must be \(images = 4, classes = 2\)"):
        visalign_table(human, CLASSES, PROBS[:3], {"s": np.array([3.0, 1, 2, 1])})


def test_every_problem_in_the_labels_is_listed(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("image_id,group,label,cat,dog,abstain\n"
                    "a,must_act,cat,1,0,0\n"
                    "a,sometimes,cat,1,0,0\n"      # unknown group, duplicate id
                    "b,must_act,zebra,1,0,0\n"     # unknown label
                    "c,uncertain,,1,0,0\n"         # uncertain without a label
                    "d,must_act,dog,-1,x,0\n"      # negative and non-numeric
                    "e,must_act,dog,0,0,0\n")      # no answers
    with pytest.raises(ValueError) as caught:
        read_human_labels(path, CLASSES)
    message = str(caught.value)
    assert "6 kind(s) of problem" in message
    for line in ("unknown group (must_act, must_abstain, uncertain) × 1 (lines [3])", "unknown label × 1 (lines [4])",
                 "without a label × 1 (lines [5])", "duplicate image_id × 2 (lines [2, 3])",
                 "non-numeric, infinite or negative human answer × 1 (lines [6])", "no human answers (row sums to 0) × 1 (lines [7])"):
        assert line in message
    (tmp_path / "short.csv").write_text("image_id,group,label,cat\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['dog', 'abstain'\]"):
        read_human_labels(tmp_path / "short.csv", CLASSES)


def test_a_model_and_the_toolkits_score_functions(human):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)).eval()
    images = torch.rand(4, 3, 2, 2)
    table = model_visalign_table(model, images, human, CLASSES, ["max_softmax", "energy"]).set_index("score")
    with torch.no_grad():
        logits = model(images).double()
    probs = logits.softmax(1).numpy()
    expected = visalign_table(human, CLASSES, probs, {"max_softmax": probs.max(1), "energy": torch.logsumexp(logits, 1).numpy()}).set_index("score")
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-6)


def test_the_reference_codes_per_category_means_beside_the_pooled_group_means(tmp_path):
    # The uncertain group holds category7 (c) and category8 (d and e): the reference reports each category's mean; the
    # group's mean pools the three images, so it weighs category8 twice.
    path = tmp_path / "labels.csv"
    path.write_text("image_id,group,label,category,cat,dog,abstain\n"
                    "a,Must-Act,cat,category1,4,0,0\n"
                    "b,must_abstain,,category5,0,0,5\n"
                    "c,uncertain,dog,category7,1,3,0\n"
                    "d,Uncertain,cat,category8,1,0,3\n"
                    "e,uncertain,cat, category8 ,1,0,3\n")
    human = read_human_labels(path, CLASSES)
    assert human["category"].tolist() == ["category1", "category5", "category7", "category8", "category8"]
    probs = np.vstack([PROBS, PROBS[3]])
    row = visalign_table(human, CLASSES, probs, {"s": np.array([3.0, 1, 2, 1, 1])}).iloc[0]
    h_a = math.sqrt(((math.sqrt(0.8) - 1) ** 2 + 0.2) / 2)
    h_c = math.sqrt(((math.sqrt(0.05) - 0.5) ** 2 + (math.sqrt(0.45) - math.sqrt(0.75)) ** 2 + 0.5) / 2)
    h_d = math.sqrt((0.25 + (1 - math.sqrt(0.75)) ** 2) / 2)
    assert list(row["hellinger_per_category"]) == ["category1", "category5", "category7", "category8"]
    assert row["hellinger_per_category"] == pytest.approx({"category1": h_a, "category5": 0.0, "category7": h_c, "category8": h_d})
    assert row["hellinger_uncertain"] == pytest.approx((h_c + 2 * h_d) / 3)
    assert row["hellinger_uncertain"] != pytest.approx((h_c + h_d) / 2)
    assert visalign_table(read_human_labels(tmp_path / "labels.csv", CLASSES).drop(columns="category"), CLASSES, probs,
                          {"s": np.array([3.0, 1, 2, 1, 1])}).iloc[0]["hellinger_per_category"] == {}


def test_answers_for_a_class_outside_classes_are_refused(tmp_path):
    """Answers in a column that is no class of ``classes=`` used to vanish and the rest be renormalised: humans 2 cat /
    6 fox / 2 abstain read as 0.5 cat / 0.5 abstain, with no word."""
    path = tmp_path / "labels.csv"
    path.write_text("image_id,group,label,cat,dog,fox,abstain,notes\n"
                    "a,must_act,cat,2,0,6,2,blurry\n")
    with pytest.raises(ValueError, match=r"numeric column\(s\) \['fox'\] are neither a class of classes=\['cat', 'dog'\]"):
        read_human_labels(path, CLASSES)
    assert read_human_labels(path, ["cat", "dog", "fox"])["fox"].iloc[0] == pytest.approx(0.6)  # a text column is left alone


def test_costs_that_would_share_a_column_are_refused():
    from perceptual.metrics import check_reliability_settings

    with pytest.raises(ValueError, match=r"more than one column named \['rs_1e\+06'\]"):  # one overwrote the other in the JSON
        check_reliability_settings(0.5, 0.5, [1_000_000, 1_000_001])
    with pytest.raises(ValueError, match=r"\['rs_450'\]"):
        check_reliability_settings(0.5, 0.5, [450, 450.0])
    assert check_reliability_settings(0.5, 0.5, [0, 450, 900])[2] == [0.0, 450.0, 900.0]


def test_category_order_and_category_problems(tmp_path):
    from perceptual.visalign_report import category_order

    assert category_order(["category10", "category2", "category1", "category2"]) == ["category1", "category2", "category10"]
    assert category_order(["10", "9", "b", "a"]) == ["9", "10", "a", "b"]
    assert category_order(["cat1_10", "cat1_9", "cat1_2"]) == ["cat1_2", "cat1_9", "cat1_10"]  # was text order: a digit before the number
    path = tmp_path / "bad.csv"
    path.write_text("image_id,group,label,category,cat,dog,abstain\n"
                    "a,must_act,cat,category1,1,0,0\n"
                    "b,must_act,cat,,1,0,0\n"            # empty category
                    "c,uncertain,cat,category1,1,0,0\n")  # category1 in two groups
    with pytest.raises(ValueError) as caught:
        read_human_labels(path, CLASSES)
    assert "empty category" in str(caught.value) and "lines [3]" in str(caught.value)
    assert "category in more than one group (category1) × 2 (lines [2, 4])" in str(caught.value)
