"""The training configs that demo and reproduce compose: paths go in verbatim, whatever characters they hold."""
from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from perceptual.pipelines.training_runs import training_config
from training.config import override_value, quoted

AWKWARD_PATHS = ["/runs/attack.eps=0.5/standard", "~/data", "/data/cifar,x", "/a b/it's", "C:\\runs\\", "a\\'b"]


@pytest.mark.parametrize("path", AWKWARD_PATHS)
def test_quoted_values_read_back_verbatim(path):
    assert OverridesParser.create().parse_override(f"run_dir={quoted(path)}").value() == path


@pytest.mark.parametrize("value", [None, True, 3, 0.1, 1e-05, "8/255", "a,b", "/x/a=b.pt", "None", [0.5, None, "x,y"], {"name": "step", "at": [5]}])
def test_override_values_read_back_as_the_same_value(value):
    assert OverridesParser.create().parse_override(f"key={override_value(value)}").value() == value


def test_model_arguments_and_recipe_settings_keep_their_values(tmp_path):
    """None stays null (not the string "None") and a comma in a value is no sweep that cuts it short."""
    config = training_config(model="small_cnn", model_kwargs={"width": 4, "note": "a,b", "extra": None}, data={"name": "digits"},
                             recipe="standard", run_dir=tmp_path, seed=0, device="cpu", progress=False,
                             train_overrides={"schedule.milestones": [2, 3], "optimizer.weight_decay": 0.0})
    assert dict(config.model.kwargs) == {"width": 4, "note": "a,b", "extra": None}
    assert list(config.train.schedule.milestones) == [2, 3] and config.train.optimizer.weight_decay == 0.0


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
