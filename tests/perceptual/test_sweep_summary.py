"""``python -m perceptual sweep``: the jobs of a sweep in one table, the swept keys found from the jobs' configs."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from perceptual.sweep_summary import choose_x, collect_sweep, find_jobs, flatten_config, numeric_value, write_sweep_summary
from training.config import compose

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def python_m(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def write_training_job(folder: Path, lr, clean: float, status: str = "completed") -> None:
    """A training run's two files, as the trainer writes them (only the keys the summary reads)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"run_dir: {folder}\ndevice: cpu\nseed: 0\ntrain:\n  name: standard\n  optimizer:\n    lr: {lr}\n")
    (folder / "summary.json").write_text(json.dumps({"status": status, "model": "small_cnn", "epochs_completed": 1, "clean_accuracy": clean,
                                                     "robust_accuracy": None, "train_seconds": 1.0, "images_per_second": 10.0}))


def test_a_training_sweep_from_the_command_line_becomes_one_table_and_figure(tmp_path):
    runs = tmp_path / "runs"
    common = ["train.epochs=1", "train.batch_size=32", "data_limit.train=64", "data_limit.test=32", "train.eval.every=0",
              "train.eval.final_subset=16", "train.eval.attack.steps=1", "progress=false", f"run_dir={runs}"]
    python_m("training", "-m", *common, "train.optimizer.lr=0.1,0.05", cwd=tmp_path)
    printed = python_m("perceptual", "sweep", f"root={runs}", cwd=tmp_path).stdout
    assert "## training (2 jobs)" in printed and "`train.optimizer.lr`" in printed
    table = pd.read_csv(runs / "sweep_training.csv")
    assert list(table["train.optimizer.lr"]) == [0.05, 0.1]  # the one swept key; sorted as numbers
    for _, row in table.iterrows():
        summary = json.loads((runs / row["job"] / "summary.json").read_text())
        assert row["clean_accuracy"] == pytest.approx(summary["clean_accuracy"]) and row["status"] == "completed"
    saved = json.loads((runs / "sweep.json").read_text())
    assert saved["kinds"]["training"]["swept"] == ["train.optimizer.lr"]
    assert (runs / "sweep_training.png").stat().st_size > 0 and "![training sweep](sweep_training.png)" in (runs / "sweep.md").read_text()


def test_measure_jobs_are_read_per_model_and_an_audits_inner_report_is_not_a_job(tmp_path):
    from perceptual.pipelines.measure import run
    from training.checkpoints import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    checkpoint = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "m.safetensors")
    root = tmp_path / "sweep"
    for steps in (4, 2):
        run(compose("measure", [
            f"out='{root / f'invert.steps={steps}'}'", f"models=[{{name:small_cnn,checkpoint:'{checkpoint}',label:tiny,kwargs:{{width:8}}}}]",
            "observers=[pixel-l2]", "n_targets=3", "tasks=[2afc]", "threat=null", "accuracy_limit=8", "device=cpu",
            f"invert.steps={steps}", "invert.progress=false",
        ]))
    # an audit writes a measure report into its alignment/ folder: that report is part of the audit, not a job
    (root / "invert.steps=2" / "alignment").mkdir()
    (root / "invert.steps=2" / "alignment" / "report.json").write_text((root / "invert.steps=2" / "report.json").read_text())
    # another command's report.json (humans-mvh) is not a measure result
    (root / "humans").mkdir()
    (root / "humans" / "report.json").write_text(json.dumps({"experiments": []}))

    tables = write_sweep_summary(root)
    assert list(tables) == ["measure"]
    table = tables["measure"]
    assert table.swept == ["invert.steps"]  # out differs too, but says where a job ran, not what it made
    assert list(table.frame["job"]) == ["invert.steps=2", "invert.steps=4"] and list(table.frame["model"]) == ["tiny", "tiny"]
    for _, row in table.frame.iterrows():
        report = json.loads((root / row["job"] / "report.json").read_text())["models"]["tiny"]
        assert row["2afc"] == pytest.approx(report["2afc"]["mean"]) and row["clean_accuracy"] == pytest.approx(report["clean_accuracy"])
        assert row["converged_fraction"] == pytest.approx(report["convergence"]["converged_fraction"])
    markdown = (root / "sweep.md").read_text()
    assert "| Job | invert.steps | Model | Observer 2AFC (%) |" in markdown and "| invert.steps=2 | 2 | tiny |" in markdown


def test_swept_values_sort_as_numbers_and_jobs_without_a_config_are_named(tmp_path, caplog):
    for lr in (10, 2, "8/255"):
        write_training_job(tmp_path / f"lr={lr}".replace("/", "%2F"), lr, clean=0.5)
    (tmp_path / "by-hand").mkdir()
    (tmp_path / "by-hand" / "summary.json").write_text(json.dumps({"status": "stopped", "epochs_completed": 0, "clean_accuracy": 0.1}))
    with caplog.at_level(logging.WARNING, logger="perceptual.sweep_summary"):
        table = collect_sweep(tmp_path)["training"]
    assert table.swept == ["train.optimizer.lr"]  # run_dir and device differ or not: they never count
    assert [numeric_value(v) for v in table.frame["train.optimizer.lr"]] == [pytest.approx(8 / 255), 2.0, 10.0, None]
    assert table.without_config == ["by-hand"] and "by-hand" in caplog.text


def test_flatten_config_and_numeric_values():
    assert flatten_config({"train": {"beta": 3, "attack": {"eps": "8/255"}}, "tasks": ["2afc", "clustering"], "kwargs": {}}) == {
        "train.beta": 3, "train.attack.eps": "8/255", "tasks": '["2afc","clustering"]', "kwargs": "{}"}
    assert numeric_value("8/255") == pytest.approx(8 / 255) and numeric_value("0.5") == 0.5 and numeric_value(np.int64(3)) == 3.0
    for not_a_number in (True, np.bool_(False), None, "pgd", "[1,2]", float("nan"), "1/0"):
        assert numeric_value(not_a_number) is None


def test_refusals_name_the_folder_and_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        collect_sweep(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no finished job below .*report.json \(measure\), summary.json \(training\)"):
        collect_sweep(tmp_path)
    write_training_job(tmp_path / "a", 0.1, 0.5)
    write_training_job(tmp_path / "b", 0.2, 0.6)
    with pytest.raises(ValueError, match=r"x='train.beta' is not a swept key; swept: training: \['train.optimizer.lr'\]"):
        write_sweep_summary(tmp_path, x="train.beta")
    assert not (tmp_path / "sweep.md").exists()  # refused before anything was written
    (tmp_path / "b" / "summary.json").write_text('{"status": "compl')
    with pytest.raises(ValueError, match=r"b/summary.json is not valid JSON"):
        find_jobs(tmp_path)


def test_a_categorical_swept_key_is_plotted_by_position(tmp_path):
    for name, clean in (("sgd", 0.4), ("adam", 0.6)):
        folder = tmp_path / name
        write_training_job(folder, 0.1, clean)
        (folder / "config.yaml").write_text(f"train:\n  optimizer:\n    name: {name}\n")
    tables = write_sweep_summary(tmp_path)
    assert tables["training"].swept == ["train.optimizer.name"] and list(tables["training"].frame["train.optimizer.name"]) == ["adam", "sgd"]
    assert (tmp_path / "sweep_training.png").is_file()


def test_a_job_without_a_value_of_the_swept_key_is_tabled_not_plotted(tmp_path):
    """A job that saved no config (or lacks a key the others have) has no value to plot: the figure shows the others."""
    for lr, clean in ((0.05, 0.5), (0.1, 0.6)):
        write_training_job(tmp_path / f"lr={lr}", lr, clean=clean)
    (tmp_path / "by-hand").mkdir()
    (tmp_path / "by-hand" / "summary.json").write_text(json.dumps({"status": "completed", "model": "small_cnn", "epochs_completed": 1,
                                                                    "clean_accuracy": 0.7}))
    tables = write_sweep_summary(tmp_path)
    assert len(tables["training"].frame) == 3 and (tmp_path / "sweep_training.png").stat().st_size > 1000
    assert "| by-hand | – |" in (tmp_path / "sweep.md").read_text()


def test_a_plain_run_where_the_sweep_wrote_its_jobs_does_not_hide_them(tmp_path):
    """`python -m training ... train=trades` writes runs/<data>-<model>-trades, and its multirun writes jobs below that
    same folder: both kinds of run are jobs, while an audit's inner measure report stays part of the audit."""
    write_training_job(tmp_path / "train.beta=1", 1, clean=0.8)
    write_training_job(tmp_path / "train.beta=6", 6, clean=0.7)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "model": "small_cnn", "epochs_completed": 1, "clean_accuracy": 0.75}))
    jobs = sorted(folder.relative_to(tmp_path).as_posix() for folder, _, _ in find_jobs(tmp_path))
    assert jobs == [".", "train.beta=1", "train.beta=6"]


def test_a_new_summary_removes_the_files_of_kinds_it_no_longer_finds(tmp_path):
    write_training_job(tmp_path / "a", 0.1, clean=0.5)
    write_training_job(tmp_path / "b", 0.2, clean=0.6)
    (tmp_path / "sweep_audit.csv").write_text("job\nold\n")  # an earlier summary's, of an audit job since removed
    (tmp_path / "sweep_measure.png").write_bytes(b"old")
    write_sweep_summary(tmp_path, figures=False)
    assert sorted(p.name for p in tmp_path.glob("sweep*")) == ["sweep.json", "sweep.md", "sweep_training.csv"]


def test_a_diverged_or_interrupted_run_is_tabled_with_its_status_not_dropped(tmp_path):
    """The trainer's summary of a run that diverged or was interrupted has no accuracies: the job stays in the table."""
    write_training_job(tmp_path / "train.optimizer.lr=0.1", 0.1, clean=0.8)
    for lr, status, stopped in ((1.0, "diverged", "non-finite training loss (nan) in epoch 3"), (0.5, "interrupted", None)):
        folder = tmp_path / f"train.optimizer.lr={lr}"
        write_training_job(folder, lr, clean=0.0, status=status)
        (folder / "summary.json").write_text(json.dumps({"status": status, "model": "small_cnn", "epochs_completed": 3, "stopped": stopped}))
    frame = write_sweep_summary(tmp_path)["training"].frame
    assert list(frame["status"]) == ["completed", "interrupted", "diverged"] and frame["clean_accuracy"].isna().tolist() == [False, True, True]
    markdown = (tmp_path / "sweep.md").read_text()
    assert "## training (3 jobs)" in markdown
    assert ("> Not finished, so without a final result: train.optimizer.lr=0.5 (interrupted); "
            "train.optimizer.lr=1.0 (diverged: non-finite training loss (nan) in epoch 3).") in markdown


def _job_with_config(folder: Path, config: str, clean: float) -> None:
    write_training_job(folder, 0.1, clean)
    (folder / "config.yaml").write_text(config)


def test_the_figure_is_drawn_against_the_key_the_jobs_were_swept_over(tmp_path):
    # a hyper-parameter over seeds: against the hyper-parameter, a line per seed (`seed` sorts first)
    for beta in (1, 3, 6):
        for seed in (0, 1):
            _job_with_config(tmp_path / "a" / f"seed={seed},train.beta={beta}", f"seed: {seed}\ntrain:\n  beta: {beta}\n", 0.5)
    table = collect_sweep(tmp_path / "a")["training"]
    assert table.swept == ["seed", "train.beta"] and choose_x(table) == "train.beta"
    # a config-group sweep changes more keys than its choice; the standard run has no attack, yet is plotted
    for name, attack in (("standard", ""), ("pgd", "  attack:\n    eps: 1.0\n"), ("trades", "  attack:\n    eps: 0.031\n")):
        _job_with_config(tmp_path / "b" / f"train={name}", f"train:\n  name: {name}\n  epochs: {3 if name == 'pgd' else 2}\n{attack}", 0.5)
    table = collect_sweep(tmp_path / "b")["training"]
    assert table.swept == ["train.attack.eps", "train.epochs", "train.name"] and choose_x(table) == "train.name"
    # folders named by hand: every job with a value first, then numbers before names
    for name, lr in (("one", 0.1), ("two", 0.2)):
        _job_with_config(tmp_path / "c" / name, f"tag: {name}\nlr: {lr}\n" + ("extra: 1\n" if name == "one" else ""), 0.5)
    assert choose_x(collect_sweep(tmp_path / "c")["training"]) == "lr"


def test_swept_values_are_printed_and_saved_exactly_enough_to_tell_jobs_apart(tmp_path):
    """A float column (one job lacks the key) keeps whole numbers whole, and sweep.json keeps small values."""
    for seed, decay in ((12344, 1e-12), (12345, 3e-11)):
        _job_with_config(tmp_path / f"seed={seed}", f"seed: {seed}\ndecay: {decay}\n", 0.5)
    (tmp_path / "by-hand").mkdir()
    (tmp_path / "by-hand" / "summary.json").write_text(json.dumps({"status": "completed", "model": "small_cnn", "epochs_completed": 1, "clean_accuracy": 0.7}))
    write_sweep_summary(tmp_path)
    markdown = (tmp_path / "sweep.md").read_text()
    assert "| seed=12344 | 1e-12 | 12344 |" in markdown and "| seed=12345 | 3e-11 | 12345 |" in markdown
    rows = json.loads((tmp_path / "sweep.json").read_text())["kinds"]["training"]["rows"]
    assert sorted(r["decay"] for r in rows if r["decay"] is not None) == [1e-12, 3e-11]


def test_a_result_of_another_kind_inside_a_job_is_named_not_dropped_in_silence(tmp_path, caplog):
    """A measure report written inside a training job's folder is read as part of that job (as an audit's alignment/
    report is); the summary used to leave it out without a word."""
    write_training_job(tmp_path / "lr=0.1", 0.1, clean=0.5)
    write_training_job(tmp_path / "lr=0.2", 0.2, clean=0.6)
    inner = tmp_path / "lr=0.1" / "measure"
    inner.mkdir()
    (inner / "report.json").write_text(json.dumps({"models": {"tiny": {"2afc": {"mean": 0.5}}}, "observers": ["pixel-l2"], "n_targets": 3}))
    (tmp_path / "lr=0.2" / "notes").mkdir()
    (tmp_path / "lr=0.2" / "notes" / "report.json").write_text(json.dumps({"experiments": []}))  # not a measure report: nothing to say
    with caplog.at_level(logging.WARNING, logger="perceptual.sweep_summary"):
        jobs = find_jobs(tmp_path)
    assert [folder.name for folder, _, _ in jobs] == ["lr=0.1", "lr=0.2"]
    assert f"{inner / 'report.json'} (a measure result) lies inside the job {tmp_path / 'lr=0.1'}" in caplog.text
    assert f"root={inner}" in caplog.text and "notes" not in caplog.text


def test_a_job_that_crashed_before_its_result_is_listed_not_dropped(tmp_path, caplog):
    """A run killed by the out-of-memory killer or Slurm leaves its config, metrics and checkpoints but no summary.json:
    the summary left it out without a word ("the jobs' configs do not differ"), and the swept key with it."""
    root = tmp_path / "sweep"
    write_training_job(root / "train.optimizer.lr=0.1", 0.1, 0.8)
    crashed = root / "train.optimizer.lr=0.05"
    crashed.mkdir(parents=True)
    (crashed / "config.yaml").write_text(f"run_dir: {crashed}\ndevice: cpu\nseed: 0\ntrain:\n  name: standard\n  optimizer:\n    lr: 0.05\n")
    (crashed / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (crashed / "checkpoints" / "epoch-0001").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        tables = write_sweep_summary(root, figures=False)
    table = tables["training"]
    assert table.swept == ["train.optimizer.lr"] and list(table.frame["job"]) == ["train.optimizer.lr=0.05", "train.optimizer.lr=0.1"]
    assert table.frame.set_index("job").loc["train.optimizer.lr=0.05", "status"].startswith("no result (running, or stopped by a crash")
    assert "1 job(s) below" in caplog.text and "train.optimizer.lr=0.05" in caplog.text
    summary = (root / "sweep.md").read_text()
    assert "## training (2 jobs)" in summary and "Not finished, so without a final result: train.optimizer.lr=0.05 (no result" in summary
    # a finished job's own checkpoints and metrics are not a second job
    write_training_job(root / "train.optimizer.lr=0.2", 0.2, 0.7)
    (root / "train.optimizer.lr=0.2" / "metrics.jsonl").write_text('{"epoch": 1}\n')
    assert len(collect_sweep(root)["training"].frame) == 3
