"""In a multirun, audit, humans and stimuli survey put each job in a folder of its own (training.sweeps.job_path)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

import perceptual.pipelines.audit as audit_command
import perceptual.pipelines.humans as humans_command
import stimuli.commands as stimuli_commands


def _job_path(base):
    return Path(base) / "eot=2"


def test_audit_jobs_report_apart_and_share_the_sweeps_references(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(audit_command, "job_path", _job_path)
    monkeypatch.setattr(audit_command, "run", lambda cfg: seen.update(cfg=cfg) or {"verdict": "v", "out": cfg.out})
    audit_command.main.__wrapped__(OmegaConf.create({"out": str(tmp_path / "audit"), "reference_dir": None}))
    assert seen["cfg"].out == str(tmp_path / "audit" / "eot=2")
    assert seen["cfg"].reference_dir == str(tmp_path / "references")  # where a single run keeps them


def test_humans_jobs_report_apart(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(humans_command, "job_path", _job_path)
    monkeypatch.setattr(humans_command, "run", lambda cfg: seen.update(out=cfg.out) or {})
    monkeypatch.setattr(humans_command.humans, "markdown_summary", lambda data: "")
    humans_command.main.__wrapped__(OmegaConf.create({"out": str(tmp_path / "humans"), "package": "p", "measure_report": None}))
    assert seen["out"] == str(tmp_path / "humans" / "eot=2")


def test_humans_jobs_with_the_default_out_report_apart(monkeypatch, tmp_path):
    """out=null (<package>/results) got no job folder: every job of a sweep wrote the same humans.json."""
    seen = {}
    monkeypatch.setattr(humans_command, "job_path", _job_path)
    monkeypatch.setattr(humans_command, "run", lambda cfg: seen.update(out=cfg.out) or {})
    monkeypatch.setattr(humans_command.humans, "markdown_summary", lambda data: "")
    humans_command.main.__wrapped__(OmegaConf.create({"out": None, "package": str(tmp_path / "pilot"), "measure_report": None}))
    assert seen["out"] == str(tmp_path / "pilot" / "results" / "eot=2")


def test_reproduce_jobs_of_a_preset_sweep_need_no_level_named_after_the_preset(monkeypatch):
    """The out template names ${experiment.name}: expanding the path first replaced the template by its value, so a
    sweep over presets gave table1-cpu-digits/experiment=table1 instead of table1-cpu-digits."""
    from hydra import compose, initialize_config_module

    import perceptual.pipelines.reproduce as reproduce_command

    seen = {}
    monkeypatch.setattr(reproduce_command, "job_path", lambda base, groups=(): seen.update(groups=groups) or Path(base))
    monkeypatch.setattr(reproduce_command, "run", lambda cfg: seen.update(out=cfg.out))
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="reproduce", overrides=["experiment=table1"])
    reproduce_command.main.__wrapped__(cfg)
    assert {"experiment", "scale", "data"} <= set(seen["groups"]) and seen["out"].endswith("table1-cpu-digits")


def test_survey_jobs_build_packages_apart(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(stimuli_commands, "job_path", _job_path)
    monkeypatch.setattr(stimuli_commands, "build_survey", lambda sets, out, **kw: seen.update(out=out) or {"surveys": [], "trials": [], "fingerprint": "f"})
    cfg = OmegaConf.create({"sets": ["a", "b"], "labels": ["x", "y"], "out": str(tmp_path / "survey"), "tasks": ["2afc"], "trials_per_survey": 10,
                            "attention_rate": 0.1, "seed": 0, "distance": "lpips", "title": "t", "base_url": "", "minutes": 5,
                            "trial_order": "per_participant", "overwrite": False})
    stimuli_commands.survey_command(cfg)
    assert seen["out"] == tmp_path / "survey" / "eot=2"


def test_perceptual_help_is_an_answer_not_an_error(capsys):
    """``python -m perceptual --help`` exited with status 1, like a mistyped command."""
    import pytest

    from perceptual.__main__ import main

    main(["--help"])
    assert "usage: python -m perceptual {measure" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown command 'mesure'"):
        main(["mesure"])
