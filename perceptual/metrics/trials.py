"""Aggregate a pairwise behavioural metric over a trial table in model-vs-human's nesting.

Follows ``get_raw_benchmark_df`` and ``format_benchmark_df`` in bethgelab/model-vs-human
(``modelvshuman/plotting/plot.py``), which build the "accuracy difference", "observed consistency" and
"error consistency" columns of its benchmark table, and ``get_mean_over_datasets`` for its "OOD accuracy" table
(:func:`ood_accuracy`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from types import MappingProxyType
from typing import Any, Callable, Collection, Hashable, Iterable

import numpy as np

from ._validation import as_binary, as_numpy, check_choice, nanmean
from .behavioural import accuracy_difference, error_consistency, observed_consistency

TRIAL_COLUMNS = ("subject", "dataset", "condition", "image_id", "correct")

# model-vs-human's EXCLUDE_CONDITIONS (plotting/plot.py, applied with EXCLUDE = True before its benchmark table): control
# conditions without a distortion, and conditions where humans score under 20 % (consistency is not meaningful there).
# Names compare as condition_key does: the reference writes false-colour's "True" and uniform-noise's "0.0", its raw CSVs
# "true" and "0.00".
MVH_EXCLUDED_CONDITIONS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "colour": ("cr",),
    "contrast": ("c100", "c03", "c01"),
    "high-pass": ("inf", "0.55", "0.45", "0.4"),
    "low-pass": ("0", "15", "40"),
    "phase-scrambling": ("0", "150", "180"),
    "power-equalisation": ("0",),
    "false-colour": ("True",),
    "rotation": ("0",),
    "eidolonI": ("1-10-10", "64-10-10", "128-10-10"),
    "eidolonII": ("1-3-10", "32-3-10", "64-3-10", "128-3-10"),
    "eidolonIII": ("1-0-10", "16-0-10", "32-0-10", "64-0-10", "128-0-10"),
    "uniform-noise": ("0.0", "0.6", "0.9"),
})


def condition_key(condition: Any) -> str:
    """The name a condition is matched by: lower-case text, and one spelling per number (``"0.00"``, ``"0.0"`` and ``0``
    all give ``"0.0"``). The reference reads its CSVs with pandas, which turns uniform-noise's ``0.00`` into the float
    whose text, ``"0.0"``, its exclusion list holds; the raw CSVs this package reads keep the text as written."""
    text = str(condition).strip().lower()
    try:
        return str(float(text))
    except ValueError:
        return text


def mvh_exclusions(cells: Iterable[tuple[Any, Any]]) -> dict[str, list[str]]:
    """The conditions of :data:`MVH_EXCLUDED_CONDITIONS` among the (dataset, condition) ``cells`` present (e.g.
    ``zip(trials["dataset"], trials["condition"])``), spelt as the cells spell them: the ``exclude`` that reproduces
    the benchmark's table with :func:`aggregate_trials` on the benchmark's trials, or on part of them."""
    present: dict[tuple[str, str], str] = {}
    for dataset, condition in cells:
        present.setdefault((str(dataset), condition_key(condition)), str(condition))
    chosen = {d: [present[(d, condition_key(c))] for c in conditions if (d, condition_key(c)) in present]
              for d, conditions in MVH_EXCLUDED_CONDITIONS.items()}
    return {d: c for d, c in chosen.items() if c}


def is_excluded(dataset: Any, condition: Any, exclude: Mapping[Any, Sequence[Any]] | None) -> bool:
    """Whether ``exclude`` ({dataset: [condition, ...]}) leaves the cell out; condition names compare by :func:`condition_key`."""
    return bool(exclude) and condition_key(condition) in {condition_key(c) for c in exclude.get(str(dataset), ())}


_METRIC_NAMES = ("error_consistency", "observed_consistency", "accuracy_difference")
_METRIC_FUNCTIONS = {error_consistency: "error_consistency", observed_consistency: "observed_consistency",
                     accuracy_difference: "accuracy_difference"}


@dataclass(frozen=True)
class TrialAggregate:
    """Result of :func:`aggregate_trials` (and of :func:`ood_accuracy`).

    ``models``: model → value against humans, averaged over data sets. ``humans``: the human-to-human value
    (distinct pairs), averaged over data sets; NaN when no data set has two humans (for :func:`ood_accuracy`: the
    humans' own pooled accuracy). The ``*_per_dataset`` fields hold the values before the last average.
    """

    metric: str
    models: dict
    humans: float
    models_per_dataset: dict
    humans_per_dataset: dict


def _columns(trials: Any) -> dict[str, list]:
    """The five trial columns as lists, from a dict of columns, a list of row dicts, or a pandas DataFrame."""
    if isinstance(trials, Mapping):
        missing = [c for c in TRIAL_COLUMNS if c not in trials]
        getter = lambda c: as_numpy(trials[c], c).tolist()  # noqa: E731
    elif hasattr(trials, "columns") and hasattr(trials, "iloc"):  # pandas DataFrame, without importing pandas
        missing = [c for c in TRIAL_COLUMNS if c not in trials.columns]
        getter = lambda c: trials[c].to_numpy().tolist()  # noqa: E731
    elif isinstance(trials, Sequence) and not isinstance(trials, (str, bytes)) and all(
        isinstance(row, Mapping) for row in trials
    ):
        missing = [c for c in TRIAL_COLUMNS if trials and c not in trials[0]]
        getter = lambda c: [row[c] for row in trials]  # noqa: E731
    else:
        raise TypeError(
            "trials must be a dict of equal-length columns, a list of row dicts or a pandas DataFrame with columns "
            f"{TRIAL_COLUMNS}; got {type(trials).__name__}"
        )
    if missing:
        raise ValueError(f"trials lack the column(s) {missing}; required: {TRIAL_COLUMNS}")
    try:
        columns = {c: getter(c) for c in TRIAL_COLUMNS}
    except KeyError as err:
        raise ValueError(f"a trial row lacks the column {err}; every row needs {TRIAL_COLUMNS}") from None
    lengths = {c: len(v) for c, v in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"trial columns must have equal lengths, got {lengths}")
    if not columns["subject"]:
        raise ValueError("trials is empty: pass at least one trial")
    columns["correct"] = as_binary(columns["correct"], "correct").tolist()
    return columns


def _cells(columns: dict[str, list]) -> dict[tuple, dict[Hashable, bool]]:
    """(dataset, condition, subject) → {image_id: correct}; a repeated image in one cell is an error."""
    cells: dict[tuple, dict[Hashable, bool]] = defaultdict(dict)
    rows = zip(*(columns[c] for c in TRIAL_COLUMNS))
    for subject, dataset, condition, image_id, correct in rows:
        cell = cells[(dataset, condition, subject)]
        if image_id in cell:
            raise ValueError(
                f"subject {subject!r} has image {image_id!r} twice in dataset {dataset!r}, condition {condition!r}; "
                "each subject must see each image once per condition"
            )
        cell[image_id] = bool(correct)
    return cells


def human_test(humans: Any = None) -> Callable[[Any], bool]:
    """A predicate for human subjects: None (model-vs-human's ``subject-NN`` names), a collection of names, or a predicate."""
    if humans is None:  # model-vs-human names its human observers "subject-01", "subject-02", ...
        return lambda s: str(s).startswith("subject-")
    if callable(humans):
        return humans
    if isinstance(humans, Collection) and not isinstance(humans, (str, bytes)):
        members = set(humans)
        return lambda s: s in members
    raise TypeError(f"humans must be None, a collection of subject ids or a predicate, got {type(humans).__name__}")


def _metric_name(metric: Any) -> str:
    if callable(metric):
        if metric not in _METRIC_FUNCTIONS:
            raise ValueError(f"metric must be one of {_METRIC_NAMES} (or that function), got {metric!r}")
        return _METRIC_FUNCTIONS[metric]
    return check_choice(metric, "metric", _METRIC_NAMES)


def _pair_value(metric: str, cell_a: dict, cell_b: dict, on_undefined: str, where: str, images: str = "same") -> float:
    if metric == "accuracy_difference":  # each observer's own trials; no image matching needed
        return accuracy_difference(np.mean(list(cell_a.values())), np.mean(list(cell_b.values())))
    if images == "shared" and cell_a.keys() != cell_b.keys():
        shared = [k for k in cell_a if k in cell_b]
        if not shared:
            return float("nan")
        cell_a, cell_b = {k: cell_a[k] for k in shared}, {k: cell_b[k] for k in shared}
    if cell_a.keys() != cell_b.keys():
        only_a = len(cell_a.keys() - cell_b.keys())
        only_b = len(cell_b.keys() - cell_a.keys())
        raise ValueError(
            f"{where}: the two observers saw different images ({only_a} only in the first, {only_b} only in the "
            "second); trial-by-trial consistency needs the same images, so filter the table to shared images"
        )
    order = list(cell_a)
    correct_a = np.fromiter((cell_a[k] for k in order), dtype=bool, count=len(order))
    correct_b = np.fromiter((cell_b[k] for k in order), dtype=bool, count=len(order))
    if metric == "observed_consistency":
        return observed_consistency(correct_a, correct_b)
    return error_consistency(correct_a, correct_b, on_undefined=on_undefined)


def _sorted(values: Collection) -> list:
    return sorted(values, key=lambda v: (str(type(v)), v if isinstance(v, (int, float, str)) else str(v)))


def _without_conditions(columns: dict[str, list], exclude: Mapping[Any, Sequence[Any]]) -> dict[str, list]:
    """``columns`` without the trials of the excluded (dataset, condition) cells; an excluded condition that a data set
    of the table lacks is an error (as in the reference), since a misspelt name would otherwise exclude nothing."""
    if not isinstance(exclude, Mapping) or any(isinstance(c, str) or not isinstance(c, Sequence) for c in exclude.values()):
        raise TypeError(f"exclude must map each dataset to a list of its conditions, e.g. {{'colour': ['cr']}}, got {exclude!r}")
    dropped = {(str(d), condition_key(c)) for d, conditions in exclude.items() for c in conditions}
    cells = [(str(d), condition_key(c)) for d, c in zip(columns["dataset"], columns["condition"])]
    datasets = {d for d, _ in cells}
    missing = sorted(cell for cell in dropped - set(cells) if cell[0] in datasets)
    if missing:
        raise ValueError(f"excluded (dataset, condition) cells {missing} do not occur in the trials: check the condition names")
    kept = {name: [v for v, cell in zip(values, cells) if cell not in dropped] for name, values in columns.items()}
    if not kept["subject"]:
        raise ValueError("every trial is in an excluded condition: nothing is left to aggregate")
    return kept


def aggregate_trials(trials: Any, metric: Any = "error_consistency", humans: Any = None,
                     on_undefined: str = "nan", images: str = "same",
                     exclude: Mapping[Any, Sequence[Any]] | None = None) -> TrialAggregate:
    """Average a pairwise metric over conditions, then observers, then data sets, as model-vs-human does.

    ``trials`` has one row per trial with columns subject, dataset, condition, image_id and correct (bool or
    0/1): a dict of equal-length columns, a list of row dicts, or a pandas DataFrame (pandas is not needed).
    ``metric``: "error_consistency", "observed_consistency" or "accuracy_difference" (or that function).
    ``humans``: which subjects are human observers: None (names starting with "subject-", model-vs-human's
    convention), a collection of subject ids, or a predicate; every other subject is a model.

    Nesting, exactly as ``format_benchmark_df`` in bethgelab/model-vs-human:

    0. ``exclude`` ({dataset: [condition, ...]}) leaves those conditions out first; the benchmark's table leaves out
       :data:`MVH_EXCLUDED_CONDITIONS` (controls, and conditions where humans score under 20 %). Default: none.

    1. For each data set d, each model m and each human h of d, and each condition c of d: the metric between
       m's and h's trials in (d, c). Consistency metrics match trials by image_id (both must have seen the same
       images); accuracy difference compares the two accuracies.
    2. Mean over the conditions of d → (m, h, d).  3. Mean over the humans of d → (m, d).
    4. Mean over the data sets m has trials in → m.
    Humans against humans: the same with each unordered pair of distinct humans in place of (m, h), and the
    mean in step 3 taken over pairs.

    Means skip NaN, as pandas' groupby mean in the toolbox does: with ``on_undefined="nan"`` (default) a
    condition where error consistency is undefined (both all right or both all wrong) drops out of the mean;
    ``on_undefined="one"`` counts it as 1.0; with ``exclude=MVH_EXCLUDED_CONDITIONS`` that reproduces model-vs-human's
    benchmark numbers. Every subject of a data set must have trials in every condition of that data set (with
    ``images="shared"``, a condition a subject lacks is one where it shares no image: NaN, skipped), and each data set
    needs at least one human.

    ``images``: ``"same"`` (default, as the benchmark, whose observers all see the same images of a condition): two
    observers who saw different images in a condition are an error. ``"shared"``: the consistency metrics compare the
    images both saw (NaN where they share none, skipped in the means); accuracy difference uses each one's own trials.
    """
    metric_name = _metric_name(metric)
    check_choice(on_undefined, "on_undefined", ("nan", "one"))
    check_choice(images, "images", ("same", "shared"))
    is_human = human_test(humans)
    columns = _columns(trials)
    cells = _cells(_without_conditions(columns, exclude) if exclude else columns)

    layout: dict[Any, dict[Any, set]] = defaultdict(lambda: defaultdict(set))  # dataset → subject → conditions
    for dataset, condition, subject in cells:
        layout[dataset][subject].add(condition)

    models_per_dataset: dict[Any, dict[Any, float]] = {}
    humans_per_dataset: dict[Any, float] = {}
    for dataset in _sorted(layout):
        subjects = layout[dataset]
        conditions = _sorted(set().union(*subjects.values()))
        for subject, seen in subjects.items():
            if len(seen) != len(conditions) and images == "same":
                lacking = _sorted(set(conditions) - seen)
                raise ValueError(f"subject {subject!r} has no trials in dataset {dataset!r}, condition(s) {lacking}")
        human_ids = _sorted(s for s in subjects if is_human(s))
        model_ids = _sorted(s for s in subjects if not is_human(s))
        if not human_ids:
            raise ValueError(
                f"dataset {dataset!r} has no human subjects; pass humans=... to say which subjects are human"
            )

        def over_conditions(a: Any, b: Any, dataset: Any = dataset, conditions: Any = conditions) -> float:
            return nanmean(
                _pair_value(metric_name, cells[(dataset, c, a)], cells[(dataset, c, b)], on_undefined,
                            f"dataset {dataset!r}, condition {c!r}, subjects {a!r} and {b!r}", images)
                if (dataset, c, a) in cells and (dataset, c, b) in cells else float("nan")  # "shared": no image in common
                for c in conditions
            )

        models_per_dataset[dataset] = {m: nanmean(over_conditions(m, h) for h in human_ids) for m in model_ids}
        humans_per_dataset[dataset] = nanmean(over_conditions(a, b) for a, b in combinations(human_ids, 2))

    model_datasets: dict[Any, list[float]] = defaultdict(list)
    for values in models_per_dataset.values():
        for model, value in values.items():
            model_datasets[model].append(value)
    return TrialAggregate(
        metric=metric_name,
        models={m: nanmean(v) for m, v in model_datasets.items()},
        humans=nanmean(humans_per_dataset.values()),
        models_per_dataset=models_per_dataset,
        humans_per_dataset=humans_per_dataset,
    )


def ood_accuracy(trials: Any, humans: Any = None, exclude: Mapping[Any, Sequence[Any]] | None = None) -> TrialAggregate:
    """The benchmark's "OOD accuracy": 16-class accuracy per data set over its kept conditions' trials pooled, then the
    mean over data sets.

    Follows ``get_mean_over_datasets`` with ``SixteenClassAccuracy`` in bethgelab/model-vs-human (``plotting/plot.py``),
    the first of its two benchmark tables: for each data set, a model's accuracy over all its trials in the conditions
    left after ``exclude`` (as in :func:`aggregate_trials`), and the humans' accuracy over every human trial of the data
    set together (one pooled decision maker, not a mean of subjects); then the plain mean over the data sets an observer
    has trials in. ``trials`` and ``humans`` as in :func:`aggregate_trials`; the result's ``humans`` is the pooled human
    value (NaN where no data set has a human).
    """
    is_human = human_test(humans)
    columns = _columns(trials)
    if exclude:
        columns = _without_conditions(columns, exclude)
    totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])  # (dataset, observer) → [correct, trials]
    for subject, dataset, correct in zip(columns["subject"], columns["dataset"], columns["correct"]):
        observer = (True, None) if is_human(subject) else (False, subject)
        total = totals[(dataset, observer)]
        total[0] += int(correct)
        total[1] += 1
    models_per_dataset: dict[Any, dict[Any, float]] = defaultdict(dict)
    humans_per_dataset: dict[Any, float] = {}
    for (dataset, (human, model)), (right, n) in totals.items():
        if human:
            humans_per_dataset[dataset] = right / n
        else:
            models_per_dataset[dataset][model] = right / n
    model_datasets: dict[Any, list[float]] = defaultdict(list)
    for dataset in _sorted(models_per_dataset):
        for model, value in models_per_dataset[dataset].items():
            model_datasets[model].append(value)
    return TrialAggregate(
        metric="ood_accuracy",
        models={m: float(np.mean(v)) for m, v in model_datasets.items()},
        humans=float(np.mean(list(humans_per_dataset.values()))) if humans_per_dataset else float("nan"),
        models_per_dataset={d: models_per_dataset[d] for d in _sorted(models_per_dataset)},
        humans_per_dataset={d: humans_per_dataset[d] for d in _sorted(humans_per_dataset)},
    )
