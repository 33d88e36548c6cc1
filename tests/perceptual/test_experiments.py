"""The paper's results from constructed measure reports: exact statistics on inputs built to have them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perceptual.experiments import Variant, baseline_pairs, comparison_pairs, correlation_with_interval, experiment_result, gaussian_result, paired_against

TASKS = ("2afc", "clustering")


def _model(scores: dict[str, dict[str, list[float]]], robust: float | None = 0.5, converged: bool = True, gaussian: dict | None = None) -> dict:
    """A measure report's model entry: task -> observer -> per-target scores (targets t0, t1, ...)."""
    per_observer = {task: {o: {"per_target": {f"t{i}": v for i, v in enumerate(values)}} for o, values in observers.items()}
                    for task, observers in scores.items()}
    entry = {"per_observer": per_observer, "clean_accuracy": 0.9, "robust_accuracy": robust, "converged": converged}
    for task, observers in scores.items():
        means = [float(np.mean(v)) for v in observers.values()]
        entry[task] = {"mean": float(np.mean(means)), "std": float(np.std(means, ddof=1)) if len(means) > 1 else 0.0}
    if gaussian is not None:
        entry["gaussian"] = gaussian
    return entry


def _variant(arch: str, training: str) -> Variant:
    return Variant(arch, training, "small_cnn")


def test_paired_difference_against_the_baseline_is_exact_on_a_constant_shift():
    base = {"a": [0.0, 1.0, 0.0, 1.0, 0.5, 0.5], "b": [1.0, 1.0, 0.0, 0.0, 0.5, 0.5]}  # 6 targets: fewer never separate
    shifted = {o: [v + 0.25 for v in values] for o, values in base.items()}
    models = {"cnn-standard": _model({"2afc": base}), "cnn-pgd": _model({"2afc": shifted})}
    diff = paired_against(models, [("cnn-pgd", "cnn-standard")], ["2afc", "clustering"], n_boot=200)
    result = diff["cnn-pgd - cnn-standard"]["2afc"]
    # Every target moves by exactly 0.25, so every bootstrap draw does too: the interval has no width.
    assert result["difference"] == pytest.approx(0.25) and result["ci_low"] == pytest.approx(0.25) and result["ci_high"] == pytest.approx(0.25)
    assert result["separated"]
    assert "clustering" not in diff["cnn-pgd - cnn-standard"]  # a task the report lacks gets no interval, not a wrong one


def test_baseline_pairs_compare_within_an_architecture():
    variants = [_variant("cnn", "standard"), _variant("cnn", "pgd"), _variant("resnet", "standard"), _variant("resnet", "trades"),
                _variant("resnet", "mart")]
    assert baseline_pairs(variants) == [("cnn-pgd", "cnn-standard"), ("resnet-trades", "resnet-standard"), ("resnet-mart", "resnet-standard")]


def test_a_presets_comparisons_pair_trainings_within_each_architecture(tmp_path):
    """Fig. 6 asks about augmentation under each loss: pgd_aug against pgd_noaug, not against standard_noaug."""
    variants = [_variant(a, t) for a in ("cnn", "vgg") for t in ("standard_noaug", "standard_aug", "pgd_noaug", "pgd_aug")][:-1]  # vgg lacks pgd_aug
    fig6 = [["standard_aug", "standard_noaug"], ["pgd_aug", "pgd_noaug"]]
    assert comparison_pairs(variants, fig6) == [("cnn-standard_aug", "cnn-standard_noaug"), ("cnn-pgd_aug", "cnn-pgd_noaug"),
                                                ("vgg-standard_aug", "vgg-standard_noaug")]
    assert comparison_pairs(variants, None) == baseline_pairs(variants)
    for bad, message in ((["pgd_aug"], "two different trainings"), ([["pgd_aug", "pgd_aug"]], "two different trainings"), ([3], "two different trainings"),
                         ([["pgd_aug", "trades"]], r"names \['trades'\], not trainings")):
        with pytest.raises(ValueError, match=message):
            comparison_pairs(variants, bad)
    with pytest.raises(ValueError, match="no architecture has both"):
        comparison_pairs([_variant("cnn", "pgd_aug"), _variant("vgg", "pgd_noaug")], [["pgd_aug", "pgd_noaug"]])
    scores = {"2afc": {"a": [0.0, 0.5], "b": [0.5, 0.0]}}
    data = {"models": {v.label: _model({t: {o: [x + 0.1 * i for x in xs] for o, xs in obs.items()} for t, obs in scores.items()})
                       for i, v in enumerate(variants)}}
    grid = experiment_result("grid", data, variants, ["2afc"], "Fig. 6", tmp_path, n_boot=50, comparisons=fig6)
    assert list(grid["differences"]) == ["cnn-standard_aug - cnn-standard_noaug", "cnn-pgd_aug - cnn-pgd_noaug", "vgg-standard_aug - vgg-standard_noaug"]
    assert grid["differences"]["cnn-pgd_aug - cnn-pgd_noaug"]["2afc"]["difference"] == pytest.approx(0.1)


def test_a_correlation_over_too_few_models_has_no_interval(tmp_path):
    """Of three models every defined bootstrap draw is a reordering of them: an interval of zero width, not certainty."""
    three = correlation_with_interval([0.1, 0.2, 0.3], [0.3, 0.1, 0.6], n_boot=200)
    assert three["spearman"]["value"] == pytest.approx(0.5) and math.isnan(three["spearman"]["ci_low"]) and three["spearman"]["valid_draws"] == 0
    five = correlation_with_interval([0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.1, 0.6, 0.5, 0.9], n_boot=200)
    assert five["spearman"]["ci_low"] < five["spearman"]["value"] < five["spearman"]["ci_high"]
    variants = [_variant("cnn", t) for t in ("standard", "pgd", "trades")]
    data = {"models": {f"cnn-{t}": _model({"2afc": {"a": [s, s]}}, robust=r) for t, s, r in (("standard", 0.3, 0.1), ("pgd", 0.1, 0.2), ("trades", 0.6, 0.3))}}
    markdown = experiment_result("scatter", data, variants, ["2afc"], "Fig. 4", tmp_path, n_boot=100)["markdown"]
    assert "| 2AFC | 3 | +0.50 (no interval from 3 models) |" in markdown


def test_correlation_is_one_for_a_monotone_relation_and_undefined_for_a_constant():
    x = [0.1, 0.2, 0.3, 0.4, 0.5]
    corr = correlation_with_interval(x, [v ** 3 for v in x], n_boot=300)
    assert corr["spearman"]["value"] == pytest.approx(1.0)
    # Any resample of a monotone relation is monotone: the Spearman interval is exactly [1, 1].
    assert corr["spearman"]["ci_low"] == pytest.approx(1.0) and corr["spearman"]["ci_high"] == pytest.approx(1.0)
    assert corr["pearson"]["value"] < 1.0 and corr["pearson"]["ci_low"] <= corr["pearson"]["value"] + 1e-9
    flat = correlation_with_interval(x, [0.0] * 5, n_boot=50)
    assert math.isnan(flat["spearman"]["value"]) and flat["spearman"]["valid_draws"] == 0
    assert math.isnan(correlation_with_interval([0.1, 0.2], [0.3, 0.4])["pearson"]["value"])  # two models: no correlation


def test_correlation_drops_non_finite_models():
    corr = correlation_with_interval([0.1, 0.2, float("nan"), 0.4], [1.0, 2.0, 3.0, 4.0], n_boot=50)
    assert corr["n_models"] == 3 and corr["spearman"]["value"] == pytest.approx(1.0)


def test_table_and_grid_results_mark_unconverged_models_and_write_the_figure(tmp_path):
    scores = {"2afc": {"a": [0.0, 0.0], "b": [0.0, 1.0]}, "clustering": {"a": [1.0, 0.0], "b": [1.0, 1.0]}}
    better = {t: {o: [min(1.0, v + 0.5) for v in vals] for o, vals in obs.items()} for t, obs in scores.items()}
    variants = [_variant("cnn", "standard"), _variant("cnn", "pgd")]
    data = {"models": {"cnn-standard": _model(scores, converged=False), "cnn-pgd": _model(better)}}
    table = experiment_result("table", data, variants, list(TASKS), "Table 1", tmp_path, n_boot=100)
    assert "cnn-standard †" in table["markdown"] and "cnn-pgd - cnn-standard" in table["markdown"]
    assert table["variants"][1]["label"] == "cnn-pgd"
    grid = experiment_result("grid", data, variants, list(TASKS), "Fig. 6", tmp_path, n_boot=100)
    assert grid["figures"] == ["grid.png"] and (tmp_path / "grid.png").stat().st_size > 1000


def test_scatter_result_reports_the_correlation_and_needs_robust_accuracy(tmp_path):
    variants = [_variant("resnet", t) for t in ("standard", "pgd", "trades")]
    data = {"models": {f"resnet-{t}": _model({"2afc": {"a": [s, s]}}, robust=r) for t, s, r in
                       (("standard", 0.1, 0.0), ("pgd", 0.5, 0.3), ("trades", 0.9, 0.4))}}
    result = experiment_result("scatter", data, variants, ["2afc"], "Fig. 4", tmp_path, n_boot=100)
    assert result["correlations"]["2afc"]["spearman"]["value"] == pytest.approx(1.0)
    assert (tmp_path / "scatter_2afc.png").exists()
    data["models"]["resnet-pgd"]["robust_accuracy"] = None
    with pytest.raises(ValueError, match="robust accuracy"):
        experiment_result("scatter", data, variants, ["2afc"], "Fig. 4", tmp_path)


def test_gaussian_result_sits_beside_the_test_images_and_refuses_a_report_without_them():
    gaussian = {"2afc": {"mean": 0.25, "std": 0.0}}
    variants = [_variant("resnet", "standard")]
    data = {"models": {"resnet-standard": _model({"2afc": {"a": [1.0, 0.0]}}, gaussian=gaussian)}}
    result = gaussian_result(data, variants, ["2afc"], "Table 3")
    assert result["table"]["resnet-standard"]["2afc"] == {"test": 0.5, "gaussian": 0.25}
    assert "| resnet-standard | 50.0 ± 0.0 | 25.0 ± 0.0 |" in result["markdown"]
    del data["models"]["resnet-standard"]["gaussian"]
    with pytest.raises(ValueError, match="gaussian_targets"):
        gaussian_result(data, variants, ["2afc"], "Table 3")


def test_unknown_result_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment result"):
        experiment_result("bars", {"models": {}}, [], ["2afc"], "x", tmp_path)
