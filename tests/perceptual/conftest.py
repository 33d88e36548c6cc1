"""Tiny digits models for the score and compare tests, trained once per session with ``training``'s
standard recipe (small_cnn of width 8 on the embedded digits, no augmentation, a few epochs).

Two runs give two models with different error patterns: ``trained`` (5 epochs, over 90 % test accuracy)
and ``early`` (1 epoch).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from training import build_model
from training.trainer import train

from ..conftest import TEST_DEVICE

TINY_WIDTH = 8


def _train_tiny_digits(run_dir: Path, epochs: int) -> Path:
    overrides = [
        "model=small_cnn", f"+model.kwargs.width={TINY_WIDTH}", "data=digits", "train=standard", f"run_dir={run_dir}",
        "seed=0", f"device={TEST_DEVICE}", "progress=false", f"train.epochs={epochs}", "train.batch_size=64",
        "train.optimizer.lr=0.05", "train.schedule.name=cosine", "train.augment.enabled=false",
        "train.eval.every=0", "train.eval.final_subset=0", "train.channels_last=false",
    ]
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    return train(cfg).run_dir / "model.safetensors"


@pytest.fixture(scope="session")
def tiny_digits_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """``{"early": path, "trained": path}``: small_cnn (width 8) digits weights after 1 and 5 epochs."""
    root = tmp_path_factory.mktemp("tiny-digits")
    return {"early": _train_tiny_digits(root / "early", 1), "trained": _train_tiny_digits(root / "trained", 5)}


@pytest.fixture(scope="session")
def tiny_digits_model(tiny_digits_checkpoints):
    """The trained tiny digits model (eval mode)."""
    model = build_model("small_cnn", "digits", checkpoint=str(tiny_digits_checkpoints["trained"]), width=TINY_WIDTH)
    return model.eval()
