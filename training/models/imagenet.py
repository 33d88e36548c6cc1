"""ImageNet architectures from torchvision, by name, with its pretrained weights when they are cached.

Weights are never downloaded behind the user's back: with ``pretrained=True`` the file must already
be in torch hub's checkpoint cache (``$TORCH_HOME/hub/checkpoints``), unless ``download=True``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

# Representation layer per family: the input of the final linear classifier, as the ``robustness`` library's
# ``with_latent`` returns it (globally pooled where it is a map), and whether its fake ReLU applies there.
# VGG and AlexNet end in an MLP: their representation is the 4096-d output of the last hidden layer's ReLU
# (robustness's ``x_relu``; the authors' timm ``pre_logits``), not the pooled conv features. DenseNet's is the
# functional ReLU after ``features`` (``features`` ends in a BatchNorm). SqueezeNet has no such layer (its last
# conv is the classifier; robustness's latent there is the 1000-channel class map): its conv features are used.
# Fake ReLU sits on the last ReLU only, as in robustness; the authors' timm code puts one on every layer4 block of
# a Bottleneck ResNet and none on a BasicBlock one (ResNet18), which changes gradients, not features.
_PENULTIMATE_BY_PREFIX = (
    ("resnet", "layer4", True),
    ("wide_resnet", "layer4", True),
    ("resnext", "layer4", True),
    ("densenet", "relu", True),
    ("vgg", "classifier.4", True),
    ("alexnet", "classifier.5", True),
    ("squeezenet", "features", False),
    ("mobilenet_v3", "classifier.1", False),  # Hardswish: no ReLU to fake
    ("mobilenet", "features", False),
    ("efficientnet", "features", False),
    ("convnext", "classifier.1", False),  # after the head's LayerNorm
    ("regnet", "trunk_output", False),
    ("inception", "Mixed_7c", False),
    ("googlenet", "inception5b", False),
)


def torchvision_classifier_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def penultimate_layer(name: str) -> tuple[str | None, bool]:
    """(representation layer, fake ReLU there by default) of a torchvision architecture; (None, False) if unknown."""
    for prefix, layer, fake_relu in _PENULTIMATE_BY_PREFIX:
        if name.startswith(prefix):
            return layer, fake_relu
    return None, False


def hub_checkpoint_dir() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def build_torchvision(name: str, num_classes: int = 1000, pretrained: bool = False, download: bool = False, **arch_kwargs: Any) -> nn.Module:
    """A torchvision classifier by name; ``pretrained`` loads its default ImageNet weights from the cache.
    ``arch_kwargs`` go to the architecture's builder (e.g. ``aux_logits=False`` for an Inception-v3 checkpoint saved
    without its auxiliary head, ``dropout=0.2``)."""
    import torchvision

    known = torchvision_classifier_names()
    if name not in known:
        raise ValueError(f"unknown torchvision architecture {name!r}; known are: {', '.join(known)}")
    if not pretrained:
        return _get_model(name, weights=None, num_classes=num_classes, **arch_kwargs)
    weights = torchvision.models.get_model_weights(name).DEFAULT
    if num_classes != len(weights.meta["categories"]):
        raise ValueError(f"{name}'s pretrained weights have {len(weights.meta['categories'])} classes, not {num_classes}")
    cached = hub_checkpoint_dir() / Path(weights.url).name
    if not cached.is_file() and not download:
        raise FileNotFoundError(
            f"pretrained weights for {name} are not cached: put {cached.name} (from {weights.url}) into "
            f"{cached.parent}/ (set TORCH_HOME to use another cache), or pass download=True when online."
        )
    return _get_model(name, weights=weights, **arch_kwargs)


def _get_model(name: str, **kwargs: Any) -> nn.Module:
    import torchvision

    try:
        return torchvision.models.get_model(name, **kwargs)
    except TypeError as err:  # an argument the architecture does not take
        extra = sorted(set(kwargs) - {"weights", "num_classes"})
        raise ValueError(f"torchvision's {name} does not take the arguments {extra} ({err}): pass only those of "
                         f"torchvision.models.{name} and its model class in model.kwargs") from None
