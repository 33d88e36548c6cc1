"""aggregate_trials: model-vs-human's nesting (conditions, then observers, then data sets)."""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest

from perceptual.metrics import TRIAL_COLUMNS, accuracy_difference, aggregate_trials, error_consistency


def _rows(spec):
    """spec: {(dataset, condition, subject): [correct, ...]} -> row dicts; image ids are positions."""
    return [
        dict(subject=s, dataset=d, condition=c, image_id=f"{d}-{c}-{i}", correct=bool(v))
        for (d, c, s), values in spec.items()
        for i, v in enumerate(values)
    ]


SPEC = {
    ("d1", "c1", "m"): [1, 1, 0, 0], ("d1", "c1", "subject-01"): [1, 1, 1, 0], ("d1", "c1", "subject-02"): [1, 0, 0, 0],
    ("d1", "c2", "m"): [1, 1, 1, 1], ("d1", "c2", "subject-01"): [1, 1, 0, 0], ("d1", "c2", "subject-02"): [1, 1, 1, 0],
    ("d2", "c1", "m"): [1, 0], ("d2", "c1", "subject-01"): [1, 1], ("d2", "c1", "subject-02"): [0, 0],
}


def _columns(rows):
    return {c: [r[c] for r in rows] for c in TRIAL_COLUMNS}


def test_accuracy_difference_nesting_hand_computed():
    result = aggregate_trials(_rows(SPEC), "accuracy_difference")
    # model m, d1: vs subject-01 mean(.0625, .25) = .15625, vs subject-02 mean(.0625, .0625) = .0625 -> .109375
    # d2: vs subject-01 .25, vs subject-02 .25 -> .25; over data sets: (.109375 + .25) / 2
    assert result.models_per_dataset["d1"]["m"] == pytest.approx(0.109375)
    assert result.models_per_dataset["d2"]["m"] == pytest.approx(0.25)
    assert result.models["m"] == pytest.approx(0.1796875)
    # humans: the single pair, d1: mean(.25, .0625) = .15625; d2: 1.0 -> (.15625 + 1) / 2
    assert result.humans_per_dataset == pytest.approx({"d1": 0.15625, "d2": 1.0})
    assert result.humans == pytest.approx(0.578125)
    assert result.metric == "accuracy_difference"
    # a flat mean over all (model, human, condition) cells would give .15625: the nesting matters
    assert result.models["m"] != pytest.approx(0.15625)


def test_error_consistency_nesting_matches_direct_loops():
    result = aggregate_trials(_rows(SPEC), error_consistency)
    humans = ["subject-01", "subject-02"]
    conditions = {"d1": ["c1", "c2"], "d2": ["c1"]}

    def cell(d, c, s):
        return np.array(SPEC[(d, c, s)], dtype=bool)

    def nested(a, b, d):
        return np.nanmean([error_consistency(cell(d, c, a), cell(d, c, b)) for c in conditions[d]])

    per_dataset = {d: np.nanmean([nested("m", h, d) for h in humans]) for d in conditions}
    assert result.models["m"] == pytest.approx(np.mean(list(per_dataset.values())))
    pair_values = [nested(a, b, "d1") for a, b in combinations(humans, 2)]
    assert result.humans_per_dataset["d1"] == pytest.approx(np.nanmean(pair_values))


def test_row_order_and_input_formats_do_not_matter():
    rows = _rows(SPEC)
    expected = aggregate_trials(rows, "observed_consistency")
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    for table in (shuffled, _columns(shuffled), {k: np.array(v) for k, v in _columns(rows).items()}):
        result = aggregate_trials(table, "observed_consistency")
        assert result.models == pytest.approx(expected.models)
        assert result.humans == pytest.approx(expected.humans)
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(shuffled)
    assert aggregate_trials(frame, "observed_consistency").models == pytest.approx(expected.models)


def test_humans_can_be_named_or_given_by_predicate():
    renamed = [dict(r, subject={"subject-01": "alice", "subject-02": "bob"}.get(r["subject"], r["subject"]))
               for r in _rows(SPEC)]
    expected = aggregate_trials(_rows(SPEC), "accuracy_difference")
    by_list = aggregate_trials(renamed, "accuracy_difference", humans=["alice", "bob"])
    by_test = aggregate_trials(renamed, "accuracy_difference", humans=lambda s: s in ("alice", "bob"))
    assert by_list.models == pytest.approx(expected.models) == by_test.models
    with pytest.raises(ValueError, match="no human subjects"):
        aggregate_trials(renamed, "accuracy_difference")


def test_undefined_error_consistency_is_skipped_or_counted_as_one():
    spec = {
        ("d", "easy", "m"): [1, 1], ("d", "easy", "subject-01"): [1, 1],  # kappa undefined
        ("d", "hard", "m"): [1, 0], ("d", "hard", "subject-01"): [0, 1],  # kappa = -1
    }
    assert aggregate_trials(_rows(spec)).models["m"] == pytest.approx(-1.0)
    assert aggregate_trials(_rows(spec), on_undefined="one").models["m"] == pytest.approx(0.0)
    assert math.isnan(aggregate_trials(_rows(spec)).humans)  # one human: no pair


def test_matches_model_vs_human_pandas_pipeline():
    """Restates get_raw_benchmark_df + format_benchmark_df (bethgelab/model-vs-human) with pandas groupby."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(7)
    humans, models = ["subject-01", "subject-02", "subject-03"], ["resnet", "vit"]
    spec = {}
    for d, conditions in {"d1": ["0", "1", "2"], "d2": ["a", "b"]}.items():
        for c in conditions:
            truth = rng.random(15) < 0.6
            for s in humans + models:
                spec[(d, c, s)] = np.where(rng.random(15) < 0.7, truth, ~truth)
    raw = []
    for (d, c, s1), values in spec.items():
        for s2 in humans:
            if s1 == s2 or (s1 in humans and humans.index(s2) <= humans.index(s1)):
                continue
            for name in ("error_consistency", "accuracy_difference"):
                other = spec[(d, c, s2)]
                value = (error_consistency(values, other, on_undefined="one") if name == "error_consistency"
                         else accuracy_difference(values.mean(), other.mean()))
                raw.append(dict(model=s1, human=s2, dataset=d, metric=name, condition=c, value=value))
    df = pd.DataFrame(raw)
    cnn = df[~df.model.str.startswith("subject-")]
    cnn = cnn.groupby(["model", "human", "dataset", "metric"], as_index=False)["value"].mean()
    cnn = cnn.groupby(["model", "dataset", "metric"], as_index=False)["value"].mean()
    cnn = cnn.groupby(["model", "metric"], as_index=False)["value"].mean()
    hum = df[df.model.str.startswith("subject-")]
    hum = hum.groupby(["model", "human", "dataset", "metric"], as_index=False)["value"].mean()
    hum = hum.groupby(["dataset", "metric"], as_index=False)["value"].mean()
    hum = hum.groupby(["metric"], as_index=False)["value"].mean()
    for name in ("error_consistency", "accuracy_difference"):
        result = aggregate_trials(_rows(spec), name, on_undefined="one")
        for m in models:
            expected = cnn[(cnn.model == m) & (cnn.metric == name)].value.item()
            assert result.models[m] == pytest.approx(expected)
        assert result.humans == pytest.approx(hum[hum.metric == name].value.item())


def test_rejects_inconsistent_tables():
    rows = _rows(SPEC)
    with pytest.raises(ValueError, match="twice"):
        aggregate_trials(rows + [rows[0]])
    mismatched = [dict(r, image_id="other") if i == 0 else r for i, r in enumerate(rows)]
    with pytest.raises(ValueError, match="different images"):
        aggregate_trials(mismatched)
    # accuracy difference does not need matched images
    assert aggregate_trials(mismatched, "accuracy_difference").models["m"] == pytest.approx(0.1796875)
    missing_condition = [r for r in rows if not (r["subject"] == "m" and r["condition"] == "c2")]
    with pytest.raises(ValueError, match="no trials in dataset 'd1', condition"):
        aggregate_trials(missing_condition)


@pytest.mark.parametrize(
    "table, kwargs, error, match",
    [
        ({"subject": ["a"], "dataset": ["d"]}, {}, ValueError, "lack the column"),
        ("trials.csv", {}, TypeError, "dict of equal-length columns"),
        ({**{c: ["x", "y"] for c in TRIAL_COLUMNS}, "correct": [1]}, {}, ValueError, "equal lengths"),
        ({**{c: ["x"] for c in TRIAL_COLUMNS}, "correct": [2]}, {}, ValueError, "0/1"),
        ([], {}, ValueError, "empty"),
        ({c: ["x"] for c in TRIAL_COLUMNS}, {"metric": "kappa"}, ValueError, "metric"),
        ({c: ["x"] for c in TRIAL_COLUMNS}, {"metric": len}, ValueError, "metric"),
        ({c: ["x"] for c in TRIAL_COLUMNS}, {"on_undefined": "zero"}, ValueError, "on_undefined"),
    ],
)
def test_rejects_bad_arguments(table, kwargs, error, match):
    with pytest.raises(error, match=match):
        aggregate_trials(table, **kwargs)


def test_shared_images_compare_only_what_both_saw():
    """images="shared": subject-01 saw a, b, c; the model a, b. On (a, b): right/wrong both times → kappa 1."""
    trials = {
        "subject": ["subject-01"] * 3 + ["model"] * 2 + ["subject-02"] * 3,
        "dataset": ["d"] * 8, "condition": ["c"] * 8,
        "image_id": ["a", "b", "c", "a", "b", "a", "b", "c"],
        "correct": [1, 0, 1, 1, 0, 1, 0, 0],
    }
    with pytest.raises(ValueError, match="different images"):
        aggregate_trials(trials, "error_consistency")
    result = aggregate_trials(trials, "error_consistency", images="shared")
    assert result.models["model"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="images"):
        aggregate_trials(trials, images="some")


def test_shared_images_skip_a_condition_a_subject_lacks():
    """images="shared": subject-02 lost condition c2 (rows left out under strict=false); it shares no image with the model
    there, so that condition is NaN and skipped, as a pair with no common image is; "same" still refuses it."""
    rows = [{"subject": s, "dataset": "d", "condition": c, "image_id": i, "correct": k}
            for s, c, i, k in [("subject-01", "c1", "a", 1), ("subject-01", "c1", "b", 0), ("subject-01", "c2", "c", 1), ("subject-01", "c2", "d", 1),
                               ("model", "c1", "a", 1), ("model", "c1", "b", 1), ("model", "c2", "c", 0), ("model", "c2", "d", 1),
                               ("subject-02", "c1", "a", 0), ("subject-02", "c1", "b", 0)]]
    with pytest.raises(ValueError, match=r"subject 'subject-02' has no trials in dataset 'd', condition\(s\) \['c2'\]"):
        aggregate_trials(rows, "accuracy_difference")
    result = aggregate_trials(rows, "accuracy_difference", images="shared")
    # model vs subject-01: (1 - .5)² in c1, (.5 - 1)² in c2; vs subject-02: (1 - 0)² in c1 alone
    assert result.models["model"] == pytest.approx((0.25 + 1.0) / 2)
    assert result.humans == pytest.approx(0.25)  # the humans share c1 only: (.5 - 0)²


def test_excluded_conditions_leave_the_nesting_first():
    """exclude={d1: [C2]} equals the table without d1's c2 (names case-insensitive); a misspelt condition is named."""
    without = {key: value for key, value in SPEC.items() if key[:2] != ("d1", "c2")}
    expected = aggregate_trials(_rows(without), "accuracy_difference")
    result = aggregate_trials(_rows(SPEC), "accuracy_difference", exclude={"d1": ["C2"], "unused-dataset": ["x"]})
    assert result.models_per_dataset["d1"]["m"] == pytest.approx(0.0625)  # c1 alone: |.5 - .75| ** 2, |.5 - .25| ** 2
    assert result.models == pytest.approx(expected.models) and result.humans == pytest.approx(expected.humans)
    assert result.models != pytest.approx(aggregate_trials(_rows(SPEC), "accuracy_difference").models)
    with pytest.raises(ValueError, match=r"cells \[\('d1', 'c3'\)\] do not occur in the trials"):
        aggregate_trials(_rows(SPEC), exclude={"d1": ["c3"]})
    for wrong in (["d1"], {"d1": "c2"}):
        with pytest.raises(TypeError, match=r"exclude must map each dataset to a list of its conditions, e.g. \{'colour': \['cr'\]\}"):
            aggregate_trials(_rows(SPEC), exclude=wrong)
    with pytest.raises(ValueError, match="every trial is in an excluded condition"):
        aggregate_trials(_rows(SPEC), exclude={"d1": ["c1", "c2"], "d2": ["c1"]})


def test_the_benchmark_exclusions_are_model_vs_humans():
    from perceptual.metrics import MVH_EXCLUDED_CONDITIONS

    assert len(MVH_EXCLUDED_CONDITIONS) == 12 and MVH_EXCLUDED_CONDITIONS["colour"] == ("cr",)
    assert MVH_EXCLUDED_CONDITIONS["eidolonIII"] == ("1-0-10", "16-0-10", "32-0-10", "64-0-10", "128-0-10")


def test_the_benchmark_exclusions_match_the_raw_csvs_spelling_of_numbers():
    # The raw uniform-noise CSVs write "0.00", "0.60", "0.90"; the reference reads them as floats and excludes "0.0", "0.6",
    # "0.9". False-colour's CSVs write "true", the reference "True".
    from perceptual.metrics import condition_key, is_excluded, mvh_exclusions

    assert condition_key("0.00") == condition_key("0.0") == condition_key(0) == condition_key(" 0 ") == "0.0"
    assert condition_key("0.60") == condition_key(0.6) and condition_key("0.05") != condition_key("0.5")
    assert condition_key("True") == condition_key("true") and condition_key("c03") != condition_key("c3")
    # The model agrees with both humans in the kept conditions and differs from them in the excluded ones.
    excluded_answers = {"m": [1, 1], "subject-01": [0, 1], "subject-02": [0, 0]}
    noisy = {("uniform-noise", c, s): excluded_answers[s] for c in ("0.00", "0.60", "0.90") for s in excluded_answers}
    noisy.update({("false-colour", "true", s): excluded_answers[s] for s in excluded_answers})
    noisy.update({(d, c, s): [1, 0] for d, c in (("uniform-noise", "0.10"), ("false-colour", "false")) for s in excluded_answers})
    rows = _rows(noisy)
    exclude = mvh_exclusions((r["dataset"], r["condition"]) for r in rows)
    assert exclude == {"false-colour": ["true"], "uniform-noise": ["0.00", "0.60", "0.90"]}  # as the trials spell them
    assert is_excluded("uniform-noise", "0.60", exclude) and is_excluded("uniform-noise", "0.6", exclude)
    assert not is_excluded("uniform-noise", "0.10", exclude) and not is_excluded("false-colour", "false", exclude)
    kept = [r for r in rows if r["condition"] in ("0.10", "false")]
    for metric in ("accuracy_difference", "observed_consistency"):
        result = aggregate_trials(rows, metric, exclude=exclude)
        assert result.models_per_dataset == aggregate_trials(kept, metric).models_per_dataset
        assert result.models_per_dataset != aggregate_trials(rows, metric).models_per_dataset
    # the reference's own spelling excludes the same cells
    reference = {"uniform-noise": ["0.0", "0.6", "0.9"], "false-colour": ["True"]}
    assert aggregate_trials(rows, "observed_consistency", exclude=reference) == aggregate_trials(kept, "observed_consistency")


def test_ood_accuracy_pools_each_data_set_then_averages_over_data_sets():
    """model-vs-human's OOD accuracy (``get_mean_over_datasets`` with ``SixteenClassAccuracy``): each observer's trials of
    a data set pooled over its kept conditions, the humans as one pooled decision maker, then the plain mean over data sets."""
    from perceptual.metrics import ood_accuracy

    spec = {
        ("A", "x", "m"): [1, 1, 1, 0], ("A", "y", "m"): [1, 0, 0, 0],
        ("A", "x", "subject-01"): [1, 1, 1, 1], ("A", "y", "subject-01"): [1, 1, 0, 0], ("A", "x", "subject-02"): [1, 0],
        ("B", "z", "m"): [0, 0, 0, 1], ("B", "z", "subject-01"): [1, 1, 1, 0],
    }
    result = ood_accuracy(_rows(spec))
    assert result.metric == "ood_accuracy"
    assert result.models_per_dataset == {"A": {"m": pytest.approx(4 / 8)}, "B": {"m": pytest.approx(1 / 4)}}
    # the humans pooled: 7 of 10 trials in A (the mean of the subjects' 6/8 and 1/2 would be 0.625)
    assert result.humans_per_dataset == {"A": pytest.approx(7 / 10), "B": pytest.approx(3 / 4)}
    assert result.models == {"m": pytest.approx((4 / 8 + 1 / 4) / 2)} and result.humans == pytest.approx((7 / 10 + 3 / 4) / 2)
    kept = ood_accuracy(_rows(spec), exclude={"A": ["y"]})
    assert kept.models["m"] == pytest.approx((3 / 4 + 1 / 4) / 2) and kept.humans == pytest.approx((5 / 6 + 3 / 4) / 2)
    assert ood_accuracy(_rows(spec), humans={"subject-01"}).models_per_dataset["A"]["subject-02"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match=r"cells \[\('A', 'w'\)\] do not occur in the trials"):
        ood_accuracy(_rows(spec), exclude={"A": ["w"]})
