"""Statistics a reviewer trusts: paired bootstrap differences between models, and ranking agreement.

* :func:`paired_difference`: two models measured on the same targets by the same observers. The difference of
  their scores is bootstrapped by resampling targets (the pairing is kept: a draw takes both models' score on the
  same target) and, for a panel, observers too (a crossed percentile bootstrap: each draw resamples observers and
  targets independently).
  Efron & Tibshirani (1993), ch. 13; the resampling unit follows the design, as in the per-target intervals of
  :func:`perceptual.tasks.bootstrap_interval`.
* :func:`ranking_agreement`: Kendall's tau (scipy, tau-b) between two rankings of the same models, e.g. by 2AFC from
  noise seeds and from training seeds, by random and by hard clustering, or by two observers: Nanda et al.'s
  reliability analysis on the simulated side, with a percentile-bootstrap interval over targets.
* :func:`sign_flip_p_value`: whether a handful of paired differences (one per controversial origin) are centred away
  from 0. The percentile bootstrap of their mean is far too narrow at that size (of 2 origins that agree in sign,
  every draw does: a verdict from a coin toss half the time); the sign-flip test is exact under the null that each
  difference is as likely negative as positive (Fisher's randomisation test, ``scipy.stats.permutation_test``).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import kendalltau, permutation_test

PerTarget = Mapping[str, Mapping[str, float]]  # observer -> target id -> score


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


def paired_difference(a: PerTarget, b: PerTarget, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``a - b`` over observers and targets with a paired percentile-bootstrap interval.

    ``a`` and ``b`` map observer -> target -> score (e.g. a model's per-target 2AFC credit). Each bootstrap draw
    resamples observers (when there are several) and targets with replacement, keeping pairs intact. ``separated``
    (the interval excludes 0) needs at least :data:`SIGN_FLIP_MIN_N` targets: below that the percentile bootstrap is
    far too narrow (one target gives a zero-width interval; with two models alike, 5 targets separated them 14 % of
    the time instead of 5 %). The interval is still given, for what it shows.
    """
    check_level(level)
    check_n_boot(n_boot)
    observers, targets = _common(a, b)
    diff = np.array([[a[o][t] - b[o][t] for t in targets] for o in observers], dtype=float)  # (observers, targets)
    rng = np.random.default_rng(seed)
    obs_draw = rng.integers(0, len(observers), size=(n_boot, len(observers))) if len(observers) > 1 else np.zeros((n_boot, 1), dtype=int)
    tgt_draw = rng.integers(0, len(targets), size=(n_boot, len(targets)))
    boots = np.array([diff[np.ix_(o, t)].mean() for o, t in zip(obs_draw, tgt_draw)])
    low, high = percentile_interval(boots, level)
    return {"difference": float(diff.mean()), "ci_low": low, "ci_high": high, "level": level,
            "separated": bool((low > 0 or high < 0) and len(targets) >= SIGN_FLIP_MIN_N), "n_targets": len(targets),
            "n_observers": len(observers)}


def ranking_agreement(first: Mapping[str, Mapping[str, float]], second: Mapping[str, Mapping[str, float]], *,
                      n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Kendall's tau between the model rankings by two scores, with a bootstrap interval over targets.

    ``first`` and ``second`` map model -> target -> score; a model's score is its mean over the targets (the same
    targets resampled for both rankings in each draw). Fewer than two models: tau is undefined (NaN).
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

    def tau(columns: np.ndarray) -> float:
        value = kendalltau(x[:, columns].mean(1), y[:, columns].mean(1)).statistic
        return float(value) if value == value else math.nan

    rng = np.random.default_rng(seed)
    boots = np.array([tau(rng.integers(0, len(targets), len(targets))) for _ in range(n_boot)])
    low, high = percentile_interval(boots[~np.isnan(boots)], level)  # draws with tied means have no tau
    return {"tau": tau(np.arange(len(targets))), "ci_low": low, "ci_high": high, "n_models": len(models), "n_targets": len(targets)}


def per_target_scores(model: Mapping, task: str, seed_type: str | None = None) -> dict[str, dict[str, float]]:
    """observer -> target id -> score of one model of a measure report (``report["models"][label]``) on ``task``,
    optionally for one seed type: the input of :func:`paired_difference`."""
    per_observer = model.get("per_observer", {}).get(task, {})
    if seed_type is None:
        return {o: r.get("per_target", {}) for o, r in per_observer.items()}
    return {o: r.get("per_target_by_seed_type", {}).get(seed_type, {}) for o, r in per_observer.items()}


def measurement_statistics(models: Mapping[str, Mapping], tasks: Sequence[str] = ("2afc", "clustering", "clustering_hard"),
                           n_boot: int = 2000, seed: int = 0) -> dict:
    """For a measure report's models: paired differences between every two models per task (over targets and the
    panel's observers), and ranking agreement across seed types, random vs hard clustering and observers."""
    labels = list(models)

    def per_target(label: str, task: str, seed_type: str | None = None) -> dict[str, dict[str, float]]:
        return per_target_scores(models[label], task, seed_type)

    out: dict = {"paired_differences": {}, "ranking_agreement": {}}
    for task in tasks:
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                try:
                    out["paired_differences"].setdefault(task, {})[f"{a} - {b}"] = paired_difference(
                        per_target(a, task), per_target(b, task), n_boot=n_boot, seed=seed)
                except ValueError:
                    continue

    def panel_mean(label: str, task: str, seed_type: str | None = None) -> dict[str, float]:
        table = per_target(label, task, seed_type)
        targets = sorted(set.intersection(*(set(v) for v in table.values()))) if table else []
        return {t: float(np.mean([table[o][t] for o in table])) for t in targets}

    if len(labels) >= 2:
        comparisons = {}
        if "2afc" in tasks:
            comparisons["2afc: noise vs train seeds"] = ({m: panel_mean(m, "2afc", "noise") for m in labels},
                                                         {m: panel_mean(m, "2afc", "train") for m in labels})
        if "clustering" in tasks and "clustering_hard" in tasks:
            comparisons["random vs hard clustering"] = ({m: panel_mean(m, "clustering") for m in labels},
                                                        {m: panel_mean(m, "clustering_hard") for m in labels})
        if "clustering" in tasks:
            observers = sorted(models[labels[0]].get("per_observer", {}).get("clustering", {}))
            for i, o1 in enumerate(observers):
                for o2 in observers[i + 1:]:
                    comparisons[f"clustering: {o1} vs {o2}"] = ({m: per_target(m, "clustering").get(o1, {}) for m in labels},
                                                                {m: per_target(m, "clustering").get(o2, {}) for m in labels})
        for name, (first, second) in comparisons.items():
            try:
                out["ranking_agreement"][name] = ranking_agreement(first, second, n_boot=n_boot, seed=seed)
            except ValueError:  # e.g. a seed type that was not measured: no shared targets to rank on
                continue
    return out


__all__ = ["SIGN_FLIP_MIN_N", "check_level", "check_n_boot", "measurement_statistics", "paired_difference", "per_target_scores", "percentile_interval",
           "ranking_agreement", "sign_flip_p_value"]
