"""Objectives: per-sample losses over images, minimised by the engine.

Every objective is an ``nn.Module`` called as ``objective(x, items=None, step=0)`` and returns a
loss of shape (N,), one value per row of ``x`` (a [0, 1] NCHW batch):

* ``items``: a 1-D long tensor saying which items the rows of ``x`` are, as indices into the
  objective's per-item buffers (targets, origins, classes). ``None`` means "all items, in order"
  (``x`` has one row per item). This is how the engine runs a micro-batch, or the still-active
  subset of one, against the right targets without copying the objective.
* ``step``: the optimisation step (an int or a 0-d tensor on the device); only objectives with
  randomness (:class:`TransformRobust`) use it.

Objectives add with ``+`` (e.g. ``InversionLoss(...) + TotalVariation(1e-3)``).

References: Nanda et al., "Do Invariances in Deep Neural Networks Align with Human Perception?"
(AAAI 2023) for Eq. 1 (inversion) and Eq. 2 (two-model controversial); Golan, Raju & Kriegeskorte,
"Controversial stimuli" (PNAS 2020) for the class-controversial objective; Mahendran & Vedaldi
(CVPR 2015) for the TV and alpha-norm priors; Olah et al. / Lucid for transformation robustness.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import kornia.geometry.transform as kgt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .modules import evaluation
from .rng import hashed_uniform
from .validation import check_images, check_number, check_whole

Step = Union[int, Tensor]


def rows(buffer: Tensor, items: Tensor | None, n: int, name: str) -> Tensor:
    """The rows of a per-item ``buffer`` for a batch of ``n`` rows: all of it when ``items`` is None."""
    if items is None:
        if buffer.shape[0] != n:
            raise ValueError(
                f"the batch has {n} rows but the objective holds {buffer.shape[0]} {name}; pass items= "
                "to say which items the rows are"
            )
        return buffer
    return buffer.index_select(0, items)


def check_push_weight(lam: float) -> float:
    """Eq. 2's ``lambda`` as a float: finite and >= 0 (a negative weight pulls model B's representation towards
    the origin instead of pushing it away)."""
    lam = float(lam)
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lambda (the weight of the push-away term, Nanda et al. Eq. 2) must be a finite number >= 0, got {lam}: "
                         "a negative lambda pulls the pushed model's representation towards the origin")
    return lam


def check_sharpness(alpha: float) -> float:
    """The class-controversial smooth minimum's ``alpha`` as a float: finite and > 0 (alpha < 0 makes it a smooth
    maximum, so that one model giving its class is enough; alpha = 0 divides by zero)."""
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha (the sharpness of the class-controversial smooth minimum) must be a finite number > 0, got {alpha}: "
                         "alpha < 0 turns the minimum into a maximum, alpha = 0 divides by zero")
    return alpha


class Objective(nn.Module):
    """Base class: ``forward(x, items=None, step=0) -> (N,)`` (see the module docstring).

    ``num_items`` is the number of items the objective holds per-item buffers for (targets, origins,
    classes), or None when it has none (a prior, a plain function); the engine checks it against the
    number of starting images. ``image_shape`` is the (C, H, W) of the reference images it was built from, or None;
    the engine checks the starting images against it (a pooled representation takes any size, so a seed of the
    wrong size would otherwise be optimised without a word).
    """

    @property
    def num_items(self) -> int | None:
        return None

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return None

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __add__(self, other: "Objective") -> "SumObjective":
        if not isinstance(other, Objective):
            return NotImplemented
        left = list(self.terms) if isinstance(self, SumObjective) else [self]
        right = list(other.terms) if isinstance(other, SumObjective) else [other]
        return SumObjective(left + right)


class SumObjective(Objective):
    """The sum of several objectives, evaluated on the same rows."""

    def __init__(self, terms: Sequence[Objective]):
        super().__init__()
        self.terms = nn.ModuleList(terms)

    @property
    def num_items(self) -> int | None:
        counts = {term.num_items for term in self.terms} - {None}
        if len(counts) > 1:
            raise ValueError(f"the summed objectives hold different numbers of items: {sorted(counts)}")
        return counts.pop() if counts else None

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        shapes = {term.image_shape for term in self.terms} - {None}
        if len(shapes) > 1:
            raise ValueError(f"the summed objectives were built from images of different shapes: {sorted(shapes)}")
        return shapes.pop() if shapes else None

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        total = self.terms[0](x, items, step)
        for term in self.terms[1:]:
            total = total + term(x, items, step)
        return total


def _features(representation: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """(N, D) float32 features: flattened, and upcast from bf16 under autocast for exact norms."""
    return representation(x).flatten(1).float()


@torch.no_grad()
def compute_features(representation: nn.Module, images: Tensor, chunk_size: int = 256) -> Tensor:
    """Features of [0, 1] ``images`` in eval mode, in chunks, without autograd: (N, D) float32."""
    check_images(images, "reference images")
    with evaluation(representation):
        return torch.cat([_features(representation, chunk) for chunk in images.split(chunk_size)])


def _checked_features(features: Tensor) -> Tensor:
    """Precomputed target features, refused before any step where they cannot be one feature vector per item."""
    if not isinstance(features, Tensor) or features.ndim < 2 or features.shape[0] < 1 or features[0].numel() < 1:
        shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
        raise ValueError(f"target_features must be a tensor of shape (N, ...), one feature vector per item, got {shape}: "
                         "a single item's features need a leading batch dimension (features[None])")
    if not features.is_floating_point():
        raise ValueError(f"target_features must be floating point, got {features.dtype}")
    if features.device.type != "meta" and not bool(torch.isfinite(features).all()):
        bad = (~torch.isfinite(features.flatten(1))).any(1).nonzero().flatten().tolist()
        raise ValueError(f"target_features hold NaN or Inf for {len(bad)} item(s) {bad[:10]}: recompute them from finite images "
                         "(invert.compute_features)")
    return features


class InversionLoss(Objective):
    """Normalised representation distance ``||g(x) - g(x_t)||_2 / ||g(x_t)||_2`` (Nanda et al. Eq. 1).

    ``targets`` are [0, 1] images, one per item; their features are computed once, here, in eval mode
    and without autograd (or pass them with :meth:`from_features`). ``representation`` maps [0, 1]
    images to features (any shape; flattened per sample). As DESIGN.md requires, both sides see the
    same (normalised-inside-the-model) inputs. A zero target norm is clamped to 1e-12 rather than
    giving a NaN.
    """

    def __init__(
        self,
        representation: nn.Module,
        targets: Tensor | None = None,
        *,
        target_features: Tensor | None = None,
        chunk_size: int = 256,
        image_shape: Sequence[int] | None = None,
    ):
        super().__init__()
        if (targets is None) == (target_features is None):
            raise ValueError("pass exactly one of targets (images) and target_features")
        self.representation = representation
        if target_features is None:
            target_features = compute_features(representation, targets, chunk_size)
            image_shape = targets.shape[1:]
        if image_shape is not None and (len(image_shape) != 3 or any(isinstance(v, bool) or int(v) != v or v < 1 for v in image_shape)):
            raise ValueError(f"image_shape must be the targets' (C, H, W), three whole numbers >= 1, got {tuple(image_shape)!r}")
        self._image_shape = tuple(int(v) for v in image_shape) if image_shape is not None else None
        self._set_targets(_checked_features(target_features).detach().flatten(1).float())

    @classmethod
    def from_features(cls, representation: nn.Module, target_features: Tensor, image_shape: Sequence[int] | None = None) -> "InversionLoss":
        """Build from precomputed target features, shape (N, ...); ``image_shape``, the targets' (C, H, W), lets the engine
        refuse starting images of another size."""
        return cls(representation, target_features=target_features, image_shape=image_shape)

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self._image_shape

    def _set_targets(self, features: Tensor) -> None:
        self.register_buffer("target_features", features, persistent=False)
        self.register_buffer("target_norms", torch.linalg.vector_norm(features, dim=1).clamp_min(1e-12), persistent=False)

    @property
    def num_items(self) -> int:
        return self.target_features.shape[0]

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        check_images(x, "x")
        n = x.shape[0]
        features = _features(self.representation, x)
        if features.shape[1] != self.target_features.shape[1]:  # a broadcast would give a loss that means nothing
            raise ValueError(f"the representation gives {features.shape[1]} features per image but the targets have "
                             f"{self.target_features.shape[1]}: give target features from the same representation (and layer)")
        diff = features - rows(self.target_features, items, n, "targets")
        return torch.linalg.vector_norm(diff, dim=1) / rows(self.target_norms, items, n, "targets")


@dataclass(frozen=True)
class Distance:
    """Marks a callable ``d(x, x0) -> (N,)`` as a *distance* between image batches (e.g. an LPIPS
    module), so that :class:`ControversialLoss` uses it as is instead of treating it as a
    representation. ``d`` receives [0, 1] images on both sides."""

    fn: Callable[[Tensor, Tensor], Tensor]


class DistanceToReferences(Objective):
    """``d(x, x_ref)`` for a distance ``d`` and one [0, 1] reference image per item."""

    def __init__(self, distance: Callable[[Tensor, Tensor], Tensor], references: Tensor):
        super().__init__()
        check_images(references, "references")
        self.distance = distance  # registered as a submodule when it is an nn.Module
        self.register_buffer("references", references.detach(), persistent=False)

    @property
    def num_items(self) -> int:
        return self.references.shape[0]

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.references.shape[1:])

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        return self.distance(x, rows(self.references, items, x.shape[0], "references")).reshape(x.shape[0]).float()


class ControversialLoss(Objective):
    """Two-model controversial objective (Nanda et al. Eq. 2), from origins x0, one per item:

    ``||g1(x) - g1(x0)|| / ||g1(x0)|| - lam * ||g2(x) - g2(x0)|| / ||g2(x0)||``

    Model 1 keeps its representation while model 2's moves away. ``g2`` is a representation
    (nn.Module mapping images to features), or a distance wrapped in :class:`Distance`, in which
    case the second term is ``lam * d(x, x0)`` (a distance carries its own scale: not normalised).
    """

    def __init__(
        self,
        g1: nn.Module,
        g2: Union[nn.Module, Distance],
        origins: Tensor,
        lam: float = 0.1,
        chunk_size: int = 256,
    ):
        super().__init__()
        self.lam = check_push_weight(lam)
        self.keep = InversionLoss(g1, origins, chunk_size=chunk_size)
        if isinstance(g2, Distance):
            self.push: Objective = DistanceToReferences(g2.fn, origins)
        elif callable(g2):
            self.push = InversionLoss(g2, origins, chunk_size=chunk_size)
        else:
            raise TypeError(f"g2 must be a representation (nn.Module) or a Distance(fn), got {type(g2).__name__}")

    @property
    def num_items(self) -> int:
        return self.keep.num_items

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self.keep.image_shape

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        return self.keep(x, items, step) - self.lam * self.push(x, items, step)


class TwoWayControversialLoss(Objective):
    """Both directions of :class:`ControversialLoss` in one batch: item i minimises

    ``d1(x) - lam * d2(x)`` where ``first_keeps[i]`` (model 1 keeps, model 2 is pushed: the direction A/B), else
    ``d2(x) - lam * d1(x)`` (B/A), with ``dk(x) = ||gk(x) - gk(x0)|| / ||gk(x0)||`` for the item's origin x0.

    Each direction needs both models' features of every row, so one batch of both directions costs the same
    forwards as two batches of one direction each, in half the launches: on a GPU where small batches are bound
    by kernel launches, both directions and all restarts of a controversial set then run as one batch. Row for
    row it computes exactly :class:`ControversialLoss`'s expression; only the batch around a row changes.
    """

    def __init__(self, g1: nn.Module, g2: nn.Module, origins: Tensor, first_keeps: Tensor, lam: float = 0.1, chunk_size: int = 256):
        super().__init__()
        first_keeps = torch.as_tensor(first_keeps)
        if first_keeps.dtype != torch.bool or first_keeps.shape != origins.shape[:1]:
            raise ValueError(
                f"first_keeps must be a bool tensor with one entry per origin ({origins.shape[0]},), got "
                f"{first_keeps.dtype} {tuple(first_keeps.shape)}"
            )
        self.lam = check_push_weight(lam)
        self.d1 = InversionLoss(g1, origins, chunk_size=chunk_size)
        self.d2 = InversionLoss(g2, origins, chunk_size=chunk_size)
        self.register_buffer("first_keeps", first_keeps.to(self.d1.target_features.device), persistent=False)

    @property
    def num_items(self) -> int:
        return self.d1.num_items

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        return self.d1.image_shape

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        d1, d2 = self.d1(x, items, step), self.d2(x, items, step)
        first = rows(self.first_keeps, items, x.shape[0], "origins")
        return torch.where(first, d1 - self.lam * d2, d2 - self.lam * d1)


def _class_buffer(classes: Union[int, Sequence[int], Tensor], name: str) -> Tensor:
    tensor = torch.as_tensor(classes)
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():  # 0.9 was class 0, without a word
        raise ValueError(f"{name} must be whole class indices, got {tensor.dtype} values {[round(float(v), 6) for v in tensor.flatten()[:5]]}")
    if tensor.ndim > 1:
        raise ValueError(f"{name} must be an int or a 1-D sequence of class indices, got shape {tuple(tensor.shape)}")
    if (tensor < 0).any():  # -1 would index the last class from the end, or stop the first step (a device assert on CUDA)
        raise ValueError(f"{name} must be class indices >= 0, got {sorted({int(v) for v in tensor[tensor < 0].flatten()[:5]})}")
    return tensor.long()


class ClassControversialLoss(Objective):
    """Class-controversial objective (Golan, Raju & Kriegeskorte 2020).

    Maximises the smooth minimum ``-(1/alpha) * logsumexp(-alpha * [log p1(c1), log p2(c2)])`` so
    that model 1 says ``class1`` and model 2 says ``class2``; as a loss to minimise it returns the
    negative, ``(1/alpha) * logsumexp(-alpha * v)``. Models return logits. Classes are ints (the same
    for every item) or one per item.
    """

    def __init__(
        self,
        model1: nn.Module,
        model2: nn.Module,
        class1: Union[int, Sequence[int], Tensor],
        class2: Union[int, Sequence[int], Tensor],
        alpha: float = 100.0,
    ):
        super().__init__()
        self.model1, self.model2, self.alpha = model1, model2, check_sharpness(alpha)
        self.register_buffer("class1", _class_buffer(class1, "class1"), persistent=False)
        self.register_buffer("class2", _class_buffer(class2, "class2"), persistent=False)

    @property
    def num_items(self) -> int | None:
        sizes = {b.shape[0] for b in (self.class1, self.class2) if b.ndim == 1}
        if len(sizes) > 1:
            raise ValueError(f"class1 and class2 give different numbers of items: {sorted(sizes)}")
        return sizes.pop() if sizes else None

    def _classes(self, buffer: Tensor, items: Tensor | None, n: int, name: str) -> Tensor:
        return buffer.expand(n) if buffer.ndim == 0 else rows(buffer, items, n, name)

    def log_probs(self, x: Tensor, items: Tensor | None = None) -> Tensor:
        """(N, 2): ``[log p1(class1), log p2(class2)]`` per row."""
        n = x.shape[0]
        c1 = self._classes(self.class1, items, n, "class1 labels")
        c2 = self._classes(self.class2, items, n, "class2 labels")
        logp1 = torch.log_softmax(self.model1(x).float(), dim=1).gather(1, c1[:, None])
        logp2 = torch.log_softmax(self.model2(x).float(), dim=1).gather(1, c2[:, None])
        return torch.cat([logp1, logp2], dim=1)

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        check_images(x, "x")
        return torch.logsumexp(-self.alpha * self.log_probs(x, items), dim=1) / self.alpha


NEGATIVE_PRIOR = " (a negative prior weight rewards rough or saturated images)"
LP_BELOW_ONE = " (below 1 the prior's gradient is infinite at a mid-grey pixel)"


class TotalVariation(Objective):
    """``weight * mean((dx^2 + dy^2) ** (beta / 2))`` per sample: the TV^beta prior of Mahendran & Vedaldi (2015), with
    ``dx``, ``dy`` the differences to the right and lower neighbours at every pixel, 0 past the last column and row
    (the image's edge replicated). Mahendran & Vedaldi sum over the pixels that have both neighbours, which leaves the
    last row's horizontal and the last column's vertical differences out (stripes there cost a quarter of the same
    stripes in the first row, and the corner pixel is free); the replicated edge keeps every difference once.

    The mean (instead of their sum) makes ``weight`` independent of image size; for beta < 2 a 1e-8 inside the power
    keeps the gradient finite on flat regions. At beta = 2 this is the authors' ``TVLoss`` (deep-learning-base
    ``attack/losses.py``: ``sum dy² + sum dx²`` over the full difference arrays) divided by C·H·W. For beta != 2 their
    loss raises the *total* to beta / 2, a different prior: their ``freq*`` losses with beta != 2 are not reproduced."""

    def __init__(self, weight: float = 1.0, beta: float = 2.0):
        super().__init__()
        check_number(weight, "weight", least=0, why=NEGATIVE_PRIOR)
        check_number(beta, "beta", positive=True)
        self.weight, self.beta = weight, beta

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        # The replicated edge as differences padded with 0: the replicate pad's CUDA backward adds atomically, in no
        # fixed order, which made deterministic=True runs with a TV prior differ in the last bits; a zero pad's is a slice.
        dx = F.pad(x[..., :, 1:] - x[..., :, :-1], (0, 1))
        dy = F.pad(x[..., 1:, :] - x[..., :-1, :], (0, 0, 0, 1))
        squared = dx * dx + dy * dy
        if self.beta != 2.0:
            squared = (squared + 1e-8) ** (self.beta / 2)
        return self.weight * squared.float().mean(dim=(1, 2, 3))


class LpPrior(Objective):
    """``weight * mean(|x - 0.5| ** p)`` per sample: the alpha-norm prior of Mahendran & Vedaldi
    (2015) around mid-grey, as a mean (size-independent ``weight``) and without the 1/p root, whose
    gradient is infinite at x = 0.5. The authors' ``LpLoss`` is ``||x||_p`` with the root and no 0.5 offset. ``p`` is at
    least 1: below, ``|t| ** p`` itself has an infinite slope at t = 0, so a mid-grey pixel would give a NaN gradient."""

    def __init__(self, weight: float = 1.0, p: float = 6.0):
        super().__init__()
        check_number(weight, "weight", least=0, why=NEGATIVE_PRIOR)
        check_number(p, "p", least=1, why=LP_BELOW_ONE)
        self.weight, self.p = weight, p

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        return self.weight * (x - 0.5).abs().float().pow(self.p).mean(dim=(1, 2, 3))


# The authors' CIFAR transforms (Lucid's standard set): jitter 8, scale 0.9..1.1, rotate -10..10
# degrees (0 six times as likely as any other angle), jitter 4.
LUCID_SCALES = tuple(1 + (i - 5) / 50.0 for i in range(11))
LUCID_ANGLES = tuple(float(a) for a in list(range(-10, 11)) + 5 * [0])
PADDING_MODES = ("reflection", "border", "zeros")  # grid_sample's


class TransformRobust(Objective):
    """Averages an objective over ``samples`` random transformations of the input (the authors'
    ``trans_robust`` option, after Lucid's ``transform.standard_transforms``): shifts t1 and t2 of up to
    ``jitter[0]`` and ``jitter[1]`` pixels, a scale s from ``scales`` and a rotation R (degrees from ``angles``)
    about the centre c, composed into one affine warp whose output pixel q samples the input at
    ``s R (q + t1 - c) + c + t2`` (:meth:`transforms`). On the image itself that is the reverse: a shift by -t2,
    a rotation by the opposite angle and a scale by 1/s about the centre, then a shift by -t1. The shift and angle
    draws are symmetric about 0, so this differs from Lucid's order (shift 8, scale and rotate, shift 4) in that the
    larger shift comes last and is not scaled or rotated, and in zooming by 1/1.1 to 1/0.9 rather than 0.9 to 1.1.

    The draws are a pure function of (``seed``, ``item_offset`` + item, step, sample), so an item
    sees the same transformations in any batch and on any device. Differs from Lucid on purpose: one
    bilinear warp that keeps the image size with reflection padding, instead of crops (which shrink
    the image) and separate resamplings. Differs from the authors' ``transforms.py`` too: they pad with
    zeros, shift by 0..d-1 pixels in one direction where this shifts by up to d/2 either way, draw one
    transformation per batch and step (numpy's global generator) where this draws one per item, and their
    ``random_scale`` changes the image size (upsample, then pad, no crop). Off in the paper preset.
    """

    def __init__(
        self,
        objective: Objective,
        samples: int = 1,
        jitter: tuple[int, int] = (8, 4),
        scales: Sequence[float] = LUCID_SCALES,
        angles: Sequence[float] = LUCID_ANGLES,
        seed: int = 0,
        item_offset: int = 0,
        padding_mode: str = "reflection",
    ):
        super().__init__()
        check_whole(samples, "samples", least=1)
        jitter, scales, angles = tuple(jitter), tuple(scales), tuple(angles)
        if len(jitter) != 2:
            raise ValueError(f"jitter must be two shifts in pixels (before and after the scale and rotation), got {jitter!r}")
        for shift in jitter:
            check_whole(shift, "jitter", least=0, why=" pixels")
        if not scales or not angles:
            raise ValueError(f"scales and angles must each list at least one choice (1.0 and 0.0 for none), got {scales!r}, {angles!r}")
        for scale in scales:
            check_number(scale, "scales", positive=True)
        for angle in angles:
            check_number(angle, "angles")
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"unknown padding_mode {padding_mode!r}: use one of {PADDING_MODES}")
        check_whole(seed, "seed")
        check_whole(item_offset, "item_offset", least=0)
        self.objective, self.samples, self.jitter = objective, samples, jitter
        self.seed, self.item_offset, self.padding_mode = seed, item_offset, padding_mode
        self.register_buffer("scales", torch.tensor(list(scales), dtype=torch.float32), persistent=False)
        self.register_buffer("angles", torch.tensor(list(angles), dtype=torch.float32), persistent=False)

    @property
    def num_items(self) -> int | None:
        return self.objective.num_items

    @staticmethod
    def _pick(u: Tensor, choices: Tensor) -> Tensor:
        return choices[(u * len(choices)).long().clamp_(max=len(choices) - 1)]

    @staticmethod
    def _shift(u: Tensor, jitter: int) -> Tensor:
        # Integer shifts in [-(jitter // 2), jitter - jitter // 2]: Lucid's crop offsets, centred.
        return torch.floor(u * (jitter + 1)) - jitter // 2

    def transforms(self, items: Tensor, step: Step, height: int, width: int) -> Tensor:
        """(samples * n, 2, 3) pixel-space affine maps, sample-major, for the items ``items``: the
        output pixel q samples the input at ``M q``."""
        u = hashed_uniform(self.seed, items + self.item_offset, step, 6 * self.samples)
        u = u.view(-1, self.samples, 6).transpose(0, 1).reshape(-1, 6)
        first = torch.stack([self._shift(u[:, 0], self.jitter[0]), self._shift(u[:, 1], self.jitter[0])], 1)
        second = torch.stack([self._shift(u[:, 4], self.jitter[1]), self._shift(u[:, 5], self.jitter[1])], 1)
        scale = self._pick(u[:, 2], self.scales)
        angle = self._pick(u[:, 3], self.angles)
        # torch.full keeps the centre a kernel argument (torch.tensor would copy from the host).
        center = torch.stack([torch.full_like(scale, (width - 1) / 2), torch.full_like(scale, (height - 1) / 2)], 1)
        matrix = kgt.get_rotation_matrix2d(center, angle, torch.stack([scale, scale], 1))
        # A (p + t1 - c) + c + t2 = A p + [A (t1 - c) + c] + t2: shift first, then rotate/scale, then shift.
        return torch.cat([matrix[:, :, :2], matrix[:, :, 2:] + matrix[:, :, :2] @ first.unsqueeze(-1) + second.unsqueeze(-1)], 2)

    def forward(self, x: Tensor, items: Tensor | None = None, step: Step = 0) -> Tensor:
        n, _, height, width = x.shape
        ids = items if items is not None else torch.arange(n, device=x.device)
        theta = _to_normalized(self.transforms(ids, step, height, width), height, width).to(x.dtype)
        repeated = x.repeat(self.samples, 1, 1, 1)
        # kornia's warp_affine would build its normalisation matrix with torch.tensor(..., device=)
        # on every call, a blocking host-to-device copy; the same warp via affine_grid has none.
        grid = F.affine_grid(theta, list(repeated.shape), align_corners=True)
        warped = F.grid_sample(repeated, grid, mode="bilinear", padding_mode=self.padding_mode, align_corners=True)
        loss = self.objective(warped, ids.repeat(self.samples), step)
        return loss.view(self.samples, n).mean(dim=0)


def _to_normalized(matrix: Tensor, height: int, width: int) -> Tensor:
    """Pixel-space (x, y) affine maps (B, 2, 3) to ``affine_grid``'s [-1, 1] coordinates
    (align_corners=True): with n = S p - 1, S = diag(2/(W-1), 2/(H-1)), the map is
    S A S^-1 n + S (b + A S^-1 1) - 1."""
    sx, sy = 2.0 / max(width - 1, 1), 2.0 / max(height - 1, 1)
    a, b = matrix[:, :, :2], matrix[:, :, 2]
    linear = torch.stack([torch.stack([a[:, 0, 0], a[:, 0, 1] * sx / sy], 1), torch.stack([a[:, 1, 0] * sy / sx, a[:, 1, 1]], 1)], 1)
    offset = torch.stack([b[:, 0] * sx, b[:, 1] * sy], 1) + linear.sum(2) - 1
    return torch.cat([linear, offset.unsqueeze(-1)], 2)
