"""``python -m perceptual audit``: composed from conf/audit.yaml, a factory import path, the files it writes, bad input."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_module

from perceptual.pipelines import COMMANDS
from perceptual.pipelines.audit import load_factory, run


def _cfg(tmp_path, *overrides):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="audit", overrides=[f"out={tmp_path}", "n_images=8", "threat.steps=2", "square_queries=5", "n_targets=1",
                                                       *overrides])


def test_audit_command_writes_json_markdown_and_figure(tmp_path):
    cfg = _cfg(tmp_path, "defence.factory=training.models:build_model", "+defence.kwargs.name=small_cnn", "+defence.kwargs.dataset=digits",
               "+defence.kwargs.width=4")
    result = run(cfg)
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["verdict"] == result["verdict"]
    assert set(report["accuracy"]) >= {"clean", "fgsm", "pgd", "apgd-ce", "apgd-t", "square", "worst_case"}
    assert report["accuracy"]["worst_case"] <= min(v for k, v in report["accuracy"].items() if k != "worst_case")
    assert (tmp_path / "audit.md").read_text().startswith("# Defence audit")
    assert (tmp_path / "accuracy_per_attack.png").stat().st_size > 1000
    assert COMMANDS["audit"] == "perceptual.pipelines.audit"


def test_bad_factory_paths_are_explained():
    with pytest.raises(ValueError, match="module:function"):
        load_factory("no_colon_here")
    with pytest.raises(ValueError, match="does not import"):
        load_factory("surely_missing_pkg.models:build")
    with pytest.raises(ValueError, match="no attribute"):
        load_factory("training.models:no_such_function")


def test_defence_must_be_named_exactly_once(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        run(_cfg(tmp_path))
