"""Atomic writes: published files follow the umask, whatever the writer does with its temporary file; checkpoint folders."""
from __future__ import annotations

import os
import stat

import pytest
import torch

from training.checkpoints import save_checkpoint
from training.io import atomic_directory, atomic_save, atomic_write_json
from training.models import build_model
from training.run import RunDirectory


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_published_files_follow_the_umask_even_when_the_writer_replaces_its_file(tmp_path, umask_022):
    def replacing_writer(tmp):  # as safetensors' save_file does: a file of its own moved over the given one
        other = tmp_path / "writer-own.tmp"
        other.write_bytes(b"weights")
        os.chmod(other, 0o600)
        os.replace(other, tmp)

    assert _mode(atomic_save(tmp_path / "a.bin", replacing_writer)) == 0o644
    assert _mode(atomic_write_json(tmp_path / "a.json", {"x": 1})) == 0o644
    assert _mode(save_checkpoint(build_model("small_cnn", "digits", width=4), tmp_path / "m.safetensors")) == 0o644
    assert _mode(atomic_save(tmp_path / "m.pt", lambda tmp: torch.save({"w": torch.zeros(1)}, tmp))) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.json", "m.pt", "m.safetensors"]  # no temporaries left


def test_a_directory_is_published_whole_with_the_umask_or_not_at_all(tmp_path, umask_022):
    target = tmp_path / "package"
    with atomic_directory(target) as staging:
        (staging / "page.html").write_text("one")
    assert _mode(target) == 0o755 and (target / "page.html").read_text() == "one"  # not mkdtemp's 0700
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "page.html").write_text("half")
        raise RuntimeError("interrupted")
    assert (target / "page.html").read_text() == "one"
    with atomic_directory(target) as staging:
        (staging / "new.html").write_text("two")
    assert sorted(p.name for p in target.iterdir()) == ["new.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]  # no staging or old copy left


def test_checkpoints_are_kept_and_found_by_epoch_number_past_9999(tmp_path):
    """Folders are epoch_%04d: by name epoch_10000 sorts before epoch_9999, so pruning deleted each new checkpoint and kept
    9998 and 9999 for ever, and the way back from a damaged checkpoint pointed at 9999."""
    run, model = RunDirectory(tmp_path / "run"), build_model("small_cnn", "digits", width=4)
    for epoch in (9998, 9999, 10000, 10001, 10002):
        latest = run.save_checkpoint(epoch, model, {"epoch": epoch}, keep=2)
    assert sorted(p.name for p in run.checkpoint_dir.glob("epoch_*")) == ["epoch_10001", "epoch_10002"]
    assert run.latest() == latest and run.earlier_checkpoint(latest).epoch == 10001


@pytest.mark.parametrize("handled", [True, False])
def test_a_terminated_command_removes_its_staging_folder_as_ctrl_c_does(tmp_path, handled):
    """`timeout`, `kill` and Slurm's scancel send SIGTERM, whose default skips every finally block: a killed survey
    build left its hidden staging folder beside the package for good."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, signal, time
        from training.io import atomic_directory, exit_on_sigterm
        if {handled}:
            exit_on_sigterm()
        with atomic_directory({str(tmp_path / "package")!r}) as staging:
            (staging / "half.json").write_text("{{}}")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    left = sorted(p.name for p in tmp_path.iterdir())
    if handled:
        assert done.returncode == 143 and left == [], (done.returncode, left, done.stderr)  # 128 + SIGTERM, as before
    else:  # what Python does by default: why the entry points install the handler
        assert done.returncode == -15 and len(left) == 1 and left[0].startswith(".package.")


def test_metrics_lines_lost_to_a_partial_write_are_written_back_from_the_checkpoints_history(tmp_path, caplog):
    """A cut line ends the readable part of metrics.jsonl: a resume kept epochs [1] and went on to log 4, so the file
    said [1, 4] while the summary's history said [1, 2, 3, 4]."""
    run = RunDirectory(tmp_path / "run")
    for epoch in (1, 2, 3):
        run.log_metrics({"epoch": epoch, "train_loss": float(epoch), "stopped": None})
    first, second, third = run.metrics_path.read_text().splitlines(keepends=True)
    run.metrics_path.write_text(first + second[:10] + "\n" + third)
    history = [{"epoch": epoch, "train_loss": float(epoch)} for epoch in (1, 2, 3)]
    with caplog.at_level("WARNING", logger="training"):
        run.truncate_metrics(3, history)
    assert run.read_metrics() == [{"epoch": 1, "train_loss": 1.0, "stopped": None}, history[1], history[2]]
    assert "had lost the records of epochs [2, 3]" in caplog.text
    run.truncate_metrics(2, history)  # a resume after epoch 2: later lines go, as before
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2]
