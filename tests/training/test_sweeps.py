"""Hydra multiruns: every job of a sweep writes to a folder of its own (training.sweeps), through the
basic launcher and through hydra-submitit-launcher's local launcher; the Slurm preset composes."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from stimuli import load_set
from training.sweeps import is_job_of, job_name, job_path, swept_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
HAS_SUBMITIT = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
needs_submitit = pytest.mark.skipif(not HAS_SUBMITIT, reason="hydra-submitit-launcher is not installed (the `slurm` extra)")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_job_name_keeps_what_a_job_makes_and_drops_where_it_runs():
    overrides = ["train=trades", "train.beta=3", "out=/r", "resume=true", "device=cuda", "shard=1", "n_shards=4"]
    assert job_name(overrides) == "train.beta=3,train=trades"
    # a data folder decides what a job makes: a sweep over two gave both jobs one folder (and with resume=true the
    # second reused the model trained on the first folder's data)
    assert job_name(["data.root=/data/a"]) != job_name(["data.root=/data/b"])
    # groups: only the choice is left out, not the keys below it
    assert job_name(["experiment=table1", "experiment.gaussian_targets=false"], groups=["experiment"]) == "experiment.gaussian_targets=false"
    assert job_name(["shard=0", "n_shards=2", "out=sets/x"]) == ""
    assert job_name(["+extra.key=1", "~train.guard"]) == "+extra.key=1,~train.guard"
    # a value with a path separator stays one folder
    assert "/" not in job_name(["train.attack.eps=8/255"]) and job_name(["train.attack.eps=8/255"]) != job_name(["train.attack.eps=8-255"])


def test_swept_keys_are_the_ones_a_sweep_varies():
    arguments = ["train=trades", "train.beta=1,3,6", "shard=range(4)", "model@model_a=vgg16,resnet18", "seed=0", "data.root=/d"]
    assert swept_keys(arguments) == {"train.beta", "shard", "model@model_a"}


def test_job_name_cuts_long_names_but_keeps_them_apart():
    long_a = [f"model.kwargs.k{i}={i}" for i in range(40)]
    long_b = long_a[:-1] + ["model.kwargs.k39=40"]
    name_a, name_b = job_name(long_a), job_name(long_b)
    assert len(name_a.encode()) <= 200 and len(name_b.encode()) <= 200 and name_a != name_b


def test_job_path_is_the_configured_place_outside_a_multirun(tmp_path):
    assert job_path(tmp_path / "runs") == tmp_path / "runs"


def _as_multirun_job(monkeypatch, sweep_dir: Path, job_overrides: list[str]) -> None:
    """``job_path`` called as from a multirun job with ``job_overrides`` (Hydra's HydraConfig stood in for)."""
    from hydra.types import RunMode

    import training.sweeps as sweeps

    hydra_cfg = OmegaConf.create({"mode": RunMode.MULTIRUN.name, "sweep": {"dir": str(sweep_dir)}, "runtime": {"cwd": str(sweep_dir)},
                                  "overrides": {"task": job_overrides}})
    hydra_cfg.mode = RunMode.MULTIRUN
    monkeypatch.setattr(sweeps, "HydraConfig", type("Running", (), {"initialized": staticmethod(lambda: True), "get": staticmethod(lambda: hydra_cfg)}))


def _write_multirun_yaml(sweep_dir: Path, arguments: list[str]) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": arguments}, "sweeper": {"params": None}}}), sweep_dir / "multirun.yaml")


def test_a_job_whose_multirun_yaml_is_another_sweeps_is_named_after_all_its_overrides(tmp_path, caplog, monkeypatch):
    """Two sweeps started in the same second share Hydra's multirun/<date>/<time> folder, and the later one's
    multirun.yaml named the earlier one's jobs after the later one's swept keys: train.beta=1,3 with train.epochs=5 read
    as a sweep over epochs put both of its jobs in train.epochs=5."""
    sweep_dir = tmp_path / "multirun" / "12-00-00"
    _write_multirun_yaml(sweep_dir, ["train.beta=1,3", "train.epochs=5"])
    _as_multirun_job(monkeypatch, sweep_dir, ["train.beta=3", "train.epochs=5"])
    assert job_path(tmp_path / "runs") == tmp_path / "runs" / "train.beta=3"  # its own sweep: the swept key alone
    _write_multirun_yaml(sweep_dir, ["train.beta=1", "train.epochs=5,10"])  # the other sweep, started in the same second
    with caplog.at_level("WARNING", logger="training.sweeps"):
        assert job_path(tmp_path / "runs") == tmp_path / "runs" / "train.beta=3,train.epochs=5"
    assert "multirun.yaml is another sweep's" in caplog.text


def test_a_sweep_over_where_jobs_run_alone_warns_that_they_share_one_folder(tmp_path, caplog, monkeypatch):
    """measure -m device=cpu,auto wrote both jobs' reports to one out, the second over the first, without a word; a sweep over
    shards shares its out on purpose (merge joins the shards) and says nothing."""
    sweep_dir = tmp_path / "multirun" / "12-00-00"
    for arguments, job, warned in ((["device=cpu,auto"], ["device=cpu"], True), (["shard=0,1", "n_shards=2"], ["shard=0", "n_shards=2"], False),
                                   (["device=cpu,auto", "seed=0,1"], ["device=cpu", "seed=1"], False)):
        caplog.clear()
        _write_multirun_yaml(sweep_dir, arguments)
        _as_multirun_job(monkeypatch, sweep_dir, job)
        with caplog.at_level("WARNING", logger="training.sweeps"):
            job_path(tmp_path / "out")
        assert ("every job of this sweep writes to" in caplog.text) is warned, (arguments, caplog.text)


def test_a_job_belongs_to_a_sweep_when_it_has_its_keys_and_one_of_its_values_for_each():
    arguments = ["train=trades", "train.beta=1,3,6", "shard=range(2)", "train.attack.eps=8/255,16/255", "+x=[1,2]", "model=glob(res*)"]
    assert is_job_of(["train=trades", "train.beta=6", "shard=1", "train.attack.eps=16/255", "+x=[1,2]", "model=resnet18"], arguments)
    assert not is_job_of(["train=trades", "train.beta=2", "shard=1", "train.attack.eps=16/255", "+x=[1,2]", "model=resnet18"], arguments)
    assert not is_job_of(["train=pgd", "train.beta=6", "shard=1", "train.attack.eps=16/255", "+x=[1,2]", "model=resnet18"], arguments)
    assert not is_job_of(["train=trades", "train.beta=6", "shard=1", "train.attack.eps=16/255", "+x=[1,2]"], arguments)  # a key fewer


@pytest.mark.slow  # the sweep summary's command-line test runs the same two-job training sweep in make test
def test_training_sweep_gives_each_job_its_own_run(tmp_path):
    runs = tmp_path / "runs"
    common = ["train.epochs=1", "train.batch_size=32", "data_limit.train=64", "data_limit.test=32", "train.eval.every=0",
              "train.eval.final_subset=16", "train.eval.attack.steps=1", "progress=false", f"run_dir={runs}"]
    run("training", "-m", *common, "train.optimizer.lr=0.05,0.1", cwd=tmp_path)
    folders = sorted(p.name for p in runs.iterdir())
    assert folders == ["train.optimizer.lr=0.05", "train.optimizer.lr=0.1"]  # named after the swept key only
    for folder in folders:
        summary = json.loads((runs / folder / "summary.json").read_text())
        assert summary["status"] == "completed"
    configs = [(runs / folder / "config.yaml").read_text() for folder in folders]
    assert "lr: 0.05" in configs[0] and "lr: 0.1" in configs[1]


@pytest.mark.slow  # 15 s: two submitit processes, each importing torch (make test-slow runs it)
@needs_submitit
def test_sharded_inversion_through_submitit_local_jobs_then_merge(tmp_path):
    out = tmp_path / "set"
    run("stimuli", "invert", "-m", "hydra/launcher=submitit_local", "shard=0,1", "n_shards=2", f"out={out}", "n_targets=3",
        "chunk_size=2", "invert.steps=2", "invert.progress=false", cwd=tmp_path)
    assert sorted(p.name for p in (out / "shards").iterdir() if p.is_dir()) == ["shard-000-of-002", "shard-001-of-002"]  # and their locks
    assert list(tmp_path.glob("multirun/*/*/.submitit/*/*_log.out"))  # the jobs ran as submitit processes
    run("stimuli", "merge", f"out={out}", cwd=tmp_path)
    merged = load_set(out)
    assert merged.shard is None and len(merged.role("target")[0]) == 3


def test_reproduce_sweeps_keep_their_bookkeeping_apart_and_their_results_where_the_readme_says():
    """reproduce's sweep dir was '.': every sweep from one folder shared ./multirun.yaml, from which each job reads the
    swept keys that name its folder, so a second sweep started meanwhile renamed the first one's jobs onto its own."""
    from perceptual.pipelines.reproduce import groups_in_out

    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="reproduce", return_hydra_config=True)
        explicit = compose(config_name="reproduce", overrides=["out=reports/mine"])
    sweep = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)
    assert sweep["dir"].startswith("multirun/") and sweep["subdir"] != "."
    # the default out names the preset, the scale and the data set: a sweep over them needs no extra level
    assert groups_in_out(cfg) == ("experiment", "scale", "data") and groups_in_out(explicit) == ()


def test_a_training_sweep_over_a_group_its_run_dir_names_adds_no_level_named_after_it():
    """train=standard,pgd wrote runs/digits-small_cnn-standard/train=standard and runs/digits-small_cnn-pgd/train=pgd;
    the default run_dir names data, model and train already, so the jobs write apart without that level."""
    from training.sweeps import groups_in_template, job_name

    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="train")
        explicit = compose(config_name="train", overrides=["run_dir=runs/recipes"])
    groups = groups_in_template(cfg, "run_dir", ("data", "model", "train"))
    assert groups == ("data", "model", "train") and groups_in_template(explicit, "run_dir", ("data", "model", "train")) == ()
    assert job_name(["train=pgd", "seed=1"], groups=groups) == "seed=1" and job_name(["train=pgd"], groups=groups) == ""
    assert job_name(["train=pgd"], groups=()) == "train=pgd"  # an explicit run_dir=runs/recipes: runs/recipes/train=pgd


def test_a_requeued_slurm_job_resumes_its_run(monkeypatch):
    """submitit requeues a job that reaches its time limit with the same command line: without resume=true the training
    refused the folder its first run had written (the README's Slurm line has no resume=true)."""
    from training.__main__ import requeued

    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert not requeued()
    for value, expected in (("0", False), ("1", True), ("3", True), ("", False)):
        monkeypatch.setenv("SLURM_RESTART_COUNT", value)
        assert requeued() is expected


def test_the_same_training_command_run_again_as_a_requeued_job_continues(make_config, tmp_path):
    from training.run import RunDirectoryError
    from training.trainer import train

    from .conftest import TINY

    overrides = ["train.epochs=2", "train.eval.every=0", "train.eval.final_subset=16"]
    train(make_config(*overrides, "stop_after_epochs=1"))  # the job's first run, stopped by its time limit
    with pytest.raises(RunDirectoryError, match="already holds a run"):
        train(make_config(*overrides))  # by hand, the same command is refused without resume=true
    requeued = subprocess.run([sys.executable, "-m", "training", *TINY, *overrides, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env={**ENV, "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert "requeued Slurm job" in requeued.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2


@needs_submitit
def test_slurm_preset_asks_for_one_gpu_per_job():
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm_gpu", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.partition) == (1, 1, "gpu")
