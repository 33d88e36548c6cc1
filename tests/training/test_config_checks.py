"""Configs are checked before work starts: misspelt keys are refused by name, paths expand ~ and $VARS."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from training.config import ConfigError, check_overrides, check_train_config, compose, expand_path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_misspelt_override_is_refused_with_the_close_key_and_no_plus_hint():
    with pytest.raises(ConfigError, match=r"unknown config key 'train.epoch'.*Did you mean train.epochs\b") as info:
        check_overrides("train", ["train.epoch=1"])
    assert "+train.epoch" not in str(info.value) and "train.batch_size" in str(info.value)
    with pytest.raises(ConfigError, match=r"'invert.step'.*Did you mean invert.steps"):
        check_overrides("demo", ["invert.step=10"])
    # a sweep is checked on its first value; group choices and real keys pass
    cfg = check_overrides("train", ["-m", "train=trades", "train.beta=1,3,6", "data.root=/somewhere"])
    assert cfg.train.beta == 1 and cfg.train.name == "trades"


def test_a_misspelt_key_inside_a_dict_value_is_named():
    with pytest.raises(ConfigError, match=r"unknown config key 'train.schedule.milestone'.*Did you mean train.schedule.milestones"):
        check_overrides("train", ["train.schedule={name:step,milestone:[5]}"])
    with pytest.raises(ConfigError, match=r"unknown config key 'threat.stpes'.*Did you mean threat.steps"):
        check_overrides("measure", ["threat={norm:linf,eps:0.0157,stpes:10}"])
    assert check_overrides("measure", ["threat={norm:linf,eps:0.0157,steps:10}"]).threat.steps == 10


def test_a_misspelt_launcher_key_is_named_with_the_launchers_keys():
    with pytest.raises(ConfigError, match=r"'hydra.launcher.partiton' in Hydra's config.*Did you mean hydra.launcher.partition") as info:
        check_overrides("stimuli_invert", ["-m", "hydra/launcher=slurm_gpu", "hydra.launcher.partiton=gpu", "shard=0,1", "n_shards=2"])
    assert "hydra.launcher.timeout_min" in str(info.value)
    assert check_overrides("stimuli_invert", ["hydra/launcher=slurm_gpu", "hydra.launcher.timeout_min=60"]).n_targets > 0


def test_a_top_level_key_added_with_plus_is_refused_by_every_command():
    """Hydra accepts '+n_target=2' and the command would run its default 100 targets."""
    with pytest.raises(ConfigError, match=r"unknown config key 'n_target' in conf/stimuli_invert.yaml.*Did you mean n_targets"):
        check_overrides("stimuli_invert", ["+n_target=2"])
    with pytest.raises(ConfigError, match=r"'\+sed=\.\.\.' would add a key that measure never reads"):
        check_overrides("measure", ["-m", "++sed=1,2"])
    # an existing key forced with ++, model kwargs and config groups pass
    assert check_overrides("stimuli_invert", ["++n_targets=2", "+model.kwargs.width=8"]).n_targets == 2


def test_a_nested_key_added_with_plus_is_refused_where_its_node_is_closed():
    """Hydra accepts '+threat.epz=1' and measure would attack at its default eps; '+data.splt=train' and
    '+controversal.lambda_=1' were accepted too. Free-form nodes (kwargs, training overrides, score parameters) and
    a node the command leaves null (controversial: measure checks a dict's keys itself) still take new keys."""
    with pytest.raises(ConfigError, match=r"unknown config key 'threat.epz' in conf/measure.yaml.*Did you mean threat.eps.*"
                                          r"'\+threat.epz=\.\.\.' would add a key that measure never reads") as info:
        check_overrides("measure", ["+threat.epz=1"])
    assert "threat.steps" in str(info.value)  # the node's valid keys are listed
    with pytest.raises(ConfigError, match=r"unknown config key 'invert.stepz'.*Did you mean invert.steps"):
        check_overrides("stimuli_invert", ["-m", "++invert.stepz=10,20"])
    with pytest.raises(ConfigError, match=r"unknown config key 'data.splt'.*Valid keys under data: data.download, data.name, data.root"):
        check_overrides("measure", ["+data.splt=train"])
    with pytest.raises(ConfigError, match=r"unknown config key 'controversal'.*Did you mean controversial"):
        check_overrides("measure", ["+controversal.lambda_=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'train.augment.flop'"):
        check_overrides("train", ["+train.augment.flop.p=0.5"])  # the shortest unknown part is named
    # open nodes and existing keys pass
    assert check_overrides("measure", ["+controversial.lambda_=0.5"]).controversial.lambda_ == 0.5
    assert check_overrides("audit", ["+defence.kwargs.width=8", "++threat.eps=0.25"]).threat.eps == 0.25
    assert check_overrides("unknown", ["+score_params.react.percentile=95"]).score_params.react.percentile == 95
    assert check_overrides("reproduce", ["+trainings.pgd.overrides.epochs=3"]).trainings.pgd.overrides.epochs == 3
    assert check_overrides("stimuli_invert", ["hydra/launcher=slurm_gpu", "+hydra.launcher.additional_parameters.qos=high"]).n_targets > 0


def test_nodes_handed_to_a_recipe_or_the_engine_take_that_schemas_keys_and_only_those():
    """At scale=paper the inversion settings (steps, cuda_graph, precision) could not be changed at all, nor a schedule
    key the scale does not set (label_smoothing): '+key' was refused as a key 'reproduce never reads', yet it reads them."""
    from perceptual.pipelines._references import pair_configs
    from perceptual.pipelines.reproduce import engine_config, expand_variants, train_overrides

    cfg = check_overrides("reproduce", ["scale=paper", "+scale.measure.invert.cuda_graph=auto", "+scale.measure.invert.steps=1000",
                                        "+scale.schedule.label_smoothing=0.1", "+scale.recipe_schedule.pgd.epochs=20"])
    engine = engine_config(cfg.scale)
    assert (engine.cuda_graph, engine.steps) == ("auto", 1000)
    pgd = next(v for v in expand_variants(cfg) if v.recipe == "pgd")
    assert train_overrides(pgd, cfg.scale)["label_smoothing"] == 0.1 and train_overrides(pgd, cfg.scale)["epochs"] == 20
    for typo, close in (("+scale.measure.invert.cuda_grph=auto", "scale.measure.invert.cuda_graph"),
                        ("+scale.schedule.label_smothing=0.1", "scale.schedule.label_smoothing"),
                        ("+scale.recipe_schedule.pgd.epoch=20", "scale.recipe_schedule.pgd.epochs")):
        with pytest.raises(ConfigError, match=rf"Did you mean {close}\b"):
            check_overrides("reproduce", ["scale=paper", typo])
    with pytest.raises(ConfigError, match=r"add it with \+scale.measure.invert.steps=VALUE"):  # no + on a key the scale does not set
        check_overrides("reproduce", ["scale=paper", "scale.measure.invert.steps=1000"])
    with pytest.raises(ConfigError, match=r"add it with \+model.kwargs.width=VALUE"):
        check_overrides("train", ["model.kwargs.width=8"])
    # the demo's and the audit's schedules are nested: each key can be set (dotted YAML keys could not be addressed at all)
    demo = check_overrides("demo", ["schedule.optimizer.lr=0.1", "schedule.eval.every=1", "+schedule.label_smoothing=0.1", "+attack.step_size=0.2"])
    robust = pair_configs(demo, "unused")["robust"]
    assert (robust.train.optimizer.lr, robust.train.eval.every, robust.train.label_smoothing, robust.train.attack.step_size) == (0.1, 1, 0.1, 0.2)
    assert check_overrides("audit", ["references.schedule.optimizer.lr=0.1"]).references.schedule.optimizer.lr == 0.1
    with pytest.raises(ConfigError, match=r"'attack.stepsize'.*Did you mean attack.step_size"):
        check_overrides("demo", ["+attack.stepsize=0.1"])


def test_a_switch_takes_true_or_false_not_a_word_read_as_true():
    """Hydra reads only true/false as booleans: 'train.augment.enabled=no' trained with augmentation, 'resume=no' resumed."""
    for command, override in (("train", "train.augment.enabled=no"), ("train", "resume=no"), ("measure", "strict=off"),
                              ("stimuli_invert", "overwrite=yes")):
        with pytest.raises(ConfigError, match=rf"{override.split('=')[0]} is a switch: .*=false.*got '{override.split('=')[1]}'"):
            check_overrides(command, [override])
    with pytest.raises(ConfigError, match="resume is a switch.*got 'flase'"):  # a later sweep value too
        check_overrides("train", ["-m", "resume=true,flase"])
    # the words a switch documents, and real booleans, pass
    check_overrides("train", ["train=pgd", "train.cuda_graph=auto", "resume=true", "train.augment.enabled=false"])
    check_overrides("stimuli_invert", ["overwrite=archive", "invert.cuda_graph=auto"])


def test_a_number_key_refuses_a_word_in_every_sweep_value_before_any_job_starts():
    """'-m train.beta=1,6x' trained the first job, then stopped the second with "could not convert string to float"."""
    with pytest.raises(ConfigError, match=r"train.beta takes a number .*got '6x' \(in the sweep's jobs with train.beta=6x\)"):
        check_overrides("train", ["-m", "train=trades", "train.beta=1,6x"])
    with pytest.raises(ConfigError, match=r"train.epochs takes a number .*train.epochs=\d+, got True"):  # no fraction hint for a count
        check_overrides("train", ["train.epochs=true"])
    with pytest.raises(ConfigError, match=r"n_targets takes a number"):
        check_overrides("measure", ["n_targets=ten"])
    # fractions, inf, null, interpolations, numeric sweeps and lists of numbers are what the readers take
    check_overrides("train", ["-m", "train=pgd", "train.attack.eps=8/255,inf", "train.attack.step_size=${train.attack.eps}",
                              "train.epochs=range(1,3)", "data_limit=null"])
    check_overrides("train", ["train=pgd", "train.attack.eps=[0.5,1]"])
    with pytest.raises(ConfigError, match=r"train.attack.eps takes a number .*or a fraction like 8/255, got \[0.5, 'x'\]"):
        check_overrides("train", ["train=pgd", "train.attack.eps=[0.5,x]"])


def test_a_misspelt_device_is_refused_before_any_job_starts():
    """device=cdua reached torch.device inside the job: a 20-frame traceback that named no key, after a sweep had queued."""
    from training.config import resolve_device

    with pytest.raises(ConfigError, match=r"^device takes auto, cpu, cuda or cuda:N \(a GPU's index\), got 'cdua'$"):
        check_overrides("train", ["device=cdua"])
    with pytest.raises(ConfigError, match=r"^device takes auto, cpu, cuda or cuda:N .*got 'gpu'$"):
        check_overrides("demo", ["-m", "device=cpu,gpu"])
    check_overrides("measure", ["-m", "device=auto,cpu,cuda,cuda:1"])  # named right, whether or not this machine has them
    with pytest.raises(ValueError, match=r"device takes auto, cpu, cuda or cuda:N .*got 'cdua'"):
        resolve_device("cdua")  # the Python API says the same


def test_a_key_added_with_plus_is_refused_before_training(tmp_path):
    cfg = compose("train", ["+train.epoch=1", f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"unknown config key 'train.epoch' in the standard recipe.*Did you mean train.epochs"):
        check_train_config(cfg)
    with pytest.raises(ConfigError, match=r"'train.optimizer.learning_rate'.*Did you mean .*train.optimizer.lr\b"):
        check_train_config(compose("train", ["+train.optimizer.learning_rate=0.1"]))
    with pytest.raises(ConfigError, match=r"'epochs' in conf/train.yaml"):
        check_train_config(compose("train", ["+epochs=3"]))
    # recipe-specific keys, model kwargs and every shipped recipe's defaults are fine
    check_train_config(compose("train", ["train=fast_at", "train.guard.every_steps=5", "+model.kwargs.width=16"]))
    for recipe in ("standard", "pgd", "trades", "mart", "fast_at", "simclr", "adv_simclr"):
        check_train_config(compose("train", [f"train={recipe}"]))
    with pytest.raises(ConfigError, match="'train.guard.every_steps' in the pgd recipe"):
        check_train_config(compose("train", ["train=pgd", "+train.guard.every_steps=5"]))


def test_python_dash_m_training_refuses_a_typo_at_once(tmp_path):
    for argument in ("train.epoch=1", "+train.epoch=1"):
        done = subprocess.run([sys.executable, "-m", "training", argument, f"run_dir={tmp_path / 'run'}", "progress=false"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "Did you mean train.epochs" in done.stderr, done.stderr[-2000:]
        assert "To append to your config use" not in done.stderr
        assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained


def test_an_output_folder_option_naming_a_file_is_refused_before_any_work(tmp_path):
    """measure, compare and demo failed with "[Errno 20] Not a directory: .../exists.txt/models/a", training with
    "[Errno 17] File exists", visalign after its scoring had run."""
    from omegaconf import OmegaConf

    from training.config import expand_path_options

    existing = tmp_path / "exists.txt"
    existing.write_text("x")
    for key in ("out", "run_dir", "runs_dir", "reference_dir"):
        with pytest.raises(ValueError, match=rf"^{key}=.*exists.txt is a file: {key} names the folder the command writes into"):
            expand_path_options(OmegaConf.create({key: str(existing)}))
    assert expand_path_options(OmegaConf.create({"out": str(existing)}), folders=()).out == str(existing)  # stimuli trials: a CSV path
    assert expand_path_options(OmegaConf.create({"out": str(tmp_path / "new")})).out == str(tmp_path / "new")
    done = subprocess.run([sys.executable, "-m", "training", f"run_dir={existing}", "progress=false"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "is a file: run_dir names the folder" in done.stderr and "Traceback" not in done.stderr


def test_paths_expand_home_and_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("REPALIGN_TEST_DATA", str(tmp_path / "data"))
    assert expand_path("~/data") == tmp_path / "data"
    assert expand_path("$REPALIGN_TEST_DATA/cifar") == tmp_path / "data" / "cifar"
    assert expand_path(None) is None
    cfg = compose("train", ["data=cifar10", "data.root=$REPALIGN_TEST_DATA"])
    from training.config import dataset_from_config
    from training.data import DataNotFoundError

    with pytest.raises(DataNotFoundError, match=str(tmp_path / "data")):
        dataset_from_config(cfg.data, "test")


def test_every_commands_path_options_expand_in_place(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from training.config import expand_path_options

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("REPALIGN_TEST_SETS", str(tmp_path / "sets"))
    cfg = compose("stimuli_survey", ["sets=['~/a','$REPALIGN_TEST_SETS/b']", "out='~/package'"])
    assert OmegaConf.is_missing(compose("stimuli_trials", []), "set")
    expand_path_options(cfg)
    assert list(cfg.sets) == [str(tmp_path / "a"), str(tmp_path / "sets" / "b")] and cfg.out == str(tmp_path / "package")
    trials = expand_path_options(compose("stimuli_trials", []))  # a mandatory '???' and a null stay as they are
    assert OmegaConf.is_missing(trials, "set") and trials.out is None


def test_an_unknown_config_group_choice_is_refused_with_the_valid_choices():
    """Hydra raises these with a traceback and its search path; the pre-check names the close choice."""
    with pytest.raises(ConfigError, match=r"unknown invert config 'papr' .*Did you mean invert=paper\?.*Valid choices: default, fast, paper$"):
        check_overrides("measure", ["invert=papr"])
    with pytest.raises(ConfigError, match=r"unknown train config 'tradse'.*Did you mean train=trades\?") as info:
        check_overrides("train", ["-m", "train=tradse,pgd"])
    assert "Config search path" not in str(info.value)
    with pytest.raises(ConfigError, match=r"invert appears more than once .*choose another with invert=NAME \(no \+\)"):
        check_overrides("measure", ["+invert=fast"])
    with pytest.raises(ConfigError, match=r"cannot read the override 'invert.steps=\[1,2'") as info:
        check_overrides("measure", ["invert.steps=[1,2"])
    assert "Quote" not in str(info.value)  # a list written wrong: quoting would make it a string
    # a sweep job's folder, as the command logged it: the error says how to quote it
    with pytest.raises(ConfigError, match=r"""Quote a value that holds '=', ',', brackets or spaces, and the whole override for the shell: """
                                          r""""set='sets/mr2/n_targets=4'"$"""):
        check_overrides("stimuli_trials", ["set=sets/mr2/n_targets=4", "task=2afc"])


def test_an_added_config_group_the_command_does_not_use_is_refused():
    """'+scale=paper' to measure, '+model=resnet18' to sweep: accepted, recorded in the report, read by no code."""
    with pytest.raises(ConfigError, match=r"^\+scale=paper adds the scale config group, which conf/measure.yaml does not use, so no code "
                                          r"would read it; this command's groups are data, invert$"):
        check_overrides("measure", ["+scale=paper"])
    with pytest.raises(ConfigError, match=r"\+model=resnet18 adds the model config group.*this command's groups are none"):
        check_overrides("sweep", ["+model=resnet18"])
    with pytest.raises(ConfigError, match=r"\+train=pgd,trades adds the train config group"):
        check_overrides("measure", ["-m", "+train=pgd,trades"])
    assert check_overrides("train", ["train=pgd"]).train.name == "pgd"  # choosing a group the command uses is fine


def test_a_launcher_setting_of_the_wrong_type_says_why_and_a_missing_plugin_says_how_to_install_it(monkeypatch):
    """Hydra's reason ("could not be converted to Integer") was dropped from the one-line message; without
    hydra-submitit-launcher, slurm_gpu "could not load" and submitit_local was "not a valid choice" without a word of why."""
    import importlib.util

    from training.config import _launcher_hint

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    with pytest.raises(ConfigError, match=r"hydra.launcher.timeout_min=4h: Value '4h' of type 'str' could not be converted to Integer"):
        check_overrides("train", ["hydra/launcher=slurm_gpu", "hydra.launcher.timeout_min=4h"])
    assert _launcher_hint("In 'hydra/launcher/slurm_gpu': Could not load 'hydra/launcher/submitit_slurm'.") == ""  # installed here
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "submitit" in name else real(name, *a))
    hint = _launcher_hint("In 'hydra/launcher/slurm_gpu': Could not load 'hydra/launcher/submitit_slurm'.")
    assert hint.endswith('need hydra-submitit-launcher: pip install -e ".[slurm]"') and _launcher_hint("unknown key 'train.x'") == ""


def test_a_bad_group_choice_exits_with_one_line_and_no_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "training", "train=pdg", f"run_dir={tmp_path}"], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: unknown train config 'pdg'") and "train=pgd" in done.stderr


def test_a_key_of_a_dict_the_user_gives_where_the_config_has_null_is_added_with_a_plus():
    """measure's controversial is null in conf/measure.yaml: controversial.steps=20 after controversial={...} was refused
    with the dict's own two keys as "the valid keys", and +controversial.steps=20 as a key measure never reads."""
    given = "controversial={model_a:a,model_b:b}"
    with pytest.raises(ConfigError, match=r"^'controversial.steps' is not set .* add it with \+controversial.steps=VALUE"):
        check_overrides("measure", [given, "controversial.steps=20"])
    assert check_overrides("measure", [given, "+controversial.steps=20"]).controversial.steps == 20  # measure checks its keys


def test_concise_errors_shorten_refusals_and_leave_bugs_and_config_errors_alone():
    from hydra.errors import CompactHydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    from training.config import concise_errors

    def refuse(_):
        raise FileNotFoundError("no stimulus set at x")

    with pytest.raises(CompactHydraException, match="^error: no stimulus set at x$"):
        concise_errors(refuse)(None)
    bad = OmegaConf.create({"a": "${oc.env:REPALIGN_SURELY_UNSET}"})
    with pytest.raises(InterpolationResolutionError):  # a ValueError, but a bug: Hydra's traceback, not a doubled message
        concise_errors(lambda cfg: cfg.a)(bad)
    with pytest.raises(KeyError):
        concise_errors(lambda cfg: {}["x"])(None)


def test_a_refused_input_is_one_line_after_hydras_not_a_traceback(tmp_path):
    """A missing set, a bad value found once the config is read: the message came under some ten lines of traceback."""
    done = subprocess.run([sys.executable, "-m", "stimuli", "trials", f"set={tmp_path / 'nothere'}", "task=2afc"], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: no stimulus set at {tmp_path / 'nothere'}: the directory does not exist" in done.stderr.splitlines()


def test_a_sweeps_later_group_choices_and_dict_values_are_checked_too():
    """Only the first value was composed: the sweep's other jobs met the bad value after their queue wait."""
    with pytest.raises(ConfigError, match=r"unknown train config 'tradse'.*Did you mean train=trades\?.*in the sweep's jobs with train=tradse"):
        check_overrides("train", ["-m", "train=pgd,tradse"])
    with pytest.raises(ConfigError, match=r"'train.schedule.milestone'.*Did you mean train.schedule.milestones.*jobs with train.schedule="):
        check_overrides("train", ["-m", "train.schedule={name:step},{name:step,milestone:[5]}"])
    with pytest.raises(ConfigError, match=r"'train.beta'.*in the sweep's jobs with train=pgd"):  # TRADES' key, not PGD's
        check_overrides("train", ["-m", "train=trades,pgd", "train.beta=6"])
    assert check_overrides("train", ["-m", "train=pgd,trades", "train.epochs=1,2,3"]).train.name == "pgd"


def test_every_command_shows_the_libraries_warnings():
    """Hydra's job_logging "disabled" disables every logger that exists when the job starts: `python -m training` never
    said it had stopped after stop_after_epochs, and no command showed a library warning (a checkpoint's normalisation,
    a failed CUDA graph capture, a run another job holds)."""
    names = sorted(p.stem for p in (REPO_ROOT / "conf").glob("*.yaml"))
    assert {"train", "measure", "audit", "stimuli_invert"} <= set(names)
    for name in names:
        logging_config = compose(name, with_hydra=True).hydra.job_logging
        assert logging_config.disable_existing_loggers is False, name
        assert logging_config.root.handlers, name
    measure = compose("measure", with_hydra=True).hydra.job_logging  # warnings from every library, the trainer's notes too
    assert measure.root.level == "WARNING" and measure.loggers["training.trainer"].level == "INFO"


def test_a_glob_sweep_over_a_config_group_is_checked_like_a_list():
    """``model='glob(resnet*)'`` crashed the check with Hydra's "ConfigLoader is not set": the parser had no loader to
    read the group's options from."""
    assert check_overrides("train", ["-m", "model=glob(resnet*)"]).model.name == "resnet18"
    with pytest.raises(ConfigError, match=r"'train.beta'.*in the sweep's jobs with train=pgd"):  # every matched recipe is composed
        check_overrides("train", ["-m", "train=glob([mart,pgd])", "train.beta=6"])


def test_every_commands_help_names_the_command():
    """--help began "commands is powered by Hydra" (the module's name) for every stimuli command, "__main__" for training."""
    from conf import CONFIG_DIR

    apps = {path.stem: compose(path.stem, with_hydra=True).hydra.help.app_name for path in sorted(Path(CONFIG_DIR).glob("*.yaml"))}
    assert apps["train"] == "python -m training" and apps["stimuli_invert"] == "python -m stimuli invert"
    assert apps["measure"] == "python -m perceptual measure" and apps["config"] == "python -m training.info"
    assert all(app.startswith("python -m ") for app in apps.values()), apps


def test_every_commands_job_name_names_the_command():
    """Slurm jobs of python -m training were all named __main__ in squeue, those of every stimuli command 'commands'."""
    from conf import CONFIG_DIR

    names = {path.stem: compose(path.stem, with_hydra=True).hydra.job.name for path in sorted(Path(CONFIG_DIR).glob("*.yaml"))}
    assert names["train"] == "training" and names["stimuli_invert"] == "stimuli-invert" and names["measure"] == "perceptual-measure"
    assert len(set(names.values())) == len(names), names  # one name per command
