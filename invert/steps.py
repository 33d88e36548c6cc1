"""Per-sample steppers and norm-ball projections, shared by inversion and adversarial attacks.

Everything here is batched over a leading sample dimension N, works on any device and never
synchronises with the host. A step always moves *against* ``grad`` (descent); an attack that
ascends a loss passes the negated gradient. Radii and step sizes may be a float or a per-sample
tensor of shape (N,).

A stepper is an object with

* ``init_state(x) -> dict[str, Tensor]``: its per-sample state (every tensor has leading dim N, so
  :func:`select_state` can keep a subset of samples), and
* ``step(x, grad, state) -> Tensor``: the next iterate (out of place; ``state`` is updated in place).

References: the L2 and Linf steps and projections follow Engstrom et al.'s ``robustness`` library
(``attack_steps.L2Step`` / ``LinfStep``), which the inversion code of Nanda et al. (AAAI 2023) uses;
Adam follows Kingma & Ba (2015) as in ``torch.optim.Adam``, applied to each sample on its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Union

import torch
from torch import Tensor

Radius = Union[float, Tensor]

# Smallest norm we divide by: a zero gradient then gives a zero step instead of NaN.
_TINY = 1e-12


def _floored_norm(x: Tensor) -> Tensor:
    """:func:`_broadcast_norm` no smaller than a floor the dtype can hold: 1e-12 is 0 in float16, where a zero gradient
    (a confident sample's, underflowed) then stepped by 0 / 0 = NaN."""
    return _broadcast_norm(x).clamp_min(max(_TINY, torch.finfo(x.dtype).tiny))


def per_sample(value: Radius, like: Tensor) -> Radius:
    """A float unchanged, or an (N,) tensor reshaped to broadcast over ``like``'s sample dims."""
    if isinstance(value, Tensor) and value.ndim > 0:
        if value.shape != like.shape[:1]:
            raise ValueError(
                f"a per-sample value must have shape ({like.shape[0]},) to match the batch, got {tuple(value.shape)}"
            )
        return value.to(dtype=like.dtype).view(-1, *([1] * (like.ndim - 1)))
    return value


def per_sample_norm(x: Tensor, p: float = 2.0) -> Tensor:
    """The p-norm of each sample, shape (N,). Reduces over all non-batch dims without copying
    (``flatten`` would copy a channels-last tensor); an (N,) tensor holds N one-number samples."""
    if x.ndim == 1:  # vector_norm reads dim=() as "every dim": the whole batch's norm
        return x.abs()
    return torch.linalg.vector_norm(x, ord=p, dim=tuple(range(1, x.ndim)))


def _broadcast_norm(x: Tensor) -> Tensor:
    """Per-sample L2 norm shaped (N, 1, ..., 1) for broadcasting."""
    if x.ndim == 1:
        return x.abs()
    return torch.linalg.vector_norm(x, dim=tuple(range(1, x.ndim)), keepdim=True)


class Stepper(Protocol):
    """The interface every stepper implements (see the module docstring)."""

    def init_state(self, x: Tensor) -> dict[str, Tensor]: ...

    def step(self, x: Tensor, grad: Tensor, state: dict[str, Tensor]) -> Tensor: ...


@dataclass(frozen=True)
class L2Step:
    """``x - step_size * g / ||g||_2`` per sample: the L2-normalised step of the ``robustness``
    library (``L2Step.step``) and of Nanda et al.'s inversions (eta 1.0).

    Differs from ``robustness`` in one detail: it divides by ``max(||g||, 1e-12)`` instead of
    ``||g|| + 1e-10``, so a step is exactly ``step_size`` long for any gradient above 1e-12, where the
    library's falls short once ``||g||`` nears 1e-10 (a zero gradient gives a zero step in both). In float16 the
    floor is the dtype's smallest normal number, 6.1e-5, instead (1e-12 is 0 there): a float16 gradient below it takes
    a shorter step. The engine steps in float32.
    """

    step_size: Radius = 1.0

    def init_state(self, x: Tensor) -> dict[str, Tensor]:
        return {}

    def step(self, x: Tensor, grad: Tensor, state: dict[str, Tensor]) -> Tensor:
        scale = per_sample(self.step_size, x) / _floored_norm(grad)
        return torch.addcmul(x, grad, scale, value=-1.0)


@dataclass(frozen=True)
class LinfStep:
    """``x - step_size * sign(g)`` per sample (FGSM/PGD-Linf step, ``robustness.LinfStep``).
    A zero gradient entry gives a zero step for that entry."""

    step_size: Radius = 1.0 / 255

    def init_state(self, x: Tensor) -> dict[str, Tensor]:
        return {}

    def step(self, x: Tensor, grad: Tensor, state: dict[str, Tensor]) -> Tensor:
        return x - grad.sign() * per_sample(self.step_size, x)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba 2015, bias-corrected, as ``torch.optim.Adam`` without weight decay).

    Adam is elementwise, so each sample is optimised independently of the others provided the
    caller differentiates the *sum* of per-sample losses (the engine does; a mean would scale every
    gradient by 1/N and change the result through ``eps``). The step count is per sample, so
    samples may join or leave a batch. Golan et al. (2020) use it with lr 0.05 on sigmoid logits.
    """

    lr: Radius = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def init_state(self, x: Tensor) -> dict[str, Tensor]:
        return {
            "exp_avg": torch.zeros_like(x),
            "exp_avg_sq": torch.zeros_like(x),
            "count": torch.zeros(x.shape[0], dtype=torch.float32, device=x.device),  # bf16 would stop counting at 256
        }

    def step(self, x: Tensor, grad: Tensor, state: dict[str, Tensor]) -> Tensor:
        beta1, beta2 = self.betas
        state["count"].add_(1)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        count = state["count"].view(-1, *([1] * (x.ndim - 1)))
        bias1 = (1 - torch.pow(beta1, count)).to(x.dtype)
        bias2 = (1 - torch.pow(beta2, count)).to(x.dtype)
        denom = (state["exp_avg_sq"] / bias2).sqrt_().add_(self.eps)
        return torch.addcdiv(x, state["exp_avg"], denom * bias1 / per_sample(self.lr, x), value=-1.0)


STEPPERS = {"l2": L2Step, "linf": LinfStep, "adam": Adam}

# Step-size schedules: the factor applied to the step size at progress p = t / steps, p in [0, 1).
STEP_SCHEDULES: dict[str, Callable[[Tensor], Tensor]] = {
    "constant": lambda p: torch.ones_like(p),
    "linear": lambda p: 1 - p,
    "cosine": lambda p: 0.5 * (1 + torch.cos(math.pi * p)),
}


@dataclass(frozen=True)
class ScheduledStep:
    """Any stepper whose step size follows a schedule over ``total_steps``: at a sample's step t it steps with
    ``step_size * schedule(t / total_steps)`` (cosine: Loshchilov & Hutter's SGDR annealing without restarts, from
    ``step_size`` towards 0; linear: straight down to 0).

    The step count is per sample (state ``schedule_count``), like Adam's, so samples may leave a batch. Not part of
    the ``robustness`` reference, whose inversions keep eta fixed: a decaying L2 step lets an item that circles its
    minimum at a fixed distance eta settle into it.
    """

    make: Callable[[Radius], Stepper]
    step_size: float
    total_steps: int
    schedule: str = "cosine"

    def init_state(self, x: Tensor) -> dict[str, Tensor]:
        return {**self.make(self.step_size).init_state(x), "schedule_count": torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)}

    def step(self, x: Tensor, grad: Tensor, state: dict[str, Tensor]) -> Tensor:
        progress = (state["schedule_count"] / max(self.total_steps, 1)).clamp(max=1.0)
        state["schedule_count"].add_(1)
        return self.make(self.step_size * STEP_SCHEDULES[self.schedule](progress)).step(x, grad, state)


def make_stepper(name: str, step_size: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 schedule: str = "constant", total_steps: int | None = None) -> Stepper:
    """Build a stepper by name: ``l2``, ``linf`` or ``adam`` (``step_size`` is Adam's lr), with its step size
    following ``schedule`` (a key of :data:`STEP_SCHEDULES`) over ``total_steps``."""
    if name not in STEPPERS:
        raise ValueError(f"unknown stepper {name!r}; choose one of {sorted(STEPPERS)}")
    if schedule not in STEP_SCHEDULES:
        raise ValueError(f"unknown step schedule {schedule!r}; choose one of {sorted(STEP_SCHEDULES)}")

    def make(size: Radius) -> Stepper:
        return Adam(lr=size, betas=tuple(betas), eps=eps) if name == "adam" else STEPPERS[name](size)

    if schedule == "constant":
        return make(step_size)
    if total_steps is None or total_steps < 1:
        raise ValueError(f"the {schedule!r} step schedule needs total_steps >= 1, got {total_steps}")
    return ScheduledStep(make, step_size, total_steps, schedule)


def select_state(state: dict[str, Tensor], index: Tensor) -> dict[str, Tensor]:
    """Keep the samples ``index`` of a stepper state (every entry has leading dim N)."""
    return {key: value[index] for key, value in state.items()}


def clamp01(x: Tensor) -> Tensor:
    """Project onto the image box [0, 1]."""
    return x.clamp(0.0, 1.0)


def project_l2(x: Tensor, center: Tensor, eps: Radius) -> Tensor:
    """Project each sample onto the L2 ball of radius ``eps`` around ``center``
    (``robustness.L2Step.project`` without its clamp; compose with :func:`clamp01`)."""
    delta = x - center
    factor = (per_sample(eps, x) / _floored_norm(delta)).clamp(max=1.0)
    return torch.addcmul(center, delta, factor)


def project_linf(x: Tensor, center: Tensor, eps: Radius) -> Tensor:
    """Project each sample onto the Linf ball of radius ``eps`` around ``center``
    (``robustness.LinfStep.project`` without its clamp; compose with :func:`clamp01`)."""
    eps = per_sample(eps, x)
    if isinstance(eps, Tensor):
        return center + torch.maximum(torch.minimum(x - center, eps), -eps)
    return center + (x - center).clamp(-eps, eps)


def random_start_l2(x: Tensor, eps: Radius, generator: torch.Generator | None = None) -> Tensor:
    """``x`` plus a perturbation drawn uniformly from the L2 ball of radius ``eps``, per sample.

    Direction: a normalised Gaussian; radius: ``eps * u ** (1/d)`` with d the number of entries
    per sample, which makes the draw uniform in the ball. (``robustness``'s ``L2Step.random_perturb`` puts
    x on the sphere of radius eps, ``eps * randn / ||randn||``; its unconstrained step renormalises
    ``rand - 0.5`` to at most the step size.) Not clamped: compose with :func:`clamp01`.
    Draws come from ``generator`` (its device must match ``x``) for reproducibility.
    """
    direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    direction = direction / _floored_norm(direction)
    dims = math.prod(x.shape[1:])
    u = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), generator=generator, device=x.device, dtype=x.dtype)
    return x + direction * (u ** (1.0 / dims)) * per_sample(eps, x)


def random_start_linf(x: Tensor, eps: Radius, generator: torch.Generator | None = None) -> Tensor:
    """``x`` plus a perturbation drawn uniformly from the Linf ball of radius ``eps``, per sample
    (as ``robustness.LinfStep.random_perturb``, without its clamp)."""
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return x + (2 * u - 1) * per_sample(eps, x)
