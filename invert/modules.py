"""Small helpers for running someone else's nn.Module: eval mode with frozen weights, a memory format for the
duration of a run, the device a module lives on, and the slices that cut a batch into chunks. Every package uses
these (they live on the lowest floor)."""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn


def module_device(*modules: nn.Module | None) -> torch.device:
    """The device of the first parameter or buffer of the first module that has one (CPU when none has)."""
    for module in modules:
        if module is None:
            continue
        for tensor in list(module.parameters()) + list(module.buffers()):
            return tensor.device
    return torch.device("cpu")


def batch_slices(n: int, size: int) -> Iterable[slice]:
    """``slice``s of at most ``size`` consecutive items covering ``range(n)``."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch_size must be a positive int, got {size!r}")
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@contextlib.contextmanager
def kept_training_flags(module: nn.Module) -> Iterator[nn.Module]:
    """Give every submodule of ``module`` back its own train/eval flag on exit. ``module.train(was)`` alone would
    put all of them in the top-level mode: a frozen batch norm (``model.train(); bn.eval()``) would be unfrozen."""
    training = {m: m.training for m in module.modules()}
    try:
        yield module
    finally:
        for m, mode in training.items():
            m.training = mode


@contextlib.contextmanager
def evaluation(module: nn.Module, freeze_parameters: bool = False) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode (BatchNorm on running statistics, no dropout: required for
    per-sample independence) and optionally stop gradients to its parameters (the engine only
    needs gradients with respect to the images; frozen parameters also keep autograd from building
    weight-gradient nodes). Restores the previous modes on exit, as ``robustness``'s
    ``AttackerModel`` does around an attack.
    """
    requires_grad = {p: p.requires_grad for p in module.parameters()}
    with kept_training_flags(module):
        module.eval()
        if freeze_parameters:
            for parameter in requires_grad:
                parameter.requires_grad_(False)
        try:
            yield module
        finally:
            for parameter, flag in requires_grad.items():
                parameter.requires_grad_(flag)


@contextlib.contextmanager
def memory_format(module: nn.Module, fmt: torch.memory_format | None) -> Iterator[nn.Module]:
    """Lay ``module``'s 4-D parameters and buffers out in ``fmt`` (e.g. ``torch.channels_last``) for the duration,
    then give each the layout it had: the caller's model comes back as it went in. ``None`` changes nothing.

    ``Module.to(memory_format=...)`` alone would convert the caller's weights for good, and a later
    computation with them (the next chunk's target features, say) would round differently from the same
    computation in a fresh process, so resumed and sharded runs would no longer equal a single run.
    """
    if fmt is None:
        yield module
        return
    contiguous = {(owner, kind, name): tensor.is_contiguous()
                  for owner in module.modules() for kind in ("_parameters", "_buffers")
                  for name, tensor in getattr(owner, kind).items() if tensor is not None}
    module.to(memory_format=fmt)
    try:
        yield module
    finally:
        for (owner, kind, name), was_contiguous in contiguous.items():
            tensor = getattr(owner, kind).get(name)
            if tensor is None or not was_contiguous or tensor.is_contiguous():
                continue
            if kind == "_parameters":
                tensor.data = tensor.data.contiguous()  # the same Parameter object: optimisers keep their references
            else:
                owner._buffers[name] = tensor.contiguous()
