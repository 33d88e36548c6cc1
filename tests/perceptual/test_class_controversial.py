"""The class-controversial score on constructed images whose nearest class is known, and inside `measure`."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from perceptual.class_controversial import class_controversial_score, class_controversial_sentence, class_exemplars, nearest_class_choice
from perceptual.observers import make_observer


class Brightness(nn.Module):
    """A classifier of constant-colour images: class = how bright the red channel is (``threshold``) or the reverse."""

    def __init__(self, reverse: bool = False):
        super().__init__()
        self.reverse = reverse
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        red = x[:, 0].mean((1, 2))
        bright = (red > 0.5).long() if not self.reverse else (red <= 0.5).long()
        return nn.functional.one_hot(bright, 2).float() + self.dummy


def _flat(values):
    return torch.stack([torch.full((3, 8, 8), v) for v in values])


def test_the_observer_picks_the_class_whose_exemplars_look_alike():
    observer = make_observer("pixel-l2")
    exemplars, labels = _flat([0.1, 0.15, 0.2, 0.8, 0.85, 0.9]), torch.tensor([0, 0, 0, 1, 1, 1])
    stimuli = _flat([0.12, 0.88, 0.5])
    choice = nearest_class_choice(observer, stimuli, torch.tensor([[0, 1], [0, 1], [1, 0]]), exemplars, labels, k=1)
    # 0.12 is nearest class 0 (column 0); 0.88 nearest class 1 (column 1); 0.5 lies halfway between 0.2 and 0.8: a tie
    assert choice.tolist() == [0, 1, -1]
    with pytest.raises(ValueError, match="no exemplars of classes"):
        nearest_class_choice(observer, stimuli, torch.tensor([[0, 2]] * 3), exemplars, labels)
    # k=0 averaged no distances: NaN for both classes, which read as a choice of column 0 for every stimulus
    with pytest.raises(ValueError, match="k .* must be a whole number >= 1, got 0"):
        nearest_class_choice(observer, stimuli, torch.tensor([[0, 1]] * 3), exemplars, labels, k=0)

    class Broken:
        name = "broken"

        def matrix(self, a, b):
            return torch.full((len(a), len(b)), float("nan"))

    with pytest.raises(ValueError, match="observer 'broken' gave non-finite distances"):
        nearest_class_choice(Broken(), stimuli, torch.tensor([[0, 1]] * 3), exemplars, labels)


def test_the_model_that_decides_like_the_observer_wins():
    observer = make_observer("pixel-l2")
    exemplars, labels = _flat([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])
    stimuli = _flat([0.05, 0.1, 0.3, 0.7, 0.95, 0.9])
    score = class_controversial_score(stimuli, {"right": Brightness(), "reversed": Brightness(reverse=True)}, [observer], exemplars, labels, k=2)
    assert score["n_controversial"] == 6  # the two models disagree on every image
    result = score["observers"]["pixel-l2"]
    assert result["per_model"]["right"]["rate"] == 1.0 and result["per_model"]["reversed"]["rate"] == 0.0
    assert result["favours"] == "right" and result["per_model"]["right"]["ci"][0] > 0.5
    same = class_controversial_score(stimuli, {"a": Brightness(), "b": Brightness()}, [observer], exemplars, labels)
    assert same["n_controversial"] == 0 and "agree on every stimulus" in same["note"]


def test_restarts_of_one_origin_do_not_narrow_the_interval():
    """A Wilson interval over stimuli counted three restarts landing on one image as three observations."""
    observer = make_observer("pixel-l2")
    exemplars, labels = _flat([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])
    once = _flat([0.05, 0.1, 0.3, 0.7, 0.95, 0.45])
    models = {"right": Brightness(), "reversed": Brightness(reverse=True)}
    one = class_controversial_score(once, models, [observer], exemplars, labels, k=2, origins=[f"o{i}" for i in range(6)])
    thrice = class_controversial_score(once.repeat_interleave(3, 0), models, [observer], exemplars, labels, k=2,
                                       origins=[f"o{i}" for i in range(6) for _ in range(3)])
    assert one["interval"] == thrice["interval"] == "bootstrap over origins"
    first, second = (s["observers"]["pixel-l2"]["per_model"]["right"] for s in (one, thrice))
    assert first["rate"] == second["rate"] and first["ci"] == second["ci"]
    with pytest.raises(ValueError, match="one origin per stimulus"):
        class_controversial_score(once, models, [observer], exemplars, labels, origins=["o0"])


def test_few_origins_decide_nothing_however_many_stimuli_they_hold():
    """Six stimuli of one origin siding with a model are one coin toss, not six: no interval and no verdict (a Wilson
    interval over them said "sides with right"); two or three origins that agree are no verdict either."""
    observer = make_observer("pixel-l2")
    exemplars, labels = _flat([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])
    stimuli = _flat([0.05, 0.1, 0.3, 0.7, 0.95, 0.9])  # "right" decides as the observer does on every one
    models = {"right": Brightness(), "reversed": Brightness(reverse=True)}
    for n_origins, decides in ((1, False), (2, False), (3, False), (6, True)):
        score = class_controversial_score(stimuli, models, [observer], exemplars, labels, k=2, origins=[f"o{i % n_origins}" for i in range(6)])
        result = score["observers"]["pixel-l2"]
        assert score["interval"] == "bootstrap over origins" and score["n_origins"] == n_origins
        assert result["p_value"] == pytest.approx(1.0 if n_origins == 1 else 2 / 2 ** n_origins)
        assert result["favours"] == ("right" if decides else None), n_origins
    one = class_controversial_score(stimuli, models, [observer], exemplars, labels, k=2, origins=["o"] * 6)
    assert all(math.isnan(bound) for bound in one["observers"]["pixel-l2"]["per_model"]["right"]["ci"])
    sentence = class_controversial_sentence(one)  # it printed "right 100% [nan%, nan%]"
    assert "right 100% (no interval: 1 origin)" in sentence and "nan" not in sentence
    assert "[" in class_controversial_sentence(score)  # six origins: an interval


def test_every_origin_counts_once_in_the_rate_as_in_the_verdict():
    """The rate and its interval pooled stimuli, so an origin that kept six counted six times, while the verdict took
    each origin's rate once: the printed rates could side with the model the verdict did not name."""
    observer = make_observer("pixel-l2")
    exemplars, labels = _flat([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])
    models = {"right": Brightness(), "reversed": Brightness(reverse=True)}
    sided = [0.05, 0.1, 0.95, 0.9, 0.08, 0.92, 0.12]  # seven origins of one stimulus each: the observer decides as "right"
    stimuli = _flat(sided + [0.5] * 12)  # two origins of six stimuli each, halfway: ties, half credit to each model
    origins = [f"o{i}" for i in range(7)] + ["big0"] * 6 + ["big1"] * 6
    result = class_controversial_score(stimuli, models, [observer], exemplars, labels, k=2, origins=origins)["observers"]["pixel-l2"]
    assert result["ties"] == 12
    assert result["per_model"]["right"]["rate"] == pytest.approx((7 * 1 + 2 * 0.5) / 9)  # was (7 + 6) / 19, pooled
    assert result["per_model"]["reversed"]["rate"] == pytest.approx(1 / 9)


def test_exemplars_are_drawn_per_class_and_reproducibly():
    images, labels = torch.rand(30, 3, 4, 4), torch.arange(30) % 3
    first, first_labels = class_exemplars(images, labels, per_class=4, seed=1)
    again, _ = class_exemplars(images, labels, per_class=4, seed=1)
    assert torch.equal(first, again) and first_labels.bincount().tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="per_class"):
        class_exemplars(images, labels, per_class=0)


def test_measure_scores_a_class_controversial_pair(tmp_path, tiny_digits_checkpoints):
    from perceptual.measure import ModelSpec, make_panel, measure_models

    from .conftest import TINY_WIDTH

    specs = [ModelSpec("small_cnn", str(path), label, kwargs={"width": TINY_WIDTH})
             for label, path in (("a", tiny_digits_checkpoints["early"]), ("b", tiny_digits_checkpoints["trained"]))]
    data = measure_models(specs, {"name": "digits"}, tmp_path, engine={"steps": 30, "progress": False}, n_targets=3, seed_types=["noise"],
                          panel=make_panel(["pixel-l2"]), tasks=["2afc"], threat=None, device="cpu",
                          controversial={"model_a": "a", "model_b": "b", "objective": "class_controversial", "n_origins": 4, "restarts": 2,
                                         "exemplars_per_class": 5})
    c = data["controversial"]
    assert c["objective"] == "class_controversial" and c["n_stimuli"] == 16  # 4 origins x 2 restarts x 2 directions
    assert c["n_controversial"] > 0  # measured: 11 of 16 (seeded)
    rates = c["observers"]["pixel-l2"]["per_model"]
    assert rates["a"]["rate"] + rates["b"]["rate"] == pytest.approx(1.0)
    assert c["interval"] == "bootstrap over origins"  # the stimuli name their origins
    text = (tmp_path / "report.md").read_text()
    assert "Class-controversial stimuli" in text
    assert "(95% bootstrap over origins; the verdict a sign-flip test over the" in text and "Wilson" not in text  # it named Wilson
