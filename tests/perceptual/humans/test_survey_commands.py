"""``python -m stimuli survey`` and ``python -m perceptual humans`` from their Hydra configs: the package's structure
(ground truth kept out of the pages, counterbalancing, a balanced mix of models, checks as the paper built them, the
platform CSV), refusals before work, and the import that adds the Human columns to a measurement report."""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import math
import re
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module
from PIL import Image

from perceptual.humans import load_package
from perceptual.measure import load_report, write_report
from perceptual.pipelines import COMMANDS
from perceptual.pipelines.humans import run as humans_run
from stimuli.commands import COMMANDS as STIMULI_COMMANDS
from stimuli.commands import survey_command
from stimuli.survey import build_survey

from .conftest import MODELS


def decoded(path) -> bytes:
    """A served image's pixels, what a person sees (each served file's bytes are its own)."""
    with Image.open(path) as image:
        return np.asarray(image).tobytes()


FIRST = {"2afc": "left", "clustering": "0", "clustering_hard": "0"}


def _compose(name, overrides):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def package_dir(inversion_sets, tmp_path_factory):
    out = tmp_path_factory.mktemp("cmd") / "package"
    sets = ",".join(str(s.path) for s in inversion_sets.values())
    cfg = _compose("stimuli_survey", [f"sets=[{sets}]", f"out={out}", "trials_per_survey=24", "attention_rate=0.2", "base_url=https://example.org/study"])
    survey_command(cfg)
    return out


def test_registered():
    assert "survey" in STIMULI_COMMANDS and COMMANDS["humans"] == "perceptual.pipelines.humans"


def test_pages_hold_no_ground_truth(package_dir, inversion_sets):
    package = load_package(package_dir)
    manifest = package.manifest
    set_ids = {i for s in inversion_sets.values() for i in s.ids}
    for survey in manifest["surveys"]:
        folder = package_dir / "surveys" / survey["survey_id"]
        page = (folder / "index.html").read_text()
        data = json.loads(re.search(r'<script type="application/json" id="survey-data">(.*?)</script>', page, re.S).group(1).replace("<\\/", "</"))
        assert set(data) == {"package", "survey_id", "task", "prompt", "completion_code", "format", "shuffle", "trials"}
        for trial in data["trials"]:
            assert set(trial) <= {"trial_id", "task", "query", "options", "columns", "rows"}
        # no set id (which names roles: "t0003.result.noise") and no truth word anywhere in the page
        assert not any(i in page for i in set_ids)
        for word in ("answer", "target", "attention_check", "seed_type", "standard", "robust"):
            assert f'"{word}"' not in page
        images = sorted(p.name for p in (folder / "images").iterdir())
        assert all(re.fullmatch(r"[0-9a-f]{20}\.png", n) for n in images)
        shown = {n for t in data["trials"] for n in [t.get("query")] + t.get("options", []) + t.get("columns", []) + t.get("rows", []) if n}
        assert shown == set(images)  # self-contained: every image it shows, nothing else


def test_trials_counterbalanced_checks_and_mixed_models(package_dir):
    package = load_package(package_dir)
    truth = package.truth
    real = truth[(truth["task"] == "2afc") & ~truth["attention_check"]]
    assert abs((real["answer"] == "left").mean() - 0.5) <= 0.05  # sides balanced per model within one trial

    def pixels(t, name):
        return decoded(package_dir / "surveys" / t["survey_id"] / "images" / name)

    for t in package.manifest["trials"]:
        if t["attention_check"] and t["task"] == "2afc":
            assert pixels(t, t["images"]["query"]) in [pixels(t, o) for o in t["images"]["options"]]  # the query IS one option
        elif t["attention_check"]:
            rows = {pixels(t, row["query_file"]) for row in t["rows"]}
            assert len(t["rows"]) == 6 and rows == {pixels(t, c) for c in t["images"]["columns"]}  # the rows ARE the columns
        elif t["task"] == "2afc":
            assert pixels(t, t["images"]["query"]) not in [pixels(t, o) for o in t["images"]["options"]]
    # No two served files share their bytes: a script hashing the files found every check (the query's file equal to
    # an option's) and every target (its file recurring across trials) although the names never repeat.
    served = list((package_dir / "surveys").glob("*/images/*.png"))
    assert len({hashlib.sha256(path.read_bytes()).digest() for path in served}) == len(served)
    checks_by_model = Counter((t["survey_id"], t["model"]) for t in package.manifest["trials"] if t["attention_check"] and t["task"] == "2afc")
    surveys_2afc = sorted(s["survey_id"] for s in package.manifest["surveys"] if s["task"] == "2afc")
    # each model's checks spread over the surveys (ties went by position: every standard check to survey 0)
    assert all(any((sid, model) in checks_by_model for sid in surveys_2afc) for model in MODELS)
    assert any(len({m for (sid, m) in checks_by_model if sid == survey}) == 2 for survey in surveys_2afc)
    for survey in package.manifest["surveys"]:
        shown = [name for t in package.manifest["trials"] if t["survey_id"] == survey["survey_id"]
                 for name in ([t["images"].get("query")] + t["images"].get("options", []) + t["images"].get("columns", [])
                              + t["images"].get("rows", [])) if name]
        assert len(shown) == len(set(shown))  # one name per appearance
    for survey in package.manifest["surveys"]:
        assert survey["models"] == ["robust", "standard"] and survey["n_attention_checks"] >= 1
        models = [t["model"] for t in package.manifest["trials"] if t["survey_id"] == survey["survey_id"] and not t["attention_check"]]
        assert abs(models.count("standard") - models.count("robust")) <= 1
    with open(package_dir / "input.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["survey_id"] for r in rows] == [s["survey_id"] for s in package.manifest["surveys"]]
    # base_url is the address of the surveys/ folder alone, which holds every page and nothing of the ground truth
    assert all(r["survey_url"] == f"https://example.org/study/{r['survey_id']}/index.html" for r in rows)
    assert all((package_dir / "surveys" / r["survey_url"].removeprefix("https://example.org/study/")).is_file() for r in rows)
    assert all(r["prolific_completion_url"].endswith(f"cc={r['completion_code']}") for r in rows)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sides_are_balanced_within_every_survey(inversion_sets, tmp_path, seed):
    """Sides balanced over a set were not balanced per survey after the deal: seed 2 gave a survey whose two checks
    were both on the left, so a participant pressing left on every trial passed all of them."""
    manifest = build_survey(inversion_sets, tmp_path / "p", tasks=("2afc",), trials_per_survey=8, attention_rate=0.2, seed=seed)
    targets = {i for s in inversion_sets.values() for i in s.manifest.loc[s.manifest["role"] == "target", "id"]}
    for survey in manifest["surveys"]:
        trials = [t for t in manifest["trials"] if t["survey_id"] == survey["survey_id"]]
        groups = {"checks": [t for t in trials if t["attention_check"]]}
        for model in ("standard", "robust"):
            groups[model] = [t for t in trials if t["model"] == model and not t["attention_check"]]
        for name, group in groups.items():
            left = sum(t["rows"][0]["answer"] == "left" for t in group)
            assert abs(left - (len(group) - left)) <= 1, (survey["survey_id"], name, left, len(group))
        for t in trials:  # a flipped trial keeps its answer on its image: the target sits on the answer's side
            answer, other = ("left_id", "right_id") if t["rows"][0]["answer"] == "left" else ("right_id", "left_id")
            assert t[answer] in targets and t[other] not in targets


def test_sides_stay_balanced_per_model_and_seed_type_over_the_package(inversion_sets, tmp_path):
    """Human scores are reported per seed type: balancing each survey by model alone gave 5 of 6 robust noise-seed
    targets on the left and 5 of 6 train-seed ones on the right, for every seed, so a participant's side bias moved the
    two seed types' accuracies apart. Each survey balances by (model, seed type) too, the odd trial to the side behind."""
    worst = 0
    for seed in range(8):
        manifest = build_survey(inversion_sets, tmp_path / f"p{seed}", tasks=("2afc",), trials_per_survey=7, attention_rate=0.2, seed=seed)
        real = [t for t in manifest["trials"] if not t["attention_check"]]
        for model in ("standard", "robust"):
            for seed_type in ("noise", "train"):
                group = [t for t in real if t["model"] == model and t["rows"][0]["seed_type"] == seed_type]
                left = sum(t["rows"][0]["answer"] == "left" for t in group)
                worst = max(worst, abs(2 * left - len(group)))
            for survey in manifest["surveys"]:  # and still balanced per model within every survey
                group = [t for t in real if t["model"] == model and t["survey_id"] == survey["survey_id"]]
                assert abs(2 * sum(t["rows"][0]["answer"] == "left" for t in group) - len(group)) <= 1
    assert worst <= 2  # 6 trials per (model, seed type): 4/2 at worst (it was 5/1 for every seed)


def test_refusals_before_work(inversion_sets, package_dir, tmp_path):
    sets = dict(inversion_sets)
    with pytest.raises(FileExistsError, match="overwrite"):
        build_survey(sets, package_dir)
    with pytest.raises(ValueError, match="unknown tasks"):
        build_survey(sets, tmp_path / "p", tasks=["3afc"])
    for bad in (1.5, -1):  # numpy's SeedSequence: a traceback, and "expected non-negative integer" naming no key
        with pytest.raises(ValueError, match=rf"seed must be a whole number >= 0, got {bad}"):
            build_survey(sets, tmp_path / "p", seed=bad)
    with pytest.raises(ValueError, match="attention_rate"):
        build_survey(sets, tmp_path / "p", attention_rate=1.0)
    for bad in (0, 2.5, "40", True):  # 2.5 was taken: surveys of 2.5 trials made a fractional slice fail mid-build
        with pytest.raises(ValueError, match=f"trials_per_survey must be a whole number >= 1, got {bad!r}"):
            build_survey(sets, tmp_path / "p", trials_per_survey=bad)
    with pytest.raises(ValueError, match="labels"):
        paths = ",".join(str(s.path) for s in inversion_sets.values())
        survey_command(_compose("stimuli_survey", [f"sets=[{paths}]", "labels=[a,a]", f"out={tmp_path / 'q'}"]))
    for bad in ("std|v2", ".hidden", 0.5):  # "|" broke humans.md's table; a number never matched the report's text label
        with pytest.raises(ValueError, match="must be a plain, non-empty string"):
            build_survey({bad: next(iter(sets.values()))}, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_sets_one_package_cannot_hold_are_refused_before_work(inversion_sets, tmp_path):
    """The same set under two labels counted its trials twice as two models; sets of different image shapes were packaged,
    and the import then failed in torch.stack when an observer reread the pages."""
    standard, robust = inversion_sets.values()
    with pytest.raises(ValueError, match="same stimulus set"):
        build_survey({"a": standard, "b": standard.path}, tmp_path / "twice", tasks=["2afc"])
    larger = dataclasses.replace(robust, images=torch.nn.functional.interpolate(robust.images, scale_factor=2), fingerprint="other")
    with pytest.raises(ValueError, match="differ in shape .*standard 3x32x32, robust 3x64x64"):
        build_survey({"standard": standard, "robust": larger}, tmp_path / "sizes", tasks=["2afc"])
    assert not (tmp_path / "twice").exists() and not (tmp_path / "sizes").exists()


@pytest.mark.parametrize("base_url", ["example.org/study", "/srv/study", "", None])
def test_a_base_url_without_scheme_and_host_is_refused(inversion_sets, tmp_path, base_url):
    """input.csv's survey_url became 'example.org/study/2afc-000/index.html', which MTurk opens relative to its own site."""
    with pytest.raises(ValueError, match="not an absolute address"):
        build_survey(dict(inversion_sets), tmp_path / "p", tasks=["2afc"], base_url=base_url)


def test_the_placeholder_base_url_builds_with_a_warning(inversion_sets, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="stimuli"):
        manifest = build_survey(dict(inversion_sets), tmp_path / "p", tasks=["2afc"])
    assert "placeholder" in caplog.text
    assert manifest["surveys"][0]["survey_url"].startswith("https://YOUR-HOST/PATH/")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stimuli"):
        build_survey(dict(inversion_sets), tmp_path / "q", tasks=["2afc"], base_url="file:///srv/study/surveys")
    assert "placeholder" not in caplog.text


def test_number_labels_and_a_bare_set_path_on_the_command_line(inversion_sets, tmp_path):
    """labels=[0.5,1.0] arrive as numbers, kept as text to match a measure report; sets=PATH was read one character at a time."""
    first, second = (str(s.path) for s in inversion_sets.values())
    manifest = survey_command(_compose("stimuli_survey", [f"sets=[{first},{second}]", "labels=[0.5,1.0]", "tasks=2afc", f"out={tmp_path / 'a'}"]))
    assert sorted(manifest["sets"]) == ["0.5", "1.0"]
    manifest = survey_command(_compose("stimuli_survey", [f"sets={first}", "labels=solo", "tasks=[2afc]", f"out={tmp_path / 'b'}"]))
    assert list(manifest["sets"]) == ["solo"]


def test_humans_command_adds_human_columns_to_a_measure_report(package_dir, tmp_path):
    package = load_package(package_dir)
    answers = tmp_path / "answers"
    answers.mkdir()
    for k, worker in enumerate(("w1", "w2", "w3")):
        for survey in package.manifest["surveys"]:
            units = package.truth[package.truth["survey_id"] == survey["survey_id"]]
            sub = {"package_fingerprint": package.fingerprint, "survey_id": survey["survey_id"], "worker_id": worker,
                   # w3 picks the first option on every real trial; all pass the checks
                   "answers": [{"trial_id": u.trial_id, "row": u.row, "choice": u.answer if (k < 2 or u.attention_check) else FIRST[u.task]}
                               for u in units.itertuples()]}
            (answers / f"{worker}-{survey['survey_id']}.json").write_text(json.dumps(sub))
    report_dir = tmp_path / "report"
    per_observer = lambda a, b: {"pixel-l2": {"overall": {"accuracy": a}}, "ssim": {"overall": {"accuracy": b}}}  # noqa: E731
    measure = {"data": "digits", "n_targets": 6, "seed_types": ["noise", "train"], "observers": ["pixel-l2", "ssim"],
               "observer_variants": {"pixel-l2": "weight-free", "ssim": "weight-free"}, "judged_on": "8-bit images",
               "models": {"standard": {"2afc": {"mean": 0.4, "std": 0.1}, "clean_accuracy": 0.9, "robust_accuracy": 0.1,
                                       "per_observer": {"2afc": per_observer(0.45, 0.35)}},
                          "robust": {"2afc": {"mean": 0.8, "std": 0.05}, "clean_accuracy": 0.8, "robust_accuracy": 0.5,
                                     "per_observer": {"2afc": per_observer(0.85, 0.75)}}}}
    write_report(measure, report_dir)
    cfg = _compose("humans", [f"package={package_dir}", f"responses=[{answers}]", f"measure_report={report_dir}", "n_boot=200", "observers=[pixel-l2]"])
    data = humans_run(cfg)
    assert data["kept_submissions"] == 3 * len(package.manifest["surveys"]) and data["excluded_counts"] == {}
    assert set(data["measure_ranking"]["2afc"]) == {"pixel-l2", "ssim"}
    assert data["reliability"]["pixel-l2"]["trial_agreement"]["2afc"]["n_answers"] == 3 * (package.truth.query("task == '2afc'")["attention_check"] == 0).sum()
    table = (report_dir / "report.md").read_text()
    assert "| Human 2AFC (%) | Human clustering (%) | Human hard clustering (%) |" in table
    standard = data["models"]["standard"]["2afc"]["accuracy"]
    assert f"| {100 * standard:.1f} |" in table.split("| standard |")[1].split("\n")[0]
    assert "Human 2AFC" in (report_dir / "report.html").read_text()
    assert load_report(report_dir)["models"]["robust"]["humans"]["2afc"]["n_workers"] == 3
    # which stimuli the people saw travels with their numbers: a rerun of measure that remakes a set drops that set's columns
    seen = {label: info["fingerprint"] for label, info in package.manifest["sets"].items()}
    assert data["sets"] == seen and load_report(report_dir)["humans"]["sets"] == seen
    results = package_dir / "results"
    assert (results / "accuracy.png").stat().st_size > 1000 and json.loads((results / "humans.json").read_text())["package"] == package.fingerprint
    assert "Fleiss' kappa" in (results / "humans.md").read_text() and "Median time per trial" in (results / "humans.md").read_text()
    for bad in ("-1", "1s"):
        with pytest.raises(ValueError, match="min_median_rt_ms must be >= 0"):
            humans_run(_compose("humans", [f"package={package_dir}", f"responses=[{answers}]", f"min_median_rt_ms={bad}"]))


def test_humans_command_refuses_a_report_about_other_sets_before_reading_answers(package_dir, tmp_path):
    """People's numbers go beside a report's only when it measured the very sets they saw; the report's labels and set
    fingerprints are checked before any answer is read or judged, and nothing is written."""
    package = load_package(package_dir)
    seen = {label: info["fingerprint"] for label, info in package.manifest["sets"].items()}
    entry = lambda fingerprint: {"2afc": {"mean": 0.5, "std": 0.1}, "set_fingerprint": fingerprint}  # noqa: E731
    header = {"data": "digits", "n_targets": 6, "seed_types": ["noise"], "observers": [], "observer_variants": {}, "judged_on": "8-bit images"}
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "none.json").write_text("[]")
    for models, message in (
        ({"standard": entry(seen["standard"]), "robust": entry("0" * 16)}, r"not the sets the measurement report measured \(robust: survey"),
        ({"standard": entry(seen["standard"])}, r"survey models \['robust'\] are not in the measurement report"),
    ):
        report = tmp_path / f"report-{len(models)}"
        write_report({**header, "models": models}, report)
        out = tmp_path / f"results-{len(models)}"
        cfg = _compose("humans", [f"package={package_dir}", f"responses=[{answers}]", f"measure_report={report}", f"out={out}", "observers=[]"])
        with pytest.raises(ValueError, match=message):
            humans_run(cfg)
        assert not out.exists()
    report = tmp_path / "report-same"  # the same sets, and a report from before set fingerprints were recorded, pass
    write_report({**header, "models": {"standard": entry(seen["standard"]), "robust": {"2afc": {"mean": 0.5, "std": 0.1}}}}, report)
    humans_run(_compose("humans", [f"package={package_dir}", f"responses=[{answers}]", f"measure_report={report}", f"out={tmp_path / 'ok'}", "observers=[]"]))
    assert load_report(report)["humans"]["sets"] == seen


def test_controversial_survey_asks_which_direction_looks_closer_to_the_origin(controversial_set, inversion_sets, tmp_path):
    from perceptual.humans import human_scores, read_responses

    with pytest.raises(ValueError, match="add controversial to tasks"):
        build_survey({"pair": controversial_set}, tmp_path / "no")
    out = tmp_path / "pkg"
    build_survey({"pair": controversial_set, "standard": inversion_sets["standard"]}, out, tasks=["2afc", "controversial"], attention_rate=0.2,
                 trials_per_survey=100)
    package = load_package(out)
    trials = [t for t in package.manifest["trials"] if t["task"] == "controversial"]
    real = [t for t in trials if not t["attention_check"]]
    assert len(real) == 4 * 2 and len(trials) == 10  # one per (origin, start); round(0.2 * 8 / 0.8) = 2 checks
    assert sum(t["rows"][0]["answer"] == "left" for t in real) == 4  # AB on the left exactly half of the time
    for t in real:
        ab = t["options"] if "options" in t else [t["left_id"], t["right_id"]]
        assert t["query_id"] == t["left_id"].split(".")[0] and {d.split(".")[1] for d in ab} == {"AB", "BA"}
    for t in trials:
        if t["attention_check"]:
            served = out / "surveys" / t["survey_id"] / "images"
            assert decoded(served / t["images"]["query"]) in [decoded(served / o) for o in t["images"]["options"]]
    page = (out / "surveys" / "controversial-000" / "index.html").read_text()
    assert ".AB." not in page and ".BA." not in page and "Which option is perceptually closer to the query?" in page
    # a worker who always picks model A's stimulus (and passes the checks) prefers A every time
    units = package.truth[package.truth["survey_id"] == "controversial-000"]
    sub = {"package_fingerprint": package.fingerprint, "survey_id": "controversial-000", "worker_id": "w",
           "answers": [{"trial_id": u.trial_id, "row": 0, "choice": u.answer} for u in units.itertuples()]}
    (tmp_path / "w.json").write_text(json.dumps(sub))
    result = human_scores(package, read_responses([tmp_path / "w.json"], package), n_boot=50)
    assert result["models"]["pair"]["controversial"]["accuracy"] == 1.0


def test_overwrite_replaces_a_survey_package_and_nothing_else(inversion_sets, tmp_path):
    sets = dict(inversion_sets)
    with pytest.raises(ValueError, match=r"tasks \['2afc'\] are listed more than once"):
        build_survey(sets, tmp_path / "twice", tasks=["2afc", "2afc"])
    results = tmp_path / "results"
    results.mkdir()
    (results / "important.txt").write_text("months of work")
    with pytest.raises(FileExistsError, match="is not a survey package"):
        build_survey(sets, results, tasks=["2afc"], overwrite=True)
    assert (results / "important.txt").read_text() == "months of work"
    package = tmp_path / "package"
    build_survey(sets, package, tasks=["2afc"], seed=0)
    (package / "answers").mkdir()  # collected answers kept inside the package folder
    with pytest.raises(FileExistsError, match=r"holds \['answers'\] besides the survey package"):
        build_survey(sets, package, tasks=["2afc"], seed=1, overwrite=True)
    (package / "answers").rmdir()
    before = load_package(package).fingerprint
    build_survey(sets, package, tasks=["2afc"], seed=1, overwrite=True)
    assert load_package(package).fingerprint != before


def test_the_same_survey_command_again_keeps_the_package_and_another_is_refused(inversion_sets, tmp_path, caplog):
    """A rerun of the same build (a script, a requeued job) was refused as if it were another package."""
    sets = dict(inversion_sets)
    package = tmp_path / "package"
    first = build_survey(sets, package, tasks=["2afc"], seed=0)
    page = package / "surveys" / "2afc-000" / "index.html"
    served = page.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="stimuli"):
        again = build_survey(sets, package, tasks=["2afc"], seed=0)
    assert again == json.loads(json.dumps(first)) and "already holds this survey package" in caplog.text
    assert page.stat().st_mtime_ns == served  # the served pages were not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]  # no scratch folder left
    with pytest.raises(FileExistsError, match=r"differs in config\.seed, .*fingerprint.*overwrite=true"):
        build_survey(sets, package, tasks=["2afc"], seed=1)
    with pytest.raises(FileExistsError, match=r"differs in config\.title.*overwrite=true"):
        build_survey(sets, package, tasks=["2afc"], seed=0, title="Another study")
    assert load_package(package).fingerprint == first["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]


def test_a_lone_controversial_check_is_not_always_on_the_same_side(controversial_set):
    from stimuli.survey import _controversial_records

    check_sides = set()
    for seed in range(12):
        records = _controversial_records("pair", controversial_set, seed, attention_rate=0.1)  # 8 real trials, 1 check
        checks = [r for r in records if r["attention_check"]]
        real = [r for r in records if not r["attention_check"]]
        assert len(checks) == 1 and sum(r["rows"][0]["answer"] == "left" for r in real) == 4
        check_sides.add(checks[0]["rows"][0]["answer"])
    assert check_sides == {"left", "right"}  # P(one side in 12 seeds) = 2 ** -11


@pytest.mark.parametrize("real, checks, per_survey", [(21, 1, 11), (19, 3, 11), (7, 5, 4)])
def test_no_survey_holds_more_trials_than_asked(real, checks, per_survey):
    from stimuli.survey import _deal

    records = [{"model": "ab"[i % 2], "attention_check": False, "n": i} for i in range(real)]
    records += [{"model": "ab"[i % 2], "attention_check": True, "n": real + i} for i in range(checks)]
    hands = _deal(records, math.ceil(len(records) / per_survey), np.random.default_rng(0))
    assert max(map(len, hands)) <= per_survey
    assert sorted(r["n"] for hand in hands for r in hand) == list(range(real + checks))
    assert max(sum(r["attention_check"] for r in hand) for hand in hands) - min(sum(r["attention_check"] for r in hand) for hand in hands) <= 1


@pytest.mark.parametrize("counts", [(6, 24), (3, 12, 12), (10, 10)])
def test_every_survey_mixes_the_models_when_the_sets_differ_in_size(counts):
    """Cutting a round robin into pieces left the later surveys with the larger set's model alone."""
    from stimuli.survey import _deal

    records = [{"model": m, "attention_check": False, "n": (m, i)} for m, count in zip("abc", counts) for i in range(count)]
    n_surveys = min(counts)
    hands = _deal(records, n_surveys, np.random.default_rng(0))
    for hand in hands:
        assert {r["model"] for r in hand} == set("abc"[:len(counts)])
        for m, count in zip("abc", counts):  # each model's share of a hand is its share of the trials, to one trial
            assert abs(sum(r["model"] == m for r in hand) - count / n_surveys) <= 1
    assert sorted(r["n"] for hand in hands for r in hand) == sorted(r["n"] for r in records)


def test_a_package_is_published_with_the_umask_and_replaced_whole(inversion_sets, tmp_path, monkeypatch):
    """mkdtemp's 0700 made the package folder unreadable to a web server running as another user."""
    import os
    import stat

    package = tmp_path / "package"
    old = os.umask(0o022)
    try:
        build_survey(dict(inversion_sets), package, tasks=["2afc"], seed=0)
    finally:
        os.umask(old)
    assert stat.S_IMODE(package.stat().st_mode) == 0o755
    before = load_package(package).fingerprint

    def fail(*args, **kwargs):
        raise RuntimeError("interrupted while writing")

    monkeypatch.setattr("stimuli.survey._write_package", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        build_survey(dict(inversion_sets), package, tasks=["2afc"], seed=1, overwrite=True)
    assert load_package(package).fingerprint == before  # the old package stays whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]  # no staging folder left behind


def test_each_survey_announces_its_own_share_of_a_full_surveys_minutes(package_dir, inversion_sets, tmp_path):
    """Every page said "about 20 minutes", also a survey that the deal left with half the trials of a full one; and a
    clustering page (6 judgements a trial) announced less than a 2AFC page with fewer judgements."""
    from stimuli.survey import announced_minutes

    assert [announced_minutes(20, n, 40) for n in (40, 21, 20, 1)] == [20, 11, 10, 1]
    with pytest.raises(ValueError, match="trials_per_survey >= 1"):
        announced_minutes(20, 10, 0)
    manifest = json.loads((package_dir / "manifest.json").read_text())  # 15 trials per survey, 20 minutes per full one
    per_survey = manifest["config"]["trials_per_survey"]
    announced = pd.read_csv(package_dir / "input.csv").set_index("survey_id")["minutes"]
    assert announced.nunique() > 1  # the fixture's tasks do not fill their surveys alike
    judgements = {sid: sum(len(t["rows"]) for t in manifest["trials"] if t["survey_id"] == sid) for sid in announced.index}
    for survey in manifest["surveys"]:
        assert survey["n_judgements"] == judgements[survey["survey_id"]] >= survey["n_trials"]
        expected = math.ceil(20 * judgements[survey["survey_id"]] / per_survey)
        assert survey["minutes"] == announced[survey["survey_id"]] == expected
        page = (package_dir / "surveys" / survey["survey_id"] / "index.html").read_text()
        assert f"It takes about {expected} minutes" in page
    # a survey holds at most trials_per_survey judgements: a clustering trial has 6 rows, so 15 // 6 = 2 trials (before: 15
    # trials, 90 judgements, six times a full survey's minutes)
    for survey in manifest["surveys"]:
        assert survey["n_judgements"] <= per_survey and survey["minutes"] <= 20
        if survey["task"].startswith("clustering"):
            assert survey["n_trials"] <= per_survey // 6
    from stimuli.survey import trials_per_page

    six_rows, one_row = [{"rows": [{}] * 6}], [{"rows": [{}]}]
    assert [trials_per_page(six_rows, n) for n in (40, 12, 10, 1)] == [6, 2, 2, 1]  # two at least (one may be a check), never above n
    assert [trials_per_page(one_row, n) for n in (40, 1)] == [40, 1]
    for bad in (0, -5, "20", True):
        with pytest.raises(ValueError, match="minutes"):
            build_survey(dict(inversion_sets), tmp_path / "bad", minutes=bad)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("per_survey, rate", [(9, 0.05), (5, 0.05), (2, 0.05), (7, 0.2)])
def test_every_survey_gets_an_attention_check_when_checks_are_asked_for(inversion_sets, tmp_path, per_survey, rate):
    """Fewer checks than surveys (or a rate that rounds to none on a few trials) left some surveys without any check,
    where a participant pressing one key throughout could never be excluded."""
    manifest = build_survey(inversion_sets, tmp_path / "p", tasks=("2afc", "clustering"), trials_per_survey=per_survey, attention_rate=rate)
    assert all(s["n_attention_checks"] >= 1 for s in manifest["surveys"])
    assert max(s["n_trials"] for s in manifest["surveys"]) <= per_survey
    package = load_package(tmp_path / "p")
    for task in ("2afc", "clustering"):  # every real trial is still asked, once
        real = package.truth[(package.truth["task"] == task) & ~package.truth["attention_check"]]
        alone = build_survey(inversion_sets, tmp_path / task, tasks=(task,), trials_per_survey=10_000, attention_rate=0)["trials"]
        assert len(real) == sum(len(t["rows"]) for t in alone)


def test_surveys_too_small_for_their_promises_say_so(inversion_sets, tmp_path, caplog):
    """trials_per_survey=1: 2AFC surveys of one trial have no room for a check, and clustering surveys hold two trials of
    six rows, twelve judgements and their time; neither was said."""
    with caplog.at_level("WARNING", logger="stimuli"):
        manifest = build_survey(inversion_sets, tmp_path / "p", tasks=("2afc", "clustering"), trials_per_survey=1, attention_rate=0.1)
    unchecked = sum(s["n_attention_checks"] == 0 for s in manifest["surveys"] if s["task"] == "2afc")
    assert unchecked > 0 and f"2afc: with one trial per survey there is no room for an attention check beside it: {unchecked} of" in caplog.text
    assert "clustering: its surveys hold 1 trial(s) of 6 rows, 6 judgements each (and announce their time), more than trials_per_survey=1" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="stimuli"):
        build_survey(inversion_sets, tmp_path / "q", tasks=("2afc", "clustering"), trials_per_survey=7, attention_rate=0.1)
    assert "clustering: its surveys hold 2 trial(s) of 6 rows, 12 judgements each" in caplog.text and "2afc" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="stimuli"):
        build_survey(inversion_sets, tmp_path / "r", tasks=("2afc", "clustering"), trials_per_survey=12, attention_rate=0.1)
    assert "trials_per_survey" not in caplog.text and "no room" not in caplog.text


def test_no_check_is_added_when_none_are_asked_for(inversion_sets, tmp_path):
    manifest = build_survey(inversion_sets, tmp_path / "p", tasks=("2afc",), trials_per_survey=5, attention_rate=0)
    assert all(s["n_attention_checks"] == 0 for s in manifest["surveys"])


@pytest.mark.parametrize("real, checks, per_survey", [(25, 1, 9), (40, 2, 5), (30, 1, 2), (8, 3, 4)])
def test_repeated_checks_fill_every_survey_within_its_size(real, checks, per_survey):
    from stimuli.survey import _deal, _with_a_check_per_survey

    records = [{"model": "ab"[i % 2], "attention_check": False, "n": i} for i in range(real)]
    records += [{"model": "ab"[i % 2], "attention_check": True, "n": real + i} for i in range(checks)]
    records, n_surveys = _with_a_check_per_survey(records, per_survey, "2afc")
    hands = _deal(records, n_surveys, np.random.default_rng(0))
    assert all(any(r["attention_check"] for r in hand) for hand in hands)
    assert max(map(len, hands)) <= per_survey
    assert sorted(r["n"] for hand in hands for r in hand if not r["attention_check"]) == list(range(real))
    fewest = next(n for n in range(1, real + checks + 1) if real + max(checks, n) <= n * per_survey)  # no survey more than needed
    assert n_surveys == fewest


def test_the_package_fingerprint_does_not_depend_on_where_the_sets_lie(inversion_sets, tmp_path, monkeypatch):
    """A rebuild naming the sets by another path (relative, another machine) refused every answer to the pages already out."""
    absolute = build_survey({label: s.path for label, s in inversion_sets.items()}, tmp_path / "a", tasks=("2afc",))
    monkeypatch.chdir(next(iter(inversion_sets.values())).path.parent)
    relative = build_survey({label: s.path.name for label, s in inversion_sets.items()}, tmp_path / "b", tasks=("2afc",))
    assert {s["path"] for s in relative["sets"].values()} != {s["path"] for s in absolute["sets"].values()}
    assert relative["fingerprint"] == absolute["fingerprint"]
    swapped = dict(zip(inversion_sets, reversed([s.path for s in inversion_sets.values()])))  # other labels, other meaning
    assert build_survey(swapped, tmp_path / "c", tasks=("2afc",))["fingerprint"] != absolute["fingerprint"]


def test_pages_enlarge_small_images_by_whole_numbers_and_never_shrink_large_ones():
    """Every image was shown at 128 px (96 px as a clustering row): a 224-px ImageNet set lost about 100 of its pixel rows
    and columns on the page, so people judged other images than the observers scored."""
    from stimuli.survey import _template_env, display_size

    assert display_size(32, 32) == (128, 128, 4) and display_size(8, 8) == (128, 128, 16) and display_size(28, 28) == (140, 140, 5)
    assert display_size(224, 224) == (224, 224, 1) and display_size(300, 200) == (300, 200, 1) and display_size(32, 64) == (64, 128, 2)
    for bad in ((0, 32), (32.5, 32), (True, 32)):
        with pytest.raises(ValueError, match="height and width must be whole numbers >= 1 pixel"):
            display_size(*bad)
    template = _template_env().get_template("survey.html.j2")
    page = template.render(title="t", task="2afc", prompt="p", minutes=1, n_trials=1, data_json="{}", script="", image_height=224,
                           image_width=224, enlarged=False)
    assert "img.stim { width: 224px; height: 224px; border" in page and "pixelated" not in page and "96px" not in page


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_clustering_check_is_not_dealt_into_the_survey_of_its_twin(inversion_sets, tmp_path, seed):
    """A clustering check shows a real triplet's columns: dealt into that triplet's survey, the same three columns came up
    twice, and a participant could tell the check from the columns seen before."""
    manifest = build_survey(inversion_sets, tmp_path / "p", tasks=("clustering",), trials_per_survey=24, attention_rate=0.2, seed=seed)
    for survey in manifest["surveys"]:
        trials = [t for t in manifest["trials"] if t["survey_id"] == survey["survey_id"]]
        real = {frozenset((t["column_0"], t["column_1"], t["column_2"])) for t in trials if not t["attention_check"]}
        checks = [frozenset((t["column_0"], t["column_1"], t["column_2"])) for t in trials if t["attention_check"]]
        assert checks and not set(checks) & real, survey["survey_id"]
