"""``python -m perceptual humans``: human survey answers read back and scored (Nanda et al., AAAI 2023, Table 1 Human
columns and Appendix A), from a Hydra config (``conf/humans.yaml``). The work is :mod:`perceptual.humans`; this module
finds the files, builds the observers, writes ``humans.json``, ``humans.md`` and a figure, and, given a measurement
report, rewrites that report with the Human columns next to the observer columns."""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from training.config import concise_errors, expand_path_options, resolve_device
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import job_path

from .. import humans
from ..measure import load_report, make_panel, write_report
from ..report import plain
from ..statistics import check_n_boot

logger = logging.getLogger("perceptual")


def _is_hidden(path: Path, folder: Path) -> bool:
    """A file no person put there as an answer: under a hidden or ``__MACOSX`` folder, or hidden itself (macOS's ``._name``
    resource forks, which unzipping an archive made on a Mac leaves next to every download, are binary)."""
    return any(part.startswith(".") or part == "__MACOSX" for part in path.relative_to(folder).parts)


def response_files(entries) -> list[Path]:
    """Files as given, and every .json / .csv inside the folders given, except hidden ones (:func:`_is_hidden`)."""
    files = []
    for entry in [entries] if isinstance(entries, str) else list(entries):
        path = Path(entry).expanduser()
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".json", ".csv") and p.is_file())
            found = [p for p in candidates if not _is_hidden(p, path)]
            if len(found) < len(candidates):
                logger.info("%s: skipped %d hidden files (macOS ._ resource forks, __MACOSX, dot folders)", path, len(candidates) - len(found))
            if not found:
                raise FileNotFoundError(f"{path} holds no .json or .csv files: put the page downloads or MTurk batch results there")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"response file or folder {path} not found")
    if not files:  # an empty list wrote results of 0 submissions over earlier ones
        raise ValueError("no responses given: pass responses=[FILE_OR_FOLDER, ...] (page downloads, MTurk batch results)")
    return files


def run(cfg: DictConfig) -> dict:
    if cfg.max_attention_failures < 0:
        raise ValueError(f"max_attention_failures must be >= 0, got {cfg.max_attention_failures}")
    check_n_boot(cfg.n_boot)
    humans.check_min_median_rt_ms(cfg.min_median_rt_ms)
    humans.check_min_answered(cfg.min_answered)
    package = humans.load_package(cfg.package)
    files = response_files(cfg.responses)
    measure = load_report(cfg.measure_report) if cfg.measure_report else None
    if measure is not None:  # before any answer is read or judged
        humans.check_report_matches(measure, humans.survey_model_labels(package), humans.package_set_fingerprints(package))
    observers = list(make_panel(cfg.observers, cfg.observer_net, cfg.lpips_weights, resolve_device(cfg.device))) if cfg.observers else []
    responses = humans.read_responses(files, package)
    data = humans.analyse(package, responses, observers, measure, cfg.max_attention_failures, cfg.n_boot, cfg.seed, cfg.min_median_rt_ms,
                          cfg.min_answered)
    out = Path(cfg.out) if cfg.out else package.path / "results"
    atomic_write_json(out / "humans.json", plain(data))  # undefined numbers (one worker's std) as null, as in every report
    atomic_write_text(out / "humans.md", humans.markdown_summary(data) + "\n![accuracy](accuracy.png)\n")
    humans.accuracy_figure(data, out / "accuracy.png")
    if measure is not None:
        write_report(humans.with_human_columns(measure, data), Path(cfg.measure_report))
    return data


@hydra.main(config_path="pkg://conf", config_name="humans", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    # a multirun's jobs report in folders of their own, the default <package>/results too (every job wrote there)
    cfg.out = str(job_path(cfg.out or Path(cfg.package) / "results"))
    data = run(cfg)
    print(humans.markdown_summary(data))
    print(f"results: {Path(cfg.out).resolve() / 'humans.md'}")
    if cfg.measure_report:
        print(f"report with the Human columns: {Path(cfg.measure_report).resolve() / 'report.md'}")


__all__ = ["main", "response_files", "run"]
