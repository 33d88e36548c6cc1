"""The Hydra config root (package data of `conf`) and the `python -m training.info` command."""
from __future__ import annotations

import subprocess
import sys
from importlib import resources

from hydra import compose, initialize_config_module

from training.config import dataset_from_config, model_from_config
from training.info import describe


def test_configs_are_package_data_of_conf():
    root = resources.files("conf")
    assert (root / "config.yaml").is_file()
    assert (root / "model" / "resnet18.yaml").is_file() and (root / "data" / "digits.yaml").is_file()


def test_composed_default_builds_model_and_data():
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="config", overrides=["model=kwta_resnet18"])
    assert cfg.model.kwargs.ratio == 0.1 and cfg.data.name == "digits"
    model = model_from_config(cfg.model, cfg.data.name)
    assert model.arch == "kwta_resnet18" and model.net.layer1[0].act1.ratio == 0.1
    assert len(dataset_from_config(cfg.data, "test")) == 450


def test_describe_lists_parameters_layers_representation_and_sizes():
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="config")
    text = describe(cfg)
    assert "parameters     242,474" in text
    assert "shape (N, 128)" in text and "features.11" in text
    assert "1,347 images" in text and "450 images" in text


def test_describe_an_imagenet_root_with_its_val_folder_only(tmp_path):
    """The documented ImageNet layout (root/val/<class>/) crashed: the train folder was required."""
    import pytest
    from PIL import Image

    from training.data import DataNotFoundError

    for name in ("n01440764", "n01443537"):
        (tmp_path / "val" / name).mkdir(parents=True)
        Image.new("RGB", (40, 40)).save(tmp_path / "val" / name / "a.png")
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="config", overrides=["data=imagenet", f"data.root={tmp_path}", "model=resnet18"])
    text = describe(cfg)
    assert "data train     absent: " in text and "data test      2 images in 2 class folders" in text
    with initialize_config_module(config_module="conf", version_base=None):
        empty = compose(config_name="config", overrides=["data=imagenet", f"data.root={tmp_path / 'none'}", "model=resnet18"])
    with pytest.raises(DataNotFoundError):  # neither split: still an error
        describe(empty)


def test_info_command_on_the_real_cifar_subset(cifar_mini_root):
    out = subprocess.run(
        [sys.executable, "-m", "training.info", "model=resnet18", "data=cifar10", f"data.root={cifar_mini_root}"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "11,173,962" in out.stdout and "shape (N, 512)" in out.stdout and "5,085 images" in out.stdout


def test_info_command_missing_data_folder_is_a_clear_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "training.info", "data=cifar10", f"data.root={tmp_path}"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert "cifar-10-batches-py" in out.stderr and "download=true" in out.stderr
