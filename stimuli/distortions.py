"""Distortion conditions: model-vs-human's parametric image manipulations, batched on the input's device.

All of them but eidolon I-III (and the 2018 paper's salt-and-pepper noise), which are not implemented.

Geirhos et al., "Generalisation in humans and deep neural networks" (NeurIPS 2018; code:
rgeirhos/generalisation-humans-DNNs, ``image_manipulation.py``) and "Partial success in closing the gap
between human and machine vision" (NeurIPS 2021; bethgelab/model-vs-human, whose parametric data sets are
those of 2018). Every function takes [0, 1] float NCHW images and returns [0, 1] images of the same shape
(rotation by 90/270 degrees needs square images), computed with torch on the images' device.

Deliberate differences that apply throughout:

* Greyscale is skimage's ``rgb2gray`` luminance (0.2125 R + 0.7154 G + 0.0721 B), as the reference code,
  replicated to three channels because the models take three.
* Randomness (uniform noise, phase noise) is a pure function of (seed, image id, generator) through
  :func:`invert.rng.hashed_uniform`: an image's distortion never depends on the batch, the device or which
  other images are distorted. The same noise pattern is scaled across a generator's parameter grid (common
  random numbers). Model-vs-human showed each subject different images per condition; here every system
  sees the same images in every condition, which trial-by-trial metrics need.
* Filter widths are given for 224 px images (model-vs-human's size) and scaled by ``size / 224``. At small
  sizes the high-pass grid's narrow filters fall below one pixel: at 32 px every width from 1.5 down leaves a
  flat grey image, and :func:`make_condition_set` warns (:meth:`Distortion.below_resolution`).
  Uniform noise is not scaled: one draw per pixel, so at 32 px its grain is coarser relative to the object than
  at 224 px.
* Sets are built from whole data-set images (e.g. 32 px CIFAR), not from 224 px ImageNet crops.
* Stored sets round to 8 bits (``stimuli.quantise``), as the 2018 reference's ``save_img`` does through
  ``scipy.misc.toimage``/``bytescale`` (``+ 0.5`` then truncation in float64: round half up); exact ties (which
  ``torch.round`` sends to the even level) and float32 near-ties may differ by one level, a few pixels in 10^5.
  Its 2023 refactor (rgeirhos/generalisation-humans-DNNs a0d7270) truncates (``(image * 255).astype("uint8")``),
  darker by half a level on average: not followed.
* Parameters are numbers or the grid's words (``contrast=0.03``, ``colour=greyscale``), not the benchmark's
  condition names (``c03``, ``bw``), which are refused with the grid.

A condition is a generator at one parameter (:class:`Distortion`, named ``"generator=parameter"``);
:data:`GRIDS` holds model-vs-human's parameter grids. :func:`make_condition_set` stores a condition as a
stimulus set on disk (``stimuli``'s format; its parameters say generator and parameter).
"""
from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from invert.modules import batch_slices
from invert.rng import hashed_uniform, stream_seed
from invert.validation import check_images

from .sets import fingerprint_of, is_complete_set, tensor_sha256

logger = logging.getLogger(__name__)

# model-vs-human's background grey: "the mean pixel value over all images" (bg_grey in image_manipulation.py).
MVH_GREY = 0.4423
REFERENCE_SIZE = 224
# skimage.color.rgb2gray's luminance weights (ITU-R BT.709), used by the reference code.
LUMINANCE_WEIGHTS = (0.2125, 0.7154, 0.0721)
# scipy.ndimage.gaussian_filter's default kernel half-width in sigmas.
GAUSSIAN_TRUNCATE = 4.0


# --------------------------------------------------------------------------------------------------
# The generators (functional form)
# --------------------------------------------------------------------------------------------------


def to_greyscale(images: Tensor) -> Tensor:
    """Luminance with skimage's ``rgb2gray`` weights, replicated to three channels (Geirhos et al. 2018).

    Single-channel input is replicated as is.
    """
    check_images(images, "images")
    if images.shape[1] == 1:
        return images.expand(-1, 3, -1, -1).clone()
    if images.shape[1] != 3:
        raise ValueError(f"images must have 1 or 3 channels, got shape {tuple(images.shape)}")
    weights = torch.tensor(LUMINANCE_WEIGHTS, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    return (images * weights).sum(1, keepdim=True).expand(-1, 3, -1, -1).clone()


def adjust_contrast(images: Tensor, contrast: float) -> Tensor:
    """(1 − c)/2 + c·x: contrast c in [0, 1] around mid grey (``adjust_contrast`` in the reference code)."""
    check_images(images, "images")
    contrast = _check_unit(contrast, "contrast")
    return (1 - contrast) / 2 + contrast * images


def uniform_noise(images: Tensor, width: float, *, image_ids: Tensor, seed: int = 0, contrast: float = 0.3) -> Tensor:
    """Contrast ``contrast`` (0.3 in model-vs-human) then additive noise U[−width, width], clipped to [0, 1].

    Geirhos et al. 2018 (``uniform_noise`` and ``apply_uniform_noise``: one noise value per pixel, shared by the
    channels of the greyscale image). The caller converts to greyscale first (see :class:`Distortion`).
    Noise is keyed by (seed, image id): see the module docstring.
    """
    check_images(images, "images")
    width = _check_nonnegative(width, "width")
    n, _, h, w = images.shape
    u = hashed_uniform(int(seed), _ids(image_ids, n, images.device), _salt("uniform_noise"), h * w)
    noise = ((2 * u - 1) * width).view(n, 1, h, w).to(images.dtype)
    return (adjust_contrast(images, contrast) + noise).clamp(0, 1)


def gaussian_kernel1d(sigma: float, truncate: float = GAUSSIAN_TRUNCATE) -> Tensor:
    """scipy.ndimage's Gaussian kernel: exp(−x²/2σ²) over |x| <= int(truncate·σ + 0.5), normalised to sum 1."""
    radius = int(truncate * float(sigma) + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * x.square() / float(sigma) ** 2)
    return kernel / kernel.sum()


def gaussian_blur(images: Tensor, sigma: float, cval: float = MVH_GREY) -> Tensor:
    """Gaussian filter of each channel with constant padding ``cval`` beyond the border.

    Equals ``scipy.ndimage.gaussian_filter(channel, sigma, mode="constant", cval=cval)`` (same kernel and
    truncation; separable, padding each pass with ``cval`` as scipy does). ``sigma = 0`` returns the input.
    """
    check_images(images, "images")  # uint8 images would round the kernel to zeros: an all-black result
    sigma = _check_nonnegative(sigma, "sigma")
    if sigma == 0:
        return images.clone()
    if math.isinf(sigma):
        raise ValueError("sigma = inf is not a blur; high_pass takes sigma = inf as the unfiltered image")
    n, c, h, w = images.shape
    kernel = gaussian_kernel1d(sigma).to(device=images.device, dtype=images.dtype)
    radius = (kernel.numel() - 1) // 2
    x = images.reshape(n * c, 1, h, w)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), value=cval), kernel.view(1, 1, -1, 1))
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), value=cval), kernel.view(1, 1, 1, -1))
    return x.view(n, c, h, w)


def low_pass(images: Tensor, sigma: float, background: float = MVH_GREY) -> Tensor:
    """Gaussian low-pass with padding value 0.4423, clipped (``low_pass_filter``, Geirhos et al. 2018)."""
    check_images(images, "images")
    return gaussian_blur(images, sigma, background).clamp(0, 1)


def high_pass(images: Tensor, sigma: float, background: float = MVH_GREY) -> Tensor:
    """x − G_σ(x), shifted so that each image's mean is 0.4423, clipped (``high_pass_filter``, 2018).

    ``sigma = inf`` is the benchmark's unfiltered condition, the original image (Geirhos et al. 2018, appendix:
    "inf (original image)"; its humans score there as on the other originals). It is not the filter's limit
    x − mean(x) + 0.4423, which shifts the brightness and clips.
    The mean is taken per image and channel (the reference filters one greyscale channel).
    """
    check_images(images, "images")
    sigma = _check_nonnegative(sigma, "sigma")
    if math.isinf(sigma):
        return images.clone()
    detail = images - gaussian_blur(images, sigma, background)
    return (detail + (background - detail.mean(dim=(2, 3), keepdim=True))).clamp(0, 1)


def conjugate_index(h: int, w: int, device=None) -> tuple[Tensor, Tensor]:
    """For every frequency (ky, kx) of an h×w FFT grid, the indices of its conjugate (−ky mod h, −kx mod w)."""
    ky = (-torch.arange(h, device=device)) % h
    kx = (-torch.arange(w, device=device)) % w
    return ky.view(h, 1).expand(h, w), kx.view(1, w).expand(h, w)


def phase_shift_field(h: int, w: int, width_degrees: float, *, image_ids: Tensor, seed: int = 0, device=None) -> Tensor:
    """(N, h, w) phase shifts in radians, uniform in ±width, odd under frequency negation (Hermitian-safe).

    Each conjugate pair (k, −k) gets one uniform draw θ: +θ at the pair member with the smaller flat index,
    −θ at the other, so a real image stays real. Self-conjugate frequencies (DC and, for even sizes, the
    Nyquist points) get no shift: their coefficients are real and must stay real.
    """
    width = _check_nonnegative(width_degrees, "width_degrees")
    if width > 180:
        raise ValueError(f"phase noise width is in degrees within [0, 180], got {width_degrees}")
    ids = _ids(image_ids, None, device)
    u = hashed_uniform(int(seed), ids, _salt("phase_noise"), h * w).view(-1, h, w)
    theta = (2 * u - 1) * math.radians(width)
    ky, kx = conjugate_index(h, w, ids.device)
    flat = torch.arange(h * w, device=ids.device).view(h, w)
    flat_conjugate = ky * w + kx
    mirrored = -theta[:, ky, kx]
    return torch.where(flat < flat_conjugate, theta, torch.where(flat > flat_conjugate, mirrored, torch.zeros_like(theta)))


def phase_noise(images: Tensor, width_degrees: float, *, image_ids: Tensor, seed: int = 0, clip: bool = True) -> Tensor:
    """Shift every frequency's phase by a uniform draw in ±width degrees; keep the amplitude spectrum.

    Geirhos et al. 2018 describe the manipulation this way, and their ``scramble_phases`` means to do it: Fourier
    transform, add random phase shifts "symmetrically to complex conjugate frequency pairs", inverse transform,
    real part, clip to [0, 1]. Deliberate difference: its ``shift_phases`` adds ``+s[k]`` at flat index k and
    ``-s[m]`` at index L/2 + 1 + m of the centred spectrum, so the conjugate of k gets ``-s[L/2 - 1 - k]``, not
    ``-s[k]``: the result is complex, and its real part scales each frequency's amplitude by
    |cos((s - s') / 2)| (on average 2/π at 180°). The benchmark's phase-noise stimuli therefore also lose
    contrast as the width grows (RMS contrast of a 224 px photo 0.112 → 0.099 at 90° and 0.075 at 180°), where
    these keep it. Here the shifts are odd under frequency negation, every non-self-conjugate frequency is
    shifted (the reference leaves the Nyquist row and column unshifted), the result is real by construction
    (its imaginary part is float rounding), and all channels get the same shifts.
    ``clip=False`` returns the unclipped image, whose amplitude spectrum equals the input's.
    """
    check_images(images, "images")
    n, c, h, w = images.shape
    shifts = phase_shift_field(h, w, width_degrees, image_ids=_ids(image_ids, n, images.device), seed=seed, device=images.device)
    spectrum = torch.fft.fft2(images.float())
    out = torch.fft.ifft2(spectrum * torch.polar(torch.ones_like(shifts), shifts).unsqueeze(1)).real.to(images.dtype)
    return out.clamp(0, 1) if clip else out


def mean_amplitude_spectrum(images: Tensor, batch_size: int = 512) -> Tensor:
    """(C, H, W) mean Fourier amplitude |fft2(x)| over a set of images (per channel)."""
    check_images(images, "images")
    total = None
    for start in range(0, len(images), batch_size):
        part = torch.fft.fft2(images[start:start + batch_size].float()).abs().sum(0)
        total = part if total is None else total + part
    return total / len(images)


def power_equalisation(images: Tensor, amplitude: Tensor, clip: bool = True) -> Tensor:
    """Replace each image's amplitude spectrum by ``amplitude`` (the set's mean), keep its phases.

    Geirhos et al. 2018 (``equalise_power_spectrum``): amplitude ← the average amplitude spectrum over all
    images of the set, inverse transform, real part, clip to [0, 1]. The mean amplitude is even under
    frequency negation and the phases odd, so the result is real.
    """
    check_images(images, "images")
    if amplitude.shape != images.shape[1:]:
        raise ValueError(f"amplitude must have the images' (C, H, W) shape {tuple(images.shape[1:])}, got {tuple(amplitude.shape)}")
    phase = torch.angle(torch.fft.fft2(images.float()))
    out = torch.fft.ifft2(torch.polar(amplitude.to(images.device).float().expand_as(phase), phase)).real.to(images.dtype)
    return out.clamp(0, 1) if clip else out


def rotate(images: Tensor, degrees: int) -> Tensor:
    """Rotation by 0, 90, 180 or 270 degrees counter-clockwise (as ``numpy.rot90`` on an (H, W) image)."""
    check_images(images, "images")
    if degrees not in (0, 90, 180, 270):
        raise ValueError(f"rotation is by 0, 90, 180 or 270 degrees, got {degrees!r}")
    if degrees in (90, 270) and images.shape[2] != images.shape[3]:
        raise ValueError(f"rotating by {degrees} degrees needs square images, got {tuple(images.shape[2:])}")
    return torch.rot90(images, degrees // 90, dims=(2, 3)).contiguous()


def opponent_colour(images: Tensor) -> Tensor:
    """Approximate opponent colours: negate CIE L*a*b* a* and b* (keep lightness), back to sRGB, clipped.

    Stands in for model-vs-human's "false colour" condition (Geirhos et al. 2018 showed images whose colours
    were replaced by their opponent colours at equal luminance). Differences: the swap is done in CIE Lab (D65,
    kornia's conversion, which matches skimage's), not in the 2018 paper's colour space, and out-of-gamut
    colours are clipped to [0, 1], so lightness is kept only approximately.
    """
    import kornia

    check_images(images, "images", channels=3)
    lab = kornia.color.rgb_to_lab(images.float())
    lab = torch.cat([lab[:, :1], -lab[:, 1:]], dim=1)
    return kornia.color.lab_to_rgb(lab, clip=True).clamp(0, 1).to(images.dtype)


# --------------------------------------------------------------------------------------------------
# Conditions: a generator at one parameter
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratorSpec:
    """One parametric manipulation: its parameter grid, how it is applied and which parameters it accepts.

    ``apply(distortion, images, ids, seed)`` gets the (already greyscale where ``greyscale``) images, their ids
    and the seed; ``validate(parameter)`` raises ValueError for a parameter it cannot take. Adding a generator is
    one :func:`register_generator` call with its spec, next to its function.
    """

    name: str
    grid: tuple
    greyscale: bool  # converted to greyscale first, as model-vs-human's stimuli
    description: str
    apply: Callable[..., Tensor]
    validate: Callable[[Any], None] = lambda parameter: None
    identity: tuple = ()  # parameters at which the images pass unchanged (after greyscale)
    uses_pixel_sigma: bool = False  # the parameter is a filter width in px at the reference size


GENERATORS: dict[str, GeneratorSpec] = {}


def register_generator(spec: GeneratorSpec) -> GeneratorSpec:
    """Add a generator (its name must be new); ``Distortion(name, parameter)`` and ``conditions=[name]`` then use it."""
    if spec.name in GENERATORS and GENERATORS[spec.name] is not spec:
        raise ValueError(f"a distortion generator named {spec.name!r} is already registered")
    GENERATORS[spec.name] = spec
    return spec


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _power_equalise(d: "Distortion", x: Tensor, ids: Tensor, seed: int) -> Tensor:
    if d.amplitude is None:
        raise RuntimeError("power_equalisation=equalised needs the set's mean amplitude: call .fit(images) on the whole set first")
    return power_equalisation(x, d.amplitude.to(x.device))


for _spec_ in (
    GeneratorSpec("colour", ("colour", "greyscale"), False, "colour vs greyscale (model-vs-human 'colour': cr/bw)",
                  apply=lambda d, x, ids, seed: x.clone(), identity=("colour", "greyscale")),
    GeneratorSpec("contrast", (1.0, 0.5, 0.3, 0.15, 0.1, 0.05, 0.03, 0.01), True, "contrast c: (1 − c)/2 + c·x",
                  apply=lambda d, x, ids, seed: adjust_contrast(x, d.parameter),
                  validate=lambda p: _require(0 <= p <= 1, f"contrast must lie in [0, 1], got {p}")),
    GeneratorSpec("uniform_noise", (0.0, 0.03, 0.05, 0.1, 0.2, 0.35, 0.6, 0.9), True, "contrast 0.3 plus uniform noise ±w, clipped",
                  apply=lambda d, x, ids, seed: uniform_noise(x, d.parameter, image_ids=ids, seed=seed),
                  validate=lambda p: _require(p >= 0, f"uniform_noise parameter must be >= 0, got {p}")),
    GeneratorSpec("low_pass", (0, 1, 3, 5, 7, 10, 15, 40), True, "Gaussian low-pass, sigma in px at 224 px, padding 0.4423",
                  apply=lambda d, x, ids, seed: low_pass(x, d.pixel_sigma(x.shape[-1])), uses_pixel_sigma=True,
                  validate=lambda p: (_require(p >= 0, f"low_pass parameter must be >= 0, got {p}"),
                                      _require(not math.isinf(p), "low_pass sigma must be finite"))),
    # the description is part of a condition set's fingerprint: its change rebuilds high-pass sets made before inf meant the original
    GeneratorSpec("high_pass", (math.inf, 3, 1.5, 1, 0.7, 0.55, 0.45, 0.4), True,
                  "x − G_sigma(x) shifted to mean 0.4423, sigma in px at 224 px; inf: the unfiltered image",
                  apply=lambda d, x, ids, seed: high_pass(x, d.pixel_sigma(x.shape[-1])), uses_pixel_sigma=True, identity=(math.inf,),
                  validate=lambda p: (_require(p >= 0, f"high_pass parameter must be >= 0, got {p}"),
                                      _require(p != 0, "high_pass sigma must be > 0 (sigma = 0 would remove the whole image); use inf for no filtering"))),
    GeneratorSpec("phase_noise", (0, 30, 60, 90, 120, 150, 180), True, "uniform phase shifts of ±w degrees",
                  apply=lambda d, x, ids, seed: phase_noise(x, d.parameter, image_ids=ids, seed=seed),
                  validate=lambda p: _require(0 <= p <= 180, f"phase_noise width must lie in [0, 180] degrees, got {p}")),
    GeneratorSpec("power_equalisation", ("original", "equalised"), True, "amplitude spectrum replaced by the set's mean",
                  apply=_power_equalise, identity=("original",)),
    GeneratorSpec("rotation", (0, 90, 180, 270), True, "rotation in degrees, counter-clockwise",
                  apply=lambda d, x, ids, seed: rotate(x, d.parameter),
                  validate=lambda p: _require(p in (0, 90, 180, 270), f"rotation must be 0, 90, 180 or 270 degrees, got {p}")),
    GeneratorSpec("opponent_colour", ("true", "opponent"), False, "approximate opponent colours (model-vs-human 'false colour')",
                  apply=lambda d, x, ids, seed: opponent_colour(x), identity=("true",)),
):
    register_generator(_spec_)


class _Grids(Mapping):
    """Each registered generator's parameter grid, as a read-only mapping that follows the registry."""

    def __getitem__(self, name: str) -> tuple:
        return GENERATORS[name].grid

    def __iter__(self):
        return iter(GENERATORS)

    def __len__(self) -> int:
        return len(GENERATORS)


GRIDS: Mapping[str, tuple] = _Grids()


def format_parameter(value: Any) -> str:
    """A parameter as it appears in condition names: 0.05, 40, inf, greyscale."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse_parameter(generator: str, value: Any) -> Any:
    spec = _spec(generator)
    if isinstance(spec.grid[0], str):
        value = str(value).lower() if isinstance(value, bool) else str(value)  # YAML reads `true` as a bool
        if value not in spec.grid:
            raise ValueError(f"{generator} takes one of {list(spec.grid)}, got {value!r}")
        return value
    if isinstance(value, str) and value.lower() in ("inf", "infinity"):
        value = math.inf
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{generator} takes a number (grid: {[format_parameter(v) for v in spec.grid]}), got {value!r}") from None
    if math.isnan(number):
        raise ValueError(f"{generator} parameter is NaN")
    return int(number) if generator == "rotation" and number.is_integer() else number


# Names a model-vs-human user may reach for that are not generators here: why, and what to use instead.
NOT_GENERATORS = {
    "eidolon": "eidolon I-III are not implemented (they need the Eidolon toolbox's partially coherent disarray)",
    "salt_and_pepper": "the 2018 paper's salt-and-pepper noise is not implemented; uniform_noise is",
    "false_colour": "the benchmark's false-colour experiment is opponent_colour here (opponent_colour=opponent; =true is the control)",
    "greyscale": "greyscale is a condition of the colour generator: colour=greyscale",
    "phase_scrambling": "phase scrambling is phase_noise here (phase_noise=90: the noise width in degrees)",
    "power_equalization": "power_equalisation is spelt with an s: power_equalisation=equalised",
}


def _spec(generator: str) -> GeneratorSpec:
    if generator not in GENERATORS:
        key = generator.lower().replace("-", "_")
        why = next((text for name, text in NOT_GENERATORS.items() if key.startswith(name)), None)
        raise ValueError(f"unknown distortion generator {generator!r}: " + (f"{why}. " if why else "") + f"use one of {sorted(GENERATORS)}")
    return GENERATORS[generator]


class Distortion:
    """One condition: a generator at one parameter, e.g. ``Distortion("low_pass", 40)``.

    ``reference_size`` is the image size the parameter grid is given for (224 px): filter widths are scaled
    by ``image size / reference_size`` (``pixel_sigma``). ``power_equalisation`` must be :meth:`fit` on the
    whole set first (the set's mean amplitude spectrum); the others need no fitting.
    Call with [0, 1] images (N, 3, H, W), their ids (integers, e.g. indices in the data split) and a seed.
    """

    def __init__(self, generator: str, parameter: Any, reference_size: int = REFERENCE_SIZE):
        self.spec = _spec(generator)
        self.generator = generator
        self.parameter = _parse_parameter(generator, parameter)
        if not isinstance(reference_size, int) or reference_size <= 0:
            raise ValueError(f"reference_size must be a positive int (px), got {reference_size!r}")
        self.reference_size = reference_size
        self._validate()
        self.amplitude: Tensor | None = None

    def _validate(self) -> None:
        if isinstance(self.parameter, float) and math.isnan(self.parameter):
            raise ValueError(f"{self.generator} parameter is NaN")
        self.spec.validate(self.parameter)

    @property
    def name(self) -> str:
        return f"{self.generator}={format_parameter(self.parameter)}"

    @property
    def needs_fit(self) -> bool:
        return self.generator == "power_equalisation" and self.parameter == "equalised"

    def pixel_sigma(self, image_size: int) -> float:
        """The filter width in pixels of an image of ``image_size`` px."""
        return float(self.parameter) * image_size / self.reference_size

    def below_resolution(self, image_size: int) -> str | None:
        """Why this high-pass condition leaves nothing at ``image_size`` px, or None. A pixel of x − G_σ(x) lies within
        a = 1 − w0² of 0 (w0: the 1-D kernel's centre weight; a bright pixel among dark ones), the shift to a mean of
        0.4423 moves it by at most a more, so when 2a stays inside the 8-bit level of 0.4423 every image is stored as
        one flat grey whatever its content, and every observer and model is at chance there."""
        if self.generator != "high_pass" or math.isinf(self.parameter):
            return None
        sigma = self.pixel_sigma(image_size)
        reach = 0.0 if sigma <= 0 else 2 * (1 - float(gaussian_kernel1d(sigma).max()) ** 2)
        grey = MVH_GREY * 255
        level_margin = min(grey - (round(grey) - 0.5), round(grey) + 0.5 - grey)  # from 0.4423 to its level's edges
        if reach * 255 < level_margin:
            return (f"{self.name} at {image_size} px is a Gaussian of sigma {sigma:.3g} px, below the image's resolution: "
                    "every image becomes flat grey (nothing is left to judge); drop the condition at this size or use larger images")
        return None

    def describe(self, image_size: int | None = None) -> dict:
        """What the manifest records: generator, parameter, greyscale, and the scaled width for filters."""
        out = {"generator": self.generator, "parameter": format_parameter(self.parameter), "greyscale": self._greyscale,
               "reference_size": self.reference_size, "description": self.spec.description}
        if self.spec.uses_pixel_sigma and image_size is not None:
            out["sigma_px"] = format_parameter(self.pixel_sigma(image_size))
        return out

    @property
    def _greyscale(self) -> bool:
        if self.generator == "colour":
            return self.parameter == "greyscale"
        return self.spec.greyscale

    def fit(self, images: Tensor) -> "Distortion":
        """Power equalisation: the mean amplitude spectrum of the (greyscale) set. A no-op for the others."""
        if self.needs_fit:
            self.amplitude = mean_amplitude_spectrum(to_greyscale(images))
        return self

    def __call__(self, images: Tensor, image_ids: Tensor | Sequence[int], seed: int = 0) -> Tensor:
        check_images(images, "images", channels=3)
        ids = _ids(image_ids, len(images), images.device)
        x = to_greyscale(images) if self._greyscale else images
        if self.parameter in self.spec.identity:
            return x.clone()
        return self.spec.apply(self, x, ids, seed)

    def __repr__(self) -> str:
        return f"Distortion({self.name!r})"


def parse_conditions(spec: Any, reference_size: int = REFERENCE_SIZE) -> list[Distortion]:
    """Conditions from a config list: a generator name (its whole model-vs-human grid), ``"generator=value"``,
    or a mapping ``{generator: name, params: [...]}`` (``params`` null or absent = the whole grid)."""
    if isinstance(spec, (str, Mapping)) or not isinstance(spec, Sequence):
        spec = [spec]
    out: list[Distortion] = []
    for entry in spec:
        if isinstance(entry, str):
            if "=" in entry:
                generator, value = entry.split("=", 1)
                out.append(Distortion(generator.strip(), value.strip(), reference_size))
                continue
            generator, params = entry, None
        elif isinstance(entry, Mapping):
            unknown = set(entry) - {"generator", "params"}
            if "generator" not in entry or unknown:
                raise ValueError(f"a condition mapping needs 'generator' (and optionally 'params'), got keys {sorted(entry)}")
            generator, params = entry["generator"], entry.get("params")
        else:
            raise ValueError(f"a condition is a generator name, 'generator=value' or a mapping, got {entry!r}: "
                             "e.g. conditions=[contrast,'rotation=90']")
        if params is not None and (isinstance(params, (str, bytes)) or not isinstance(params, Sequence)):
            raise ValueError(f"params of {generator!r} must be a list, e.g. params: [{params}], got {params!r}")
        values = _spec(generator).grid if params is None else list(params)
        out.extend(Distortion(generator, v, reference_size) for v in values)
    names = [d.name for d in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"conditions listed twice: {duplicates}")
    if not out:
        raise ValueError("no conditions given")
    return out


def in_grid_order(conditions: Sequence[Distortion]) -> list[Distortion]:
    """``conditions`` with each generator's levels from its grid's first (undistorted) to its last, as the benchmark
    plots them (levels off the grid fall in place by value); generators stay in the order they first appear."""
    first_seen = {c.generator: i for i, c in reversed(list(enumerate(conditions)))}

    def position(condition: Distortion) -> tuple:
        grid = GRIDS[condition.generator]
        if condition.parameter in grid:  # on the grid: its place there, whatever the grid's order
            return first_seen[condition.generator], grid.index(condition.parameter), 0.0
        # Off the grid (numbers only: a named level must be on its grid): between the grid's levels, by value, in the
        # grid's direction.
        rising, value = grid[0] <= grid[-1], float(condition.parameter)
        before = sum(1 for v in grid if (v < value if rising else v > value))
        return first_seen[condition.generator], before - 0.5, value if rising else -value

    return sorted(conditions, key=position)


# --------------------------------------------------------------------------------------------------
# Condition sets on disk
# --------------------------------------------------------------------------------------------------


def apply_batched(distortion: Distortion, images: Tensor, image_ids: Tensor, seed: int, batch_size: int = 256,
                  device: torch.device | str | None = None) -> Tensor:
    """Distort a whole set in batches on ``device`` (fitting first where needed); float [0, 1] on the CPU."""
    if not len(images):
        raise ValueError("no images to distort: select at least one (e.g. a larger limit or another split)")
    device = torch.device(device) if device is not None else images.device
    ids = torch.as_tensor(image_ids, dtype=torch.long)
    if distortion.needs_fit:
        distortion.fit(images.to(device))
    parts = [distortion(images[s].to(device), ids[s].to(device), seed).cpu() for s in batch_slices(len(images), batch_size)]
    return torch.cat(parts)


def condition_parameters(distortion: Distortion, images: Tensor, labels: Tensor, *, seed: int, dataset: str, split: str,
                         source_index: Sequence[int]) -> dict:
    """What determines a condition set's images (its stimulus-set ``parameters``; their fingerprint names the set): the
    distortion, the seed, which images, and their pixels and labels, so that changed data or preprocessing is rebuilt."""
    index = [int(i) for i in source_index]
    digest = hashlib.sha256(",".join(map(str, index)).encode()).hexdigest()
    return {**distortion.describe(images.shape[-1]), "seed": int(seed), "dataset": dataset, "split": split,
            "n_images": len(index), "source_index_sha256": digest, "image_shape": list(images.shape[1:]),
            "images_sha256": tensor_sha256(images.float()), "labels_sha256": tensor_sha256(labels.long()), "quantised": "8-bit"}


def make_condition_set(path: str | Path, distortion: Distortion, images: Tensor, labels: Tensor, source_index: Sequence[int], *,
                       classes: Sequence[str], dataset: str, split: str = "test", seed: int = 0, batch_size: int = 256,
                       device: torch.device | str | None = None, preview: bool = False, config: Mapping[str, Any] | None = None):
    """The stimulus set of one condition at ``path``: built, or reused when a complete set with the same
    parameters is there (so reruns skip finished conditions).

    Written with :func:`stimuli.write_set` (kind ``condition``; ``parameters`` name the generator, the parameter,
    the pixel sigma, the seed and which images). Rows have role ``query`` (the image every system is asked
    about), ``id`` ``<dataset>-<split>-<index>``, ``label``, ``class_name``, ``source``, ``source_split`` and
    ``source_index``. Images are distorted from the float originals and quantised to 8 bits (what people see);
    the set's exact tensors hold those 8-bit values, so models and observers judge the same pixels.
    Returns the loaded :class:`stimuli.StimulusSet`.
    """
    import pandas as pd

    import stimuli

    path = Path(path)
    index = torch.as_tensor(list(source_index), dtype=torch.long)
    labels = torch.as_tensor(labels, dtype=torch.long).cpu()
    if not (len(index) == len(labels) == len(images)):
        raise ValueError(f"one label and one source index per image: {len(images)} images, {len(labels)} labels, {len(index)} indices")
    if not len(images):
        raise ValueError(f"no images for the condition set {path}: select at least one (e.g. a larger limit or another split)")
    class_names = [classes[int(k)] for k in labels]
    parameters = condition_parameters(distortion, images, labels, seed=seed, dataset=dataset, split=split, source_index=index.tolist())
    empty = distortion.below_resolution(images.shape[-1])
    if empty:
        logger.warning(empty)
    if is_complete_set(path):
        try:
            existing = stimuli.load_set(path, verify_pngs=False)
        except stimuli.StimulusSetError as err:  # a condition set is a cache: a damaged one is made again
            logger.warning("the condition set %s cannot be read (%s): it is made again", path, err)
        else:
            # the class names are not in the fingerprint (sets made before would all be rebuilt): compared here
            if existing.fingerprint == fingerprint_of(parameters) and list(existing.manifest["class_name"]) == class_names:
                return existing
    distorted = apply_batched(distortion, images, index, seed, batch_size=batch_size, device=device)
    eight_bit = stimuli.quantise(distorted).float() / 255
    manifest = pd.DataFrame({
        "id": [f"{dataset}-{split}-{int(i):05d}" for i in index], "role": "query", "label": labels.tolist(),
        "class_name": class_names, "source": dataset, "source_split": split, "source_index": index.tolist(),
    })
    stimuli.write_set(path, eight_bit, manifest, kind="condition", parameters=parameters, config=dict(config or {}), preview=preview)
    return stimuli.load_set(path, verify_pngs=False)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _salt(purpose: str) -> int:
    """A stable 31-bit stream number per generator, so generators never share noise."""
    return stream_seed("repalign.conditions", purpose)


def _ids(image_ids: Any, n: int | None, device) -> Tensor:
    if image_ids is None:
        raise ValueError("image_ids are required: randomness is keyed by (seed, image id), never by batch position")
    ids = torch.as_tensor(image_ids, dtype=torch.long)
    if ids.ndim != 1:
        raise ValueError(f"image_ids must be 1-D, got shape {tuple(ids.shape)}")
    if n is not None and len(ids) != n:
        raise ValueError(f"one image id per image: {len(ids)} ids for {n} images")
    if len(ids) and int(ids.min()) < 0:
        raise ValueError("image ids must be non-negative integers")
    return ids.to(device) if device is not None else ids


def _check_unit(value: float, name: str) -> float:
    value = float(value)
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return value


def _check_nonnegative(value: float, name: str) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


__all__ = [
    "GENERATORS", "GRIDS", "register_generator", "LUMINANCE_WEIGHTS", "MVH_GREY", "REFERENCE_SIZE", "Distortion", "GeneratorSpec",
    "adjust_contrast", "apply_batched", "conjugate_index", "format_parameter", "gaussian_blur", "gaussian_kernel1d",
    "condition_parameters", "high_pass", "in_grid_order", "low_pass", "make_condition_set", "mean_amplitude_spectrum", "opponent_colour",
    "parse_conditions", "phase_noise", "phase_shift_field", "power_equalisation", "rotate", "to_greyscale", "uniform_noise",
]
