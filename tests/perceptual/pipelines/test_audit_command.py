"""``python -m perceptual audit``: the whole command on digits (references trained on the spot and reused by the
audit of another defence, alignment and controversial stimuli, every file it writes, a rerun that recomputes
nothing) and the bad input it refuses before the long work."""
from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch
from hydra import compose, initialize_config_module

import perceptual.audit as audit_module
import perceptual.measure as measure_module
import perceptual.pipelines.training_runs as references_module
from invert import Engine
from perceptual.pipelines import COMMANDS
from perceptual.pipelines.audit import load_defence, load_factory, model_spec, run, scoring_model_spec, sweep_eps
from perceptual.pipelines.unknown import load_model
from training.attacks import config_number

# The untrained CNNs these tests audit do not classify: rule 0 would stop them (tested on its own below).
QUICK = ["n_images=8", "threat.steps=2", "square_queries=5", "n_targets=1", "unbounded_steps=2", "eps_sweep=[4/255]", "masking_eps=[8/255]",
         "smoothing.samples=4", "allow_chance_accuracy=true"]
RANDOM_REFERENCES = [f"reference.{label}.factory=training.models:build_model" for label in ("standard", "robust")] + [
    f"+reference.{label}.kwargs={{name: small_cnn, dataset: digits, width: 4}}" for label in ("standard", "robust")]


def _cfg(out, *overrides):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="audit", overrides=[f"out={out}", *QUICK, *overrides])


def _refuse(*args, **kwargs):
    raise AssertionError("a cached stage ran again")


def test_audit_command_end_to_end_and_a_rerun_recomputes_nothing(tmp_path, monkeypatch):
    """Quantised-input small CNN (untrained, seeded) against given (random) references, with the alignment and the
    controversial stimuli; the bootstrap statistics of the measure report are skipped (measure's, tested there, slow)."""
    monkeypatch.setattr(measure_module, "measurement_statistics", lambda *args, **kwargs: {})
    overrides = ["defence.factory=training.models.defences:input_quantised", "+defence.kwargs={name: small_cnn, dataset: digits, width: 4}",
                 "alignment.n_targets=3", "alignment.observers=[pixel-l2]", "alignment.controversial.n_origins=2", "alignment.controversial.steps=5",
                 "invert.steps=10", *RANDOM_REFERENCES]
    result = run(_cfg(tmp_path, *overrides))
    # strict JSON: one observer has no spread, which was written as the bare token NaN that JSON.parse and jq refuse
    report = json.loads((tmp_path / "audit.json").read_text(), parse_constant=lambda token: pytest.fail(f"audit.json holds {token}"))
    assert report["verdict"] == result["verdict"] and report["flagged"] == audit_module.is_flagged(report["verdict"])
    accuracy = report["robustness"]["accuracy"]
    assert set(accuracy) >= {"clean", "fgsm", "pgd", "apgd-ce", "apgd-t", "apgd-smooth", "square", "transfer", "worst_case"}
    assert "smoothed_gradient_not_stronger" in {c["name"] for c in report["robustness"]["checks"]}
    assert accuracy["worst_case"] <= min(v for k, v in accuracy.items() if k != "worst_case")
    assert set(report["robustness"]["sweep"]) == {"0.0156863", "0.0313725"}
    assert set(report["alignment"]["models"]) == {"defence", "standard", "robust"} and "position" in report["alignment"]
    controversial = report["alignment"]["controversial"]
    assert "favoured_by_observer" in controversial and "spread" not in controversial  # no mean over observers' different scales
    assert set(controversial["scores"]) == set(controversial["directions"]) and all(set(s) == {"pixel-l2"} for s in controversial["scores"].values())
    assert report["references"]["robust"]["source"].startswith("given")
    markdown = (tmp_path / "audit.md").read_text()
    assert markdown.startswith("# Defence audit") and "Table 2 score per direction and observer" in markdown  # was: "panel mean"
    assert re.search(r"defence keeps, robust pushed: pixel-l2 \d\.\d{4}", markdown)
    page = (tmp_path / "audit.html").read_text()
    assert page.index("Verdict") < page.index("Masking checks") < page.index("Decision rule")
    for figure in ("accuracy_vs_eps.png", "masking_checks.png", "accuracy_per_attack.png", "alignment_vs_robust_clustering.png"):
        assert (tmp_path / figure).stat().st_size > 1000, figure
        assert figure in report["figures"]
    assert COMMANDS["audit"] == "perceptual.pipelines.audit"
    # Rerunning recomputes no attack, no masking report and no inversion.
    for name in ("apgd", "pgd", "fgsm", "square", "gradient_masking_report"):
        monkeypatch.setattr(audit_module, name, _refuse)
    monkeypatch.setattr(Engine, "run", _refuse)
    assert run(_cfg(tmp_path, *overrides))["verdict"] == result["verdict"]
    # Another quantisation is another defence with the same weights: its attacks and its inversions run afresh.
    monkeypatch.undo()
    monkeypatch.setattr(measure_module, "measurement_statistics", lambda *args, **kwargs: {})
    engine_runs, original_run, apgd_runs, original_apgd = [], Engine.run, [], audit_module.apgd
    monkeypatch.setattr(Engine, "run", lambda self, *args, **kwargs: engine_runs.append(1) or original_run(self, *args, **kwargs))
    monkeypatch.setattr(audit_module, "apgd", lambda *args, **kwargs: apgd_runs.append(1) or original_apgd(*args, **kwargs))
    coarser = [o.replace("width: 4}", "width: 4, levels: 2}") if o.startswith("+defence.kwargs") else o for o in overrides]
    run(_cfg(tmp_path, *coarser))
    assert apgd_runs and engine_runs
    again = json.loads((tmp_path / "audit.json").read_text())
    assert again["alignment"]["report"] != report["alignment"]["report"]  # the defence's own sets, not the 8-level ones


def test_audit_with_class_controversial_stimuli_reports_whose_decisions_each_observer_shares(tmp_path, monkeypatch):
    """objective=class_controversial passed every check, then the report asked for Table 2's directions: KeyError after all the work."""
    monkeypatch.setattr(measure_module, "measurement_statistics", lambda *args, **kwargs: {})
    run(_cfg(tmp_path, "defence.name=small_cnn", "+defence.kwargs={width: 8}", "alignment.n_targets=3", "alignment.observers=[pixel-l2,ssim]",
             "alignment.controversial.n_origins=2", "alignment.controversial.steps=5", "+alignment.controversial.objective=class_controversial",
             "+alignment.controversial.exemplars_per_class=3", "invert.steps=10", *RANDOM_REFERENCES))
    controversial = json.loads((tmp_path / "audit.json").read_text())["alignment"]["controversial"]
    assert controversial["objective"] == "class_controversial" and set(controversial["observers"]) == {"pixel-l2", "ssim"}
    assert controversial["summary"].startswith("of 2 observers, ")
    page = (tmp_path / "audit.md").read_text()
    assert "Class-controversial stimuli (defence vs robust" in page and "- pixel-l2: " in page


def test_references_are_trained_once_and_reused_by_the_next_audit(tmp_path, monkeypatch):
    """No reference given: a standard and a PGD small CNN are trained (one tiny epoch) into <out>/../references; the
    audit of another defence beside it finds them and trains nothing."""
    tiny = ["references.schedule.epochs=1", "references.schedule.batch_size=256", "references.model_kwargs.width=4", "references.attack.steps=1",
            "alignment.enabled=false"]
    first = run(_cfg(tmp_path / "first", "defence.name=small_cnn", "+defence.kwargs={width: 4}", *tiny))
    report = json.loads((tmp_path / "first" / "audit.json").read_text())
    assert "trained here with the pgd recipe" in report["references"]["robust"]["source"] and "transfer" in report["robustness"]["accuracy"]
    weights = sorted((tmp_path / "references").glob("*/runs/*/model.safetensors"))
    assert [w.parent.name for w in weights] == ["robust", "standard"]
    stamps = [w.stat().st_mtime_ns for w in weights]
    monkeypatch.setattr(references_module, "train", _refuse)
    second = run(_cfg(tmp_path / "second", "defence.factory=training.models.defences:input_quantised",
                      "+defence.kwargs={name: small_cnn, dataset: digits, width: 4}", *tiny))
    assert first["verdict"] and second["verdict"]
    assert [w.stat().st_mtime_ns for w in weights] == stamps


@pytest.fixture()
def user_models(tmp_path, monkeypatch):
    """A module of the user's own models on sys.path: a probability output, a randomised one, a non-classifier."""
    (tmp_path / "my_defences.py").write_text(textwrap.dedent("""
        import torch
        from training import build_model

        class Noisy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = build_model("small_cnn", "digits", width=4)
                self.penultimate = None
            def forward(self, x):
                return self.inner((x + 0.05 * torch.randn_like(x)).clamp(0, 1))

        def probabilities():
            return torch.nn.Sequential(build_model("small_cnn", "digits", width=4), torch.nn.Softmax(dim=1))

        def noisy():
            return Noisy()

        def features():
            return torch.nn.Flatten()

        def not_a_module():
            return "model"

        class Dimmed(torch.nn.Module):
            # a reference whose setting shows in neither its weights nor its repr
            def __init__(self, scale):
                super().__init__()
                torch.manual_seed(0)
                self.inner, self.scale = build_model("small_cnn", "digits", width=4), scale
            def forward(self, x):
                return self.inner(x * self.scale)

        def dimmed(scale):
            return Dimmed(scale)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("factory,error,match", [
    ("surely_missing_pkg.models:build", ValueError, "does not import"),
    ("my_defences:no_such_function", ValueError, "no attribute"),
    ("my_defences:not_a_module", TypeError, "not a torch.nn.Module"),
    ("my_defences:features", ValueError, "one logit per class"),
    ("my_defences:probabilities", ValueError, "probabilities"),
])
def test_bad_defences_are_refused_before_any_work(user_models, factory, error, match, monkeypatch):
    monkeypatch.setattr(references_module, "train", _refuse)
    monkeypatch.setattr(audit_module, "worst_case", _refuse)
    with pytest.raises(error, match=match):
        run(_cfg(user_models / "out", f"defence.factory={factory}"))


def test_a_defence_that_does_not_classify_is_refused_before_any_work(tmp_path, monkeypatch):
    """An untrained CNN (a forgotten checkpoint) answered one class for every image: 12% clean and 12% under every
    attack, which the audit called "no sign of gradient masking". It is stopped before references train or attacks run;
    audited anyway, it gets no verdict and is flagged."""
    untrained = ["defence.name=small_cnn", "+defence.kwargs.width=4", "n_images=64", "alignment.enabled=false", *RANDOM_REFERENCES]
    with monkeypatch.context() as patched:
        patched.setattr(references_module, "train", _refuse)
        patched.setattr(audit_module, "worst_case", _refuse)
        with pytest.raises(ValueError, match=r"clean accuracy \(\d+\.\d% of 64 images\) is not above the chance agreement of its answers "
                                             r"with the labels \(\d+\.\d%; it answered \d distinct class.*Check the weights.*"
                                             r"allow_chance_accuracy=true audits it anyway"):
            run(_cfg(tmp_path, *untrained, "allow_chance_accuracy=false"))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    result = run(_cfg(tmp_path, *untrained))  # QUICK allows it
    report = json.loads((tmp_path / "audit.json").read_text())
    assert "no verdict: the defence does not classify" in result["verdict"] and result["flagged"] and report["flagged"]
    assert "does not classify these images" in report["warnings"][0] and not report["robustness"]["above_chance"]
    assert report["robustness"]["chance_agreement"] == pytest.approx(report["robustness"]["accuracy"]["clean"], abs=0.05)


@pytest.mark.parametrize("setting,match", [("alignment.observers=[lpips-alexx]", "unknown observer 'lpips-alexx'"),
                                           ("alignment.observer_net=alexnet", "unknown LPIPS network 'alexnet'")])
def test_the_observer_panel_is_checked_before_references_train(tmp_path, monkeypatch, setting, match):
    """A misspelt observer failed at stage 4, after the references trained and every attack ran."""
    monkeypatch.setattr(references_module, "train", _refuse)
    monkeypatch.setattr(audit_module, "worst_case", _refuse)
    with pytest.raises(ValueError, match=match):
        run(_cfg(tmp_path, "defence.name=small_cnn", "+defence.kwargs.width=4", setting))


def test_a_reference_rebuilt_with_other_settings_is_attacked_again(user_models):
    """The references' cache keys held their weights and repr only: a factory reference rebuilt with another kwarg kept
    the old model's attack results in a rerun."""
    def keys(out, scale):  # what each cached attack result is filed under (untrained models: every accuracy is 0 here)
        run(_cfg(user_models / out, "defence.factory=my_defences:noisy", "eot=2", "alignment.enabled=false", *RANDOM_REFERENCES[::2],
                 "reference.robust.factory=my_defences:dimmed", f"+reference.robust.kwargs={{scale: {scale}}}"))
        files = sorted((user_models / out / "cache").rglob("*.json"))
        return {f.relative_to(user_models / out).as_posix(): json.loads(f.read_text()).get("key") for f in files if "attacks" in f.parts}

    first = keys("rerun", 1.0)
    again = keys("rerun", 0.0)
    assert again == keys("fresh", 0.0)  # the rerun computed what a fresh run does
    assert all(again[name] != first[name] for name in first if name.startswith("cache/robust/"))
    assert all(again[name] == first[name] for name in first if name.startswith("cache/standard/"))  # the other reference: kept


def test_randomised_defence_without_eot_is_warned_in_the_report(user_models, capsys, caplog):
    run(_cfg(user_models / "out", "defence.factory=my_defences:noisy", "alignment.enabled=false", *RANDOM_REFERENCES))
    # the library logs the warning once; it printed it besides, where logging settings cannot reach it
    assert capsys.readouterr().out == "" and sum("the defence is randomised" in r.getMessage() for r in caplog.records) == 1
    report = json.loads((user_models / "out" / "audit.json").read_text())
    assert report["robustness"]["randomised"] and "eot=1" in report["warnings"][0]
    assert "**Warning:** the defence is randomised" in (user_models / "out" / "audit.md").read_text()
    assert {c["name"]: c["status"] for c in report["robustness"]["checks"]}["randomness_handled"] == "fail"


def test_bad_configs_are_explained(tmp_path):
    with pytest.raises(ValueError, match="module:function"):
        load_factory("no_colon_here")
    with pytest.raises(ValueError, match="exactly one"):
        run(_cfg(tmp_path))
    with pytest.raises(ValueError, match="reference.robust is not given"):
        run(_cfg(tmp_path, "defence.name=small_cnn", "reference.standard.name=small_cnn"))
    with pytest.raises(ValueError, match="bpda='quantize' is not a submodule"):
        run(_cfg(tmp_path, "defence.factory=training.models.defences:input_quantised", "+defence.kwargs={name: small_cnn, dataset: digits, width: 4}",
                 "bpda=quantize", *RANDOM_REFERENCES))
    with pytest.raises(ValueError, match="smoothing.samples must be 0"):
        run(_cfg(tmp_path, "defence.name=small_cnn", "smoothing.samples=1", *RANDOM_REFERENCES))
    with pytest.raises(FileNotFoundError, match="defence.checkpoint not found"):
        run(_cfg(tmp_path, "defence.name=small_cnn", "defence.checkpoint=missing.safetensors"))
    for setting in ("eot=0", "n_targets=0", "square_queries=-5"):  # eot=0 was audited with no pass; the others failed mid-attack
        with pytest.raises(ValueError, match=f"{setting.split('=')[0]} must be an integer >= 1"):
            run(_cfg(tmp_path, "defence.name=small_cnn", setting))
    for setting in ("eps_sweep=[0]", "masking_eps=[-0.1]"):  # they failed after every attack at threat.eps had run
        with pytest.raises(ValueError, match=f"{setting.split('=')[0]}: .*eps"):
            run(_cfg(tmp_path, "defence.name=small_cnn", setting, *RANDOM_REFERENCES))
        assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "audit.json").exists()


def test_model_nodes_take_every_model_spec_key_and_refuse_unknown_ones(tmp_path, monkeypatch):
    """The audit's (and visalign's, unknown's) model nodes dropped trust_pickle, fake_relu and any misspelt key without a
    word, and looked for '$RUNS/x.pt' literally while measure's models=[...] expands it."""
    from argparse import Namespace

    from omegaconf import OmegaConf

    from training import build_model

    checkpoint = tmp_path / "runs" / "robustness_style.pt"  # a library checkpoint with its argparse options: needs trust
    checkpoint.parent.mkdir()
    torch.save({"model": build_model("small_cnn", "digits", width=4).state_dict(), "args": Namespace(arch="small_cnn")}, checkpoint)
    monkeypatch.setenv("RUNS", str(checkpoint.parent))
    node = OmegaConf.create({"name": "small_cnn", "factory": None, "checkpoint": "$RUNS/robustness_style.pt", "kwargs": {"width": 4},
                             "layer": None, "trust_pickle": True, "fake_relu": False})
    spec = model_spec(node, "robust", "reference.robust")
    assert (spec.checkpoint, spec.trust_pickle, spec.fake_relu, spec.label) == (str(checkpoint), True, False, "robust")
    assert load_defence(spec, "digits")(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    node.trust_pickle = False
    with pytest.raises(ValueError, match="reference.robust: .*holds what a safe load .* refuses .* trust_pickle"):
        load_defence(model_spec(node, "robust", "reference.robust"), "digits", "reference.robust")
    with pytest.raises(ValueError, match=r"model: .*holds what a safe load .* refuses"):  # unknown's zoo path read it the same way
        load_model(scoring_model_spec(node, "unknown"), 10)
    node.trust_pickle = True
    assert load_model(scoring_model_spec(OmegaConf.merge(node, {"checkpoint": None}), "unknown"), 7)(torch.rand(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(ValueError, match=r"defence has unknown keys \['trust_pikle'\]: it takes name, factory, checkpoint"):
        model_spec(OmegaConf.merge(node, {"trust_pikle": True}), "defence", "defence")
    with pytest.raises(ValueError, match="reference.robust.label='mine': this command labels it 'robust'"):
        model_spec(OmegaConf.merge(node, {"label": "mine"}), "robust", "reference.robust")
    with pytest.raises(FileNotFoundError, match="reference.robust.checkpoint not found: \\$RUNS/gone.pt"):
        model_spec(OmegaConf.merge(node, {"checkpoint": "$RUNS/gone.pt"}), "robust", "reference.robust")


def test_a_misspelt_defence_key_and_a_missing_lpips_weights_file_stop_the_audit_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(references_module, "train", _refuse)
    monkeypatch.setattr(audit_module, "worst_case", _refuse)
    with pytest.raises(ValueError, match=r"defence has unknown keys \['chekpoint'\]"):
        run(_cfg(tmp_path, "defence.name=small_cnn", "+defence.chekpoint=model.safetensors"))
    with pytest.raises(FileNotFoundError, match=r"LPIPS-alex weights file not found: .*missing-alex\.pth"):  # the error's advice now works
        run(_cfg(tmp_path, "defence.name=small_cnn", "+defence.kwargs.width=4", "alignment.observers=[lpips]",
                 f"alignment.lpips_weights={tmp_path / 'missing-alex.pth'}"))


def test_the_default_eps_sweep_follows_the_threat(tmp_path):
    """An L2 audit at eps 0.5 ran every attack three more times at the Linf default's 2/255, 4/255 and 16/255."""
    with initialize_config_module(config_module="conf", version_base=None):
        default = compose(config_name="audit")
        l2 = compose(config_name="audit", overrides=["threat.norm=l2", "threat.eps=0.5"])
    assert sweep_eps(default.eps_sweep, config_number(default.threat.eps, "eps")) == [2 / 255, 4 / 255, 16 / 255]  # bit for bit: cache keys hold
    assert sweep_eps(l2.eps_sweep, 0.5) == [0.125, 0.25, 1.0]
    assert sweep_eps([], 0.5) == [] and sweep_eps(["4/255"], 0.5) == [4 / 255]


def test_bpda_option_reaches_the_attacks(tmp_path):
    """bpda=quantise: the white-box attacks go through the rounding's identity gradient (recorded in the report)."""
    torch.manual_seed(0)
    run(_cfg(tmp_path, "defence.factory=training.models.defences:input_quantised", "+defence.kwargs={name: small_cnn, dataset: digits, width: 4}",
             "bpda=quantise", "alignment.enabled=false", *RANDOM_REFERENCES))
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["robustness"]["bpda"] == "quantise" and "BPDA: quantise" in (tmp_path / "audit.md").read_text()
