"""Observer decisions: a classification read-out for the perceptual observers, as a panel of simulated subjects.

Each image is labelled by its nearest labelled exemplars under an observer's perceptual distance: a k-nearest-
neighbour vote over an exemplar set drawn (seeded, stratified) from the training split, distances from the
observer's batched ``matrix``. Two parameters make it behave like a subject rather than a rule:

* **decision noise** ``noise``: Gaussian noise of standard deviation ``noise`` added to each image's distances
  after standardising them over the exemplars (z-score of the image's row of distances), so ``noise`` means
  the same for every observer whatever its distance scale, and an image's decision never depends on the
  other images in the batch. ``noise = 0`` is the plain k-NN rule.
* **lapse rate** ``lapse``: with probability ``lapse`` the subject answers uniformly at random among the
  classes (a lapse, as in psychophysical observer models, e.g. Wichmann & Hill 2001).

Ties in the vote go to the tied class whose voting exemplars are closer in sum. A simulated subject is one
observer network with one seed; the seed draws its exemplars and its noise and lapses, keyed by (subject,
condition, image id) through :func:`invert.rng.hashed_uniform`, so a panel of several seeds × several
networks answers like several people. Subject names start with ``subject-`` (model-vs-human's convention for
human observers), so :func:`perceptual.metrics.aggregate_trials` treats them as the "human" side by default.

Trial tables have model-vs-human's columns (``subject, dataset, condition, image_id, category, response,
correct``; ``category`` is the true class name, ``response`` the answered one); models produce the same table
(:func:`model_trials`, subject = model name), so the metric suite works on both.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from invert.rng import hashed_uniform, stream_seed

from .observers import Observer, Panel, observer_slug

TRIAL_TABLE_COLUMNS = ("subject", "dataset", "condition", "image_id", "category", "response", "correct")


def stable_key(*parts: object) -> int:
    """A 31-bit integer from strings/numbers, the same in every process (unlike ``hash``)."""
    return stream_seed("repalign.decisions", *parts)


def draw_exemplars(labels: Tensor | Sequence[int], per_class: int, seed: int) -> Tensor:
    """Indices of ``per_class`` exemplars of every class present in ``labels``, drawn without replacement.

    Class c's draw comes from its own generator keyed by (seed, c) (numpy's SeedSequence), so it does not depend on the other
    classes; the result is sorted by class, then by draw order.
    """
    labels = torch.as_tensor(labels, dtype=torch.long).cpu()
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError(f"labels must be a non-empty 1-D sequence of class indices, got shape {tuple(labels.shape)}")
    if not isinstance(per_class, int) or per_class < 1:
        raise ValueError(f"per_class must be a positive int, got {per_class!r}")
    chosen = []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        if len(members) < per_class:
            raise ValueError(f"class {c} has only {len(members)} images in the exemplar split, fewer than per_class={per_class}")
        # numpy's SeedSequence mixes (seed, class) fully; a torch CPU generator would use only 32 bits of a key.
        order = torch.from_numpy(np.random.default_rng([int(seed), int(c)]).permutation(len(members)))
        chosen.append(members[order[:per_class]])
    return torch.cat(chosen)


def _standard_normal(seed: int, items: Tensor, step: int, n: int) -> Tensor:
    """(len(items), n) standard normals from counter-based uniforms (Box–Muller), keyed like hashed_uniform."""
    u = hashed_uniform(seed, items, step, 2 * n).double()
    radius = torch.sqrt(-2 * torch.log1p(-u[:, :n]))  # 1 − u lies in (0, 1]: the log is finite
    return (radius * torch.cos(2 * math.pi * u[:, n:])).float()


def knn_decide(distances: Tensor, exemplar_labels: Tensor, num_classes: int, *, k: int = 5, lapse: float = 0.0,
               noise: float = 0.0, seed: int = 0, image_ids: Tensor | None = None, condition_key: int = 0) -> tuple[Tensor, Tensor]:
    """k-NN decisions with decision noise and lapses, from an (N, E) distance matrix to labelled exemplars.

    Returns ``(responses (N,), probabilities (N, K))``: the class answered and the subject's answer
    distribution, (1 − lapse)·(vote share of the noisy k-NN) + lapse/K. Random draws are keyed by
    (``seed``, ``image_ids``, ``condition_key``); see the module docstring for the noise and tie rules.
    """
    if distances.ndim != 2:
        raise ValueError(f"distances must be (N images, E exemplars), got shape {tuple(distances.shape)}")
    n, e = distances.shape
    exemplar_labels = torch.as_tensor(exemplar_labels, dtype=torch.long, device=distances.device)
    if exemplar_labels.shape != (e,):
        raise ValueError(f"one label per exemplar: {tuple(exemplar_labels.shape)} labels for {e} exemplars")
    if not isinstance(k, int) or not 1 <= k <= e:
        raise ValueError(f"k must be an int in [1, number of exemplars = {e}], got {k!r}")
    _check_lapse_and_noise(lapse, noise)
    if len(exemplar_labels) and (int(exemplar_labels.min()) < 0 or int(exemplar_labels.max()) >= num_classes):
        raise ValueError(f"exemplar labels must lie in [0, {num_classes})")
    if not torch.isfinite(distances).all():
        raise ValueError("distances contain NaN or inf")
    needs_draws = noise > 0 or lapse > 0
    if needs_draws and image_ids is None:
        raise ValueError("image_ids are needed for noisy or lapsing decisions: draws are keyed by image, not batch")
    ids = torch.as_tensor(image_ids, dtype=torch.long, device=distances.device) if image_ids is not None else None
    if ids is not None and ids.shape != (n,):
        raise ValueError(f"one image id per row of distances: {tuple(ids.shape)} ids for {n} rows")

    d = distances.float()
    if noise > 0:
        spread = d.std(dim=1, keepdim=True, unbiased=False)
        d = (d - d.mean(dim=1, keepdim=True)) / torch.where(spread > 0, spread, torch.ones_like(spread))
        d = d + noise * _standard_normal(seed, ids, stable_key("noise", condition_key), e).to(d.device)
    nearest_d, nearest = torch.topk(d, k, dim=1, largest=False)
    voters = exemplar_labels[nearest]
    votes = torch.zeros(n, num_classes, device=d.device).scatter_add_(1, voters, torch.ones_like(nearest_d))
    summed = torch.zeros(n, num_classes, device=d.device).scatter_add_(1, voters, nearest_d)
    best = votes == votes.max(dim=1, keepdim=True).values
    responses = torch.where(best, summed, torch.full_like(summed, math.inf)).argmin(dim=1)
    probabilities = (1 - lapse) * votes / k + lapse / num_classes
    if lapse > 0:
        u = hashed_uniform(seed, ids, stable_key("lapse", condition_key), 2).to(d.device)
        random_class = torch.clamp((u[:, 1] * num_classes).long(), max=num_classes - 1)
        responses = torch.where(u[:, 0] < lapse, random_class, responses)
    return responses, probabilities


def trial_table(subject: str, dataset: str, condition: str, image_ids: Sequence, labels: Sequence[int],
                responses: Sequence[int], classes: Sequence[str]) -> pd.DataFrame:
    """One model-vs-human trial row per image: subject, dataset, condition, image_id, category, response, correct."""
    labels = np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64)
    responses = np.asarray(torch.as_tensor(responses).cpu(), dtype=np.int64)
    image_ids = list(torch.as_tensor(image_ids).cpu().tolist()) if isinstance(image_ids, Tensor) else list(image_ids)
    if not (len(labels) == len(responses) == len(image_ids)):
        raise ValueError(f"image_ids, labels and responses differ in length: {len(image_ids)}, {len(labels)}, {len(responses)}")
    names = np.asarray(list(classes), dtype=object)
    for what, values in (("labels", labels), ("responses", responses)):
        if len(values) and (values.min() < 0 or values.max() >= len(names)):
            raise ValueError(f"{what} must be class indices in [0, {len(names)})")
    return pd.DataFrame({
        "subject": subject, "dataset": dataset, "condition": condition, "image_id": image_ids,
        "category": names[labels], "response": names[responses], "correct": labels == responses,
    }, columns=list(TRIAL_TABLE_COLUMNS))


def model_trials(name: str, logits: Tensor, labels, image_ids, classes: Sequence[str], dataset: str, condition: str) -> pd.DataFrame:
    """A model's trial table (its response is the arg-max class)."""
    if logits.ndim != 2 or logits.shape[1] != len(classes):
        raise ValueError(f"logits must be (N, {len(classes)} classes), got shape {tuple(logits.shape)}")
    return trial_table(name, dataset, condition, image_ids, labels, logits.argmax(dim=1), classes)


def subject_name(observer_name: str, seed: int) -> str:
    """``subject-<observer slug>-s<seed>``."""
    return f"subject-{observer_slug(observer_name)}-s{seed}"


@dataclass(frozen=True)
class SimulatedSubject:
    """One simulated subject: an observer network, a seed, and its exemplars (indices into the exemplar split)."""

    name: str
    observer: str
    seed: int
    exemplars: Tensor

    @property
    def key(self) -> int:
        return stable_key(self.observer, self.seed)


def whole_or_as_is(value):
    """An integral value (a numpy int too) as a Python int, anything else unchanged: casting with int() first turned
    k=2.7 into 2 and seeds [0.5, 1.5] into [0, 1], past the checks written to refuse them."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def check_decision_rule(*, seeds: Sequence[int], per_class: int, k: int, lapse: float, noise: float) -> None:
    """Refuse a decision rule that cannot run, before any distance is computed: distinct int ``seeds``, ``per_class`` and
    ``k`` whole numbers >= 1, ``lapse`` a probability, ``noise`` finite and >= 0 (NaN fails every comparison, so each
    check is written to fail on it). ``k`` against the exemplars a subject draws needs the data: :class:`ObserverDecisions`."""
    if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct ints, got {list(seeds)}")
    for name, value in (("per_class", per_class), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    _check_lapse_and_noise(lapse, noise)


def _check_lapse_and_noise(lapse: float, noise: float) -> None:
    """``lapse`` a probability, ``noise`` finite and >= 0 (infinite noise turns every distance into ±inf: a coin, not a
    subject; NaN fails every comparison, so each check is written to fail on it)."""
    if not 0 <= lapse <= 1:
        raise ValueError(f"lapse is a probability in [0, 1], got {lapse}")
    if not (noise >= 0 and math.isfinite(noise)):
        raise ValueError(f"noise must be finite and >= 0 (standard deviations of the standardised distances), got {noise}")


class ObserverDecisions:
    """A panel of simulated subjects (observer networks × seeds) that classify images by k-NN over exemplars.

    Args:
        observers: the observer networks (a :class:`~perceptual.observers.Panel` or a sequence of observers).
        exemplar_images: [0, 1] float (or uint8) (M, 3, H, W) images to draw exemplars from (the training split).
        exemplar_labels: (M,) class indices. ``classes``: class names, index = label.
        seeds: one subject per (observer, seed). ``per_class``: exemplars per class and subject.
        k, lapse, noise: the decision rule (module docstring).

    :meth:`distances` computes each observer's distances to the exemplars of all its subjects at once (the
    expensive part; cache it), :meth:`decide` turns them into each subject's trial table and answer
    distributions.
    """

    def __init__(self, observers: Panel | Sequence[Observer], exemplar_images: Tensor, exemplar_labels, classes: Sequence[str], *,
                 seeds: Sequence[int] = (0, 1, 2), per_class: int = 10, k: int = 5, lapse: float = 0.05, noise: float = 0.25):
        self.observers = Panel(list(observers)).observers  # a panel checks: at least one, unique names
        seeds = [whole_or_as_is(s) for s in seeds]  # numpy ints as ints; 0.9 stays 0.9, for the check to refuse
        check_decision_rule(seeds=seeds, per_class=per_class, k=k, lapse=lapse, noise=noise)
        self.classes = list(classes)
        self.exemplar_labels = torch.as_tensor(exemplar_labels, dtype=torch.long).cpu()
        if exemplar_images.ndim != 4 or len(exemplar_images) != len(self.exemplar_labels):
            raise ValueError(f"exemplar_images must be (M, 3, H, W) with one label each; got {tuple(exemplar_images.shape)} "
                             f"and {len(self.exemplar_labels)} labels")
        self.exemplar_images = exemplar_images
        present = torch.unique(self.exemplar_labels)
        if len(present) and (int(present[0]) < 0 or int(present[-1]) >= len(self.classes)):
            raise ValueError(f"exemplar_labels must be class indices in [0, {len(self.classes)}) (one per class name), "
                             f"got values from {int(present[0])} to {int(present[-1])}")
        # Each subject draws per_class exemplars of every class present in the split, so that is what k-NN can vote over.
        if not isinstance(k, int) or not 1 <= k <= per_class * len(present):
            raise ValueError(f"k must be an int in [1, per_class × classes present in the exemplar split = {per_class} × {len(present)}], "
                             f"got {k!r}")
        self.k, self.lapse, self.noise, self.per_class = k, float(lapse), float(noise), per_class
        self.subjects = [
            SimulatedSubject(subject_name(o.name, s), o.name, s, draw_exemplars(self.exemplar_labels, per_class, stable_key("exemplars", o.name, s)))
            for o in self.observers for s in seeds
        ]
        # Each observer measures distances to the union of its subjects' exemplars, once.
        self.pools = {o.name: torch.unique(torch.cat([s.exemplars for s in self.subjects if s.observer == o.name])) for o in self.observers}

    @property
    def subject_names(self) -> list[str]:
        return [s.name for s in self.subjects]

    def pool_images(self, observer_name: str) -> Tensor:
        images = self.exemplar_images[self.pools[observer_name]]
        return images.float() / 255 if images.dtype == torch.uint8 else images

    @torch.no_grad()
    def distances(self, images: Tensor, observer: Observer) -> Tensor:
        """(N, P) distances from [0, 1] images to ``observer``'s exemplar pool (:attr:`pools`)."""
        if observer.name not in self.pools:
            raise KeyError(f"observer {observer.name!r} is not in this panel: {list(self.pools)}")
        return observer.matrix(images, self.pool_images(observer.name)).float()

    def decide(self, distances: Mapping[str, Tensor], image_ids, labels, *, dataset: str, condition: str) -> tuple[pd.DataFrame, dict[str, Tensor]]:
        """Every subject's trial table (concatenated) and answer distributions ``{subject: (N, K)}``.

        ``distances`` maps each observer name to its (N, P) matrix from :meth:`distances`.
        """
        ids = torch.as_tensor(image_ids, dtype=torch.long)
        tables, probabilities = [], {}
        for subject in self.subjects:
            if subject.observer not in distances:
                raise KeyError(f"no distances for observer {subject.observer!r}")
            pool = self.pools[subject.observer]
            matrix = distances[subject.observer]
            if matrix.shape != (len(ids), len(pool)):
                raise ValueError(f"distances for {subject.observer!r} must be ({len(ids)}, {len(pool)}), got {tuple(matrix.shape)}")
            columns = torch.searchsorted(pool, subject.exemplars)
            responses, probs = knn_decide(
                matrix[:, columns], self.exemplar_labels[subject.exemplars], len(self.classes), k=self.k, lapse=self.lapse,
                noise=self.noise, seed=subject.key, image_ids=ids, condition_key=stable_key(dataset, condition),
            )
            tables.append(trial_table(subject.name, dataset, condition, ids, labels, responses, self.classes))
            probabilities[subject.name] = probs.cpu()
        return pd.concat(tables, ignore_index=True), probabilities

    def describe(self) -> dict:
        """The panel's settings and subjects, for reports."""
        return {
            "k": self.k, "lapse": self.lapse, "noise": self.noise, "exemplars_per_class": self.per_class,
            "subjects": [{"name": s.name, "observer": s.observer, "seed": s.seed} for s in self.subjects],
        }


__all__ = [
    "TRIAL_TABLE_COLUMNS", "ObserverDecisions", "SimulatedSubject", "draw_exemplars", "knn_decide", "model_trials",
    "observer_slug", "stable_key", "subject_name", "trial_table", "whole_or_as_is",
]
