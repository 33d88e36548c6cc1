"""The compare pipeline: pairwise matrices and their diagonals, metric correlations, and a tiny end-to-end run
(two digits models, two conditions, four simulated subjects) that is resumed through the command line."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module

import stimuli
from perceptual import metrics as M
from perceptual.decisions import TRIAL_TABLE_COLUMNS
from perceptual.measure import ModelSpec, make_panel
from perceptual.pair_metrics import PAIR_METRIC_REGISTRY, Responses, metric_correlations, nanmean_matrices, pairwise_matrices
from perceptual.pipelines.compare import ComparePipeline, run
from stimuli.distortions import parse_conditions

from ..conftest import TEST_DEVICE

PAIR_METRICS = tuple(PAIR_METRIC_REGISTRY)
DIAGONAL = {name: metric.diagonal for name, metric in PAIR_METRIC_REGISTRY.items()}

LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1])


def _responses(predictions, features=True, seed=0) -> Responses:
    predictions = np.asarray(predictions)
    rng = np.random.default_rng(seed)
    probabilities = np.full((len(predictions), 3), 0.1)
    probabilities[np.arange(len(predictions)), predictions] = 0.8
    return Responses(predictions, probabilities, rng.normal(size=(len(predictions), 4)) if features else None)


def _symmetric(matrix: np.ndarray) -> bool:
    return bool(np.allclose(matrix, matrix.T, equal_nan=True))


def test_pairwise_matrices_are_symmetric_with_the_documented_diagonals():
    systems = {
        "some-errors": _responses([0, 2, 2, 1, 1, 0, 0, 1], seed=1),  # errors with two distinct wrong labels
        "perfect": _responses(LABELS, seed=2),
        "subject-x": _responses([1, 0, 2, 2, 0, 0, 0, 1], features=False),
    }
    matrices = pairwise_matrices(systems, LABELS, 3)
    assert set(matrices) == set(PAIR_METRICS) == set(DIAGONAL)
    for name, matrix in matrices.items():
        assert matrix.shape == (3, 3) and _symmetric(matrix), name
    diagonal = {name: np.diag(m) for name, m in matrices.items()}
    np.testing.assert_array_equal(diagonal["observed_consistency"], 1.0)
    np.testing.assert_array_equal(diagonal["soc"], 1.0)
    assert diagonal["error_consistency"][0] == 1.0 and math.isnan(diagonal["error_consistency"][1])  # all right: undefined
    assert diagonal["misclassification_agreement"][0] == 1.0 and math.isnan(diagonal["misclassification_agreement"][1])
    assert diagonal["soce"][0] == pytest.approx(1.0) and math.isnan(diagonal["soce"][1])
    assert diagonal["cka"][:2] == pytest.approx([1.0, 1.0]) and math.isnan(diagonal["cka"][2])  # no features: NaN
    paper = M.class_level_error_similarity(LABELS, systems["some-errors"].predictions, systems["some-errors"].predictions, 3)
    assert diagonal["cles"][0] == pytest.approx(paper) and paper < 1 and math.isnan(diagonal["cles"][1])
    jsd = pairwise_matrices(systems, LABELS, 3, cles_variant="jsd", metrics=["cles"])["cles"]
    assert jsd[0, 0] == pytest.approx(1.0)
    # off-diagonal entries are the metric functions themselves
    a, c = systems["some-errors"].predictions, systems["subject-x"].predictions
    assert matrices["error_consistency"][0, 2] == pytest.approx(M.error_consistency(a == LABELS, c == LABELS))
    assert not math.isnan(matrices["misclassification_agreement"][2, 0])
    assert matrices["misclassification_agreement"][2, 0] == pytest.approx(M.misclassification_agreement(LABELS, a, c))


def test_condition_means_skip_nan_and_metric_correlations():
    a = np.array([[1.0, np.nan], [np.nan, 1.0]])
    b = np.array([[1.0, 0.5], [0.5, np.nan]])
    mean = nanmean_matrices([a, b])
    np.testing.assert_allclose(mean, [[1.0, 0.5], [0.5, 1.0]])
    assert math.isnan(nanmean_matrices([np.full((2, 2), np.nan)] * 2)[0, 0])
    rng = np.random.default_rng(0)
    x = rng.random((5, 5))
    x = (x + x.T) / 2
    result = metric_correlations({"x": x, "minus_x": -x, "few": np.where(np.eye(5) == 1, 1.0, np.nan)})
    rho = result["rho"]
    assert rho[0, 0] == pytest.approx(1.0) and rho[0, 1] == pytest.approx(-1.0)
    assert result["pairs"][0, 1] == 10 and result["pairs"][0, 2] == 0 and math.isnan(rho[0, 2])
    with pytest.raises(ValueError, match="no metric matrices to correlate"):  # a bare StopIteration before
        metric_correlations({})


def _overrides(out, checkpoints) -> list[str]:
    models = ",".join(
        f"{{name:small_cnn,checkpoint:'{checkpoints[label]}',label:{label},kwargs:{{width:8}}}}" for label in ("early", "trained")
    )
    return [
        f"out={out}", f"models=[{models}]", "n_images=30", 'conditions=["colour=greyscale","uniform_noise=0.35"]',
        "observers=[lpips-random-backbone,pixel-l2]", "decisions.seeds=[0,1]", "decisions.exemplars_per_class=3",
        "decisions.k=3", "unknown.n_fit=200", "unknown.scores=[max_softmax,energy,mahalanobis,knn,react,mc_dropout]",
        "unknown.score_params.mc_dropout.passes=2", "unknown.score_params.mc_dropout.insert_dropout=0.2",
        "unknown.score_params.knn.k=5", 'unknown.ood=[noise:uniform,"uniform_noise=0.9"]', f"device={TEST_DEVICE}", "progress=false",
    ]


@pytest.fixture(scope="module")
def compared(tmp_path_factory, tiny_digits_checkpoints):
    out = tmp_path_factory.mktemp("compare")
    overrides = _overrides(out, tiny_digits_checkpoints)
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="compare", overrides=overrides)
    return out, overrides, run(cfg)


def test_end_to_end_outputs_trials_and_condition_sets(compared):
    out, _, data = compared
    for name in ("metrics.json", "unknown.json", "summary.md", "trials.csv", "figures/heatmap_error_consistency.png",
                 "figures/accuracy_uniform_noise.png", "figures/spearman_between_metrics.png", "figures/unknown_auroc.png"):
        assert (out / name).is_file(), name
    strict = json.loads((out / "metrics.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in metrics.json"))
    assert strict["systems"] == data["systems"] and len(data["systems"]) == 6
    trials = pd.read_csv(out / "trials.csv")
    assert tuple(trials.columns) == TRIAL_TABLE_COLUMNS and len(trials) == 6 * 2 * 30
    assert set(trials["subject"]) == set(data["systems"]) and set(trials["condition"]) == {"colour=greyscale", "uniform_noise=0.35"}
    assert data["accuracy"]["colour=greyscale"]["trained"] > 0.6  # digits are grey already (test accuracy 0.825-0.905 over seeds 0-5)
    assert data["accuracy"]["colour=greyscale"]["trained"] > data["accuracy"]["uniform_noise=0.35"]["trained"]
    condition_set = stimuli.load_set(out / "conditions" / "uniform_noise=0.35")
    assert condition_set.kind == "condition" and condition_set.parameters["generator"] == "uniform_noise"
    assert len(condition_set) == 30 and set(condition_set.manifest["role"]) == {"query"}
    sources = strict["model_sources"]  # were overwritten by the list of labels: no checkpoint or weights hash was recorded
    assert set(sources) == {"early", "trained"} and all(len(v["weights_sha256"]) == 16 and v["checkpoint"] for v in sources.values())
    assert sorted(strict["models"]) == ["early", "trained"]
    subjects = strict["subjects"]
    for condition, panel in strict["accuracy_panel"].items():  # the summary's "observers (mean ± sample std)", in the JSON
        values = [data["accuracy"][condition][s] for s in subjects]
        assert panel["mean"] == pytest.approx(np.mean(values)) and panel["std"] == pytest.approx(np.std(values, ddof=1))
    summary = (out / "summary.md").read_text()
    for heading in ("## Accuracy per condition", "## Models against the observer panel", "## Spearman's rho", "## Unknown detection",
                    "## Error alignment"):
        assert heading in summary
    alignment = json.loads((out / "error_alignment.json").read_text())
    assert alignment["families"] == ["colour=greyscale", "uniform_noise=0.35"] and "error_consistency" in alignment["metrics"]
    for figure in alignment["figures"]:
        assert (out / figure).is_file(), figure


def test_end_to_end_matrices_are_symmetric_with_documented_diagonals(compared):
    out, _, data = compared
    trials = pd.read_csv(out / "trials.csv", dtype={"category": str, "response": str})  # digits' class names are "0".."9"
    systems, models = data["systems"], data["models"]
    classes = data["classes"]
    for condition, matrices in list(data["per_condition"].items()) + [("aggregated", data["aggregated"])]:
        for name, matrix in matrices.items():
            assert _symmetric(matrix), (condition, name)
            diagonal = np.diag(matrix)
            if name in ("observed_consistency", "soc"):
                np.testing.assert_allclose(diagonal, 1.0)
            if name == "cka":
                np.testing.assert_allclose(diagonal[: len(models)], 1.0)
                assert np.isnan(diagonal[len(models):]).all()
            if name in ("error_consistency", "misclassification_agreement", "soce"):
                assert np.all(np.isnan(diagonal) | np.isclose(diagonal, 1.0)), (condition, name)
            if name == "cles" and condition != "aggregated":
                rows = trials[trials["condition"] == condition]
                for k, system in enumerate(systems):
                    mine = rows[rows["subject"] == system]
                    y = mine["category"].map(classes.index).to_numpy()
                    p = mine["response"].map(classes.index).to_numpy()
                    expected = M.class_level_error_similarity(y, p, p, len(classes))
                    assert diagonal[k] == pytest.approx(expected, nan_ok=True)  # the paper variant's documented value


def test_end_to_end_rankings_correlations_and_unknown_report(compared):
    _, _, data = compared
    ranking = data["ranking"]
    assert set(ranking["mean_rank_mvh"]) == {"early", "trained"}
    for name in ("mean_rank_mvh", "mean_rank_all"):
        ranks = list(ranking[name].values())
        assert sum(ranks) == pytest.approx(3.0) and all(1 <= r <= 2 for r in ranks)  # two models: ranks 1 and 2 per metric
    for model in ("early", "trained"):
        assert set(ranking["values"][model]) >= {"accuracy_difference", "observed_consistency", "error_consistency", "misclassification_agreement", "cles"}
    spearman = data["spearman_between_metrics"]
    assert spearman["metrics"] == list(PAIR_METRICS)
    rho = np.array(spearman["rho"], dtype=float)
    assert rho[0, 0] == pytest.approx(1.0) and _symmetric(rho)
    unknown = data["unknown"]
    assert unknown["ood_sets"] == ["noise:uniform", "uniform_noise=0.9"]
    trained = unknown["systems"]["trained"]
    assert set(trained) == {"max_softmax", "energy", "mahalanobis", "knn", "react", "mc_dropout"}
    assert "error" not in trained["mc_dropout"]  # dropout inserted before the final layer, as configured
    for result in trained.values():
        assert 0 <= result["aurc"] <= 1 and 0 <= result["auroc"]["noise:uniform"] <= 1
    assert trained["mahalanobis"]["auroc"]["noise:uniform"] > 0.9
    assert trained["max_softmax"]["ece"] is not None and trained["energy"]["ece"] is None
    assert "ensemble" in unknown["systems"]["ensemble(early+trained)"]


def test_rerun_through_the_command_line_resumes_from_the_cache(compared):
    out, overrides, data = compared
    cached = sorted(p for p in (out / "cache").rglob("*") if p.is_file()) + sorted((out / "conditions").glob("*/manifest.json"))
    stamps = {p: p.stat().st_mtime_ns for p in cached}
    assert len(cached) > 20
    result = subprocess.run([sys.executable, "-m", "perceptual", "compare", *overrides], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "report:" in result.stdout and "trained" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in cached} == stamps  # nothing recomputed
    again = json.loads((out / "metrics.json").read_text())
    assert again["accuracy"] == json.loads(json.dumps(data["accuracy"]))
    assert np.allclose(np.array(again["aggregated"]["error_consistency"], dtype=float), data["aggregated"]["error_consistency"], equal_nan=True)


def test_bad_compare_configs_are_refused_before_any_work(tmp_path):
    def compose_with(*extra):
        with initialize_config_module(config_module="conf", version_base=None):
            return compose(config_name="compare", overrides=[f"out={tmp_path}", *extra])

    with pytest.raises(ValueError, match="no models given"):
        run(compose_with())
    model = "models=[{name:small_cnn,label:subject-1}]"
    with pytest.raises(ValueError, match="must not start with 'subject-'"):
        run(compose_with(model))
    model = "models=[{name:small_cnn,label:m}]"
    with pytest.raises(ValueError, match="unknown OOD set 'noise:pink'"):
        run(compose_with(model, "unknown.ood=[noise:pink]"))
    with pytest.raises(ValueError, match="unknown score function 'vim'"):
        run(compose_with(model, "unknown.scores=[vim]"))
    with pytest.raises(ValueError, match="OOD set 'contrast' names 8 conditions: give one"):  # failed after the whole panel run
        run(compose_with(model, "unknown.ood=[contrast]"))
    with pytest.raises(ValueError, match="unknown distortion generator 'swirl'"):
        run(compose_with(model, "conditions=[swirl]"))
    for n_fit in ("0", "-5"):  # 0 meant all training images; -5 failed after every condition had run
        with pytest.raises(ValueError, match=f"unknown.n_fit must be a positive number of training images \\(or null for all\\), got {n_fit}"):
            run(compose_with(model, f"unknown.n_fit={n_fit}"))
    for ood in ("['uniform_noise=0.9','uniform_noise=0.90']", "[noise:uniform,noise:uniform]"):  # the unified AURC pooled its images twice
        with pytest.raises(ValueError, match="unknown.ood names '.*' twice"):
            run(compose_with(model, f"unknown.ood={ood}"))
    # Refused in __init__: with humans_with_panel the human report was written first, a plain run loaded every model first.
    for override, message in (("observers=[pixel-l1]", r"observers must be auto or distinct names from \[.*\], got \['pixel-l1'\]"),
                              ("observers=[ssim,ssim]", "observers must be auto or distinct names"),
                              ("decisions.noise=nan", "noise must be finite and >= 0"), ("decisions.lapse=1.5", "lapse is a probability"),
                              ("decisions.k=0", "k must be a whole number >= 1"), ("decisions.seeds=[1,1]", "seeds must be a non-empty list of distinct"),
                              ("decisions.k=2.7", "k must be a whole number >= 1, got 2.7"),  # int() made it 2 before the check
                              ("decisions.seeds=[0.5,1.5]", r"seeds must be a non-empty list of distinct ints, got \[0.5, 1.5\]")):
        with pytest.raises(ValueError, match=message):
            run(compose_with(model, override))
    for group, typo in (("decisions", "lapse_rate"), ("metrics", "cles_varient"), ("unknown", "nfit")):  # Hydra refuses these; Python kept them
        with pytest.raises(ValueError, match=f"unknown {group} key\\(s\\) \\['{typo}'\\]: valid keys are"):
            ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["colour"], **{group: {typo: 1}})
    spelled = ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["colour"],
                              unknown={"ood": ["uniform_noise=0.90", "noise:gaussian"]})
    assert spelled.unknown_cfg["ood"] == ["uniform_noise=0.9", "noise:gaussian"]  # reported under the condition's own name
    # One bare value on the command line is one item: observers=ssim was the observers 's', 's', 'i', 'm' at the first image
    bare = ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["colour"],
                           observers="ssim", unknown={"scores": "energy", "ood": "noise:gaussian"})
    assert bare.unknown_cfg["scores"] == ["energy"] and bare.unknown_cfg["ood"] == ["noise:gaussian"]
    assert [o.name for o in make_panel(bare.observer_spec[0])] == ["ssim"]
    assert not (tmp_path / "conditions").exists()


def _pipeline(out, specs, **kwargs):
    from perceptual.pipelines.compare import ComparePipeline

    pipeline = ComparePipeline(specs, {"name": "digits", "root": None}, out, conditions=["colour=greyscale"], n_images=12, device="cpu",
                               observers=["pixel-l2"], progress=False, **kwargs)
    pipeline._load_data()
    torch.manual_seed(0)  # the same random weights for every build
    pipeline._build_models()
    return pipeline


def test_model_outputs_are_cached_by_the_models_identity_not_only_its_weights(tmp_path):
    """A k-WTA ratio is no weight: keyed by the weights, ratio 0.9 was served ratio 0.1's outputs."""
    from perceptual.measure import ModelSpec

    def logits(ratio, out):
        pipeline = _pipeline(out, [ModelSpec("kwta_small_cnn", None, "k", kwargs={"width": 4, "ratio": ratio})])
        return pipeline.weights["k"], pipeline._outputs("k", "targets", pipeline.targets.images, "id").logits

    (w1, first), (w9, cached) = logits(0.1, tmp_path / "shared"), logits(0.9, tmp_path / "shared")
    _, fresh = logits(0.9, tmp_path / "fresh")
    assert w1 == w9 and not torch.equal(first, fresh)
    assert torch.equal(cached, fresh)


def test_a_factory_entry_is_built_and_pretrained_is_not_dropped(tmp_path):
    from perceptual.measure import ModelSpec
    from training.models.defences import InputQuantised

    spec = ModelSpec(None, None, "q", factory="training.models.defences:input_quantised", kwargs={"name": "small_cnn", "dataset": "digits", "width": 4})
    assert isinstance(_pipeline(tmp_path, [spec]).models["q"], InputQuantised)
    with pytest.raises(ValueError, match="pretrained"):
        _pipeline(tmp_path / "p", [ModelSpec("small_cnn", None, "p", pretrained=True)])


def test_a_fractional_image_count_and_a_number_for_conditions_are_refused(tmp_path):
    """n_images=2.5 ran with 2 images without a word; conditions=3 was a TypeError traceback."""
    from perceptual.measure import ModelSpec
    from perceptual.pipelines.compare import ComparePipeline
    from stimuli.distortions import parse_conditions

    for bad in (2.5, 0):
        with pytest.raises(ValueError, match=rf"n_images must be a whole number >= 1, got {bad}"):
            ComparePipeline([ModelSpec("small_cnn", None, "m")], {"name": "digits", "root": None}, tmp_path, conditions=["colour"], n_images=bad)
    with pytest.raises(ValueError, match=r"a condition is a generator name.*got 3"):
        parse_conditions(3)
    with pytest.raises(ValueError, match=r"^decisions.exemplars_per_class must be a whole number >= 1, got 0"):
        ComparePipeline([ModelSpec("small_cnn", None, "m")], {"name": "digits", "root": None}, tmp_path, conditions=["colour"],
                        decisions={"exemplars_per_class": 0})


def test_a_model_that_does_not_serve_the_data_is_refused_by_its_label_before_any_condition(tmp_path):
    """A factory with 5 outputs on 10-class digits stopped the run in the first condition with "logits must be (N, 10
    classes)", naming no model; one expecting other image sizes with a raw addmm traceback."""
    from perceptual.measure import ModelSpec

    five = ModelSpec(None, None, "five", factory="torch.nn:Sequential", kwargs={})
    with pytest.raises(ValueError, match=r"model 'five' must map \(N, C, H, W\) images to \(N, classes\) logits"):
        _pipeline(tmp_path / "a", [ModelSpec("small_cnn", None, "good", kwargs={"width": 4}), five])
    narrow = ModelSpec("small_cnn", None, "narrow", kwargs={"width": 4, "num_classes": 5})
    with pytest.raises(ValueError, match=r"model 'narrow' has 5 outputs but digits has 10 classes"):
        _pipeline(tmp_path / "b", [narrow])
    assert not (tmp_path / "b" / "conditions").exists()


def test_unknown_caches_follow_the_data_and_a_failure_of_the_run_is_not_cached(tmp_path, monkeypatch):
    """Keyed by the data set's name and indices, another copy of the data (cifar-10-mini and CIFAR-10 share a name) reused
    the first one's outputs; a RuntimeError (out of memory) was cached as the score's permanent result."""
    import perceptual.pipelines.compare as compare_module
    from perceptual.measure import ModelSpec

    unknown = {"scores": ["max_softmax"], "ood": ["noise:uniform"], "n_fit": 20, "ensemble": False}
    specs = [ModelSpec("small_cnn", None, "m", kwargs={"width": 4})]
    _pipeline(tmp_path, specs, unknown=unknown)._unknown()
    fit_file = tmp_path / "cache" / "models" / "m" / "fit.safetensors"
    stamp = fit_file.stat().st_mtime_ns
    real = compare_module.dataset_from_config

    def inverted(cfg, split):  # the same name, sizes and labels; other pixels
        data = real(cfg, split)
        return data if split == "test" else type(data)(data.name, split, 255 - data.images, data.labels, data.classes, dict(data.meta))

    monkeypatch.setattr(compare_module, "dataset_from_config", inverted)
    _pipeline(tmp_path, specs, unknown=unknown)._unknown()
    assert fit_file.stat().st_mtime_ns != stamp

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.undo()
    pipeline = _pipeline(tmp_path / "oom", specs, unknown=unknown)
    monkeypatch.setattr(compare_module, "make_score", out_of_memory)
    assert "out of memory" in pipeline._unknown()["systems"]["m"]["max_softmax"]["error"]
    monkeypatch.undo()
    assert "error" not in _pipeline(tmp_path / "oom", specs, unknown=unknown)._unknown()["systems"]["m"]["max_softmax"]


def test_reports_name_missing_lpips_weights_only_for_the_random_backbone():
    from perceptual.observers import offline_variants

    assert offline_variants(["lpips", "pretrained backbone, no heads", "weight-free"]) == []
    assert offline_variants(["random backbone, real heads", "random backbone, no heads", "weight-free"]) == [
        "random backbone, no heads", "random backbone, real heads"]


def test_a_figure_that_fails_to_draw_loses_no_number(compared, tmp_path, monkeypatch):
    import perceptual.compare_report as report_module

    out, _, data = compared
    data = {k: v for k, v in data.items() if k != "unknown"}

    def broken(*args, **kwargs):
        raise ValueError("ParseSyntaxException")

    monkeypatch.setattr(report_module, "heatmap", broken)
    conditions = parse_conditions(data["conditions"], 224)
    with pytest.raises(ValueError, match="ParseSyntaxException"):
        report_module.write_outputs(data, None, tmp_path, conditions)
    assert json.loads((tmp_path / "metrics.json").read_text())["systems"] == data["systems"]


def test_ranking_and_condition_means_name_what_is_empty():
    from perceptual.pair_metrics import rankings
    from perceptual.report import image_grid

    with pytest.raises(ValueError, match="no per-condition matrices"):
        nanmean_matrices([])
    with pytest.raises(ValueError, match=r"at least one of each: got 0 model\(s\) and 2 subject\(s\)"):
        rankings(pd.DataFrame(), {}, ["subject-a", "subject-b"], [], ["subject-a", "subject-b"], "nan")
    with pytest.raises(ValueError, match="at least one row with an image"):
        image_grid({}, [], "unused.png")


def test_compare_figures_have_titles_and_labelled_axes(tmp_path, monkeypatch):
    import perceptual.compare_report as report_module
    from stimuli.distortions import Distortion

    drawn = []

    def record(fig, path):
        ax = fig.axes[0]
        drawn.append((ax.get_title(), ax.get_xlabel(), ax.get_ylabel()))
        return path

    monkeypatch.setattr(report_module, "save_figure", record)
    report_module.heatmap(np.eye(2), ["a", "b"], tmp_path / "h.png", "error consistency")
    conditions = [Distortion("contrast", 1.0), Distortion("contrast", 0.3)]
    accuracy = {c.name: {"m": 0.5, "subject-1": 0.6} for c in conditions}
    report_module.accuracy_figure(accuracy, conditions, ["m"], ["subject-1"], tmp_path / "a.png", "contrast")
    unknown = {"ood_sets": ["noise:uniform"], "systems": {"m": {"energy": {"auroc": {"noise:uniform": 0.7}}}}}
    report_module._unknown_figure(unknown, tmp_path / "u.png")
    assert len(drawn) == 3 and all(title and xlabel and ylabel for title, xlabel, ylabel in drawn), drawn


def test_accuracy_figures_run_from_undistorted_to_most_distorted_with_chance_and_the_band_named(tmp_path, monkeypatch):
    """conditions=[low_pass=10,low_pass=0,low_pass=3] drew 10, 0, 3 left to right (a zig-zag that looked like an effect);
    the grey band was in no legend, there was no chance line, and the x axis read 'rotation' without its unit."""
    import perceptual.compare_report as report_module
    from stimuli.distortions import Distortion, in_grid_order

    drawn = []
    monkeypatch.setattr(report_module, "save_figure", lambda fig, path: drawn.append(fig.axes[0]) or path)
    conditions = [Distortion("low_pass", 10), Distortion("rotation", 90), Distortion("low_pass", 0), Distortion("low_pass", 3),
                  Distortion("rotation", 0)]
    assert [c.name for c in in_grid_order(conditions)] == ["low_pass=0", "low_pass=3", "low_pass=10", "rotation=0", "rotation=90"]
    high = [Distortion("high_pass", 0.4), Distortion("high_pass", "inf"), Distortion("high_pass", 1.5)]
    assert [c.name for c in in_grid_order(high)] == ["high_pass=inf", "high_pass=1.5", "high_pass=0.4"]  # its grid runs downwards
    off_grid = [Distortion("low_pass", 50), Distortion("low_pass", 2), Distortion("high_pass", 2), Distortion("low_pass", 0),
                Distortion("high_pass", "inf")]  # levels between the grid's fall in place by value, in the grid's direction
    assert [c.name for c in in_grid_order(off_grid)] == ["low_pass=0", "low_pass=2", "low_pass=50", "high_pass=inf", "high_pass=2"]
    colour = [Distortion("colour", "greyscale"), Distortion("colour", "colour")]
    assert [c.name for c in in_grid_order(colour)] == ["colour=colour", "colour=greyscale"]
    accuracy = {c.name: {"m": 0.5, "subject-1": 0.6} for c in conditions}
    report_module.accuracy_figure(accuracy, conditions, ["m"], ["subject-1"], tmp_path / "a.png", "low_pass", num_classes=10)
    report_module.accuracy_figure(accuracy, conditions, ["m"], ["subject-1"], tmp_path / "r.png", "rotation")
    low_pass, rotation = drawn
    assert [t.get_text() for t in low_pass.get_xticklabels()] == ["0", "3", "10"]
    legend = [t.get_text() for t in low_pass.get_legend().get_texts()]
    assert legend == ["m", "observers (n=1)", "observers ± std", "chance (1/10)"]
    assert "degrees" in rotation.get_xlabel() and "chance" not in " ".join(t.get_text() for t in rotation.get_legend().get_texts())


def test_a_model_without_a_penultimate_layer_is_compared_on_its_logits(tmp_path, monkeypatch):
    """A factory's nn.Sequential names no penultimate layer: compare stopped with "pass layer=", which it refuses. Its
    logits are compared now; CKA with it is undefined and the feature scores do not apply to it. A rerun without the
    unknown report left the first run's unknown.json beside the new metrics."""
    from perceptual.measure import ModelSpec
    from perceptual.pipelines.compare import ComparePipeline

    (tmp_path / "plain_models.py").write_text(
        "import torch\n\ndef sequential():\n    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = [ModelSpec(factory="plain_models:sequential", label="plain"), ModelSpec("small_cnn", label="cnn", kwargs={"width": 4})]
    torch.manual_seed(0)
    data = ComparePipeline(specs, {"name": "digits", "root": None}, tmp_path / "out", conditions=["colour=greyscale"], n_images=12,
                           device="cpu", observers=["pixel-l2"], progress=False,
                           unknown={"scores": ["max_softmax", "mahalanobis"], "ood": ["noise:uniform"], "n_fit": 20, "ensemble": False}).run()
    systems = data["systems"]
    cka = data["aggregated"]["cka"]
    assert np.isnan(cka[systems.index("plain"), systems.index("cnn")]) and np.isfinite(cka[systems.index("cnn"), systems.index("cnn")])
    assert np.isfinite(data["aggregated"]["error_consistency"][systems.index("plain"), systems.index("cnn")])
    scores = data["unknown"]["systems"]
    assert "auroc" in str(scores["plain"]["max_softmax"]) and "penultimate" in scores["plain"]["mahalanobis"]["error"]
    assert "`penultimate` attribute" in scores["plain"]["mahalanobis"]["error"]  # what a command-line user can do about it
    assert "error" not in scores["cnn"]["mahalanobis"]
    # a rerun into the folder without the unknown report and with other conditions leaves none of the first run's files
    figures = tmp_path / "out" / "figures"
    assert (tmp_path / "out" / "unknown.json").is_file() and (figures / "unknown_auroc.png").is_file() and (figures / "accuracy_colour.png").is_file()
    ComparePipeline(specs, {"name": "digits", "root": None}, tmp_path / "out", conditions=["contrast=0.5"], n_images=12, device="cpu",
                    observers=["pixel-l2"], progress=False, unknown={"enabled": False}).run()
    assert sorted(p.name for p in figures.glob("*unknown*")) == [] and not (tmp_path / "out" / "unknown.json").exists()
    assert (figures / "accuracy_contrast.png").is_file() and not (figures / "accuracy_colour.png").exists()


def _constructed_behaviour(benchmark_exclusions: bool) -> dict:
    """``_behaviour`` on constructed answers: the model is right everywhere but on greyscale; the subject is right
    everywhere but on contrast=1 (the benchmark's excluded control)."""
    from types import SimpleNamespace

    pipeline = ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, "unused", conditions=["contrast", "colour"],
                               observers=["pixel-l2"], progress=False, metrics={"benchmark_exclusions": benchmark_exclusions})
    labels = np.array([0, 1, 0, 1])
    pipeline.labels, pipeline.classes, pipeline.models = labels, ["zero", "one"], {"m": None}
    pipeline.decider = SimpleNamespace(subject_names=["subject-s"])
    wrong_on = {"m": "colour=greyscale", "subject-s": "contrast=1"}
    responses, rows = {}, []
    for condition in pipeline.conditions:
        responses[condition.name] = {}
        for system in ("m", "subject-s"):
            predictions = 1 - labels if condition.name == wrong_on[system] else labels
            responses[condition.name][system] = Responses(predictions, np.eye(2)[predictions])
            rows += [{"subject": system, "dataset": condition.generator, "condition": condition.name, "image_id": i,
                      "correct": bool(predictions[i] == labels[i])} for i in range(4)]
    return pipeline._behaviour(pd.DataFrame(rows), responses)


def test_the_panel_ranking_averages_each_generators_conditions_then_the_generators_without_the_benchmarks_exclusions():
    """Every condition weighed the same: contrast's 8 levels counted four times colour's 2, and the controls
    (contrast=1, colour=colour, ...) that model-vs-human's table leaves out were ranked."""
    data = _constructed_behaviour(benchmark_exclusions=True)
    assert data["excluded"] == {"contrast": ["contrast=1", "contrast=0.03", "contrast=0.01"], "colour": ["colour=colour"]}
    # ranked: contrast 0.5 ... 0.05 (both right) and greyscale (the model wrong): |difference| 0 and 1, one per generator
    assert data["ranking"]["values"]["m"]["accuracy_difference"] == pytest.approx(0.5)
    assert data["accuracy_mean"]["m"] == pytest.approx(0.5) and data["accuracy_mean"]["subject-s"] == pytest.approx(1.0)
    systems = data["systems"]
    observed = data["aggregated"]["observed_consistency"][systems.index("m"), systems.index("subject-s")]
    assert observed == pytest.approx(0.5)  # agree on every ranked contrast level, disagree on greyscale
    assert set(data["accuracy"]) == {c.name for c in parse_conditions(["contrast", "colour"], 224)}  # per condition: all kept
    # the error alignment takes the ranked conditions too (it took the controls, identical copies for a model)
    assert set(data["ranked_conditions"]) == set(data["accuracy"]) - {"contrast=1", "contrast=0.03", "contrast=0.01", "colour=colour"}

    everything = _constructed_behaviour(benchmark_exclusions=False)
    assert everything["excluded"] == {}
    # contrast: the model and subject differ on 1 of 8 levels; colour: on 1 of 2 -> (1/8 + 1/2) / 2, not (1 + 1) / 10
    assert everything["ranking"]["values"]["m"]["accuracy_difference"] == pytest.approx((1 / 8 + 1 / 2) / 2)
    assert everything["accuracy_mean"]["m"] == pytest.approx((1 + 1 / 2) / 2)


def test_conditions_that_are_all_excluded_are_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"every condition .*'contrast=1', 'rotation=0'.* leaves out.*metrics.benchmark_exclusions=false"):
        ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["contrast=1", "rotation=0"],
                        observers=["pixel-l2"])
    with pytest.raises(ValueError, match=r"metrics.benchmark_exclusions must be one of \(True, False\)"):
        ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["contrast"],
                        observers=["pixel-l2"], metrics={"benchmark_exclusions": "yes"})


def test_the_benchmark_exclusions_are_model_vs_humans_on_this_toolkits_grids():
    from perceptual.metrics import MVH_EXCLUDED_CONDITIONS
    from perceptual.pipelines.compare import BENCHMARK_EXCLUDED_PARAMETERS
    from stimuli.distortions import GRIDS

    experiment_of = {"colour": "colour", "contrast": "contrast", "high_pass": "high-pass", "low_pass": "low-pass", "phase_noise": "phase-scrambling",
                     "power_equalisation": "power-equalisation", "opponent_colour": "false-colour", "rotation": "rotation",
                     "uniform_noise": "uniform-noise"}
    assert set(BENCHMARK_EXCLUDED_PARAMETERS) == set(experiment_of) == set(GRIDS)
    for generator, parameters in BENCHMARK_EXCLUDED_PARAMETERS.items():
        assert set(parameters) <= set(GRIDS[generator]), generator  # spelt as the grid spells them
        theirs = MVH_EXCLUDED_CONDITIONS[experiment_of[generator]]
        assert len(parameters) == len(theirs), generator
        if generator == "contrast":  # c100 = 100 % contrast
            assert sorted(parameters) == sorted(int(c[1:]) / 100 for c in theirs)
        elif isinstance(parameters[0], float):
            assert sorted(parameters) == sorted(float(c) for c in theirs), generator


def test_conditions_of_flat_grey_images_are_left_out_of_the_averages_and_the_ranking(tmp_path):
    """At 32 px high-pass 1 stores every image as one grey level: two systems that answer one class there agree on every
    image (error consistency 1) and raised every average, benchmark_exclusions or not."""
    from types import SimpleNamespace

    conditions = ["high_pass=1", "high_pass=3", "rotation=90"]
    pipeline = ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=conditions,
                               observers=["pixel-l2"], progress=False, metrics={"benchmark_exclusions": False})
    pipeline._leave_out_flat_conditions(32)
    assert pipeline.below_resolution == ["high_pass=1"]
    labels = np.array([0, 1, 0, 1])
    pipeline.labels, pipeline.classes, pipeline.models = labels, ["zero", "one"], {"m": None}
    pipeline.decider = SimpleNamespace(subject_names=["subject-s"])
    answers = {"high_pass=1": {"m": [0, 0, 0, 0], "subject-s": [0, 0, 0, 0]},  # one class for the flat images: alike
               "high_pass=3": {"m": [0, 1, 1, 1], "subject-s": [1, 1, 0, 1]}, "rotation=90": {"m": [0, 0, 0, 1], "subject-s": [0, 1, 1, 1]}}
    responses, rows = {}, []
    for condition in pipeline.conditions:
        responses[condition.name] = {}
        for system, predictions in answers[condition.name].items():
            predictions = np.array(predictions)
            responses[condition.name][system] = Responses(predictions, np.eye(2)[predictions])
            rows += [{"subject": system, "dataset": condition.generator, "condition": condition.name, "image_id": i,
                      "correct": bool(predictions[i] == labels[i])} for i in range(4)]
    data = pipeline._behaviour(pd.DataFrame(rows), responses)
    assert data["below_resolution"] == ["high_pass=1"] and data["excluded"] == {}
    assert data["ranked_conditions"] == ["high_pass=3", "rotation=90"]
    systems = data["systems"]
    observed = data["aggregated"]["observed_consistency"][systems.index("m"), systems.index("subject-s")]
    assert observed == pytest.approx((2 / 4 + 2 / 4) / 2)  # high-pass 3 alone for high-pass, then rotation: not (1 + 1/2) / 2
    with pytest.raises(ValueError, match=r"every condition \(\['high_pass=1', 'high_pass=0.7'\]\) is left out .*flat grey image at 32 px"):
        ComparePipeline([ModelSpec("small_cnn", label="m")], {"name": "digits", "root": None}, tmp_path, conditions=["high_pass=1", "high_pass=0.7"],
                        observers=["pixel-l2"])._leave_out_flat_conditions(32)


def test_rewritten_outputs_keep_no_stale_per_condition_heatmaps_and_cell_text_stays_readable(compared, tmp_path, monkeypatch):
    """A run without per_condition_figures (or with other conditions) kept an earlier run's figures/conditions/<c>/;
    on coolwarm's pale middle the values near 0 were written white on near-white."""
    import matplotlib.figure

    import perceptual.compare_report as report_module

    out, _, data = compared
    data = {k: v for k, v in data.items() if k != "unknown"}
    conditions = parse_conditions(data["conditions"], 224)
    report_module.write_outputs(data, None, tmp_path, conditions, per_condition_figures=True)
    stale = tmp_path / "figures" / "conditions" / "gone=1"
    stale.mkdir()
    (stale / "heatmap_x.png").write_bytes(b"old")
    report_module.write_outputs(data, None, tmp_path, conditions, per_condition_figures=True)
    assert not stale.exists() and sorted(p.name for p in (tmp_path / "figures" / "conditions").iterdir()) == sorted(data["per_condition"])
    report_module.write_outputs(data, None, tmp_path, conditions)
    assert not any((tmp_path / "figures" / "conditions").iterdir())

    colours = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: colours.update(
        {t.get_text(): t.get_color() for ax in fig.axes for t in ax.texts}))
    report_module.heatmap(np.array([[-0.05, 0.9], [-0.9, 0.05]]), ["a", "b"], tmp_path / "h.png", "t", vmin=-1, vmax=1, cmap="coolwarm")
    assert colours["-0.05"] == colours["0.05"] == "black" and colours["0.90"] == colours["-0.90"] == "white"
