"""``python -m perceptual reproduce``: the paper's presets at a test size (the slow test runs every preset)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perceptual.pipelines.reproduce import _digest, expand_variants, run, train_overrides, training_configs
from training.config import compose

# A preset at test size: one epoch, narrow models, 4 targets, 20 inversion steps, two weight-free observers.
TINY = [
    "progress=false", "n_boot=100", "observers=[pixel-l2,ssim]",
    "scale.schedule.epochs=1", "scale.measure.n_targets=4", "scale.measure.invert.steps=20", "scale.measure.threat.steps=2",
    "scale.architectures.cnn.kwargs.width=4", "scale.architectures.resnet.kwargs.width=4", "scale.architectures.vgg.kwargs.width=4",
    "scale.architectures.kwta.kwargs.width=4",
    "scale.recipe_schedule.simclr.epochs=1", "scale.recipe_schedule.simclr.probe.epochs=2", "scale.recipe_schedule.simclr.schedule.warmup_epochs=0",
    "scale.recipe_schedule.adv_simclr.epochs=1", "scale.recipe_schedule.adv_simclr.probe.epochs=2",
    "scale.recipe_schedule.adv_simclr.schedule.warmup_epochs=0",
]


def _config(tmp_path, *overrides):
    return compose("reproduce", [f"out={tmp_path / 'out'}", f"runs_dir={tmp_path / 'runs'}", *TINY, *overrides])


def test_presets_expand_to_the_papers_models():
    table1 = expand_variants(compose("reproduce", ["experiment=table1"]))
    assert [v.label for v in table1] == ["cnn-standard", "cnn-pgd", "resnet-standard", "resnet-pgd", "vgg-standard", "vgg-pgd"]
    fig4 = expand_variants(compose("reproduce", ["experiment=fig4"]))
    assert fig4[0].label == "cnn-standard" and fig4[-1].label == "kwta-pgd"
    assert {v.training for v in fig4} >= {"trades_beta1", "trades_beta6", "mart_beta1", "mart_beta5"}
    fig7 = expand_variants(compose("reproduce", ["experiment=fig7"]))
    assert [v.recipe for v in fig7] == ["standard", "pgd", "simclr", "adv_simclr"]
    paper = expand_variants(compose("reproduce", ["experiment=table1", "scale=paper", "data=cifar10"]))
    assert [v.model for v in paper[::2]] == ["resnet18", "resnet50", "vgg16", "densenet121", "inception_v3"]
    assert expand_variants(compose("reproduce", ["experiment=fig6", "scale=paper", "data=cifar10"]))[0].model == "resnet18"


def test_train_overrides_give_every_adversarial_recipe_the_scales_attack_and_let_the_catalogue_win():
    cfg = compose("reproduce", ["experiment=fig6"])
    variants = {v.training: v for v in expand_variants(cfg)}
    pgd_aug = train_overrides(variants["pgd_aug"], cfg.scale)
    assert pgd_aug["attack.eps"] == 1.0 and pgd_aug["attack.norm"] == "l2" and pgd_aug["epochs"] == 10
    assert pgd_aug["augment.enabled"] is True  # the catalogue entry overrides the scale's augment.enabled=false
    assert "attack.eps" not in train_overrides(variants["standard_noaug"], cfg.scale)


def test_the_scale_keeps_each_recipes_own_attack_step():
    """The scale's attack set step_size: null, so TRADES and MART trained with Madry's 2.5 eps/steps instead of their
    reference inner step, and adversarial SimCLR with 0.83 instead of its 0.5."""
    from training.config import reference_inner_step

    for scale, steps in (("cpu", 3), ("paper", 10)):  # paper: TRADES' and MART's own 10 steps (the scale shared 7)
        cfg = compose("reproduce", ["experiment=fig5", f"scale={scale}"])
        step_of = {c.train.name: c.train.attack.step_size for c in training_configs(cfg, expand_variants(cfg)).values() if "attack" in c.train}
        reference = reference_inner_step("l2", 1.0, steps)
        assert step_of == {"pgd": None, "trades": pytest.approx(reference), "mart": pytest.approx(reference)}  # PGD's None: 2.5 eps / steps


@pytest.mark.parametrize("overrides, message", [
    (["experiment.architectures=[cnn,transformer]"], "unknown architectures"),
    (["experiment.trainings=[standard,pdg]"], "unknown trainings"),
    (["scale=paper"], "scale=paper trains on the paper's data sets"),
    (["scale=paper", "data=imagenet", "data.root=/nowhere"], r"scale=paper trains on .*ImageNet models are measured from checkpoints"),
    (["experiment.result=bars"], "result must be one of"),
    (["experiment.architectures=everything"], "is not a set of this scale"),
    (["experiment=fig6", "experiment.comparisons=[[pgd_aug,pgd_noug]]"], r"names \['pgd_noug'\], not trainings of this experiment"),
    # found only after every model was trained and measured
    (["experiment=fig4", "scale.measure.threat=null"], "fig4 plots alignment against robust accuracy: scale.measure.threat must not be null"),
    (["experiment=table3", "experiment.gaussian_targets=false"], "table3 compares .* it needs experiment.gaussian_targets=true"),
    (["convergence_threshold=0"], "the convergence threshold must be a positive number"),
    (["scale.measure.accuracy_limit=0"], "accuracy_limit must be a positive number of test images"),
    (["n_boot=0"], "n_boot is the number of bootstrap draws"),  # NaN intervals
    (["n_boot=-1"], "n_boot is the number of bootstrap draws"),  # every paired difference silently left out
    (["experiment=fig4", "+scale.recipe_schedule.trade.epochs=3"], r"scale.recipe_schedule names no recipe: \['trade'\]"),  # TRADES kept 10
    # dropped without a word: measured with the defaults
    (["+scale.measure.noise_knd=super"], r"scale.measure key\(s\) \['noise_knd'\] are not used by reproduce: use \['n_targets'"),
    (["seed=-1"], "seed must be a whole number >= 0"),  # failed in the trial draws, after every model was inverted
])
def test_bad_presets_are_refused_before_anything_trains(tmp_path, overrides, message):
    cfg = compose("reproduce", [f"out={tmp_path / 'out'}", f"runs_dir={tmp_path / 'runs'}", "progress=false", *overrides])
    with pytest.raises(ValueError, match=message):
        run(cfg)
    assert not (tmp_path / "runs").exists()


def test_measure_settings_reach_the_measurement_and_only_set_settings_name_its_folder(tmp_path, monkeypatch):
    """noise_kind, attention_rate, judge_8bit and chunk_size of scale.measure were dropped; another observer panel or
    threat gave a new folder, so every model was inverted again."""
    import perceptual.pipelines.reproduce as reproduce

    seen = {}

    class Stop(Exception):
        pass

    def measure_models(specs, data_cfg, out, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(reproduce, "train_models", lambda configs: {label: tmp_path / f"{label}.safetensors" for label in configs})
    monkeypatch.setattr(reproduce, "measure_models", measure_models)
    settings = ["scale.measure.noise_kind=super", "scale.measure.attention_rate=0.1", "scale.measure.judge_8bit=false",
                "scale.measure.chunk_size=16"]
    from training.config import check_overrides

    check_overrides("reproduce", settings)  # the command line's check refused +scale.measure.noise_kind, which reproduce reads
    with pytest.raises(Stop):
        run(_config(tmp_path, "experiment=table1", "experiment.architectures=[cnn]", *settings))
    assert (seen["noise_kind"], seen["attention_rate"], seen["judge_8bit"], seen["chunk_size"]) == ("super", 0.1, False, 16)
    folders = seen["model_dirs"]

    def folders_with(*overrides):
        with pytest.raises(Stop):
            run(_config(tmp_path, "experiment=table1", "experiment.architectures=[cnn]", *settings, *overrides))
        return seen["model_dirs"]

    assert folders_with("observers=[pixel-l2]", "scale.measure.threat.steps=5", "scale.measure.accuracy_limit=10") == folders
    assert folders_with("scale.measure.n_targets=6") != folders and folders_with("seed=1") != folders


def test_table1_at_test_size_trains_measures_and_reuses_its_models(tmp_path):
    cfg = _config(tmp_path, "experiment=table1", "experiment.architectures=[cnn]")
    first = run(cfg)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert [v["label"] for v in result["variants"]] == ["cnn-standard", "cnn-pgd"]
    assert set(result["differences"]["cnn-pgd - cnn-standard"]) == {"2afc", "clustering", "clustering_hard"}
    assert "python -m perceptual reproduce experiment=table1 scale=cpu data=digits" in (tmp_path / "out" / "result.md").read_text()
    assert first["data"]["models"]["cnn-pgd"]["robust_accuracy"] is not None
    weights = sorted((tmp_path / "runs").glob("*/model.safetensors"))
    assert len(weights) == 2
    stamps = [w.stat().st_mtime_ns for w in weights]
    run(cfg)  # the models are reused, not retrained
    assert [w.stat().st_mtime_ns for w in sorted((tmp_path / "runs").glob("*/model.safetensors"))] == stamps


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["table3", "fig4", "fig5", "fig6", "fig7"])
def test_every_preset_runs_at_test_size(tmp_path_factory, experiment):
    shared = tmp_path_factory.getbasetemp() / "reproduce-runs"  # the presets share their models, as on the command line
    tmp_path = tmp_path_factory.mktemp(experiment)
    cfg = compose("reproduce", [f"out={tmp_path / 'out'}", f"runs_dir={shared}", *TINY, f"experiment={experiment}"])
    run(cfg)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["experiment"] == experiment
    for figure in result["figures"]:
        assert (tmp_path / "out" / figure).stat().st_size > 1000


def test_a_model_is_one_folder_however_a_preset_spells_its_settings(tmp_path):
    """At scale=paper the standard recipe augments already: standard_aug is the standard model, and pgd_aug the pgd one
    (keyed by the overrides, Fig. 6 trained two 150-epoch ResNet18s that Table 1 had)."""
    def paper_configs(experiment):
        cfg = compose("reproduce", [f"experiment={experiment}", "scale=paper", "data=cifar10", f"runs_dir={tmp_path / 'runs'}"])
        return training_configs(cfg, expand_variants(cfg))

    table1, fig6 = paper_configs("table1"), paper_configs("fig6")
    assert fig6["resnet-standard_aug"].run_dir == table1["resnet-standard"].run_dir
    assert fig6["resnet-pgd_aug"].run_dir == table1["resnet-pgd"].run_dir
    assert fig6["resnet-standard_noaug"].run_dir != table1["resnet-standard"].run_dir  # without augmentation: another model
    # a folder named by the former digest of the overrides is used where it exists: nothing is retrained after an update
    cpu = compose("reproduce", ["experiment=table1", "experiment.architectures=[cnn]", f"runs_dir={tmp_path / 'cpu'}"])
    variant = expand_variants(cpu)[0]
    overrides = train_overrides(variant, cpu.scale)
    legacy = tmp_path / "cpu" / f"digits-{variant.model}-{variant.recipe}-{_digest(variant.model, variant.kwargs, variant.recipe, overrides, cpu.seed)}"
    legacy.mkdir(parents=True)
    assert training_configs(cpu, [variant])[variant.label].run_dir == str(legacy)


def test_models_trained_on_another_data_folder_of_the_same_name_are_not_reused(tmp_path):
    """cifar-10-mini and CIFAR-10 are both data=cifar10: the resolved root separates their runs (and so their
    measurements); a folder from before the root counted is reused only for the root its saved config names."""
    def cnn_run_dir(root):
        cfg = compose("reproduce", ["experiment=table1", "experiment.architectures=[cnn]", "data=cifar10", f"data.root={root}",
                                    f"runs_dir={tmp_path / 'runs'}"])
        variant = expand_variants(cfg)[0]
        return Path(training_configs(cfg, [variant])[variant.label].run_dir), cfg, variant

    mini, cfg, variant = cnn_run_dir(tmp_path / "cifar-10-mini")
    full, _, _ = cnn_run_dir(tmp_path / "cifar-10")
    assert mini != full and mini.parent == full.parent
    assert cnn_run_dir(f"{tmp_path}/./cifar-10-mini")[0] == mini  # one root, however it is spelt
    from perceptual.pipelines.reproduce import run_identity
    config = training_configs(cfg, [variant])[variant.label]
    before = mini.parent / f"{mini.name.rsplit('-', 1)[0]}-{_digest(run_identity(config))}"  # named before the root counted
    before.mkdir(parents=True)
    (before / "config.yaml").write_text(f"data:\n  name: cifar10\n  root: {tmp_path / 'cifar-10-mini'}\n")
    assert cnn_run_dir(tmp_path / "cifar-10-mini")[0] == before and cnn_run_dir(tmp_path / "cifar-10")[0] == full
