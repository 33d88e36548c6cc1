"""``python -m perceptual unknown`` on a synthetic CIFAR-100-format folder and a model whose answers are known.

CIFAR-100 folder (tests/perceptual/test_unknown_benchmark.py): image i of class c is filled with 10·c + i, classes
apple (0–3), bear (10–13), cloud (20–23), dolphin (30–33), girl (40–43). Known: [girl, apple]; near-unknown: the others.
The model answers logits [s, −s] with s = (v − 21.5) / 2 for an image of mean value v: girl → s ≥ 9.25 (class 0),
apple → s ≤ −9.25 (class 1), every near-unknown image |s| ≤ 5.75, and a far-unknown white image s = 116.75.

So by hand, for max-softmax (and energy, both monotone in |s|): every known image is right (AURC = E-AURC = 0), every
known image is more confident than every near-unknown one (AUROC 1, FPR@95 0) and less than the white ones (AUROC 0,
FPR@95 1). The improvement of energy over max-softmax in AUROC is 0 for cifar-near and NaN (baseline 0) for white.
"""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from PIL import Image

from perceptual.__main__ import main as perceptual_main
from perceptual.pipelines.unknown import run

from ..test_unknown_benchmark import write_cifar100


@pytest.fixture
def benchmark(tmp_path, monkeypatch):
    (tmp_path / "levelmodel.py").write_text(textwrap.dedent("""
        import torch

        class Level(torch.nn.Module):
            def forward(self, x):
                s = (x.mean(dim=(1, 2, 3)) * 255 - 21.5) / 2
                return torch.stack([s, -s], dim=1)

        def build():
            return Level()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    write_cifar100(tmp_path / "data")
    (tmp_path / "white").mkdir()
    for i in range(3):
        Image.fromarray(np.full((40, 40, 3), 255, dtype=np.uint8)).save(tmp_path / "white" / f"{i}.png")
    return tmp_path


def _overrides(root, *extra):
    return [f"root={root / 'data'}", "known_classes=[girl,apple]", "model.factory=levelmodel:build", f"far_unknown={{white: {root / 'white'}}}",
            "scores=[max_softmax,energy]", "n_fit=0", f"out={root / 'out'}", *extra]


def test_hand_computed_table(benchmark):
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="unknown", overrides=_overrides(benchmark)))
    assert data["unknown_sets"] == ["cifar-near", "white"] and data["n_unknown"] == {"cifar-near": 12, "white": 3}
    rows = {r["score"]: r for r in data["table"]}
    for score in ("max_softmax", "energy"):
        row = rows[score]
        assert row["aurc"] == pytest.approx(0.0) and row["eaurc"] == pytest.approx(0.0) and row["accuracy"] == 1.0
        # the paper's headline, pooled by confidence: 3 white images (errors) first, the 8 known (right), then 12 near (errors)
        assert row["unknown_aurc"] == pytest.approx(sum((min(k, 3) + max(0, k - 11)) / k for k in range(1, 24)) / 23)
        assert row["auroc_cifar-near"] == pytest.approx(1.0) and row["fpr_at_95_tpr_cifar-near"] == pytest.approx(0.0)
        assert row["auroc_white"] == pytest.approx(0.0) and row["fpr_at_95_tpr_white"] == pytest.approx(1.0)
    assert rows["energy"]["auroc_cifar-near_improvement"] == pytest.approx(0.0)
    assert rows["energy"]["auroc_white_improvement"] is None  # the baseline is 0: no ratio


def test_command_writes_json_markdown_and_figure(benchmark, capsys):
    perceptual_main(["unknown", *_overrides(benchmark)])
    assert "AUROC cifar-near 1.000" in capsys.readouterr().out
    out = benchmark / "out"
    assert json.loads((out / "unknown.json").read_text())["n_known"] == 8
    text = (out / "unknown.md").read_text()
    assert "| max_softmax |" in text and "Improvement ratio over max_softmax" in text
    assert "| score | ACC | unknown AURC | AURC | E-AURC |" in text  # the paper's headline column was in the JSON only
    assert (out / "unknown.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_settings_are_refused_before_the_model_runs(benchmark):
    with initialize_config_module(config_module="conf", version_base=None):
        for extra, error in ((["known_classes=[girl,zebra]"], "zebra"), (["baseline=odin"], "baseline"),
                             (["scores=[max_softmax,nonsense]"], "nonsense"), ([f"far_unknown={{white: {benchmark / 'nowhere'}}}"], "no far-unknown"),
                             (["known_classes=[girl,apple,bear]"], "3 known classes"),
                             # accepted and ignored before: a misspelt score's settings, a layer, n_fit -5 as "no fitting", far_limit 0 as all
                             (["+score_params.enrgy.temperature=5"], r"score_params names unknown score functions \['enrgy'\]"),
                             (["+model.layer=features.0"], r"model.layer='features.0': unknown scores with the penultimate layer"),
                             (["n_fit=-5"], "n_fit must be a whole number >= 0"), (["n_fit=2.5"], "n_fit must be a whole number >= 0"),
                             (["far_limit=0"], "far_limit must be a whole number >= 1")):
            with pytest.raises((ValueError, FileNotFoundError), match=error):
                run(compose(config_name="unknown", overrides=_overrides(benchmark, *extra)))
    (benchmark / "known.txt").write_text("# CIFAR-40 names\ngirl\n\napple\n")
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="unknown", overrides=_overrides(benchmark, f"known_classes={benchmark / 'known.txt'}")))
    assert data["known_classes"] == ["girl", "apple"]


def test_a_bare_score_name_is_one_score(benchmark):
    """``scores=energy`` on the command line is one score, not the letters e, n, e, r, g, y."""
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="unknown", overrides=_overrides(benchmark, "scores=energy", "baseline=energy")))
    assert [r["score"] for r in data["table"]] == ["energy"]


def test_near_unknown_alone_and_every_score_with_its_defaults(benchmark):
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="unknown", overrides=[*_overrides(benchmark), "far_unknown=null", "score_params=null"]))
    assert data["unknown_sets"] == ["cifar-near"]  # score_params=null crashed after the data sets and the model were read


def test_feature_scores_on_a_model_without_a_penultimate_layer_are_reported_as_not_applying(benchmark):
    """The level model names no penultimate layer: Mahalanobis and k-NN cannot apply, and the other scores are reported."""
    with initialize_config_module(config_module="conf", version_base=None):
        data = run(compose(config_name="unknown", overrides=_overrides(benchmark, "scores=[max_softmax,mahalanobis,energy,knn]")))
    rows = {r["score"]: r for r in data["table"]}
    assert rows["max_softmax"]["auroc_cifar-near"] == pytest.approx(1.0) and rows["energy"]["auroc_cifar-near"] == pytest.approx(1.0)
    assert [r["score"] for r in data["table"]] == ["max_softmax", "mahalanobis", "energy", "knn"]  # in the order asked
    for name in ("mahalanobis", "knn"):
        assert rows[name]["error"].startswith("needs the penultimate layer's features, and Level names none")


def test_far_unknown_folders_must_be_named(benchmark):
    """Hydra refuses a list where the config has a mapping; the Python API (run with a plain dict) says what to give."""
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="conf", version_base=None):
        settings = OmegaConf.to_container(compose(config_name="unknown", overrides=_overrides(benchmark)), resolve=True)
    with pytest.raises(ValueError, match=r"far_unknown must name each folder, as far_unknown=\{svhn: PATH"):
        run({**settings, "far_unknown": [str(benchmark / "white")]})
