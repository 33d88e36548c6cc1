"""Two real processes under ``torchrun`` (gloo on the CPU): the DDP path of ``python -m training``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed

from .conftest import REPO_ROOT_FOR_CLI, TINY

# Each rank trains through the real trainer, then saves its final weights for the comparison.
DRIVER = """
import os, sys
import torch
from hydra import compose, initialize_config_dir
from conf import CONFIG_DIR
from training.trainer import train

with initialize_config_dir(str(CONFIG_DIR), version_base=None):
    cfg = compose("train", overrides=sys.argv[2:])
result = train(cfg)
state = {k: v.detach().cpu().clone() for k, v in result.model.state_dict().items()}
torch.save({"state": state, "summary": result.summary}, os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
"""


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch build has no gloo backend")
@pytest.mark.parametrize("recipe", [
    ["train=pgd", "train.attack.steps=2"],
    # The guard checks after every step in eval mode: the ranks must agree on its running statistics. Slow (10 s: two
    # processes); make test-slow runs it, the pgd case keeps two-process training in make test.
    pytest.param(["train=fast_at", "train.guard.every_steps=1", "train.guard.batch_size=32", "train.guard.steps=2"], marks=pytest.mark.slow),
], ids=["pgd", "fast_at_guard"])
def test_two_processes_stay_in_sync_and_write_one_run_directory(tmp_path, recipe):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run_dir = tmp_path / "run"
    overrides = [*TINY, *recipe, "train.epochs=2", "train.batch_size=16", f"run_dir={run_dir}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(driver), str(tmp_path),
               *overrides]
    path = os.pathsep.join(filter(None, [str(REPO_ROOT_FOR_CLI), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    done = subprocess.run(command, cwd=REPO_ROOT_FOR_CLI, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    # DDP averages the gradients and broadcasts rank 0's buffers: both ranks end with the same model.
    for key, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][key]), key
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "completed"
    history = summary["history"]
    # Each step takes 16 images per process: 128 images -> 4 steps of 32 per epoch.
    assert [h["step"] for h in history] == [4, 8]
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in history)
    # Evaluation counts are summed over the processes' shards: the same accuracy on both ranks.
    assert ranks[0]["summary"]["clean_accuracy"] == ranks[1]["summary"]["clean_accuracy"] == summary["clean_accuracy"]
    assert ranks[0]["summary"]["recipe"] == ranks[1]["summary"]["recipe"]  # e.g. the guard's history
    assert len([p for p in (run_dir / "checkpoints").iterdir()]) >= 1
    assert not any(Path(tmp_path).glob("run*/run"))  # no second run directory from rank 1


@pytest.mark.parametrize("gpus, requested, expected", [
    (1, "auto", "gloo"),   # two processes, one GPU: the CPU with gloo, and a warning
    (2, "auto", "nccl"),   # one GPU per process: NCCL on cuda:LOCAL_RANK
    (0, "auto", "gloo"),
    (2, "cpu", "gloo"),
])
def test_processes_map_to_gpus_by_local_rank_or_fall_back_to_gloo(monkeypatch, gpus, requested, expected):
    from training import trainer

    chosen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.setdefault("device", index))
    monkeypatch.setattr(trainer.torch_dist, "is_initialized", lambda: False)
    monkeypatch.setattr(trainer.torch_dist, "init_process_group", lambda backend: chosen.setdefault("backend", backend))
    dist = trainer.Distributed.from_env(requested)
    assert chosen["backend"] == expected and dist.rank == 1 and dist.world_size == 2
    if expected == "nccl":
        assert chosen["device"] == 1 and dist.device(requested) == torch.device("cuda", 1)
    else:
        assert "device" not in chosen and dist.device(requested) == torch.device("cpu")


def test_more_processes_than_gpus_with_device_cuda_is_refused_with_what_to_do(monkeypatch):
    from training import trainer
    from training.config import ConfigError

    for key, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(trainer.torch_dist, "init_process_group", lambda backend: pytest.fail("must refuse before joining a group"))
    with pytest.raises(ConfigError, match=r"2 processes on this machine but 1 GPU.*--nproc_per_node=1.*device=cpu"):
        trainer.Distributed.from_env("cuda")
