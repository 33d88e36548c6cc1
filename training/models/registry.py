"""The zoo's registry of CIFAR-size (32 px) architectures: one decorator next to each builder.

``@register_model("name", penultimate="layer4", fake_relu=True)`` on a function ``builder(num_classes=10,
**kwargs) -> nn.Module`` makes ``build_model("name", "cifar10")`` and ``model=small_cnn model.name=name`` on
the command line build it, with no other file to edit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch
from torch import nn


@dataclass(frozen=True)
class Architecture:
    """A zoo entry: how to build the network and which layer is its representation.

    ``fake_relu`` is the default for the representation wrapper (Nanda et al.'s code: on for
    ResNets and DenseNets, off for VGG, Inception and k-WTA models). ``infer_kwargs`` reads the
    builder's keyword arguments off a checkpoint's tensor shapes where they show (``width`` of the
    small CNN), so that a checkpoint of another size gets an error that names the argument. ``unused_keys``: prefixes
    of checkpoint keys (Classifier keys, ``net.*``) that the reference implementation saves but no forward pass uses
    (TRADES's WideResNet's ``sub_block1``); loading drops them instead of refusing the file.
    """

    builder: Callable[..., nn.Module]
    penultimate: str
    fake_relu: bool
    infer_kwargs: Optional[Callable[[Mapping[str, torch.Tensor]], dict]] = None
    unused_keys: tuple[str, ...] = ()


CIFAR_ARCHITECTURES: dict[str, Architecture] = {}


def register_model(name: str, *, penultimate: str, fake_relu: bool,
                   infer_kwargs: Optional[Callable[[Mapping[str, torch.Tensor]], dict]] = None,
                   unused_keys: tuple[str, ...] = ()) -> Callable:
    """Register a CIFAR-size architecture's builder under ``name`` (see the module docstring)."""

    def register(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in CIFAR_ARCHITECTURES and CIFAR_ARCHITECTURES[name].builder is not builder:
            raise ValueError(f"a zoo model named {name!r} is already registered")
        CIFAR_ARCHITECTURES[name] = Architecture(builder, penultimate, fake_relu, infer_kwargs, tuple(unused_keys))
        return builder

    return register


__all__ = ["Architecture", "CIFAR_ARCHITECTURES", "register_model"]
