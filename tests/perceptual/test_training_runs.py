"""The training configs that demo and reproduce compose: paths go in verbatim, whatever characters they hold."""
from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from perceptual.pipelines.training_runs import training_config
from training.config import quoted

AWKWARD_PATHS = ["/runs/attack.eps=0.5/standard", "~/data", "/data/cifar,x", "/a b/it's", "C:\\runs\\", "a\\'b"]


@pytest.mark.parametrize("path", AWKWARD_PATHS)
def test_quoted_values_read_back_verbatim(path):
    assert OverridesParser.create().parse_override(f"run_dir={quoted(path)}").value() == path


def test_a_sweep_jobs_folder_and_a_home_relative_root_compose(tmp_path):
    """demo -m puts 'key=value' in the job's folder; conf/data/cifar10.yaml's default root starts with '~'."""
    run_dir = tmp_path / "attack.eps=0.5" / "runs" / "standard"
    config = training_config(model="small_cnn", model_kwargs={"width": 4}, data={"name": "cifar10", "root": "~/data,x"},
                             recipe="standard", run_dir=run_dir, seed=0, device="cpu", progress=False)
    assert config.run_dir == str(run_dir) and config.data.root == "~/data,x"


def test_a_finished_run_is_reused_only_under_the_settings_it_was_trained_with(tmp_path):
    from perceptual.pipelines.training_runs import train_models
    from training.run import RunDirectoryError

    def config(**train):
        return training_config(model="small_cnn", model_kwargs={"width": 4}, data={"name": "digits"}, recipe="standard",
                               run_dir=tmp_path / "runs" / "standard", seed=0, device="cpu", progress=False,
                               train_overrides={"epochs": 1, "batch_size": 256, "eval.every": 0, "eval.final_subset": 0, **train})

    first = train_models({"standard": config()}, log=lambda _: None)
    messages = []
    again = train_models({"standard": config()}, log=messages.append)
    assert again == first and "reusing" in messages[0]
    with pytest.raises(RunDirectoryError, match=r"cannot resume .*train\.epochs: 1 -> 3"):
        train_models({"standard": config(epochs=3)}, log=messages.append)
