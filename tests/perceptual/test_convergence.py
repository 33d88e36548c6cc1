"""Convergence is part of the measurement: per-item distances, their curve, the converged fraction, the
warning (or error with strict) and alignment over converged items only."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from perceptual.convergence import convergence_figure, convergence_sentence, convergence_summary, is_converged
from perceptual.measure import ModelSpec, measure_models
from perceptual.observers import Panel, PixelL2Observer
from perceptual.pipelines.measure import check_convergence
from training.checkpoints import save_checkpoint
from training.models import build_model


def _set(best, last, curves):
    rows = [{"id": "t0", "role": "target"}] + [
        {"id": f"r{i}", "role": "result", "seed_type": "noise" if i % 2 == 0 else "train", "final_loss": b, "last_loss": l}
        for i, (b, l) in enumerate(zip(best, last))
    ]
    curve = torch.tensor([[math.nan] * len(curves[0])] + curves, dtype=torch.float32)
    return SimpleNamespace(manifest=pd.DataFrame(rows), loss_curve=curve, curve_steps=[0, 50, 100])


def test_summary_of_a_constructed_set_counts_items_under_the_threshold():
    s = _set([0.01, 0.04, 0.2, 0.5], [0.02, 0.05, 0.3, 0.5], [[1.0, 0.5, 0.01], [1.0, 0.4, 0.04], [1.0, 0.6, 0.2], [1.0, 0.9, 0.5]])
    summary = convergence_summary(s, threshold=0.05)
    assert summary["n_items"] == 4 and summary["converged_fraction"] == 0.5
    assert summary["converged_ids"] == ["r0", "r1"]
    assert summary["best_median"] == pytest.approx(0.12) and summary["last_median"] == pytest.approx(0.175)
    assert summary["best_p90"] == pytest.approx(0.41)
    assert summary["curve"]["steps"] == [0, 50, 100] and summary["curve"]["median"] == pytest.approx([1.0, 0.55, 0.12])
    assert summary["by_seed_type"]["noise"]["converged_fraction"] == 0.5
    assert is_converged(summary) and "NOT CONVERGED" not in convergence_sentence("m", summary)
    stricter = convergence_summary(s, threshold=0.02)
    assert stricter["converged_fraction"] == 0.25 and not is_converged(stricter)
    assert "NOT CONVERGED" in convergence_sentence("m", stricter)
    with pytest.raises(ValueError, match="positive number"):
        convergence_summary(s, threshold=0)


def test_convergence_is_judged_on_the_inversion_distance_not_on_the_objective_with_priors(caplog):
    """With tv_weight the set's final_loss adds the prior: 0.07 for items whose distance is 0.04 read as unconverged."""
    s = _set([0.07, 0.07, 0.07], [0.08, 0.08, 0.08], [[1.0, 0.5, 0.07]] * 3)
    s.parameters = {"engine": {"tv_weight": 0.05, "lp_weight": 0.0}}
    s.manifest["final_task_loss"] = [math.nan, 0.04, 0.045, 0.07]  # the target row has none
    summary = convergence_summary(s, threshold=0.05)
    assert summary["converged_ids"] == ["r0", "r1"] and summary["best_median"] == pytest.approx(0.045)
    assert summary["by_seed_type"]["noise"]["converged_fraction"] == 0.5 and summary["curve_includes_priors"]
    assert not caplog.records
    s.manifest["final_task_loss"] = math.nan  # a set made before the column: the whole objective, said so
    with caplog.at_level("WARNING", logger="perceptual.convergence"):
        assert convergence_summary(s, threshold=0.05)["converged_fraction"] == 0.0
    assert "tv_weight" in caplog.text and "remake the set" in caplog.text


def test_an_inversion_set_made_with_a_prior_records_each_results_distance(tmp_path):
    import stimuli
    from invert import InversionLoss
    from training import load_dataset

    torch.manual_seed(0)
    representation = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, 2, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten()).eval()
    targets = stimuli.select_targets(load_dataset("digits", "test"), n=3, seed=0)
    engine = {"steps": 15, "step_size": 0.5, "tv_weight": 0.05, "progress": False}
    s = stimuli.make_inversion_set(tmp_path / "set", stimuli.ModelRef("tiny", representation), targets, seed_types=("noise",), engine=engine,
                                   preview=False)
    results, images = s.role("result")
    target_rows, target_images = s.role("target")
    order = [list(target_rows["id"]).index(t) for t in results["target_id"]]
    with torch.no_grad():
        distance = InversionLoss(representation, target_images[order])(images).double().numpy()
    assert results["final_task_loss"].to_numpy() == pytest.approx(distance, rel=1e-4)
    assert (results["final_loss"].to_numpy() > distance).all()  # the prior's share
    assert convergence_summary(s, threshold=1.0)["best_median"] == pytest.approx(float(pd.Series(distance).median()), rel=1e-4)


def test_convergence_figure_is_written(tmp_path):
    s = _set([0.01, 0.2], [0.01, 0.3], [[1.0, 0.5, 0.01], [1.0, 0.6, 0.2]])
    path = convergence_figure({"a": convergence_summary(s), "b": convergence_summary(s, 0.3)}, tmp_path / "c.png")
    assert path.is_file() and path.stat().st_size > 1000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(3)
    return save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path_factory.mktemp("conv") / "m.safetensors")


def _measure(out, checkpoint, steps, **kwargs):
    return measure_models(
        [ModelSpec("small_cnn", str(checkpoint), "m", kwargs={"width": 8})], {"name": "digits", "root": None}, out,
        engine={"steps": steps, "log_every": 5, "progress": False, "patience": None}, n_targets=3, seed_types=("noise",),
        panel=Panel([PixelL2Observer()]), threat=None, accuracy_limit=8, device="cpu", **kwargs,
    )


def test_too_few_steps_are_reported_as_not_converged_with_a_warning_or_an_error(tmp_path, checkpoint):
    data = _measure(tmp_path / "r", checkpoint, steps=2)
    assert data["not_converged"] == ["m"] and not data["models"]["m"]["converged"]
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| m † |" in report and "NOT CONVERGED" in report and "## Convergence" in report
    assert (tmp_path / "r" / "convergence.png").is_file()
    with pytest.warns(UserWarning, match="inversions did not converge"):
        check_convergence(data)
    with pytest.raises(SystemExit, match="strict=true"):
        check_convergence(data, strict=True)


def test_a_converged_run_is_not_marked_and_converged_only_sits_beside_all_items(tmp_path, checkpoint):
    # an untrained small CNN is easy to invert: after 150 steps the 90th-percentile distance was 0.13-0.22 (init seeds 3-5)
    data = _measure(tmp_path / "r", checkpoint, steps=150, convergence_threshold=0.3, converged_only=True)
    model = data["models"]["m"]
    assert model["convergence"]["converged_fraction"] == 1.0 and model["converged"] and data["not_converged"] == []
    check_convergence(data, strict=True)  # nothing to complain about
    assert set(model["converged_only"]) == {"2afc", "clustering", "clustering_hard"}
    assert model["converged_only"]["2afc"]["mean"] == model["2afc"]["mean"]  # every item converged: the same trials
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| m |" in report and "## Converged items only" in report


def test_gaussian_targets_are_measured_beside_the_test_images(tmp_path, checkpoint):
    data = _measure(tmp_path / "r", checkpoint, steps=3, gaussian_targets=True)
    gaussian = data["models"]["m"]["gaussian"]
    assert [g["name"] for g in gaussian["gaussians"]] == ["dark", "light"]
    assert gaussian["2afc"]["observers"]["pixel-l2"] is not None and gaussian["convergence"]["n_items"] == 3
    from stimuli import load_set

    ood = load_set(gaussian["set"])
    assert set(ood.role("target")[0]["source"]) == {"gaussian:dark", "gaussian:light"}
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## In-distribution vs Gaussian targets (Nanda et al. Table 3)" in report
    assert "| m | test images |" in report and "| m | Gaussian |" in report
