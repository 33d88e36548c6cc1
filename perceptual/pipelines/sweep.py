"""``python -m perceptual sweep root=DIR``: the jobs of a sweep in one table, beside the values that set them apart.

Reads every job below ``root`` (measure reports, training runs, audits; :mod:`perceptual.sweep_summary`) and writes
``sweep.md``, ``sweep.json``, ``sweep_<kind>.csv`` and ``sweep_<kind>.png`` into ``out`` (default ``root``)."""
from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from training.config import concise_errors, expand_path, expand_path_options

from ..sweep_summary import sweep_markdown, write_sweep_summary


def _folders(cfg: DictConfig) -> tuple[Path, Path]:
    if cfg.root is None:
        raise SystemExit("error: give root=DIR, the `out` (or `run_dir`) a sweep wrote its jobs below")
    root = expand_path(cfg.root)
    return root, (expand_path(cfg.out) if cfg.out is not None else root)


def run(cfg: DictConfig) -> dict:
    root, out = _folders(cfg)
    return write_sweep_summary(root, out, x=cfg.x, figures=bool(cfg.figures))


@hydra.main(config_path="pkg://conf", config_name="sweep", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    tables = run(cfg)
    root, out = _folders(cfg)
    print(sweep_markdown(tables, root))
    print(f"summary: {out.resolve() / 'sweep.md'}")


__all__ = ["main", "run"]
