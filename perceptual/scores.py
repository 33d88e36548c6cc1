"""Abstention / unknown scores: how "known" an input is to a classifier. Higher = more known, throughout.

Each score function has ``fit(model, images, labels)`` (on in-distribution training data, where it must) and
``score(model, images) -> Scores`` (the per-image score and, where the method defines one, its predictive
distribution, used for calibration and selective-risk metrics). Logit- and feature-based scores also take
precomputed :class:`ModelOutputs`, so a pipeline runs each model once per image set.

* ``max_softmax``: maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).
* ``negative_entropy``: Σ p log p of the softmax.
* ``energy``: T·logsumexp(logits / T), the negative free energy (Liu et al., NeurIPS 2020), T = 1.
* ``odin``: max softmax at temperature T of an input moved against the gradient of the tempered cross-entropy
  of its predicted class (Liang et al., ICLR 2018; facebookresearch/odin). Their code adds −ε·sign(∇)/std to
  the *normalised* input, i.e. a step of ε/std per channel in normalised units; since normalisation lives
  inside our models, the same step on the [0, 1] input is ε per pixel (x' = x − std·(ε/std)·sign ∇), and
  x' is clamped to [0, 1] (the original does not clamp). Defaults T = 1000, ε = 0.0014 (their CIFAR values).
  Its tempered softmax of a moved input is a detection statistic, not the model's predictive distribution (at
  T = 1000 it is nearly uniform), so ODIN gives no ``probs``: correctness comes from the clean logits, as in the
  benchmark code of Kim et al. (``md_metrics``), and the report gives it no calibration numbers.
* ``mahalanobis``: −min_c (f − μ_c)ᵀ Σ⁻¹ (f − μ_c) on penultimate features with class means and one tied
  covariance (Lee et al., NeurIPS 2018; pinv of the empirical covariance as their sklearn code). Deliberate
  differences: the penultimate layer only, no input pre-processing, no feature ensemble over layers.
* ``knn``: −(distance to the k-th nearest training feature), features L2-normalised (Sun et al., ICML 2022),
  k = 50 (their CIFAR-10 choice), capped at the number of training images.
* ``mc_dropout``: max of the mean softmax over T passes with dropout on and batch norm frozen (Gal &
  Ghahramani, ICML 2016). MC dropout needs dropout layers: a model without any is refused, unless
  ``insert_dropout=p`` asks for dropout before the final linear layer (on a copy; a network not trained with
  dropout only approximates the method then). Masks come from torch's generator seeded once per call, so
  they depend on batch composition, as in every MC-dropout implementation.
* ``ensemble``: max of the mean softmax of several independently trained models (Lakshminarayanan et al.,
  NeurIPS 2017); the ensemble is its own system (:class:`DeepEnsemble`).
* ``react``: clip penultimate activations at the p-th percentile (p = 90) of in-distribution activations,
  then the energy through the final linear layer (Sun, Guo & Li, NeurIPS 2021). Needs logits = final
  linear(penultimate features); checked at fit time.
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import batch_slices, evaluation, module_device
from invert.rng import seeded_rng
from invert.validation import check_images

log = logging.getLogger(__name__)


@dataclass
class ModelOutputs:
    """A model's logits (N, K) and penultimate features (N, D) (or None) for one image set, on the CPU."""

    logits: Tensor
    features: Tensor | None = None


@dataclass
class Scores:
    """Per-image scores (higher = more known) and, where the method has one, its class distribution (N, K)."""

    scores: np.ndarray
    probs: np.ndarray | None = None


def _as_float_images(images: Tensor) -> Tensor:
    if isinstance(images, Tensor) and images.dtype == torch.uint8:
        images = images.float() / 255
    return check_images(images, "images", channels=3)


@torch.no_grad()
def model_outputs(model: nn.Module, images: Tensor, *, batch_size: int = 256, features: bool = True,
                  representation: nn.Module | None = None) -> ModelOutputs:
    """Logits and (optionally) penultimate features via :class:`training.Representation`, batched, eval mode.

    ``images``: [0, 1] float or uint8 (N, 3, H, W), on any device (moved to the model's batch by batch).
    ``representation``: a ready ``Representation(model)`` to reuse (building one traces the network).
    """
    from training import Representation

    images = _as_float_images(images)
    device = module_device(model)
    if features and representation is None:
        representation = Representation(model)
    elif not features:
        representation = None
    logits, feats = [], []
    with evaluation(model):
        for s in batch_slices(len(images), batch_size):
            x = images[s].to(device)
            logits.append(model(x).float().cpu())
            if representation is not None:
                feats.append(representation(x).float().cpu())
    return ModelOutputs(torch.cat(logits), torch.cat(feats) if feats else None)


def feature_representation(model: nn.Module, scores: Mapping[str, "ScoreFunction"]) -> tuple[nn.Module | None, dict[str, str]]:
    """The penultimate-layer :class:`training.Representation` that the feature scores among ``scores`` (Mahalanobis,
    k-NN, ReAct) need, built once (None where no score needs it), and ``{name: reason}`` for those scores where the
    model names no penultimate layer: they do not apply to it, and the caller leaves them out, keeping the others."""
    from training import Representation

    needing = [name for name, score in scores.items() if getattr(score, "needs_features", False)]
    if not needing:
        return None, {}
    try:
        return Representation(model), {}
    except ValueError as err:
        why = str(err).split(": pass layer=")[0]  # the commands take no layer= for these scores: the model names its own
        return None, {name: f"needs the penultimate layer's features, and {type(model).__name__} names none ({why}; give it a `penultimate` "
                            "attribute naming one of training.list_layers(model))" for name in needing}


class ScoreFunction:
    """Base class. ``fit`` where the method needs in-distribution data; ``score`` returns :class:`Scores`."""

    name = "score"
    needs_fit = False
    needs_features = False
    feature_based = False  # a distance in penultimate-feature space (Mahalanobis, k-NN)

    def fit(self, model: nn.Module, images: Tensor, labels: Tensor, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> "ScoreFunction":
        return self

    def score(self, model: nn.Module, images: Tensor, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> Scores:
        if outputs is None:
            outputs = model_outputs(model, images, batch_size=batch_size, features=self.needs_features)
        return self.from_outputs(outputs)

    def from_outputs(self, outputs: ModelOutputs) -> Scores:  # pragma: no cover - interface
        raise NotImplementedError(f"{self.name} needs the model itself, not precomputed outputs")

    def _check_fitted(self, *attributes: str) -> None:
        if any(getattr(self, a, None) is None for a in attributes):
            raise RuntimeError(f"{self.name} must be fit on in-distribution training data first: call .fit(model, images, labels)")

    def _features(self, outputs: ModelOutputs) -> Tensor:
        if outputs.features is None:
            raise ValueError(f"{self.name} needs penultimate features, and the model names no penultimate layer (a zoo model does; give "
                             "your own a `penultimate` attribute naming one of training.list_layers(model)); in Python, compute outputs "
                             "with features=True")
        return outputs.features

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MaxSoftmax(ScoreFunction):
    """Maximum softmax probability (Hendrycks & Gimpel, ICLR 2017)."""

    name = "max_softmax"

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        probs = outputs.logits.double().softmax(1)
        return Scores(probs.max(1).values.numpy(), probs.numpy())


class NegativeEntropy(ScoreFunction):
    """Σ_k p_k log p_k of the softmax: 0 for a one-hot answer, −log K for a uniform one."""

    name = "negative_entropy"

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        log_probs = outputs.logits.double().log_softmax(1)
        probs = log_probs.exp()
        return Scores((probs * log_probs).sum(1).numpy(), probs.numpy())


def energy_score(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """T·logsumexp(logits / T): the negative free energy (Liu et al., NeurIPS 2020)."""
    return temperature * torch.logsumexp(logits.double() / temperature, dim=1)


class Energy(ScoreFunction):
    """Negative free energy T·logsumexp(logits / T) (Liu et al., NeurIPS 2020)."""

    name = "energy"

    def __init__(self, temperature: float = 1.0):
        self.temperature = _positive(temperature, "temperature")

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        return Scores(energy_score(outputs.logits, self.temperature).numpy())


class ODIN(ScoreFunction):
    """ODIN (Liang et al., ICLR 2018): temperature scaling plus an input perturbation; see the module docstring."""

    name = "odin"

    def __init__(self, temperature: float = 1000.0, epsilon: float = 0.0014):
        self.temperature = _positive(temperature, "temperature")
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0 (step in [0, 1] pixel units), got {epsilon}")
        self.epsilon = float(epsilon)

    def perturb(self, model: nn.Module, x: Tensor) -> Tensor:
        """x − ε·sign(∇_x CE(model(x)/T, predicted class)), clamped to [0, 1]."""
        x = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            logits = model(x) / self.temperature
            loss = F.cross_entropy(logits, logits.argmax(1), reduction="sum")
            (gradient,) = torch.autograd.grad(loss, x)
        return (x.detach() - self.epsilon * gradient.sign()).clamp(0, 1)

    def score(self, model: nn.Module, images: Tensor, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> Scores:
        images = _as_float_images(images)
        device = module_device(model)
        probs = []
        with evaluation(model):
            for s in batch_slices(len(images), batch_size):
                x = self.perturb(model, images[s].to(device)) if self.epsilon > 0 else images[s].to(device)
                with torch.no_grad():
                    probs.append((model(x).double() / self.temperature).softmax(1).cpu())
        return Scores(torch.cat(probs).max(1).values.numpy())  # no probs: see the module docstring


class Mahalanobis(ScoreFunction):
    """Negative minimum Mahalanobis distance to the class means, tied covariance (Lee et al., NeurIPS 2018)."""

    name = "mahalanobis"
    needs_fit = needs_features = feature_based = True

    def __init__(self):
        self.means: Tensor | None = None
        self.precision: Tensor | None = None

    def fit(self, model, images, labels, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> "Mahalanobis":
        outputs = outputs or model_outputs(model, images, batch_size=batch_size, features=True)
        feats = self._features(outputs).double()
        labels = _labels(labels, len(feats))
        classes = torch.unique(labels)
        if len(classes) < 2:
            raise ValueError("Mahalanobis needs training images of at least two classes")
        self.means = torch.stack([feats[labels == c].mean(0) for c in classes])
        centred = feats - self.means[torch.searchsorted(classes, labels)]
        covariance = centred.T @ centred / len(feats)  # sklearn EmpiricalCovariance, as the authors' code
        self.precision = torch.linalg.pinv(covariance, hermitian=True)
        rank, dims = len(feats) - len(classes), feats.shape[1]
        if rank < dims:  # the pseudo-inverse gives no cost to a direction the fit images do not span
            log.warning("Mahalanobis fit on %d images of %d classes in %d feature dimensions: the covariance has rank at most %d, so "
                        "features off the fit images' span along %d directions cost nothing; fit on at least %d images (n_fit)",
                        len(feats), len(classes), dims, rank, dims - rank, dims + len(classes))
        return self

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        self._check_fitted("means", "precision")
        feats = self._features(outputs).double()
        nearest = []
        for s in batch_slices(len(feats), max(1, 2**22 // max(1, self.means.numel()))):  # bounds the (n, C, D) difference
            diff = feats[s, None, :] - self.means[None]
            nearest.append(torch.einsum("ncd,de,nce->nc", diff, self.precision, diff).min(1).values)
        return Scores((-torch.cat(nearest)).numpy())


class KNNDistance(ScoreFunction):
    """Negative distance to the k-th nearest L2-normalised training feature (Sun et al., ICML 2022)."""

    name = "knn"
    needs_fit = needs_features = feature_based = True

    def __init__(self, k: int = 50, chunk: int = 1024):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k, self.chunk = k, chunk
        self.bank: Tensor | None = None

    def fit(self, model, images, labels=None, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> "KNNDistance":
        outputs = outputs or model_outputs(model, images, batch_size=batch_size, features=True)
        self.bank = F.normalize(self._features(outputs).float(), dim=1)
        return self

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        self._check_fitted("bank")
        feats = F.normalize(self._features(outputs).float(), dim=1)
        k = min(self.k, len(self.bank))
        kth = [torch.cdist(feats[s], self.bank).topk(k, dim=1, largest=False).values[:, -1] for s in batch_slices(len(feats), self.chunk)]
        return Scores((-torch.cat(kth)).double().numpy())


def final_linear(model: nn.Module, outputs: ModelOutputs) -> nn.Linear:
    """The linear layer that maps the penultimate features to the logits; an error if there is none.

    Takes the last ``nn.Linear`` whose input width is the features' and checks that it reproduces the logits.
    """
    feats = outputs.features
    if feats is None:
        raise ValueError("finding the final linear layer needs penultimate features")
    candidates = [m for m in model.modules() if isinstance(m, nn.Linear) and m.in_features == feats.shape[1]]
    if candidates:
        layer = candidates[-1]
        with torch.no_grad():
            probe = layer(feats[:8].to(layer.weight.device, layer.weight.dtype)).float().cpu()
        if probe.shape == outputs.logits[:8].shape and torch.allclose(probe, outputs.logits[:8], atol=1e-3, rtol=1e-3):
            return layer
    raise ValueError(
        f"{type(model).__name__}: the logits are not one linear layer of the penultimate features (width {feats.shape[1]}), "
        "so ReAct (and dropout inserted before the final layer) cannot be applied to this model"
    )


class ReAct(ScoreFunction):
    """Energy after clipping penultimate activations at an in-distribution percentile (Sun et al., NeurIPS 2021).

    An energy (logit) score computed from rectified features, not a distance in feature space
    (``feature_based`` is False): on far-OOD inputs that a small network maps to large logits it improves on the
    plain energy but need not separate them.
    """

    name = "react"
    needs_fit = needs_features = True

    def __init__(self, percentile: float = 90.0):
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must lie in (0, 100], got {percentile}")
        self.percentile = float(percentile)
        self.threshold: float | None = None
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None

    def fit(self, model, images, labels=None, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> "ReAct":
        outputs = outputs or model_outputs(model, images, batch_size=batch_size, features=True)
        layer = final_linear(model, outputs)
        self.weight = layer.weight.detach().double().cpu()
        self.bias = layer.bias.detach().double().cpu() if layer.bias is not None else torch.zeros(layer.out_features, dtype=torch.float64)
        self.threshold = float(np.percentile(self._features(outputs).double().numpy(), self.percentile))
        return self

    def from_outputs(self, outputs: ModelOutputs) -> Scores:
        self._check_fitted("threshold", "weight")
        clipped = self._features(outputs).double().clamp(max=self.threshold)
        return Scores(energy_score(clipped @ self.weight.T + self.bias).numpy())


class MCDropout(ScoreFunction):
    """Monte Carlo dropout (Gal & Ghahramani, ICML 2016); see the module docstring for models without dropout."""

    name = "mc_dropout"

    def __init__(self, passes: int = 20, insert_dropout: float | None = None, seed: int = 0):
        if not isinstance(passes, int) or passes < 1:
            raise ValueError(f"passes must be a positive int, got {passes!r}")
        if insert_dropout is not None and not 0 <= insert_dropout < 1:
            raise ValueError(f"insert_dropout is a dropout probability in [0, 1), got {insert_dropout}")
        self.passes, self.insert_dropout, self.seed = passes, insert_dropout, seed
        self._prepared: dict[int, tuple[nn.Module, nn.Module]] = {}

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model to sample from: the model itself if it has dropout layers, else a copy with dropout inserted."""
        if id(model) in self._prepared:
            return self._prepared[id(model)][1]
        has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
        if has_dropout:  # insert_dropout is for the models without: one trained with dropout keeps its own rate
            if self.insert_dropout is not None:
                log.info("%s has dropout layers of its own: MC dropout samples them, insert_dropout=%s is not applied",
                         getattr(model, "arch", type(model).__name__), self.insert_dropout)
            prepared = model
        elif self.insert_dropout is None:
            raise ValueError(
                f"MC dropout needs dropout layers and {getattr(model, 'arch', type(model).__name__)} has none: pass "
                "insert_dropout=p to insert dropout before the final linear layer (an approximation for a network not "
                "trained with it), or leave mc_dropout out of the score functions"
            )
        else:
            prepared = copy.deepcopy(model)
            _insert_dropout_before_final_linear(prepared, self.insert_dropout)
        self._prepared[id(model)] = (model, prepared)  # holding the model keeps its id from being reused
        return prepared

    @torch.no_grad()
    def score(self, model: nn.Module, images: Tensor, *, batch_size: int = 256, outputs: ModelOutputs | None = None) -> Scores:
        images = _as_float_images(images)
        sampler = self.prepare(model)
        device = module_device(sampler)
        states = {m: m.training for m in sampler.modules()}
        sampler.eval()  # batch norm (and everything else) frozen ...
        for m in sampler.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd):
                m.train()  # ... except dropout
        total = None
        try:
            with seeded_rng(self.seed, device):
                for _ in range(self.passes):
                    probs = torch.cat([sampler(images[s].to(device)).double().softmax(1).cpu() for s in batch_slices(len(images), batch_size)])
                    total = probs if total is None else total + probs
        finally:
            for m, training in states.items():
                m.train(training)
        mean = total / self.passes
        return Scores(mean.max(1).values.numpy(), mean.numpy())


def _insert_dropout_before_final_linear(model: nn.Module, p: float) -> None:
    """Replace the last nn.Linear of ``model`` by Sequential(Dropout(p), that linear), in place."""
    named = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not named:
        raise ValueError(f"{type(model).__name__} has no linear layer to insert dropout before")
    name, layer = named[-1]
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    setattr(parent, name.rsplit(".", 1)[-1], nn.Sequential(nn.Dropout(p), layer))


class DeepEnsemble:
    """Deep ensemble (Lakshminarayanan et al., NeurIPS 2017): mean softmax of the members; score = its maximum."""

    name = "ensemble"

    def __init__(self, members: Sequence[nn.Module]):
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"a deep ensemble needs at least two models, got {len(members)}")
        self.members = members

    @staticmethod
    def from_logits(member_logits: Sequence[Tensor]) -> Scores:
        """Scores from each member's logits on the same images."""
        shapes = {tuple(t.shape) for t in member_logits}
        if len(shapes) != 1:
            raise ValueError(f"ensemble members' logits differ in shape: {sorted(shapes)}")
        mean = torch.stack([t.double().softmax(1) for t in member_logits]).mean(0)
        return Scores(mean.max(1).values.numpy(), mean.numpy())

    def score(self, images: Tensor, *, batch_size: int = 256) -> Scores:
        return self.from_logits([model_outputs(m, images, batch_size=batch_size, features=False).logits for m in self.members])


SCORE_FUNCTIONS = {cls.name: cls for cls in (MaxSoftmax, NegativeEntropy, Energy, ODIN, Mahalanobis, KNNDistance, MCDropout, ReAct)}
SCORE_NAMES = tuple(SCORE_FUNCTIONS) + ("ensemble",)


def make_score(name: str, **params: Any) -> ScoreFunction:
    """A score function by name (``ensemble`` is built from models: :class:`DeepEnsemble`)."""
    if name == "ensemble":
        raise ValueError("the ensemble score is built from several models: use DeepEnsemble(models)")
    if name not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score function {name!r}: use one of {SCORE_NAMES}")
    try:
        return SCORE_FUNCTIONS[name](**params)
    except TypeError as err:
        raise TypeError(f"bad parameters for score function {name!r}: {err}") from None


def check_score_settings(scores: Sequence[str], score_params: Mapping[str, Any] | None, where: str = "") -> None:
    """Build every score of ``scores`` with its ``score_params`` entry (a bad name or parameter is named), and refuse a
    ``score_params`` entry for a score function that does not exist (``enrgy``): it would be dropped without a word.
    ``where``: the config prefix of the names in the messages (``unknown.``)."""
    params = dict(score_params or {})
    misspelt = sorted(set(params) - set(SCORE_FUNCTIONS))
    if misspelt:
        raise ValueError(f"{where}score_params names unknown score functions {misspelt}: use some of {SCORE_NAMES}")
    for name in scores:
        make_score(name, **dict(params.get(name) or {}))


def _labels(labels, n: int) -> Tensor:
    labels = torch.as_tensor(labels, dtype=torch.long).cpu()
    if labels.shape != (n,):
        raise ValueError(f"one label per training image: got shape {tuple(labels.shape)} for {n} images")
    return labels


def _positive(value: float, name: str) -> float:
    value = float(value)
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


__all__ = [
    "DeepEnsemble", "Energy", "KNNDistance", "MCDropout", "Mahalanobis", "MaxSoftmax", "ModelOutputs", "NegativeEntropy",
    "ODIN", "ReAct", "SCORE_FUNCTIONS", "SCORE_NAMES", "ScoreFunction", "Scores", "energy_score", "final_linear",
    "check_score_settings", "feature_representation", "make_score", "model_outputs",
]
