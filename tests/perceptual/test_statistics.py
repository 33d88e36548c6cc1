"""Paired bootstrap differences and ranking agreement on constructed cases."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perceptual.experiments import correlation_with_interval
from perceptual.statistics import (
    measurement_statistics,
    model_difference,
    paired_difference,
    per_target_scores,
    percentile_interval,
    ranking_agreement,
    sign_flip_p_value,
)
from perceptual.tasks import bootstrap_interval, summarize


def test_a_constant_paired_difference_has_a_zero_width_interval():
    a = {"obs": {f"t{i}": 0.8 for i in range(10)}}
    b = {"obs": {f"t{i}": 0.5 for i in range(10)}}
    r = paired_difference(a, b)
    assert r["difference"] == pytest.approx(0.3) and r["ci_low"] == pytest.approx(0.3) and r["ci_high"] == pytest.approx(0.3)
    assert r["separated"] and r["n_targets"] == 10 and r["n_observers"] == 1


def test_fewer_targets_than_a_test_can_decide_on_never_separate():
    """One target gave a zero-width interval that 'separated' the models; a handful of targets separates two alike models
    far more often than 5 % (the percentile bootstrap is too narrow at that size)."""
    for n in (1, 5):
        a, b = {"obs": {f"t{i}": 1.0 for i in range(n)}}, {"obs": {f"t{i}": 0.5 for i in range(n)}}
        r = paired_difference(a, b)
        assert r["ci_low"] == pytest.approx(0.5) and not r["separated"] and r["n_targets"] == n
    six = paired_difference({"obs": {f"t{i}": 1.0 for i in range(6)}}, {"obs": {f"t{i}": 0.5 for i in range(6)}})
    assert six["separated"]


def test_pairing_removes_the_variation_shared_by_both_models():
    # targets differ a lot in difficulty, but model a is always exactly 0.1 above b: the paired interval is tight
    easy_hard = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6]
    a = {"o1": {f"t{i}": v + 0.1 for i, v in enumerate(easy_hard)}, "o2": {f"t{i}": v + 0.1 for i, v in enumerate(easy_hard)}}
    b = {"o1": {f"t{i}": v for i, v in enumerate(easy_hard)}, "o2": {f"t{i}": v for i, v in enumerate(easy_hard)}}
    r = paired_difference(a, b)
    assert r["difference"] == pytest.approx(0.1) and r["ci_high"] - r["ci_low"] < 1e-12 and r["n_observers"] == 2
    # a symmetric difference around 0 is not separated
    noisy = {"o1": {f"t{i}": (0.2 if i % 2 else -0.2) for i in range(20)}}
    zero = {"o1": {f"t{i}": 0.0 for i in range(20)}}
    r = paired_difference(noisy, zero)
    assert r["difference"] == pytest.approx(0.0) and r["ci_low"] < 0 < r["ci_high"] and not r["separated"]
    with pytest.raises(ValueError, match="share no target"):
        paired_difference({"o": {"x": 1.0}}, {"o": {"y": 1.0}})


def test_ranking_agreement_is_kendalls_tau_between_mean_scores():
    first = {"m1": {"t1": 0.9, "t2": 0.8}, "m2": {"t1": 0.5, "t2": 0.6}, "m3": {"t1": 0.1, "t2": 0.2}}
    same = {"m1": {"t1": 0.7, "t2": 0.7}, "m2": {"t1": 0.4, "t2": 0.4}, "m3": {"t1": 0.0, "t2": 0.1}}
    reversed_ = {m: {t: -v for t, v in s.items()} for m, s in same.items()}
    assert ranking_agreement(first, same)["tau"] == pytest.approx(1.0)
    assert ranking_agreement(first, reversed_)["tau"] == pytest.approx(-1.0)
    assert math.isnan(ranking_agreement({"m1": {"t": 1.0}}, {"m1": {"t": 1.0}})["tau"])


def test_measurement_statistics_reads_a_reports_models():
    def model(level):
        per = {"per_target": {f"t{i}": level for i in range(4)},
               "per_target_by_seed_type": {"noise": {f"t{i}": level for i in range(4)}, "train": {f"t{i}": level for i in range(4)}}}
        return {"per_observer": {task: {"obs": per} for task in ("2afc", "clustering", "clustering_hard")}}

    stats = measurement_statistics({"a": model(0.9), "b": model(0.4)}, n_boot=200)
    assert stats["paired_differences"]["clustering"]["a - b"]["difference"] == pytest.approx(0.5)
    assert stats["ranking_agreement"]["random vs hard clustering"]["tau"] == pytest.approx(1.0)


def test_measurement_statistics_skips_comparisons_whose_tasks_were_not_measured():
    per = {"per_target": {"t0": 0.5, "t1": 0.7}}
    models = {m: {"per_observer": {"2afc": {"obs": per}, "clustering": {"obs": per}}} for m in ("a", "b")}
    stats = measurement_statistics(models, tasks=("2afc", "clustering"), n_boot=50)
    assert "random vs hard clustering" not in stats["ranking_agreement"]
    assert "2afc: noise vs train seeds" not in stats["ranking_agreement"]  # no per-seed-type scores here
    assert stats["paired_differences"]["2afc"]["a - b"]["difference"] == 0.0


def test_one_seed_type_is_not_read_as_an_old_report(caplog, monkeypatch):
    """seed_types=[noise] (the paper's Table 1) with two models logged the warning meant for reports written before
    trial counts were kept, and used up its one warning, so a real old report later went unnamed."""
    import perceptual.statistics as statistics

    monkeypatch.setattr(statistics, "_warned_target_weighting", False)
    per = {"per_target": {"t0": 0.5, "t1": 0.7}, "per_target_trials": {"t0": 2, "t1": 2},
           "per_target_by_seed_type": {"noise": {"t0": 0.5, "t1": 0.7}}, "per_target_trials_by_seed_type": {"noise": {"t0": 2, "t1": 2}}}
    models = {m: {"per_observer": {"2afc": {"obs": per}}} for m in ("a", "b")}
    with caplog.at_level("WARNING", logger="perceptual.statistics"):
        stats = measurement_statistics(models, tasks=("2afc",), n_boot=50)
    assert "written before they were kept" not in caplog.text and not statistics._warned_target_weighting
    assert "2afc: noise vs train seeds" not in stats["ranking_agreement"]


@pytest.mark.parametrize("level", [95, 0, 1.0, -0.5, float("nan"), "0.95"])
def test_an_interval_level_outside_zero_to_one_is_refused(level):
    """level=95 failed inside numpy; level=0 gave a zero-width interval that called two models 'separated'."""
    a = {"o": {"t1": 0.5, "t2": 0.7, "t3": 0.2}}
    b = {"o": {"t1": 0.3, "t2": 0.6, "t3": 0.4}}
    with pytest.raises(ValueError, match="level is the interval's coverage, a fraction strictly between 0 and 1"):
        paired_difference(a, b, level=level)
    with pytest.raises(ValueError, match="level is the interval's coverage"):
        ranking_agreement({"m": a["o"], "n": b["o"]}, {"m": b["o"], "n": a["o"]}, level=level)
    with pytest.raises(ValueError, match="level is the interval's coverage"):
        bootstrap_interval(np.array([0.0, 1.0, 1.0]), level=level)
    with pytest.raises(ValueError, match="level is the interval's coverage"):
        correlation_with_interval([1, 2, 3], [1, 3, 2], level=level)


def test_percentile_interval_is_the_central_share_of_the_draws():
    draws = np.arange(1001, dtype=float)
    assert percentile_interval(draws, 0.95) == pytest.approx((25.0, 975.0))
    assert percentile_interval(draws, 0.5) == (250.0, 750.0)
    assert all(math.isnan(v) for v in percentile_interval([], 0.95))


def test_the_sign_flip_p_value_is_exact_on_small_samples():
    assert sign_flip_p_value([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx(2 / 64)  # only all-positive and all-negative as extreme
    assert sign_flip_p_value([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)  # 5 agreeing origins cannot decide (> 0.05)
    assert sign_flip_p_value([0.5, -0.1, 0.3, 0.4, 0.2, 0.6]) == pytest.approx(4 / 64)  # the -0.1 flipped back is as extreme too
    assert sign_flip_p_value([0.3]) == 1.0 and sign_flip_p_value([0.0, 0.0, 0.0]) == 1.0
    assert 0.0 < sign_flip_p_value(np.linspace(0.1, 1.0, 30), seed=1) < 0.001  # Monte Carlo above 2^13 flips
    with pytest.raises(ValueError, match="finite differences"):
        sign_flip_p_value([0.1, float("nan")])
    with pytest.raises(ValueError, match="1-D sequence"):
        sign_flip_p_value([[0.1, 0.2], [0.3, 0.4]])


def _judged(credits_per_target: dict[str, list[float]], seed_type: str = "noise") -> pd.DataFrame:
    rows = [{"target_id": t, "credit": c, "tie": False, "attention_check": False, "seed_type": seed_type}
            for t, credits in credits_per_target.items() for c in credits]
    return pd.DataFrame(rows)


def _report_model(credits_per_target: dict[str, list[float]]) -> dict:
    summary = summarize(_judged(credits_per_target))
    return {"per_observer": {"clustering": {"obs": summary}}}, summary["overall"]["accuracy"]


def test_a_paired_difference_is_the_difference_of_the_accuracy_rows_when_targets_have_different_trial_counts():
    """Clustering gives targets different numbers of trials; the report's rows pool trials. Weighting every target the
    same gave a difference of the other sign than the rows beside it (README Fig. 6: +1.0 against rows -1.0)."""
    a, row_a = _report_model({"t0": [1.0] * 9 + [0.0], "t1": [0.0, 0.0], "t2": [0.5, 0.5]})  # 10.5 / 14 credits
    b, row_b = _report_model({"t0": [1.0] * 6 + [0.0] * 4, "t1": [1.0, 0.0], "t2": [0.5, 0.5]})  # 8.5 / 14
    assert row_a - row_b == pytest.approx(2 / 14)
    targets_weighted = paired_difference(per_target_scores(a, "clustering"), per_target_scores(b, "clustering"))
    assert targets_weighted["difference"] == pytest.approx((0.3 - 0.5) / 3) and targets_weighted["weighting"] == "targets"  # the old, other sign
    stats = measurement_statistics({"a": a, "b": b}, tasks=("clustering",), n_boot=500)
    r = stats["paired_differences"]["clustering"]["a - b"]
    assert r["difference"] == pytest.approx(row_a - row_b) and r["weighting"] == "trials"
    assert r["ci_low"] <= r["difference"] <= r["ci_high"]
    assert model_difference(a, b, "clustering", n_boot=500) == r


def test_trial_weighted_bootstrap_draws_pool_the_drawn_targets_trials():
    """Each draw is each model's credit over the drawn targets' trials (a target drawn twice counts its trials twice),
    averaged over the drawn observers; with one trial per target it is the plain mean of the old statistic."""
    scores_a = {"o1": {"t0": 1.0, "t1": 0.0, "t2": 0.5}, "o2": {"t0": 0.5, "t1": 0.5, "t2": 1.0}}
    scores_b = {"o1": {"t0": 0.0, "t1": 0.5, "t2": 0.5}, "o2": {"t0": 0.0, "t1": 1.0, "t2": 0.0}}
    trials = {"o1": {"t0": 4, "t1": 1, "t2": 2}, "o2": {"t0": 4, "t1": 1, "t2": 2}}
    r = paired_difference(scores_a, scores_b, trials_a=trials, trials_b=trials, n_boot=300, seed=3)
    rng = np.random.default_rng(3)
    obs_draw, tgt_draw = rng.integers(0, 2, size=(300, 2)), rng.integers(0, 3, size=(300, 3))
    names, targets = ["o1", "o2"], ["t0", "t1", "t2"]

    def accuracy(scores, o, drawn):
        return sum(scores[names[o]][targets[t]] * trials[names[o]][targets[t]] for t in drawn) / sum(trials[names[o]][targets[t]] for t in drawn)

    by_hand = [np.mean([accuracy(scores_a, o, t) - accuracy(scores_b, o, t) for o in obs]) for obs, t in zip(obs_draw, tgt_draw)]
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(percentile_interval(by_hand, 0.95))
    assert r["difference"] == pytest.approx(np.mean([accuracy(scores_a, o, [0, 1, 2]) - accuracy(scores_b, o, [0, 1, 2]) for o in (0, 1)]))
    ones = {o: {t: 1 for t in targets} for o in names}
    assert paired_difference(scores_a, scores_b, trials_a=ones, trials_b=ones, n_boot=300) == {
        **paired_difference(scores_a, scores_b, n_boot=300), "weighting": "trials"}


def test_trial_counts_must_cover_every_score_and_be_positive():
    scores = {"o": {"t0": 0.5, "t1": 1.0}}
    with pytest.raises(ValueError, match="trials_a has no trial count for 't1'"):
        paired_difference(scores, scores, trials_a={"o": {"t0": 3}}, trials_b={"o": {"t0": 3, "t1": 2}})
    with pytest.raises(ValueError, match="trials_b must be positive trial counts"):
        paired_difference(scores, scores, trials_a={"o": {"t0": 3, "t1": 2}}, trials_b={"o": {"t0": 0, "t1": 2}})
    with pytest.raises(ValueError, match="trials_first must be positive"):
        ranking_agreement({"m": scores["o"], "n": scores["o"]}, {"m": scores["o"], "n": scores["o"]},
                          trials_first={"m": {"t0": 1, "t1": float("nan")}, "n": {"t0": 1, "t1": 1}}, trials_second=None)


def test_ranking_agreement_ranks_models_by_their_pooled_trials():
    """m1 leads on the target with most trials, m2 on the other: pooled over trials m1 ranks first, by target means m2."""
    first = {"m1": {"t0": 0.6, "t1": 0.0}, "m2": {"t0": 0.4, "t1": 0.5}}
    trials = {"m1": {"t0": 10, "t1": 1}, "m2": {"t0": 10, "t1": 1}}
    second = {"m1": {"t0": 0.9, "t1": 0.9}, "m2": {"t0": 0.1, "t1": 0.1}}
    assert ranking_agreement(first, second, n_boot=20)["tau"] == pytest.approx(-1.0)
    assert ranking_agreement(first, second, trials_first=trials, trials_second=trials, n_boot=20)["tau"] == pytest.approx(1.0)


def test_a_report_without_trial_counts_weighs_targets_the_same_and_says_so(caplog):
    """Reports written before the counts were kept still compare (as they did), with a warning that the rows pool trials."""
    import perceptual.statistics as statistics

    statistics._warned_target_weighting = False
    old = {m: {"per_observer": {"clustering": {"obs": {"per_target": {"t0": v, "t1": 0.5}}}}} for m, v in (("a", 0.9), ("b", 0.1))}
    with caplog.at_level("WARNING", logger="perceptual.statistics"):
        r = measurement_statistics(old, tasks=("clustering",), n_boot=50)["paired_differences"]["clustering"]["a - b"]
    assert r["difference"] == pytest.approx(0.4) and r["weighting"] == "targets"
    assert "without per-target trial counts" in caplog.text


def test_a_zero_difference_is_zero_not_summation_noise():
    """(0.1 + 0.2) + 0.3 and (0.3 + 0.2) + 0.1 differ in the last bit: the difference came out as 5.6e-17, and a bootstrap
    lower bound of 1.4e-17 marked two models as separated (README Fig. 7: "+12.0 [+0.0, +24.5] *")."""
    a, b = {"o": {"t0": 0.1, "t1": 0.2, "t2": 0.3}}, {"o": {"t0": 0.3, "t1": 0.2, "t2": 0.1}}
    r = paired_difference(a, b, n_boot=500)
    assert r["difference"] == 0.0 and r["ci_low"] <= 0.0 <= r["ci_high"] and not r["separated"]
