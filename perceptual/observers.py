"""Simulated observers: perceptual distances between [0, 1] images, computed batched.

Every observer offers

* ``pairwise(images, i, j) -> (P,)``: distances between ``images[i[p]]`` and ``images[j[p]]`` for all
  pairs at once (images are embedded once, never pair by pair in Python);
* ``matrix(a, b=None) -> (Na, Nb)``: the full distance matrix.

Observers
---------
- :class:`LPIPSObserver` (Zhang et al., CVPR 2018, the ``lpips`` package, version 0.1 heads):
  AlexNet (the paper's choice), VGG16 or SqueezeNet backbones. Inputs in [0, 1] are mapped to the
  [-1, 1] range LPIPS expects. The backbone's ImageNet weights come from ``weights_path`` or the torch
  hub cache (``$TORCH_HOME/hub/checkpoints``) and are never downloaded behind the user's back;
  explicit, labelled offline variants are ``backbone="random"`` (the package's ``pnet_rand``: random
  backbone, real heads) and ``heads=False`` (the package's ``lpips=False``: unweighted backbone
  features). The observer's ``name`` always says which variant it is.
  The distance is computed from the package's own layers, rearranged so that a whole matrix costs
  one Gram product per layer: d(a, b) = Σ_l mean_hw Σ_c w_c (â_c − b̂_c)², with â the unit-normalised
  features and w the linear heads (1 without heads), equal to ``lpips.LPIPS.forward`` (tested).
- :class:`SSIMObserver`: 1 − SSIM (Wang et al., 2004; Gaussian window 11, σ 1.5, kornia's SSIM) or
  1 − MS-SSIM (Wang et al., 2003). MS-SSIM uses as many of the 5 standard scales as fit the image
  (a 32 px image fits 2 with an 11 px window); the standard weights are renormalised over the scales
  used — a deliberate difference needed for CIFAR-size images.
- :class:`PixelL2Observer`: root-mean-square pixel difference.
- :class:`Panel`: several observers judging the same trials. Nanda et al.'s notebook averages four LPIPS
  objects (AlexNet with its heads, then, by a typo in its arguments, VGG16 three times: with heads and twice
  without). This toolkit's default panel (:func:`default_panel`) is LPIPS with and without heads plus SSIM,
  MS-SSIM and pixel L2, so its mean mixes perceptual metrics with pixel baselines that a model's invariances
  can fool differently; for a headline closer to theirs, give ``observers=[lpips,lpips-no-heads]`` (the
  per-observer numbers are in every report's JSON either way).
"""
from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import batch_slices, module_device
from invert.rng import seeded_rng
from invert.validation import check_images
from training.checkpoints import check_torch_format, first_line, weights_hash
from training.config import expand_path

from .cache import cache_key

LPIPS_BACKBONES = {"alex": "alexnet", "vgg": "vgg16", "squeeze": "squeezenet1_1"}


def quantize_8bit(x: Tensor) -> Tensor:
    """What people see: round to 8 bits (as the stimulus sets' PNGs are written)."""
    return torch.round(x.clamp(0, 1) * 255) / 255


def backbone_weights_file(net: str) -> tuple[str, str]:
    """(file name, download URL) of torchvision's ImageNet weights for an LPIPS backbone."""
    import torchvision

    if net not in LPIPS_BACKBONES:
        raise ValueError(f"unknown LPIPS network {net!r}: use one of {sorted(LPIPS_BACKBONES)}")
    url = torchvision.models.get_model_weights(LPIPS_BACKBONES[net]).IMAGENET1K_V1.url
    return Path(url).name, url


def pair_indices(i, j, n_images: int, device=None) -> tuple[Tensor, Tensor]:
    """``i`` and ``j`` as int64 index vectors of one length into ``n_images`` images: one distance per pair. Indexing
    alone would broadcast a single index against many, cut ``j`` to ``len(i)`` and wrap a negative index round; a cast
    would truncate 0.9 to 0 and read a mask as the indices 0 and 1."""
    i, j = torch.as_tensor(i, device=device), torch.as_tensor(j, device=device)
    for name, index in (("i", i), ("j", j)):
        if index.numel() and (index.dtype == torch.bool or index.is_floating_point() or index.is_complex()):
            raise ValueError(f"pair indices must be whole numbers (image positions), got {name} of dtype {index.dtype}: "
                             "use torch.nonzero(mask) for a mask")
    i, j = i.long(), j.long()
    if i.ndim != 1 or j.shape != i.shape:
        raise ValueError(f"pairwise needs two index vectors of one length (one pair per position), got shapes {tuple(i.shape)} and {tuple(j.shape)}")
    if len(i):
        lo, hi = int(torch.minimum(i.min(), j.min())), int(torch.maximum(i.max(), j.max()))
        if lo < 0 or hi >= n_images:
            raise ValueError(f"pair indices must lie in [0, {n_images}) for {n_images} images, got values in [{lo}, {hi}]")
    return i, j


def check_image_sets(a: Tensor, b: Tensor | None, channels: int | None = None) -> None:
    """Both image sets of a distance matrix checked before any work: images in [0, 1], one image shape."""
    check_images(a, "observer images", channels=channels)
    if b is not None:
        check_images(b, "observer images (second set)", channels=channels)
        if a.shape[1:] != b.shape[1:]:
            raise ValueError(f"the two image sets differ in shape: {tuple(a.shape[1:])} and {tuple(b.shape[1:])} (C, H, W); "
                             "resize one to the other's size first")


class Observer(nn.Module):
    """Base class: subclasses implement :meth:`pairwise_images` (batched pairs) or override :meth:`pairwise`."""

    name = "observer"
    batch_size = 256

    def pairwise_images(self, a: Tensor, b: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    @torch.no_grad()
    def pairwise(self, images: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Distances between ``images[i]`` and ``images[j]``, shape (P,)."""
        check_images(images, "observer images")
        return self._pairs(images, *pair_indices(i, j, len(images)))

    def _pairs(self, images: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """:meth:`pairwise` on checked images and indices."""
        device = self.device
        out = [self.pairwise_images(images[i[s]].to(device), images[j[s]].to(device)).float().cpu() for s in batch_slices(len(i), self.batch_size)]
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def matrix(self, a: Tensor, b: Tensor | None = None) -> Tensor:
        """The (Na, Nb) distance matrix between two image sets (``b=None``: ``a`` against itself)."""
        check_image_sets(a, b)
        b_ = a if b is None else b
        images = a if b is None else torch.cat([a, b_])
        offset = 0 if b is None else len(a)
        ii, jj = torch.meshgrid(torch.arange(len(a)), torch.arange(len(b_)) + offset, indexing="ij")
        return self._pairs(images, ii.flatten(), jj.flatten()).view(len(a), len(b_))

    @property
    def device(self) -> torch.device:
        return module_device(self)

    def fingerprint(self) -> str:
        """What a cached judgement of this observer is keyed by: its class, name, settings (``extra_repr``) and weights
        (LPIPS from another ``lpips_weights`` file keeps its name)."""
        return cache_key(type(self).__name__, self.name, self.extra_repr(), weights_hash(self))


class PixelL2Observer(Observer):
    """Root-mean-square pixel difference."""

    name = "pixel-l2"

    def __init__(self):
        super().__init__()
        # no weights: without a buffer .to("cuda") moved nothing and the images were judged on the CPU
        self.register_buffer("_device_anchor", torch.zeros(0), persistent=False)

    def pairwise_images(self, a: Tensor, b: Tensor) -> Tensor:
        return (a - b).square().flatten(1).mean(1).sqrt()


class SSIMObserver(Observer):
    """1 − SSIM or 1 − MS-SSIM (see the module docstring for the scale rule on small images)."""

    MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)

    def __init__(self, multiscale: bool = False, window_size: int = 11, sigma: float = 1.5):
        super().__init__()
        self.multiscale, self.window_size, self.sigma = multiscale, window_size, sigma
        self.name = "ms-ssim" if multiscale else "ssim"
        self.register_buffer("_device_anchor", torch.zeros(0), persistent=False)

    def extra_repr(self) -> str:
        return f"multiscale={self.multiscale}, window_size={self.window_size}, sigma={self.sigma}"

    def _terms(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """Per-sample mean luminance·contrast-structure and contrast-structure terms (C1, C2 for range 1)."""
        import kornia

        c1, c2 = 0.01**2, 0.03**2
        # The five local means in one blur (one kernel build and one convolution instead of five).
        blurred = kornia.filters.gaussian_blur2d(torch.cat([a, b, a * a, b * b, a * b], 1), (self.window_size,) * 2, (self.sigma,) * 2,
                                                 border_type="reflect")
        mu_a, mu_b, mean_aa, mean_bb, mean_ab = blurred.chunk(5, dim=1)
        var_a, var_b, cov = mean_aa - mu_a**2, mean_bb - mu_b**2, mean_ab - mu_a * mu_b
        cs = (2 * cov + c2) / (var_a + var_b + c2)
        luminance = (2 * mu_a * mu_b + c1) / (mu_a**2 + mu_b**2 + c1)
        return (luminance * cs).flatten(1).mean(1), cs.flatten(1).mean(1)

    def pairwise_images(self, a: Tensor, b: Tensor) -> Tensor:
        if not self.multiscale:  # kornia.metrics.ssim's value at sigma 1.5 (its fixed sigma); here sigma is honoured
            return 1 - self._terms(a, b)[0]
        scales = 1
        while scales < len(self.MS_WEIGHTS) and min(a.shape[-2:]) // 2**scales >= self.window_size:
            scales += 1
        weights = torch.tensor(self.MS_WEIGHTS[:scales], device=a.device)
        weights = weights / weights.sum()
        value = torch.ones(a.shape[0], device=a.device)
        for level in range(scales):
            ssim, cs = self._terms(a, b)
            term = ssim if level == scales - 1 else cs
            value = value * term.clamp(min=1e-8) ** weights[level]
            a, b = F.avg_pool2d(a, 2), F.avg_pool2d(b, 2)
        return 1 - value


class LPIPSObserver(Observer):
    """LPIPS distance with labelled variants (see the module docstring).

    Args:
        net: ``alex`` (default), ``vgg`` or ``squeeze``.
        backbone: ``pretrained`` (ImageNet weights from ``weights_path`` or the torch hub cache; a clear
            error names the file when it is missing) or ``random`` (offline variant, seeded).
        heads: use LPIPS's learned linear heads (True) or plain backbone features (False).
        weights_path: an explicit file with torchvision's ImageNet weights for the backbone.
        seed: seeds the random backbone, so the offline variant is the same network every run.
    """

    def __init__(
        self,
        net: str = "alex",
        backbone: str = "pretrained",
        heads: bool = True,
        weights_path: str | Path | None = None,
        seed: int = 0,
        device: str | torch.device | None = None,
    ):
        super().__init__()
        import lpips

        if backbone not in ("pretrained", "random"):
            raise ValueError(f"backbone must be 'pretrained' or 'random', got {backbone!r}")
        file_name, url = backbone_weights_file(net)
        weights_file = None
        if backbone == "pretrained":
            offline = (
                "Offline, use the labelled variants instead: observers=[lpips-random-backbone,lpips-no-heads-random,ssim,"
                "ms-ssim,pixel-l2] on the command line (in Python: LPIPSObserver(backbone='random') or heads=False)."
            )
            if weights_path:
                weights_file = expand_path(weights_path)
                if not weights_file.is_file():
                    raise FileNotFoundError(
                        f"LPIPS-{net} weights file not found: {weights_file}. lpips_weights= must name torchvision's "
                        f"ImageNet {LPIPS_BACKBONES[net]} weights ({file_name}, from {url}). {offline}"
                    )
            else:
                weights_file = Path(torch.hub.get_dir()) / "checkpoints" / file_name
                if not weights_file.is_file():
                    raise FileNotFoundError(
                        f"LPIPS-{net} needs torchvision's ImageNet {LPIPS_BACKBONES[net]} weights, not found at {weights_file}: "
                        f"put {file_name} (from {url}) into {weights_file.parent}/ (or set TORCH_HOME), or name the file with "
                        f"lpips_weights=FILE. {offline}"
                    )
        with seeded_rng(seed):  # the random backbone is built on the CPU
            # pnet_rand=True: never let the package download anything; real weights are loaded below.
            # The package passes torchvision's deprecated `pretrained=` argument; its warnings are noise here.
            with contextlib.redirect_stdout(None), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=UserWarning, module="torchvision")
                self.lpips = lpips.LPIPS(net=net, version="0.1", lpips=heads, pretrained=True, pnet_rand=True, verbose=False)
        if weights_file is not None:
            self._load_backbone(weights_file, net)
        self.lpips.eval().requires_grad_(False)
        self.net, self.backbone, self.heads, self.seed = net, backbone, heads, seed
        self.variant = "lpips" if backbone == "pretrained" and heads else (
            ("random backbone" if backbone == "random" else "pretrained backbone") + (", real heads" if heads else ", no heads")
        )
        self.name = f"lpips-{net}" + ("" if self.variant == "lpips" else f" [{self.variant}]")
        if device is not None:
            self.to(device)

    def _load_backbone(self, weights_file: Path, net: str) -> None:
        """Copy torchvision's ``features.{i}`` weights into the package's slices (named by the same i)."""
        try:
            check_torch_format(weights_file)  # an image or a text file: said as such, not as torch's safe-load advice
            state = torch.load(weights_file, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"lpips_weights={weights_file} is not a readable torchvision weights file (truncated or corrupt?): "
                             f"{first_line(err)}") from err
        expected = f"torchvision's ImageNet {LPIPS_BACKBONES[net]} weights (a state dict with keys features.N.weight / .bias)"
        if not isinstance(state, dict) or not any(str(k).startswith("features.") for k in state):
            keys = list(state)[:3] if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{weights_file} is not {expected}: it holds {keys} ... (a training checkpoint wrapping the state dict, or "
                             "keys with a 'module.' prefix? save model.state_dict() of the torchvision model)")
        for slice_module in self.lpips.net.children():
            for index, layer in slice_module.named_children():
                own = layer.state_dict()
                if own:
                    try:
                        layer.load_state_dict({k: state[f"features.{index}.{k}"] for k in own})
                    except (KeyError, RuntimeError) as err:
                        raise ValueError(f"{weights_file} does not fit LPIPS-{net}'s layer features.{index}: need {expected} "
                                         f"({type(err).__name__}: {str(err).splitlines()[0]})") from None

    def features(self, x: Tensor) -> list[Tensor]:
        """Unit-normalised backbone features per layer, scaled by the heads' weights where used: (N, C, H, W)."""
        model = self.lpips
        outs = model.net.forward(model.scaling_layer(2 * x - 1))
        # lpips.normalize_tensor: divide by the channel norm plus 1e-10 (not F.normalize's max(norm, eps)).
        return [o / (o.square().sum(1, keepdim=True).sqrt() + 1e-10) for o in outs]

    def _head_weights(self, layer: int, channels: int, device) -> Tensor:
        if not self.heads:
            return torch.ones(channels, device=device)
        return self.lpips.lins[layer].model[-1].weight.view(-1)

    @staticmethod
    def _channels(images: Tensor) -> int:
        """RGB, or greyscale (the package repeats it over RGB too): anything else, e.g. channels-last, is refused."""
        return 1 if isinstance(images, Tensor) and images.ndim == 4 and images.shape[1] == 1 else 3

    @torch.no_grad()
    def embed(self, images: Tensor) -> list[Tensor]:
        """Per-layer (N, C, H·W) feature matrices for Gram-product distances, kept in float32 as the backbone computes them
        (:meth:`_distances` widens one layer at a time to float64: all of them at once would take 2x the memory)."""
        check_images(images, "observer images", channels=self._channels(images))
        return self._embed(images)

    def _embed(self, images: Tensor) -> list[Tensor]:
        """:meth:`embed` of checked images."""
        per_layer: list[list[Tensor]] = []
        for s in batch_slices(len(images), self.batch_size):
            feats = self.features(images[s].to(self.device).float())
            for k, f in enumerate(feats):
                if len(per_layer) <= k:
                    per_layer.append([])
                per_layer[k].append(f.float().flatten(2))  # (n, C, HW)
        return [torch.cat(chunks) for chunks in per_layer]

    @torch.no_grad()
    def _distances(self, fa: list[Tensor], fb: list[Tensor], pairs: tuple[Tensor, Tensor] | None) -> Tensor:
        total = None
        for k, (a, b) in enumerate(zip(fa, fb)):
            w = self._head_weights(k, a.shape[1], a.device).double().view(1, -1, 1)
            hw = a.shape[2]
            if pairs is None:
                a, b = a.double(), b.double()
                sq_a, sq_b = (w * a * a).sum((1, 2)), (w * b * b).sum((1, 2))
                cross = (w * a).flatten(1) @ b.flatten(1).T
                d = (sq_a[:, None] + sq_b[None, :] - 2 * cross) / hw
            else:
                a, b = a[pairs[0]].double(), b[pairs[1]].double()  # only this chunk's pairs
                d = ((w * a * a).sum((1, 2)) + (w * b * b).sum((1, 2)) - 2 * ((w * a) * b).sum((1, 2))) / hw
            total = d if total is None else total + d
        return total.clamp(min=0).float().cpu()

    @torch.no_grad()  # as the base class's: images straight from an optimisation require grad
    def pairwise(self, images: Tensor, i: Tensor, j: Tensor) -> Tensor:
        check_image_sets(images, None, channels=self._channels(images))
        i, j = pair_indices(i, j, len(images))
        feats = self._embed(images)
        i, j = i.to(feats[0].device), j.to(feats[0].device)
        # batch_size pairs at a time: a pair's weighted feature product is as large as one image's features
        out = [self._distances(feats, feats, (i[s], j[s])) for s in batch_slices(len(i), self.batch_size)]
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def matrix(self, a: Tensor, b: Tensor | None = None) -> Tensor:
        check_image_sets(a, b, channels=self._channels(a))
        fa = self._embed(a)
        return self._distances(fa, fa if b is None else self._embed(b), None)

    def pairwise_images(self, a: Tensor, b: Tensor) -> Tensor:
        fa, fb = self.embed(a), self.embed(b)
        idx = torch.arange(len(a), device=fa[0].device)
        return self._distances(fa, fb, (idx, idx))


def offline_variants(variants) -> list[str]:
    """The LPIPS variants among ``variants`` (observer -> variant) that run without the pretrained backbone: what a
    report names when the AlexNet weights were missing ("pretrained backbone, no heads" is in the panel with them too)."""
    return sorted({v for v in variants if "random backbone" in v})


def observer_slug(observer_name: str) -> str:
    """An observer name made file- and label-safe: ``lpips-alex [random backbone]`` → ``lpips-alex-random-backbone``."""
    return re.sub(r"[^a-z0-9]+", "-", observer_name.lower()).strip("-")


class Panel:
    """Several observers judging the same trials; results per observer and as mean ± std."""

    def __init__(self, observers: Sequence[Observer]):
        if not observers:
            raise ValueError("a panel needs at least one observer")
        names = [o.name for o in observers]
        if len(set(names)) != len(names):
            raise ValueError(f"observer names must be unique within a panel, got {names}")
        # Slugs name the observers' files and simulated subjects, so they must differ too ('SSIM' and 'ssim' do not).
        by_slug: dict[str, list[str]] = {}
        for name in names:
            by_slug.setdefault(observer_slug(name), []).append(name)
        clashes = [group for group in by_slug.values() if len(group) > 1]
        if clashes:
            raise ValueError(f"observers {clashes} differ only in case or punctuation, which their files and subject names drop: rename one")
        self.observers = list(observers)

    def __iter__(self):
        return iter(self.observers)

    def __len__(self) -> int:
        return len(self.observers)

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.observers]


ObserverFactory = Callable[..., Observer]
# name -> factory(net=, weights_path=, seed=) -> Observer. Add one with @register_observer("name").
OBSERVERS: dict[str, ObserverFactory] = {}


def register_observer(name: str) -> Callable[[ObserverFactory], ObserverFactory]:
    """Register ``factory(net, weights_path, seed) -> Observer`` under ``name``, which then works everywhere
    an observer is named (``observers=[name]`` on the command line, :func:`make_observer`)."""

    def register(factory: ObserverFactory) -> ObserverFactory:
        if name in OBSERVERS and OBSERVERS[name] is not factory:
            raise ValueError(f"an observer named {name!r} is already registered")
        OBSERVERS[name] = factory
        return factory

    return register


@register_observer("lpips")
def _lpips(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    """LPIPS with the pretrained backbone and the real heads; never falls back to a random backbone."""
    return LPIPSObserver(net, "pretrained", True, weights_path, seed)


@register_observer("lpips-random-backbone")
def _lpips_random_backbone(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return LPIPSObserver(net, "random", True, None, seed)


@register_observer("lpips-no-heads")
def _lpips_no_heads(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return LPIPSObserver(net, "pretrained", False, weights_path, seed)


@register_observer("lpips-no-heads-random")
def _lpips_no_heads_random(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return LPIPSObserver(net, "random", False, None, seed)


@register_observer("ssim")
def _ssim(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return SSIMObserver(multiscale=False)


@register_observer("ms-ssim")
def _ms_ssim(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return SSIMObserver(multiscale=True)


@register_observer("pixel-l2")
def _pixel_l2(net: str = "alex", weights_path: str | None = None, seed: int = 0) -> Observer:
    return PixelL2Observer()


def observer_names() -> list[str]:
    """The registered observer names."""
    return list(OBSERVERS)


def make_observer(kind: str, net: str = "alex", weights_path: str | None = None, seed: int = 0, device=None) -> Observer:
    """A registered observer by name: ``lpips`` (pretrained backbone, real heads), ``lpips-random-backbone``,
    ``lpips-no-heads`` (pretrained backbone), ``lpips-no-heads-random``, ``ssim``, ``ms-ssim``, ``pixel-l2``,
    or one added with :func:`register_observer`. A variant that needs weights never falls back silently to a
    random backbone."""
    if kind not in OBSERVERS:
        raise ValueError(f"unknown observer {kind!r}: use one of {observer_names()}")
    observer = OBSERVERS[kind](net=net, weights_path=weights_path, seed=seed)
    return observer.to(device) if device is not None else observer


def lpips_weights_available(net: str = "alex", weights_path: str | None = None) -> bool:
    file_name, _ = backbone_weights_file(net)
    path = expand_path(weights_path) if weights_path else Path(torch.hub.get_dir()) / "checkpoints" / file_name
    return path.is_file()


def default_panel(net: str = "alex", weights_path: str | None = None, seed: int = 0, device=None) -> Panel:
    """LPIPS with real weights when they are there; otherwise the labelled offline variants. Plus the
    weight-free observers (SSIM, MS-SSIM, pixel L2), which the authors' panel does not have (module docstring).

    Only the torch hub cache may be missing: a ``weights_path`` given explicitly is used, and one that is not a
    file is an error (LPIPS was asked for), never a quiet switch to the random backbone."""
    if weights_path or lpips_weights_available(net):
        kinds = ["lpips", "lpips-no-heads"]
    else:
        kinds = ["lpips-random-backbone", "lpips-no-heads-random"]
    kinds += ["ssim", "ms-ssim", "pixel-l2"]
    return Panel([make_observer(k, net, weights_path, seed, device) for k in kinds])


def lpips_distance_matrix(images: Tensor) -> Tensor:
    """(N, N) LPIPS-AlexNet distances between 8-bit-quantised images, for hard clustering from the command line
    (``python -m stimuli trials task=clustering_hard distance=perceptual.observers:lpips_distance_matrix``).

    Uses the pretrained backbone when its weights are cached, else the labelled random-backbone variant,
    and warns which one it used."""
    observer = default_panel().observers[0]
    if observer.variant != "lpips":
        warnings.warn(f"LPIPS AlexNet weights are not cached: hard triplets use {observer.name}", stacklevel=2)
    return observer.matrix(quantize_8bit(images))
