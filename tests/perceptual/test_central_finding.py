"""The paper's central finding at toy scale: on digits, a PGD-robust model's inversions are judged
more often like their targets by the LPIPS observers than a standard model's (same schedule).

Sized for the default test run (about two CPU minutes): 4 epochs of a width-16 small CNN, L2-PGD with
eps 2 (a strongly robust model makes the effect visible after few inversion steps), 10 targets × 2
seeds, 300 steps. Measured over training seeds 0-2 (torch 2.15, CPU; both offline LPIPS variants):
robust 2AFC 0.25-0.45 vs standard 0.0, robust clustering 0.65-0.78 vs standard 0.32-0.37 (chance 1/3).
The assertions are the direction (robust above standard) and clustering above chance, which every
seed met with a margin of at least 0.25.
"""
from __future__ import annotations

import pytest

from perceptual.measure import ModelSpec, measure_models
from perceptual.observers import Panel, default_panel
from training.config import compose as compose_config
from training.trainer import train

from ..conftest import TEST_DEVICE

SCHEDULE = [
    "model=small_cnn", "+model.kwargs.width=16", "data=digits", "train.epochs=4", "train.batch_size=64",
    "train.optimizer.lr=0.05", "train.schedule.name=cosine", "train.augment.enabled=false",
    "train.eval.every=0", "train.eval.final_subset=0", "progress=false",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("central")
    weights = {}
    for label, recipe, extra in (("standard", "standard", []), ("robust", "pgd", ["train.attack.eps=2.0", "train.attack.steps=3"])):
        cfg = compose_config("train", SCHEDULE + [f"train={recipe}", f"run_dir={root / label}"] + extra)
        weights[label] = train(cfg).run_dir / "model.safetensors"
    return root, weights


def test_robust_model_is_more_aligned_with_the_lpips_observers(pair):
    root, weights = pair
    # Offline here: the labelled LPIPS variants (with weights cached: LPIPS AlexNet itself).
    panel = Panel([o for o in default_panel() if o.name.startswith("lpips")])
    lpips = panel.names
    specs = [ModelSpec("small_cnn", str(path), label, kwargs={"width": 16}) for label, path in weights.items()]
    data = measure_models(
        specs, {"name": "digits", "root": None}, root / "report", n_targets=10, seed=0, panel=panel,
        tasks=("2afc", "clustering"), threat=None, device=TEST_DEVICE,
        engine={"steps": 300, "log_every": 50, "progress": False, "patience": None},
    )
    robust, standard = data["models"]["robust"]["per_observer"], data["models"]["standard"]["per_observer"]
    for task in ("2afc", "clustering"):
        for observer in lpips:
            r, s = robust[task][observer]["overall"]["accuracy"], standard[task][observer]["overall"]["accuracy"]
            assert r > s, f"{task} / {observer}: robust {r:.3f} vs standard {s:.3f}"
    assert data["models"]["robust"]["clustering"]["mean"] > 1 / 3  # above chance
