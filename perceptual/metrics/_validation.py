"""Shared input checks for the metric functions.

Every metric takes numpy arrays or torch tensors. These helpers turn either into a numpy array and
check it; they raise TypeError for the wrong kind of object and ValueError for wrong shapes or values,
with a message that names the argument, says what was wrong and how to fix it. torch is never imported:
a tensor is recognised by its ``detach`` method.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

# A float32 softmax over 1000 classes sums to 1 within ~1e-5; leave room for rounding and storage.
PROBABILITY_ATOL = 1e-3


def as_numpy(x: Any, name: str) -> np.ndarray:
    """Return ``x`` as a numpy array; tensors are detached and moved to the CPU first."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":  # numpy has no bfloat16
            x = x.float()
        x = x.numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be array-like (numpy array, torch tensor or list), got {type(x).__name__}: {err}") from err


def as_float_array(x: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """A finite float64 array, optionally of a given number of dimensions."""
    arr = as_numpy(x, name)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.number)):
        raise TypeError(f"{name} must hold numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if ndim is not None and arr.ndim != ndim:
        hint = " (a single column? use x.reshape(-1, 1))" if ndim == 2 and arr.ndim == 1 else ""
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}{hint}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: shape {arr.shape}")
    check_finite(arr, name)
    return arr


def check_finite(arr: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s); remove or impute them first")


def as_vector(x: Any, name: str) -> np.ndarray:
    """A non-empty finite 1-D float64 array."""
    arr = as_float_array(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per item), got shape {arr.shape}")
    return arr


def as_binary(x: Any, name: str) -> np.ndarray:
    """A non-empty 1-D boolean array from booleans or 0/1 numbers (e.g. per-trial correctness)."""
    arr = as_numpy(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per trial), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: pass at least one trial")
    if arr.dtype == bool:
        return arr
    if not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must be booleans or 0/1 numbers, got dtype {arr.dtype}")
    if not np.all((arr == 0) | (arr == 1)):
        raise ValueError(
            f"{name} must contain only 0/1 or True/False, got values {np.unique(arr)[:5]}; "
            "pass correctness (prediction == label), not the predictions themselves"
        )
    return arr.astype(bool)


def as_labels(x: Any, name: str, num_classes: int | None = None, allow: Iterable[int] = ()) -> np.ndarray:
    """A non-empty 1-D int64 array of class indices in [0, num_classes); extra values in ``allow`` pass too."""
    arr = as_numpy(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one class index per item), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: pass at least one item")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must hold integer class indices, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.integer):
        check_finite(arr, name)
        if not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must hold integer class indices, got non-integer values; pass argmax indices")
    arr = arr.astype(np.int64)
    valid = arr >= 0
    if num_classes is not None:
        valid &= arr < num_classes
    for extra in allow:
        valid |= arr == extra
    if not np.all(valid):
        bad = np.unique(arr[~valid])[:5]
        upper = f"[0, {num_classes})" if num_classes is not None else ">= 0"
        extras = f" (or one of {tuple(allow)})" if tuple(allow) else ""
        raise ValueError(f"{name} must be class indices in {upper}{extras}, got {bad.tolist()}")
    return arr


def as_distributions(x: Any, name: str, ndim: tuple[int, ...] = (1, 2)) -> np.ndarray:
    """A float64 array whose last axis holds probability distributions (>= 0, summing to 1)."""
    arr = as_float_array(x, name)
    if arr.ndim not in ndim:
        shapes = " or ".join({1: "(K,)", 2: "(N, K)"}[d] for d in ndim)
        raise ValueError(f"{name} must have shape {shapes}, got {arr.shape}")
    if arr.min() < 0:
        raise ValueError(f"{name} has negative entries (min {arr.min():.3g}); pass probabilities, e.g. softmax(logits)")
    sums = np.atleast_1d(arr.sum(axis=-1))
    worst = int(np.argmax(np.abs(sums - 1.0)))
    if abs(sums[worst] - 1.0) > PROBABILITY_ATOL:
        raise ValueError(
            f"{name} rows must sum to 1 (within {PROBABILITY_ATOL}), but row {worst} sums to {sums[worst]:.6g}; "
            "pass probabilities (softmax of logits), not logits or unnormalised scores"
        )
    return arr


def as_unit_interval(x: Any, name: str) -> np.ndarray:
    """A finite float64 array with every value in [0, 1]."""
    arr = as_float_array(x, name)
    if arr.min() < 0 or arr.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1], got values in [{arr.min():.4g}, {arr.max():.4g}]")
    return arr


def check_same_length(**arrays: np.ndarray) -> int:
    """Check that all arrays have the same first dimension; return it."""
    lengths = {name: len(arr) for name, arr in arrays.items()}
    if len(set(lengths.values())) > 1:
        listing = ", ".join(f"{name}: {n}" for name, n in lengths.items())
        raise ValueError(f"inputs must have one entry per item, i.e. equal lengths; got {listing}")
    return next(iter(lengths.values()))


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_scalar(value: Any, name: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number within the given (optionally open) bounds."""
    if hasattr(value, "detach") or isinstance(value, np.ndarray):
        arr = as_numpy(value, name)
        if arr.size != 1:
            raise ValueError(f"{name} must be a single number, got shape {arr.shape}")
        value = arr.reshape(()).item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}{right}, got {value:g}")
    return value


def nanmean(values: Iterable[float]) -> float:
    """Mean that skips NaN (as pandas' groupby mean does); NaN, without a warning, when nothing is left."""
    arr = np.asarray(list(values), dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return float(arr.mean()) if arr.size else float("nan")
