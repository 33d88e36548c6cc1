"""``python -m training model=NAME data=NAME train=RECIPE [key=value ...]``: train a model.

Recipes (``train=``): standard, pgd, trades, mart, fast_at, simclr, adv_simclr. Examples::

    python -m training                                        # small CNN on the embedded digits
    python -m training model=resnet18 data=cifar10 data.root=$HOME/data train=pgd
    python -m training model=resnet18 data=cifar10 train=trades train.attack.norm=l2 train.attack.eps=0.5
    python -m training ... run_dir=runs/x resume=true         # continue an interrupted run
    torchrun --nproc_per_node=4 -m training model=resnet50 data=cifar10 train=pgd   # DDP
    python -m training -m train=trades train.beta=1,3,6       # a sweep: run_dir/<overrides>/ per job

Writes ``run_dir`` (config, metrics.jsonl, checkpoints, model.safetensors, summary.json); see
``training.trainer`` and ``training.run``.
"""
from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from .config import concise_errors, expand_path_options, run_checked
from .io import exit_on_sigterm
from .run import RunDirectory, RunDirectoryError
from .sweeps import groups_in_template, job_path
from .trainer import format_summary, train

logger = logging.getLogger("training")


def requeued() -> bool:
    """Whether this process is a Slurm job started again after a requeue (submitit requeues a job that reaches its time
    limit, with the same command line): Slurm counts the restarts in ``SLURM_RESTART_COUNT``."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False


def train_or_say_how_to_resume(cfg: DictConfig):
    """:func:`training.trainer.train`; stopped by Ctrl-C or SIGTERM (``timeout``, ``scancel``), the run's checkpoints are
    intact: say so and how to go on, in one line instead of a traceback from somewhere inside torch, and exit with
    the signal's status (130, 143)."""
    try:
        return train(cfg)
    except (KeyboardInterrupt, SystemExit) as stop:
        status = 130 if isinstance(stop, KeyboardInterrupt) else stop.code
        if status not in (130, 143):
            raise
        try:
            latest = RunDirectory(cfg.run_dir).latest()
        except RunDirectoryError:
            latest = None
        kept = f"its checkpoint of epoch {latest.epoch} is kept" if latest else "no epoch had finished"
        if int(os.environ.get("RANK", "0")) == 0:
            logger.error("interrupted: %s in %s; run the same command with resume=true to continue", kept, cfg.run_dir)
        sys.exit(status)


@hydra.main(config_path="pkg://conf", config_name="train", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    # A swept group the run_dir template names (train=standard,pgd with runs/${data.name}-${model.name}-${train.name})
    # already gives each job its own run_dir: no second level named train=pgd below runs/...-pgd.
    groups = groups_in_template(cfg, "run_dir", ("data", "model", "train"))
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.run_dir = str(job_path(cfg.run_dir, groups=groups))  # a multirun's jobs train in folders of their own
    if requeued() and not cfg.resume:  # the same command again: without resume it refused the folder its first run wrote
        if int(os.environ.get("RANK", "0")) == 0:  # said once, not by every process under torchrun
            logger.warning("requeued Slurm job (SLURM_RESTART_COUNT=%s): continuing %s as with resume=true",
                           os.environ["SLURM_RESTART_COUNT"], cfg.run_dir)
        cfg.resume = True
    result = train_or_say_how_to_resume(cfg)
    if result.completed and int(os.environ.get("RANK", "0")) == 0:  # one summary, from rank 0 under torchrun
        print(format_summary(result.summary))


if __name__ == "__main__":
    exit_on_sigterm()  # a killed job (timeout, scancel) removes its temporary files as Ctrl-C does
    run_checked("train", sys.argv[1:])  # a misspelt key is refused by name before Hydra starts
    main()
