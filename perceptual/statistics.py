"""Statistics a reviewer trusts: paired bootstrap differences between models, and ranking agreement.

* :func:`paired_difference`: two models measured on the same targets by the same observers. The difference of
  their scores is bootstrapped by resampling targets (the pairing is kept: a draw takes both models' score on the
  same target) and, for a panel, observers too (a crossed percentile bootstrap: each draw resamples observers and
  targets independently).
  Efron & Tibshirani (1993), ch. 13; the resampling unit follows the design, as in the per-target intervals of
  :func:`perceptual.tasks.bootstrap_interval`. Given each target's trial count, a model's score in a draw is its
  credit over the drawn targets' trials (a ratio estimator, as that function's), so the difference is that of the
  report's accuracy rows, which pool trials; clustering gives targets different numbers of trials, and the mean of
  per-target scores weighted them equally (a difference of +1.0 beside rows that differed by -1.0).
* :func:`ranking_agreement`: Kendall's tau (scipy, tau-b) between two rankings of the same models, e.g. by 2AFC from
  noise seeds and from training seeds, by random and by hard clustering, or by two observers: Nanda et al.'s
  reliability analysis on the simulated side, with a percentile-bootstrap interval over targets.
* :func:`sign_flip_p_value`: whether a handful of paired differences (one per controversial origin) are centred away
  from 0. The percentile bootstrap of their mean is far too narrow at that size (of 2 origins that agree in sign,
  every draw does: a verdict from a coin toss half the time); the sign-flip test is exact under the null that each
  difference is as likely negative as positive (Fisher's randomisation test, ``scipy.stats.permutation_test``).
"""
from __future__ import annotations

import logging
import math
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import kendalltau, permutation_test

log = logging.getLogger(__name__)

PerTarget = Mapping[str, Mapping[str, float]]  # observer -> target id -> score (or trial count)


def check_level(level: float) -> float:
    """An interval's coverage as a float in (0, 1); 95 or 0 are refused (0 gave a zero-width interval that 'separated')."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating, np.integer)) or not 0 < level < 1:
        raise ValueError(f"level is the interval's coverage, a fraction strictly between 0 and 1 (e.g. 0.95), got {level!r}")
    return float(level)


def check_n_boot(n_boot: int) -> int:
    """The number of bootstrap draws as a positive int (0 gave NaN intervals, a negative number an error that a caller
    skipping undefined comparisons took for "no shared targets")."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot is the number of bootstrap draws, a whole number >= 1 (e.g. 2000), got {n_boot!r}")
    return int(n_boot)


def percentile_interval(draws: Sequence[float] | np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap ``draws`` (NaN, NaN without draws)."""
    draws = np.asarray(draws, dtype=float)
    if not draws.size:
        return math.nan, math.nan
    tail = (1 - check_level(level)) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


ROUND_DECIMALS = 12  # paired differences are rounded to this many decimals: summation noise is not a difference

# Fewer differences than this never reach p < 0.05 in the two-sided sign-flip test: all n agreeing in sign gives 2 / 2^n.
SIGN_FLIP_MIN_N = 6


def sign_flip_p_value(differences: Sequence[float] | np.ndarray, *, n_resamples: int = 9999, seed: int = 0) -> float:
    """Two-sided p-value of the mean of ``differences`` under random sign flips (exact, all 2^n flips, up to
    ``n_resamples``; seeded Monte Carlo above); 1.0 for fewer than two differences."""
    differences = np.asarray(differences, dtype=float)
    if differences.ndim != 1:
        raise ValueError(f"a sign-flip test takes one difference per unit (a 1-D sequence), got shape {differences.shape}")
    if not np.isfinite(differences).all():
        raise ValueError(f"a sign-flip test needs finite differences, got {differences.tolist()}")
    if len(differences) < 2 or not differences.any():
        return 1.0
    result = permutation_test((differences,), np.mean, permutation_type="samples", n_resamples=n_resamples, alternative="two-sided",
                              vectorized=True, axis=-1, random_state=np.random.default_rng(seed))
    return float(result.pvalue)


def _common(a: PerTarget, b: PerTarget) -> tuple[list[str], list[str]]:
    observers = sorted(set(a) & set(b))
    if not observers:
        raise ValueError("the two models share no observer: a paired comparison needs the same observers")
    targets = sorted(set.intersection(*(set(a[o]) & set(b[o]) for o in observers)))
    if not targets:
        raise ValueError("the two models share no target: a paired comparison needs the same targets")
    return observers, targets


def _trial_counts(trials: PerTarget | None, observers: list[str], targets: list[str], name: str) -> np.ndarray:
    """(observers, targets) trial counts, ones (every target weighs the same) without ``trials``."""
    if trials is None:
        return np.ones((len(observers), len(targets)))
    try:
        counts = np.array([[trials[o][t] for t in targets] for o in observers], dtype=float)
    except KeyError as missing:
        raise ValueError(f"{name} has no trial count for {missing}: give one per observer and target of its scores") from None
    if not (np.isfinite(counts).all() and (counts > 0).all()):
        raise ValueError(f"{name} must be positive trial counts (the trials behind each per-target score), got {counts.tolist()}")
    return counts


def _multiplicities(draws: np.ndarray, size: int) -> np.ndarray:
    """(n_boot, size): how often each unit was drawn in each bootstrap draw."""
    counts = np.zeros((len(draws), size))
    np.add.at(counts, (np.arange(len(draws))[:, None], draws), 1)
    return counts


def _panel_accuracy(credit: np.ndarray, counts: np.ndarray, observer_weights: np.ndarray, target_weights: np.ndarray) -> np.ndarray:
    """Each observer's credit over the (weighted) targets' trials, averaged over the (weighted) observers; one value
    per row of the weights (a bootstrap draw)."""
    per_observer = (target_weights @ (credit * counts).T) / (target_weights @ counts.T)  # (draws, observers)
    return (per_observer * observer_weights).sum(1) / observer_weights.sum(1)


def paired_difference(a: PerTarget, b: PerTarget, *, trials_a: PerTarget | None = None, trials_b: PerTarget | None = None,
                      n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Accuracy of ``a`` minus that of ``b`` over observers and targets, with a paired percentile-bootstrap interval.

    ``a`` and ``b`` map observer -> target -> score (e.g. a model's per-target 2AFC credit); ``trials_a`` and
    ``trials_b`` the same keys -> the number of trials behind each score. With them, each observer's accuracy pools
    the targets' trials (the report's rows; :func:`per_target_trials`); without them, every target weighs the same.
    Observers weigh the same. Each bootstrap draw resamples observers (when there are several) and targets with
    replacement, keeping pairs intact. ``separated`` (the interval excludes 0) needs at least
    :data:`SIGN_FLIP_MIN_N` targets: below that the percentile bootstrap is far too narrow (one target gives a
    zero-width interval; with two models alike, 5 targets separated them 14 % of the time instead of 5 %). The
    interval is still given, for what it shows.
    """
    check_level(level)
    check_n_boot(n_boot)
    observers, targets = _common(a, b)
    credit_a, credit_b = (np.array([[x[o][t] for t in targets] for o in observers], dtype=float) for x in (a, b))
    counts_a = _trial_counts(trials_a, observers, targets, "trials_a")
    counts_b = _trial_counts(trials_b, observers, targets, "trials_b")
    rng = np.random.default_rng(seed)
    obs_draw = rng.integers(0, len(observers), size=(n_boot, len(observers))) if len(observers) > 1 else np.zeros((n_boot, 1), dtype=int)
    tgt_draw = rng.integers(0, len(targets), size=(n_boot, len(targets)))
    observer_weights, target_weights = _multiplicities(obs_draw, len(observers)), _multiplicities(tgt_draw, len(targets))

    def difference(obs_w: np.ndarray, tgt_w: np.ndarray) -> np.ndarray:
        return _panel_accuracy(credit_a, counts_a, obs_w, tgt_w) - _panel_accuracy(credit_b, counts_b, obs_w, tgt_w)

    # Rounded far below any score's resolution: a difference that is 0 came out as 1e-17 in one summation order, and a
    # lower bound of that size "separated" two models.
    boots = np.round(difference(observer_weights, target_weights), ROUND_DECIMALS)
    point = float(np.round(difference(np.ones((1, len(observers))), np.ones((1, len(targets)))), ROUND_DECIMALS)[0])
    low, high = percentile_interval(boots, level)
    return {"difference": point, "ci_low": low, "ci_high": high, "level": level,
            "separated": bool((low > 0 or high < 0) and len(targets) >= SIGN_FLIP_MIN_N), "n_targets": len(targets),
            "n_observers": len(observers), "weighting": "trials" if trials_a is not None and trials_b is not None else "targets"}


def ranking_agreement(first: Mapping[str, Mapping[str, float]], second: Mapping[str, Mapping[str, float]], *,
                      trials_first: Mapping[str, Mapping[str, float]] | None = None,
                      trials_second: Mapping[str, Mapping[str, float]] | None = None,
                      n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Kendall's tau between the model rankings by two scores, with a bootstrap interval over targets.

    ``first`` and ``second`` map model -> target -> score; a model's score is its credit over the targets' trials
    when ``trials_first``/``trials_second`` give each score's trial count (model -> target -> n), else the mean
    over the targets (the same targets resampled for both rankings in each draw). Fewer than two models: tau is
    undefined (NaN).
    """
    check_level(level)
    check_n_boot(n_boot)
    models = sorted(set(first) & set(second))
    if len(models) < 2:
        return {"tau": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n_models": len(models), "n_targets": 0}
    targets = sorted(set.intersection(*(set(first[m]) & set(second[m]) for m in models)))
    if not targets:
        raise ValueError("the two rankings share no target")
    x = np.array([[first[m][t] for t in targets] for m in models], dtype=float)
    y = np.array([[second[m][t] for t in targets] for m in models], dtype=float)
    x_counts = _trial_counts(trials_first, models, targets, "trials_first")
    y_counts = _trial_counts(trials_second, models, targets, "trials_second")

    def tau(target_weights: np.ndarray) -> float:
        def scores(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
            return np.round((values * counts) @ target_weights / (counts @ target_weights), ROUND_DECIMALS)  # equal scores tie

        value = kendalltau(scores(x, x_counts), scores(y, y_counts)).statistic
        return float(value) if value == value else math.nan

    rng = np.random.default_rng(seed)
    draws = _multiplicities(rng.integers(0, len(targets), size=(n_boot, len(targets))), len(targets))
    boots = np.array([tau(weights) for weights in draws])
    low, high = percentile_interval(boots[~np.isnan(boots)], level)  # draws with tied means have no tau
    return {"tau": tau(np.ones(len(targets))), "ci_low": low, "ci_high": high, "n_models": len(models), "n_targets": len(targets)}


def per_target_scores(model: Mapping, task: str, seed_type: str | None = None) -> dict[str, dict[str, float]]:
    """observer -> target id -> score of one model of a measure report (``report["models"][label]``) on ``task``,
    optionally for one seed type: the input of :func:`paired_difference`."""
    per_observer = model.get("per_observer", {}).get(task, {})
    if seed_type is None:
        return {o: r.get("per_target", {}) for o, r in per_observer.items()}
    return {o: r.get("per_target_by_seed_type", {}).get(seed_type, {}) for o, r in per_observer.items()}


def per_target_trials(model: Mapping, task: str, seed_type: str | None = None) -> dict[str, dict[str, float]] | None:
    """observer -> target id -> number of trials behind :func:`per_target_scores`' score; None for a report written
    before the counts were kept (its differences then weigh every target the same)."""
    per_observer = model.get("per_observer", {}).get(task, {})
    if seed_type is None:
        trials = {o: r.get("per_target_trials") for o, r in per_observer.items()}
    else:
        trials = {o: r.get("per_target_trials_by_seed_type", {}).get(seed_type) for o, r in per_observer.items()}
    return trials if all(v is not None for v in trials.values()) else None


_warned_target_weighting = False


def _both_or_neither(first, second):
    """Trial counts for both sides, or for neither (a side without them would be weighted otherwise)."""
    global _warned_target_weighting
    if first is None or second is None:
        if not _warned_target_weighting:
            log.warning("a measure report without per-target trial counts (written before they were kept): its paired statistics weigh every "
                        "target the same, where its accuracy rows pool trials; measure it again for differences that match the rows")
            _warned_target_weighting = True
        return None, None
    return first, second


def model_difference(a: Mapping, b: Mapping, task: str, **options) -> dict:
    """:func:`paired_difference` of two models of a measure report (``report["models"][label]``) on ``task``: the
    difference of their accuracy rows, with its interval."""
    trials_a, trials_b = _both_or_neither(per_target_trials(a, task), per_target_trials(b, task))
    return paired_difference(per_target_scores(a, task), per_target_scores(b, task), trials_a=trials_a, trials_b=trials_b, **options)


def measurement_statistics(models: Mapping[str, Mapping], tasks: Sequence[str] = ("2afc", "clustering", "clustering_hard"),
                           n_boot: int = 2000, seed: int = 0) -> dict:
    """For a measure report's models: paired differences between every two models per task (over targets and the
    panel's observers), and ranking agreement across seed types, random vs hard clustering and observers."""
    labels = list(models)
    out: dict = {"paired_differences": {}, "ranking_agreement": {}}
    for task in tasks:
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                try:
                    out["paired_differences"].setdefault(task, {})[f"{a} - {b}"] = model_difference(models[a], models[b], task, n_boot=n_boot, seed=seed)
                except ValueError:
                    continue

    Ranked = tuple[dict[str, dict[str, float]], dict[str, dict[str, float]] | None]  # model -> target -> score, and trial counts

    def panel(task: str, seed_type: str | None = None) -> Ranked:
        """Each model's panel credit per target: its observers' trials pooled (observers judge the same trials)."""
        scores, trials = {}, {}
        for label in labels:
            table, counts = per_target_scores(models[label], task, seed_type), per_target_trials(models[label], task, seed_type)
            targets = sorted(set.intersection(*(set(v) for v in table.values()))) if table else []
            if counts is None:
                scores[label], trials = {t: float(np.mean([table[o][t] for o in table])) for t in targets}, None
                continue
            pooled = {t: sum(counts[o][t] for o in table) for t in targets}
            scores[label] = {t: sum(table[o][t] * counts[o][t] for o in table) / pooled[t] for t in targets}
            if trials is not None:
                trials[label] = pooled
        return scores, trials

    def one_observer(task: str, observer: str) -> Ranked:
        counts = {m: per_target_trials(models[m], task) for m in labels}
        return ({m: per_target_scores(models[m], task).get(observer, {}) for m in labels},
                {m: c[observer] for m, c in counts.items()} if all(c is not None and observer in c for c in counts.values()) else None)

    def measured(task: str, seed_type: str) -> bool:  # a seed type nobody measured has no scores (and no trial counts)
        return all(any(per_target_scores(models[m], task, seed_type).values()) for m in labels)

    if len(labels) >= 2:
        comparisons: dict[str, tuple[Ranked, Ranked]] = {}
        if "2afc" in tasks and measured("2afc", "noise") and measured("2afc", "train"):  # seed_types=[noise] read as an old report
            comparisons["2afc: noise vs train seeds"] = (panel("2afc", "noise"), panel("2afc", "train"))
        if "clustering" in tasks and "clustering_hard" in tasks:
            comparisons["random vs hard clustering"] = (panel("clustering"), panel("clustering_hard"))
        if "clustering" in tasks:
            observers = sorted(models[labels[0]].get("per_observer", {}).get("clustering", {}))
            for i, o1 in enumerate(observers):
                for o2 in observers[i + 1:]:
                    comparisons[f"clustering: {o1} vs {o2}"] = (one_observer("clustering", o1), one_observer("clustering", o2))
        for name, ((first, trials_first), (second, trials_second)) in comparisons.items():
            trials_first, trials_second = _both_or_neither(trials_first, trials_second)
            try:
                out["ranking_agreement"][name] = ranking_agreement(first, second, trials_first=trials_first, trials_second=trials_second,
                                                                   n_boot=n_boot, seed=seed)
            except ValueError:  # e.g. a seed type that was not measured: no shared targets to rank on
                continue
    return out


__all__ = ["SIGN_FLIP_MIN_N", "check_level", "check_n_boot", "measurement_statistics", "model_difference", "paired_difference", "per_target_scores",
           "per_target_trials", "percentile_interval", "ranking_agreement", "sign_flip_p_value"]
