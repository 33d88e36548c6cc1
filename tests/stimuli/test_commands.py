"""The Hydra commands (python -m stimuli invert | controversial | trials | merge) on small_cnn and
the embedded digits, with few engine steps."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from stimuli import load_set
from stimuli.__main__ import main, translate
from stimuli.commands import controversial_command, invert_command, merge_command, trials_command, trials_file_name

from ..conftest import finished_job_logs, start_two_waiting_jobs

FAST = ["invert.steps=2", "invert.log_every=1", "invert.progress=false"]


def config(name: str, overrides: list[str]):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name=name, overrides=overrides)


def test_paper_defaults_are_the_composed_defaults():
    cfg = config("stimuli_invert", [])
    assert cfg.n_targets == 100 and list(cfg.seeds) == ["noise", "train"] and not cfg.shared_noise
    assert cfg.invert.steps == 5000 and cfg.invert.stepper == "l2" and cfg.model.name == "small_cnn"
    cfg = config("stimuli_controversial", translate(["model_a=resnet18", "model_b=vgg16", "lambda_=0.5"]))
    assert (cfg.model_a.name, cfg.model_b.name, cfg.lambda_) == ("resnet18", "vgg16", 0.5)
    assert list(cfg.directions) == ["AB", "BA"]


def test_model_alias_only_rewrites_the_choice_of_model():
    assert translate(["model_a=vgg16", "model_b.checkpoint=b.pt", "model=x", "model_ab=y"]) == [
        "model@model_a=vgg16", "model_b.checkpoint=b.pt", "model=x", "model_ab=y",
    ]


@pytest.fixture(scope="module")
def sharded_and_whole(tmp_path_factory):
    """small_cnn on digits: an unsharded set and the same run in 2 shards, merged."""
    root = tmp_path_factory.mktemp("commands")
    common = FAST + ["n_targets=3", "chunk_size=2", "seeds=[noise,train]"]
    whole = invert_command(config("stimuli_invert", common + [f"out={root / 'whole'}"]))
    for shard in range(2):
        invert_command(config("stimuli_invert", common + [f"out={root / 'sharded'}", f"shard={shard}", "n_shards=2"]))
    merged = merge_command(config("stimuli_merge", [f"out={root / 'sharded'}"]))
    return whole, merged


def test_invert_command_writes_the_set_with_its_config(sharded_and_whole):
    whole, _ = sharded_and_whole
    assert whole.kind == "inversion" and len(whole) == 3 + 6 + 6
    assert whole.config["model"]["name"] == "small_cnn" and whole.config["invert"]["steps"] == 2
    assert "out" not in whole.config and "shard" not in whole.config
    results = whole.role("result")[0]
    assert set(results["model"]) == {"small_cnn"} and set(results["layer"]) == {"features"}
    assert (whole.path / "preview.png").is_file()


def test_merge_command_equals_the_unsharded_command(sharded_and_whole):
    whole, merged = sharded_and_whole
    for name in ("manifest.json", "tensors.safetensors"):
        assert (merged.path / name).read_bytes() == (whole.path / name).read_bytes()
    assert sorted(p.name for p in (merged.path / "shards").iterdir() if p.is_dir()) == ["shard-000-of-002", "shard-001-of-002"]


def test_trials_command_refuses_a_bad_seed_a_folder_and_a_file_it_did_not_write(sharded_and_whole, tmp_path):
    """seed=1.5 reached numpy as a traceback; out=FOLDER failed naming a temporary file; out=notes.txt was replaced."""
    whole, _ = sharded_and_whole
    with pytest.raises(ValueError, match=r"seed must be a whole number >= 0, got 1.5"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", "seed=1.5"]))
    with pytest.raises(ValueError, match=r"out=.* is a folder: out names the trial table's CSV file"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", f"out={tmp_path}"]))
    notes = tmp_path / "notes.txt"
    notes.write_text("months of work")
    with pytest.raises(FileExistsError, match=r"exists and is not a trial table"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", f"out={notes}"]))
    assert notes.read_text() == "months of work"
    table = tmp_path / "t.csv"
    trials_command(config("stimuli_trials", [f"set={whole.path}", f"out={table}"]))
    trials_command(config("stimuli_trials", [f"set={whole.path}", f"out={table}", "seed=1"]))  # its own table is replaced


@pytest.mark.parametrize("task", ["2afc", "clustering", "clustering_hard"])
def test_trials_command_writes_a_csv_table(sharded_and_whole, task):
    whole, _ = sharded_and_whole
    out, table = trials_command(config("stimuli_trials", [f"set={whole.path}", f"task={task}", "attention_rate=0.25"]))
    assert out == whole.path / "trials" / f"{task}-seed0-attention0.25.csv"
    written = pd.read_csv(out)
    assert len(written) == len(table) and set(written["task"]) == {task}
    per_trial = table.drop_duplicates("trial")
    assert per_trial["attention_check"].sum() == round(0.25 * (len(per_trial) - per_trial["attention_check"].sum()) / 0.75)


def test_trials_tables_with_other_settings_do_not_overwrite_each_other(sharded_and_whole):
    whole, _ = sharded_and_whole
    written = {
        trials_command(config("stimuli_trials", [f"set={whole.path}", *overrides]))[0].name: overrides
        for overrides in (
            ["task=2afc"], ["task=2afc", "attention_rate=0.1"], ["task=clustering", "n_trials=2"], ["task=clustering"],
            ["task=clustering_hard", "distance=stimuli.distances:pixel_l2_distances"], ["task=clustering_hard"],
        )
    }
    assert sorted(written) == sorted([
        "2afc-seed0.csv", "2afc-seed0-attention0.1.csv", "clustering-seed0-n2.csv", "clustering-seed0.csv",
        "clustering_hard-seed0-stimuli.distances.pixel_l2_distances.csv", "clustering_hard-seed0.csv",
    ])
    assert pd.read_csv(whole.path / "trials" / "clustering-seed0-n2.csv")["trial"].nunique() == 2


def test_trials_file_names_tell_apart_distances_that_share_a_file_or_function_name(tmp_path):
    """Two labs' similarity.csv, or two modules' lpips, gave one file name: the second table replaced the first."""
    names = {}
    for lab, value in (("lab-a", "1.0,0.2\n0.2,1.0\n"), ("lab-b", "1.0,0.7\n0.7,1.0\n"), ("lab-c", "1.0,0.2\n0.2,1.0\n")):
        (tmp_path / lab).mkdir()
        (tmp_path / lab / "sim ratings.csv").write_text(value)
        names[lab] = trials_file_name(config("stimuli_trials", ["set=x", "task=clustering_hard", f"distance=human:{tmp_path / lab / 'sim ratings.csv'}"]))
    assert names["lab-a"].startswith("clustering_hard-seed0-human-sim-ratings-") and names["lab-a"].endswith(".csv")
    assert names["lab-a"] != names["lab-b"] and names["lab-a"] == names["lab-c"]  # by content: the same matrix, the same table
    functions = [trials_file_name(config("stimuli_trials", ["set=x", "task=clustering_hard", f"distance={module}:lpips"]))
                 for module in ("mypkg.dist", "otherpkg.dist")]
    assert functions == ["clustering_hard-seed0-mypkg.dist.lpips.csv", "clustering_hard-seed0-otherpkg.dist.lpips.csv"]


def test_paths_expand_home_and_variables_before_any_work(sharded_and_whole, tmp_path, monkeypatch):
    """out='~/x' made a folder named '~' in the working directory, and a home-relative similarity matrix was read but
    left out of the table's name, so two labs' tables shared one file."""
    whole, _ = sharded_and_whole
    home = tmp_path / "home"
    (home / "sets").mkdir(parents=True)
    (home / "sets" / "whole").symlink_to(whole.path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TABLES", str(tmp_path / "tables"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["stimuli"])
    main(["trials", "set='~/sets/whole'", "task=2afc", "out='$TABLES/2afc.csv'"])
    assert (tmp_path / "tables" / "2afc.csv").is_file() and not (tmp_path / "~").exists() and not (tmp_path / "$TABLES").exists()
    for lab, value in (("lab-a", "1.0,0.2\n0.2,1.0\n"), ("lab-b", "1.0,0.7\n0.7,1.0\n")):
        (home / lab).mkdir()
        (home / lab / "sim.csv").write_text(value)
    names = {lab: trials_file_name(config("stimuli_trials", ["set=x", "task=clustering_hard", f"distance='human:~/{lab}/sim.csv'"]))
             for lab in ("lab-a", "lab-b")}
    assert names["lab-a"] != names["lab-b"] and names["lab-a"].startswith("clustering_hard-seed0-human-sim-")


def test_trials_command_refuses_n_trials_for_2afc(sharded_and_whole):
    whole, _ = sharded_and_whole
    with pytest.raises(ValueError, match="n_trials=5 applies to the clustering tasks: 2afc makes one trial per result"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", "task=2afc", "n_trials=5"]))
    with pytest.raises(ValueError, match="n_trials must be a whole number >= 1"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", "task=clustering", "n_trials=0"]))


def test_trials_command_takes_a_distance_function_by_import_path(sharded_and_whole, tmp_path):
    whole, _ = sharded_and_whole
    cfg = config("stimuli_trials", [f"set={whole.path}", "task=clustering_hard", "distance=stimuli.distances:pixel_l2_distances", f"out={tmp_path / 't.csv'}"])
    assert trials_command(cfg)[0] == tmp_path / "t.csv"
    with pytest.raises(ValueError, match="cannot import the distance"):
        trials_command(config("stimuli_trials", [f"set={whole.path}", "task=clustering_hard", "distance=nowhere:thing"]))


def test_controversial_command_ood_origins(tmp_path):
    cfg = config("stimuli_controversial", FAST + translate([
        "model_b=small_cnn", "origins=gaussian", "n_origins=2", "restarts=1", f"out={tmp_path / 'c'}",
    ]))
    s = controversial_command(cfg)
    assert s.kind == "controversial" and len(s.role("result")[0]) == 4
    assert list(s.role("origin")[0]["source"]) == ["gaussian:dark", "gaussian:light"]


def test_controversial_origins_are_refused_under_their_own_names(tmp_path):
    """n_origins=0 was refused as "n_targets", origins=foo as "unknown targets 'foo'"."""
    base = FAST + translate(["model_b=small_cnn", "restarts=1", f"out={tmp_path / 'c'}"])
    with pytest.raises(ValueError, match=r"n_origins must be a whole number >= 1, got 0"):
        controversial_command(config("stimuli_controversial", base + ["n_origins=0"]))
    with pytest.raises(ValueError, match=r"use 1 <= n_origins <= 450"):
        controversial_command(config("stimuli_controversial", base + ["n_origins=451"]))
    with pytest.raises(ValueError, match=r"origins must be data or gaussian, got 'foo'"):
        controversial_command(config("stimuli_controversial", base + ["origins=foo"]))


def test_a_misspelt_alias_choice_is_answered_in_the_alias():
    """``model_a=resnt18`` suggested ``model=resnet18``, which the controversial command refuses."""
    from training.config import ConfigError, check_overrides

    with pytest.raises(ConfigError, match=r"Did you mean model_a=resnet18\b"):
        check_overrides("stimuli_controversial", translate(["model_a=resnt18", "model_b=vgg16"]))


def test_help_lists_the_commands(capsys):
    main([])
    out = capsys.readouterr().out
    assert "python -m stimuli invert" in out and "commands: invert, controversial, trials, merge" in out
    with pytest.raises(SystemExit, match="unknown command 'frobnicate'"):
        main(["frobnicate"])


def test_python_dash_m_stimuli_end_to_end(tmp_path):
    out = tmp_path / "cli"
    run = subprocess.run(
        [sys.executable, "-m", "stimuli", "controversial", "model_a=small_cnn", "model_b=small_cnn", "n_origins=2",
         "restarts=1", "lambda_=0.2", "preview=false", *FAST, f"out={out}"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "controversial set at" in run.stdout + run.stderr
    s = load_set(out)
    assert s.config["lambda_"] == 0.2 and set(s.role("result")[0]["direction"]) == {"AB", "BA"}


def test_two_jobs_asking_for_one_set_make_it_once(tmp_path):
    """reproduce's presets share their measurements, so two jobs of a sweep could make one set in one folder at once:
    both ran every chunk, and one job's write_set removed the manifest the other was about to read. The second job now
    waits for the first and reuses its set."""
    from stimuli.generate import set_lock_file
    from training.io import exclusive_lock

    out = tmp_path / "shared-set"
    command = [sys.executable, "-m", "stimuli", "invert", "model=small_cnn", "n_targets=1", "seeds=[noise]", "preview=false", *FAST, f"out={out}"]
    logs = [tmp_path / f"job{k}.log" for k in range(2)]
    with exclusive_lock(set_lock_file(out), what=str(out), activity="held by the test"):
        jobs = start_two_waiting_jobs(command, logs, "is being made by another process")
    texts = finished_job_logs(jobs, logs)
    assert sum("chunk 1/1 done" in text for text in texts) == 1
    assert sum("already holds this set: nothing to do" in text for text in texts) == 1
    assert len(load_set(out).role("result")[0]) == 1


def test_command_errors_are_reported_with_their_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stimuli"])
    with pytest.raises(SystemExit) as exit_info:
        main(["trials", f"set={tmp_path / 'nothing'}"])
    assert exit_info.value.code != 0
    assert "no stimulus set at" in capsys.readouterr().err


def test_invert_command_on_the_real_cifar_subset(cifar_mini_root, tmp_path):
    cfg = config("stimuli_invert", FAST + [
        "data=cifar10", f"data.root={cifar_mini_root}", "n_targets=2", "seeds=[train,black]", "preview=false", f"out={tmp_path / 'cifar'}",
    ])
    s = invert_command(cfg)
    targets, seeds = s.role("target")[0], s.role("seed")[0]
    assert list(targets["source"]) == ["cifar10", "cifar10"] and targets["class_name"].notna().all()
    train_seeds = seeds[seeds.seed_type == "train"]
    assert list(train_seeds["source_split"]) == ["train", "train"] and train_seeds["class_name"].notna().all()
    assert s.images.shape[1:] == (3, 32, 32)
