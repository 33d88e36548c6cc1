"""Data augmentation on the device, batched, without host synchronisation.

Two pipelines, both drawing every random parameter on the images' device:

* :class:`SupervisedAugment`: the ``robustness`` library's CIFAR training transform
  (``data_augmentation.TRAIN_TRANSFORMS_DEFAULT``: ``RandomCrop(32, padding=4)``,
  ``RandomHorizontalFlip``, ``ColorJitter(.25, .25, .25)``, ``RandomRotation(2)``), each part
  optional. Crop and flip are one gather on the uint8 batch, the colour jitter uses kornia's
  torchvision-compatible kernels, the rotation one ``grid_sample``.
* :class:`SimCLRAugment`: Chen et al.'s (2020) augmentations for CIFAR: random resized crop
  (scale 0.08-1, ratio 3/4-4/3) and flip in one ``grid_sample``, colour jitter (strength 0.5:
  brightness, contrast, saturation 0.4, hue 0.1) with probability 0.8, greyscale with
  probability 0.2; no blur (their CIFAR setting). Nanda et al.'s own SimCLR code (deep-learning-base
  ``SIMCLR_TRAIN_TRANSFORMS`` with s = 1) uses strength 1 (brightness, contrast, saturation 0.8, hue 0.2) and a
  Gaussian blur (kernel size // 2, sigma 0.2-2, probability 0.5); ``simclr.strength=1.0`` gives their jitter,
  the blur is not offered.

Kornia's augmentation *modules* gate samples by probability with boolean indexing and skip
steps after inspecting the factors, both of which synchronise with a GPU; so the parameters are
drawn here and kornia's functional kernels (``kornia.enhance``, ``kornia.color``) are applied to
the whole batch, with ``torch.where`` for the probability gates.

Deliberate differences from torchvision: the order of the colour-jitter steps is drawn once per
batch (torchvision draws it per image); the random resized crop clips an over-large box to the
image instead of re-drawing up to ten times.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from invert.validation import check_images


def to_float(images: Tensor) -> Tensor:
    """uint8 [0, 255] → float32 [0, 1]; float input is checked to be an image batch in [0, 1] (0-255 floats, a forgotten
    ``/ 255``, would otherwise come out as 0-255 "images"; the range check is skipped inside ``hot_loop``) and returned as
    float32."""
    if images.dtype == torch.uint8:
        return images.float().div_(255)
    return check_images(images, "augmentation input").float()


def random_crop_flip(images: Tensor, padding: int = 4, flip: bool = True) -> Tensor:
    """Random crop of each image from its zero-padded copy, plus a random horizontal flip: one gather.

    Works on uint8 or float batches (N, C, H, W).
    """
    n, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding)) if padding else images
    padded_w = w + 2 * padding
    top = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    left = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    rows = top + torch.arange(h, device=device)
    cols = left + torch.arange(w, device=device)
    if flip:
        flipped = torch.rand(n, 1, device=device) < 0.5
        cols = torch.where(flipped, cols.flip(1), cols)
    # Flat index of every output pixel in its padded image; gather is faster than 3-D advanced indexing.
    index = (rows[:, :, None] * padded_w + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return padded.reshape(n, c, -1).gather(2, index).view(n, c, h, w)


def _uniform(n: int, low: float, high: float, like: Tensor) -> Tensor:
    return torch.empty(n, device=like.device, dtype=like.dtype).uniform_(low, high)


def color_jitter(
    x: Tensor, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0, hue: float = 0.0
) -> Tensor:
    """torchvision's ``ColorJitter`` on a float batch in [0, 1], factors drawn per image.

    Brightness, contrast and saturation factors are uniform in [max(0, 1 - s), 1 + s], the hue
    shift uniform in [-hue, hue] (a fraction of the colour circle); the steps run in an order drawn
    per batch. Kernels: kornia's torchvision-compatible ``adjust_*`` functions.
    """
    from kornia.enhance import (
        adjust_brightness_accumulative,
        adjust_contrast_with_mean_subtraction,
        adjust_hue,
        adjust_saturation_with_gray_subtraction,
    )

    n = x.shape[0]
    steps = []
    if brightness > 0:
        steps.append(lambda t: adjust_brightness_accumulative(t, _uniform(n, max(0.0, 1 - brightness), 1 + brightness, t)))
    if contrast > 0:
        steps.append(lambda t: adjust_contrast_with_mean_subtraction(t, _uniform(n, max(0.0, 1 - contrast), 1 + contrast, t)))
    if saturation > 0:
        steps.append(lambda t: adjust_saturation_with_gray_subtraction(t, _uniform(n, max(0.0, 1 - saturation), 1 + saturation, t)))
    if hue > 0:
        steps.append(lambda t: adjust_hue(t, _uniform(n, -hue, hue, t) * (2 * math.pi)).clamp(0, 1))
    # The order is drawn on the host from torch's CPU generator: no device round trip.
    for i in torch.randperm(len(steps)).tolist():
        x = steps[i](x)
    return x


def random_rotation(x: Tensor, degrees: float) -> Tensor:
    """Rotate each image by an angle uniform in [-degrees, degrees] about its centre, with zero fill and
    nearest-neighbour sampling (torchvision's ``RandomRotation`` defaults), as one ``grid_sample``.

    The sampling grid is the inverse rotation written down directly (kornia's ``rotate`` inverts the
    matrix with ``torch.inverse``, whose singularity check waits for the GPU).
    """
    n, _, h, w = x.shape
    angle = _uniform(n, -degrees, degrees, x) * (math.pi / 180)
    cos, sin = angle.cos(), angle.sin()
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    # Normalised coordinates scale x by 2/W and y by 2/H, hence the aspect factors on the off-diagonal.
    theta[:, 0, 0], theta[:, 0, 1] = cos, sin * (h / w)
    theta[:, 1, 0], theta[:, 1, 1] = -sin * (w / h), cos
    grid = F.affine_grid(theta, [n, x.shape[1], h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def random_grayscale(x: Tensor, p: float) -> Tensor:
    """Replace each image by its (3-channel) luminance with probability ``p``."""
    from kornia.color import rgb_to_grayscale

    chosen = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < p
    return torch.where(chosen, rgb_to_grayscale(x).expand_as(x), x)


def random_resized_crop_flip(
    x: Tensor,
    size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
) -> Tensor:
    """torchvision's ``RandomResizedCrop`` followed by ``RandomHorizontalFlip``, as one bilinear
    ``grid_sample`` per batch: area fraction uniform in ``scale``, aspect ratio (width / height in
    pixels, as torchvision) log-uniform in ``ratio``, position uniform; a box larger than the image is
    clipped to it."""
    n, _, h, w = x.shape
    area = _uniform(n, scale[0], scale[1], x)
    log_ratio = _uniform(n, math.log(ratio[0]), math.log(ratio[1]), x)
    aspect = log_ratio.exp()
    # Fractions of the image's width and height: a box of area a·H·W and pixel aspect r is sqrt(a·H·W·r) pixels wide.
    width = (area * aspect * (h / w)).sqrt().clamp(max=1.0)
    height = (area * (w / h) / aspect).sqrt().clamp(max=1.0)
    left = torch.rand(n, device=x.device, dtype=x.dtype) * (1 - width)
    top = torch.rand(n, device=x.device, dtype=x.dtype) * (1 - height)
    sign = torch.ones(n, device=x.device, dtype=x.dtype)
    if flip:
        sign = torch.where(torch.rand(n, device=x.device) < 0.5, -sign, sign)
    # affine_grid maps output coordinates in [-1, 1] to input coordinates: scale by the box size and
    # shift to the box centre (2 * centre - 1 in normalised coordinates); a negative x-scale flips.
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = width * sign
    theta[:, 0, 2] = 2 * (left + width / 2) - 1
    theta[:, 1, 1] = height
    theta[:, 1, 2] = 2 * (top + height / 2) - 1
    grid = F.affine_grid(theta, [n, x.shape[1], size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class SupervisedAugment:
    """The ``robustness`` library's CIFAR training augmentation on the device (see module docstring).

    ``crop_flip``: random crop from a ``padding``-pixel zero-padded image and horizontal flip;
    ``color_jitter``: brightness/contrast/saturation strength (0 = off; the library uses 0.25);
    ``rotation``: maximum angle in degrees (0 = off; the library uses 2).
    Call with a uint8 (or [0, 1] float) batch; returns float32 in [0, 1].
    """

    def __init__(self, crop_flip: bool = True, padding: int = 4, color_jitter: float = 0.0, rotation: float = 0.0):
        if padding < 0 or color_jitter < 0 or rotation < 0:
            raise ValueError(f"augmentation strengths must be non-negative: padding={padding}, color_jitter={color_jitter}, rotation={rotation}")
        self.crop_flip, self.padding = bool(crop_flip), int(padding)
        self.jitter, self.rotation = float(color_jitter), float(rotation)

    def __call__(self, images: Tensor) -> Tensor:
        if self.crop_flip:
            images = random_crop_flip(images, self.padding)  # on uint8: a quarter of the bytes to move
        x = to_float(images)
        if self.jitter > 0:
            x = color_jitter(x, self.jitter, self.jitter, self.jitter)
        if self.rotation > 0:
            x = random_rotation(x, self.rotation)
        return x

    def __repr__(self) -> str:
        return f"SupervisedAugment(crop_flip={self.crop_flip}, padding={self.padding}, color_jitter={self.jitter}, rotation={self.rotation})"


class SimCLRAugment:
    """Chen et al.'s SimCLR augmentation for CIFAR-size images (see module docstring).

    ``strength`` s sets the colour jitter (brightness, contrast, saturation 0.8 s, hue 0.2 s),
    applied with probability ``jitter_p``; greyscale with probability ``grayscale_p``.
    """

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        strength: float = 0.5,
        jitter_p: float = 0.8,
        grayscale_p: float = 0.2,
        flip: bool = True,
    ):
        if isinstance(scale, (str, bytes)) or not hasattr(scale, "__len__") or len(scale) != 2:
            raise ValueError(f"crop scale must be two numbers [low, high] (the crop's area fraction), got {scale!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"crop scale must satisfy 0 < low <= high <= 1, got {tuple(scale)}")
        if not strength >= 0:  # NaN too
            raise ValueError(f"colour-jitter strength must be >= 0 (0 = off), got {strength}")
        if int(size) < 1:
            raise ValueError(f"crop size must be a positive number of pixels, got {size}")
        for name, p in (("jitter_p", jitter_p), ("grayscale_p", grayscale_p)):
            if not 0 <= p <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        self.size, self.scale, self.strength = int(size), (float(scale[0]), float(scale[1])), float(strength)
        self.jitter_p, self.grayscale_p, self.flip = float(jitter_p), float(grayscale_p), bool(flip)

    def __call__(self, images: Tensor) -> Tensor:
        x = random_resized_crop_flip(to_float(images), self.size, self.scale, flip=self.flip)
        if self.strength > 0 and self.jitter_p > 0:
            s = self.strength
            jittered = color_jitter(x, 0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)
            chosen = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < self.jitter_p
            x = torch.where(chosen, jittered, x)
        if self.grayscale_p > 0:
            x = random_grayscale(x, self.grayscale_p)
        return x.clamp_(0, 1)

    def __repr__(self) -> str:
        return (
            f"SimCLRAugment(size={self.size}, scale={self.scale}, strength={self.strength}, "
            f"jitter_p={self.jitter_p}, grayscale_p={self.grayscale_p}, flip={self.flip})"
        )


__all__ = [
    "SimCLRAugment",
    "SupervisedAugment",
    "color_jitter",
    "random_crop_flip",
    "random_grayscale",
    "random_resized_crop_flip",
    "random_rotation",
    "to_float",
]
