"""One table for a sweep: every job's result beside the config values that set the jobs apart.

A Hydra multirun (``python -m perceptual measure -m invert.steps=200,1000``, ``python -m training -m train.beta=1,3,6``,
an ``audit`` sweep; :mod:`training.sweeps`) writes one folder per job below the configured ``out`` or ``run_dir``.
:func:`collect_sweep` walks such a folder and reads each job's result file (:data:`SWEEP_SOURCES`: measure's
``report.json``, a training run's ``summary.json``, an audit's ``audit.json``). The swept keys are found from the jobs'
own configs (flattened to dotted keys; those whose values differ between jobs, leaving out where and how a job ran,
:data:`training.sweeps.RUN_LOCATION_KEYS`), so a sweep made by Hydra, by a Slurm launcher or by hand reads alike.
:func:`write_sweep_summary` writes ``sweep.md``, ``sweep.json``, one ``sweep_<kind>.csv`` and one figure
``sweep_<kind>.png`` (each plotted metric against a swept key, a line per model and other swept values) per kind.

A job is the highest folder below the root that holds a result file: the measure report that an audit writes
into its ``alignment/`` folder belongs to the audit, not to a job of its own. Adding a kind of result is one
:class:`SweepSource` and one :func:`register_sweep_source`.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from training.attacks import AttackConfigError, config_number
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import is_run_location

from .report import format_score, save_figure

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepMetric:
    """A result column: its name in the CSV and JSON, its heading in the table, and whether it is a fraction that
    the table prints in percent."""
    column: str
    heading: str
    percent: bool = True


@dataclass(frozen=True)
class SweepSource:
    """A kind of job result. ``filename`` is the file a job of this kind writes in its folder; ``recognise`` tells
    this kind's file from another command's file of the same name; ``rows`` gives a job's rows (one per model, each
    with a ``model`` entry and the metric columns); ``config`` gives the config the job ran with (None when it was
    not saved). ``plotted`` names the metric columns drawn in the figure. ``started`` names what a job of this kind
    writes in its folder before its result (a training run's ``metrics.jsonl``): a folder holding one and no result is a
    job still running or one that crashed, listed with the status :data:`NO_RESULT`."""
    kind: str
    filename: str
    metrics: tuple[SweepMetric, ...]
    plotted: tuple[str, ...]
    recognise: Callable[[Mapping], bool]
    rows: Callable[[Mapping], list[dict]]
    config: Callable[[Mapping, Path], Mapping | None]
    started: tuple[str, ...] = ()


SWEEP_SOURCES: dict[str, SweepSource] = {}


def register_sweep_source(source: SweepSource) -> SweepSource:
    if source.kind in SWEEP_SOURCES:
        raise ValueError(f"a sweep source named {source.kind!r} is already registered")
    SWEEP_SOURCES[source.kind] = source
    return source


def _mean(entry: Any) -> float | None:
    """A panel score's mean (``{mean, std, observers}``), or a plain number."""
    value = entry.get("mean") if isinstance(entry, Mapping) else entry
    return None if value is None else float(value)


ALIGNMENT_METRICS = (SweepMetric("2afc", "Observer 2AFC (%)"), SweepMetric("clustering", "Observer clustering (%)"),
                     SweepMetric("clustering_hard", "Hard clustering (%)"))


def _measure_rows(report: Mapping) -> list[dict]:
    rows = []
    for label, result in report["models"].items():
        convergence = result.get("convergence") or {}
        rows.append({"model": label, **{m.column: _mean(result.get(m.column)) for m in ALIGNMENT_METRICS},
                     "clean_accuracy": result.get("clean_accuracy"), "robust_accuracy": result.get("robust_accuracy"),
                     "converged_fraction": convergence.get("converged_fraction"), "median_final_distance": result.get("median_final_distance"),
                     "seconds": report.get("seconds")})
    return rows


def _training_config(summary: Mapping, folder: Path) -> Mapping | None:
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def _audit_rows(audit: Mapping) -> list[dict]:
    accuracy = audit["robustness"]["accuracy"]
    defence = ((audit.get("alignment") or {}).get("models") or {}).get("defence") or {}
    return [{"model": audit.get("defence_name", "defence"), "flagged": bool(audit.get("flagged")), "clean_accuracy": accuracy.get("clean"),
             "worst_case_accuracy": accuracy.get("worst_case"), **{m.column: _mean(defence.get(m.column)) for m in ALIGNMENT_METRICS},
             "alignment_position": (audit.get("alignment") or {}).get("position")}]


register_sweep_source(SweepSource(
    kind="measure", filename="report.json",
    metrics=(*ALIGNMENT_METRICS, SweepMetric("clean_accuracy", "Clean acc. (%)"), SweepMetric("robust_accuracy", "Robust acc. (%)"),
             SweepMetric("converged_fraction", "Converged (%)"), SweepMetric("median_final_distance", "Median distance", percent=False),
             SweepMetric("seconds", "Seconds", percent=False)),
    plotted=("2afc", "clustering", "converged_fraction"),
    recognise=lambda data: isinstance(data.get("models"), Mapping) and "observers" in data and "n_targets" in data,
    rows=_measure_rows,
    config=lambda data, folder: data.get("config"),
    started=("models",),  # a model's inversions and scores, cached before the report
))
register_sweep_source(SweepSource(
    kind="training", filename="summary.json",
    metrics=(SweepMetric("clean_accuracy", "Clean acc. (%)"), SweepMetric("robust_accuracy", "Robust acc. (%)"),
             SweepMetric("epochs_completed", "Epochs", percent=False), SweepMetric("train_seconds", "Train seconds", percent=False),
             SweepMetric("images_per_second", "Images/s", percent=False)),
    plotted=("clean_accuracy", "robust_accuracy"),
    # a run that diverged or was interrupted writes a summary without accuracies: it is a job, tabled with its status
    recognise=lambda data: "epochs_completed" in data and ("clean_accuracy" in data or "status" in data),
    rows=lambda data: [{"model": data.get("model"), "status": data.get("status"), "stopped": data.get("stopped"),
                        **{k: data.get(k) for k in ("clean_accuracy", "robust_accuracy", "epochs_completed", "train_seconds", "images_per_second")}}],
    config=_training_config,
    started=("metrics.jsonl", "checkpoints"),
))
register_sweep_source(SweepSource(
    kind="audit", filename="audit.json",
    metrics=(SweepMetric("clean_accuracy", "Clean acc. (%)"), SweepMetric("worst_case_accuracy", "Worst-case acc. (%)"), *ALIGNMENT_METRICS,
             SweepMetric("alignment_position", "Alignment position", percent=False), SweepMetric("flagged", "Flagged", percent=False)),
    plotted=("worst_case_accuracy", "2afc"),
    recognise=lambda data: "verdict" in data and isinstance(data.get("robustness"), Mapping),
    rows=_audit_rows,
    config=lambda data, folder: data.get("config"),
    started=("cache",),  # the attacks' results, cached before the verdict
))


def flatten_config(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to scalar values (``{"train": {"beta": 3}}`` -> ``{"train.beta": 3}``); a list becomes its compact
    JSON text, so that it compares and prints as one value."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name + "."))
        elif isinstance(value, (list, tuple, Mapping)):
            flat[name] = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
        else:
            flat[name] = value
    return flat


def numeric_value(value: Any) -> float | None:
    """A swept value as a number where it is one: ints and floats, and fractions written as text (``8/255``, how
    eps is often given on the command line); None otherwise (booleans, names, lists)."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return None
    if isinstance(value, numbers.Real):  # numpy's numbers too, as a DataFrame holds them
        return None if math.isnan(value) else float(value)
    if isinstance(value, str):
        try:
            return config_number(value, "a swept value")
        except AttackConfigError:
            return None
    return None


@dataclass
class SweepTable:
    """The jobs of one kind: ``frame`` has a row per job and model (columns ``job``, the swept keys, ``model`` and
    the source's metrics); ``swept`` lists the keys whose values differ between the jobs."""
    source: SweepSource
    frame: pd.DataFrame
    swept: list[str]
    without_config: list[str]


def _read_json(path: Path) -> Mapping:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): rerun that job, or move the file away to summarise the others") from err
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object: it is not a job's result")
    return data


def _recognised(path: Path, source: SweepSource) -> bool:
    """Whether ``path`` holds a ``source`` result (False for a file that does not parse)."""
    try:
        return bool(source.recognise(_read_json(path)))
    except ValueError:
        return False


INNER_RESULT_FOLDERS = ("alignment",)  # where a job writes another command's result as part of its own (the audit's measure report)


def find_jobs(root: str | Path, sources: Mapping[str, SweepSource] | None = None) -> list[tuple[Path, SweepSource, Mapping]]:
    """Every job folder below ``root`` (``root`` itself included) with its source and result: the highest folder
    holding a result file that its source recognises; result files further down belong to that job where they are of
    another kind or in one of :data:`INNER_RESULT_FOLDERS` (an audit's ``alignment/report.json``), and are jobs of their own
    otherwise (a sweep's jobs below the folder where a plain run of the same command wrote: ``runs/cifar10-resnet18-trades``
    and its ``train.beta=3/``)."""
    root = Path(root)
    sources = SWEEP_SOURCES if sources is None else sources
    candidates = sorted(((path, source) for source in sources.values() for path in root.rglob(source.filename) if path.is_file()),
                        key=lambda item: (len(item[0].relative_to(root).parts), str(item[0])))
    jobs: list[tuple[Path, SweepSource, Mapping]] = []
    folded: list[tuple[Path, str, Path]] = []  # results of another kind taken as part of a job, to say so
    for path, source in candidates:
        folder = path.parent
        owner = next((job for job, job_source, _ in jobs
                      if folder == job or (job in folder.parents and (job_source.kind != source.kind or folder.name in INNER_RESULT_FOLDERS))), None)
        if owner is not None:
            if folder != owner and folder.name not in INNER_RESULT_FOLDERS and _recognised(path, source):
                folded.append((path, source.kind, owner))
            continue
        data = _read_json(path)
        if source.recognise(data):
            jobs.append((folder, source, data))
        else:
            log.debug("%s is not a %s result; skipped", path, source.kind)
    for path, kind, owner in folded:
        log.warning("%s (a %s result) lies inside the job %s, so it is read as part of that job, not as a job of its own: give "
                    "root=%s to summarise it", path, kind, owner, path.parent)
    return jobs


NO_RESULT = "no result (running, or stopped by a crash, a kill or a time limit)"


def find_started_jobs(root: str | Path, jobs: Sequence[tuple[Path, SweepSource, Mapping]],
                      sources: Mapping[str, SweepSource] | None = None) -> list[tuple[Path, SweepSource]]:
    """Folders below ``root`` where a job started and wrote no result: a folder holding something a source's jobs write
    first (:attr:`SweepSource.started`) and not its result file, outside every job of ``jobs`` (:func:`find_jobs`) and
    below no other such folder. A job killed by the out-of-memory killer or by Slurm, or one that raised, left its
    config and checkpoints and no result; the summary dropped it without a word, and the swept key with it."""
    root = Path(root)
    sources = SWEEP_SOURCES if sources is None else sources
    found: list[tuple[Path, SweepSource]] = []
    candidates = sorted(((path.parent, source) for source in sources.values() for name in source.started for path in root.rglob(name)),
                        key=lambda item: (len(item[0].relative_to(root).parts), str(item[0])))
    for folder, source in candidates:
        inside = [job for job, _, _ in jobs] + [f for f, _ in found]
        if (folder / source.filename).exists() or any(folder == f or f in folder.parents for f in inside):
            continue
        found.append((folder, source))
    return found


def _sort_key(value: Any) -> tuple:
    number = numeric_value(value)
    return (0, number, "") if number is not None else (1, 0.0, "" if value is None else str(value))


def collect_sweep(root: str | Path, sources: Mapping[str, SweepSource] | None = None) -> dict[str, SweepTable]:
    """Read every job below ``root`` (see the module docstring): one :class:`SweepTable` per kind of result found,
    rows sorted by the swept values (numbers as numbers, ``8/255`` included) and then by model."""
    root = Path(root)
    sources = SWEEP_SOURCES if sources is None else sources
    if not root.is_dir():
        raise FileNotFoundError(f"root={root} is not a folder: give the `out` (or `run_dir`) that the sweep wrote its jobs below")
    jobs = find_jobs(root, sources)
    started = find_started_jobs(root, jobs, sources)
    if started:
        log.warning("%d job(s) below %s started and wrote no result (still running, or stopped by a crash, a kill or a time limit): %s",
                    len(started), root, ", ".join(folder.relative_to(root).as_posix() for folder, _ in started))
    jobs = jobs + [(folder, source, {}) for folder, source in started]  # {}: rows of their own, below
    if not jobs:
        looked_for = ", ".join(f"{s.filename} ({s.kind})" for s in sources.values())
        raise FileNotFoundError(f"no finished job below {root}: looked for {looked_for}. Give the `out` (or `run_dir`) the sweep "
                                "wrote its jobs below; a job that did not finish has written no result yet")
    tables = {}
    for kind in dict.fromkeys(source.kind for _, source, _ in jobs):
        of_kind = [(folder, source, data) for folder, source, data in jobs if source.kind == kind]
        source = of_kind[0][1]
        configs, without_config = {}, []
        for folder, _, data in of_kind:
            job = folder.relative_to(root).as_posix()  # "." for the root itself
            config = source.config(data, folder)
            configs[job] = {} if config is None else {k: v for k, v in flatten_config(config).items() if not is_run_location(k)}
            if config is None:
                without_config.append(job)
        keys = sorted({k for flat in configs.values() for k in flat})
        with_config = [flat for job, flat in configs.items() if job not in without_config]  # an unknown config differs in nothing
        swept = [k for k in keys if len({json.dumps(flat.get(k), sort_keys=True, default=str) for flat in with_config}) > 1]
        records = []
        for folder, _, data in of_kind:
            job = folder.relative_to(root).as_posix()
            rows = source.rows(data) if data else [{"model": None, "status": NO_RESULT}]
            records += [{"job": job, **{k: configs[job].get(k) for k in swept}, **row} for row in rows]
        records.sort(key=lambda r: ([_sort_key(r[k]) for k in swept], str(r["model"]), r["job"]))
        tables[kind] = SweepTable(source, pd.DataFrame.from_records(records), swept, without_config)
        if without_config:
            log.warning("%d %s job(s) saved no config, so their swept values are unknown: %s", len(without_config), kind, ", ".join(without_config))
    return tables


def _cell(value: Any, metric: SweepMetric | None = None) -> str:
    """A table cell: a metric to 4 significant digits (percent where it is a fraction); a swept value exactly enough to
    tell jobs apart (a float column holds whole numbers as floats once any job lacks the key: seed 12345.0 is "12345")."""
    if _unknown(value):
        return "–"
    if metric is not None and metric.percent and not isinstance(value, bool):
        return format_score(float(value))
    if isinstance(value, float):
        if metric is None and value.is_integer():
            return str(int(value))
        return f"{value:{'.4g' if metric is not None else '.10g'}}"
    return str(value).replace("|", "\\|")


FINISHED_STATUS = "completed"  # a training summary's status when the run wrote its final result


def sweep_markdown(tables: Mapping[str, SweepTable], root: str | Path) -> str:
    """``sweep.md``: per kind, a table with a row per job and model, the swept keys first."""
    lines = [f"# Sweep summary: {root}", ""]
    for kind, table in tables.items():
        n_jobs = table.frame["job"].nunique()
        lines += [f"## {kind} ({n_jobs} job{'s' if n_jobs != 1 else ''})", ""]
        if table.swept:
            lines += [f"Swept keys (values that differ between the jobs' configs): {', '.join(f'`{k}`' for k in table.swept)}.", ""]
        else:
            lines += ["The jobs' configs do not differ in any key that changes a result.", ""]
        if table.without_config:
            lines += [f"> No config saved by: {', '.join(table.without_config)}; their swept values are unknown.", ""]
        unfinished = _unfinished(table)
        if unfinished:
            lines += ["> Not finished, so without a final result: "
                      + "; ".join(f"{job} ({status}" + (f": {stopped}" if stopped else "") + ")" for job, status, stopped in unfinished) + ".", ""]
        metrics = [m for m in table.source.metrics if m.column in table.frame]
        extra = ["status"] if "status" in table.frame else []
        header = ["Job", *table.swept, "Model", *extra, *(m.heading for m in metrics)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for _, row in table.frame.iterrows():
            cells = [row["job"], *(_cell(row[k]) for k in table.swept), _cell(row["model"]), *(_cell(row[c]) for c in extra),
                     *(_cell(row[m.column], m) for m in metrics)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _unfinished(table: SweepTable) -> list[tuple[str, str, str | None]]:
    """(job, status, why it stopped) of every job that ended without a final result (a training run that diverged or
    was interrupted)."""
    if "status" not in table.frame:
        return []
    rows = table.frame.drop_duplicates("job")
    return [(row["job"], row["status"], None if _unknown(row.get("stopped")) else row.get("stopped"))
            for _, row in rows.iterrows() if not _unknown(row["status"]) and row["status"] != FINISHED_STATUS]


def _is_seed(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def _named_in_job_folders(table: SweepTable) -> set[str]:
    """The swept keys the jobs' folder names give (:func:`training.sweeps.job_name`: ``seed=0,train.beta=3``): the
    keys the sweep was asked for, not those that changed with them; a config group's choice (``train=trades``) names
    the group's ``name`` key."""
    named = set()
    for job in table.frame["job"]:
        for part in Path(job).name.split(","):
            key = part.split("=", 1)[0].lstrip("+~") if "=" in part else None
            if key in table.swept:
                named.add(key)
            elif key is not None and f"{key}.name" in table.swept:
                named.add(f"{key}.name")
    return named


def choose_x(table: SweepTable, x: str | None = None) -> str | None:
    """The swept key the figure puts on its x axis: ``x`` when given (it must be a swept key), else the first swept key
    by: named in the job folders (a group sweep ``train=standard,pgd,trades`` changes ``train.attack.eps`` too, and
    the standard run has none), every job with a config has a value of it, not a seed (a hyper-parameter swept over
    seeds is plotted against the hyper-parameter, a line per seed), its values all numbers; None when nothing was swept."""
    if x is not None:
        if x not in table.swept:
            raise ValueError(f"x={x!r} is not a swept key of the {table.source.kind} jobs; swept: {table.swept or 'none'}")
        return x
    if not table.swept:
        return None
    with_config = table.frame[~table.frame["job"].isin(table.without_config)]
    named = _named_in_job_folders(table)

    def rank(key: str) -> tuple:
        values = list(with_config[key])
        known = [v for v in values if not _unknown(v)]
        return (key not in named, len(known) < len(values), _is_seed(key), not all(numeric_value(v) is not None for v in known),
                table.swept.index(key))
    return min(table.swept, key=rank)


def _unknown(value: Any) -> bool:
    """A job's value of a key it does not record (no saved config, or a key other jobs added): None, or NaN in a frame."""
    return value is None or (isinstance(value, float) and math.isnan(value))


MAX_LEGEND_KEYS = 2  # other swept keys named in a line's legend entry; with more, the entry is the job's folder


def sweep_figure(table: SweepTable, path: str | Path, x: str | None = None) -> Path | None:
    """Each plotted metric against the swept key ``x`` (:func:`choose_x`), one line per model and combination of the
    other swept values (per model and job folder when more than :data:`MAX_LEGEND_KEYS` other keys differ); None (no
    figure) when the jobs differ in no key."""
    x = choose_x(table, x)
    if x is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = table.frame[[not _unknown(v) for v in table.frame[x]]].reset_index(drop=True)  # jobs without a value: in the table only
    metrics = [m for m in table.source.metrics if m.column in table.source.plotted and frame[m.column].notna().any()]
    if not metrics:
        return None
    values_as_numbers = [numeric_value(v) for v in frame[x]]
    is_numeric = all(n is not None for n in values_as_numbers)
    categories = sorted(dict.fromkeys(frame[x]), key=_sort_key)
    positions = values_as_numbers if is_numeric else [categories.index(v) for v in frame[x]]
    others = [k for k in table.swept if k != x]
    models = [frame["model"].astype(str)] if frame["model"].nunique() > 1 else []
    if len(others) > MAX_LEGEND_KEYS:  # jobs that differ in many keys (runs gathered by hand): a line per job folder
        group_keys = models + [frame["job"]]
    else:
        group_keys = (models + [frame[k].map(lambda v, k=k: f"{k}={_cell(v)}") for k in others]) or [frame["model"].astype(str)]
    groups = pd.Series([", ".join(parts) for parts in zip(*group_keys)], index=frame.index)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 1.5, 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        scale = 100 if metric.percent else 1
        for group, members in groups.groupby(groups, sort=False).groups.items():
            index = sorted(members, key=lambda i: positions[i])  # the frame's index is 0..n-1
            values = [frame[metric.column].iloc[i] for i in index]
            ax.plot([positions[i] for i in index], [math.nan if v is None else float(v) * scale for v in values], marker="o", label=group)
        ax.set_xlabel(x)
        ax.set_ylabel(metric.heading)
        if not is_numeric:
            ax.set_xticks(range(len(categories)), [_cell(c) for c in categories], rotation=30, ha="right")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=7, ncol=1 if len(labels) > 6 or max(map(len, labels)) > 40 else 2)
    fig.suptitle(f"{table.source.kind} sweep: each job's result against {x}")
    fig.tight_layout()
    return save_figure(fig, Path(path))


def write_sweep_summary(root: str | Path, out: str | Path | None = None, *, x: str | None = None, figures: bool = True,
                        sources: Mapping[str, SweepSource] | None = None) -> dict[str, SweepTable]:
    """Collect the sweep below ``root`` and write, into ``out`` (default ``root``): ``sweep.md``, ``sweep.json``
    (every row, the swept keys per kind), ``sweep_<kind>.csv`` and, with ``figures``, ``sweep_<kind>.png``."""
    root = Path(root)
    out = Path(out) if out is not None else root
    tables = collect_sweep(root, sources)
    if x is not None and not any(x in table.swept for table in tables.values()):  # refused before anything is written
        raise ValueError(f"x={x!r} is not a swept key; swept: " + "; ".join(f"{kind}: {t.swept or 'none'}" for kind, t in tables.items()))
    written: dict[str, Sequence[str]] = {}
    for kind, table in tables.items():
        atomic_write_text(out / f"sweep_{kind}.csv", table.frame.to_csv(index=False))
        files = [f"sweep_{kind}.csv"]
        if figures:
            chosen = x if x is not None and x in table.swept else None
            figure = sweep_figure(table, out / f"sweep_{kind}.png", chosen)
            if figure is not None:
                files.append(figure.name)
        written[kind] = files
    for source in (SWEEP_SOURCES if sources is None else sources).values():  # an earlier summary's files this one does not write
        for stale in (f"sweep_{source.kind}.csv", f"sweep_{source.kind}.png"):
            if stale not in written.get(source.kind, ()):
                (out / stale).unlink(missing_ok=True)
    markdown = sweep_markdown(tables, root)
    figure_lines = [f"![{kind} sweep]({name})" for kind, files in written.items() for name in files if name.endswith(".png")]
    atomic_write_text(out / "sweep.md", markdown + ("\n".join(figure_lines) + "\n" if figure_lines else ""))
    atomic_write_json(out / "sweep.json", {
        "root": str(root.resolve()),
        "kinds": {kind: {"swept": table.swept, "without_config": table.without_config, "files": written[kind],
                         "rows": json.loads(table.frame.to_json(orient="records", double_precision=15))} for kind, table in tables.items()},
    })
    return tables


__all__ = ["NO_RESULT", "SWEEP_SOURCES", "SweepMetric", "SweepSource", "SweepTable", "choose_x", "collect_sweep", "find_jobs", "find_started_jobs",
           "flatten_config",
           "numeric_value", "register_sweep_source", "sweep_figure", "sweep_markdown", "write_sweep_summary"]
