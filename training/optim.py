"""Optimisers and learning-rate schedules for the training recipes.

* SGD with momentum and weight decay (``torch.optim.SGD``), decay on every parameter as the
  ``robustness`` library, TRADES, MART and Wong et al. do (SimCLR's reference leaves batch norm out of it: use LARS
  for SimCLR, which does too).
* :class:`LARS` as in SimCLR's reference code (google-research/simclr ``lars_optimizer.py``):
  ``g += wd * w``; ``lr_layer = lr * eta * ||w|| / ||g||`` (1 when either norm is 0); momentum on
  ``lr_layer * g``. Biases and batch-norm parameters (every parameter with fewer than two
  dimensions) get neither weight decay nor the trust ratio, as SimCLR excludes them.
* Per-step schedules (:func:`lr_factor`): ``step`` (multiply by ``gamma`` at each milestone epoch),
  ``cosine`` (to 0), ``cyclic`` (0 → peak → 0, linear, Wong et al.'s one cycle), ``constant``;
  each optionally behind a linear warm-up.
"""
from __future__ import annotations

import bisect
import math
from typing import Iterable, Sequence

import torch
from torch import nn

from .config import ConfigError
from .config import get as _get

OPTIMIZERS = ("sgd", "lars")
SCHEDULES = ("step", "cosine", "cyclic", "constant")


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017) in SimCLR's formulation (see module docstring).

    Parameter groups with ``adapt=False`` skip weight decay and the trust ratio.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 0.001, nesterov: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ConfigError(f"LARS needs lr >= 0, momentum >= 0, weight_decay >= 0, eta > 0; got {lr}, {momentum}, {weight_decay}, {eta}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, nesterov=nesterov, adapt=True))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["adapt"]:
                    if group["weight_decay"]:
                        grad = grad.add(p, alpha=group["weight_decay"])
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(grad)
                    # torch.where keeps the trust ratio on the device (no host sync).
                    trust = torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm.clamp_min(1e-30), torch.ones_like(w_norm))
                    scaled = grad * (trust * group["lr"])
                else:
                    scaled = grad * group["lr"]
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"].mul_(group["momentum"]).add_(scaled)
                p.sub_(buf * group["momentum"] + scaled if group["nesterov"] else buf)
        return loss


def build_optimizer(named_parameters: Iterable[tuple[str, nn.Parameter]], cfg) -> torch.optim.Optimizer:
    """SGD or LARS from a ``train.optimizer`` node (name, lr, momentum, weight_decay, nesterov, eta)."""
    name = _get(cfg, "name", "sgd")
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}: use one of {OPTIMIZERS}")
    lr = float(_get(cfg, "lr", 0.1))
    momentum = float(_get(cfg, "momentum", 0.9))
    weight_decay = float(_get(cfg, "weight_decay", 0.0))
    if not (lr > 0 and momentum >= 0 and weight_decay >= 0):
        raise ConfigError(f"optimizer needs lr > 0, momentum >= 0, weight_decay >= 0; got lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    if not named:
        raise ConfigError("no trainable parameters")
    nesterov = bool(_get(cfg, "nesterov", False))
    if name == "sgd":
        return torch.optim.SGD([p for _, p in named], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    adapted = [p for _, p in named if p.ndim > 1]
    excluded = [p for _, p in named if p.ndim <= 1]
    groups = [{"params": adapted}] + ([{"params": excluded, "adapt": False, "weight_decay": 0.0}] if excluded else [])
    return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, eta=float(_get(cfg, "eta", 0.001)), nesterov=nesterov)


def lr_factor(step: int, *, schedule: str, epochs: int, steps_per_epoch: int, milestones=(), gamma: float = 0.1,
              warmup_epochs: float = 0.0, cyclic_peak: float = 0.5) -> float:
    """The multiplier of the base learning rate at optimisation step ``step`` (0-based).

    Milestones and the warm-up are in epochs (fractions allowed); ``cyclic_peak`` is the fraction
    of training at which the cyclic schedule peaks. A milestone m drops the rate from the 0-based epoch m on
    (``MultiStepLR``'s convention; a reference that checks ``epoch >= m`` with 1-based epochs means m − 1).

    With a warm-up, the cosine decays over the steps after it, as SimCLR's reference does
    (google-research/simclr, ``learning_rate_schedule``); the linear ramp reaches the base rate at its last
    step ((step + 1) / warm-up steps, where the reference starts from 0 at step 0).
    """
    total = epochs * steps_per_epoch
    epoch = step / steps_per_epoch
    warmup_steps = warmup_epochs * steps_per_epoch
    if schedule == "step":
        factor = gamma ** bisect.bisect_right(sorted(milestones), epoch)
    elif schedule == "cosine":
        progress = (step - warmup_steps) / (total - warmup_steps) if total > warmup_steps else 0.0  # all warm-up: no decay
        factor = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    elif schedule == "cyclic":
        peak = cyclic_peak * total
        factor = step / peak if step < peak else max(0.0, (total - step) / (total - peak))
    else:
        factor = 1.0
    if warmup_steps > 0 and step < warmup_steps:
        factor *= min(1.0, (step + 1) / warmup_steps)  # a fractional warm-up's last step would overshoot the base rate
    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg, epochs: int, steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step ``LambdaLR`` from a ``train.schedule`` node (name, milestones, gamma, warmup_epochs, cyclic_peak)."""
    schedule = _get(cfg, "name", "step")
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}: use one of {SCHEDULES}")
    milestones = _get(cfg, "milestones") or []
    if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
        raise ConfigError(f"schedule.milestones must be a list of epochs (train.schedule.milestones=[100,150]), got {milestones!r}")
    milestones = [float(m) for m in milestones]
    gamma = float(_get(cfg, "gamma", 0.1))
    warmup = float(_get(cfg, "warmup_epochs", 0.0) or 0.0)
    peak = float(_get(cfg, "cyclic_peak", 0.5))
    if not 0 < gamma <= 1:
        raise ConfigError(f"schedule.gamma must be in (0, 1], got {gamma}")
    if warmup < 0 or warmup > epochs:
        raise ConfigError(f"schedule.warmup_epochs must be in [0, epochs={epochs}], got {warmup}")
    if not 0 < peak < 1:
        raise ConfigError(f"schedule.cyclic_peak must be in (0, 1), got {peak}")
    kwargs = dict(schedule=schedule, epochs=epochs, steps_per_epoch=steps_per_epoch, milestones=tuple(milestones),
                  gamma=gamma, warmup_epochs=warmup, cyclic_peak=peak)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, **kwargs))


__all__ = ["ConfigError", "LARS", "OPTIMIZERS", "SCHEDULES", "build_optimizer", "build_scheduler", "lr_factor"]
