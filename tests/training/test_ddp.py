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
    # The guard checks after every step in eval mode: the ranks must agree on its running statistics.
    ["train=fast_at", "train.guard.every_steps=1", "train.guard.batch_size=32", "train.guard.steps=2"],
], ids=["pgd", "fast_at_guard"])
def test_two_processes_stay_in_sync_and_write_one_run_directory(tmp_path, recipe):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run_dir = tmp_path / "run"
    overrides = [*TINY, *recipe, "train.epochs=2", "train.batch_size=16", f"run_dir={run_dir}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(driver), str(tmp_path),
               *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT_FOR_CLI)}
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
