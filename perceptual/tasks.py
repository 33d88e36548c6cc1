"""The automated observer tasks: an observer answers 2AFC and clustering trials; scores with intervals.

The observer answers as the paper's survey participants were asked to (Nanda et al., AAAI 2023):

- **2AFC**: pick the option perceptually closer to the query. A tie (equal distances within
  ``tie_tolerance``) earns half credit and is counted.
- **Clustering**: assign each row to the column perceptually closest to it; a tie among k columns
  that include the answer earns 1/k. Chance is 1/3.

Accuracy excludes attention checks, whose pass rate is reported separately (an observer that fails
them is broken: it must see identical images as identical). Scores come overall, per seed type and
per target, with 95 % confidence intervals: by default a percentile bootstrap over targets, or
Wilson's score interval (Wilson, 1927; with half-credit ties the credit sum stands for the success
count). The bootstrap is the default because trials are not independent: a clustering trial's three
rows share their columns, a result is a row in about three trials, and the results of one target
share it; Wilson's interval treats every row as a new draw and, on clustering rows, covered the
true accuracy in about 70 % of simulated runs instead of 95 %. Below :data:`perceptual.statistics.SIGN_FLIP_MIN_N`
targets (a converged-only score may have that few) the bootstrap over targets is far too narrow (one target gives an
interval of zero width), and the score takes Wilson's interval instead; ``ci_method`` says which.

Ties follow the survey, not the reference's simulated score: the authors' notebook counts a 2AFC
result correct when ``d(result, target) <= d(result, seed)``, so a tie earns full credit there and
half credit here (a person who sees no difference guesses). Exact ties are rare with LPIPS.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from .observers import Observer
from .statistics import SIGN_FLIP_MIN_N, check_level, percentile_interval

TIE_TOLERANCE = 1e-7


def _index(ids: Sequence[str], id_to_row: Mapping[str, int]) -> torch.Tensor:
    missing = [i for i in ids if i not in id_to_row]
    if missing:
        raise KeyError(f"trial images {missing[:5]} are not in the stimulus set (was the set regenerated after the trials were built?)")
    return torch.tensor([id_to_row[i] for i in ids], dtype=torch.long)


def _check_finite(d: np.ndarray, observer: Observer, trials: pd.DataFrame) -> None:
    """Refuse a NaN or infinite distance ``d`` (one row per trial row): a NaN is no tie and never nearer, so it would be
    scored as a choice."""
    bad = ~np.isfinite(d)
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        first = trials["trial"].tolist()[row] if "trial" in trials else row
        raise ValueError(f"observer {observer.name!r} returned {int(bad.sum())} non-finite distance(s), first in trial {first}: "
                         "check the observer (a registered one must give a finite distance for every pair)")


def judge_2afc(trials: pd.DataFrame, images: torch.Tensor, id_to_row: Mapping[str, int], observer: Observer,
               tie_tolerance: float = TIE_TOLERANCE) -> pd.DataFrame:
    """Per-trial judgements: distances to both options, the choice, credit (1, 0 or 0.5 on a tie)."""
    query = _index(trials["query_id"], id_to_row)
    left, right = _index(trials["left_id"], id_to_row), _index(trials["right_id"], id_to_row)
    d = observer.pairwise(images, torch.cat([query, query]), torch.cat([left, right])).double().numpy()
    d_left, d_right = d[: len(trials)], d[len(trials):]
    _check_finite(np.stack([d_left, d_right], axis=1), observer, trials)
    tie = np.abs(d_left - d_right) <= tie_tolerance
    choice = np.where(tie, "tie", np.where(d_left < d_right, "left", "right"))
    credit = np.where(tie, 0.5, (choice == trials["answer"].to_numpy()).astype(float))
    out = trials.copy()
    out["d_left"], out["d_right"], out["choice"], out["tie"], out["credit"] = d_left, d_right, choice, tie, credit
    out["observer"] = observer.name
    return out


def judge_clustering(trials: pd.DataFrame, images: torch.Tensor, id_to_row: Mapping[str, int], observer: Observer,
                     tie_tolerance: float = TIE_TOLERANCE) -> pd.DataFrame:
    """Per-row judgements: distances to the three columns, the choice, credit (1/k on a k-way tie)."""
    query = _index(trials["query_id"], id_to_row)
    columns = [_index(trials[f"column_{k}"], id_to_row) for k in range(3)]
    d = observer.pairwise(images, query.repeat(3), torch.cat(columns)).double().numpy().reshape(3, -1).T  # (rows, 3)
    _check_finite(d, observer, trials)
    nearest = d <= d.min(axis=1, keepdims=True) + tie_tolerance
    answer = trials["answer"].to_numpy()
    credit = nearest[np.arange(len(d)), answer] / nearest.sum(axis=1)
    out = trials.copy()
    for k in range(3):
        out[f"d_{k}"] = d[:, k]
    out["choice"] = np.where(nearest.sum(axis=1) > 1, -1, d.argmin(axis=1))
    out["tie"], out["credit"] = nearest.sum(axis=1) > 1, credit
    out["observer"] = observer.name
    return out


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be fractional with half-credit ties)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(credit: np.ndarray, clusters: np.ndarray | None = None, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap of the mean credit, resampling whole clusters (e.g. targets) when given."""
    check_level(level)
    rng = np.random.default_rng(seed)
    credit = np.asarray(credit, dtype=float)
    if clusters is None:
        clusters = np.arange(len(credit))
    labels, inverse = np.unique(np.asarray(clusters), return_inverse=True)
    sums = np.bincount(inverse, weights=credit, minlength=len(labels))
    counts = np.bincount(inverse, minlength=len(labels))
    draws = rng.integers(0, len(labels), size=(n_boot, len(labels)))
    return percentile_interval(sums[draws].sum(1) / counts[draws].sum(1), level)


def _per_target(judged: pd.DataFrame) -> tuple[dict[str, float], dict[str, int]]:
    """Each target's mean credit and its number of trials."""
    stats = judged.groupby("target_id", sort=True)["credit"].agg(["mean", "size"])
    return {str(k): float(v) for k, v in stats["mean"].items()}, {str(k): int(v) for k, v in stats["size"].items()}


def summarize(judged: pd.DataFrame, by: str | None = "seed_type", interval: str = "bootstrap", seed: int = 0) -> dict:
    """Accuracy (mean credit) with a 95 % interval, ties and n; overall, per ``by`` group and per target.

    ``interval``: ``"bootstrap"`` resamples targets (the default, see the module docstring); ``"wilson"``
    treats every row as independent. Attention checks are left out of the accuracy and reported as
    ``attention_pass_rate``.
    """
    if interval not in ("wilson", "bootstrap"):
        raise ValueError(f"interval must be 'wilson' or 'bootstrap', got {interval!r}")
    checks = judged[judged["attention_check"]]
    real = judged[~judged["attention_check"]]

    def score(frame: pd.DataFrame) -> dict:
        n, n_targets = len(frame), int(frame["target_id"].nunique())
        credit = frame["credit"].to_numpy(float)
        acc = float(credit.mean()) if n else math.nan
        method = "wilson" if interval == "wilson" or n_targets < SIGN_FLIP_MIN_N else "bootstrap"  # too few targets to resample
        if method == "wilson":
            low, high = wilson_interval(float(credit.sum()), n)
        else:
            low, high = bootstrap_interval(credit, frame["target_id"].to_numpy(), seed=seed)
        return {"accuracy": acc, "ci_low": low, "ci_high": high, "ci_method": method, "n": n, "n_targets": n_targets,
                "ties": int(frame["tie"].sum())}

    out = {"overall": score(real), "interval": interval}
    if by is not None and by in real:
        out[f"by_{by}"] = {str(k): score(g) for k, g in real.groupby(by, sort=True)}
    out["per_target"], out["per_target_trials"] = _per_target(real)  # the trial counts weigh them: the rows pool trials
    if by is not None and by in real:  # per-target scores within each group, for paired statistics across groups
        per_group = {str(group): _per_target(frame) for group, frame in real.groupby(by, sort=True)}
        out[f"per_target_by_{by}"] = {group: scores for group, (scores, _) in per_group.items()}
        out[f"per_target_trials_by_{by}"] = {group: trials for group, (_, trials) in per_group.items()}
    out["attention_pass_rate"] = float(checks["credit"].mean()) if len(checks) else None
    out["attention_checks"] = len(checks)
    return out


def controversial_spread(manifest: pd.DataFrame, images: torch.Tensor, id_to_row: Mapping[str, int], observer: Observer) -> dict:
    """The controversial score of Nanda et al. (AAAI 2023, Section 3.1 and Table 2), per direction.

    For each origin x_0 and direction, the results x_1..x_k (one per random start) are, with x_0, all perceived
    alike by the model that keeps its representation; the score is the mean pairwise perceptual distance among
    {x_0, x_1, ..., x_k} ("all of the x_i, along with x_0"), averaged over origins. Lower: that model's
    invariances are the more perceptually aligned. Beside it: ``to_origin``, the mean distance of the results to
    x_0, and ``among_results``, the mean pairwise distance of the results alone (this toolkit's earlier score,
    which leaves x_0 out).

    Returns ``{direction: {"mean", "std", "n_origins", "per_origin", "to_origin": {"mean", "per_origin"},
    "among_results": {"mean", "per_origin"}}}``. The origin images must be rows of the set (role ``origin``).
    """
    results = manifest[manifest["role"] == "result"]
    needed = {"origin_id", "direction"} - set(results.columns)
    if needed:
        raise ValueError(f"controversial results need columns {sorted(needed)}: is this a controversial set?")
    missing = sorted(set(results["origin_id"]) - set(id_to_row))
    if missing:
        raise KeyError(f"origin images {missing[:5]} are not in the set: the score includes each origin x_0 (Nanda et al. Table 2)")
    pairs_i, pairs_j, keys = [], [], []
    for (direction, origin), group in results.groupby(["direction", "origin_id"], sort=True):
        rows = _index(group["id"], id_to_row).tolist()
        members = [id_to_row[origin]] + rows  # x_0 first
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                pairs_i.append(members[a])
                pairs_j.append(members[b])
                keys.append((direction, origin, a == 0))
    if not keys:
        raise ValueError("every origin needs at least one result to score")
    d = observer.pairwise(images, torch.tensor(pairs_i), torch.tensor(pairs_j)).double().numpy()
    frame = pd.DataFrame(keys, columns=["direction", "origin_id", "with_origin"]).assign(distance=d)
    out = {}
    for direction, group in frame.groupby("direction", sort=True):
        per_origin = group.groupby("origin_id")["distance"].mean()
        to_origin = group[group["with_origin"]].groupby("origin_id")["distance"].mean()
        among = group[~group["with_origin"]].groupby("origin_id")["distance"].mean()
        out[str(direction)] = {
            "mean": float(per_origin.mean()),
            "std": float(per_origin.std(ddof=1)) if len(per_origin) > 1 else 0.0,
            "n_origins": int(len(per_origin)),
            "per_origin": {str(k): float(v) for k, v in per_origin.items()},
            "to_origin": {"mean": float(to_origin.mean()), "per_origin": {str(k): float(v) for k, v in to_origin.items()}},
            "among_results": {"mean": float(among.mean()) if len(among) else math.nan, "per_origin": {str(k): float(v) for k, v in among.items()}},
        }
    return out


def panel_summary(per_observer: Mapping[str, float]) -> dict:
    """Mean ± sample std of one score across a panel's observers.

    The sample std (ddof 1) is wider than the authors' notebook's ``np.std`` (ddof 0) by sqrt(n / (n - 1)):
    a panel is a sample of possible observers, not all of them. With fewer than two scores it is NaN (shown as no
    spread at all), not 0, which would read as observers in perfect agreement."""
    values = np.array([v for v in per_observer.values() if v is not None and not math.isnan(v)], dtype=float)
    return {
        "mean": float(values.mean()) if len(values) else math.nan,
        "std": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
        "observers": dict(per_observer),
    }
