"""The benchmark's figures (perceptual.mvh_figures): what they draw, read back from the matplotlib figure before it is saved."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perceptual.mvh_figures as figures
from perceptual.mvh_analysis import accuracy_per_subject, consistency_matrix, pairwise_consistency, shape_bias_per_category, shape_bias_table


@pytest.fixture
def captured(monkeypatch):
    """The figures handed to save_figure (still open), instead of PNG files."""
    drawn = []

    def keep(fig, path):
        drawn.append(fig)
        return Path(path)

    monkeypatch.setattr(figures, "save_figure", keep)
    yield drawn
    import matplotlib.pyplot as plt

    plt.close("all")


def trials():
    rows = []
    correct = {  # subject → condition → correctness over images 1..4
        "subject-01": {"0.4": [0, 0, 0, 1], "3": [1, 1, 1, 0], "inf": [1, 1, 1, 1]},
        "subject-02": {"0.4": [0, 0, 1, 1], "3": [1, 1, 0, 0], "inf": [1, 1, 1, 0]},
        "net": {"0.4": [0, 0, 0, 0], "3": [1, 0, 0, 0], "inf": [1, 1, 0, 0]},
    }
    for subject, conditions in correct.items():
        for condition, values in conditions.items():
            for image, ok in enumerate(values, start=1):
                rows.append({"subject": subject, "dataset": "high-pass", "condition": condition, "image_id": image, "correct": bool(ok),
                             "category": "cat", "response": "cat" if ok else "dog"})
    return pd.DataFrame(rows)


def test_accuracy_figure_draws_the_human_band_and_model_lines(captured, tmp_path):
    figures.accuracy_figure(accuracy_per_subject(trials()), tmp_path / "a.png")
    (fig,) = captured
    ax = fig.axes[0]
    assert ax.get_title() == "high-pass (2 human subjects)" and ax.get_ylabel() == "16-class accuracy"
    assert ax.get_xlabel() == "filter standard deviation"  # the benchmark's axis label for the experiment
    # numeric order, not string order, and from the undistorted image (inf) to the strongest filter, as the benchmark plots it
    assert [t.get_text() for t in ax.get_xticklabels()] == ["inf", "3", "0.4"]
    lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    np.testing.assert_allclose(lines["humans (mean)"], [0.875, 0.625, 0.375])
    np.testing.assert_allclose(lines["net"], [0.5, 0.25, 0.0])
    np.testing.assert_allclose(lines["chance (1/16)"], [1 / 16, 1 / 16])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(0.25) and band.max() == pytest.approx(1.0)  # lowest and highest subject
    assert fig._suptitle.get_text() == "Accuracy against condition"


def test_contrast_and_eidolon_ticks_are_the_benchmarks_labels(captured, tmp_path):
    table = pd.concat([trials().replace({"condition": {"0.4": "c05", "3": "c50", "inf": "c100"}}).assign(dataset="contrast"),
                       trials().replace({"condition": {"0.4": "1-10-10", "3": "16-10-10", "inf": "128-10-10"}}).assign(dataset="eidolonI")])
    figures.accuracy_figure(accuracy_per_subject(table), tmp_path / "a.png")
    contrast, eidolon = captured[0].axes[:2]
    assert [t.get_text() for t in contrast.get_xticklabels()] == ["100", "50", "5"] and contrast.get_xlabel() == "contrast in percent"
    assert [t.get_text() for t in eidolon.get_xticklabels()] == ["1", "16", "128"] and eidolon.get_xlabel() == "reach (coherence 1.0)"


def test_named_conditions_are_ticked_as_the_benchmark_names_them(captured, tmp_path):
    """colour, false-colour and power-equalisation were ticked with the data's codes (cr/bw, true/false, 0/pow)."""
    rename = {"colour": {"inf": "cr", "3": "bw"}, "false-colour": {"inf": "True", "3": "False"}, "power-equalisation": {"inf": "0", "3": "pow"}}
    table = pd.concat([trials().query("condition != '0.4'").replace({"condition": names}).assign(dataset=dataset)
                       for dataset, names in rename.items()])
    figures.accuracy_figure(accuracy_per_subject(table), tmp_path / "a.png")
    ticks = {ax.get_title().split(" (")[0]: [t.get_text() for t in ax.get_xticklabels()] for ax in captured[0].axes if ax.get_xticklabels()}
    assert ticks == {"colour": ["colour", "greyscale"], "false-colour": ["true", "opponent"], "power-equalisation": ["original", "equalised"]}


def test_error_consistency_figure_and_matrix(captured, tmp_path):
    pairs = pairwise_consistency(trials())
    figures.error_consistency_figure(pairs, tmp_path / "e.png")
    ax = captured[0].axes[0]
    assert ax.get_ylabel() == "error consistency (kappa)"
    lines = {line.get_label(): line.get_ydata() for line in ax.get_lines() if not line.get_label().startswith("_")}
    human = pairs[pairs["kind"] == "human-human"].set_index("condition")["error_consistency"]
    assert ax.get_title() == "high-pass (1 human pairs)"
    np.testing.assert_allclose(lines["human-human (mean)"], human.loc[["inf", "3", "0.4"]].to_numpy())
    model = pairs[pairs["kind"] == "model-human"].groupby("condition")["error_consistency"].mean()
    np.testing.assert_allclose(lines["net vs humans"], model.loc[["inf", "3", "0.4"]].to_numpy())
    matrix = consistency_matrix(pairs, "high-pass")
    figures.consistency_matrix_figure(matrix, tmp_path / "m.png", "high-pass")
    ax = captured[1].axes[0]
    np.testing.assert_allclose(ax.get_images()[0].get_array(), matrix.to_numpy(dtype=float))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["net", "subject-01", "subject-02"]


def test_a_model_keeps_its_colour_in_every_panel_and_the_shared_legend_names_it(captured, tmp_path):
    """A model without trials in the first experiment shifted the others' colours there, and only panel 0 had a legend."""
    a, b = trials().replace({"subject": {"net": "a-net"}}), trials().replace({"subject": {"net": "b-net"}})
    both = pd.concat([b.assign(dataset="colour"), a, b[b["subject"] == "b-net"]])  # a-net has no colour trials
    for draw, data in ((figures.accuracy_figure, accuracy_per_subject(both)), (figures.error_consistency_figure, pairwise_consistency(both))):
        draw(data, tmp_path / "f.png")
        fig = captured[-1]
        colours = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                if "net" in line.get_label():
                    colours.setdefault(line.get_label(), set()).add(line.get_color())
        assert len(colours) == 2 and all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 2
        (legend,) = fig.legends
        assert {t.get_text() for t in legend.get_texts()} >= set(colours)


def test_shape_bias_figure(captured, tmp_path):
    def cue(subject, shape, texture, response, trial):
        name = f"{trial:04d}_s5n_s01_0_{shape}_00_{shape}1-{texture}2.png"
        return {"subject": subject, "dataset": "cue-conflict", "condition": "0", "image_id": name.split("_", 4)[4], "category": shape,
                "response": response, "correct": response == shape, "imagename": name}

    table = pd.DataFrame([cue("subject-01", "cat", "dog", "cat", 1), cue("subject-01", "dog", "cat", "cat", 2),
                          cue("subject-02", "cat", "dog", "cat", 1), cue("subject-02", "dog", "cat", "dog", 2),
                          cue("net", "cat", "dog", "dog", 1), cue("net", "dog", "cat", "cat", 2)])
    figures.shape_bias_figure(shape_bias_per_category(table), shape_bias_table(table), tmp_path / "s.png")
    ax = captured[0].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cat", "dog"]
    lines = {line.get_label(): line.get_xdata() for line in ax.get_lines()}
    np.testing.assert_allclose(lines["humans, mean of subjects (0.75)"], [1.0, 0.5])  # cat: both by shape; dog: (1 + 0) / 2
    np.testing.assert_allclose(lines["net (0.00)"], [0.0, 0.0])
    assert ax.get_xlabel().startswith("fraction of shape decisions")
    # the legend sits beside the axes: in the lower left it hid texture-biased models' markers (x near 0)
    legend_box = ax.get_legend().get_window_extent(captured[0].canvas.get_renderer())
    assert legend_box.x0 >= ax.get_window_extent().x1
    # each model in its colour of the other figures: matplotlib's cycle gave the 4th model the humans' red, and others shifted
    nets = [f"net{i}" for i in range(5)]
    many = pd.concat([table[table["subject"] != "net"]] + [table[table["subject"] == "net"].assign(subject=n) for n in nets])
    figures.shape_bias_figure(shape_bias_per_category(many), shape_bias_table(many), tmp_path / "s.png", models=["a-net", *nets])
    drawn = {line.get_label().split(" ")[0]: line.get_color() for line in captured[-1].axes[0].get_lines()}
    assert {n: drawn[n] for n in nets} == {n: c for n, c in figures._model_colours(["a-net", *nets]).items() if n in nets}
    figures.accuracy_figure(accuracy_per_subject(many), tmp_path / "a.png", models=["a-net", *nets])
    in_accuracy = {line.get_label(): line.get_color() for ax in captured[-1].axes for line in ax.get_lines() if "net" in line.get_label()}
    assert in_accuracy == {n: drawn[n] for n in nets}
