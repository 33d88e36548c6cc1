"""A small survey package for the import and browser tests: two tiny "models" (differently seeded random
convolutional representations) inverted on the embedded digits for two engine steps, 6 targets × seeds
noise and train each, exported with attention checks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from invert import Engine, InvertConfig
from stimuli import ModelRef, make_controversial_set, make_inversion_set, select_targets
from stimuli.survey import build_survey

MODELS = ("standard", "robust")


def _representation(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 3, 2, 1), nn.ReLU(), nn.Conv2d(6, 6, 3, 2, 1), nn.AdaptiveAvgPool2d(4), nn.Flatten()).eval()


@pytest.fixture(scope="session")
def inversion_sets(tmp_path_factory):
    from training import load_dataset

    test, train = load_dataset("digits", "test"), load_dataset("digits", "train")
    root = tmp_path_factory.mktemp("survey-sets")
    engine = Engine(InvertConfig(steps=2, log_every=1, progress=False))
    return {
        name: make_inversion_set(root / name, ModelRef(name, _representation(i)), select_targets(test, 6, seed=0), seed_types=["noise", "train"],
                                 train_set=train, engine=engine, preview=False)
        for i, name in enumerate(MODELS)
    }


@pytest.fixture(scope="session")
def survey_package(inversion_sets, tmp_path_factory):
    """2AFC (2 × 12 trials + 6 checks) in 2 surveys; random and hard clustering (2 × 6 triplets + 3 checks, one repeated) in
    4 surveys each of 3 triplets and a check (24 judgements at most: 4 trials of 6 rows)."""
    out = tmp_path_factory.mktemp("survey-package") / "package"
    build_survey(inversion_sets, out, tasks=("2afc", "clustering", "clustering_hard"), trials_per_survey=24, attention_rate=0.2, seed=0)
    return out


@pytest.fixture(scope="session")
def controversial_set(tmp_path_factory):
    """A controversial set between the two tiny models: 4 origins × 2 starts × directions AB and BA."""
    from training import load_dataset

    test = load_dataset("digits", "test")
    engine = Engine(InvertConfig(steps=2, log_every=1, progress=False))
    return make_controversial_set(tmp_path_factory.mktemp("controversial") / "set", ModelRef("standard", _representation(0)),
                                  ModelRef("robust", _representation(1)), select_targets(test, 4, seed=0), restarts=2, engine=engine, preview=False)
