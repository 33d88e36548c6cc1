"""A score for class-controversial stimuli: whose decision would people make?

Golan, Raju and Kriegeskorte ("Controversial stimuli", PNAS 2020) synthesise images that two classifiers label
differently and ask people which of the two classes they see; the model whose decisions people share more often
is the better model of them. ``stimuli.make_controversial_set(objective="class_controversial")`` makes such
images; this module plays the person with a simulated observer.

The observer decides between the two models' classes by its nearest class exemplars: for each candidate class
it takes the mean of the ``k`` smallest perceptual distances from the stimulus to that class's exemplars (labelled
images the caller gives, e.g. training images), and chooses the class with the smaller one. Only stimuli the two
models actually disagree on count (a synthesis that failed to split them is no evidence for either); a tie
between the two classes gives each model half a point, as the tasks' ties do.

Per observer and model: the fraction of the controversial stimuli on which the observer's choice is that model's
decision, with a 95 % interval. When the stimuli name their origins (the restarts and both directions from one
origin are not independent stimuli) every origin counts once: the rate is the mean of the origins' rates (an origin
keeps 0 to all of its stimuli, those the models disagree on), the interval a percentile bootstrap of those rates
(:func:`perceptual.tasks.bootstrap_interval`), and the verdict is the sign-flip test over origins of each origin's
rate minus one half (:func:`perceptual.statistics.sign_flip_p_value`, p < 0.05): the bootstrap interval alone sided
with a model from 1 to 3 origins in a third to all of the runs where each origin sided by a coin toss, and fewer
than :data:`perceptual.statistics.SIGN_FLIP_MIN_N` origins now never decide. Stimuli without origins are taken as
independent: a Wilson interval over stimuli, whose lower bound above 0.5 is the verdict. The two rates sum to 1 over
the same items; a rate above 0.5 means the observer sides with that model more often than with the other.

Differences from Golan et al.: people there answer with any of the classes (or "none"); the observer here makes
the two-alternative choice between the models' classes, which is the comparison their score uses; exemplars
stand in for the category knowledge a person brings.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from invert.validation import check_images
from training.config import check_whole_number

from .observers import Observer
from .statistics import sign_flip_p_value
from .tasks import TIE_TOLERANCE, bootstrap_interval, wilson_interval


def class_exemplars(images: Tensor, labels: Tensor, per_class: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Up to ``per_class`` images of every class, drawn with a seeded generator (images in [0, 1], NCHW)."""
    check_images(images, "exemplar images")
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for c in sorted(set(labels.tolist())):
        index = torch.nonzero(labels == c).flatten()
        chosen.append(index[torch.randperm(len(index), generator=generator)[:per_class]])
    index = torch.cat(chosen)
    return images[index], labels[index]


def nearest_class_choice(observer: Observer, stimuli: Tensor, candidates: Tensor, exemplars: Tensor, exemplar_labels: Tensor, *,
                         k: int = 5, tie_tolerance: float = TIE_TOLERANCE) -> Tensor:
    """The observer's choice between two candidate classes per stimulus: 0 or 1 (the column of ``candidates``, (N, 2)),
    or -1 on a tie; class distance = mean of the ``k`` smallest distances to the class's exemplars."""
    if candidates.ndim != 2 or candidates.shape != (len(stimuli), 2):
        raise ValueError(f"candidates must be (N, 2) class indices for N={len(stimuli)} stimuli, got {tuple(candidates.shape)}")
    check_whole_number(k, "k (the nearest exemplars a class distance averages)")
    missing = sorted(set(candidates.flatten().tolist()) - set(exemplar_labels.tolist()))
    if missing:
        raise ValueError(f"no exemplars of classes {missing}: give exemplar images of every class the models decide")
    distances = observer.matrix(stimuli, exemplars).double().cpu()  # (N, exemplars)
    class_distance = torch.empty(len(stimuli), 2, dtype=torch.float64)
    for col in range(2):
        for i, c in enumerate(candidates[:, col].tolist()):
            row = distances[i, exemplar_labels == c]
            class_distance[i, col] = row.topk(min(k, len(row)), largest=False).values.mean()
    if not torch.isfinite(class_distance).all():  # a NaN gap would read as a choice of column 0
        raise ValueError(f"observer {getattr(observer, 'name', observer)!r} gave non-finite distances to the class exemplars")
    gap = class_distance[:, 0] - class_distance[:, 1]
    return torch.where(gap.abs() <= tie_tolerance, torch.full_like(gap, -1), (gap > 0).double()).long()


@torch.no_grad()
def _decisions(model: nn.Module, images: Tensor, batch_size: int = 256) -> Tensor:
    device = next(model.parameters()).device
    return torch.cat([model(images[i:i + batch_size].to(device)).argmax(1).cpu() for i in range(0, len(images), batch_size)])


def class_controversial_score(stimuli: Tensor, models: Mapping[str, nn.Module], observers: Mapping[str, Observer] | list, exemplars: Tensor,
                              exemplar_labels: Tensor, *, k: int = 5, origins: Sequence | None = None, n_boot: int = 2000,
                              seed: int = 0) -> dict:
    """Per observer, how often each of the two ``models`` (label -> classifier on [0, 1] images) makes the decision
    the observer makes on the stimuli they disagree on (see the module docstring). ``origins``: each stimulus's
    origin id, the unit the interval resamples."""
    check_images(stimuli, "class-controversial stimuli")
    if origins is not None and len(origins) != len(stimuli):
        raise ValueError(f"one origin per stimulus: {len(stimuli)} stimuli, {len(origins)} origins")
    if len(models) != 2:
        raise ValueError(f"the class-controversial score compares two models, got {list(models)}")
    (name_a, model_a), (name_b, model_b) = models.items()
    decision_a, decision_b = _decisions(model_a.eval(), stimuli), _decisions(model_b.eval(), stimuli)
    split = decision_a != decision_b
    out = {"models": [name_a, name_b], "n_stimuli": len(stimuli), "n_controversial": int(split.sum()), "observers": {}}
    if not bool(split.any()):
        return {**out, "note": "the two models agree on every stimulus: nothing to score (the synthesis did not split them)"}
    candidates = torch.stack([decision_a[split], decision_b[split]], 1)
    observers = observers if isinstance(observers, Mapping) else {o.name: o for o in observers}
    n = int(split.sum())
    clusters = np.asarray(list(origins), dtype=object)[split.numpy()].astype(str) if origins is not None else None
    n_origins = len(set(clusters.tolist())) if clusters is not None else None
    out["interval"] = "bootstrap over origins" if clusters is not None else "Wilson over stimuli"
    out["n_origins"] = n_origins
    inverse = np.unique(clusters, return_inverse=True)[1] if clusters is not None else None
    for name, observer in observers.items():
        choice = nearest_class_choice(observer, stimuli[split], candidates, exemplars, exemplar_labels, k=k).numpy()
        per_model, origin_rates = {}, {}
        for label, side in ((name_a, 0), (name_b, 1)):
            credit = (choice == side) + 0.5 * (choice == -1)
            if clusters is None:
                rate, (low, high) = float(credit.mean()), wilson_interval(float(credit.sum()), n)
            else:  # the unit of the verdict: pooling stimuli weighted an origin by how many it kept, and could side the other way
                origin_rates[label] = np.bincount(inverse, weights=credit) / np.bincount(inverse)
                rate = float(origin_rates[label].mean())
                low, high = bootstrap_interval(origin_rates[label], n_boot=n_boot, seed=seed) if n_origins > 1 else (math.nan, math.nan)
            per_model[label] = {"rate": rate, "ci": [low, high]}
        entry = {"per_model": per_model, "ties": int((choice == -1).sum())}
        if clusters is None:
            favoured = max(per_model, key=lambda m: per_model[m]["rate"])
            entry["favours"] = favoured if per_model[favoured]["ci"][0] > 0.5 else None
        else:
            lead_a = origin_rates[name_a] - 0.5  # per origin: how far A leads
            entry["p_value"] = sign_flip_p_value(lead_a, seed=seed)
            entry["favours"] = (name_a if lead_a.mean() > 0 else name_b) if entry["p_value"] < 0.05 else None
        out["observers"][name] = entry
    return out


def _interval_text(interval: Sequence, n_origins: int | None) -> str:
    """``[low, high]`` in percent, or why there is none (one origin: NaN here, null once written as JSON)."""
    if any(bound is None or math.isnan(bound) for bound in interval):
        return f"(no interval: {n_origins} origin)" if n_origins == 1 else "(no interval)"
    return f"[{interval[0]:.0%}, {interval[1]:.0%}]"


def class_controversial_sentence(score: Mapping) -> str:
    """One line per observer for a report."""
    if not score.get("observers"):
        return score.get("note", "no class-controversial score")
    lines = []
    for name, result in score["observers"].items():
        rates = ", ".join(f"{m} {r['rate']:.0%} {_interval_text(r['ci'], score.get('n_origins'))}" for m, r in result["per_model"].items())
        if result["favours"]:
            verdict = f"sides with {result['favours']}" + (f" (sign-flip p {result['p_value']:.3f} over {score['n_origins']} origins)"
                                                            if "p_value" in result else "")
        elif "p_value" in result:
            verdict = f"sides with neither (sign-flip p {result['p_value']:.2f} over {score['n_origins']} origins)"
        else:
            verdict = "sides with neither (interval includes 50%)"
        lines.append(f"{name}: {rates} of {score['n_controversial']} stimuli the models disagree on; {verdict}")
    return "\n".join(lines)


__all__ = ["class_controversial_score", "class_controversial_sentence", "class_exemplars", "nearest_class_choice"]
