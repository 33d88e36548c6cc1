"""The model zoo: one entry point, :func:`build_model`, from a name and a data set.

Every model is a :class:`Classifier`: it takes [0, 1] images and normalises them itself, so
callers never handle means and standard deviations. ``Classifier.net`` is the bare network (for
CIFAR-size architectures its state-dict keys are the ``robustness`` library's).
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from invert.validation import check_images

from ..checkpoints import load_into
from ..data import DATASET_STATS, IMAGE_SIZE, NUM_CLASSES
from . import cifar  # noqa: F401  (registers the CIFAR-size architectures)
from .cifar import KWinnersTakeAll  # noqa: F401  (public: the k-WTA activation)
from .imagenet import build_torchvision, penultimate_layer, torchvision_classifier_names
from .registry import CIFAR_ARCHITECTURES, Architecture, register_model  # noqa: F401  (public: the zoo's registry)

log = logging.getLogger(__name__)

# Data sets whose models are torchvision's ImageNet architectures (224 px); all others use CIFAR-size ones.
IMAGENET_LIKE = ("imagenet",)


class Normalize(nn.Module):
    """(x - mean) / std per channel, with mean and std as buffers (saved with the weights).

    Unlike robustness's ``InputNormalize`` (and the authors' copy), it does not clamp x to [0, 1] first: inputs are
    checked to be in range instead, and an optimiser's iterate stays in the box by its own projection (see
    ``invert.InvertConfig.stop_at_bounds`` for the one place where the two differ: gradients at the bounds)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).clone())
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Classifier(nn.Module):
    """[0, 1] images (N, 3, H, W) → logits, with the data set's normalisation inside.

    Attributes: ``arch`` and ``dataset`` names, ``num_classes``, ``penultimate`` (the
    representation layer, named inside ``net``), ``fake_relu`` (its default for that layer),
    ``arch_kwargs`` (the keyword arguments the network was built with) and ``unused_checkpoint_keys`` (key prefixes a
    checkpoint may hold that loading drops: :class:`~training.models.registry.Architecture`).
    """

    def __init__(
        self,
        net: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        arch: str,
        dataset: str,
        num_classes: int,
        penultimate: str | None,
        fake_relu: bool,
    ):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.net = net
        self.arch, self.dataset, self.num_classes = arch, dataset, num_classes
        self.penultimate, self.fake_relu = penultimate, fake_relu
        self.arch_kwargs: dict = {}
        self.unused_checkpoint_keys: tuple[str, ...] = ()  # saved by the reference implementation, used by no forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The range check is skipped inside invert.validation.hot_loop() (it would sync the device).
        check_images(x, "model input", channels=3)
        return self.net(self.normalize(x))

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, dataset={self.dataset!r}, num_classes={self.num_classes}"

    def kwargs_hint(self, state) -> str:
        """Which builder arguments a checkpoint's shapes say it was made with, where they differ (see :func:`kwargs_hint`)."""
        return kwargs_hint(self, state)


def kwargs_hint(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """Which builder arguments a checkpoint was made with, when the zoo can read them off its shapes and
    they differ from the model's: e.g. `` (the checkpoint has width=16, the model width=32: pass
    +model.kwargs.width=16, or width=16 to build_model)``; empty when nothing can be told."""
    spec = CIFAR_ARCHITECTURES.get(getattr(model, "arch", ""))
    if spec is None or spec.infer_kwargs is None:
        return ""
    builder_defaults = {k: p.default for k, p in inspect.signature(spec.builder).parameters.items()}
    current = {**builder_defaults, **getattr(model, "arch_kwargs", {})}
    found = {k: v for k, v in spec.infer_kwargs(state).items() if current.get(k) != v}
    if not found:
        return ""
    try:  # advice only where it works: the network built with those arguments has the file's keys and shapes
        fitting = spec.builder(num_classes=getattr(model, "num_classes", 10), **{**getattr(model, "arch_kwargs", {}), **found}).state_dict()
    except (TypeError, ValueError):
        return ""
    weights = {k.removeprefix("net."): v.shape for k, v in state.items()
               if k.startswith("net.") and not k.startswith(spec.unused_keys or ("\0",)) and not k.endswith(".num_batches_tracked")}
    if weights != {k: v.shape for k, v in fitting.items() if not k.endswith(".num_batches_tracked")}:
        return ""
    has = ", ".join(f"{k}={v}" for k, v in found.items())
    built = ", ".join(f"{k}={current.get(k)}" for k in found)
    overrides = " ".join(f"+model.kwargs.{k}={v}" for k, v in found.items())
    return f" (the checkpoint has {has}, the model {built}: pass {overrides} on the command line, or {has} to build_model)"


def list_models(dataset: str = "cifar10") -> list[str]:
    """Architecture names :func:`build_model` accepts for ``dataset``."""
    if dataset in IMAGENET_LIKE:
        return torchvision_classifier_names()
    return sorted(CIFAR_ARCHITECTURES)


def build_model(
    name: str,
    dataset: str = "cifar10",
    *,
    num_classes: int | None = None,
    checkpoint: str | None = None,
    trust_pickle: bool = False,
    pretrained: bool = False,
    download: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    **arch_kwargs,
) -> Classifier:
    """Build a zoo model by name for a data set, optionally from a checkpoint.

    ``dataset`` picks the family (``imagenet`` → torchvision architectures at 224 px; ``cifar10``,
    ``cifar100``, ``digits`` → CIFAR-size ones), the number of classes and the normalisation.
    ``checkpoint`` may be any format :func:`training.checkpoints.load_checkpoint` reads
    (safetensors, state dicts, torchvision weights, ``robustness`` checkpoints); pickles that need
    more than ``torch.load(weights_only=True)`` are refused unless ``trust_pickle=True``.
    ``pretrained`` loads torchvision's ImageNet weights from the torch hub cache.
    ``arch_kwargs`` go to the architecture (e.g. ``ratio`` for ``kwta_resnet18``, ``width`` for ``small_cnn``).
    """
    explicit = mean is not None or std is not None
    if dataset not in DATASET_STATS and (mean is None or std is None):
        raise ValueError(
            f"unknown data set {dataset!r}: known are {sorted(DATASET_STATS)}; for another data set pass mean= and std="
        )
    default_mean, default_std = DATASET_STATS.get(dataset, (mean, std))
    mean = mean if mean is not None else default_mean  # a tensor (a robustness data set's ds.mean) has no truth value
    std = std if std is not None else default_std
    num_classes = NUM_CLASSES.get(dataset) if num_classes is None else num_classes  # 0 is not "the data set's"
    if num_classes is None:
        raise ValueError(f"num_classes is required for data set {dataset!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a whole number >= 1, got {num_classes!r}")

    if dataset in IMAGENET_LIKE:
        net = build_torchvision(name, num_classes, pretrained=pretrained, download=download, **arch_kwargs)
        penultimate, fake_relu = penultimate_layer(name)
    else:
        if name not in CIFAR_ARCHITECTURES:
            raise ValueError(
                f"unknown model {name!r} for {dataset} ({IMAGE_SIZE.get(dataset, 32)} px): known are "
                f"{', '.join(sorted(CIFAR_ARCHITECTURES))}. ImageNet architectures need data=imagenet."
            )
        if pretrained:
            raise ValueError(f"no pretrained weights for CIFAR-size {name}: pass checkpoint=PATH instead")
        spec = CIFAR_ARCHITECTURES[name]
        signature = inspect.signature(spec.builder)
        try:
            signature.bind(num_classes=num_classes, **arch_kwargs)
        except TypeError as err:  # a misspelt argument: name what the architecture takes
            taken = [p for p in signature.parameters if p != "num_classes"]
            raise ValueError(f"{name} does not take {sorted(arch_kwargs)} ({err}): its arguments are {taken}") from None
        net = spec.builder(num_classes=num_classes, **arch_kwargs)
        penultimate, fake_relu = spec.penultimate, spec.fake_relu
        defaults = {k: p.default for k, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}

    model = Classifier(
        net, mean, std, arch=name, dataset=dataset, num_classes=num_classes, penultimate=penultimate, fake_relu=fake_relu
    )
    model.arch_kwargs = dict(arch_kwargs)
    if dataset not in IMAGENET_LIKE:
        model.unused_checkpoint_keys = spec.unused_keys
    if checkpoint is not None:
        metadata = load_into(model, checkpoint, trust_pickle=trust_pickle)
        _check_saved_architecture(metadata, name, {**(defaults if dataset not in IMAGENET_LIKE else {}), **arch_kwargs}, checkpoint)
        _check_normalisation(model, mean, std, explicit, checkpoint, dataset)
    return model.eval()


def _check_saved_architecture(metadata: Mapping[str, str] | None, name: str, built: Mapping[str, Any], checkpoint) -> None:
    """Refuse a file this toolkit saved from another architecture, and warn where it was saved with other builder
    arguments: k-WTA layers hold no weight, so a ``kwta_resnet18`` file fits ``resnet18`` key for key (and one of ratio
    0.3 a ratio 0.1 build), and loaded as the other network without a word. Other arguments can be meant (the same
    weights at another k-WTA ratio), so they are named, not refused. Files without the metadata (other tools', older
    ones) pass."""
    metadata = metadata or {}
    if metadata.get("format") != "repalign":
        return
    saved = metadata.get("arch")
    if saved is not None and saved != name:
        raise ValueError(f"{checkpoint} was saved from a {saved} model, not {name}: build it as {saved} (model={saved} on the command "
                         f"line, or name: {saved} in a models entry)")
    arguments = {k[len("kwarg."):]: v for k, v in metadata.items() if k.startswith("kwarg.")}
    differing = {k: v for k, v in arguments.items() if str(built.get(k, "not given")) != v}
    if differing:
        wanted = ", ".join(f"{k}={v}" for k, v in differing.items())
        given = ", ".join(f"{k}={built.get(k, 'not given')}" for k in differing)
        log.warning("%s was saved from %s with %s; this build has %s. To load the network the file holds, pass its arguments (%s on "
                    "the command line, or kwargs: {%s} in a models entry)", checkpoint, name, wanted, given,
                    " ".join(f"model.kwargs.{item}" for item in wanted.split(", ")), wanted.replace("=", ": "))


def _check_normalisation(model: Classifier, mean, std, explicit: bool, checkpoint, dataset: str) -> None:
    """A checkpoint's own normalisation is what its weights were trained with, so it wins; one that contradicts an
    explicit ``mean=``/``std=`` is refused, one that differs from the data set's statistics is logged. A file with
    no normalisation (a plain state dict) gets the data set's statistics with a warning, unless ``mean=``/``std=``
    were given or the data set is ImageNet (torchvision's weights expect its statistics): TRADES, MART and Xiao et
    al.'s k-WTA train on raw [0, 1] inputs, and their files load without a missing key."""
    if not getattr(model, "normalization_from_checkpoint", True) and not explicit and dataset not in IMAGENET_LIKE:
        log.warning("%s holds no input normalisation: assuming %s's mean %s and std %s. A network trained on raw [0, 1] "
                    "inputs (TRADES, MART and k-WTA reference code) needs mean=[0,0,0] std=[1,1,1]", checkpoint, dataset,
                    [round(float(v), 4) for v in mean], [round(float(v), 4) for v in std])
        return
    loaded = (model.normalize.mean.flatten().tolist(), model.normalize.std.flatten().tolist())
    asked = ([float(v) for v in mean], [float(v) for v in std])
    if all(abs(a - b) <= 1e-6 for pair in zip(loaded, asked) for a, b in zip(*pair)):
        return
    if explicit:
        raise ValueError(f"{checkpoint} normalises with mean {loaded[0]} and std {loaded[1]}, not the mean={asked[0]} and std={asked[1]} "
                         "given: leave mean= and std= out to use the file's (its weights were trained with them)")
    log.warning("%s normalises with mean %s and std %s, not %s's statistics: the file's are used", checkpoint, loaded[0], loaded[1], dataset)
