"""Trials shared by the simulated observer and human surveys: 2AFC, clustering (random and hard).

Trials are built from a stimulus set's manifest (a table with one row per image: ``id``, ``role``
and, for results, ``target_id``, ``seed_id``, ``seed_type``) and returned as a
:class:`pandas.DataFrame` with the ground truth, deterministically from ``seed``.

Tasks follow Nanda et al. (AAAI 2023, section 2.3 and appendix A.3):

- **2AFC**: the query is an inversion result; the two options are its target and its seed, sides
  randomised with exactly balanced answer positions; the correct answer is the target.
- **Clustering**: three targets as columns; their results as rows (two per target in the paper's
  default); each row's answer is its target's column; chance is 1/3. Triplets are random, or
  **hard**: each anchor target with its two nearest other targets under a given distance.
- **Attention checks**: 2AFC trials whose query IS one option (the target), clustering trials
  whose rows ARE the column targets. ``attention_rate`` is the fraction of trials in the returned
  table that are checks, as near as a whole number of checks allows: ``n_checks = round(rate · n_real / (1 − rate))``
  (rate 0.1 with 100 real trials: 11 checks, 9.9 %).

Columns of a 2AFC table: ``trial, task, query_id, left_id, right_id, answer`` ('left'/'right'),
``target_id, seed_id, seed_type, attention_check``.
Columns of a clustering table (one row per (trial, row)): ``trial, task, row, query_id,
column_0, column_1, column_2, answer`` (0, 1, 2), ``target_id, seed_type, attention_check``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from training.config import check_whole_number

TWO_AFC_COLUMNS = ["trial", "task", "query_id", "left_id", "right_id", "answer", "target_id", "seed_id", "seed_type", "attention_check"]
CLUSTERING_COLUMNS = ["trial", "task", "row", "query_id", "column_0", "column_1", "column_2", "answer", "target_id", "seed_type", "attention_check"]
TASKS = ("2afc", "clustering", "clustering_hard")


def _results(manifest: pd.DataFrame) -> pd.DataFrame:
    missing = {"id", "role", "target_id", "seed_id", "seed_type"} - set(manifest.columns)
    if missing:
        raise ValueError(f"the manifest lacks columns {sorted(missing)}: build trials from an inversion set's manifest")
    results = manifest[manifest["role"] == "result"]
    if results.empty:
        raise ValueError("the manifest has no rows with role 'result': is the set complete? (stimuli.load_set checks)")
    return results.sort_values("id").reset_index(drop=True)


def check_attention_rate(rate: float) -> None:
    """The fraction of attention checks among all trials: in [0, 1)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(f"attention_rate must be a fraction of the trials in [0, 1), got {rate!r}")


def attention_check_count(n_real: int, rate: float) -> int:
    """How many checks to add to ``n_real`` trials so that they are the fraction ``rate`` of all: at least one when
    ``rate`` > 0 (a rate that rounds to none on a few trials would silently leave them without any)."""
    check_attention_rate(rate)
    return max(int(round(rate * n_real / (1 - rate))), int(rate > 0 and n_real > 0))


def balanced_sides(n: int, rng: np.random.Generator, odd_left: bool | None = None) -> np.ndarray:
    """n booleans (True = target on the left), half each, in random order; the odd one out is on the left when
    ``odd_left`` says so, at random when it is None."""
    left = np.zeros(n, dtype=bool)
    if odd_left is None:
        odd_left = bool(n % 2) and rng.random() < 0.5
    left[: n // 2 + (n % 2 and odd_left)] = True
    return rng.permutation(left)


def two_afc_trials(manifest: pd.DataFrame, seed: int = 0, attention_rate: float = 0.0) -> pd.DataFrame:
    """One 2AFC trial per inversion result (query = result, options = its target and seed)."""
    rng = np.random.default_rng(seed)
    results = _results(manifest)
    n_real = len(results)
    n_checks = attention_check_count(n_real, attention_rate)
    queries = list(results["id"])
    targets, seeds, seed_types = list(results["target_id"]), list(results["seed_id"]), list(results["seed_type"])
    checks = rng.choice(n_real, size=n_checks, replace=n_checks > n_real)
    for i in checks:  # the query is the target itself: anyone paying attention gets it right
        queries.append(targets[i])
        targets.append(targets[i])
        seeds.append(seeds[i])
        seed_types.append(seed_types[i])
    is_check = np.r_[np.zeros(n_real, bool), np.ones(n_checks, bool)]
    # Balance answer sides within every seed type, separately among real trials and among checks: the scores are
    # reported per seed type, and an uneven split there would mix a side bias of people into the comparison.
    groups = pd.Series(list(zip(is_check, map(str, seed_types))))
    target_left = np.zeros(len(queries), dtype=bool)
    for _, index in sorted(groups.groupby(groups).indices.items()):
        target_left[index] = balanced_sides(len(index), rng)
    table = pd.DataFrame(
        {
            "task": "2afc",
            "query_id": queries,
            "left_id": np.where(target_left, targets, seeds),
            "right_id": np.where(target_left, seeds, targets),
            "answer": np.where(target_left, "left", "right"),
            "target_id": targets,
            "seed_id": seeds,
            "seed_type": seed_types,
            "attention_check": is_check,
        }
    )
    table = table.iloc[rng.permutation(len(table))].reset_index(drop=True)
    table.insert(0, "trial", np.arange(len(table)))
    return table[TWO_AFC_COLUMNS]


def nearest_triplets(distances: pd.DataFrame, anchors: Sequence[str], distinct: bool = True) -> list[tuple[str, str, str]]:
    """Each anchor with its two nearest other targets under ``distances`` (a square table indexed by id).

    Nanda et al. (AAAI 2023, Appendix A) pair each target with its two nearest. Two targets that are each other's nearest
    then give the same three targets twice: the same trial (the rows are the three targets' results), counted twice in the
    score and shown twice to people. With ``distinct`` (the default; a deliberate difference) an anchor whose nearest
    triplet is taken gets the hardest one still free: the pair whose farther member ranks nearest the anchor, then whose
    nearer one does. Only where every triplet of an anchor is taken (a handful of targets) does a triplet repeat."""
    if list(distances.index) != list(distances.columns):
        raise ValueError("target_distances must be a square table with the same ids as index and columns")
    out, used = [], set()
    for anchor in anchors:
        if anchor not in distances.index:
            raise ValueError(f"target {anchor!r} is missing from target_distances")
        ranked = list(distances.loc[anchor].drop(anchor).sort_values(kind="stable").index)
        pairs = ((ranked[near], ranked[far]) for far in range(1, len(ranked)) for near in range(far))  # hardest first
        nearest = (ranked[0], ranked[1])
        pair = next((p for p in pairs if frozenset((anchor, *p)) not in used), nearest) if distinct else nearest
        used.add(frozenset((anchor, *pair)))
        out.append((anchor, *pair))
    return out


def clustering_trials(
    manifest: pd.DataFrame,
    seed: int = 0,
    attention_rate: float = 0.0,
    hard: bool = False,
    target_distances: pd.DataFrame | None = None,
    n_trials: int | None = None,
) -> pd.DataFrame:
    """Clustering trials: one triplet per anchor target (all targets, or ``n_trials`` drawn at random).

    Random triplets pair the anchor with two other targets drawn uniformly (independently: a triplet may repeat); hard
    triplets (``hard=True``) with its two nearest under ``target_distances`` (square, indexed by target id), no triplet
    twice while another is free (:func:`nearest_triplets`).
    """
    rng = np.random.default_rng(seed)
    results = _results(manifest)
    by_target = {t: group for t, group in results.groupby("target_id", sort=True)}
    target_ids = sorted(by_target)
    if len(target_ids) < 3:
        raise ValueError(f"clustering needs at least 3 targets with results, the set has {len(target_ids)}")
    if hard and target_distances is None:
        raise ValueError("hard clustering needs target_distances (a square table of distances between target ids)")
    if n_trials is not None:
        check_whole_number(n_trials, "n_trials", hint=" (or None for one triplet per target)")
    n_trials = len(target_ids) if n_trials is None else n_trials
    anchors = list(rng.choice(target_ids, size=n_trials, replace=n_trials > len(target_ids)))
    if hard:
        missing = [t for t in target_ids if t not in target_distances.index or t not in target_distances.columns]
        if missing:
            raise ValueError(
                f"target_distances lacks targets {missing[:5]}{' ...' if len(missing) > 5 else ''}: give distances "
                "between all targets that have results (stimuli.target_distances(set) builds the table)"
            )
        triplets = nearest_triplets(target_distances.loc[target_ids, target_ids], anchors)
    else:
        triplets = []
        for anchor in anchors:
            others = [t for t in target_ids if t != anchor]
            a, b = rng.choice(len(others), size=2, replace=False)
            triplets.append((anchor, others[a], others[b]))
    n_checks = attention_check_count(len(triplets), attention_rate)
    check_triplets = [triplets[i] for i in rng.choice(len(triplets), size=n_checks, replace=n_checks > len(triplets))]

    trials = [(t, False) for t in triplets] + [(t, True) for t in check_triplets]
    order = rng.permutation(len(trials))
    rows = []
    for trial_number, index in enumerate(order):
        triplet, is_check = trials[index]
        columns = list(rng.permutation(triplet))
        if is_check:  # rows are the column targets themselves, each as often as its results are rows in a real trial
            queries = [(t, t, "target") for t in triplet for _ in range(len(by_target[t]))]
        else:
            queries = [(r.id, t, r.seed_type) for t in triplet for r in by_target[t].itertuples()]
        for row_number, q in enumerate(rng.permutation(len(queries))):
            query_id, target_id, seed_type = queries[q]
            rows.append(
                {
                    "trial": trial_number,
                    "task": "clustering_hard" if hard else "clustering",
                    "row": row_number,
                    "query_id": query_id,
                    "column_0": columns[0],
                    "column_1": columns[1],
                    "column_2": columns[2],
                    "answer": columns.index(target_id),
                    "target_id": target_id,
                    "seed_type": seed_type,
                    "attention_check": is_check,
                }
            )
    return pd.DataFrame(rows, columns=CLUSTERING_COLUMNS)


def make_trials(manifest: pd.DataFrame, task: str, seed: int = 0, attention_rate: float = 0.0, target_distances=None, n_trials=None) -> pd.DataFrame:
    """Dispatch by task name: ``2afc``, ``clustering`` or ``clustering_hard``. ``n_trials`` is the clustering tasks'
    (2AFC makes one trial per result: a survey takes subsets of it with ``trials_per_survey``)."""
    if task == "2afc":
        if n_trials is not None:
            raise ValueError(
                f"n_trials={n_trials!r} applies to the clustering tasks: 2afc makes one trial per result; leave n_trials "
                "unset (null), and take subsets in the survey (trials_per_survey)"
            )
        return two_afc_trials(manifest, seed, attention_rate)
    if task in ("clustering", "clustering_hard"):
        return clustering_trials(manifest, seed, attention_rate, task == "clustering_hard", target_distances, n_trials)
    raise ValueError(f"unknown task {task!r}: use one of {TASKS}")
