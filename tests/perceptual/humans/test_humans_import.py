"""Importing answers without a browser: synthetic MTurk batch results and page downloads, every validation rule,
attention-check exclusion, the human scores, and agreement with an observer."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest

from perceptual.humans import (
    COPY,
    LATER_ATTEMPT,
    human_observer_agreement,
    human_scores,
    load_package,
    markdown_summary,
    observer_choices,
    read_responses,
    scored,
    survey_kappa,
    trial_agreement,
)
from perceptual.observers import make_observer

OPTIONS = {"2afc": ["left", "right"]}


def _submission(package, survey_id, worker, choose):
    """The page's JSON for ``worker`` answering ``survey_id`` with ``choose(unit) -> choice``."""
    units = package.truth[package.truth["survey_id"] == survey_id]
    return {"format": "repalign-survey-responses/1", "package_fingerprint": package.fingerprint, "survey_id": survey_id,
            "worker_id": worker, "answers": [{"trial_id": u.trial_id, "row": u.row, "choice": choose(u)} for u in units.itertuples()]}


def _wrong(unit):
    return {"left": "right", "right": "left", "0": "1", "1": "2", "2": "0"}[unit.answer]


def _write_mturk(path, rows):
    with open(path, "w", newline="") as f:
        fields = ["HITId", "WorkerId", "AssignmentId", "AssignmentStatus", "Input.survey_id", "Input.survey_url", "Answer.responses"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for i, (status, payload) in enumerate(rows):
            writer.writerow({"HITId": f"H{payload.get('survey_id')}", "WorkerId": payload.get("worker_id"), "AssignmentId": f"A{i}",
                             "AssignmentStatus": status, "Input.survey_id": payload.get("survey_id"), "Input.survey_url": "https://host/x",
                             "Answer.responses": json.dumps(payload)})


@pytest.fixture(scope="module")
def package(survey_package):
    return load_package(survey_package)


def test_mturk_batch_results_three_workers_per_survey(package, tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for survey in package.manifest["surveys"]:
        sid = survey["survey_id"]
        rows.append(("Approved", _submission(package, sid, f"good-{sid}", lambda u: u.answer)))
        # 'flaky' answers real trials at random but passes every check
        rows.append(("Submitted", _submission(package, sid, f"flaky-{sid}",
                                              lambda u: u.answer if u.attention_check else str(rng.choice(OPTIONS.get(u.task, ["0", "1", "2"]))))))
        rows.append(("Approved", _submission(package, sid, f"sloppy-{sid}", lambda u: _wrong(u) if u.attention_check else u.answer)))
    path = tmp_path / "Batch_123_batch_results.csv"
    _write_mturk(path, rows)

    responses = read_responses([path], package)
    assert responses.submissions == 3 * len(package.manifest["surveys"]) and responses.excluded == []
    result = human_scores(package, responses, n_boot=300)
    excluded = {a["worker_id"] for a in result["attention"] if a["excluded"]}
    assert excluded == {f"sloppy-{s['survey_id']}" for s in package.manifest["surveys"]}
    reasons = [r for r in result["excluded_counts"] if r.startswith("failed attention checks")]
    assert sum(result["excluded_counts"][r] for r in reasons) == len(package.truth)  # all of the sloppy workers' answers
    # Kept: one perfect and one random worker per survey, so every accuracy is between chance and 1 with the
    # perfect half pulling it up; the intervals contain the estimate.
    for tasks in result["models"].values():
        assert set(tasks) == {"2afc", "clustering", "clustering_hard"}
        for entry in tasks.values():
            assert entry["n_workers"] >= 2 and 0.5 <= entry["accuracy"] <= 1
            low, high = entry["ci_trials"]
            assert low <= entry["accuracy"] <= high
            # over workers: undefined below 6 (resampling 3 workers covered the truth in 70 % of simulated studies)
            low, high = entry["ci_workers"]
            assert (low <= entry["accuracy"] <= high) if entry["n_workers"] >= 6 else (math.isnan(low) and math.isnan(high))
        assert set(tasks["2afc"]["by_seed_type"]) == {"noise", "train"}
    spread = result["agreement"]["2afc"]
    assert spread["worker_accuracy_max"] == 1.0 and spread["n_workers"] == 4 and spread["worker_accuracy_std"] > 0
    assert spread["worker_accuracy_min"] == pytest.approx(min(
        scored(responses, package).query("worker_id.str.startswith('flaky') and task == '2afc' and not attention_check", engine="python")
        .groupby("worker_id")["correct"].mean()))


def test_validation_names_every_exclusion(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    good = _submission(package, sid, "w1", lambda u: u.answer)
    units = list(package.truth[package.truth["survey_id"] == sid].itertuples())
    partial = _submission(package, sid, "w2", lambda u: u.answer)
    partial["answers"] = partial["answers"][:-2] + [{"trial_id": "nope/000", "row": 0, "choice": "left"}, dict(partial["answers"][0], choice="up")]
    rows = [
        ("Approved", good),
        ("Approved", dict(good)),  # the same answers again: a copy of w1's submission
        ("Approved", dict(good, answers=[dict(a, choice=_wrong(u)) for a, u in zip(good["answers"], units)])),  # w1 again, other answers
        ("Approved", dict(good, worker_id="w3", package_fingerprint="0000")),
        ("Approved", dict(good, worker_id="w4", survey_id="2afc-999")),
        ("Rejected", dict(good, worker_id="w5")),
        ("Approved", partial),
    ]
    path = tmp_path / "batch.csv"
    _write_mturk(path, rows)
    with open(path, "a", newline="") as f:  # a row whose answer field is not the page's JSON
        csv.writer(f).writerow(["H", "w6", "A9", "Approved", sid, "u", "{not json"])
        csv.writer(f).writerow(["H", "w8", "A10", "Approved", sid, "u", "[1, 2]"])  # JSON, but not an object
        csv.writer(f).writerow(["H", "w7", "A11", "", sid, "u", json.dumps(dict(good, worker_id="w7"))])  # no status yet: kept
    responses = read_responses([path], package)
    counts = responses.exclusion_counts()
    n = len(good["answers"])
    assert counts[COPY] == n and counts[LATER_ATTEMPT] == n
    assert counts[f"answers from a package with another fingerprint ('0000', this package is {package.fingerprint!r})"] == n
    assert counts["unknown survey id '2afc-999'"] == n
    assert counts["assignment rejected on MTurk"] == n
    assert counts[f"unknown trial id or row for survey {sid}"] == 1
    assert counts["invalid choice (expected one of ('left', 'right'))"] == 1
    assert counts["missing answer"] == 2
    assert any(r.startswith("Answer.responses is not the page's JSON") for r in counts)
    assert counts["Answer.responses is JSON but not the page's object (a list)"] == 1
    assert set(responses.answers["worker_id"]) == {"w1", "w2", "w7"} and len(responses.answers) == 3 * n - 2
    with pytest.raises(ValueError, match="a page CSV needs columns"):
        (tmp_path / "other.csv").write_text("a,b\n1,2\n")
        read_responses([tmp_path / "other.csv"], package)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_package(tmp_path)


def test_page_csv_and_json_downloads_read_alike(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    sub = _submission(package, sid, "w1", lambda u: u.answer)
    (tmp_path / "a.json").write_text(json.dumps(sub))
    frame = pd.DataFrame([{"package_fingerprint": package.fingerprint, "survey_id": sid, "worker_id": "w1", **a} for a in sub["answers"]])
    frame.to_csv(tmp_path / "a.csv", index=False)
    from_json = read_responses([tmp_path / "a.json"], package).answers.drop(columns="source")
    from_csv = read_responses([tmp_path / "a.csv"], package).answers.drop(columns="source")
    pd.testing.assert_frame_equal(from_json, from_csv)


def test_a_truncated_json_download_names_its_file(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    text = json.dumps(_submission(package, sid, "w1", lambda u: u.answer))
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"cut\.json is not valid JSON.*cut short"):
        read_responses([tmp_path / "cut.json"], package)


def test_fleiss_kappa_per_survey_on_constructed_answers():
    # 4 items, 3 raters, 2 categories; items 0-1 unanimous, items 2-3 split 2:1 -> P̄ = (1 + 1 + 1/3 + 1/3)/4 = 2/3,
    # p = (6/12, 6/12), P̄e = 1/2, kappa = (2/3 - 1/2) / (1 - 1/2) = 1/3.
    choices = {0: "lll", 1: "rrr", 2: "llr", 3: "rrl"}
    rows = [{"survey_id": "s", "trial_id": f"t{i}", "row": 0, "worker_id": f"w{k}", "choice": {"l": "left", "r": "right"}[c], "attention_check": False}
            for i, cs in choices.items() for k, c in enumerate(cs)]
    assert survey_kappa(pd.DataFrame(rows))["s"] == pytest.approx(1 / 3)
    one = pd.DataFrame(rows[:3])
    assert math.isnan(survey_kappa(one.assign(worker_id="w0"))["s"])
    # a fourth worker who answered only t0: the units every worker answered shrank to t0, where all agree (NaN); the
    # incomplete worker is left out instead
    partial = rows + [{"survey_id": "s", "trial_id": "t0", "row": 0, "worker_id": "w9", "choice": "left", "attention_check": False}]
    assert survey_kappa(pd.DataFrame(partial))["s"] == pytest.approx(1 / 3)


def test_human_observer_agreement_same_order_treats_ties_as_ties():
    """Sorted by score, tied models fell in name order: humans {a: .5, b: .5} against an observer that ranks a above b
    had "the same order", against one that ranks b above a not."""
    assert not human_observer_agreement({"a": 0.5, "b": 0.5, "c": 0.3}, {"a": 0.6, "b": 0.4, "c": 0.1})["same_order"]
    assert not human_observer_agreement({"a": 0.5, "b": 0.5, "c": 0.3}, {"a": 0.4, "b": 0.6, "c": 0.1})["same_order"]
    assert human_observer_agreement({"a": 0.5, "b": 0.5, "c": 0.3}, {"a": 0.7, "b": 0.7, "c": 0.1})["same_order"]
    assert human_observer_agreement({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 0.8, "b": 0.5, "c": 0.1})["same_order"]


def test_order_effects_need_an_order_of_each_participants_own(package, tmp_path, caplog):
    """With trial_order=fixed the halves hold different trials: their difference was reported as learning or fatigue."""
    import copy

    fixed = copy.copy(package)
    fixed.manifest = {**package.manifest, "config": {**package.manifest["config"], "trial_order": "fixed"}}
    sid = next(s["survey_id"] for s in package.manifest["surveys"] if s["survey_id"].startswith("2afc"))
    sub = _submission(package, sid, "w", lambda u: u.answer)
    for k, a in enumerate(sub["answers"]):
        a["position"] = k + 1
    (tmp_path / "a.json").write_text(json.dumps(sub))
    with caplog.at_level("WARNING", logger="perceptual"):
        result = human_scores(fixed, read_responses([tmp_path / "a.json"], package), n_boot=50)
    assert result["order_effects"] == {} and "no order effects" in caplog.text


def test_human_observer_agreement_exact_values():
    same = human_observer_agreement({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 0.8, "b": 0.5, "c": 0.1, "d": 0.7})
    assert same["models"] == ["a", "b", "c"] and same["kendall_tau"] == pytest.approx(1.0) and same["spearman_rho"] == pytest.approx(1.0)
    assert same["same_order"]
    flipped = human_observer_agreement({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 0.1, "b": 0.5, "c": 0.8})
    assert flipped["kendall_tau"] == pytest.approx(-1.0) and not flipped["same_order"]
    assert math.isnan(human_observer_agreement({"a": 1.0}, {"a": 1.0})["kendall_tau"])
    # an undefined observer score (null in a report.json read back) is a missing model, not a TypeError or a NaN tau
    assert human_observer_agreement({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 0.8, "b": None, "c": math.nan, "d": 0.7})["models"] == ["a"]
    assert human_observer_agreement({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 0.8, "b": None, "c": 0.1})["kendall_tau"] == pytest.approx(1.0)


def test_trial_agreement_with_an_observer_on_the_package_images(package):
    observer = make_observer("pixel-l2")
    choices = observer_choices(package, observer)
    assert len(choices) == len(package.truth)
    # Attention checks are identical images: the observer answers them all correctly.
    merged = choices.merge(package.truth, on=["trial_id", "row"])
    assert merged.loc[merged["attention_check"], "credit"].eq(1).all()
    # A "human" who copies the observer agrees with it everywhere (ties aside); one who always disagrees never does.
    table = merged.assign(worker_id="copy", choice=merged["choice"])
    copy = trial_agreement(table, choices)
    untied = choices["choice"].isin(["left", "right", "0", "1", "2"])
    assert copy["per_answer"] == pytest.approx(untied[~merged["attention_check"]].mean())
    contrary = merged.assign(choice=[{"left": "right", "right": "left", "0": "1", "1": "2", "2": "0"}.get(c, "0") for c in merged["choice"]])
    assert trial_agreement(contrary, choices)["per_answer"] == 0.0


def test_a_clustering_check_answered_only_where_right_fails(package, tmp_path):
    """A worker who skips the rows of a clustering check they would get wrong does not pass it."""
    from perceptual.humans import attention_failures

    survey = next(s["survey_id"] for s in package.manifest["surveys"] if s["task"] == "clustering")
    check = package.truth[(package.truth["survey_id"] == survey) & package.truth["attention_check"]]["trial_id"].iloc[0]
    complete = _submission(package, survey, "complete", lambda u: u.answer)
    partial = {**complete, "worker_id": "partial",
               "answers": [a for a in complete["answers"] if not (a["trial_id"] == check and a["row"] > 0)]}
    for sub in (partial, complete):
        (tmp_path / f"{sub['worker_id']}.json").write_text(json.dumps(sub))
    table = scored(read_responses([tmp_path / "partial.json", tmp_path / "complete.json"], package), package)
    failures = attention_failures(table, package).set_index("worker_id")
    assert failures.loc["complete", "failed"] == 0 and not failures.loc["complete", "excluded"]
    assert failures.loc["partial", "failed"] == 1 and failures.loc["partial", "excluded"]


def test_a_tied_human_vote_favours_no_side():
    """Two workers split on each unit: an observer answering "left" everywhere and one answering "right" agree equally
    with the (tied) majority, 1/2 each, where breaking ties alphabetically gave 1 and 0."""
    units = pd.DataFrame({"trial_id": ["t0", "t0", "t1", "t1", "t2", "t2"], "row": 0, "attention_check": False,
                          "choice": ["left", "right", "right", "left", "left", "left"], "worker_id": ["a", "b"] * 3})
    left = trial_agreement(units, pd.DataFrame({"trial_id": ["t0", "t1", "t2"], "row": 0, "choice": "left"}))
    right = trial_agreement(units, pd.DataFrame({"trial_id": ["t0", "t1", "t2"], "row": 0, "choice": "right"}))
    assert left["majority"] == pytest.approx((0.5 + 0.5 + 1) / 3) and right["majority"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert left["n_tied_units"] == right["n_tied_units"] == 2 and left["n_units"] == 3


def test_human_columns_of_an_earlier_package_do_not_survive_a_new_import():
    """Two packages must not be mixed in one Table 1: the new import names only its own package."""
    from perceptual.humans import with_human_columns

    report = {"models": {"standard": {"2afc": {"mean": 0.4}}, "robust": {"2afc": {"mean": 0.8}}}}
    first = with_human_columns(report, {"package": "A", "kept_submissions": 3, "excluded_counts": {},
                                        "models": {"standard": {"2afc": {"accuracy": 0.1}}, "robust": {"2afc": {"accuracy": 0.2}}}})
    second = with_human_columns(first, {"package": "B", "kept_submissions": 2, "excluded_counts": {},
                                        "models": {"robust": {"2afc": {"accuracy": 0.9}}}})
    assert second["humans"]["package"] == "B" and second["models"]["robust"]["humans"]["2afc"]["accuracy"] == 0.9
    assert "humans" not in second["models"]["standard"]  # package A's number is gone, not passed off as B's
    # a controversial set is labelled by itself, not by a model of the report: its answers get a section of their own
    both = with_human_columns(report, {"package": "C", "kept_submissions": 2, "excluded_counts": {},
                                       "models": {"standard": {"2afc": {"accuracy": 0.5}},
                                                  "standard-vs-robust": {"controversial": {"accuracy": 0.7}}}})
    assert both["humans"]["controversial"] == {"standard-vs-robust": {"accuracy": 0.7}} and both["models"]["standard"]["humans"]
    with pytest.raises(ValueError, match=r"survey models \['vgg'\] are not in the measurement report"):
        with_human_columns(report, {"package": "D", "kept_submissions": 1, "excluded_counts": {}, "models": {"vgg": {"2afc": {"accuracy": 0.5}}}})


def test_the_interval_over_trials_resamples_whole_clustering_trials(package, tmp_path):
    """A clustering trial's rows share its images: resampling rows made the interval too narrow."""
    from perceptual.tasks import bootstrap_interval

    def answer(unit):  # right on whole trials only: every row of a trial right or every row wrong
        return unit.answer if (unit.attention_check or sum(map(ord, unit.trial_id)) % 2) else _wrong(unit)

    for survey in package.manifest["surveys"]:
        (tmp_path / f"{survey['survey_id']}.json").write_text(json.dumps(_submission(package, survey["survey_id"], "w1", answer)))
    responses = read_responses(sorted(tmp_path.glob("*.json")), package)
    data = human_scores(package, responses, n_boot=400, seed=0)
    table = scored(responses, package)
    for model, tasks in data["models"].items():
        entry = tasks["clustering"]
        rows = table[(table["model"] == model) & (table["task"] == "clustering") & ~table["attention_check"].astype(bool)]
        expected = bootstrap_interval(rows["correct"].to_numpy(float), rows["trial_id"].to_numpy(), n_boot=400, seed=0)
        assert entry["ci_trials"] == pytest.approx(list(expected))


def test_a_prolific_export_excludes_returned_rejected_and_timed_out_submissions(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    answers = tmp_path / "answers"
    answers.mkdir()

    def page_download(worker, session=""):
        sub = dict(_submission(package, sid, worker, lambda u: u.answer), session_id=session)
        (answers / f"{worker}-{session or 'none'}.json").write_text(json.dumps(sub))
        return len(sub["answers"])

    n = page_download("P-approved", "S1")
    page_download("P-returned", "S2")
    page_download("P-timed-out")  # no session id: the participant's one status decides
    page_download("P-retook", "S4")  # returned once, then approved: each session by its own status
    page_download("P-retook", "S5")
    page_download("P-two-studies")  # two studies with different statuses and no session id: which one is unknown
    page_download("lab-worker", "")  # not on Prolific at all
    page_download("P-other-study", "S9")  # finished this study (its export not given) after returning another one
    export = pd.DataFrame([
        {"Submission id": "S1", "Participant id": "P-approved", "Status": "APPROVED"},
        {"Submission id": "S2", "Participant id": "P-returned", "Status": "RETURNED"},
        {"Submission id": "S3", "Participant id": "P-timed-out", "Status": "TIMED-OUT"},
        {"Submission id": "S4", "Participant id": "P-retook", "Status": "RETURNED"},
        {"Submission id": "S5", "Participant id": "P-retook", "Status": "AWAITING REVIEW"},
        {"Submission id": "S6", "Participant id": "P-two-studies", "Status": "APPROVED"},
        {"Submission id": "S7", "Participant id": "P-two-studies", "Status": "REJECTED"},
        {"Submission id": "S8", "Participant id": "P-other-study", "Status": "RETURNED"},
    ])
    export.to_csv(tmp_path / "prolific_export_abc.csv", index=False)

    responses = read_responses(sorted(answers.iterdir()) + [tmp_path / "prolific_export_abc.csv"], package)
    counts = responses.exclusion_counts()
    assert counts["submission returned on Prolific"] == 2 * n and counts["submission timed-out on Prolific"] == n
    assert counts["the participant's Prolific submissions are APPROVED, REJECTED and these answers carry no session id to tell which "
                  "(add SESSION_ID={{%SESSION_ID%}} to the study URL)"] == n
    assert set(responses.answers["worker_id"]) == {"P-approved", "P-retook", "lab-worker", "P-other-study"} and len(responses.answers) == 4 * n
    assert responses.submissions == 8  # the export's rows are statuses, not submissions
    # the page's CSV download carries the session id as well; Prolific's older lower-case export headers read alike
    frame = pd.DataFrame([{"package_fingerprint": package.fingerprint, "survey_id": sid, "worker_id": "P-returned", "session_id": "S2", **a}
                          for a in _submission(package, sid, "P-returned", lambda u: u.answer)["answers"]])
    frame.to_csv(tmp_path / "page.csv", index=False)
    export.rename(columns=lambda c: c.lower().replace(" ", "_")).to_csv(tmp_path / "old_export.csv", index=False)
    assert read_responses([tmp_path / "page.csv", tmp_path / "old_export.csv"], package).exclusion_counts() == {"submission returned on Prolific": n}


def _timed(package, survey_id, worker, seconds_per_trial):
    """A correct submission whose page recorded ``rt_ms`` as a real page does: from when the trial was shown, so a
    clustering trial's rows take 1/3, 2/3 and all of the trial's time."""
    sub = _submission(package, survey_id, worker, lambda u: u.answer)
    rows = package.truth.groupby("trial_id")["row"].nunique()
    for a in sub["answers"]:
        a["rt_ms"] = 1000 * seconds_per_trial * (a["row"] + 1) / rows[a["trial_id"]]
    return sub


def test_response_times_are_read_back_and_speeders_excluded_on_request(package, tmp_path, caplog):
    surveys = [s["survey_id"] for s in package.manifest["surveys"]]
    two_afc, clustering = surveys[0], next(s for s in surveys if s.startswith("clustering-"))
    submissions = [_timed(package, two_afc, "careful", 2.5), _timed(package, clustering, "careful", 6.0),
                   _timed(package, two_afc, "speeder", 0.2), _submission(package, two_afc, "untimed", lambda u: u.answer)]
    submissions[0]["answers"][0]["rt_ms"] = "soon"  # not a time: the answer stays, its time does not
    submissions[2]["answers"][0]["rt_ms"] = -5000  # a clock change
    (tmp_path / "answers.json").write_text(json.dumps(submissions))
    responses = read_responses([tmp_path / "answers.json"], package)
    assert responses.excluded == [] and responses.answers["rt_ms"].isna().sum() == 2 + len(submissions[3]["answers"])

    everyone = human_scores(package, responses, n_boot=50)
    speed = {(a["worker_id"], a["survey_id"]): a for a in everyone["attention"]}
    assert not any(a["excluded"] or a["too_fast"] for a in speed.values())
    # A clustering trial's time is its last row's rt_ms: 6 s, not the rows' median of 4 s.
    assert speed[("careful", two_afc)]["median_rt_ms"] == 2500 and speed[("careful", clustering)]["median_rt_ms"] == 6000
    assert speed[("speeder", two_afc)]["median_rt_ms"] == 200 and math.isnan(speed[("untimed", two_afc)]["median_rt_ms"])
    assert everyone["agreement"]["clustering"]["median_rt_ms"] == 6000
    # The median over the kept trials: as many timed trials at 2.5 s (careful) as at 0.2 s (speeder).
    assert everyone["agreement"]["2afc"]["median_rt_ms"] == (2500 + 200) / 2

    with caplog.at_level("WARNING", logger="perceptual"):
        strict = human_scores(package, responses, n_boot=50, min_median_rt_ms=500)
    assert "1 of 4 submissions carry no valid rt_ms" in caplog.text
    kept = {(a["worker_id"], a["survey_id"]) for a in strict["attention"] if not a["excluded"]}
    assert kept == {("careful", two_afc), ("careful", clustering), ("untimed", two_afc)}
    assert strict["excluded_counts"] == {"answered too fast (median time per trial below 500 ms)": len(submissions[2]["answers"])}
    assert strict["agreement"]["2afc"]["median_rt_ms"] == 2500
    assert "median time per trial at least 500 ms" in markdown_summary(strict) and "| 2.5 |" in markdown_summary(strict)
    for bad in (-1, math.nan, "1s", True):
        with pytest.raises(ValueError, match="min_median_rt_ms must be >= 0"):
            human_scores(package, responses, min_median_rt_ms=bad)


def test_partial_submissions_are_kept_unless_min_answered_asks_for_more(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    complete = _submission(package, sid, "complete", lambda u: u.answer)
    checks = set(package.truth.loc[package.truth["attention_check"], "trial_id"])
    real = [a for a in complete["answers"] if a["trial_id"] not in checks]
    gave_up = real[len(real) // 2:]  # every check passed, half of the real trials left unanswered
    partial = {**complete, "worker_id": "partial", "answers": [a for a in complete["answers"] if a not in gave_up]}
    (tmp_path / "a.json").write_text(json.dumps([complete, partial]))
    responses = read_responses([tmp_path / "a.json"], package)
    share = len(partial["answers"]) / len(complete["answers"])

    everyone = human_scores(package, responses, n_boot=50)
    answered = {a["worker_id"]: a for a in everyone["attention"]}
    assert answered["partial"]["answered"] == pytest.approx(share) and answered["complete"]["answered"] == 1.0
    assert not any(a["excluded"] or a["incomplete"] for a in answered.values())
    strict = human_scores(package, responses, n_boot=50, min_answered=1)
    assert {a["worker_id"] for a in strict["attention"] if a["excluded"]} == {"partial"}
    assert strict["excluded_counts"] == {"answered too little of the survey (less than min_answered 100% of its answers)": len(partial["answers"]),
                                         "missing answer": len(gave_up)}
    assert "at least 100% of a survey answered" in markdown_summary(strict)
    assert not any(a["excluded"] for a in human_scores(package, responses, n_boot=50, min_answered=share)["attention"])
    for bad in (-0.1, 1.5, math.nan, "half", True):
        with pytest.raises(ValueError, match=r"min_answered must be a share of a survey's answers in \[0, 1\]"):
            human_scores(package, responses, min_answered=bad)


def test_a_participant_who_stops_before_the_checks_is_kept_and_the_unreached_checks_are_counted(package, tmp_path):
    """Unreached checks counted as failed: a participant who gave up before the page's (randomly placed) checks was
    excluded as failing them, so the default min_answered=0 kept almost no partial submission."""
    sid = package.manifest["surveys"][0]["survey_id"]
    complete = _submission(package, sid, "complete", lambda u: u.answer)
    checks = set(package.truth.loc[package.truth["attention_check"], "trial_id"])
    n_checks = package.truth.loc[package.truth["attention_check"] & (package.truth["survey_id"] == sid), "trial_id"].nunique()
    real = [a for a in complete["answers"] if a["trial_id"] not in checks]
    trial_ids = list(dict.fromkeys(a["trial_id"] for a in real))
    placed = [{**a, "position": trial_ids.index(a["trial_id"]) + 1} for a in real]  # the page's place of each trial: checks last
    stopped = trial_ids[: len(trial_ids) // 2]
    early = {**complete, "worker_id": "early", "answers": [a for a in placed if a["trial_id"] in stopped]}  # stopped before any check
    careless = {**complete, "worker_id": "careless", "answers": [
        {**a, "choice": "right" if a["choice"] == "left" else "left"} if a["trial_id"] in checks else a for a in complete["answers"]]}
    # Every trial answered, the checks with a choice the page never offers: they were reached, so they failed.
    garbled = {**complete, "worker_id": "garbled", "answers": placed + [
        {**a, "choice": "none", "position": len(trial_ids) + k + 1} for k, a in enumerate(a for a in complete["answers"] if a["trial_id"] in checks)]}
    # Without positions (a hand-made file) nothing can be told unseen: the missing checks failed.
    unplaced = {**complete, "worker_id": "unplaced", "answers": [a for a in real if a["trial_id"] in stopped]}
    (tmp_path / "a.json").write_text(json.dumps([complete, early, careless, garbled, unplaced]))
    result = human_scores(package, read_responses([tmp_path / "a.json"], package), n_boot=50)
    attention = {a["worker_id"]: a for a in result["attention"]}
    assert n_checks >= 1 and attention["early"]["unreached"] == n_checks and attention["early"]["failed"] == 0
    assert not attention["early"]["excluded"] and not attention["complete"]["excluded"]
    assert attention["careless"]["excluded"] and attention["careless"]["failed"] == n_checks and attention["careless"]["unreached"] == 0
    for worker in ("garbled", "unplaced"):
        assert attention[worker]["excluded"] and attention[worker]["failed"] == n_checks and attention[worker]["unreached"] == 0, worker
    assert f"1 of them stopped before {n_checks} of their attention checks (unreached, not failed" in markdown_summary(result)
    assert "stopped before" not in markdown_summary(human_scores(package, read_responses([tmp_path / "a.json"], package), n_boot=50,
                                                                  min_answered=1))


def test_a_submission_failing_checks_and_too_fast_is_counted_once(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    sub = _timed(package, sid, "both", 0.1)
    for a in sub["answers"]:
        a["choice"] = "left" if a["choice"] == "right" else "right"
    (tmp_path / "a.json").write_text(json.dumps(sub))
    result = human_scores(package, read_responses([tmp_path / "a.json"], package), n_boot=50, min_median_rt_ms=500)
    (reason, count), = result["excluded_counts"].items()
    assert reason.startswith("failed attention checks") and count == len(sub["answers"])


def test_page_csv_downloads_carry_response_times_and_positions(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    sub = _timed(package, sid, "w1", 1.5)
    for k, a in enumerate(reversed(sub["answers"])):  # the participant saw the trials in reverse (2AFC: one answer per trial)
        a["position"] = k + 1
    sub["answers"][0]["position"] = 0  # positions count from 1: not a position
    (tmp_path / "a.json").write_text(json.dumps(sub))
    frame = pd.DataFrame([{"package_fingerprint": package.fingerprint, "survey_id": sid, "worker_id": "w1", "session_id": "", **a} for a in sub["answers"]])
    frame.to_csv(tmp_path / "a.csv", index=False)
    from_json = read_responses([tmp_path / "a.json"], package).answers.drop(columns="source")
    from_csv = read_responses([tmp_path / "a.csv"], package).answers.drop(columns="source")
    pd.testing.assert_frame_equal(from_json, from_csv)
    assert (from_csv["rt_ms"] == 1500).all()
    n = len(sub["answers"])
    assert math.isnan(from_csv["position"].iloc[0]) and list(from_csv["position"].iloc[1:]) == list(range(n - 1, 0, -1))


def test_order_effects_split_each_participants_survey_at_its_middle(package, tmp_path):
    sid = next(s["survey_id"] for s in package.manifest["surveys"] if s["survey_id"].startswith("2afc"))
    n = next(s["n_trials"] for s in package.manifest["surveys"] if s["survey_id"] == sid)
    sub = _submission(package, sid, "tiring", lambda u: u.answer)
    checks = set(package.truth.query("attention_check")["trial_id"])
    for k, a in enumerate(sub["answers"]):  # seen in the package's order; right in the first half, wrong after (checks always right)
        a["position"] = k + 1
        if k + 1 > n / 2 and a["trial_id"] not in checks:
            a["choice"] = {"left": "right", "right": "left"}[a["choice"]]
    (tmp_path / "a.json").write_text(json.dumps(sub))
    result = human_scores(package, read_responses([tmp_path / "a.json"], package), n_boot=50)
    effect = result["order_effects"]["2afc"]
    first_real = sum(1 for k, a in enumerate(sub["answers"]) if k + 1 <= n / 2 and a["trial_id"] not in checks)
    assert effect["first_half"]["accuracy"] == 1.0 and effect["second_half"]["accuracy"] == 0.0 and effect["difference"] == -1.0
    assert effect["first_half"]["n_answers"] == first_real
    # one worker: every draw is that worker, an interval of zero width that "excluded" 0; below 6 workers there is none
    assert all(math.isnan(v) for v in effect["ci_difference"]) and effect["n_workers"] == 1
    assert "| 2afc | 100.0 | 0.0 | -100.0 | [–, –] |" in markdown_summary(result)
    # three tiring and three steady workers: the paired draws range between all tiring (-1) and all steady (0)
    files = []
    for worker in ("tiring-1", "tiring-2", "tiring-3", "steady-1", "steady-2", "steady-3"):
        answers = _submission(package, sid, worker, lambda u: u.answer)
        for k, a in enumerate(answers["answers"]):
            a["position"] = k + 1
            if worker.startswith("tiring") and k + 1 > n / 2 and a["trial_id"] not in checks:
                a["choice"] = {"left": "right", "right": "left"}[a["choice"]]
        files.append(tmp_path / f"{worker}.json")
        files[-1].write_text(json.dumps(answers))
    six = human_scores(package, read_responses(files, package), n_boot=200)["order_effects"]["2afc"]
    low, high = six["ci_difference"]
    assert six["difference"] == -0.5 and six["n_workers"] == 6 and -1.0 <= low < -0.5 < high <= 0.0
    # answers without positions (older pages) give no split
    (tmp_path / "b.json").write_text(json.dumps(_submission(package, sid, "old", lambda u: u.answer)))
    assert human_scores(package, read_responses([tmp_path / "b.json"], package), n_boot=50)["order_effects"] == {}


def _page_csv(path, package, sub):
    """The page's CSV download of ``sub`` (the columns of survey.js's responsesCsv; no assignment id, no times of day)."""
    pd.DataFrame([{"package_fingerprint": package.fingerprint, "survey_id": sub["survey_id"], "worker_id": sub["worker_id"], "session_id": "",
                   **a} for a in sub["answers"]]).to_csv(path, index=False)


def test_a_rejected_mturk_assignment_takes_the_page_downloads_of_its_answers_with_it(package, tmp_path):
    from perceptual.pipelines.humans import response_files

    sid = package.manifest["surveys"][0]["survey_id"]
    cheat = _submission(package, sid, "W1", lambda u: u.answer)
    honest = _submission(package, sid, "W2", lambda u: u.answer)
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / f"responses-{sid}-W1.json").write_text(json.dumps(cheat))
    _page_csv(answers / f"responses-{sid}-W1.csv", package, cheat)
    _write_mturk(tmp_path / "Batch_1_batch_results.csv", [("Rejected", cheat), ("Approved", honest)])
    n = len(cheat["answers"])
    for order in ([answers, tmp_path / "Batch_1_batch_results.csv"], [tmp_path / "Batch_1_batch_results.csv", answers]):
        responses = read_responses(response_files([str(p) for p in order]), package)
        assert set(responses.answers["worker_id"]) == {"W2"}  # nothing of the rejected worker counts, from any file
        assert responses.exclusion_counts() == {"assignment rejected on MTurk": 3 * n}


def test_of_two_attempts_the_earliest_is_kept_and_copies_are_not_counted_as_attempts(package, tmp_path):
    from perceptual.pipelines.humans import response_files

    sid = package.manifest["surveys"][0]["survey_id"]
    first = dict(_submission(package, sid, "W1", lambda u: u.answer), started_at="2026-05-01T10:00:00.000Z")
    second = dict(_submission(package, sid, "W1", lambda u: "left" if u.task == "2afc" else "0"), started_at="2026-05-01T11:00:00.000Z")
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / f"responses-{sid}-W1.json").write_text(json.dumps(first))
    (answers / f"responses-{sid}-W1 (1).json").write_text(json.dumps(second))  # a browser's name for the second download: read first
    _page_csv(answers / f"responses-{sid}-W1 (1).csv", package, second)  # the second attempt's CSV: a copy of it, without started_at
    _write_mturk(tmp_path / "Batch_1_batch_results.csv", [("Approved", first)])  # the first attempt's MTurk row: a copy
    files = response_files([str(answers), str(tmp_path / "Batch_1_batch_results.csv")])
    assert files[0].name == f"responses-{sid}-W1 (1).csv"
    responses = read_responses(files, package)
    n = len(first["answers"])
    assert responses.answers["source"].str.endswith(f"responses-{sid}-W1.json").all()  # the 10:00 attempt, though read later
    assert (responses.answers["choice"].to_numpy() == [a["choice"] for a in first["answers"]]).all()
    assert responses.exclusion_counts() == {LATER_ATTEMPT: n, COPY: 2 * n}
    # the headline counts attempts apart from copies: "4 submissions read, 1 kept" looked like 3 rejected attempts
    data = human_scores(package, responses, n_boot=50)
    assert data["submissions"] == 4 and data["copies"] == 2
    assert "4 submissions read (2 attempts; 2 further copies of them, such as a JSON and a CSV download of one attempt, counted once)" in (
        markdown_summary(data))
    # without start times (the CSV downloads alone) the first file read is kept
    _page_csv(tmp_path / "first.csv", package, first)
    only_csv = read_responses([answers / f"responses-{sid}-W1 (1).csv", tmp_path / "first.csv"], package)
    assert only_csv.answers["source"].str.endswith("W1 (1).csv").all() and only_csv.exclusion_counts() == {LATER_ATTEMPT: n}


def test_a_page_csv_carries_its_start_time_so_an_earlier_csv_attempt_wins(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    monday = _submission(package, sid, "W1", lambda u: u.answer)
    tuesday = dict(_submission(package, sid, "W1", lambda u: "left" if u.task == "2afc" else "0"), started_at="2026-05-05T09:00:00.000Z")
    frame = pd.DataFrame([{"package_fingerprint": package.fingerprint, "survey_id": sid, "worker_id": "W1", "session_id": "", **a,
                           "started_at": "2026-05-04T09:00:00.000Z"} for a in monday["answers"]])
    frame.to_csv(tmp_path / "monday.csv", index=False)
    (tmp_path / "tuesday.json").write_text(json.dumps(tuesday))
    responses = read_responses([tmp_path / "tuesday.json", tmp_path / "monday.csv"], package)
    assert responses.answers["source"].str.endswith("monday.csv").all()
    assert responses.exclusion_counts() == {LATER_ATTEMPT: len(monday["answers"])}


def test_a_rejected_assignment_leaves_the_workers_approved_assignment_of_the_survey_alone(package, tmp_path):
    """A worker who did a survey again in a republished batch: the rejection was keyed by worker and survey, and took
    the approved assignment's answers with the rejected one's."""
    sid = package.manifest["surveys"][0]["survey_id"]
    careless = dict(_submission(package, sid, "W1", lambda u: "left" if u.task == "2afc" else "0"), started_at="2026-05-01T10:00:00.000Z")
    careful = dict(_submission(package, sid, "W1", lambda u: u.answer), started_at="2026-06-01T10:00:00.000Z")
    _write_mturk(tmp_path / "batches.csv", [("Rejected", careless), ("Approved", careful)])  # assignments A0 and A1
    (tmp_path / "page.json").write_text(json.dumps({**careful, "assignment_id": "A1"}))  # the approved one's page download: a copy
    (tmp_path / "rejected-page.json").write_text(json.dumps({**careless, "assignment_id": "A0"}))
    responses = read_responses([tmp_path / "batches.csv", tmp_path / "page.json", tmp_path / "rejected-page.json"], package)
    n = len(careful["answers"])
    assert (responses.answers["choice"].to_numpy() == [a["choice"] for a in careful["answers"]]).all()
    assert responses.exclusion_counts() == {"assignment rejected on MTurk": 2 * n, COPY: n}


def test_two_attempts_with_the_same_answers_keep_the_earliest_not_the_first_read(package, tmp_path, caplog):
    """The same answers twice, a month apart: taken for copies of one attempt, the first file read was kept (the later,
    faster one), and the minimum time per trial then dropped the worker, whose first attempt was slow enough."""
    sid = package.manifest["surveys"][0]["survey_id"]
    early = dict(_timed(package, sid, "W1", 3.0), started_at="2026-01-01T10:00:00.000Z")
    late = dict(_timed(package, sid, "W1", 0.4), started_at="2026-03-01T10:00:00.000Z")
    (tmp_path / "a-late.json").write_text(json.dumps(late))
    (tmp_path / "b-early.json").write_text(json.dumps(early))
    _page_csv(tmp_path / "c-early.csv", package, early)  # the early attempt's CSV download keeps no start time: a copy of it
    responses = read_responses([tmp_path / "a-late.json", tmp_path / "b-early.json", tmp_path / "c-early.csv"], package)
    n = len(early["answers"])
    assert responses.answers["source"].str.endswith("b-early.json").all()
    assert responses.exclusion_counts() == {LATER_ATTEMPT: n, COPY: n}
    scores = human_scores(package, responses, n_boot=20, min_median_rt_ms=1000)
    assert not any("too fast" in str(reason) for reason in scores["excluded_counts"])


def test_a_rejection_in_another_package_leaves_this_packages_answers_alone(package, tmp_path):
    """Survey ids repeat across packages (a pilot's 2afc-000 and the study's): a worker rejected in the pilot keeps the
    study's approved answers, and the pilot's row counts as another package's."""
    sid = package.manifest["surveys"][0]["survey_id"]
    study = _submission(package, sid, "W1", lambda u: u.answer)
    pilot = dict(study, package_fingerprint="pilot00000000000")
    _write_mturk(tmp_path / "study.csv", [("Approved", study)])
    _write_mturk(tmp_path / "pilot.csv", [("Rejected", pilot)])
    responses = read_responses([tmp_path / "pilot.csv", tmp_path / "study.csv"], package)
    n = len(study["answers"])
    assert len(responses.answers) == n and set(responses.answers["worker_id"]) == {"W1"}
    assert responses.exclusion_counts() == {f"answers from a package with another fingerprint ('pilot00000000000', this package is {package.fingerprint!r})": n}


def test_an_invalid_answer_is_counted_once(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    sub = _submission(package, sid, "W1", lambda u: "up")
    sub["answers"] = sub["answers"][:-1]  # and one unit left unanswered
    (tmp_path / "a.json").write_text(json.dumps(sub))
    counts = read_responses([tmp_path / "a.json"], package).exclusion_counts()
    tasks = set(package.truth.loc[package.truth["survey_id"] == sid, "task"])
    valid = ("0", "1", "2") if tasks != {"2afc"} else ("left", "right")
    assert counts == {f"invalid choice (expected one of {valid})": len(sub["answers"]), "missing answer": 1}


def test_a_row_that_is_not_a_whole_number_is_no_row(package, tmp_path):
    """int() read a hand-edited row 0.9 as row 0 and True as row 1; 1.0 (a spreadsheet's column with blanks) and "1"
    are still row 1."""
    sid = next(s["survey_id"] for s in package.manifest["surveys"] if s["task"] == "clustering")
    sub = _submission(package, sid, "W1", lambda u: u.answer)
    rows = [a["row"] for a in sub["answers"]]
    assert rows[:3] == [0, 1, 2]
    for answer, row in zip(sub["answers"][:5], [0.9, True, 2.0, "0", "x"]):
        answer["row"] = row
    (tmp_path / "a.json").write_text(json.dumps(sub))
    responses = read_responses([tmp_path / "a.json"], package)
    unknown = f"unknown trial id or row for survey {sid}"
    counts = responses.exclusion_counts()
    assert counts[unknown] == 3  # 0.9, True and "x"; 2.0 is row 2 and "0" is row 0 of their trials
    assert counts.get("repeated answer within a submission", 0) == 0


@pytest.mark.parametrize("content", ["null", '["a", "b"]', "3"])
def test_json_that_is_not_a_page_download_names_its_file(package, tmp_path, content):
    (tmp_path / "odd.json").write_text(content)
    with pytest.raises(ValueError, match=r"odd\.json holds JSON that is not the survey page's download"):
        read_responses([tmp_path / "odd.json"], package)


def test_prolific_statuses_in_either_spelling_and_participants_without_answers(package, tmp_path):
    """Prolific writes SCREENED OUT with a space and TIMED-OUT with a hyphen; participants it would pay who sent no answers
    are listed (the completion code is readable in the page)."""
    sid = package.manifest["surveys"][0]["survey_id"]
    for worker in ("P-screened", "P-screened-hyphen", "P-ok"):
        (tmp_path / f"{worker}.json").write_text(json.dumps(_submission(package, sid, worker, lambda u: u.answer)))
    pd.DataFrame([
        {"Participant id": "P-screened", "Status": "SCREENED OUT"}, {"Participant id": "P-screened-hyphen", "Status": "screened-out"},
        {"Participant id": "P-ok", "Status": "APPROVED"}, {"Participant id": "P-silent", "Status": "AWAITING REVIEW"},
        {"Participant id": "P-gone", "Status": "Timed out"},
    ]).to_csv(tmp_path / "export.csv", index=False)
    files = sorted(tmp_path.glob("*.json")) + [tmp_path / "export.csv"]
    responses = read_responses(files, package)
    n = len(package.truth[package.truth["survey_id"] == sid])
    assert responses.exclusion_counts() == {"submission screened-out on Prolific": 2 * n}
    assert set(responses.answers["worker_id"]) == {"P-ok"} and responses.prolific_without_answers == ["P-silent"]
    data = human_scores(package, responses, n_boot=50)
    assert data["prolific_without_answers"] == ["P-silent"] and "P-silent" in markdown_summary(data)


@pytest.mark.parametrize("name, content, message", [
    ("empty.csv", b"", r"empty\.csv is empty: was the download cut short"),
    ("empty.json", b"  \n", r"empty\.json is empty"),
    ("excel.csv", "package_fingerprint,survey_id,worker_id,trial_id,row,choice\nx,s,Jos\u00e9,t,0,left\n".encode("cp1252"),
     r"excel\.csv is not UTF-8 text.*CSV UTF-8"),
    ("semi.csv", b"package_fingerprint;survey_id;worker_id;trial_id;row;choice\nx;s;w;t;0;left\n", r"semi\.csv: .*separated by semicolons"),
    ("ragged.csv", b'a,b\n1,"2\n', r"ragged\.csv is not a readable CSV"),
])
def test_an_unreadable_answer_file_is_named_with_what_to_do(package, tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_responses([tmp_path / name], package)


def test_macos_resource_forks_and_hidden_folders_in_an_answers_folder_are_skipped(package, tmp_path):
    """Unzipping a Mac's archive leaves ._name next to every download and a __MACOSX copy: binary files that stopped the
    import with "not UTF-8 text ... re-saved by a spreadsheet?"."""
    from perceptual.pipelines.humans import response_files

    sid = package.manifest["surveys"][0]["survey_id"]
    answers = tmp_path / "answers"
    (answers / "__MACOSX").mkdir(parents=True)
    (answers / ".ipynb_checkpoints").mkdir()
    (answers / "W1.json").write_text(json.dumps(_submission(package, sid, "W1", lambda u: u.answer)))
    for hidden in ("._W1.json", "__MACOSX/._W1.json", ".ipynb_checkpoints/W1-checkpoint.json"):
        (answers / hidden).write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \xff\xfe")
    assert [p.name for p in response_files([str(answers)])] == ["W1.json"]
    assert set(read_responses(response_files([str(answers)]), package).answers["worker_id"]) == {"W1"}
    with pytest.raises(ValueError, match=r"\._W1\.json is not UTF-8 text.*not a download of the survey page"):  # named on its own: read, and told
        read_responses([answers / "._W1.json"], package)


def test_csv_files_joined_into_one_drop_their_repeated_headers(package, tmp_path):
    """``cat a.csv b.csv > all.csv`` left b's header as a row: a submission of worker 'worker_id' to survey 'survey_id'."""
    sid = package.manifest["surveys"][0]["survey_id"]
    for worker in ("W1", "W2"):
        _page_csv(tmp_path / f"{worker}.csv", package, _submission(package, sid, worker, lambda u: u.answer))
    joined = tmp_path / "all.csv"
    joined.write_text((tmp_path / "W1.csv").read_text() + (tmp_path / "W2.csv").read_text())
    responses = read_responses([joined], package)
    assert set(responses.answers["worker_id"]) == {"W1", "W2"} and responses.excluded == []
    first = (tmp_path / "W1.csv").read_text().splitlines()
    header = first[0].split(",")
    other_order = pd.read_csv(tmp_path / "W2.csv", dtype=str, keep_default_na=False)[header[::-1]].to_csv(index=False)
    joined.write_text("\n".join(first) + "\n" + other_order)
    with pytest.raises(ValueError, match=rf"all\.csv joins CSV files with different columns .* at line {len(first) + 1}"):
        read_responses([joined], package)


@pytest.mark.parametrize("change, reason", [
    ({"answers": "left,right"}, "answers is not a list of objects"),
    ({"answers": [["t", 0, "left"]]}, "answers is not a list of objects"),
    ({"answers": 3}, "answers is not a list of objects"),
    ({"survey_id": ["2afc-000"]}, "survey_id is a list, not text"),
    ({"worker_id": {"id": "w"}, "answers": 7}, "worker_id is a dict, not text; answers is not a list of objects"),
])
def test_a_download_of_another_shape_is_excluded_with_its_reason_and_the_rest_kept(package, tmp_path, change, reason):
    sid = package.manifest["surveys"][0]["survey_id"]
    good = _submission(package, sid, "W1", lambda u: u.answer)
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "odd.json").write_text(json.dumps({**_submission(package, sid, "W2", lambda u: u.answer), **change}))
    responses = read_responses([tmp_path / "good.json", tmp_path / "odd.json"], package)
    assert set(responses.answers["worker_id"]) == {"W1"} and len(responses.answers) == len(good["answers"])
    [(counted, _)] = responses.exclusion_counts().items()
    assert counted == f"{reason} (not the page's download)"
    assert {e["source"] for e in responses.excluded} == {str(tmp_path / "odd.json")}


def test_an_mturk_row_of_another_shape_is_excluded_not_fatal(package, tmp_path):
    sid = package.manifest["surveys"][0]["survey_id"]
    good = _submission(package, sid, "W1", lambda u: u.answer)
    _write_mturk(tmp_path / "batch.csv", [("Submitted", good), ("Submitted", {**good, "worker_id": "W2", "answers": {"t": "left"}})])
    responses = read_responses([tmp_path / "batch.csv"], package)
    assert set(responses.answers["worker_id"]) == {"W1"}
    assert responses.exclusion_counts() == {"answers is not a list of objects (not the page's download)": 1}


def test_an_empty_list_of_responses_is_refused():
    """responses=[] wrote results of 0 submissions (over earlier ones, on a rerun) and exited 0."""
    from perceptual.pipelines.humans import response_files

    with pytest.raises(ValueError, match=r"no responses given: pass responses=\[FILE_OR_FOLDER"):
        response_files([])
