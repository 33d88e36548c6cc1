"""Parametrisations: what the optimiser steps on, and how it becomes a [0, 1] image.

Each parametrisation maps a batch of images to parameters and back, and keeps its parameters
feasible after each step:

* ``from_image(x) -> param``: the parameters of a [0, 1] NCHW image batch;
* ``to_image(param) -> x``: differentiable, used inside the loss;
* ``project(param) -> param``: after each step (no autograd), restores feasibility; it may work
  in place on ``param``, which the engine owns.

``pixel`` steps on the image itself and clamps (Nanda et al., ``robustness``); ``sigmoid`` steps on
logits (Golan et al. 2020 with Adam, lr 0.05); ``fourier`` steps on a decorrelated Fourier spectrum
(Olah et al. 2017, Lucid's ``fft_image`` and ``to_valid_rgb``), clamped in image space.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from .steps import clamp01


class Parametrization(Protocol):
    """See the module docstring."""

    def from_image(self, x: Tensor) -> Tensor: ...

    def to_image(self, param: Tensor) -> Tensor: ...

    def project(self, param: Tensor) -> Tensor: ...


class Pixel:
    """The image is the parameter, clamped to [0, 1] after each step (the reference).

    With ``stop_at_bounds``, pixels sitting on the box boundary (exactly 0 or 1) get zero gradient, as in
    the reference run under a torch whose clamp has zero subgradient at its bounds: ``robustness``'s
    ``InputNormalize`` clamps its input. Which torch that is changed in 2026 (pytorch/pytorch#191142,
    issue #184574): from 2018 (#7049) torch's clamp passed subgradient 1 at min and max, so the authors'
    runs moved bound pixels, and so does the default here; recent releases (the pinned 2.15) pass 0.
    :func:`clamp_stops_gradient_at_bounds` tells which torch is installed. The L2-normalised step then
    spends its whole length on the pixels that can still move; on CIFAR ResNet18 inversions this lowered
    the median distance after 100 steps from 0.060 to 0.050 (14 of 16 items better). Over long runs,
    though, a pixel that reaches a bound never leaves it and images saturate, so plain gradients are the
    default.
    """

    def __init__(self, stop_at_bounds: bool = False):
        self.stop_at_bounds = stop_at_bounds

    def from_image(self, x: Tensor) -> Tensor:
        return x.detach().clone()

    def to_image(self, param: Tensor) -> Tensor:
        if not self.stop_at_bounds:
            return param
        # Same values (param is already in [0, 1]); the gradient flows through interior pixels only.
        return torch.where((param > 0) & (param < 1), param, param.detach())

    def project(self, param: Tensor) -> Tensor:
        return param.clamp_(0.0, 1.0)


def clamp_stops_gradient_at_bounds() -> bool:
    """Whether the installed torch's ``clamp(x, 0, 1)`` gives zero gradient at x = 0 and x = 1 (torch releases
    since pytorch/pytorch#191142, 2026) rather than 1 (2018 to then): the value of ``stop_at_bounds`` that runs
    exactly what ``robustness``'s clamped input does under this torch."""
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    (grad,) = torch.autograd.grad(x.clamp(0.0, 1.0).sum(), x)
    return bool((grad == 0).all())


class Sigmoid:
    """``x = sigmoid(logits)``: always in (0, 1), no projection (Golan et al. 2020).

    ``from_image`` clamps to [margin, 1 - margin] before the logit, so images with exact 0 or 1
    start at finite logits (|logit| <= 9.2 for the default margin) and still receive gradient; the logits are float32
    whatever the image's dtype, since in fp16 or bf16 neither holds.
    """

    def __init__(self, margin: float = 1e-4):
        self.margin = margin

    def from_image(self, x: Tensor) -> Tensor:
        # float32 whatever x's dtype: 1 - 1e-4 rounds to 1 in fp16 and bf16 (logit inf), and a half-precision sigmoid
        # rounds near-white to 1, passing no gradient either way: a white pixel could never move
        return torch.logit(x.detach().float().clamp(self.margin, 1 - self.margin))

    def to_image(self, param: Tensor) -> Tensor:
        return torch.sigmoid(param)

    def project(self, param: Tensor) -> Tensor:
        return param


# Lucid's square root of the ImageNet colour correlation matrix (``to_valid_rgb``), scaled so that its largest column
# norm is 1, and its inverse: both computed once on the host, where inverting needs no device sync.
_COLOR_CORRELATION_SQRT = torch.tensor([[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]], dtype=torch.float64)
_COLOR = _COLOR_CORRELATION_SQRT / torch.linalg.vector_norm(_COLOR_CORRELATION_SQRT, dim=0).max()
_COLOR_INVERSE = torch.linalg.inv(_COLOR)


class Fourier:
    """Decorrelated Fourier parametrisation (Olah et al., Distill 2017; Lucid's ``fft_image``).

    ``image = 0.5 + C @ irfft2(scale * spectrum)`` with ``scale = 1 / max(|f|, 1/max(H, W)) ** decay``
    (the 1/f prior of natural images) and, for 3-channel images, ``C`` Lucid's colour-decorrelation
    matrix. The parameters are the real and imaginary parts of the spectrum, shape
    (N, C, H, W // 2 + 1, 2).

    Differences from Lucid, on purpose: orthonormal FFTs and ``scale`` normalised to 1 at DC (so a
    step of length eta moves the image by at most sqrt(2) eta in L2: the parameters are the half spectrum
    of ``rfft2``, where each interior column stands for two conjugate bins); no
    sigmoid at the end: the image is kept in [0, 1] by :meth:`project`, which clamps *in image
    space* and maps back (the map is linear and invertible), instead of clamping the spectrum.
    """

    def __init__(self, decay_power: float = 1.0, decorrelate_colors: bool = True):
        self.decay_power = decay_power
        self.decorrelate_colors = decorrelate_colors
        self.image_size: tuple[int, int] | None = None
        # (matrix, inverse) on each (device, dtype), copied there at the first from_image (before the engine's loop):
        # a host-to-device copy, or torch.linalg.inv's error check, inside a step synchronises it and breaks a CUDA graph.
        self._colors: dict[tuple, tuple[Tensor, Tensor]] = {}

    def _scale(self, height: int, width: int, like: Tensor) -> Tensor:
        fy = torch.fft.fftfreq(height, device=like.device, dtype=torch.float32)[:, None]
        fx = torch.fft.rfftfreq(width, device=like.device, dtype=torch.float32)[None, :]
        freqs = torch.sqrt(fx * fx + fy * fy)
        scale = 1.0 / freqs.clamp_min(1.0 / max(height, width)) ** self.decay_power
        return (scale / scale.max()).to(like.dtype)

    def _color(self, channels: int, like: Tensor) -> tuple[Tensor, Tensor] | None:
        """The colour matrix and its inverse on ``like``'s device and dtype (None: no decorrelation)."""
        if not self.decorrelate_colors or channels != 3:
            return None
        key = (like.device, like.dtype)
        if key not in self._colors:
            self._colors[key] = (_COLOR.to(device=like.device, dtype=like.dtype), _COLOR_INVERSE.to(device=like.device, dtype=like.dtype))
        return self._colors[key]

    def from_image(self, x: Tensor) -> Tensor:
        height, width = x.shape[-2:]
        self.image_size = (height, width)
        centred = x.detach() - 0.5
        color = self._color(x.shape[1], x)
        if color is not None:
            centred = torch.einsum("ij,njhw->nihw", color[1], centred)
        spectrum = torch.fft.rfft2(centred, norm="ortho") / self._scale(height, width, x)
        return torch.view_as_real(spectrum).contiguous()

    def to_image(self, param: Tensor) -> Tensor:
        if self.image_size is None:
            raise RuntimeError("Fourier.to_image needs the image size: call from_image first")
        height, width = self.image_size
        spectrum = torch.complex(param[..., 0], param[..., 1]) * self._scale(height, width, param)
        image = torch.fft.irfft2(spectrum, s=(height, width), norm="ortho")
        color = self._color(image.shape[1], image)
        if color is not None:
            image = torch.einsum("ij,njhw->nihw", color[0], image)
        return image + 0.5

    def project(self, param: Tensor) -> Tensor:
        return self.from_image(clamp01(self.to_image(param)))


PARAMETRIZATIONS = {"pixel": Pixel, "sigmoid": Sigmoid, "fourier": Fourier}


def make_parametrization(name: str, stop_at_bounds: bool = False) -> Parametrization:
    """A fresh parametrisation by name: ``pixel`` (``stop_at_bounds`` as :class:`Pixel`), ``sigmoid`` or ``fourier``."""
    if name not in PARAMETRIZATIONS:
        raise ValueError(f"unknown parametrization {name!r}; choose one of {sorted(PARAMETRIZATIONS)}")
    return Pixel(stop_at_bounds) if name == "pixel" else PARAMETRIZATIONS[name]()
