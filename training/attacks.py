"""Adversarial attacks for training and evaluation, built on ``invert.steps``' steppers and projections.

* :func:`maximize` is projected gradient *ascent* of any loss over each sample's own norm ball
  (intersected with the image box [0, 1]); every attack here is an instance of it.
* :func:`pgd` is Madry et al.'s attack ("Towards Deep Learning Models Resistant to Adversarial
  Attacks", ICLR 2018; the ``robustness`` library's ``Attacker``): maximise the cross-entropy.
* :func:`fgsm` is Wong et al.'s FGSM from a random start ("Fast is better than free", ICLR 2020;
  ``locuslab/fast_adversarial``): one step of size ``alpha`` (default 1.25 eps) from a uniform
  random point in the ball, projected back onto the ball.
* TRADES' and MART's inner maximisation and adversarial SimCLR's view perturbation call
  :func:`maximize` with their own loss and start (see ``training.recipes``).

The steppers move *against* the gradient (``invert.steps`` is a descent engine), so ascent passes
the negated gradient. Nothing here synchronises with the host: the step loop has a fixed length and
runs inside ``invert.validation.hot_loop()``.

Deliberate differences from the reference code: the random L2 start is uniform in the ball
(``invert.steps.random_start_l2``) where ``robustness`` (1.2.1) puts it on the sphere of radius eps; the
last iterate is returned (``robustness``' ``use_best=False``), which is what Madry et al.'s training
uses; an attack in ``train`` batch-norm mode leaves the running statistics untouched (Wong et al.'s
code lets the FGSM pass update them).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import kept_training_flags
from invert.steps import (
    L2Step,
    LinfStep,
    clamp01,
    project_l2,
    project_linf,
    random_start_l2,
    random_start_linf,
)
from invert.validation import check_images, hot_loop

from .config import get as config_get
from .folding import eval_view, forget_folded_weights

NORMS = ("l2", "linf")
BN_MODES = ("eval", "train")
# The robustness library's rule of thumb for the PGD step size, 2.5 * eps / steps (Madry et al.'s own CIFAR run took
# 2/255 x 7 steps for eps 8/255: 1.75 * eps / steps).
LIBRARY_STEP_FACTOR = 2.5


class AttackConfigError(ValueError):
    """An attack was configured with an unknown norm or an impossible radius, step size or step count."""


def check_norm(norm: str) -> str:
    """Return ``norm`` if it is ``l2`` or ``linf``; otherwise raise with the accepted names."""
    if norm not in NORMS:
        raise AttackConfigError(f"unknown norm {norm!r}: use 'l2' or 'linf'")
    return norm


@dataclass(frozen=True)
class ThreatModel:
    """A norm ball and the projected-gradient schedule used to search it.

    ``eps`` is in [0, 1] pixel units (Linf 8/255 = 0.0314; CIFAR L2 1.0 is the robustness library's setting, Engstrom et al.'s models and Nanda et al.'s;
    Madry et al. trained CIFAR at Linf 8/255 only); in
    configs it may be written as a fraction (``train.attack.eps=8/255``).
    ``step_size`` ``None`` means the robustness library's ``2.5 * eps / steps``. ``random_start`` starts each
    sample from a uniform point in its ball.
    """

    norm: str
    eps: float
    steps: int = 10
    step_size: Optional[float] = None
    random_start: bool = True

    def __post_init__(self) -> None:
        check_norm(self.norm)
        if isinstance(self.random_start, int) and not isinstance(self.random_start, bool) and self.random_start in (0, 1):
            object.__setattr__(self, "random_start", bool(self.random_start))  # YAML's 0 and 1
        if not isinstance(self.random_start, bool):  # Hydra reads random_start=no as the text 'no', which bool() made True
            raise AttackConfigError(f"random_start must be true or false, got {self.random_start!r}")
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise AttackConfigError(
                f"eps must be a positive finite number in [0, 1] pixel units, got {eps!r}"
                " (an 'unbounded' attack uses the box's diameter: Linf 1.0, L2 sqrt(C*H*W))"
            )
        if self.norm == "linf" and eps > 1:
            raise AttackConfigError(
                f"Linf eps {eps} exceeds the image range [0, 1]: eps is in [0, 1] units, e.g. 8/255 = {8 / 255:.4f}"
                f" (did you mean {eps}/255 = {eps / 255:.4f}?)"
            )
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise AttackConfigError(f"steps must be a positive integer, got {self.steps!r}")
        if self.step_size is not None and not (math.isfinite(self.step_size) and self.step_size > 0):
            raise AttackConfigError(f"step_size must be a positive finite number or None (2.5 * eps / steps), got {self.step_size!r}")
        object.__setattr__(self, "eps", float(eps))

    @property
    def alpha(self) -> float:
        """The step size actually used."""
        return float(self.step_size) if self.step_size is not None else LIBRARY_STEP_FACTOR * self.eps / self.steps

    def stepper(self):
        return L2Step(self.alpha) if self.norm == "l2" else LinfStep(self.alpha)

    def project(self, x: Tensor, center: Tensor) -> Tensor:
        """Onto the ball around ``center`` and then the image box (the box keeps it inside the ball)."""
        inside = project_l2(x, center, self.eps) if self.norm == "l2" else project_linf(x, center, self.eps)
        return clamp01(inside)

    def random_point(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """A uniform random point of each sample's ball, clamped to the image box."""
        start = random_start_l2 if self.norm == "l2" else random_start_linf
        return clamp01(start(x, self.eps, generator))

    def describe(self) -> str:
        eps = f"{self.eps * 255:.3g}/255" if self.norm == "linf" else f"{self.eps:g}"
        return f"{self.norm} eps={eps}, {self.steps} steps of {self.alpha:.4g}" + (", random start" if self.random_start else "")

    def to_dict(self) -> dict:
        return {"norm": self.norm, "eps": self.eps, "steps": self.steps, "step_size": self.alpha, "random_start": self.random_start}

    @classmethod
    def from_config(cls, cfg, **overrides) -> "ThreatModel":
        """From a config node with ``norm``, ``eps``, ``steps``, optional ``step_size`` and ``random_start``."""
        get = lambda k, d=None: config_get(cfg, k, d)  # noqa: E731
        values = {
            "norm": get("norm"),
            "eps": get("eps"),
            "steps": get("steps", 10),
            "step_size": get("step_size"),
            "random_start": get("random_start", True),
        }
        values.update(overrides)
        for key in ("eps", "step_size"):
            values[key] = config_number(values[key], key)
        return cls(**values)


def config_number(value, name: str):
    """A config number: int, float, or a fraction string such as ``8/255`` (parsed, never evaluated)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(Fraction(str(value).replace(" ", "")))
    except (ValueError, ZeroDivisionError):
        raise AttackConfigError(f"{name} must be a number or a fraction like 8/255, got {value!r}") from None


def check_labels(y: Tensor, x: Tensor) -> Tensor:
    """One integer class label per image to attack (shape and dtype only: no host sync inside a training step);
    returns them as int64, the index type the losses take (a no-op for int64 labels)."""
    if not isinstance(y, Tensor) or y.dtype.is_floating_point or y.dtype == torch.bool or y.shape != x.shape[:1]:
        if not isinstance(x, Tensor) or x.ndim != 4:
            check_images(x, "images to attack")  # the images' shape is what is wrong: say so (e.g. a missing batch dimension)
        got = f"{type(y).__name__} of shape {tuple(y.shape)} and dtype {y.dtype}" if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"labels must be an integer tensor of shape ({x.shape[0]},), one class index per image to attack; got {got}")
    return y.long()


def maximize(
    loss_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    threat: ThreatModel,
    *,
    start: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Projected gradient ascent of ``loss_fn`` within each sample's ball around ``x``.

    ``loss_fn(x_adv)`` returns a per-sample (N,) loss or a scalar; its sum is differentiated, and
    the steppers normalise each sample's gradient, so the scale of the loss does not matter.
    ``start`` (projected onto the ball) overrides the threat model's start: ``x`` itself, or a
    random point when ``threat.random_start``. Returns a detached tensor in the ball and in [0, 1].

    The model runs in whatever mode it is in (a training step attacks in train mode for Wong et al.'s FGSM): call it
    inside :func:`attack_mode` for batch norm's running statistics, as the recipes and the evaluation do; a model left
    in train mode would have them updated by every step of the attack.
    """
    check_images(x, "images to attack")  # shape and dtype always; the range outside hot_loop() only
    stepper = threat.stepper()
    center = x.detach()
    if start is not None:
        x_adv = threat.project(start.detach(), center)
    elif threat.random_start:
        x_adv = threat.random_point(center, generator)
    else:
        x_adv = center.clone()
    state = stepper.init_state(x_adv)
    with hot_loop(), torch.enable_grad():
        for _ in range(threat.steps):
            x_adv = x_adv.detach().requires_grad_(True)
            loss = loss_fn(x_adv)
            (grad,) = torch.autograd.grad(loss.float().sum(), x_adv)
            x_adv = threat.project(stepper.step(x_adv.detach(), grad.neg(), state), center)
    return x_adv.detach()


def pgd(model: nn.Module, x: Tensor, y: Tensor, threat: ThreatModel, generator: torch.Generator | None = None) -> Tensor:
    """Madry et al.'s PGD: maximise the cross-entropy of ``model`` (which takes [0, 1] images), in the model's current
    mode (see :func:`maximize`; :func:`attack_mode` sets it)."""
    y = check_labels(y, x)
    return maximize(lambda z: F.cross_entropy(model(z), y, reduction="none"), x, threat, generator=generator)


FGSM_ALPHA_FACTOR = 1.25  # Wong et al.: alpha = 1.25 eps (10/255 for eps 8/255)


def fgsm_threat(norm: str, eps: float, alpha: float | None = None, random_start: bool = True) -> ThreatModel:
    """The threat model of Wong et al.'s FGSM: one step of ``alpha`` (default 1.25 eps)."""
    return ThreatModel(norm, eps, steps=1, step_size=alpha if alpha is not None else FGSM_ALPHA_FACTOR * eps, random_start=random_start)


def fgsm(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    *,
    norm: str = "linf",
    alpha: float | None = None,
    random_start: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """FGSM from a random start (Wong et al. 2020): ``x + delta0`` stepped once by ``alpha`` along
    the (sign of the, for Linf) gradient, then projected onto the eps ball and [0, 1]."""
    return pgd(model, x, y, fgsm_threat(norm, eps, alpha, random_start), generator)


def check_bn_mode(mode: str) -> str:
    """Return ``mode`` if it is ``eval`` or ``train``; otherwise raise with the accepted names."""
    if mode not in BN_MODES:
        raise AttackConfigError(f"unknown attack batch-norm mode {mode!r}: use 'eval' or 'train'")
    return mode


def _batch_norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@contextlib.contextmanager
def bn_mode(module: nn.Module, mode: str) -> Iterator[None]:
    """Run an attack with batch norm in ``eval`` mode (running statistics, as the ``robustness`` library, TRADES and
    MART do) or ``train`` mode (batch statistics, as Wong et al.'s FGSM and Madry et al.'s own code) without updating the running
    statistics. Every submodule's own training flag is restored afterwards (a frozen batch norm stays frozen)."""
    check_bn_mode(mode)
    with kept_training_flags(module):
        if mode == "eval":
            module.eval()
            yield
            return
        # Batch statistics without touching the running ones: with track_running_stats off, a training-mode
        # BatchNorm normalises with batch statistics and updates nothing (not even num_batches_tracked).
        norms = [m for m in _batch_norms(module) if m.track_running_stats]
        module.train()
        for m in norms:
            m.track_running_stats = False
        try:
            yield
        finally:
            for m in norms:
                m.track_running_stats = True


@contextlib.contextmanager
def attack_mode(model: nn.Module, bn: str = "eval", *, fold_bn: bool = True) -> Iterator[nn.Module]:
    """``model`` set up for an attack, yielding the module to differentiate.

    Batch norm runs in ``bn`` mode (see :func:`bn_mode`). In ``eval`` mode with ``fold_bn``, the
    module yielded is :func:`training.folding.eval_view` of the model: the same function with each
    batch norm folded into its convolution, cheaper per step (gradients reach the input only),
    folded from the weights and statistics as they are on entry and reused for the whole attack.
    Otherwise, and for models that cannot be folded, it is ``model`` itself.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"attack_mode needs the model (a torch.nn.Module), got {type(model).__name__}")
    with bn_mode(model, bn):
        if not (fold_bn and bn == "eval"):
            yield model
            return
        view = eval_view(model)
        # Refold on entry: some in-place updates bump no version counter for the view's cache to see (fused optimizer
        # kernels, batch norm's running statistics, CUDA graph replays of a training step).
        forget_folded_weights(model)
        yield view


__all__ = [
    "attack_mode",
    "AttackConfigError",
    "BN_MODES",
    "NORMS",
    "ThreatModel",
    "bn_mode",
    "check_bn_mode",
    "check_norm",
    "config_number",
    "fgsm",
    "fgsm_threat",
    "maximize",
    "pgd",
]
