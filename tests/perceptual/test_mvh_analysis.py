"""Human baselines of the model-vs-human benchmark (perceptual.mvh_analysis) on hand-computed trial tables, and on the
shared real trials when they are there."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perceptual.human_trials import read_trials
from perceptual.mvh_analysis import (
    accuracy_per_subject,
    accuracy_summary,
    condition_order,
    consistency_matrix,
    consistency_summary,
    pairwise_consistency,
    shape_bias_per_category,
    shape_bias_table,
)

from ..conftest import MVH_RAW


def table(rows):
    """Rows (subject, dataset, condition, image_id, correct) → a trial table (category 'cat'; response follows correct)."""
    frame = pd.DataFrame(rows, columns=["subject", "dataset", "condition", "image_id", "correct"])
    frame["category"] = "cat"
    frame["response"] = np.where(frame["correct"], "cat", "dog")
    return frame


# subject-01: right on images 1, 2, 3, wrong on 4; subject-02: right on 1, 2 only; model "net" right on 1 and 4.
# s01 vs s02: c_obs = 3/4, p = .75 and .5, c_exp = .75·.5 + .25·.5 = .5, kappa = (.75 − .5) / (1 − .5) = .5
# net vs s01: they agree on image 1 only, c_obs = 1/4; p = .5 and .75, c_exp = .5, kappa = (.25 − .5) / .5 = −.5
# net vs s02: agree on 1 and 3 → c_obs = .5, c_exp = .5, kappa = 0
CELL = ([("subject-01", "exp", "c1", i, c) for i, c in zip([1, 2, 3, 4], [1, 1, 1, 0])]
        + [("subject-02", "exp", "c1", i, c) for i, c in zip([4, 3, 2, 1], [0, 0, 1, 1])]  # another order: matched by image
        + [("net", "exp", "c1", i, c) for i, c in zip([1, 2, 3, 4], [1, 0, 0, 1])])


def test_pairwise_consistency_matches_trials_by_image():
    pairs = pairwise_consistency(table(CELL)).set_index(["subject_a", "subject_b"])
    assert pairs.loc[("subject-01", "subject-02"), "kind"] == "human-human"
    assert pairs.loc[("subject-01", "subject-02"), "error_consistency"] == pytest.approx(0.5)
    assert pairs.loc[("subject-01", "subject-02"), "observed_consistency"] == pytest.approx(0.75)
    assert pairs.loc[("net", "subject-01"), "kind"] == "model-human"  # the model is always subject_a
    assert pairs.loc[("net", "subject-01"), "error_consistency"] == pytest.approx(-0.5)
    assert pairs.loc[("net", "subject-02"), "error_consistency"] == pytest.approx(0.0)
    assert (pairs["n_shared"] == 4).all() and (pairs["n_only_a"] == 0).all()


def test_partly_shared_images_are_compared_on_the_shared_ones_and_counted():
    rows = CELL + [("subject-01", "exp", "c1", 5, 1), ("subject-02", "exp", "c1", 6, 1), ("subject-02", "exp", "c1", 7, 0)]
    pairs = pairwise_consistency(table(rows)).set_index(["subject_a", "subject_b"])
    row = pairs.loc[("subject-01", "subject-02")]
    assert (row["n_shared"], row["n_only_a"], row["n_only_b"]) == (4, 1, 2)
    assert row["error_consistency"] == pytest.approx(0.5)


def test_undefined_error_consistency_follows_on_undefined():
    rows = [("subject-01", "e", "c", i, 1) for i in range(3)] + [("subject-02", "e", "c", i, 1) for i in range(3)]
    assert math.isnan(pairwise_consistency(table(rows))["error_consistency"].iloc[0])
    assert pairwise_consistency(table(rows), on_undefined="one")["error_consistency"].iloc[0] == 1.0


def test_consistency_summary_and_matrix_over_human_pairs():
    # a second condition where s01 and s02 agree on every trial but are not always right: kappa 1
    rows = CELL + [(s, "exp", "c2", i, c) for s in ("subject-01", "subject-02") for i, c in zip([1, 2], [1, 0])]
    rows += [("subject-03", "exp", c, i, 1) for c, ids in (("c1", [1, 2, 3, 4]), ("c2", [1, 2])) for i in ids]
    pairs = pairwise_consistency(table(rows))
    summary = consistency_summary(pairs).set_index("condition")
    # s03 is always right: against it c_obs = c_exp = the other's accuracy, so kappa = 0 (defined)
    c1 = pairs[(pairs["condition"] == "c1") & (pairs["kind"] == "human-human")]["error_consistency"].to_numpy()
    assert summary.loc["c1", "n_pairs"] == 3 and summary.loc["c1", "mean"] == pytest.approx(np.mean(c1))
    assert summary.loc["c1", "std"] == pytest.approx(np.std(c1, ddof=1))
    assert summary.loc["c2", "max"] == pytest.approx(1.0)
    matrix = consistency_matrix(pairs[pairs["kind"] == "human-human"], "exp")
    expected = np.mean([0.5, 1.0])
    assert matrix.loc["subject-01", "subject-02"] == matrix.loc["subject-02", "subject-01"] == pytest.approx(expected)
    assert math.isnan(matrix.loc["subject-01", "subject-01"])
    with pytest.raises(ValueError, match="no model-human pairs"):
        consistency_summary(pairs[pairs["kind"] == "human-human"], kind="model-human")


def test_accuracy_per_condition_with_the_spread_across_humans():
    per_subject = accuracy_per_subject(table(CELL))
    values = per_subject.set_index("subject")["accuracy"]
    assert values.to_dict() == {"net": 0.5, "subject-01": 0.75, "subject-02": 0.5}
    assert per_subject.set_index("subject")["is_human"].to_dict() == {"net": False, "subject-01": True, "subject-02": True}
    summary = accuracy_summary(per_subject).iloc[0]
    assert summary["n_subjects"] == 2 and summary["mean"] == pytest.approx(0.625)
    assert summary["std"] == pytest.approx(np.std([0.75, 0.5], ddof=1))
    assert (summary["min"], summary["max"]) == (0.5, 0.75)


def test_repeated_images_are_refused():
    with pytest.raises(ValueError, match="1 trial.*repeat an image"):
        accuracy_per_subject(table(CELL + [("net", "exp", "c1", 1, 0)]))


def test_a_correct_column_that_is_not_right_or_wrong_is_refused():
    """NaN (a model without decisions, after a merge) and the text "False" both read as correct in a boolean cast: the
    model got consistency as if it were always right, while its accuracy was NaN."""
    missing = table(CELL).astype({"correct": float})
    missing.loc[missing["subject"] == "net", "correct"] = np.nan
    with pytest.raises(ValueError, match="correct column must contain only 0/1 or True/False"):
        pairwise_consistency(missing)
    with pytest.raises(TypeError, match="correct column must be booleans or 0/1 numbers"):
        accuracy_per_subject(table(CELL).assign(correct=lambda t: t["correct"].map({1: "True", 0: "False"})))


def cue(subject, shape, texture, response, trial):
    name = f"{trial:04d}_s5n_s01_0_{shape}_00_{shape}1-{texture}2.png"
    return {"subject": subject, "dataset": "cue-conflict", "condition": "0", "image_id": name.split("_", 4)[4], "category": shape,
            "response": response, "correct": response == shape, "imagename": name}


def test_shape_bias_per_subject_pooled_and_mean():
    rows = [
        cue("subject-01", "cat", "dog", "cat", 1), cue("subject-01", "cat", "clock", "cat", 2),  # shape, shape
        cue("subject-01", "car", "dog", "dog", 3), cue("subject-01", "car", "car", "car", 4),    # texture; no conflict: out
        cue("subject-01", "car", "bird", "oven", 5),                                               # neither cue
        cue("subject-02", "cat", "dog", "dog", 1), cue("subject-02", "cat", "clock", "cat", 2),  # texture, shape
        cue("net", "cat", "dog", "dog", 1), cue("net", "cat", "clock", "clock", 2),                # texture, texture
    ]
    result = shape_bias_table(pd.DataFrame(rows)).set_index("subject")
    assert result.loc["subject-01", "shape_bias"] == pytest.approx(2 / 3)
    assert (result.loc["subject-01", "n_conflict"], result.loc["subject-01", "shape_decisions"], result.loc["subject-01", "texture_decisions"]) == (4, 2, 1)
    assert result.loc["subject-02", "shape_bias"] == pytest.approx(1 / 2)
    assert result.loc["net", "shape_bias"] == 0.0 and not result.loc["net", "is_human"]
    assert result.loc["all humans", "shape_bias"] == pytest.approx(3 / 5)  # 3 shape of 5 cue decisions, pooled
    assert result.loc["mean of humans", "shape_bias"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    per_category = shape_bias_per_category(pd.DataFrame(rows)).set_index(["subject", "category"])
    assert per_category.loc[("all humans", "cat"), "shape_bias"] == pytest.approx(3 / 4)
    assert per_category.loc[("subject-01", "car"), "shape_bias"] == 0.0
    # the benchmark's plot takes the mean of the subjects, not the pooled trials (which weight subjects by their trials)
    more = shape_bias_per_category(pd.DataFrame(rows + [cue("subject-02", "cat", "bird", "bird", 3)])).set_index(["subject", "category"])
    assert more.loc[("all humans", "cat"), "shape_bias"] == pytest.approx(3 / 5)
    assert more.loc[("mean of humans", "cat"), "shape_bias"] == pytest.approx((1 + 1 / 3) / 2)
    assert more.loc[("mean of humans", "car"), "shape_bias"] == 0.0 and ("mean of humans", "car") in more.index
    with pytest.raises(ValueError, match="no 'cue-conflict' trials"):
        shape_bias_table(pd.DataFrame(rows).assign(dataset="edge"))


def test_condition_order():
    assert condition_order(["3", "0.7", "inf", "1"]) == ["0.7", "1", "3", "inf"]
    assert condition_order(["16-10-10", "2-10-10", "128-10-10"]) == ["2-10-10", "16-10-10", "128-10-10"]
    # the benchmark's order for named conditions; contrast by its percentage (as strings c100 sat between c10 and c15)
    assert condition_order(["bw", "cr"]) == ["cr", "bw"] and condition_order(["False", "True"]) == ["True", "False"]
    assert condition_order(["false", "true"]) == ["true", "false"]  # as the raw CSVs write false-colour's conditions
    assert condition_order(["pow", "0"]) == ["0", "pow"]
    assert condition_order(["c100", "c05", "c10", "c15", "c01"]) == ["c01", "c05", "c10", "c15", "c100"]
    # the benchmark lists contrast and high-pass from the undistorted end (experiments.py's data_conditions)
    assert condition_order(["c100", "c05", "c10", "c15", "c01"], "contrast") == ["c100", "c15", "c10", "c05", "c01"]
    assert condition_order(["3", "0.7", "inf", "1"], "high-pass") == ["inf", "3", "1", "0.7"]
    assert condition_order(["3", "0", "40"], "low-pass") == ["0", "3", "40"]


@pytest.fixture(scope="module")
def real_trials():
    if not MVH_RAW.is_dir():
        pytest.skip(f"model-vs-human raw trials not found at {MVH_RAW}")
    return read_trials(MVH_RAW)[0]


def test_real_human_shape_bias_recomputed_from_the_raw_files(real_trials):
    """The pooled human shape bias equals a direct count over the raw cue-conflict CSVs (an independent path)."""
    raw = pd.concat([pd.read_csv(f) for f in sorted((MVH_RAW / "cue-conflict").glob("*.csv"))])
    texture = raw["imagename"].str.extract(r"-([a-z]+)\d*\.png$")[0]
    conflict = raw["category"] != texture
    shape = int((conflict & (raw["object_response"] == raw["category"])).sum())
    texture_hits = int((conflict & (raw["object_response"] == texture)).sum())
    result = shape_bias_table(real_trials).set_index("subject")
    assert result.loc["all humans", "shape_bias"] == pytest.approx(shape / (shape + texture_hits))
    assert (result.loc["all humans", "shape_decisions"], result.loc["all humans", "texture_decisions"]) == (shape, texture_hits)


def test_real_false_colour_conditions_come_in_the_benchmarks_order(real_trials):
    conditions = real_trials.loc[real_trials["dataset"] == "false-colour", "condition"].unique()
    assert condition_order(conditions) == ["true", "false"]  # true colour before opponent colour, as the benchmark lists them


def test_real_human_error_consistency_per_condition(real_trials):
    pairs = pairwise_consistency(real_trials[real_trials["dataset"].isin(["colour", "sketch"])])
    summary = consistency_summary(pairs).set_index(["dataset", "condition"])
    assert summary.loc[("sketch", "0"), "n_pairs"] == 7 * 6 // 2 and summary.loc[("colour", "bw"), "n_pairs"] == 6
    assert (pairs["n_only_a"] == 0).all() and (pairs["n_only_b"] == 0).all()
    # one pair recomputed with scikit-learn's Cohen's kappa
    from sklearn.metrics import cohen_kappa_score

    cell = real_trials[(real_trials["dataset"] == "colour") & (real_trials["condition"] == "bw")]
    a = cell[cell["subject"] == "subject-01"].set_index("image_id")["correct"]
    b = cell[cell["subject"] == "subject-02"].set_index("image_id")["correct"].loc[a.index]
    kappa = pairs.set_index(["condition", "subject_a", "subject_b"]).loc[("bw", "subject-01", "subject-02"), "error_consistency"]
    assert kappa == pytest.approx(cohen_kappa_score(a, b))
