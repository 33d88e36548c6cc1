"""Input checks for [0, 1] NCHW image batches, with a switch for the engine's hot loop, and for the settings of
the engine's objectives (numbers that must be finite, whole numbers).

A range check needs the tensor's min and max on the host, i.e. a device synchronisation. Public
entry points check once; inside the optimisation loop the engine enters :func:`hot_loop` and the
modules it calls (for example ``training.Representation``) skip the range part of their checks, so the
loop never waits on the GPU.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import threading
from typing import Iterator

import torch

_state = threading.local()

# 8-bit images round-trip through float with errors around 1e-7; allow a little slack.
RANGE_TOLERANCE = 1e-4


@contextlib.contextmanager
def hot_loop() -> Iterator[None]:
    """Within this block, :func:`check_images` skips checks that synchronise with the device."""
    previous = getattr(_state, "hot", False)
    _state.hot = True
    try:
        yield
    finally:
        _state.hot = previous


def in_hot_loop() -> bool:
    """True inside :func:`hot_loop`: callers should avoid host synchronisation."""
    return getattr(_state, "hot", False)


def check_number(value: object, name: str, *, least: float | None = None, positive: bool = False, why: str = "") -> None:
    """Refuse anything but a finite real number (a bool, a text, NaN, inf) that is ``>= least`` or, with ``positive``,
    ``> 0``; the message names the setting and adds ``why`` after the bound."""
    bound = " >= " + format(least, "g") if least is not None else ""
    kind = "a positive finite number" if positive else "a finite number"
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or (positive and value <= 0)
            or (least is not None and value < least)):
        raise ValueError(f"{name} must be {kind}{bound}{why}, got {value!r}")


def check_whole(value: object, name: str, *, least: int | None = None, why: str = "") -> None:
    """Refuse anything but an integer (a bool, a float such as 1.5 or 1e3, a text) that is ``>= least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (least is not None and value < least):
        bound = f" >= {least}" if least is not None else ""
        raise ValueError(f"{name} must be a whole number{bound}{why}, got {value!r}")


def check_images(x: object, name: str = "images", channels: int | None = None) -> torch.Tensor:
    """Check that ``x`` is a float image batch in [0, 1] of shape (N, C, H, W); return it.

    Raises TypeError or ValueError with a message that says what was wrong and how to fix it.
    The range check is skipped inside :func:`hot_loop` (it would synchronise with the device).
    """
    if not isinstance(x, torch.Tensor):
        if isinstance(x, torch.fx.Proxy):  # symbolic tracing (training.list_layers, Representation): no values to check yet
            return x
        raise TypeError(f"{name} must be a torch.Tensor of shape (N, C, H, W) in [0, 1], got {type(x).__name__}")
    if x.dtype == torch.uint8:
        raise TypeError(
            f"{name} are uint8; convert 8-bit images to floats in [0, 1] first, e.g. images.float() / 255"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor in [0, 1], got dtype {x.dtype}")
    if x.ndim != 4:
        hint = " (add a batch dimension with x.unsqueeze(0))" if x.ndim == 3 else ""
        raise ValueError(f"{name} must be 4-D (N, C, H, W), got shape {tuple(x.shape)}{hint}")
    if channels is not None and x.shape[1] != channels:
        hint = " (channels-last input? use x.permute(0, 3, 1, 2))" if x.shape[-1] == channels else ""
        raise ValueError(f"{name} must have {channels} channels in dim 1, got shape {tuple(x.shape)}{hint}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty: shape {tuple(x.shape)}")
    if not in_hot_loop():
        lo, hi = torch.aminmax(x.detach())
        lo, hi = float(lo), float(hi)
        if not (lo == lo and hi == hi):  # NaN compares unequal to itself
            raise ValueError(f"{name} contain NaN values")
        if lo < -RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
            hint = (
                " They look like 0-255 pixel values: divide by 255."
                if hi > 1.5 and hi <= 255 and lo >= 0
                else " They look normalised (mean/std): pass raw [0, 1] images; normalisation lives inside the model wrapper."
                if lo < 0
                else ""
            )
            raise ValueError(f"{name} must lie in [0, 1], got values in [{lo:.4g}, {hi:.4g}].{hint}")
    return x
