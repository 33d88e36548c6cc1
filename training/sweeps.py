"""Hydra multiruns whose jobs write apart.

``python -m training -m train=trades train.beta=1,3,6`` runs three jobs, one after another or, with a
Slurm launcher (``hydra/launcher=slurm_gpu``), at the same time. Every command writes to one
configured place (``run_dir``, ``out``), so without help the jobs of a sweep would overwrite each
other or refuse to start. Inside a multirun, :func:`job_path` puts each job in a folder of its own
below that place, named after the values this job takes for the swept keys, in the style of Hydra's
``override_dirname`` (``train.beta=3``). Keys that only say where or how a job runs
(:data:`RUN_LOCATION_KEYS`: output paths, device, resume, shards, progress) are left out, so the same sweep
run again with ``resume=true`` finds its runs, and a sweep over shards alone keeps the sharded layout
that ``python -m stimuli merge`` joins. The swept keys are read from the sweep's ``multirun.yaml``
(the command line and ``hydra.sweeper.params``); a sweeper that writes none names folders after all
of the job's overrides. Outside a multirun the configured place is used as it is. A data folder
(``data.root``) is not a run location: it decides what a job makes, so a sweep over data folders gets a folder
per job. A config group the configured place already names (``out: reports/${experiment.name}``) is left out
with ``groups=``: its jobs write apart without another level.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Iterable
from urllib.parse import quote

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# Keys that say where or how a job runs, not what it makes (a data folder decides what it makes: not here).
RUN_LOCATION_KEYS = (
    "out", "run_dir", "device", "resume", "stop_after_epochs", "overwrite", "keep_parts", "preview", "shard", "n_shards",
    "progress", "progress_every", "save_every", "keep_checkpoints", "data.download",
)
SHARD_KEYS = ("shard", "n_shards")  # a sweep over shards writes one set's shards/ layout under one out, for merge
_MAX_NAME = 200  # bytes; file systems allow 255 per path component


def _key(override: str) -> str:
    """The config key an override sets: ``train.beta`` for ``train.beta=3``, ``++x.y=1`` or ``~x.y``."""
    return override.split("=", 1)[0].lstrip("+~")


def _excluded(key: str, exclude: Iterable[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in exclude)


def is_run_location(key: str) -> bool:
    """Whether a config key only says where or how a job runs (:data:`RUN_LOCATION_KEYS`, or a key below one)."""
    return _excluded(key, RUN_LOCATION_KEYS)


def job_name(overrides: Iterable[str], exclude: Iterable[str] = RUN_LOCATION_KEYS, groups: Iterable[str] = ()) -> str:
    """A folder name for a job: its overrides without the excluded keys (and the keys below them) and
    without the choice of the config ``groups`` (that key alone: ``experiment=table1``, not
    ``experiment.trainings=...``), sorted and joined by commas, with path separators escaped; a name too
    long for a file system is cut and ends in a hash of the whole. Empty when every override is left out."""
    exclude, groups = tuple(exclude), set(groups)
    kept = sorted(o for o in overrides if not _excluded(_key(o), exclude) and _key(o) not in groups)
    name = quote(",".join(kept), safe="=+~@:,[]{}._-")
    if len(name.encode()) > _MAX_NAME:
        name = name[: _MAX_NAME - 13] + "-" + hashlib.sha1(name.encode()).hexdigest()[:12]
    return name


def swept_keys(sweep_arguments: Iterable[str]) -> set[str]:
    """The keys that a sweep's arguments vary (``train.beta=1,3,6``, ``shard=range(4)``, ``glob(...)``),
    as Hydra's override parser reads them."""
    parsed = override_parser().parse_overrides(list(sweep_arguments))
    return {o.key_or_group + (f"@{o.package}" if o.package else "") for o in parsed if o.is_sweep_override()}


def override_parser() -> OverridesParser:
    """Hydra's override parser with a config loader (the running app's, else ``conf``'s), which a glob sweep over a
    config group (``experiment='glob(fig*)'``) reads the group's options from."""
    from hydra import initialize_config_module

    if GlobalHydra.instance().is_initialized():
        return OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    with initialize_config_module(config_module="conf", version_base=None):
        return OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())


def is_job_of(job_overrides: Iterable[str], sweep_arguments: Iterable[str]) -> bool:
    """Whether a job with ``job_overrides`` (one value per key) is one of the jobs of the sweep ``sweep_arguments``: the
    same keys, each value one of the sweep's for that key (a glob that cannot be expanded here allows any value)."""
    parser = override_parser()
    allowed: dict[str, set[str] | None] = {}
    for o in parser.parse_overrides(list(sweep_arguments)):
        key = o.input_line.split("=", 1)[0]  # as written: '+' and '@package' included
        try:
            allowed[key] = set(o.sweep_string_iterator()) if o.is_sweep_override() else {o.get_value_element_as_str()}
        except HydraException:  # a glob over a group this config does not have
            allowed[key] = None
    job = {o.input_line.split("=", 1)[0]: o.get_value_element_as_str() for o in parser.parse_overrides(list(job_overrides))}
    return job.keys() == allowed.keys() and all(values is None or job[key] in values for key, values in allowed.items())


def _sweep_arguments(hydra_cfg) -> list[str] | None:
    """The arguments of the sweep this job belongs to, from the ``multirun.yaml`` its sweeper wrote."""
    sweep_dir = Path(hydra_cfg.sweep.dir)
    if not sweep_dir.is_absolute():
        sweep_dir = Path(hydra_cfg.runtime.cwd) / sweep_dir
    saved = sweep_dir / "multirun.yaml"
    if not saved.is_file():
        return None
    sweep = OmegaConf.load(saved).hydra
    params = OmegaConf.select(sweep, "sweeper.params") or {}
    return [*sweep.overrides.task, *(f"{key}={value}" for key, value in params.items())]


def groups_in_template(cfg, key: str, groups: Iterable[str]) -> tuple[str, ...]:
    """The config ``groups`` whose values the unresolved template of ``cfg[key]`` names (``run_dir:
    runs/${data.name}-${model.name}-${train.name}``): a sweep over them already writes apart, so its jobs' folders need no
    level named after them (:func:`job_path`'s ``groups=``; an explicit path names none). Read it before the path is
    expanded, which replaces the template by its value."""
    template = str(OmegaConf.to_container(cfg, resolve=False)[key])
    return tuple(group for group in groups if "${" + group + "." in template)


def job_path(base: str | Path, exclude: Iterable[str] = RUN_LOCATION_KEYS, groups: Iterable[str] = ()) -> Path:
    """``base`` itself, or in a Hydra multirun ``base / job_name(...)`` of this job's values for the
    swept keys (see the module docstring). Call it from a ``@hydra.main`` function; elsewhere (tests,
    the Python API) there is no multirun and ``base`` comes back unchanged."""
    if not HydraConfig.initialized():
        return Path(base)
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return Path(base)
    overrides = list(hydra_cfg.overrides.task)
    arguments = _sweep_arguments(hydra_cfg)
    if arguments is not None and not is_job_of(overrides, arguments):
        log.warning("%s/multirun.yaml is another sweep's (two sweeps started in the same second share the folder): this job's "
                    "folder is named after all its overrides; give each sweep its own hydra.sweep.dir", hydra_cfg.sweep.dir)
    elif arguments is not None:
        swept = swept_keys(arguments)
        overrides = [o for o in overrides if _key(o) in swept]
        shared = sorted(k for k in swept if _excluded(k, exclude) and not _excluded(k, SHARD_KEYS))
        if shared and not job_name(overrides, exclude, groups):  # shards share their out on purpose: merge joins them
            log.warning("the swept key(s) %s only say where or how a job runs, so every job of this sweep writes to %s and a later job "
                        "replaces an earlier one's results; sweep a key that changes the result, or give each job its own out/run_dir",
                        ", ".join(shared), base)
    name = job_name(overrides, exclude, groups)
    return Path(base) / name if name else Path(base)


__all__ = ["RUN_LOCATION_KEYS", "groups_in_template", "is_job_of", "is_run_location", "job_name", "job_path", "override_parser", "swept_keys"]
