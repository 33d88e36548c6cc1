"""``python -m perceptual visalign`` on three synthetic images and a hand-computed table.

The model (a factory in a module the test writes) answers logits [log 9 · m, 0] for an image of mean grey level m:
white → softmax [0.9, 0.1] (max-softmax 0.9), black → [0.5, 0.5] (0.5). Images A white (must-act, label a), B black
(must-abstain), C white (uncertain, label b; humans 1 × a, 1 × b, 2 × abstain).

Min-max over the set: scores [0.9, 0.5, 0.9] → scaled [1, 0, 1] → abstention [0, 1, 0]; answers A [0.9, 0.1, 0],
B [0, 0, 1], C [0.9, 0.1, 0]. Hellinger: A and B match their humans exactly (0); C against [0.25, 0.25, 0.5]:
sqrt((√0.9 − 0.5)² + (√0.1 − 0.5)² + 0.5) / √2 = 0.606255; overall 0.606255 / 3.
Reliability (γ = λ = 0.5): A acts and is right (+1); B abstains (+1); C is must-abstain (human P(b) = 0.25 ≤ λ) but
answers a, neither abstaining nor its original label (−c): RS_0 = 2, RS_450 = −448, RS_900 = −898.
"""
from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from PIL import Image

from perceptual.__main__ import main as perceptual_main
from perceptual.pipelines.visalign import run
from perceptual.visalign_report import read_human_labels, visalign_table

C_DISTANCE = math.sqrt((math.sqrt(0.9) - 0.5) ** 2 + (math.sqrt(0.1) - 0.5) ** 2 + 0.5) / math.sqrt(2)


@pytest.fixture
def visalign_set(tmp_path, monkeypatch):
    (tmp_path / "greymodel.py").write_text(textwrap.dedent("""
        import math
        import torch

        class Grey(torch.nn.Module):
            def forward(self, x):
                m = x.mean(dim=(1, 2, 3))
                return torch.stack([math.log(9.0) * m, torch.zeros_like(m)], dim=1)

        def build():
            return Grey()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    images = tmp_path / "images"
    images.mkdir()
    for name, level in (("A", 255), ("B", 0), ("C", 255)):
        Image.fromarray(np.full((8, 8, 3), level, dtype=np.uint8)).save(images / f"{name}.png")
    (tmp_path / "labels.csv").write_text("image_id,group,label,a,b,abstain\nA,Must-Act,a,9,1,0\nB,Must-Abstain,,0,0,4\nC,Uncertain,b,1,1,2\n")
    return tmp_path


def _overrides(root, *extra):
    return ["model.factory=greymodel:build", f"images={root / 'images'}", f"labels={root / 'labels.csv'}", "classes=[a,b]",
            "scores=[max_softmax]", "n_fit=0", f"out={root / 'out'}", *extra]


def test_hand_computed_table(visalign_set):
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="visalign", overrides=_overrides(visalign_set)))
    (row,) = data["table"]
    assert row["hellinger_must_act"] == pytest.approx(0.0, abs=1e-6)  # float32 logits
    assert row["hellinger_must_abstain"] == pytest.approx(0.0, abs=1e-6)  # float32 logits
    assert row["hellinger_uncertain"] == pytest.approx(C_DISTANCE, rel=1e-6)
    assert row["hellinger_all"] == pytest.approx(C_DISTANCE / 3, rel=1e-6)
    assert (row["rs_0"], row["rs_450"], row["rs_900"]) == (2, -448, -898)
    assert data["n_per_group"] == {"must_act": 1, "must_abstain": 1, "uncertain": 1}


def test_bare_values_of_list_options_are_one_item(visalign_set):
    """``scores=max_softmax``, ``costs=450`` on the command line are one item each, not characters."""
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="visalign", overrides=_overrides(visalign_set, "scores=max_softmax", "costs=450")))
    (row,) = data["table"]
    assert row["score"] == "max_softmax" and row["rs_450"] == -448 and "rs_0" not in row and data["left_out"] == []


def test_command_writes_json_markdown_and_figure(visalign_set, capsys):
    perceptual_main(["visalign", *_overrides(visalign_set)])
    assert "max_softmax" in capsys.readouterr().out
    out = visalign_set / "out"
    assert json.loads((out / "visalign.json").read_text())["table"][0]["rs_0"] == 2
    assert "| max_softmax |" in (out / "visalign.md").read_text()
    assert (out / "visalign.png").read_bytes()[:4] == b"\x89PNG"


def test_categories_get_the_reference_codes_table(visalign_set):
    (visalign_set / "labels.csv").write_text("image_id,group,label,category,a,b,abstain\n"
                                             "A,Must-Act,a,category1,9,1,0\nB,Must-Abstain,,category5,0,0,4\nC,Uncertain,b,category8,1,1,2\n")
    perceptual_main(["visalign", *_overrides(visalign_set)])
    data = json.loads((visalign_set / "out" / "visalign.json").read_text())
    assert data["n_per_category"] == {"category1": 1, "category5": 1, "category8": 1}
    assert data["table"][0]["hellinger_per_category"]["category8"] == pytest.approx(C_DISTANCE, rel=1e-6)
    markdown = (visalign_set / "out" / "visalign.md").read_text()
    assert "| score | category1 (1) | category5 (1) | category8 (1) |" in markdown
    assert f"| {C_DISTANCE:.3f} |" in markdown


def test_missing_images_and_bad_labels_are_named(visalign_set):
    (visalign_set / "images" / "C.png").unlink()
    with initialize_config_module(config_module="conf", version_base=None):
        with pytest.raises(FileNotFoundError, match="1 image.*C"):
            run(compose(config_name="visalign", overrides=_overrides(visalign_set)))
        (visalign_set / "labels.csv").write_text("image_id,group,label,a,b,abstain\nA,Sometimes,a,9,1,0\n")
        with pytest.raises(ValueError, match="unknown group"):
            run(compose(config_name="visalign", overrides=_overrides(visalign_set)))
        with pytest.raises(ValueError, match="no model"):
            run(compose(config_name="visalign", overrides=_overrides(visalign_set, "model.factory=null")))


def _compose(root, *extra):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="visalign", overrides=_overrides(root, *extra))


def test_any_non_negative_cost_is_reported(visalign_set):
    """Costs name columns rs_0.5 and rs_1e+06, which are no attribute names: the figure reads them by name."""
    data = run(_compose(visalign_set, "costs=[0,0.5,1000000]"))
    (row,) = data["table"]
    assert (row["rs_0"], row["rs_0.5"], row["rs_1e+06"]) == (2, 1.5, -999998)
    assert (visalign_set / "out" / "visalign.png").read_bytes()[:4] == b"\x89PNG" and "RS_0.5" in (visalign_set / "out" / "visalign.md").read_text()
    # a fractional cost gives fractional scores: 1.5 was printed as 2 (a whole number per score)
    assert "| 2.00 | 1.50 | -999998.00 |" in (visalign_set / "out" / "visalign.md").read_text()


def test_scores_that_do_not_apply_are_left_out_and_the_others_reported(visalign_set, caplog):
    """The grey model names no penultimate layer (Mahalanobis and k-NN need one), and its max-softmax is constant when
    every image is white: each such score is left out with its reason, and energy is still reported."""
    with caplog.at_level("WARNING"):
        data = run(_compose(visalign_set, "scores=[max_softmax,energy,mahalanobis,knn]"))
    assert [r["score"] for r in data["table"]] == ["max_softmax", "energy"] and data["left_out"] == ["knn", "mahalanobis"]
    assert "score mahalanobis left out: needs the penultimate layer's features, and Grey names none" in caplog.text
    # a score equal on every image (max-softmax saturated at 1.0) gives no abstention: it alone is left out
    human = read_human_labels(visalign_set / "labels.csv", ["a", "b"])
    probs = np.array([[0.9, 0.1], [0.5, 0.5], [0.9, 0.1]])
    with caplog.at_level("WARNING"):
        table = visalign_table(human, ["a", "b"], probs, {"saturated": np.ones(3), "varied": np.array([0.9, 0.5, 0.9])})
    assert list(table["score"]) == ["varied"] and "score saturated left out: scores are all equal" in caplog.text
    with pytest.raises(ValueError, match="none of the scores .* gives an abstention"):
        visalign_table(human, ["a", "b"], probs, {"saturated": np.ones(3)})


def test_settings_and_the_models_classes_are_checked_before_the_whole_set_runs(visalign_set, monkeypatch):
    import greymodel

    calls = []
    forward = greymodel.Grey.forward
    monkeypatch.setattr(greymodel.Grey, "forward", lambda self, x: calls.append(len(x)) or forward(self, x))
    for extra, message in ((["gamma=1.5"], "gamma"), (["lam=-0.2"], "lam"), (["costs=[-450]"], "each cost"),
                           (["+score_params.enrgy.temperature=5"], r"score_params names unknown score functions \['enrgy'\]"),
                           (["+model.layer=inner"], "model.layer='inner': visalign scores with the penultimate layer"),
                           (["n_fit=-5"], "n_fit must be a whole number >= 0")):
        with pytest.raises(ValueError, match=message):
            run(_compose(visalign_set, *extra))
    assert calls == []  # refused before the model was built
    with pytest.raises(ValueError, match=r"the model has 2 outputs but the labels name 3 classes"):
        (visalign_set / "labels.csv").write_text("image_id,group,label,a,b,c,abstain\nA,Must-Act,a,9,1,0,0\nB,Must-Abstain,,0,0,0,4\nC,Uncertain,b,1,1,0,2\n")
        run(_compose(visalign_set, "classes=[a,b,c]"))
    assert calls == [1]  # one image, not the set


def test_given_classes_are_text_and_are_not_fit_on_another_data_set(visalign_set):
    """classes=[a,b] with the default n_fit fit Mahalanobis and k-NN on digits' images and 10 labels, silently; classes=[0,1]
    (Hydra's ints) were refused as missing columns "0" and "1"."""
    with pytest.raises(ValueError, match=r"classes=\['a', 'b'\] are not the classes of data=digits .*set n_fit=0"):
        run(_compose(visalign_set, "n_fit=2000"))
    labels = visalign_set / "labels.csv"
    labels.write_text(labels.read_text().replace("label,a,b,", "label,0,1,").replace(",a,", ",0,").replace(",b,", ",1,"))
    data = run(_compose(visalign_set, "classes=[0,1]"))
    assert data["classes"] == ["0", "1"] and data["table"][0]["hellinger_all"] == pytest.approx(C_DISTANCE / 3)


def test_infinite_human_counts_are_named_with_their_line(visalign_set):
    (visalign_set / "labels.csv").write_text("image_id,group,label,a,b,abstain\nA,Must-Act,a,inf,1,0\nB,Must-Abstain,,0,0,4\nC,Uncertain,b,1,1,2\n")
    with pytest.raises(ValueError, match=r"non-numeric, infinite or negative human answer × 1 \(lines \[2\]"):
        run(_compose(visalign_set))
