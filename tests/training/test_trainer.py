"""The trainer: run directory, resume = uninterrupted run, refusals with clear messages, CLI, DDP, CIFAR."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from training.checkpoints import read_checkpoint
from training.data import load_dataset
from training.models import build_model
from training.optim import ConfigError
from training.recipes import build_recipe
from training.run import RunDirectory, RunDirectoryError
from training.trainer import Distributed, _epoch_batches, train

from ..conftest import finished_job_logs, start_two_waiting_jobs
from .conftest import REPO_ROOT_FOR_CLI, compose_train

QUICK = ["train.epochs=2", "train.schedule.name=cosine", "train.eval.attack.steps=2", "train.attack.steps=2"]


def weights_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_resume_gives_the_same_result_as_an_uninterrupted_run(make_config):
    whole = train(make_config("train=pgd", *QUICK, run="whole"))
    first = train(make_config("train=pgd", *QUICK, "stop_after_epochs=1", run="split"))
    assert not first.completed and first.summary["status"] == "interrupted" and first.summary["epochs_completed"] == 1
    assert not first.model.training and not whole.model.training  # as build_model returns a model: BN uses its running statistics
    run = RunDirectory(first.run_dir)
    assert not run.model_path.exists() and run.latest().epoch == 1
    # a crash after logging epoch 2 but before its checkpoint leaves a line the resume must drop
    run.log_metrics({"epoch": 2, "train_loss": -1.0})
    resumed = train(make_config("train=pgd", *QUICK, "resume=true", run="split"))
    assert resumed.completed
    assert weights_equal(whole.model, resumed.model)
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2]
    assert run.read_metrics()[1]["train_loss"] == pytest.approx(whole.summary["history"][1]["train_loss"])
    assert resumed.summary["clean_accuracy"] == whole.summary["clean_accuracy"]
    assert resumed.summary["robust_accuracy"] == whole.summary["robust_accuracy"]


def test_run_directory_holds_config_metrics_checkpoints_model_and_summary(make_config):
    result = train(make_config("train=standard", "train.epochs=3", "keep_checkpoints=2", "train.eval.masking.enabled=true",
                               "train.eval.masking.limit=16", "train.eval.masking.steps=2", "train.eval.masking.unbounded_steps=10"))
    run = RunDirectory(result.run_dir)
    assert "name: standard" in run.config_path.read_text()
    metrics = run.read_metrics()
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert {"train_loss", "train_acc", "lr", "images_per_second", "test_clean_acc", "test_robust_acc"} <= metrics[0].keys()
    assert sorted(p.name for p in run.checkpoint_dir.glob("epoch_*")) == ["epoch_0002", "epoch_0003"]
    ref = run.latest()
    state = torch.load(ref.state, weights_only=True)
    assert state["epoch"] == 3 and {"optimizer", "scheduler", "rng"} <= state.keys()
    _, metadata = read_checkpoint(ref.weights)
    assert metadata["epoch"] == "3" and metadata["recipe"] == "standard"
    summary = json.loads(run.summary_path.read_text())
    assert summary["status"] == "completed" and summary["images_per_second"] > 0 and summary["train_seconds"] > 0
    assert summary["robust_attack"]["norm"] == "l2" and 0 <= summary["robust_accuracy"] <= summary["clean_accuracy"] + 1e-9
    masking = summary["gradient_masking"]
    assert masking["n"] == 16 and masking["norm"] == "l2" and set(masking["checks"]) >= {"unbounded_attack_succeeds"}
    reloaded = build_model("small_cnn", "digits", width=16, checkpoint=str(run.model_path))
    assert weights_equal(reloaded, result.model.cpu())


def test_an_existing_run_is_not_overwritten_and_a_changed_config_is_not_resumed(make_config):
    train(make_config("train=pgd", *QUICK, "stop_after_epochs=1"))
    with pytest.raises(RunDirectoryError, match="resume=true"):
        train(make_config("train=pgd", *QUICK))
    with pytest.raises(RunDirectoryError, match=r"train.attack.eps: 1.0 -> 0.5"):
        train(make_config("train=pgd", *QUICK, "train.attack.eps=0.5", "resume=true"))
    # evaluation settings may change between calls
    done = train(make_config("train=pgd", *QUICK, "train.eval.subset=16", "resume=true"))
    assert done.summary["epochs_completed"] == 2


def test_a_completed_run_without_its_checkpoints_is_reused_not_trained_over(make_config):
    """Removing checkpoints/ to free disk made the next identical command train from scratch and replace the model."""
    first = train(make_config("train=pgd", *QUICK))
    run = RunDirectory(first.run_dir)
    shutil.rmtree(run.checkpoint_dir)
    model_bytes, summary_text = run.model_path.read_bytes(), run.summary_path.read_text()
    with pytest.raises(RunDirectoryError, match=r"already holds a completed run .*checkpoints/ were removed.*resume=true to reuse it"):
        train(make_config("train=pgd", *QUICK))
    reused = train(make_config("train=pgd", *QUICK, "resume=true"))
    assert reused.completed and weights_equal(reused.model, first.model)
    assert run.model_path.read_bytes() == model_bytes and run.summary_path.read_text() == summary_text
    with pytest.raises(RunDirectoryError, match=r"train.epochs: 2 -> 3"):  # no optimizer state to go on from
        train(make_config("train=pgd", *QUICK, "train.epochs=3", "resume=true"))
    run.config_path.unlink()  # nothing to compare the config with: still no training on from fresh weights
    with pytest.raises(RunDirectoryError, match=r"completed 2 epochs .*cannot be continued to train.epochs=3"):
        train(make_config("train=pgd", *QUICK, "train.epochs=3", "resume=true"))


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        (["train.name=free_at"], ConfigError, "unknown training recipe 'free_at'"),
        (["train.precision=fp16"], ConfigError, "unknown precision 'fp16'"),
        (["train.batch_size=512"], ConfigError, "exceeds the 128 training images"),
        (["train.eval.attack.norm=l1"], ValueError, "unknown norm 'l1'"),
        (["train.optimizer.name=adam"], ConfigError, "unknown optimizer 'adam'"),
        (["train.epochs=0"], ConfigError, r"train.epochs must be a whole number >= 1, got 0"),
        (["train.epochs=2.5"], ConfigError, r"train.epochs must be a whole number >= 1, got 2.5"),  # trained 2 and reported 2
        (["train.batch_size=32.9"], ConfigError, r"train.batch_size must be a whole number >= 1, got 32.9"),
        (["keep_checkpoints=-1"], ConfigError, r"keep_checkpoints must be a whole number >= 0 \(0 = all\), got -1"),
        (["save_every=0"], ConfigError, r"save_every must be a whole number >= 1 epochs, got 0"),
        (["data_limit.train=0.5"], ConfigError, r"data_limit.train must be a whole number >= 1 images \(or null for all\), got 0.5"),
        # refused only after both ImageNet folders (a million files) were walked, or asking for a train folder first
        (["data=imagenet", "data.root=/nonexistent"], ConfigError, r"training needs an in-memory data set \(cifar10, cifar100, digits\), got 'imagenet'"),
        # used only after every epoch, or read as another count (0 epochs before stopping trained one)
        (["train.eval.batch_size=0"], ConfigError, r"train.eval.batch_size must be a whole number >= 1 \(or null for the default\), got 0"),
        (["train.eval.final_restarts=0"], ConfigError, "train.eval.final_restarts must be a whole number >= 1"),
        (["stop_after_epochs=0"], ConfigError, "stop_after_epochs must be a whole number >= 1"),
        # a count of test images: 0.5 measured the final robust accuracy on one image, -1 dropped it, 'all' crashed after training
        (["train.eval.final_subset=0.5"], ConfigError, r"train.eval.final_subset must be a whole number >= 0 test images \(0 = none, null = all\)"),
        (["train.eval.subset=-5"], ConfigError, "train.eval.subset must be a whole number >= 0"),
        # int(0.5) turned per-epoch evaluation off; the masking report's limit and a bare milestone failed after training or bare
        (["train.eval.every=0.5"], ConfigError, r"train.eval.every must be a whole number >= 0 epochs \(0 = no per-epoch evaluation\), got 0.5"),
        (["train.eval.masking.enabled=true", "train.eval.masking.limit=0"], ConfigError,
         r"train.eval.masking.limit must be a whole number >= 1 test images \(or null for all\), got 0"),
        (["train.schedule.milestones=50"], ConfigError, r"schedule.milestones must be a list of epochs \(train.schedule.milestones=\[100,150\]\), got 50"),
        (["train=simclr", "train.probe.lr=0"], ValueError, r"linear probe needs .*lr > 0.*got 100, 0.0, 256.*\(train.probe\)"),
        (["train=adv_simclr", "train.batch_size=1"], ConfigError, "gives SimCLR no negatives"),  # the loss is 0: nothing learnt
    ],
)
def test_bad_settings_fail_before_training_with_clear_messages(make_config, overrides, error, message, tmp_path):
    recipe = [] if any(o.startswith("train=") for o in overrides) else ["train=standard"]
    with pytest.raises(error, match=message):
        train(make_config(*recipe, *overrides))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # not one epoch ran


def test_a_diverged_run_stops_and_keeps_no_weights_that_are_not_numbers(make_config):
    """lr 1e30: the loss was NaN from the first epoch, every epoch still ran and the NaN model was saved as completed."""
    from training.trainer import TrainingDiverged

    with pytest.raises(TrainingDiverged, match=r"non-finite training loss \(nan\) in epoch 1; no checkpoint was written .*train.optimizer.lr"):
        train(make_config("train=standard", "train.epochs=3", "train.optimizer.lr=1e30"))
    run = RunDirectory(make_config().run_dir)
    assert [m["epoch"] for m in run.read_metrics()] == [1] and run.latest() is None and not run.model_path.exists()
    assert json.loads(run.summary_path.read_text())["status"] == "diverged"


def test_a_diverged_run_names_the_checkpoint_it_kept_not_the_last_finished_epoch(make_config, monkeypatch):
    """save_every=2 and a NaN loss in epoch 4: the message said epoch 3 was kept, which was never written."""
    from training import trainer
    from training.trainer import TrainingDiverged

    real_epoch = trainer._train_epoch

    def nan_from_epoch_4(*args, **kwargs):
        record = real_epoch(*args, **kwargs)
        return {**record, "train_loss": float("nan")} if kwargs["epoch"] == 3 else record

    monkeypatch.setattr(trainer, "_train_epoch", nan_from_epoch_4)
    with pytest.raises(TrainingDiverged, match=r"in epoch 4; the checkpoint of epoch 2 is kept"):
        train(make_config("train=standard", "train.epochs=5", "save_every=2", "train.eval.every=0"))
    assert RunDirectory(make_config().run_dir).latest().epoch == 2


def test_weights_broken_by_an_epochs_last_update_are_not_evaluated_or_kept(make_config, monkeypatch):
    """The loss of a step comes before its update: a last update that made the weights NaN left the epoch's mean loss
    finite, and the NaN model was evaluated and checkpointed as the epoch that "is kept"."""
    from training import trainer
    from training.trainer import TrainingDiverged

    real_epoch = trainer._train_epoch

    def nan_weights_in_epoch_2(recipe, *args, **kwargs):
        record = real_epoch(recipe, *args, **kwargs)
        if kwargs["epoch"] == 1:
            with torch.no_grad():
                next(recipe.parameters()).fill_(float("nan"))
        return record

    monkeypatch.setattr(trainer, "_train_epoch", nan_weights_in_epoch_2)
    with pytest.raises(TrainingDiverged, match=r"non-finite weights after epoch 2 \(its mean loss .* was finite\); the checkpoint of epoch 1 is kept"):
        train(make_config("train=standard", "train.epochs=3", "train.eval.every=0"))
    run = RunDirectory(make_config().run_dir)
    assert run.latest().epoch == 1 and [m["epoch"] for m in run.read_metrics()] == [1, 2]


def test_a_run_resumes_only_on_the_data_and_processes_it_started_with(make_config, tmp_path):
    """The scheduler resumes at a step count: on fewer images (same data.root) the resumed epoch trained at lr 0."""
    from .test_data import write_cifar10_folder

    write_cifar10_folder(tmp_path / "data", per_batch=16)
    cifar = ["data=cifar10", f"data.root={tmp_path / 'data'}", "train.batch_size=16",
             "train.eval.every=0", "train.eval.final_subset=0", "train.epochs=2"]
    first = train(make_config("train=standard", *cifar, "stop_after_epochs=1"))
    assert torch.load(RunDirectory(first.run_dir).latest().state, weights_only=True)["layout"] == {
        "train_images": 80, "processes": 1, "steps_per_epoch": 5}
    import shutil

    shutil.rmtree(tmp_path / "data")
    write_cifar10_folder(tmp_path / "data", per_batch=8)  # the folder re-extracted with fewer images
    with pytest.raises(RunDirectoryError, match=r"another data layout \(train_images 80 then, 40 now; steps_per_epoch 5 then, 2 now\)"
                                                r".*same training data .* on 1 process"):
        train(make_config("train=standard", *cifar, "resume=true"))


def test_a_damaged_latest_checkpoint_names_the_earlier_one_kept_beside_it(make_config):
    first = train(make_config("train=standard", "train.epochs=3", "train.eval.every=0", "stop_after_epochs=2"))
    run = RunDirectory(first.run_dir)
    pointer = run.latest_path.read_text()
    run.latest_path.write_text(pointer[:10])  # its advice was to delete it and start from scratch, with both checkpoints intact
    with pytest.raises(RunDirectoryError, match=r"latest.json is unreadable .*; the checkpoint of epoch 2 is kept: resume from it by writing "
                                                r"'\{\"epoch\": 2, \"path\": \"epoch_0002\"\}' to .*latest.json"):
        train(make_config("train=standard", "train.epochs=3", "train.eval.every=0", "resume=true"))
    run.latest_path.write_text(pointer)
    orphan = run.checkpoint_dir / "epoch_0002" / ".state.pt.x1y2z3.tmp"  # a SIGKILL inside the checkpoint's write skips every cleanup
    orphan.write_bytes(b"half a checkpoint")
    latest = run.latest()
    latest.state.write_bytes(latest.state.read_bytes()[:100])  # a partial copy of the run folder
    with pytest.raises(RunDirectoryError, match=r"cannot read training state .*epoch 1 is kept beside it: resume from it by writing "
                                                r"'\{\"epoch\": 1, \"path\": \"epoch_0001\"\}' to .*latest.json"):
        train(make_config("train=standard", "train.epochs=3", "train.eval.every=0", "resume=true"))
    (run.checkpoint_dir / "latest.json").write_text('{"epoch": 1, "path": "epoch_0001"}')  # as the message says
    assert train(make_config("train=standard", "train.epochs=3", "train.eval.every=0", "resume=true")).summary["epochs_completed"] == 3
    assert not orphan.exists()


def test_the_logged_rate_is_the_one_the_epoch_trained_at(make_config):
    """With lr / 10 at (0-based) epochs 1 and 2, epoch 1 trains at 0.1; it was logged with epoch 2's 0.01."""
    result = train(make_config("train=standard", "train.epochs=3", "train.schedule.milestones=[1,2]", "train.eval.every=0"))
    assert [h["lr"] for h in result.summary["history"]] == pytest.approx([0.1, 0.01, 0.001])


def test_epoch_batches_split_one_permutation_between_processes():
    device = torch.device("cpu")
    ranks = [_epoch_batches(100, 8, Distributed(rank=r, world_size=2), seed=0, epoch=3, device=device) for r in (0, 1)]
    assert ranks[0].shape == (6, 8)
    together = torch.cat([ranks[0].flatten(), ranks[1].flatten()])
    assert together.unique().numel() == 96  # disjoint, 96 of the 100 images (the remainder is dropped)
    assert torch.equal(_epoch_batches(100, 8, Distributed(), 0, 3, device), _epoch_batches(100, 8, Distributed(), 0, 3, device))
    assert not torch.equal(_epoch_batches(100, 8, Distributed(), 0, 3, device), _epoch_batches(100, 8, Distributed(), 0, 4, device))


def test_recipe_under_ddp_gives_the_same_gradients(tmp_path):
    """TRADES (two forward passes and an attack inside one DDP forward) in a one-process gloo group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        data = load_dataset("digits", "train").subset(torch.arange(8))
        grads = []
        for wrap in (False, True):
            torch.manual_seed(0)
            model = build_model("small_cnn", "digits", width=8)
            recipe = build_recipe(compose_train("train=trades", "train.attack.steps=2").train, model, data).train()
            forward = DistributedDataParallel(recipe) if wrap else recipe
            torch.manual_seed(1)
            loss, _ = forward(data.float_images(), data.labels)
            loss.backward()
            grads.append(model.net.features[0].weight.grad.clone())
        assert torch.allclose(grads[0], grads[1], atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_cli_trains_and_writes_a_summary(tmp_path):
    run_dir = tmp_path / "cli"
    command = [sys.executable, "-m", "training", "train.epochs=2", "train.batch_size=32", "data_limit.train=64",
               "data_limit.test=32", "train.eval.attack.steps=2", f"run_dir={run_dir}", "progress=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command + ["stop_after_epochs=1"], cwd=REPO_ROOT_FOR_CLI, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "INFO training.trainer: stopped after 1 epoch(s) as asked (stop_after_epochs); continue with resume=true" in first.stderr
    done = subprocess.run(command + ["resume=true"], cwd=REPO_ROOT_FOR_CLI, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming {run_dir} after epoch 1" in done.stderr
    assert "clean accuracy" in done.stdout and "images/s" in done.stdout and done.stdout.count("clean accuracy") == 1
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_trains_on_the_real_cifar_subset(make_config, cifar_mini_root):
    result = train(make_config("data=cifar10", f"data.root={cifar_mini_root}", "train=standard", "train.epochs=1"))
    assert result.summary["dataset"] == "cifar10" and result.model.num_classes == 10
    assert result.summary["history"][0]["train_loss"] > 0


def test_bf16_autocast_and_nchw_layout_run(make_config):
    result = train(make_config("train=fast_at", "train.epochs=1", "train.precision=bf16", "train.channels_last=false",
                               "train.guard.batch_size=16", "train.eval.every=0", "train.eval.final_subset=16"))
    assert result.summary["precision"] == "bf16" and result.summary["channels_last"] is False
    assert all(p.dtype == torch.float32 for p in result.model.parameters())  # autocast keeps fp32 master weights
    assert result.summary["robust_accuracy"] is not None


def test_bf16_pgd_attacks_the_folded_model(make_config):
    """bf16 autocast around the folded eval view (its fp32 folded weights are cast like any convolution's)."""
    result = train(make_config("train=pgd", "train.epochs=1", "train.attack.steps=2", "train.precision=bf16",
                               "train.eval.every=0", "train.eval.final_subset=16"))
    assert result.summary["recipe"]["fold_bn"] is True
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in result.summary["history"])


@pytest.mark.slow
def test_compiled_training_matches_the_eager_loss_closely(make_config):
    """torch.compile of the model (minutes on a CPU: inductor compiles C++ kernels)."""
    eager = train(make_config("train=pgd", "train.epochs=1", "train.attack.steps=1", "train.eval.final_subset=0", run="eager"))
    compiled = train(make_config("train=pgd", "train.epochs=1", "train.attack.steps=1", "train.eval.final_subset=0",
                                 "train.compile=true", run="compiled"))
    assert compiled.summary["compile"] is True
    assert compiled.summary["history"][0]["train_loss"] == pytest.approx(eager.summary["history"][0]["train_loss"], rel=1e-3)


def test_one_process_at_a_time_trains_in_a_run_directory(tmp_path):
    """Two jobs of a sweep needing the same model (reproduce's Table 1 and Fig. 6) both trained it in one folder:
    each epoch was appended to the metrics twice and each job resumed from the other's checkpoints. The second
    now waits for the first and reuses its finished run."""
    import fcntl

    run_dir = tmp_path / "shared-run"
    holder = RunDirectory(run_dir)
    with holder.held():
        with pytest.raises(RunDirectoryError, match=r"being trained by another process \(pid \d+ on .* since"):
            with RunDirectory(run_dir).held(wait=False):
                pass
        # Two sweep jobs start while the folder is held: both wait, then one trains and the other reuses its run.
        command = [sys.executable, "-m", "training", "model=small_cnn", "+model.kwargs.width=8", "data=digits", "train=standard",
                   "train.epochs=2", "train.batch_size=32", "data_limit.train=64", "data_limit.test=32", f"run_dir={run_dir}",
                   "resume=true", "progress=false"]
        logs = [tmp_path / f"job{k}.log" for k in range(2)]
        jobs = start_two_waiting_jobs(command, logs, "waiting for it", cwd=REPO_ROOT_FOR_CLI)
    texts = finished_job_logs(jobs, logs)
    assert sum("is complete: its model and summary are reused" in text for text in texts) == 1
    run = RunDirectory(run_dir)
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2]
    assert json.loads(run.summary_path.read_text())["status"] == "completed"
    with open(run_dir / ".lock") as handle:  # released: a job that is killed releases it too (flock ends with the process)
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_failing_masking_report_does_not_cost_the_trained_model(make_config, tmp_path, monkeypatch):
    import training.trainer as trainer

    def broken(*args, **kwargs):
        raise RuntimeError("report failed")

    monkeypatch.setattr(trainer, "gradient_masking_report", broken)
    with pytest.raises(RuntimeError, match="report failed"):
        train(make_config("train=standard", "train.epochs=1", "train.eval.masking.enabled=true", "train.eval.masking.limit=4"))
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_a_reused_run_says_when_its_evaluation_settings_differ(make_config, caplog):
    """train.eval may change on resume; a finished run returns its saved accuracies, so it must say whose they are."""
    first = train(make_config("train=standard", "train.epochs=1", "train.eval.subset=8"))
    with caplog.at_level("WARNING", logger="training.trainer"):
        again = train(make_config("train=standard", "train.epochs=1", "train.eval.subset=8", "resume=true"))
    assert "other train.eval settings" not in caplog.text and again.summary == first.summary
    with caplog.at_level("WARNING", logger="training.trainer"):
        other = train(make_config("train=standard", "train.epochs=1", "train.eval.subset=16", "resume=true"))
    assert "was evaluated with other train.eval settings than these" in caplog.text and other.summary == first.summary


def test_the_masking_report_settings_are_read_before_the_first_epoch(make_config, tmp_path):
    """train.eval.masking.eps=[4/255,8/255] or a scalar crashed after the last epoch, before the model was saved."""
    masking = ["train.eval.masking.enabled=true", "train.eval.masking.limit=16", "train.eval.masking.steps=2",
               "train.eval.masking.unbounded_steps=5", "train.eval.masking.norm=linf"]
    result = train(make_config("train=standard", "train.epochs=1", *masking, "train.eval.masking.eps=[4/255,8/255]", run="fractions"))
    assert result.summary["gradient_masking"]["eps"] == pytest.approx([4 / 255, 8 / 255])
    scalar = train(make_config("train=standard", "train.epochs=1", *masking, "train.eval.masking.eps=0.03", run="scalar"))
    assert scalar.summary["gradient_masking"]["eps"] == pytest.approx([0.03])
    for bad, message in (("[4/255,eight]", "fraction like 8/255"), ("[0.1,-0.2]", "positive numbers"), ("[]", "positive numbers")):
        with pytest.raises(ConfigError, match=message):
            train(make_config("train=standard", "train.epochs=1", *masking, f"train.eval.masking.eps={bad}", run="bad"))
        assert not (tmp_path / "bad").exists()


def test_an_interrupted_command_says_which_checkpoint_is_kept_and_how_to_continue(make_config, monkeypatch, caplog):
    """Ctrl-C printed some forty lines of KeyboardInterrupt traceback ending inside torch, and no word on the run."""
    import training.__main__ as command

    cfg = make_config("train=standard", "train.epochs=2", "train.eval.every=0")

    def interrupted(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "train", interrupted)
    with caplog.at_level("ERROR", logger="training"), pytest.raises(SystemExit) as stop:
        command.train_or_say_how_to_resume(cfg)
    assert stop.value.code == 130 and "interrupted: no epoch had finished" in caplog.text
    monkeypatch.setattr(command, "train", train)
    train(make_config("train=standard", "train.epochs=2", "train.eval.every=0", "stop_after_epochs=1"))
    monkeypatch.setattr(command, "train", lambda _: (_ for _ in ()).throw(SystemExit(143)))  # SIGTERM, as exit_on_sigterm raises it
    with caplog.at_level("ERROR", logger="training"), pytest.raises(SystemExit) as stop:
        command.train_or_say_how_to_resume(cfg)
    assert stop.value.code == 143
    assert f"interrupted: its checkpoint of epoch 1 is kept in {cfg.run_dir}; run the same command with resume=true to continue" in caplog.text
