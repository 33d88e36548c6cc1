"""``python -m perceptual humans-mvh``: the model-vs-human benchmark's real human trials, and models next to them.

Reads the benchmark's trial CSVs (:func:`perceptual.human_trials.read_trials`; any problem in the files stops the run
with the full report unless ``strict=false``) and computes, per experiment and condition (:mod:`perceptual.mvh_analysis`):
the human-human error consistency over every pair of subjects (the benchmark's ceiling for models), human accuracy with
its spread across subjects, and the shape bias on the cue-conflict trials per subject, pooled and as the mean of the
subjects; and the benchmark's two tables over the conditions they keep (``benchmark_exclusions=false``: all of them):
OOD accuracy (:func:`perceptual.metrics.ood_accuracy`) and the aggregate (:func:`perceptual.metrics.aggregate_trials`:
accuracy difference, observed and error consistency), with the humans' row in every run. Model decisions in the same
format (``models=[PATH, ...]``) join as further observers, matched by source image: their accuracy, their error
consistency with the humans, their shape bias, and their rows of the two tables with the OOD-accuracy rank and the
benchmark's mean rank.

Output directory (``out``)::

    report.json              every number below, and the reader's report
    tables/accuracy.csv      accuracy per experiment, condition and subject
    tables/accuracy_humans.csv   per experiment and condition: mean, std, min, max over human subjects
    tables/pairs.csv         observed and error consistency of every pair of observers per experiment and condition
    tables/error_consistency_humans.csv   per experiment and condition, over the human-human pairs
    tables/shape_bias.csv, tables/shape_bias_per_category.csv
    figures/accuracy.png, figures/error_consistency.png, figures/matrix_<experiment>.png, figures/shape_bias.png
    summary.md               the tables, in words
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from training.config import as_list, concise_errors, expand_path, expand_path_options
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import job_path

from ..human_compare import check_shared_images
from ..human_trials import read_trials
from ..metrics import aggregate_trials, condition_key, is_excluded, mean_rank, mvh_exclusions, ood_accuracy
from ..mvh_analysis import (
    CUE_CONFLICT,
    accuracy_per_subject,
    accuracy_summary,
    condition_order,
    consistency_matrix,
    consistency_summary,
    pairwise_consistency,
    shape_bias_per_category,
    shape_bias_table,
)
from ..mvh_figures import accuracy_figure, consistency_matrix_figure, error_consistency_figure, shape_bias_figure
from ..report import format_number, plain


def _fmt(value: float, digits: int = 3) -> str:
    return format_number(value, f".{digits}f")


def _in_condition_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by experiment, then condition in the benchmark's plotting order (:func:`condition_order`)."""
    rank = {}
    for dataset, group in frame.groupby("dataset"):
        rank.update({(dataset, c): i for i, c in enumerate(condition_order(group["condition"].unique(), dataset))})
    keys = [rank[(d, c)] for d, c in zip(frame["dataset"], frame["condition"])]
    return frame.assign(_order=keys).sort_values(["dataset", "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)


HUMANLIKE_METRICS = ("accuracy_difference", "observed_consistency", "error_consistency")


def _benchmark(trials: pd.DataFrame, models: Sequence[str], on_undefined: str, exclusions: bool) -> dict:
    """The benchmark's two tables: OOD accuracy (:func:`perceptual.metrics.ood_accuracy`) with its rank, and the three
    "most human-like" aggregate metrics per model (conditions, then humans, then experiments) with their mean rank; with
    ``exclusions``, over the conditions the benchmark's table keeps (:data:`MVH_EXCLUDED_CONDITIONS` left out). The
    humans' row (pairs of subjects; their pooled OOD accuracy) is there with or without models: without models, over
    every experiment, the benchmark's human baseline.

    As in the reference (one list of experiments for every model and the humans), the table is over the experiments every
    model has decisions for; a model's other experiments are named in ``left_out``. Consistency is over the images both
    observers saw (a human row left out under ``strict=false`` does not stop the run). A model with an undefined value
    (NaN: no trials left after the exclusions) is not ranked; the others are ranked among themselves, as pandas' ``rank``
    leaves NaN unranked in the reference. A model without decisions in some of the kept conditions averages over the ones
    it has; they are named in ``missing_conditions``."""
    covered = {m: set(trials.loc[trials["subject"] == m, "dataset"]) for m in models}
    common = sorted(set.intersection(*covered.values()) if models else set(trials["dataset"]))
    left_out = {m: sorted(covered[m] - set(common)) for m in models if covered[m] - set(common)}
    if not common:
        return {"experiments": [], "left_out": left_out, "missing_conditions": {}, "values": {}, "humans": {}, "mean_rank": {},
                "ood_accuracy_rank": {}, "excluded_conditions": {}, "note": "the models share no experiment: run them separately to rank them"}
    trials = trials[trials["dataset"].isin(common)]
    excluded = mvh_exclusions(zip(trials["dataset"], trials["condition"])) if exclusions else {}
    metrics = {name: aggregate_trials(trials, name, on_undefined=on_undefined, exclude=excluded, images="shared")
               for name in HUMANLIKE_METRICS}
    metrics["ood_accuracy"] = ood_accuracy(trials, exclude=excluded)
    values = {m: {name: result.models.get(m, float("nan")) for name, result in metrics.items()} for m in models}
    return {"experiments": common, "left_out": left_out, "missing_conditions": _missing_conditions(trials, models, excluded),
            "values": values, "humans": {name: result.humans for name, result in metrics.items()},
            "mean_rank": _ranks(values, HUMANLIKE_METRICS, [False, True, True]),
            "ood_accuracy_rank": _ranks(values, ("ood_accuracy",), [True]), "excluded_conditions": excluded}


def _ranks(values: Mapping[str, Mapping[str, float]], names: Sequence[str], higher_is_better: Sequence[bool]) -> dict:
    """Each model's mean rank over the metrics ``names`` (:func:`perceptual.metrics.mean_rank`); a model with an undefined
    value is not ranked (NaN) and the others are ranked among themselves."""
    ranked = [m for m in values if all(np.isfinite(values[m][n]) for n in names)]
    ranks = mean_rank(np.array([[values[m][n] for n in names] for m in ranked]), list(higher_is_better)) if len(ranked) > 1 else [1.0] * len(ranked)
    rank_of = dict(zip(ranked, ranks))
    return {m: float(rank_of.get(m, float("nan"))) for m in values}


def _missing_conditions(trials: pd.DataFrame, models: Sequence[str], excluded: Mapping[str, Sequence[str]]) -> dict:
    """{model: {experiment: [conditions]}}: the kept conditions the humans have and a model has no decisions in."""
    dropped = {(d, condition_key(c)) for d, conditions in excluded.items() for c in conditions}
    kept = trials[[(d, condition_key(c)) not in dropped for d, c in zip(trials["dataset"], trials["condition"])]]
    conditions = {d: set(g["condition"]) for d, g in kept[~kept["subject"].isin(models)].groupby("dataset")}
    has = {(m, d): set(g["condition"]) for (m, d), g in kept[kept["subject"].isin(models)].groupby(["subject", "dataset"])}
    missing = {m: {d: condition_order(c - has.get((m, d), set()), d) for d, c in conditions.items() if c - has.get((m, d), set())}
               for m in models}
    return {m: per for m, per in missing.items() if per}


def _conditions_as_humans_spell_them(models: pd.DataFrame, humans: pd.DataFrame) -> pd.DataFrame:
    """The models' conditions in the humans' spelling where they name the same condition (``1.0`` and ``1``: a table that
    went through pandas); a condition the humans do not have is an error, named before any analysis."""
    spelling = {(d, condition_key(c)): c for d, c in zip(humans["dataset"], humans["condition"])}
    keys = [(d, condition_key(c)) for d, c in zip(models["dataset"], models["condition"])]
    unknown = sorted({(s, d, c) for s, d, c, k in zip(models["subject"], models["dataset"], models["condition"], keys) if k not in spelling})
    if unknown:
        named = "; ".join(f"{s} in {d}: condition {c!r}" for s, d, c in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        datasets = sorted({d for _, d, _ in unknown})
        theirs = {d: condition_order(humans.loc[humans["dataset"] == d, "condition"].unique(), d) for d in datasets}
        raise ValueError(f"model decisions in conditions the humans do not have ({named}); the humans' conditions are {theirs}")
    return models.assign(condition=[spelling[k] for k in keys])


def _human_consistency(pairs: pd.DataFrame) -> pd.DataFrame:
    """:func:`consistency_summary` over the human-human pairs; none (every experiment has one subject): no rows."""
    if (pairs["kind"] == "human-human").any():
        return consistency_summary(pairs)
    return pd.DataFrame(columns=["dataset", "condition", "n_pairs", "n_defined", "mean", "std", "min", "max", "observed_mean"])


def _human_consistency_per_experiment(pairs: pd.DataFrame, excluded: Mapping[str, Sequence[str]]) -> dict:
    """{experiment: human-human error consistency} in the benchmark's nesting (each pair's mean over the conditions not in
    ``excluded``, then the mean over pairs: :func:`perceptual.metrics.aggregate_trials`); experiments with one subject
    are absent."""
    human = pairs[pairs["kind"] == "human-human"]
    human = human[[not is_excluded(d, c, excluded) for d, c in zip(human["dataset"], human["condition"])]]
    if human.empty:
        return {}
    per_pair = human.groupby(["dataset", "subject_a", "subject_b"])["error_consistency"].mean()
    return {d: float(v) for d, v in per_pair.groupby(level="dataset").mean().items()}


def _human_rows(data: Mapping) -> list[tuple[dict, dict]]:
    """(accuracy, error consistency) per experiment and condition, in the accuracy table's order: an experiment with one
    human subject keeps its accuracy row, with no pair (0 pairs, "–")."""
    consistency = {(r["dataset"], r["condition"]): r for r in data["human_error_consistency"]}
    none = {"n_pairs": 0, "mean": None, "std": None, "min": None, "max": None, "observed_mean": None}
    return [(a, consistency.get((a["dataset"], a["condition"]), {**none, "dataset": a["dataset"], "condition": a["condition"]}))
            for a in data["human_accuracy"]]


def _pair_count(row: Mapping) -> str:
    """A condition's pair count, with how many have a defined error consistency where some do not (no shared image, or
    both subjects always right or always wrong): the mean is over those alone."""
    defined = row.get("n_defined", row["n_pairs"])
    return str(row["n_pairs"]) if defined == row["n_pairs"] else f"{defined} defined of {row['n_pairs']}"


OUTPUT_TABLES = ("accuracy", "accuracy_humans", "pairs", "error_consistency_humans", "shape_bias", "shape_bias_per_category")


def _clear_previous_outputs(out: Path) -> None:
    """Remove what an earlier run wrote to ``out`` (its report first), so that a rerun that writes fewer tables or figures,
    or stops half-way, leaves no file of the old run beside the new ones. Other files stay."""
    for path in [out / "report.json", out / "summary.md", *(out / "tables" / f"{name}.csv" for name in OUTPUT_TABLES),
                 *(out / "figures" / f"{name}.png" for name in ("accuracy", "error_consistency", "shape_bias")),
                 *(out / "figures").glob("matrix_*.png")]:
        path.unlink(missing_ok=True)


def analyse(root: str | Path, out: str | Path, *, experiments: Sequence[str] | None = None, models: Sequence[str | Path] = (),
            strict: bool = True, on_undefined: str = "nan", figures: bool = True, benchmark_exclusions: bool = True) -> dict:
    """The command's work in Python (module docstring); returns what ``report.json`` holds."""
    started = time.perf_counter()
    if root is None:
        raise ValueError("root is not set: pass root=PATH, the benchmark's raw-data folder (<root>/<experiment>/*.csv)")
    if on_undefined not in ("nan", "one"):
        raise ValueError(f"on_undefined must be nan or one, got {on_undefined!r}")
    experiments, models = as_list(experiments, "experiments"), as_list(models, "models") or []
    humans, report = read_trials(expand_path(root), experiments=experiments, strict=strict)
    not_human = sorted(s for s in humans["subject"].unique() if not str(s).startswith("subject-"))
    if not_human:
        raise ValueError(f"subjects {not_human[:5]} under root do not look human (names start with 'subject-'); pass model files as models=")
    model_report, model_names = None, []
    trials = humans
    if models:
        model_trials, model_report = read_trials([expand_path(m) for m in models], strict=strict)
        if experiments is not None:  # the humans' trials are read for these alone; so are the models'
            model_trials = model_trials[model_trials["dataset"].isin(experiments)]
            if model_trials.empty:
                raise ValueError(f"the models have no decisions in experiments {sorted(experiments)}: add their files or choose other experiments")
        model_names = sorted(model_trials["subject"].unique())
        clash = [s for s in model_names if str(s).startswith("subject-")]
        if clash:
            raise ValueError(f"model subjects {clash} start with 'subject-', the prefix of human observers; rename them")
        unknown = sorted(set(model_trials["dataset"]) - set(humans["dataset"]))
        if unknown:
            raise ValueError(f"model decisions for experiment(s) {unknown} that have no human trials under {root}")
        model_trials = _conditions_as_humans_spell_them(model_trials, humans)
        check_shared_images(humans, model_trials)
        trials = pd.concat([humans, model_trials], ignore_index=True)
    # every number first, then the files: a failure leaves the previous run's report as it was
    per_subject = accuracy_per_subject(trials)
    human_accuracy = _in_condition_order(accuracy_summary(per_subject))
    pairs = pairwise_consistency(trials, on_undefined=on_undefined)
    human_consistency = _in_condition_order(_human_consistency(pairs))
    has_cue = CUE_CONFLICT in set(trials["dataset"])
    shape = shape_bias_table(trials) if has_cue else None
    shape_categories = shape_bias_per_category(trials) if has_cue else None
    benchmark = _benchmark(trials, model_names, on_undefined, benchmark_exclusions)
    excluded = mvh_exclusions(zip(humans["dataset"], humans["condition"])) if benchmark_exclusions else {}
    out = Path(out)
    _clear_previous_outputs(out)
    tables = {"accuracy": per_subject, "accuracy_humans": human_accuracy, "pairs": pairs, "error_consistency_humans": human_consistency}
    if has_cue:
        tables.update({"shape_bias": shape, "shape_bias_per_category": shape_categories})
    for name, frame in tables.items():
        atomic_write_text(out / "tables" / f"{name}.csv", frame.to_csv(index=False))
    figure_paths = []
    if figures:
        figure_paths.append(accuracy_figure(per_subject, out / "figures" / "accuracy.png", models=model_names))
        figure_paths.append(error_consistency_figure(pairs, out / "figures" / "error_consistency.png", models=model_names))
        for dataset in sorted(set(pairs["dataset"])):  # an experiment with one observer has no pair to draw
            matrix = consistency_matrix(pairs, dataset)
            figure_paths.append(consistency_matrix_figure(matrix, out / "figures" / f"matrix_{dataset}.png",
                                                          f"{dataset}: error consistency between observers (mean over conditions)"))
        if has_cue:
            figure_paths.append(shape_bias_figure(shape_categories, shape, out / "figures" / "shape_bias.png", models=model_names))
    model_pairs = pairs[pairs["kind"] == "model-human"]
    data = {
        "root": str(root), "experiments": sorted(trials["dataset"].unique()), "on_undefined": on_undefined,
        "reader": report.as_dict(), "model_reader": model_report.as_dict() if model_report else None,
        "n_subjects": {d: int(g["subject"].nunique()) for d, g in humans.groupby("dataset")},
        "human_error_consistency": human_consistency.to_dict(orient="records"),
        "human_error_consistency_per_experiment": _human_consistency_per_experiment(pairs, excluded),
        "human_accuracy": human_accuracy.to_dict(orient="records"),
        "shape_bias": shape.to_dict(orient="records") if has_cue else None,
        "models": model_names,
        "model_accuracy": per_subject[~per_subject["is_human"]].to_dict(orient="records"),
        "model_error_consistency": (model_pairs.groupby(["subject_a", "dataset", "condition"])["error_consistency"].mean()
                                    .rename("mean_over_humans").reset_index().rename(columns={"subject_a": "model"})
                                    .to_dict(orient="records")),
        "benchmark": benchmark,
        "figures": [str(p.relative_to(out)) for p in figure_paths],
    }
    data["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(out / "report.json", plain(data))
    atomic_write_text(out / "summary.md", summary_markdown(data))
    return data


def summary_markdown(data: Mapping) -> str:
    lines = ["# Model-vs-human trials: human baselines", "",
             f"Trials: {data['reader']['rows']} rows from {data['reader']['files']} files under `{data['root']}`, "
             f"{data['reader']['unanswered']} unanswered (counted wrong); problems: {data['reader']['problem_counts'] or 'none'}.", "",
             "## Human-human error consistency per condition (the ceiling for models)", "",
             "| experiment | condition | pairs | error consistency mean ± std [min, max] | observed consistency | human accuracy mean ± std [min, max] |",
             "|---|---|---|---|---|---|"]
    for a, r in _human_rows(data):
        lines.append(f"| {r['dataset']} | {r['condition']} | {_pair_count(r)} | {_fmt(r['mean'])} ± {_fmt(r['std'])} [{_fmt(r['min'])}, "
                     f"{_fmt(r['max'])}] | {_fmt(r['observed_mean'])} | {_fmt(a['mean'])} ± {_fmt(a['std'])} [{_fmt(a['min'])}, {_fmt(a['max'])}] |")
    if data["shape_bias"]:
        lines += ["", "## Shape bias (cue-conflict; shape / (shape + texture) decisions, same-class images excluded)", "",
                  "| observer | conflict trials | shape decisions | texture decisions | shape bias |", "|---|---|---|---|---|"]
        for r in data["shape_bias"]:
            lines.append(f"| {r['subject']} | {r['n_conflict']} | {_fmt(r['shape_decisions'], 0)} | {_fmt(r['texture_decisions'], 0)} | "
                         f"{_fmt(r['shape_bias'])} |")
    if data["benchmark"]:
        excluded = data["benchmark"]["excluded_conditions"]
        scope = ("conditions " + "; ".join(f"{d}: {', '.join(c)}" for d, c in excluded.items()) + " left out, as in the benchmark's table"
                 if excluded else "every condition")
        coverage = f" in experiments {', '.join(data['benchmark']['experiments'])} (those every model has)"
        left = "; ".join(f"{m}: {', '.join(d)}" for m, d in data["benchmark"].get("left_out", {}).items())
        coverage += f"; left out of this table: {left}" if left else ""
        lacking = "; ".join(f"{m}: " + ", ".join(f"{d} {' '.join(c)}" for d, c in per.items())
                            for m, per in data["benchmark"].get("missing_conditions", {}).items())
        coverage += f". Conditions a model has no decisions in (its values average over the others): {lacking}" if lacking else ""
        if not data["models"]:
            coverage = f" in every experiment ({', '.join(data['benchmark']['experiments'])})"
        lines += ["", "## The benchmark's tables (OOD accuracy; accuracy difference, observed and error consistency: conditions, then "
                  "humans, then experiments)", "",
                  f"Over {scope},{coverage}." + (f" {data['benchmark']['note']}." if data["benchmark"].get("note") else "")
                  + " The humans' OOD accuracy pools every human trial of an experiment; their consistency is over pairs of subjects.", "",
                  "| observer | OOD accuracy | OOD rank | accuracy difference | observed consistency | error consistency | mean rank |",
                  "|---|---|---|---|---|---|---|"]
        for m, v in data["benchmark"]["values"].items():
            lines.append(f"| {m} | {_fmt(v['ood_accuracy'])} | {_fmt(data['benchmark']['ood_accuracy_rank'][m], 1)} | "
                         f"{_fmt(v['accuracy_difference'])} | {_fmt(v['observed_consistency'])} | {_fmt(v['error_consistency'])} | "
                         f"{_fmt(data['benchmark']['mean_rank'][m], 2)} |")
        h = data["benchmark"]["humans"]
        if h:
            lines.append(f"| humans | {_fmt(h['ood_accuracy'])} | | {_fmt(h['accuracy_difference'])} | {_fmt(h['observed_consistency'])} | "
                         f"{_fmt(h['error_consistency'])} | |")
    lines += ["", "## Figures", ""] + [f"![{p}]({p})" for p in data["figures"]]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig | Mapping) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    return analyse(container["root"], container["out"], experiments=container.get("experiments"), models=container.get("models") or [],
                   strict=bool(container["strict"]), on_undefined=str(container["on_undefined"]), figures=bool(container["figures"]),
                   benchmark_exclusions=bool(container.get("benchmark_exclusions", True)))


@hydra.main(config_path="pkg://conf", config_name="humans-mvh", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))
    data = run(cfg)
    print(f"read {data['reader']['rows']} trials from {data['reader']['files']} files ({data['reader']['unanswered']} unanswered, "
          f"problems: {data['reader']['problem_counts'] or 'none'})")
    print("human-human error consistency (mean ± std over subject pairs) and human accuracy, per experiment and condition:")
    for a, r in _human_rows(data):
        print(f"  {r['dataset']:>18} {r['condition']:>10}: kappa {_fmt(r['mean'])} ± {_fmt(r['std'])} ({_pair_count(r)} pairs), "
              f"accuracy {_fmt(a['mean'])} ± {_fmt(a['std'])}")
    if data["shape_bias"]:
        rows = {r["subject"]: r for r in data["shape_bias"]}
        humans = [r for r in data["shape_bias"] if r["scope"] == "subject" and r["is_human"]]
        values = [r["shape_bias"] for r in humans]
        print(f"human shape bias: {_fmt(rows['all humans']['shape_bias'])} pooled over {rows['all humans']['n_conflict']} cue-conflict "
              f"trials; mean of {len(values)} subjects {_fmt(rows['mean of humans']['shape_bias'])} (range {_fmt(min(values))}–{_fmt(max(values))})")
        for r in data["shape_bias"]:
            if not r["is_human"]:
                print(f"  {r['subject']}: shape bias {_fmt(r['shape_bias'])}")
    if data["benchmark"]["humans"]:
        bench, h = data["benchmark"], data["benchmark"]["humans"]
        scope = "the benchmark's conditions" if bench["excluded_conditions"] else "every condition"
        print(f"the benchmark's tables over {scope} of {len(bench['experiments'])} experiment(s):")
        print(f"  humans: OOD accuracy {_fmt(h['ood_accuracy'])} (pooled), between subjects: accuracy difference "
              f"{_fmt(h['accuracy_difference'])}, observed consistency {_fmt(h['observed_consistency'])}, "
              f"error consistency {_fmt(h['error_consistency'])}")
        for m, v in bench["values"].items():
            print(f"  {m}: OOD accuracy {_fmt(v['ood_accuracy'])} (rank {_fmt(bench['ood_accuracy_rank'][m], 1)}), error consistency "
                  f"with humans {_fmt(v['error_consistency'])}, mean rank {_fmt(bench['mean_rank'][m], 2)}")
    print(f"report: {(Path(cfg.out) / 'summary.md').resolve()}  ({data['seconds']:.0f} s)")


__all__ = ["analyse", "main", "run", "summary_markdown"]
