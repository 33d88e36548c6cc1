"""The Hydra group conf/invert: keys map 1:1 onto InvertConfig; presets hold the reference values."""
from __future__ import annotations

import dataclasses
from importlib import resources

import pytest
from omegaconf import OmegaConf

from invert import InvertConfig, load_preset, preset_names

FIELDS = {f.name for f in dataclasses.fields(InvertConfig)}


def _yaml(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.create(resources.files("conf").joinpath("invert", f"{name}.yaml").read_text()))


@pytest.mark.parametrize("name", ["default", "paper", "fast"])
def test_every_preset_has_exactly_the_config_fields(name):
    assert set(_yaml(name)) == FIELDS
    assert load_preset(name).to_dict() == _yaml(name)


def test_default_is_paper_and_paper_is_the_reference():
    shipped = {p.name[:-5] for p in resources.files("conf").joinpath("invert").iterdir() if p.name.endswith(".yaml")}
    assert set(preset_names()) == shipped == {"default", "paper", "fast"}  # the engine's presets are the Hydra group
    assert _yaml("default") == _yaml("paper")
    paper = load_preset("paper")
    assert paper == InvertConfig()  # the dataclass defaults are the reference too
    assert (paper.stepper, paper.step_size, paper.steps, paper.keep_best, paper.parametrization) == ("l2", 1.0, 5000, True, "pixel")
    assert paper.patience is None and paper.loss_threshold is None and paper.precision == "fp32"


def test_fast_preset_stops_early_with_bf16_on_cuda():
    fast = load_preset("fast")
    assert fast.steps < 5000 and fast.patience is not None and fast.precision == "auto"


def test_hydra_composes_the_group():
    hydra = pytest.importorskip("hydra")
    with hydra.initialize_config_module(config_module="conf", version_base=None):
        cfg = hydra.compose(overrides=["+invert=fast", "invert.steps=77"])
    config = InvertConfig.from_dict(cfg.invert)
    assert config.steps == 77 and config.patience == load_preset("fast").patience


def test_errors():
    with pytest.raises(ValueError, match=r"unknown invert preset 'turbo'; available presets: \[.*'fast'.*'paper'"):
        load_preset("turbo")
    with pytest.raises(ValueError, match=r"unknown invert config keys \['iterations'\]; valid keys are \[.*'steps'"):
        InvertConfig.from_dict({"iterations": 10})
    with pytest.raises(ValueError, match="unknown stepper 'pgd'"):
        load_preset("paper", stepper="pgd")
    # a value from a Hydra node (invert.steps=-1) is named as the invert config's
    with pytest.raises(ValueError, match=r"^invert config: steps must be >= 0, got -1$"):
        InvertConfig.from_dict({"steps": -1})


@pytest.mark.parametrize("override, message", [
    ({"steps": 1e3}, r"steps must be an integer, got 1000.0 \(write 1000"),
    ({"patience": 50.0}, "patience must be an integer"),
    ({"seed": True}, "seed must be an integer"),
    ({"rtol": -1e-3}, "rtol must be a finite number >= 0"),
    ({"rtol": float("inf")}, "rtol must be a finite number >= 0"),  # every item would freeze after exactly `patience` steps
    ({"tv_weight": -0.1}, "tv_weight must be a finite number >= 0"),
    ({"lp_weight": float("nan")}, "lp_weight must be a finite number >= 0"),
    ({"lp_p": 0}, "lp_p must be a finite number >= 1"),
    ({"lp_p": 0.5}, "lp_p must be a finite number >= 1"),  # a mid-grey pixel would give a NaN gradient
    ({"tv_beta": float("inf")}, "tv_beta must be a positive finite number"),
    ({"step_size": float("nan")}, "step_size must be a positive finite number, got nan"),  # NaN <= 0 is False
    ({"step_size": float("inf")}, "step_size must be a positive finite number"),
    ({"adam_betas": [0.9]}, r"adam_betas must be two numbers in \[0, 1\)"),
    ({"adam_betas": [0.9, 1.0]}, r"adam_betas must be two numbers in \[0, 1\)"),
    ({"adam_eps": 0.0}, "adam_eps positive"),
    ({"adam_eps": float("inf")}, "adam_eps positive and finite"),  # Adam's step would be 0: the seeds come back unchanged
    ({"cuda_graph": 0.0}, "cuda_graph must be one of"),  # 0.0 == False, yet `is False` read it as on
    ({"cuda_graph": 1.0}, "cuda_graph must be one of"),
    ({"cuda_graph": 2}, "cuda_graph must be one of"),
    ({"stop_at_bounds": True, "parametrization": "sigmoid"}, "stop_at_bounds applies to parametrization=pixel only"),
    ({"keep_best": "no"}, "keep_best must be true or false, got 'no'"),  # Hydra's keep_best=no: a truthy string, so on
    ({"progress": 2}, "progress must be true or false"),
    ({"loss_threshold": float("nan")}, "loss_threshold must be a finite number"),  # switched the threshold off
    ({"loss_threshold": "0.05"}, "loss_threshold must be a finite number"),  # failed mid-run comparing a tensor with text
])
def test_a_value_the_engine_cannot_use_is_named_when_the_config_is_built(override, message):
    with pytest.raises(ValueError, match=message):
        load_preset("paper", **override)


def test_zero_and_one_are_booleans():
    config = load_preset("paper", keep_best=0, deterministic=1, loss_threshold=0)
    assert config.keep_best is False and config.deterministic is True and config.loss_threshold == 0
