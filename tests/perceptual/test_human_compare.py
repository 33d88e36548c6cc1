"""``compare humans=PATH``: the metric suite with real (here: made-up, and the shared) human trials as the human rows.

Hand-computed case (experiment colour, condition bw (greyscale, a condition the benchmark ranks); categories oven, bear, car, dog, knife):

* subject-01 sees all five images, right on [1, 1, 0, 0, 1]; subject-02 sees the first four, right on [1, 1, 0, 0].
* model ``alternating`` sees all five, right on [1, 0, 1, 0, 1]; model ``copycat`` answers as subject-01.

alternating vs subject-01 (5 shared): c_obs 3/5, c_exp 0.6·0.6 + 0.4·0.4 = 0.52, kappa (0.6 − 0.52) / 0.48 = 1/6;
vs subject-02 (4 shared): c_obs 0.5, c_exp 0.5, kappa 0; mean over humans 1/12. Observed consistency (0.6 + 0.5) / 2.
Accuracy difference (squared, as model-vs-human): (0.6 − 0.6)² and (0.6 − 0.5)² → 0.005 for both models. copycat: kappa 1 with both humans.
Mean rank (accuracy difference tied → 1.5 each): copycat (1.5 + 1 + 1) / 3, alternating (1.5 + 2 + 2) / 3.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from PIL import Image

from perceptual.__main__ import main as perceptual_main
from perceptual.decisions import trial_table
from perceptual.human_compare import compare_on_trials, labelled_trials, pair_matrices_on_trials
from perceptual.human_compare import summary_markdown as human_summary_markdown
from perceptual.human_trials import read_trials, write_trials
from perceptual.metrics import SIXTEEN_CLASS_NAMES
from perceptual.pipelines.compare import human_model_decisions
from perceptual.pipelines.compare import run as compare_run

from ..conftest import MVH_RAW

CLASSES = list(SIXTEEN_CLASS_NAMES)
IMAGES = [("oven-1.png", "oven"), ("bear-2.png", "bear"), ("car-3.png", "car"), ("dog-4.png", "dog"), ("knife-5.png", "knife")]
WRONG = "truck"


def _answers(right):
    return [c if r else WRONG for (_, c), r in zip(IMAGES, right)]


def human_folder(root):
    people = {"subject-01": [1, 1, 0, 0, 1], "subject-02": [1, 1, 0, 0]}
    (root / "colour").mkdir(parents=True)
    for subject, right in people.items():
        lines = [f"{subject},1,{t + 1},0.5,{response},{category},bw,{t + 1:04d}_cl_s{subject[-2:]}_bw_{category}_40_{image}"
                 for t, ((image, category), response) in enumerate(zip(IMAGES, _answers(right)))]
        (root / "colour" / f"colour_{subject}_session_1.csv").write_text(
            "subj,Session,trial,rt,object_response,category,condition,imagename\n" + "\n".join(lines) + "\n")
    return root


def model_csvs(root):
    ids = [i for i, _ in IMAGES]
    labels = [CLASSES.index(c) for _, c in IMAGES]
    paths = []
    for name, right in (("alternating", [1, 0, 1, 0, 1]), ("copycat", [1, 1, 0, 0, 1])):
        table = trial_table(name, "colour", "bw", ids, labels, [CLASSES.index(a) for a in _answers(right)], CLASSES)
        paths.append(write_trials(table, root / "colour" / f"colour_{name}_session_1.csv"))  # the folder names the experiment
    return paths


@pytest.fixture
def trials(tmp_path):
    humans, _ = read_trials(human_folder(tmp_path / "raw"))
    models, _ = read_trials(model_csvs(tmp_path / "models"))
    return labelled_trials(humans, models)


def test_hand_computed_values_and_ranks(trials):
    data = compare_on_trials(trials)
    assert data["models"] == ["model:alternating", "model:copycat"]
    assert data["subjects"] == ["human:subject-01", "human:subject-02"]
    values = data["ranking"]["values"]
    assert values["model:alternating"]["error_consistency"] == pytest.approx(1 / 12)
    assert values["model:alternating"]["observed_consistency"] == pytest.approx(0.55)
    assert values["model:copycat"]["error_consistency"] == pytest.approx(1.0)
    for model in data["models"]:
        assert values[model]["accuracy_difference"] == pytest.approx(0.005)
    assert data["ranking"]["mean_rank_mvh"]["model:copycat"] == pytest.approx((1.5 + 1 + 1) / 3)
    assert data["ranking"]["mean_rank_mvh"]["model:alternating"] == pytest.approx((1.5 + 2 + 2) / 3)
    assert data["ranking"]["observers_among_themselves"]["error_consistency"] == pytest.approx(1.0)
    # The matrix is pair by pair on shared images: alternating vs subject-02 on four images only.
    kappa = data["aggregated"]["error_consistency"]
    systems = data["systems"]
    assert kappa[systems.index("model:alternating"), systems.index("human:subject-01")] == pytest.approx(1 / 6)
    assert kappa[systems.index("model:alternating"), systems.index("human:subject-02")] == pytest.approx(0.0)
    assert data["accuracy"]["colour/bw"]["human:subject-02"] == pytest.approx(0.5)
    assert set(data["spearman_between_metrics"]["metrics"]) == set(data["aggregated"]) and "cka" not in data["aggregated"]


def test_unanswered_trial_is_its_own_wrong_class(trials):
    changed = trials.copy()
    row = (changed["subject"] == "human:subject-02") & (changed["image_id"] == "car-3.png")
    changed.loc[row, "response"] = "na"
    matrices = pair_matrices_on_trials(changed, ["human:subject-01", "human:subject-02"])[("colour", "bw")]
    # Both are wrong on car_3 (still kappa 1), but "na" never agrees with subject-01's "truck".
    assert matrices["error_consistency"][0, 1] == pytest.approx(1.0)
    assert matrices["misclassification_agreement"][0, 1] < 1.0
    both = changed.copy()  # both leave car_3 unanswered: counted as naming the same wrong class, MA stayed 1
    both.loc[(both["subject"] == "human:subject-01") & (both["image_id"] == "car-3.png"), "response"] = "na"
    matrices = pair_matrices_on_trials(both, ["human:subject-01", "human:subject-02"])[("colour", "bw")]
    assert matrices["error_consistency"][0, 1] == pytest.approx(1.0)
    assert matrices["misclassification_agreement"][0, 1] < 1.0
    assert matrices["misclassification_agreement"][0, 0] == pytest.approx(1.0)  # an observer against itself still agrees


def test_model_decisions_must_meet_the_human_images(tmp_path):
    humans, _ = read_trials(human_folder(tmp_path / "raw"))
    stranger = trial_table("elsewhere", "colour", "bw", ["cat-9.png"], [CLASSES.index("cat")], [CLASSES.index("cat")], CLASSES)
    with pytest.raises(ValueError, match="share no source image"):
        labelled_trials(humans, stranger)
    with pytest.raises(ValueError, match="no human trials"):
        labelled_trials(humans, stranger.assign(dataset="rotation"))
    with pytest.raises(ValueError, match="subject name"):
        labelled_trials(humans, humans[humans["subject"] == "subject-01"])
    with pytest.raises(ValueError, match="model_trials=.*humans_images="):
        human_model_decisions(humans)
    model = humans[humans["subject"] == "subject-01"].assign(subject="model")
    with pytest.raises(ValueError, match=r"model 'model' decided image .* more than once.*labelled alike"):  # two models, one name
        labelled_trials(humans, pd.concat([model, model]))


def test_models_sharing_a_label_are_refused_before_any_image_is_classified(tmp_path):
    """Unlabelled checkpoints are all model.safetensors: two became one subject and failed later in a broadcast."""
    root = human_folder(tmp_path / "raw")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="model labels must be unique"):
        compare_run(_config([f"humans={root}", f"humans_images={tmp_path}", f"out={out}",
                             "models=[{name:resnet18,checkpoint:a/model.safetensors},{name:resnet18,checkpoint:b/model.safetensors}]"]))
    assert not out.exists()


def test_compare_command_with_humans(tmp_path, capsys):
    root = human_folder(tmp_path / "raw")
    paths = model_csvs(tmp_path / "models")
    out = tmp_path / "out"
    perceptual_main(["compare", f"humans={root}", f"model_trials=[{paths[0]},{paths[1]}]", f"out={out}", "progress=false"])
    printed = capsys.readouterr().out
    assert "model:copycat" in printed and "humans (pairs)" in printed
    report = json.loads((out / "humans" / "metrics.json").read_text())
    assert report["ranking"]["values"]["model:alternating"]["error_consistency"] == pytest.approx(1 / 12)
    for figure in report["figures"]:
        assert (out / "humans" / figure).stat().st_size > 0
    summary = (out / "humans" / "summary.md").read_text()
    assert "| model:copycat |" in summary and "Spearman" in summary
    assert not (out / "metrics.json").exists()  # no panel run unless humans_with_panel=true
    with pytest.raises(ValueError, match="humans_images"):
        compare_run(_config([f"humans={root}", f"model_trials=[{paths[0]}]", "models=[resnet18]", f"out={out}"]))
    with pytest.raises(ValueError, match="only used with humans"):
        compare_run(_config([f"model_trials=[{paths[0]}]", "models=[small_cnn]", f"out={out}"]))


def _config(overrides):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="compare", overrides=overrides)


def test_image_folder_models_join_the_humans(tmp_path, caplog):
    """An ImageNet zoo model (random weights) classifies a synthetic benchmark image folder; its trials meet the humans'."""
    humans, _ = read_trials(human_folder(tmp_path / "raw"))
    folder = tmp_path / "images" / "colour" / "dnn" / "session-1"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for t, (image, category) in enumerate(IMAGES):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{t + 1:04d}_cl_dnn_bw_{category}_40_{image}")
    from perceptual.measure import ModelSpec

    models = human_model_decisions(humans, images=str(tmp_path / "images"), specs=[ModelSpec(name="resnet18", label="r18")],
                                   image_size=32, progress=False)
    assert sorted(models["image_id"]) == sorted(i for i, _ in IMAGES) and set(models["subject"]) == {"r18"}
    data = compare_on_trials(labelled_trials(humans, models))
    assert data["models"] == ["model:r18"] and not math.isnan(data["ranking"]["values"]["model:r18"]["observed_consistency"])
    with pytest.raises(FileNotFoundError, match="no image folder"):
        human_model_decisions(humans, images=str(tmp_path), specs=[ModelSpec(name="resnet18")])
    # a human experiment without images there is named, not skipped in silence
    edge = humans.assign(dataset="edge")
    with caplog.at_level("WARNING", logger="perceptual.pipelines.compare"):
        human_model_decisions(pd.concat([humans, edge]), images=str(tmp_path / "images"), specs=[ModelSpec(name="resnet18", label="r18")],
                              image_size=32, progress=False)
    assert "no image folder for the human experiment(s) ['edge']: the models are compared on ['colour'] only" in caplog.text
    # a factory entry, as the panel run builds it (was: "unknown torchvision architecture None")
    factory = human_model_decisions(humans, images=str(tmp_path / "images"), specs=[ModelSpec(factory="torchvision.models:resnet18", label="f18")],
                                    image_size=32, progress=False)
    assert set(factory["subject"]) == {"f18"} and len(factory) == len(models)


@pytest.mark.slow
def test_image_folder_decisions_round_trip_through_the_command(tmp_path):
    """compare humans_images=... writes the model's decisions in the benchmark's format; read back as model_trials= they
    give the same numbers (about 16 s on two busy CPU cores: two reports with their figures)."""
    human_folder(tmp_path / "raw")
    folder = tmp_path / "images" / "colour" / "dnn" / "session-1"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for t, (image, category) in enumerate(IMAGES):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{t + 1:04d}_cl_dnn_bw_{category}_40_{image}")
    out = tmp_path / "out"
    first = compare_run(_config([f"humans={tmp_path / 'raw'}", f"humans_images={tmp_path / 'images'}", "humans_image_size=32",
                                 "models=[{name:resnet18,label:r18}]", f"out={out}", "progress=false"]))["humans"]
    written = out / "humans" / "decisions" / "colour" / "colour_r18_session_1.csv"
    again = compare_run(_config([f"humans={tmp_path / 'raw'}", f"model_trials=[{written}]", f"out={tmp_path / 'again'}", "progress=false"]))["humans"]
    assert again["ranking"]["values"] == first["ranking"]["values"]


def test_shared_trials_with_a_copycat_model(tmp_path):
    if not MVH_RAW.is_dir():
        pytest.skip(f"shared model-vs-human trials not at {MVH_RAW}")
    humans, _ = read_trials(MVH_RAW, experiments=["colour"])
    first = humans[humans["subject"] == "subject-01"]
    guesser = first.assign(subject="always-dog", response="dog")
    guesser["correct"] = guesser["category"] == "dog"
    data = compare_on_trials(labelled_trials(humans, pd.concat([first.assign(subject="copycat"), guesser])))
    values, among = data["ranking"]["values"], data["ranking"]["observers_among_themselves"]
    assert 0.3 < among["error_consistency"] < 0.6  # README: colour, 0.42 and 0.48
    assert values["model:copycat"]["error_consistency"] > among["error_consistency"] > values["model:always-dog"]["error_consistency"]
    assert data["ranking"]["mean_rank_mvh"]["model:copycat"] < data["ranking"]["mean_rank_mvh"]["model:always-dog"]


def test_humans_next_to_the_simulated_panel(tmp_path, tiny_digits_checkpoints):
    """humans_with_panel=true: the panel run on the data set (its report in out/) and the human one (out/humans/)."""
    root = human_folder(tmp_path / "raw")
    paths = model_csvs(tmp_path / "models")
    out = tmp_path / "out"
    model = f"{{name:small_cnn,checkpoint:'{tiny_digits_checkpoints['trained']}',label:trained,kwargs:{{width:8}}}}"
    data = compare_run(_config([
        f"humans={root}", f"model_trials=[{paths[0]},{paths[1]}]", "humans_with_panel=true", f"models=[{model}]", f"out={out}",
        "n_images=20", 'conditions=["colour=greyscale"]', "observers=[pixel-l2]", "decisions.seeds=[0]", "decisions.exemplars_per_class=3",
        "decisions.k=3", "unknown.enabled=false", "device=cpu", "progress=false"]))
    assert data["panel"]["models"] == ["trained"] and data["humans"]["models"] == ["model:alternating", "model:copycat"]
    assert (out / "metrics.json").exists() and (out / "humans" / "metrics.json").exists()
    assert "humans/summary.md" in (out / "summary.md").read_text()


def _shuffled_model(humans: pd.DataFrame) -> pd.DataFrame:
    """subject-01's trials of every experiment with each cell's answers rotated by one: a model with errors of its own."""
    first = humans[humans["subject"] == "subject-01"].sort_values(["dataset", "condition", "image_id"])
    rotated = first.groupby(["dataset", "condition"])["response"].transform(lambda r: np.roll(r.to_numpy(), 1))
    model = first.assign(subject="rotated", response=rotated)
    return model.assign(correct=model["response"] == model["category"])


def test_the_ranking_nests_every_metric_per_experiment_without_the_benchmarks_excluded_conditions():
    """The benchmark numbers subjects per experiment: averaging an id over experiments first weighted colour's 4
    subjects as 1/5 of edge's 10. Its table also leaves out controls (colour: cr) and conditions under 20 %."""
    if not MVH_RAW.is_dir():
        pytest.skip(f"shared model-vs-human trials not at {MVH_RAW}")
    from perceptual.metrics import aggregate_trials, misclassification_agreement, mvh_exclusions

    humans, _ = read_trials(MVH_RAW, experiments=["colour", "edge"])
    trials = labelled_trials(humans, _shuffled_model(humans))
    exclude = mvh_exclusions(zip(trials["dataset"], trials["condition"]))
    assert exclude == {"colour": ["cr"]}
    data = compare_on_trials(trials, exclude=exclude)
    values = data["ranking"]["values"]["model:rotated"]
    subjects = data["subjects"]
    for metric in ("accuracy_difference", "observed_consistency", "error_consistency"):
        expected = aggregate_trials(trials, metric, humans=subjects, images="shared", exclude=exclude).models["model:rotated"]
        assert values[metric] == pytest.approx(expected)
    assert values["error_consistency"] != pytest.approx(compare_on_trials(trials)["ranking"]["values"]["model:rotated"]["error_consistency"])

    def answers(subject, dataset, condition):
        cell = trials[(trials["subject"] == subject) & (trials["dataset"] == dataset) & (trials["condition"] == condition)]
        return cell.set_index("image_id")

    index = {c: i for i, c in enumerate(CLASSES)} | {"na": len(CLASSES)}
    per_experiment = []
    for dataset, experiment in trials.groupby("dataset"):
        conditions = [c for c in experiment["condition"].unique() if c not in exclude.get(dataset, [])]
        per_human = []
        for human in sorted(s for s in experiment["subject"].unique() if s.startswith("human:")):
            per_condition = []
            for condition in conditions:
                m, h = answers("model:rotated", dataset, condition), answers(human, dataset, condition)
                shared = m.index.intersection(h.index)
                labels, ours, theirs = (frame.loc[shared, column].map(index).to_numpy()
                                        for frame, column in ((m, "category"), (m, "response"), (h, "response")))
                theirs = np.where(theirs == len(CLASSES), len(CLASSES) + 1, theirs)  # two no-answers are not one answer
                per_condition.append(misclassification_agreement(labels, ours, theirs))
            per_human.append(np.nanmean(per_condition))
        per_experiment.append(np.nanmean(per_human))
    assert values["misclassification_agreement"] == pytest.approx(np.mean(per_experiment))
    assert data["excluded_conditions"] == {"colour": ["cr"]} and "colour/cr" in data["per_condition"]  # kept per condition
    assert "colour/cr" not in data["ranked_conditions"] and "colour/bw" in data["ranked_conditions"]  # compare's error alignment takes these
    summary = human_summary_markdown(data)
    assert "leave out its controls" in summary and "humans (mean ± sample std)" in summary
    cell, accuracy = next(iter(data["accuracy"].items()))
    humans = [accuracy[s] for s in accuracy if s.startswith("human:")]
    assert f"{np.mean(humans):.3f} ± {np.std(humans, ddof=1):.3f} |" in summary.split(f"| {cell} |", 1)[1].split("\n", 1)[0]


def test_cles_smooths_over_sixteen_classes_unless_a_trial_is_unanswered(trials):
    from perceptual.metrics import class_level_error_similarity

    pair = ["human:subject-01", "model:alternating"]
    first, model = (trials[trials["subject"] == s].set_index("image_id").sort_index() for s in pair)
    index = {c: i for i, c in enumerate(CLASSES)}
    labels = first["category"].map(index).to_numpy()

    def cles(k, model_answers):
        return class_level_error_similarity(labels, first["response"].map(index).to_numpy(), model_answers, k)

    matrices = pair_matrices_on_trials(trials, pair)[("colour", "bw")]
    assert matrices["cles"][0, 1] == pytest.approx(cles(16, model["response"].map(index).to_numpy()))
    changed = trials.copy()
    changed.loc[(changed["subject"] == "model:alternating") & (changed["image_id"] == "bear-2.png"), "response"] = "na"
    with_na = np.array(model["response"].map(index))
    with_na[list(model.index).index("bear-2.png")] = 16
    assert pair_matrices_on_trials(changed, pair)[("colour", "bw")]["cles"][0, 1] == pytest.approx(cles(17, with_na))


def test_excluding_every_condition_is_refused_with_the_way_out(trials):
    with pytest.raises(ValueError, match=r"every condition .* is excluded .*humans_benchmark_exclusions=false"):
        compare_on_trials(trials, exclude={"colour": ["bw"]})


def _observer(subject, cells):
    """A trial table from {(experiment, condition): [correct?, ...]} over the images oven-1.png, bear-2.png, ..."""
    tables = []
    for (dataset, condition), right in cells.items():
        ids, categories = [i for i, _ in IMAGES[:len(right)]], [c for _, c in IMAGES[:len(right)]]
        answers = [c if r else WRONG for c, r in zip(categories, right)]
        tables.append(trial_table(subject, dataset, condition, ids, [CLASSES.index(c) for c in categories],
                                  [CLASSES.index(a) for a in answers], CLASSES))
    return pd.concat(tables, ignore_index=True)


def test_models_are_ranked_on_the_experiments_they_all_have():
    """One model with an extra (here easy) experiment would be averaged over a different mix than the other: as in
    the reference and humans-mvh, every model is compared on the experiments all have, and the rest is named."""
    humans = pd.concat([_observer(s, {("colour", "bw"): right, ("edge", "0"): [1, 1, 1, 1]})
                        for s, right in (("subject-01", [1, 1, 0, 0]), ("subject-02", [1, 0, 1, 0]))])
    models = pd.concat([_observer("wide", {("colour", "bw"): [1, 0, 0, 1], ("edge", "0"): [1, 1, 1, 1]}),
                        _observer("narrow", {("colour", "bw"): [1, 1, 0, 0]})])
    data = compare_on_trials(labelled_trials(humans, models))
    assert data["experiments"] == ["colour"] and data["left_out"] == {"model:wide": ["edge"]} and data["without_models"] == []
    assert list(data["accuracy"]) == ["colour/bw"]
    only_colour = compare_on_trials(labelled_trials(humans[humans["dataset"] == "colour"], models[models["dataset"] == "colour"]))
    assert json.dumps(data["ranking"]["values"], sort_keys=True) == json.dumps(only_colour["ranking"]["values"], sort_keys=True)
    assert "left out: model:wide: edge." in human_summary_markdown(data)
    with pytest.raises(ValueError, match="the models share no experiment"):
        compare_on_trials(labelled_trials(humans, pd.concat([_observer("a", {("colour", "bw"): [1, 1, 0, 0]}),
                                                             _observer("b", {("edge", "0"): [1, 1, 1, 1]})])))


def test_a_model_with_only_excluded_conditions_is_not_ranked_and_stops_nothing():
    """Its nested metrics are undefined (no trials left after the exclusions): NaN, not a KeyError after all the work."""
    humans = pd.concat([_observer(s, {("colour", "cr"): [1, 1, 1, 0], ("colour", "bw"): right})
                        for s, right in (("subject-01", [1, 1, 0, 0]), ("subject-02", [1, 0, 1, 0]))])
    models = pd.concat([_observer("both", {("colour", "cr"): [1, 1, 1, 1], ("colour", "bw"): [1, 1, 0, 1]}),
                        _observer("control-only", {("colour", "cr"): [1, 1, 1, 1]})])
    data = compare_on_trials(labelled_trials(humans, models), exclude={"colour": ["cr"]})
    values = data["ranking"]["values"]["model:control-only"]
    assert all(math.isnan(values[m]) for m in ("accuracy_difference", "observed_consistency", "error_consistency"))
    assert math.isnan(data["ranking"]["mean_rank_mvh"]["model:control-only"]) and data["ranking"]["mean_rank_mvh"]["model:both"] == 1.0


def test_mean_rank_leaves_an_undefined_value_unranked_as_pandas_does():
    """One model's NaN no longer drops that metric for every model: the reference ranks each column with pandas
    (NaN unranked) and averages each model's defined ranks."""
    from perceptual.pair_metrics import _mean_rank

    table = np.array([[0.01, 0.80, 0.10], [0.02, 0.70, 0.30], [0.03, 0.60, np.nan]])  # A worst on EC, C's EC undefined
    frame = pd.DataFrame(table, columns=["ad", "oc", "ec"])
    expected = pd.concat([frame["ad"].rank(), frame["oc"].rank(ascending=False), frame["ec"].rank(ascending=False)], axis=1).mean(axis=1)
    ranks = _mean_rank(table, [False, True, True])
    assert ranks == pytest.approx(expected.tolist()) and ranks == pytest.approx([4 / 3, 5 / 3, 3.0])
    assert math.isnan(_mean_rank(np.full((2, 3), np.nan), [False, True, True])[0])
