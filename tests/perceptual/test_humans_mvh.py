"""``python -m perceptual humans-mvh`` and the benchmark's figures on a small raw-data folder the test writes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perceptual.__main__ import main as perceptual_main
from perceptual.decisions import trial_table
from perceptual.human_trials import TrialDataError, write_trials
from perceptual.metrics import SIXTEEN_CLASS_NAMES, mean_rank
from perceptual.pipelines.humans_mvh import analyse

from ..conftest import MVH_RAW

PNG = b"\x89PNG\r\n\x1a\n"
CLASSES = list(SIXTEEN_CLASS_NAMES)


def raw_folder(root):
    """colour: two subjects × two conditions × two images; cue-conflict: two subjects × three images (one same-class)."""
    colour = {  # subject → condition → [(image, category, response)]
        "subject-01": {"cr": [("oven-1.png", "oven", "oven"), ("bear-2.png", "bear", "cat")],
                       "bw": [("car-3.png", "car", "car"), ("dog-4.png", "dog", "dog")]},
        "subject-02": {"cr": [("oven-1.png", "oven", "oven"), ("bear-2.png", "bear", "bear")],
                       "bw": [("car-3.png", "car", "truck"), ("dog-4.png", "dog", "dog")]},
    }
    for subject, conditions in colour.items():
        lines, trial = [], 0
        for condition, items in conditions.items():
            for image, category, response in items:
                trial += 1
                lines.append(f"{subject},1,{trial},0.5,{response},{category},{condition},{trial:04d}_cl_s{subject[-2:]}_{condition}_{image}")
        (root / "colour").mkdir(parents=True, exist_ok=True)
        (root / "colour" / f"colour_{subject}_session_1.csv").write_text(
            "subj,Session,trial,rt,object_response,category,condition,imagename\n" + "\n".join(lines) + "\n")
    cue = {"subject-01": ["cat", "cat", "dog"], "subject-02": ["dog", "cat", "dog"]}
    images = [("cat", "cat1-dog2.png"), ("cat", "cat2-clock1.png"), ("dog", "dog1-dog3.png")]
    for subject, responses in cue.items():
        lines = [f"{subject},1,{i + 1},0.5,{r},{c},0,{i + 1:04d}_s5n_s{subject[-2:]}_0_{name}"
                 for i, ((c, name), r) in enumerate(zip(images, responses))]
        (root / "cue-conflict").mkdir(parents=True, exist_ok=True)
        (root / "cue-conflict" / f"cue-conflict_{subject}_session_1.csv").write_text(
            "subj,session,trial,rt,object_response,category,condition,imagename\n" + "\n".join(lines) + "\n")
    return root


def model_folder(root, bw_decisions=("car", "cat")):
    """A model's decisions on the same source images, written in the benchmark's format."""
    ids = ["oven-1.png", "bear-2.png"]
    cr = trial_table("toynet", "colour", "cr", ids, [CLASSES.index("oven"), CLASSES.index("bear")],
                     [CLASSES.index("cat"), CLASSES.index("bear")], CLASSES)
    bw = trial_table("toynet", "colour", "bw", ["car-3.png", "dog-4.png"], [CLASSES.index("car"), CLASSES.index("dog")],
                     [CLASSES.index(d) for d in bw_decisions], CLASSES)
    table = pd.concat([cr, bw], ignore_index=True)
    write_trials(table, root / "colour" / "colour_toynet_session_1.csv")
    cue = trial_table("toynet", "cue-conflict", "0", ["cat1-dog2.png", "cat2-clock1.png", "dog1-dog3.png"],
                      [CLASSES.index("cat")] * 2 + [CLASSES.index("dog")], [CLASSES.index(r) for r in ("dog", "clock", "dog")], CLASSES)
    write_trials(cue, root / "cue-conflict" / "cue-conflict_toynet_session_1.csv")
    return root


def test_the_command_reports_humans_and_models(tmp_path):
    root, models, out = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models"), tmp_path / "out"
    data = analyse(root, out, models=[models])
    report = json.loads((out / "report.json").read_text())
    assert report["reader"]["rows"] == 14 and report["model_reader"]["rows"] == 7
    colour = {r["condition"]: r for r in report["human_accuracy"] if r["dataset"] == "colour"}
    assert colour["cr"]["mean"] == pytest.approx(0.75) and colour["cr"]["min"] == 0.5 and colour["cr"]["max"] == 1.0
    # humans in cr: s01 [1, 0], s02 [1, 1]: c_exp = p_a = .5 (s02 always right), c_obs = .5 → kappa 0
    consistency = {(r["dataset"], r["condition"]): r for r in report["human_error_consistency"]}
    assert consistency[("colour", "cr")]["mean"] == pytest.approx(0.0) and consistency[("colour", "cr")]["n_pairs"] == 1
    # shape bias: s01 answers shape, shape on the two conflict images (1.0); s02 texture, shape (0.5); pooled 3/4; model 0
    shape = {r["subject"]: r["shape_bias"] for r in report["shape_bias"]}
    assert shape == pytest.approx({"subject-01": 1.0, "subject-02": 0.5, "toynet": 0.0, "all humans": 0.75, "mean of humans": 0.75})
    assert report["models"] == ["toynet"] and set(report["benchmark"]["values"]["toynet"]) == {
        "ood_accuracy", "accuracy_difference", "observed_consistency", "error_consistency"}
    # OOD accuracy over the kept conditions (colour's control cr left out): toynet bw 1/2, cue-conflict 1/3; the humans
    # pooled: bw 3/4, cue-conflict 5/6
    assert report["benchmark"]["values"]["toynet"]["ood_accuracy"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert report["benchmark"]["humans"]["ood_accuracy"] == pytest.approx((3 / 4 + 5 / 6) / 2)
    model_accuracy = {(r["dataset"], r["condition"]): r["accuracy"] for r in report["model_accuracy"]}
    assert model_accuracy == {("colour", "bw"): 0.5, ("colour", "cr"): 0.5, ("cue-conflict", "0"): pytest.approx(1 / 3)}
    assert sorted(report["figures"]) == ["figures/accuracy.png", "figures/error_consistency.png", "figures/matrix_colour.png",
                                         "figures/matrix_cue-conflict.png", "figures/shape_bias.png"]
    for figure in report["figures"]:
        assert (out / figure).read_bytes()[:8] == PNG
    for table in ("accuracy", "accuracy_humans", "pairs", "error_consistency_humans", "shape_bias", "shape_bias_per_category"):
        assert (out / "tables" / f"{table}.csv").is_file()
    pairs = pd.read_csv(out / "tables" / "pairs.csv")
    assert set(pairs["kind"]) == {"human-human", "model-human"}
    summary = (out / "summary.md").read_text()
    assert "## Human-human error consistency per condition" in summary and "| toynet |" in summary
    assert data["seconds"] >= 0


def test_the_models_benchmark_leaves_out_the_conditions_the_benchmarks_table_leaves_out(tmp_path):
    """colour's "cr" (the unmodified control) is out of the models' aggregate, as in model-vs-human's table: the values
    equal aggregate_trials over the other trials; ``benchmark_exclusions=false`` keeps every condition."""
    from perceptual.human_trials import read_trials
    from perceptual.metrics import aggregate_trials

    root, models = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models", bw_decisions=("car", "dog"))
    excluded = analyse(root, tmp_path / "out", models=[models], figures=False)["benchmark"]
    every = analyse(root, tmp_path / "all", models=[models], figures=False, benchmark_exclusions=False)["benchmark"]
    assert excluded["excluded_conditions"] == {"colour": ["cr"]} and every["excluded_conditions"] == {}
    trials = pd.concat([read_trials(root)[0], read_trials([models])[0]], ignore_index=True)
    for name in ("accuracy_difference", "observed_consistency", "error_consistency"):
        kept = trials[trials["condition"] != "cr"]
        assert excluded["values"]["toynet"][name] == pytest.approx(aggregate_trials(kept, name).models["toynet"], nan_ok=True)
        assert every["values"]["toynet"][name] == pytest.approx(aggregate_trials(trials, name).models["toynet"], nan_ok=True)
    assert excluded["values"]["toynet"] != pytest.approx(every["values"]["toynet"], nan_ok=True)
    assert "colour: cr left out, as in the benchmark's table" in (tmp_path / "out" / "summary.md").read_text()


def _model_decisions(root, name, dataset, condition, pairs, session=1):
    """``name``'s decisions ``[(image, category, decision)]`` in one condition, in the benchmark's format."""
    ids, truth, decided = zip(*pairs)
    table = trial_table(name, dataset, condition, list(ids), [CLASSES.index(c) for c in truth], [CLASSES.index(d) for d in decided], CLASSES)
    return write_trials(table, root / dataset / f"{dataset}_{name}_{condition}_session_{session}.csv", session=session)


def test_a_human_row_left_out_under_strict_false_does_not_stop_the_models_benchmark(tmp_path):
    """subject-01 loses a cr trial to a typo: the consistency metrics compare the images both observers saw."""
    root, models = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models")
    path = root / "colour" / "colour_subject-01_session_1.csv"
    path.write_text(path.read_text().replace(",cat,bear,cr,", ",cta,bear,cr,"))
    data = analyse(root, tmp_path / "out", models=[models], strict=False, figures=False)
    assert data["reader"]["problem_counts"] == {"unknown response": 1}
    assert data["benchmark"]["experiments"] == ["colour", "cue-conflict"] and (tmp_path / "out" / "report.json").is_file()


def test_a_human_who_lost_a_whole_condition_under_strict_false_does_not_stop_the_models_benchmark(tmp_path):
    """subject-01's two cr answers are unreadable: the models' benchmark failed at the end, after the old report was
    deleted; the condition now counts as one where the two share no image (skipped in the means)."""
    root, models, out = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models"), tmp_path / "out"
    path = root / "colour" / "colour_subject-01_session_1.csv"
    path.write_text(path.read_text().replace(",oven,oven,cr,", ",ovn,oven,cr,").replace(",cat,bear,cr,", ",cta,bear,cr,"))
    data = analyse(root, out, models=[models], strict=False, figures=False, benchmark_exclusions=False)
    assert data["reader"]["problem_counts"] == {"unknown response": 2}
    # colour: toynet (cr: 1/2, bw: 1/2) against subject-01 in bw alone (1), subject-02 in both (1, 1/2)
    expected_colour = (0.25 + (0.25 + 0.0) / 2) / 2
    expected_cue = ((1 / 3 - 1) ** 2 + (1 / 3 - 2 / 3) ** 2) / 2  # toynet 1/3 right, the humans 1 and 2/3
    assert data["benchmark"]["values"]["toynet"]["accuracy_difference"] == pytest.approx((expected_colour + expected_cue) / 2)


def test_an_experiment_with_one_human_keeps_its_accuracy_and_draws_no_matrix(tmp_path):
    """A pilot with one subject: the run failed (one experiment: "no human-human pairs"; with others: in the matrix
    figure, after the old report was deleted), or, without figures, dropped the experiment from summary.md."""
    root, out = raw_folder(tmp_path / "raw"), tmp_path / "out"
    (root / "colour" / "colour_subject-02_session_1.csv").unlink()
    data = analyse(root, out)
    assert {r["dataset"] for r in data["human_error_consistency"]} == {"cue-conflict"}
    assert "| colour | cr | 0 | – ± – [–, –] | – | 0.500 ± – [0.500, 0.500] |" in (out / "summary.md").read_text()
    assert not (out / "figures" / "matrix_colour.png").exists() and (out / "figures" / "matrix_cue-conflict.png").is_file()
    alone = analyse(root, tmp_path / "alone", experiments="colour", figures=False)  # one value, not a list of characters
    assert alone["experiments"] == ["colour"] and alone["human_error_consistency"] == []


def test_a_model_without_every_condition_is_named_and_averaged_over_those_it_has(tmp_path):
    """halfnet decided colour's bw images alone: the models' benchmark failed at the end, after the old report was deleted."""
    root, models, out = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models"), tmp_path / "out"
    _model_decisions(models, "halfnet", "colour", "cr", [("oven-1.png", "oven", "oven"), ("bear-2.png", "bear", "bear")])
    bench = analyse(root, out, models=str(models), experiments=["colour"], figures=False, benchmark_exclusions=False)["benchmark"]
    assert bench["missing_conditions"] == {"halfnet": {"colour": ["bw"]}}
    # halfnet's cr accuracy 1 against the humans' 1/2 and 1: ((1 - .5)² + 0) / 2
    assert bench["values"]["halfnet"]["accuracy_difference"] == pytest.approx(0.125)
    assert "Conditions a model has no decisions in (its values average over the others): halfnet: colour bw" in (out / "summary.md").read_text()


def test_model_conditions_are_matched_in_the_humans_spelling_and_unknown_ones_refused(tmp_path):
    root = raw_folder(tmp_path / "raw")
    images = [("cat1-dog2.png", "cat", "dog"), ("cat2-clock1.png", "cat", "cat"), ("dog1-dog3.png", "dog", "dog")]
    _model_decisions(tmp_path / "models", "floatnet", "cue-conflict", "0.0", images)  # "0" after a trip through pandas
    data = analyse(root, tmp_path / "out", models=[tmp_path / "models"], figures=False)
    pairs = pd.read_csv(tmp_path / "out" / "tables" / "pairs.csv", dtype={"condition": str})
    assert set(pairs.loc[pairs["kind"] == "model-human", "condition"]) == {"0"}
    assert data["benchmark"]["values"]["floatnet"]["observed_consistency"] == pytest.approx((2 / 3 + 1) / 2)
    _model_decisions(tmp_path / "other", "greynet", "colour", "grey", [("oven-1.png", "oven", "oven")])
    refusal = r"conditions the humans do not have \(greynet in colour: condition 'grey'\); the humans' conditions are \{'colour': \['cr', 'bw'\]\}"
    with pytest.raises(ValueError, match=refusal):
        analyse(root, tmp_path / "refused", models=[tmp_path / "other"])
    assert not (tmp_path / "refused").exists()


def test_models_are_compared_on_the_experiments_they_all_have_and_an_undefined_one_is_not_ranked(tmp_path):
    """The reference ranks every model (and the humans' row) on one list of experiments; a model with no trials left after
    the benchmark's exclusions (colour's control cr alone) has NaN and no rank, and the others are ranked."""
    root, models = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models", bw_decisions=("car", "dog"))
    _model_decisions(models, "colournet", "colour", "cr", [("oven-1.png", "oven", "oven"), ("bear-2.png", "bear", "bear")])
    _model_decisions(models, "colournet", "colour", "bw", [("car-3.png", "car", "car"), ("dog-4.png", "dog", "cat")], session=2)
    _model_decisions(models, "controlnet", "colour", "cr", [("oven-1.png", "oven", "oven"), ("bear-2.png", "bear", "cat")])
    bench = analyse(root, tmp_path / "out", models=[models], figures=False)["benchmark"]
    assert bench["experiments"] == ["colour"] and bench["left_out"] == {"toynet": ["cue-conflict"]}
    assert all(v != v for v in bench["values"]["controlnet"].values()) and bench["mean_rank"]["controlnet"] != bench["mean_rank"]["controlnet"]
    ranked = ["colournet", "toynet"]  # ranked among the two, as if controlnet were not there
    expected = mean_rank([[bench["values"][m][n] for n in ("accuracy_difference", "observed_consistency", "error_consistency")] for m in ranked],
                         [False, True, True])
    assert [bench["mean_rank"][m] for m in ranked] == pytest.approx(list(expected))
    # OOD accuracy in colour's bw: colournet 1/2, toynet 1 (car, dog); the higher ranks first, controlnet has none
    assert bench["values"]["colournet"]["ood_accuracy"] == 0.5 and bench["values"]["toynet"]["ood_accuracy"] == 1.0
    assert bench["ood_accuracy_rank"]["toynet"] == 1.0 and bench["ood_accuracy_rank"]["colournet"] == 2.0
    assert bench["ood_accuracy_rank"]["controlnet"] != bench["ood_accuracy_rank"]["controlnet"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "in experiments colour (those every model has); left out of this table: toynet: cue-conflict" in summary
    assert "| controlnet | – | – | – | – | – | – |" in summary
    assert "| toynet | 1.000 | 1.0 |" in summary


def test_experiments_filter_the_models_too_and_a_rerun_leaves_no_old_output(tmp_path):
    root, models, out = raw_folder(tmp_path / "raw"), model_folder(tmp_path / "models"), tmp_path / "out"
    analyse(root, out, models=[models])
    assert (out / "tables" / "shape_bias.csv").is_file() and (out / "figures" / "matrix_cue-conflict.png").is_file()
    data = analyse(root, out, models=[models], experiments=["colour"])
    assert data["experiments"] == ["colour"] and data["shape_bias"] is None
    assert not (out / "tables" / "shape_bias.csv").exists() and not (out / "figures" / "shape_bias.png").exists()
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["accuracy.png", "error_consistency.png", "matrix_colour.png"]
    with pytest.raises(ValueError, match=r"the models have no decisions in experiments \['edge'\]"):
        write_trials_root = root / "edge"
        write_trials_root.mkdir()
        (write_trials_root / "edge_subject-01_session_1.csv").write_text(
            "subj,Session,trial,rt,object_response,category,condition,imagename\nsubject-01,1,1,0.5,oven,oven,0,0001_edg_s01_0_oven_00_oven1.png\n")
        analyse(root, tmp_path / "edge-out", models=[models], experiments=["edge"])


def test_a_humans_only_run_reports_the_benchmarks_human_row_over_the_kept_conditions(tmp_path, capsys):
    """Without models the run had no benchmark row, and its per-experiment human error consistency averaged every condition,
    the benchmark's excluded controls too. Here subject-02 answers cr as subject-01 does: kappa 1 in cr, 0 in bw."""
    root, out = raw_folder(tmp_path / "raw"), tmp_path / "out"
    path = root / "colour" / "colour_subject-02_session_1.csv"
    path.write_text(path.read_text().replace(",bear,bear,cr,", ",cat,bear,cr,"))
    perceptual_main(["humans-mvh", f"root={root}", f"out={out}", "figures=false"])
    data = json.loads((out / "report.json").read_text())
    humans = data["benchmark"]["humans"]
    assert data["benchmark"]["excluded_conditions"] == {"colour": ["cr"]} and data["benchmark"]["values"] == {}
    assert humans["ood_accuracy"] == pytest.approx((3 / 4 + 5 / 6) / 2)  # bw pooled 3 of 4; cue-conflict 5 of 6
    assert data["human_error_consistency_per_experiment"]["colour"] == pytest.approx(0.0)  # bw alone, not (1 + 0) / 2
    assert humans["error_consistency"] == pytest.approx(np.nanmean(list(data["human_error_consistency_per_experiment"].values())))
    assert "| humans | 0.792 | |" in (out / "summary.md").read_text()
    assert "humans: OOD accuracy 0.792 (pooled)" in capsys.readouterr().out
    every = analyse(root, tmp_path / "every", figures=False, benchmark_exclusions=False)
    assert every["human_error_consistency_per_experiment"]["colour"] == pytest.approx(0.5)


def test_the_command_line_prints_the_human_numbers(tmp_path, capsys):
    root, out = raw_folder(tmp_path / "raw"), tmp_path / "out"
    perceptual_main(["humans-mvh", f"root={root}", f"out={out}", "figures=false"])
    printed = capsys.readouterr().out
    assert "read 14 trials from 4 files" in printed
    assert "colour         cr: kappa 0.000 ± – (1 pairs), accuracy 0.750 ± 0.354" in printed
    assert "human shape bias: 0.750 pooled over 4 cue-conflict trials; mean of 2 subjects 0.750 (range 0.500–1.000)" in printed
    assert not (out / "figures").exists()


def test_subjects_who_saw_other_images_are_named_and_the_defined_pairs_counted(tmp_path, capsys):
    """Trials whose image names did not match were left out with an info line nobody saw, and the report still said
    "1 pairs" for a condition whose only pair shares no image (its kappa undefined)."""
    root, out = raw_folder(tmp_path / "raw"), tmp_path / "out"
    subject_02 = root / "colour" / "colour_subject-02_session_1.csv"
    subject_02.write_text(subject_02.read_text().replace("car-3.png", "car-3x.png").replace("dog-4.png", "dog-4x.png"))
    perceptual_main(["humans-mvh", f"root={root}", f"out={out}", "figures=false"])
    printed = capsys.readouterr()
    assert ("WARNING perceptual.mvh_analysis: 1 subject pair(s) saw partly different images and are compared on the images both saw, "
            "1 of them on none (undefined), e.g. subject-01 vs subject-02 in colour bw: 0 shared, 2 and 2 seen by one only") in printed.err
    assert "colour         bw: kappa – ± – (0 defined of 1 pairs)" in printed.out
    assert "| colour | bw | 0 defined of 1 | – ± – [–, –] |" in (out / "summary.md").read_text()
    assert "| colour | cr | 1 | " in (out / "summary.md").read_text()


def test_bad_input_stops_before_any_output(tmp_path):
    root = raw_folder(tmp_path / "raw")
    path = root / "colour" / "colour_subject-01_session_1.csv"
    path.write_text(path.read_text().replace(",bear,cr,", ",zebra,cr,"))
    with pytest.raises(TrialDataError, match="unknown category × 1"):
        analyse(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    data = analyse(root, tmp_path / "out", strict=False, figures=False)
    assert data["reader"]["problem_counts"] == {"unknown category": 1} and data["reader"]["kept"] == 13
    with pytest.raises(ValueError, match="root is not set"):
        analyse(None, tmp_path / "x")
    with pytest.raises(ValueError, match="do not look human"):
        analyse(model_folder(tmp_path / "models"), tmp_path / "x")
    with pytest.raises(SystemExit, match="rooot"):
        perceptual_main(["humans-mvh", "rooot=x"])
    # decisions on other images (here .JPEG for the humans' .png) would give NaN consistencies and a run that looks fine
    _model_decisions(tmp_path / "elsewhere", "jpegnet", "colour", "cr", [("oven-1.JPEG", "oven", "oven"), ("bear-2.JPEG", "bear", "bear")])
    with pytest.raises(ValueError, match=r"share no source image with the human trials in 1 cell\(s\): jpegnet in colour/cr"):
        analyse(root, tmp_path / "out2", models=[tmp_path / "elsewhere"], strict=False)
    assert not (tmp_path / "out2").exists()


@pytest.mark.skipif(not MVH_RAW.is_dir(), reason=f"model-vs-human raw trials not found at {MVH_RAW}")
def test_the_command_on_two_real_experiments(tmp_path):
    data = analyse(MVH_RAW, tmp_path / "out", experiments=["cue-conflict", "sketch"], figures=False)
    assert data["n_subjects"] == {"cue-conflict": 10, "sketch": 7}
    pooled = next(r for r in data["shape_bias"] if r["subject"] == "all humans")
    assert pooled["shape_decisions"] + pooled["texture_decisions"] <= pooled["n_conflict"]
    assert 0.5 < pooled["shape_bias"] <= 1  # the benchmark's humans decide mostly by shape
