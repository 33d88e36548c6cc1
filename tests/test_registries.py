"""Each extension point is a registry: a toy entry added here, in the test alone, works from the command-line
configs without touching any other file."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from training.config import compose


@pytest.fixture
def toy_observer():
    from perceptual.observers import OBSERVERS, Observer, register_observer

    class MeanIntensity(Observer):
        name = "toy-mean-intensity"

        def pairwise_images(self, a, b):
            return (a.flatten(1).mean(1) - b.flatten(1).mean(1)).abs()

    register_observer("toy-mean-intensity")(lambda net="alex", weights_path=None, seed=0: MeanIntensity())
    yield "toy-mean-intensity"
    OBSERVERS.pop("toy-mean-intensity")


def test_a_registered_observer_judges_from_the_measure_command(tmp_path, toy_observer):
    from perceptual.pipelines.measure import run
    from training.checkpoints import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    path = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "m.safetensors")
    cfg = compose("measure", [
        f"out={tmp_path / 'report'}", f"models=[{{name:small_cnn,checkpoint:'{path}',label:toy,kwargs:{{width:8}}}}]",
        f"observers=[{toy_observer},pixel-l2]", "n_targets=3", "tasks=[2afc]", "threat=null", "accuracy_limit=8", "device=cpu",
        "invert.steps=2", "invert.progress=false",
    ])
    data = run(cfg)
    assert data["observers"] == [toy_observer, "pixel-l2"]
    assert data["models"]["toy"]["per_observer"]["2afc"][toy_observer]["overall"]["n"] == 6


@pytest.fixture
def toy_recipe():
    from training.recipes import RECIPE_DEFAULTS, RECIPES, register_recipe
    from training.recipes.supervised import StandardRecipe

    class SmoothedRecipe(StandardRecipe):
        name = "toy_smoothed"

    @register_recipe("toy_smoothed", defaults="standard")
    def _build(cfg, model, train_data, seed):
        return SmoothedRecipe(model, label_smoothing=0.2)

    yield "toy_smoothed"
    RECIPES.pop("toy_smoothed")
    RECIPE_DEFAULTS.pop("toy_smoothed")


def test_a_registered_recipe_trains_from_the_training_config(tmp_path, toy_recipe):
    from training.trainer import train

    cfg = compose("train", [
        "model=small_cnn", "+model.kwargs.width=8", "train=standard", f"train.name={toy_recipe}", "train.epochs=1",
        "train.batch_size=32", "data_limit.train=64", "data_limit.test=16", "train.eval.every=0", "train.eval.final_subset=0",
        f"run_dir={tmp_path / 'run'}", "progress=false", "device=cpu",
    ])
    result = train(cfg)
    assert result.summary["recipe"]["recipe"] == toy_recipe and result.summary["recipe"]["label_smoothing"] == 0.2


@pytest.fixture
def toy_architecture():
    from training.models import CIFAR_ARCHITECTURES, register_model

    class TinyMLP(nn.Module):
        def __init__(self, num_classes: int = 10, hidden: int = 16):
            super().__init__()
            self.features = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU())
            self.linear = nn.Linear(hidden, num_classes)

        def forward(self, x):
            return self.linear(self.features(x))

    register_model("toy_mlp", penultimate="features", fake_relu=False)(lambda num_classes=10, hidden=16: TinyMLP(num_classes, hidden))
    yield "toy_mlp"
    CIFAR_ARCHITECTURES.pop("toy_mlp")


def test_a_registered_zoo_model_builds_from_the_model_config(toy_architecture):
    from training.info import describe

    text = describe(compose("config", ["model=small_cnn", f"model.name={toy_architecture}", "+model.kwargs.hidden=12"]))
    assert f"model          {toy_architecture} for digits (10 classes)" in text
    assert "shape (N, 12)" in text  # the representation is the registered penultimate layer, with the kwarg applied


@pytest.fixture
def toy_distortion_and_metric():
    from perceptual.pair_metrics import PAIR_METRIC_REGISTRY, PairMetric, register_pair_metric
    from stimuli.distortions import GENERATORS, GeneratorSpec, register_generator

    register_generator(GeneratorSpec("negative", ("no", "yes"), False, "photographic negative 1 - x",
                                     apply=lambda d, x, ids, seed: 1 - x, identity=("no",)))
    register_pair_metric(PairMetric("same_answer_rate", lambda a, b, c: float((a.predictions == b.predictions).mean()),
                                    "1", ranked=False))
    yield "negative", "same_answer_rate"
    GENERATORS.pop("negative")
    PAIR_METRIC_REGISTRY.pop("same_answer_rate")


def test_a_registered_distortion_and_pair_metric_run_through_the_compare_command(tmp_path, toy_distortion_and_metric):
    from perceptual.pipelines.compare import run
    from training.checkpoints import save_checkpoint
    from training.models import build_model

    generator, metric = toy_distortion_and_metric
    torch.manual_seed(0)
    path = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "m.safetensors")
    cfg = compose("compare", [
        f"out={tmp_path / 'compare'}", f"models=[{{name:small_cnn,checkpoint:'{path}',label:toy,kwargs:{{width:8}}}}]",
        f"conditions=[{generator}]", "n_images=12", "observers=[pixel-l2]", "decisions.seeds=[0]", "decisions.exemplars_per_class=2",
        "decisions.k=1", "unknown.enabled=false", "device=cpu", "progress=false",
    ])
    data = run(cfg)
    assert data["conditions"] == ["negative=no", "negative=yes"]
    assert metric in data["aggregated"] and data["aggregated"][metric].shape == (2, 2)
    assert data["aggregated"][metric][0, 0] == 1.0  # a system always gives its own answers
    assert (tmp_path / "compare" / "figures" / f"heatmap_{metric}.png").is_file()


@pytest.fixture
def toy_sweep_source():
    from perceptual.sweep_summary import SWEEP_SOURCES, SweepMetric, SweepSource, register_sweep_source

    register_sweep_source(SweepSource(
        kind="toy", filename="toy_result.json", metrics=(SweepMetric("score", "Score (%)"),), plotted=("score",),
        recognise=lambda data: "score" in data, rows=lambda data: [{"model": "toy", "score": data["score"]}],
        config=lambda data, folder: data["settings"],
    ))
    yield "toy"
    SWEEP_SOURCES.pop("toy")


def test_a_registered_sweep_source_is_read_by_the_sweep_command(tmp_path, toy_sweep_source):
    import json

    from perceptual.pipelines.sweep import run

    for width, score in ((16, 0.75), (8, 0.5)):
        (tmp_path / f"width={width}").mkdir()
        (tmp_path / f"width={width}" / "toy_result.json").write_text(json.dumps({"score": score, "settings": {"width": width, "out": "x"}}))
    tables = run(compose("sweep", [f"root={tmp_path}"]))
    assert tables[toy_sweep_source].swept == ["width"] and list(tables[toy_sweep_source].frame["score"]) == [0.5, 0.75]
    assert "| width=8 | 8 | toy | 50.0 |" in (tmp_path / "sweep.md").read_text() and (tmp_path / "sweep_toy.png").is_file()
