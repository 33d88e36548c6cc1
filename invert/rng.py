"""Per-item random numbers: every draw is keyed by (base seed, item id), never by the batch.

Two tools, for two situations:

* :func:`item_generator` gives a ``torch.Generator`` per item, for one-off draws outside the hot loop
  (noise seeds, random starts): :func:`noise_images` uses it.
* :func:`hashed_uniform` is a counter-based generator (a 32-bit integer hash of seed, item, step and
  draw index evaluated with tensor ops on the device), for draws *inside* the step loop: a Generator
  per item would cost a Python loop and a kernel launch per item per step. The same (seed, item,
  step) always gives the same numbers, whatever else is in the batch and on any device.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator, Sequence, Union

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# Multipliers below 2**31 keep every product of a 32-bit value below 2**63 (no int64 overflow).
_MUL1 = 0x7FEB352D
_MUL2 = 0x5BD1E995
_GOLDEN = 0x9E3779B9


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit avalanche hash (Wellons' lowbias32 shape) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def _combine(h: Tensor, value: Union[int, Tensor]) -> Tensor:
    # A Python int stays a kernel argument: building a device tensor from it would be a blocking copy.
    salted = (value + _GOLDEN) & _MASK32
    return _mix32((h ^ salted) & _MASK32)


def hashed_uniform(seed: int, items: Tensor, step: Union[int, Tensor], n: int) -> Tensor:
    """Uniform numbers in [0, 1), shape (len(items), n), a pure function of (seed, item, step, j).

    ``items`` is a 1-D integer tensor of item ids (its device is used); ``step`` an int or a 0-d
    integer tensor on the same device (the engine keeps it on the device to avoid host syncs).
    """
    h = torch.full_like(items, seed & _MASK32, dtype=torch.int64)
    h = _combine(_mix32(h), items.to(torch.int64))
    h = _combine(h, step.to(torch.int64) if isinstance(step, Tensor) else step)
    draws = torch.arange(n, device=items.device, dtype=torch.int64)
    h = _combine(h.unsqueeze(1), draws.unsqueeze(0))
    # The top 24 bits convert to float32 exactly, so the result is strictly below 1.
    return (_mix32(h) >> 8).to(torch.float32) / 16777216.0


def stream_seed(namespace: str, *parts: object) -> int:
    """A 31-bit seed for one purpose, derived by SHA-256 from a namespace and parts (e.g. the base seed and a
    purpose name), so that draws for different purposes never share a random stream and the same purpose gets
    the same stream in every process (unlike Python's ``hash``)."""
    text = namespace + ":" + "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def item_generator(seed: int, item: int, device: Union[str, torch.device] = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded from (seed, item) alone.

    The key is a 32-bit hash: the CPU generator (mt19937) keeps only the low 32 bits of its seed, so
    a wider key would lose the base seed. For a fixed seed the hash is a bijection of the item id,
    so distinct items (below 2**32) never share a generator.
    """
    key = int(_combine(_mix32(torch.tensor(seed & _MASK32)), item))
    return torch.Generator(device=device).manual_seed(key)


# Seed noise distributions, each clamped to [0, 1]: ``uniform`` U[0, 1]; ``gaussian`` N(0.5, 0.25²);
# ``super`` and ``light`` are the seeds of Nanda et al.'s inversion code (reg_free_loss.py, initialize_seed):
# "super-noise" N(0, 1) and "light-noise" N(0, 0.01²), as mean and standard deviation.
NOISE_KINDS = {"uniform": None, "gaussian": (0.5, 0.25), "super": (0.0, 1.0), "light": (0.0, 0.01)}


def noise_images(
    n: int,
    shape: Sequence[int],
    *,
    seed: int = 0,
    kind: str = "uniform",
    first_item: int = 0,
    device: Union[str, torch.device] = "cpu",
) -> Tensor:
    """``n`` seed images of ``shape`` (C, H, W) in [0, 1], item ``first_item + i`` drawn from its
    own generator, so an item's seed does not depend on ``n`` (drawn on the CPU, then moved, so
    they are also the same on every device).

    ``kind`` (:data:`NOISE_KINDS`): ``uniform`` (U[0, 1]), ``gaussian`` (N(0.5, 0.25²)), or the seeds of
    Nanda et al.'s code, ``super`` (their "super-noise", N(0, 1): after clamping half the pixels are black,
    16 % white) and ``light`` ("light-noise", N(0, 0.01²): a nearly black image). Gaussians are clamped to
    [0, 1]. Deliberate difference: the authors' first step sees the unclamped draw (their optimiser clamps
    to [0, 1] only after each step); here the seed itself is a valid image.
    """
    if kind not in NOISE_KINDS:
        raise ValueError(f"unknown noise kind {kind!r}; choose one of {sorted(NOISE_KINDS)}")
    images = []
    for i in range(n):
        generator = item_generator(seed, first_item + i)
        if NOISE_KINDS[kind] is None:
            images.append(torch.rand(tuple(shape), generator=generator))
        else:
            mean, std = NOISE_KINDS[kind]
            images.append((mean + std * torch.randn(tuple(shape), generator=generator)).clamp_(0, 1))
    return torch.stack(images).to(device)


@contextlib.contextmanager
def seeded_rng(seed: int, device: Union[str, torch.device, None] = None) -> Iterator[None]:
    """A block whose draws from torch's global generators start at ``seed``: the CPU generator and, for a CUDA
    ``device``, that device's; both are restored afterwards, so code after the block draws as it would without it.

    ``torch.manual_seed`` inside ``torch.random.fork_rng`` is not the same: it reseeds every CUDA device, while the
    fork restores only the devices it was given, so the process's CUDA generators were left at ``seed``.
    """
    device = torch.device("cpu" if device is None else device)
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:  # initialised by the fork, which read its state
            torch.cuda.default_generators[index].manual_seed(seed)
        yield
