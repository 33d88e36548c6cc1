"""Defences that are not zoo architectures: models from the user's own code (a ``module:function``
factory) and a deliberately masked defence for audits (input quantisation in front of a zoo model).

:func:`build_from_factory` is how the audit and ``measure`` build a model that is in nobody's zoo.
:class:`InputQuantised` follows the input-quantisation defences that Athalye et al., "Obfuscated
gradients give a false sense of security" (ICML 2018) broke with BPDA: rounding the input to a few
levels makes the gradient zero almost everywhere, so gradient attacks stall while the decision
function is barely more robust than the model behind it.
"""
from __future__ import annotations

import importlib
from typing import Callable, Mapping

import torch
from torch import nn

from ..checkpoints import load_into
from . import Classifier, build_model


def load_factory(path: str) -> Callable[..., nn.Module]:
    """``"module:function"`` -> the function, with an error naming what failed when it does not import."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a model factory must be 'module:function' (e.g. mypkg.models:build_defence), got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"model factory {path!r}: module {module_name!r} does not import ({err}); is it on PYTHONPATH?") from err
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"model factory {path!r}: {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise ValueError(f"model factory {path!r}: {module_name}.{attr} is a {type(factory).__name__}, not a function")
    return factory


def build_from_factory(path: str, kwargs: Mapping | None = None, *, checkpoint: str | None = None, trust_pickle: bool = False) -> nn.Module:
    """Call the factory ``path`` with ``kwargs`` (which may hold a ``checkpoint`` of the factory's own), check it returned
    an ``nn.Module`` and load ``checkpoint`` (any format :func:`training.checkpoints.read_checkpoint` reads) into it.
    Returned in eval mode."""
    model = load_factory(path)(**dict(kwargs or {}))
    if not isinstance(model, nn.Module):
        raise TypeError(f"model factory {path!r} returned {type(model).__name__}, not a torch.nn.Module: return the model itself")
    if checkpoint:
        load_into(model, checkpoint, trust_pickle=trust_pickle)
    return model.eval()


class Quantise(nn.Module):
    """Rounds [0, 1] images to ``levels`` evenly spaced values: its gradient is zero almost everywhere."""

    def __init__(self, levels: int = 8):
        super().__init__()
        if levels < 2:
            raise ValueError(f"input quantisation needs at least 2 levels, got {levels}")
        self.levels = int(levels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * (self.levels - 1)) / (self.levels - 1)

    def extra_repr(self) -> str:
        return f"levels={self.levels}"


class InputQuantised(Classifier):
    """A zoo :class:`Classifier` behind :class:`Quantise` (submodule ``quantise``, the name to give ``bpda``).

    The state dict is the inner classifier's, so its checkpoints load unchanged. The representation
    (:class:`training.Representation` traces ``net`` after ``normalize``) is the inner network's: the
    rounding has no gradient to invert through, and the defence's features are the network's features.
    """

    def __init__(self, classifier: Classifier, levels: int = 8):
        nn.Module.__init__(self)
        self.quantise = Quantise(levels)
        self.normalize, self.net = classifier.normalize, classifier.net
        self.arch, self.dataset, self.num_classes = f"quantised_{classifier.arch}", classifier.dataset, classifier.num_classes
        self.penultimate, self.fake_relu, self.arch_kwargs = classifier.penultimate, classifier.fake_relu, dict(classifier.arch_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.quantise(x))


def input_quantised(name: str, dataset: str, levels: int = 8, checkpoint: str | None = None, **arch_kwargs) -> InputQuantised:
    """Factory (``training.models.defences:input_quantised``): zoo model ``name`` (+ ``checkpoint``) behind
    ``levels``-level input quantisation, a defence with a masked gradient by construction."""
    return InputQuantised(build_model(name, dataset, checkpoint=checkpoint, **arch_kwargs), levels).eval()


__all__ = ["InputQuantised", "Quantise", "build_from_factory", "input_quantised", "load_factory"]
