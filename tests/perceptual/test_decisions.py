"""Observer decisions: exemplar draws, the noisy k-NN rule with lapses, trial tables, and a panel on digits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from perceptual.decisions import (
    TRIAL_TABLE_COLUMNS,
    ObserverDecisions,
    draw_exemplars,
    knn_decide,
    model_trials,
    subject_name,
    trial_table,
)
from perceptual.metrics import aggregate_trials
from perceptual.observers import make_observer
from stimuli.distortions import Distortion
from training import load_dataset


def test_draw_exemplars_is_stratified_seeded_and_per_class():
    labels = torch.tensor([0] * 6 + [1] * 4 + [2] * 5)
    chosen = draw_exemplars(labels, 3, seed=4)
    assert labels[chosen].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and len(set(chosen.tolist())) == 9
    assert torch.equal(chosen, draw_exemplars(labels, 3, seed=4))
    draws = {tuple(draw_exemplars(labels, 3, seed=s).tolist()) for s in range(6)}
    assert len(draws) > 3  # different seeds, different exemplars
    # class 2's draw does not depend on the other classes
    assert torch.equal(chosen[6:] - 10, draw_exemplars(labels[10:], 3, seed=4))
    with pytest.raises(ValueError, match="class 1 has only 4 images"):
        draw_exemplars(labels, 5, seed=0)


def test_knn_rule_votes_and_breaks_ties_by_summed_distance():
    labels = torch.tensor([0, 0, 1, 1, 2])
    distances = torch.tensor([
        [0.1, 0.9, 0.2, 0.3, 0.8],  # k=3 nearest: 0 (class 0), 2, 3 (class 1) -> class 1 by vote
        [0.5, 0.6, 0.9, 0.9, 0.05],  # nearest: 4 (class 2), 0, 1 (class 0) -> class 0 by vote
        [0.2, 0.9, 0.1, 0.9, 0.9],  # k=2 below
    ])
    responses, probs = knn_decide(distances, labels, 3, k=3)
    assert responses[:2].tolist() == [1, 0]
    torch.testing.assert_close(probs[0], torch.tensor([1 / 3, 2 / 3, 0.0]))
    # k=2: row 2 has one vote each for classes 0 (0.2) and 1 (0.1): the closer class wins the tie
    responses, _ = knn_decide(distances, labels, 3, k=2)
    assert responses[2] == 1
    responses, _ = knn_decide(distances, labels, 3, k=1)
    assert responses.tolist() == [0, 2, 1]


def test_lapses_answer_uniformly_at_random_at_the_given_rate():
    n, classes = 4000, 4
    distances = torch.rand(n, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(8) % classes
    ids = torch.arange(n)
    clean, _ = knn_decide(distances, labels, classes, k=1)
    lapsed, probs = knn_decide(distances, labels, classes, k=1, lapse=0.4, seed=3, image_ids=ids)
    changed = (lapsed != clean).float().mean().item()
    assert changed == pytest.approx(0.4 * (1 - 1 / classes), abs=0.03)
    torch.testing.assert_close(probs.sum(1), torch.ones(n))
    _, all_lapse = knn_decide(distances, labels, classes, k=1, lapse=1.0, seed=3, image_ids=ids)
    torch.testing.assert_close(all_lapse, torch.full((n, classes), 1 / classes))
    counts = np.bincount(knn_decide(distances, labels, classes, k=1, lapse=1.0, seed=3, image_ids=ids)[0].numpy(), minlength=classes)
    assert counts.min() > 0.2 * n  # roughly uniform


def test_noisy_decisions_are_keyed_by_image_seed_and_condition_not_batch():
    distances = torch.rand(50, 20, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(20) % 5
    ids = torch.arange(100, 150)
    kwargs = dict(k=3, lapse=0.1, noise=1.0, seed=7, condition_key=11)
    full, _ = knn_decide(distances, labels, 5, image_ids=ids, **kwargs)
    part, _ = knn_decide(distances[10:13], labels, 5, image_ids=ids[10:13], **kwargs)
    assert torch.equal(full[10:13], part)
    assert torch.equal(full, knn_decide(distances, labels, 5, image_ids=ids, **kwargs)[0])
    other_seed, _ = knn_decide(distances, labels, 5, image_ids=ids, **{**kwargs, "seed": 8})
    other_condition, _ = knn_decide(distances, labels, 5, image_ids=ids, **{**kwargs, "condition_key": 12})
    assert not torch.equal(full, other_seed) and not torch.equal(full, other_condition)


def test_decision_noise_is_scale_free():
    distances = torch.rand(30, 12, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(12) % 3
    ids = torch.arange(30)
    a, _ = knn_decide(distances, labels, 3, k=3, noise=0.7, seed=1, image_ids=ids)
    b, _ = knn_decide(1000 * distances + 5, labels, 3, k=3, noise=0.7, seed=1, image_ids=ids)
    assert torch.equal(a, b)


def test_bad_decision_inputs_are_refused():
    d, labels = torch.rand(4, 6), torch.arange(6) % 2
    with pytest.raises(ValueError, match="k must be an int in"):
        knn_decide(d, labels, 2, k=7)
    with pytest.raises(ValueError, match="lapse is a probability"):
        knn_decide(d, labels, 2, lapse=1.5, image_ids=torch.arange(4))
    with pytest.raises(ValueError, match="image_ids are needed"):
        knn_decide(d, labels, 2, noise=0.5)
    for noise in (math.inf, math.nan, -0.1):  # the panel's rule, so a direct call cannot turn subjects into coins
        with pytest.raises(ValueError, match="noise must be finite and >= 0"):
            knn_decide(d, labels, 2, noise=noise, image_ids=torch.arange(4))
    with pytest.raises(ValueError, match="one label per exemplar"):
        knn_decide(d, labels[:5], 2)
    with pytest.raises(ValueError, match="NaN"):
        knn_decide(torch.full((2, 6), math.nan), labels, 2)
    with pytest.raises(ValueError, match="class indices"):
        trial_table("m", "d", "c", [0, 1], [0, 5], [0, 1], ["a", "b"])


def test_panel_checks_k_against_the_classes_present_in_the_exemplar_split():
    observers = [make_observer("pixel-l2")]
    images, labels = torch.rand(8, 3, 4, 4), torch.tensor([0, 0, 0, 0, 2, 2, 2, 2])  # classes 0 and 2 of 3 present
    with pytest.raises(ValueError, match=r"k must be an int in \[1, per_class × classes present in the exemplar split = 2 × 2\]"):
        ObserverDecisions(observers, images, labels, ["a", "b", "c"], per_class=2, k=5)
    panel = ObserverDecisions(observers, images, labels, ["a", "b", "c"], seeds=(0,), per_class=2, k=4, lapse=0.0, noise=0.0)
    table, _ = panel.decide({"pixel-l2": panel.distances(images, observers[0])}, torch.arange(8), labels, dataset="toy", condition="clean")
    assert len(table) == 8
    with pytest.raises(ValueError, match=r"exemplar_labels must be class indices in \[0, 2\)"):
        ObserverDecisions(observers, images, labels, ["a", "b"], per_class=2, k=1)
    for noise in (math.nan, math.inf, -0.1):  # NaN passed `noise < 0` and failed only after the distances
        with pytest.raises(ValueError, match="noise must be finite and >= 0"):
            ObserverDecisions(observers, images, labels, ["a", "b", "c"], per_class=2, k=1, noise=noise)
    with pytest.raises(ValueError, match="lapse is a probability"):
        ObserverDecisions(observers, images, labels, ["a", "b", "c"], per_class=2, k=1, lapse=math.nan)


def test_trial_tables_of_models_and_subjects_feed_the_metric_suite():
    classes = ["a", "b", "c"]
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    ids = list(range(6))
    subject = trial_table(subject_name("LPIPS-alex [random backbone]", 2), "toy", "clean", ids, labels, torch.tensor([0, 1, 0, 0, 2, 2]), classes)
    assert tuple(subject.columns) == TRIAL_TABLE_COLUMNS
    assert subject["subject"][0] == "subject-lpips-alex-random-backbone-s2"
    assert subject["category"].tolist() == ["a", "b", "c", "a", "b", "c"] and subject["response"][2] == "a"
    same = model_trials("same-errors", torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 0, 0, 2]), 3).float(), labels, ids, classes, "toy", "clean")
    other = model_trials("other-errors", torch.nn.functional.one_hot(torch.tensor([1, 1, 2, 0, 1, 1]), 3).float(), labels, ids, classes, "toy", "clean")
    import pandas as pd

    result = aggregate_trials(pd.concat([subject, same, other]), "error_consistency")
    assert result.models["same-errors"] == pytest.approx(1.0)
    assert result.models["other-errors"] < 0


@pytest.fixture(scope="module")
def digits_panel():
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    observers = [make_observer("lpips-random-backbone"), make_observer("lpips-no-heads-random")]
    panel = ObserverDecisions(observers, train.images, train.labels, train.classes, seeds=(0, 1), per_class=5, k=3, lapse=0.0, noise=0.0)
    index = torch.arange(0, len(test), 5)  # 90 test images
    return panel, test.float_images(index), test.labels[index], index


def _panel_accuracy(panel, images, labels, ids, condition: str) -> dict:
    distances = {o.name: panel.distances(images, o) for o in panel.observers}
    table, probs = panel.decide(distances, ids, labels, dataset="digits", condition=condition)
    assert set(probs) == set(panel.subject_names) and all(p.shape == (len(ids), 10) for p in probs.values())
    return table.groupby("subject")["correct"].mean().to_dict()


def test_observer_panel_on_digits_beats_chance_and_degrades_with_noise(digits_panel):
    panel, images, labels, ids = digits_panel
    assert len(panel.subjects) == 4 and all(s.startswith("subject-") for s in panel.subject_names)
    assert len({tuple(s.exemplars.tolist()) for s in panel.subjects}) == 4  # every subject has its own exemplars
    accuracy = {w: _panel_accuracy(panel, Distortion("uniform_noise", w)(images, ids, seed=0), labels, ids, f"uniform_noise={w}")
                for w in (0.0, 0.35, 0.9)}
    clean = np.mean(list(accuracy[0.0].values()))
    assert min(accuracy[0.0].values()) > 0.6  # chance is 0.1
    assert clean > np.mean(list(accuracy[0.35].values())) + 0.05 > np.mean(list(accuracy[0.9].values())) + 0.1


def test_decision_noise_and_lapses_lower_the_panels_accuracy(digits_panel):
    panel, images, labels, ids = digits_panel
    distances = {o.name: panel.distances(images, o) for o in panel.observers}

    def mean_accuracy(noise: float, lapse: float) -> float:
        panel.noise, panel.lapse = noise, lapse
        table, _ = panel.decide(distances, ids, labels, dataset="digits", condition="clean")
        return float(table["correct"].mean())

    try:
        exact, noisy, lapsing = mean_accuracy(0.0, 0.0), mean_accuracy(2.0, 0.0), mean_accuracy(0.0, 1.0)
    finally:
        panel.noise, panel.lapse = 0.0, 0.0
    assert noisy < exact - 0.2
    assert lapsing == pytest.approx(0.1, abs=0.08)  # all lapses: chance
