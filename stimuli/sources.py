"""Targets and seeds: what the engine starts from and what it aims at.

Follows Nanda et al. (AAAI 2023), section 2.4 and appendix A.4:

- **Targets**: ``n`` images (paper: 100) drawn with a seed from a data set's test split
  (:func:`select_targets`), or out-of-distribution targets sampled pixel-wise from Gaussians
  (:func:`gaussian_targets`; the paper's Table 3, "images that look like noise").
- **Seeds** (:func:`make_seeds`), one per target and seed type: ``noise`` (uniform random pixels),
  ``train`` (a random training image), ``gray``, ``black``, ``white``. This toolkit's default is
  ``noise`` and ``train``; the authors' inversion code has noise seeds only (``super``, ``light``, ``white``,
  ``black``), and their notebook scores ``super``-noise results alone. ``shared_noise=True`` uses one noise image for every target, as the
  authors' code did (their ``initialize_seed`` is called once per run).

Every random draw comes from a generator keyed by (base seed, purpose, item)
(:func:`keyed_generator`), never by batch: target k's noise seed is the same whether 5 or 500
targets are drawn, and the first ``m`` targets of a draw of ``n > m`` are the draw of ``m``.

Noise seeds are colour noise unless ``noise_channels`` says otherwise: ``gray`` draws one uniform value
per pixel and copies it to every channel, ``auto`` does so for targets whose channels are all identical (a
greyscale data set stored as RGB, such as the embedded digits). Grey noise did not converge the robust digits
model's inversions more reliably: 20 % of its 30 noise-seeded demo items against 27 % from colour noise, and 40 %
against 23 % on another draw of seeds (README, "Why the demo's settings"), so colour stays the default.

Noise seeds are uniform in [0, 1] unless ``noise_kind`` names another distribution
(:data:`invert.NOISE_KINDS`): the authors' inversion code (``reg_free_loss.py``) starts from ``super``
("super-noise", N(0, 1), its default) or ``light`` ("light-noise", N(0, 0.01²), a nearly black image),
which its optimiser clamps to [0, 1] after the first step; here they are clamped from the start.

Deliberate differences from the authors' code: noise seeds default to uniform noise; targets are clean test
images, where their ``reg_free_loss.py`` inverts a 100-image subset of the *training* split with training
augmentation on (its data module has ``val_frac=0`` and falls back to the augmented training subset: random crop,
flip, colour jitter, rotation), so their targets are images the model was fitted on, shifted and recoloured;
:func:`select_targets` on a training set gives training targets, without augmentation. Gaussian targets
(the authors' ``random_0_1`` and ``random_0.5_2`` data sets, N(0, 1) and N(0.5, 2²)) are stored clamped to
[0, 1]; the authors' models clamp their input too (``InputNormalize``) and ``save_image`` clamps, so the targets
the models see are the same, a dark and a high-contrast light-and-dark noise; ``gaussian_targets`` draws ``n``
split between the two, where the authors ran ``n`` of each.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from invert import NOISE_KINDS, item_generator, noise_images
from invert import stream_seed as _stream_seed

SEED_TYPES = ("noise", "train", "gray", "black", "white")
CONSTANT_SEEDS = {"gray": 0.5, "black": 0.0, "white": 1.0}
DEFAULT_SEED_TYPES = ("noise", "train")
NOISE_CHANNELS = ("auto", "color", "gray")
# The authors' OOD data sets random_0_1 and random_0.5_2 (mean, std), clamped to [0, 1] here.
DEFAULT_GAUSSIANS = ({"name": "dark", "mean": 0.0, "std": 1.0}, {"name": "light", "mean": 0.5, "std": 2.0})


def stream_seed(seed: int, purpose: str) -> int:
    """A 31-bit seed for one purpose (targets, noise seeds, train seeds ...) derived from the base seed
    (:func:`invert.stream_seed` in the ``repalign.stimuli`` namespace), so that the draws for different
    purposes never share a random stream."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Real) or not float(seed).is_integer():
        raise ValueError(f"seed must be a whole number, got {seed!r}")  # int(1.5) drew what seed=1 draws
    return _stream_seed("repalign.stimuli", f"{int(seed)}:{purpose}")


def keyed_generator(seed: int, purpose: str, item: int) -> torch.Generator:
    """A CPU ``torch.Generator`` keyed by (base seed, purpose, item) alone:
    :func:`invert.item_generator` on the purpose's stream seed (a 32-bit key, a bijection of the
    item for a fixed stream, so two items of one purpose never share a generator)."""
    return item_generator(stream_seed(seed, purpose), int(item))


def noise_image(shape: Sequence[int], seed: int, purpose: str, item: int, kind: str = "uniform", gray: bool = False) -> Tensor:
    """One noise image in [0, 1] keyed by (seed, purpose, item) (:func:`invert.noise_images`): ``kind`` one
    of :data:`invert.NOISE_KINDS` (``uniform`` U[0, 1] pixels, ``gaussian`` N(0.5, 0.25²), the authors'
    ``super`` N(0, 1) and ``light`` N(0, 0.01²), clamped to [0, 1]); ``gray``: one value per pixel, the
    same in every channel."""
    drawn_shape = (1, *shape[1:]) if gray else shape
    image = noise_images(1, drawn_shape, seed=stream_seed(seed, purpose), kind=kind, first_item=int(item))[0]
    return image.expand(*shape).contiguous() if gray else image


def is_grayscale(images: Tensor) -> bool:
    """Every image has identical channels (a greyscale data set stored as RGB, like the embedded digits)."""
    return images.ndim == 4 and images.shape[1] > 1 and bool((images == images[:, :1]).all())


def resolve_noise_channels(noise_channels: str, targets: Tensor) -> str:
    """``color`` or ``gray`` for the noise seeds of ``targets``; ``auto`` is ``gray`` for greyscale targets."""
    if noise_channels not in NOISE_CHANNELS:
        raise ValueError(f"unknown noise_channels {noise_channels!r}: use one of {NOISE_CHANNELS}")
    if noise_channels == "auto":
        return "gray" if is_grayscale(targets) else "color"
    return noise_channels


@dataclass
class Targets:
    """Target (or origin) images and where they came from.

    images: float32 (n, C, H, W) in [0, 1]. labels: int64 (n,), -1 where there is none (Gaussian
    targets). source_index: int64 (n,), the index in the data split, -1 where there is none.
    source: the data set name or ``gaussian:<name>`` per image. split: the data split or None.
    params: how they were drawn (recorded in the set's parameters).
    """

    images: Tensor
    labels: Tensor
    source_index: Tensor
    sources: list[str]
    split: str | None
    classes: list[str] | None = None
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.images.ndim != 4 or not self.images.is_floating_point():
            raise ValueError(f"target images must be float (n, C, H, W) in [0, 1], got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.shape != (n,) or self.source_index.shape != (n,) or len(self.sources) != n:
            raise ValueError("Targets needs one label, source index and source per image")

    def __len__(self) -> int:
        return self.images.shape[0]

    def class_name(self, i: int) -> str | None:
        label = int(self.labels[i])
        if label < 0 or not self.classes:
            return None
        return self.classes[label] if label < len(self.classes) else None


def _dataset_name(dataset: Any) -> str:
    return getattr(dataset, "name", None) or type(dataset).__name__


def _materialise(dataset: Any, index: Tensor) -> tuple[Tensor, Tensor, list[str] | None]:
    """(float images, labels, class names) of ``dataset[index]`` for an ImageSet or a folder data set."""
    if hasattr(dataset, "float_images"):  # training.ImageSet: uint8 in memory
        return dataset.float_images(index), dataset.labels[index].clone(), list(dataset.classes)
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):  # e.g. torchvision ImageFolder
        items = [dataset[int(i)] for i in index]
        images = torch.stack([torch.as_tensor(image, dtype=torch.float32) for image, _ in items])
        labels = torch.tensor([int(label) for _, label in items], dtype=torch.long)
        return images, labels, list(getattr(dataset, "classes", []) or []) or None
    raise TypeError(f"expected a training.ImageSet or an indexable data set of (image, label), got {type(dataset).__name__}")


def select_targets(dataset: Any, n: int = 100, seed: int = 0, split: str | None = None, name: str | None = None,
                   key: str = "n_targets") -> Targets:
    """``n`` distinct images of ``dataset`` (normally its test split) drawn with ``seed``.

    The draw is a seeded permutation whose first ``n`` entries are taken, so target ``k`` does not
    depend on ``n``. ``dataset`` is a :class:`training.ImageSet` or an indexable data set of
    ([0, 1] image, label) pairs (an ImageNet folder; only the chosen images are read). ``key``: the option that
    gave ``n``, named in a refusal (``n_origins`` for controversial sets).
    """
    size = len(dataset)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):  # 2.5 failed in slicing
        raise ValueError(f"{key} must be a whole number, got {n!r}")
    if not 1 <= n <= size:
        raise ValueError(f"cannot draw {n} images from a data set of {size}: use 1 <= {key} <= {size}")
    index = torch.randperm(size, generator=keyed_generator(seed, "targets", 0))[:n]
    images, labels, classes = _materialise(dataset, index)
    name = name or _dataset_name(dataset)
    split = split or getattr(dataset, "split", None)
    _check_unit_range(images, f"images of {name}")
    return Targets(
        images=images.float().contiguous(),
        labels=labels.long(),
        source_index=index.long(),
        sources=[name] * n,
        split=split,
        classes=classes,
        params={"source": name, "split": split, "n": n, "seed": seed, "size": size},
    )


def check_gaussians(gaussians: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Each Gaussian as ``{"name", "mean", "std"}`` with finite numbers and std >= 0 (``name`` defaults to
    ``gaussian<i>``); refuses anything else, naming the entry."""
    if not gaussians or isinstance(gaussians, (str, Mapping)):
        raise ValueError(f"gaussian targets need a list of Gaussians {{name, mean, std}}, got {gaussians!r}")
    specs = []
    for i, g in enumerate(gaussians):
        if not isinstance(g, Mapping):
            raise ValueError(f"Gaussian {i} is {g!r}: give each as {{name, mean, std}}")
        missing, unknown = {"mean", "std"} - set(g), set(g) - {"name", "mean", "std"}
        if missing or unknown:
            problem = f"lacks {sorted(missing)}" if missing else f"has unknown keys {sorted(unknown)}"
            raise ValueError(f"Gaussian {i} {problem}: give each as {{name, mean, std}}")
        try:
            mean, std = float(g["mean"]), float(g["std"])
        except (TypeError, ValueError):
            raise ValueError(f"Gaussian {i}: mean and std must be numbers, got {g['mean']!r} and {g['std']!r}") from None
        if not (math.isfinite(mean) and math.isfinite(std)) or std < 0:
            raise ValueError(f"Gaussian {i} needs a finite mean and a finite, non-negative std, got mean={mean} std={std}")
        specs.append({"name": str(g.get("name", f"gaussian{i}")), "mean": mean, "std": std})
    return specs


def gaussian_targets(
    n: int = 100,
    shape: Sequence[int] = (3, 32, 32),
    gaussians: Sequence[Mapping[str, Any]] = DEFAULT_GAUSSIANS,
    seed: int = 0,
) -> Targets:
    """Out-of-distribution targets: target ``k`` is i.i.d. N(mean, std²) pixels from Gaussian
    ``k mod len(gaussians)``, clamped to [0, 1]. Each Gaussian is ``{"name", "mean", "std"}``."""
    if n < 1:
        raise ValueError(f"n_targets must be at least 1, got {n}")
    specs = check_gaussians(gaussians)
    shape = tuple(int(s) for s in shape)
    images, sources = [], []
    for k in range(n):
        spec = specs[k % len(specs)]
        noise = torch.randn(shape, generator=keyed_generator(seed, "gaussian_targets", k))
        images.append((spec["mean"] + spec["std"] * noise).clamp_(0, 1))
        sources.append(f"gaussian:{spec['name']}")
    return Targets(
        images=torch.stack(images),
        labels=torch.full((n,), -1, dtype=torch.long),
        source_index=torch.full((n,), -1, dtype=torch.long),
        sources=sources,
        split=None,
        classes=None,
        params={"source": "gaussian", "gaussians": specs, "shape": list(shape), "n": n, "seed": seed},
    )


@dataclass
class Seeds:
    """Seed images and which target each serves.

    images: float32 (m, C, H, W) in [0, 1]. seed_types: the type of each. targets: the target
    index each belongs to, or None for the shared noise seed. train_index: the training-split index
    of ``train`` seeds (else -1), labels: their label (else -1). ``lookup[(target, seed_type)]`` is
    the row of that target's seed of that type.
    """

    images: Tensor
    seed_types: list[str]
    targets: list[int | None]
    train_index: Tensor
    labels: Tensor
    lookup: dict[tuple[int, str], int]
    train_source: str | None = None
    train_classes: list[str] | None = None
    params: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.images.shape[0]


def check_seed_types(seed_types: Sequence[str]) -> tuple[str, ...]:
    seed_types = tuple(str(s) for s in seed_types)
    if not seed_types:
        raise ValueError(f"give at least one seed type, from {SEED_TYPES}")
    unknown = [s for s in seed_types if s not in SEED_TYPES]
    if unknown:
        raise ValueError(f"unknown seed types {unknown}: use {SEED_TYPES}")
    if len(set(seed_types)) != len(seed_types):
        raise ValueError(f"seed types repeat: {list(seed_types)}")
    return seed_types


def make_seeds(
    targets: Targets,
    seed_types: Sequence[str] = DEFAULT_SEED_TYPES,
    seed: int = 0,
    train_set: Any = None,
    shared_noise: bool = False,
    noise_channels: str = "color",
    noise_kind: str = "uniform",
) -> Seeds:
    """One seed per target and seed type (the shared noise seed once, when ``shared_noise``).
    ``noise_channels``: ``color`` (the default), ``gray``, or ``auto`` (grey noise for greyscale targets).
    ``noise_kind``: the noise seeds' distribution, one of :data:`invert.NOISE_KINDS` (default ``uniform``;
    ``super`` and ``light`` are the authors' seeds).

    ``train_set`` (an ImageSet or indexable data set, the model's training split) is needed for the
    ``train`` seed type: target ``k``'s training image is drawn from a generator keyed by
    (``seed``, k). Noise seeds are keyed by (``seed``, k).
    """
    seed_types = check_seed_types(seed_types)
    if noise_kind not in NOISE_KINDS:
        raise ValueError(f"unknown noise_kind {noise_kind!r}: use one of {sorted(NOISE_KINDS)}")
    gray = resolve_noise_channels(noise_channels, targets.images) == "gray"
    if "train" in seed_types and train_set is None:
        raise ValueError("the 'train' seed type needs train_set (the training split the model was trained on)")
    shape = tuple(targets.images.shape[1:])
    n = len(targets)
    images: list[Tensor] = []
    types: list[str] = []
    owners: list[int | None] = []
    train_index: list[int] = []
    labels: list[int] = []
    lookup: dict[tuple[int, str], int] = {}

    def add(image: Tensor, seed_type: str, owner: int | None, index: int = -1, label: int = -1) -> int:
        images.append(image)
        types.append(seed_type)
        owners.append(owner)
        train_index.append(index)
        labels.append(label)
        return len(images) - 1

    if "noise" in seed_types and shared_noise:
        shared_row = add(noise_image(shape, seed, "shared_noise_seed", 0, kind=noise_kind, gray=gray), "noise", None)
    train_draws = None
    if "train" in seed_types:
        size = len(train_set)
        if size < 1:
            raise ValueError("train_set is empty: the 'train' seed type needs training images")
        # One draw per target, keyed by the target alone (so a target keeps its seed whatever n is): independent draws,
        # so two targets may share a training seed (100 digits targets get 98 distinct ones), as with replacement.
        picks = torch.tensor([int(torch.randint(size, (1,), generator=keyed_generator(seed, "train_seeds", k))) for k in range(n)], dtype=torch.long)
        train_images, train_labels, _ = _materialise(train_set, picks)
        if tuple(train_images.shape[1:]) != shape:
            raise ValueError(f"training images are {tuple(train_images.shape[1:])} but targets are {shape}: use the same data set")
        _check_unit_range(train_images, "training images")
        train_draws = (picks, train_images.float(), train_labels)
    for k in range(n):
        for seed_type in seed_types:
            if seed_type == "noise":
                if shared_noise:
                    lookup[(k, seed_type)] = shared_row
                    continue
                image = noise_image(shape, seed, "noise_seeds", k, kind=noise_kind, gray=gray)
                lookup[(k, seed_type)] = add(image, seed_type, k)
            elif seed_type == "train":
                picks, train_images, train_labels = train_draws
                lookup[(k, seed_type)] = add(train_images[k], seed_type, k, int(picks[k]), int(train_labels[k]))
            else:
                lookup[(k, seed_type)] = add(torch.full(shape, CONSTANT_SEEDS[seed_type]), seed_type, k)
    train_source = _dataset_name(train_set) if train_set is not None else None
    return Seeds(
        images=torch.stack(images).float().contiguous(),
        seed_types=types,
        targets=owners,
        train_index=torch.tensor(train_index, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        lookup=lookup,
        train_source=train_source,
        train_classes=list(getattr(train_set, "classes", []) or []) or None if train_set is not None else None,
        params={
            "types": list(seed_types),
            "shared_noise": bool(shared_noise),
            "seed": seed,
            "noise": noise_kind,
            **({"noise_channels": "gray"} if gray else {}),  # colour noise, the behaviour before the option, stays out of fingerprints
            "train_source": train_source,
            "train_size": len(train_set) if train_set is not None else None,
        },
    )


def _check_unit_range(images: Tensor, name: str) -> None:
    if images.numel() and (float(images.min()) < 0 or float(images.max()) > 1):
        raise ValueError(f"{name} are outside [0, 1] ({float(images.min()):.3g}..{float(images.max()):.3g}): give unnormalised [0, 1] images")


__all__ = [
    "CONSTANT_SEEDS",
    "DEFAULT_GAUSSIANS",
    "DEFAULT_SEED_TYPES",
    "NOISE_CHANNELS",
    "SEED_TYPES",
    "Seeds",
    "Targets",
    "check_seed_types",
    "gaussian_targets",
    "is_grayscale",
    "keyed_generator",
    "make_seeds",
    "noise_image",
    "resolve_noise_channels",
    "select_targets",
    "stream_seed",
]
