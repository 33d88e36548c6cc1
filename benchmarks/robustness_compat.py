"""Make the MadryLab ``robustness`` library (1.2.1.post2) import and run under torch 2.x, on CPU too.

Used only where that library is used: the benchmarks in this folder (it is their speed anchor) and the
checkpoint-interoperability tests, which load this file by path. Two patches, both applied by :func:`import_robustness`:

1. ``torchvision.models.utils`` no longer exists; the library imports ``load_state_dict_from_url``
   from it. A stub module provides torch.hub's function under the old name.
2. The library calls ``.cuda()`` unconditionally (``Attacker.forward``, ``make_and_restore_model``).
   Where CUDA is unavailable those calls would raise, so ``Tensor.cuda`` and ``Module.cuda`` become
   no-ops on such machines. On a machine with CUDA nothing is patched.
"""
from __future__ import annotations

import importlib
import sys
import types

import torch

_PATCHED = False


def _no_cuda(self, *args, **kwargs):
    return self


def apply_patches() -> None:
    global _PATCHED
    if _PATCHED:
        return
    if "torchvision.models.utils" not in sys.modules:
        import torchvision.models

        stub = types.ModuleType("torchvision.models.utils")
        stub.load_state_dict_from_url = torch.hub.load_state_dict_from_url
        sys.modules["torchvision.models.utils"] = stub
        torchvision.models.utils = stub
    if not torch.cuda.is_available():
        torch.Tensor.cuda = _no_cuda
        torch.nn.Module.cuda = _no_cuda
    _PATCHED = True


def import_robustness():
    """Return the patched ``robustness`` package; a clear ImportError when it is not installed."""
    apply_patches()
    try:
        robustness = importlib.import_module("robustness")
        for submodule in ("attacker", "cifar_models", "datasets", "model_utils"):  # attributes of the package once imported
            importlib.import_module(f"robustness.{submodule}")
    except ImportError as err:
        missing = getattr(err, "name", None) or ""
        if missing and missing.split(".")[0] != "robustness":  # e.g. protobuf under tensorboardX: not robustness itself
            raise ImportError(f"`robustness` is installed but its dependency {missing!r} is not: install it (pip install "
                              f"{missing.split('.')[0]}). Original error: {err}") from err
        raise ImportError(
            "the `robustness` library is not installed: pip install 'repalign[robustness]' "
            f"(or robustness==1.2.1.post2). Original error: {err}"
        ) from err
    return robustness
