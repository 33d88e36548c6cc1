"""Fast adversarial training (Wong, Rice & Kolter, "Fast is better than free: Revisiting adversarial
training", ICLR 2020; locuslab/fast_adversarial ``CIFAR10/train_fgsm.py``).

FGSM from a uniform random start with step alpha = 1.25 eps, a cyclic learning rate (the config's
``schedule.name: cyclic``), bf16 autocast on a GPU (the reference uses apex fp16), and the guard
against catastrophic overfitting: PGD accuracy on a held training batch is measured every epoch
(or every ``every_steps`` steps); when it falls by more than ``max_drop`` (0.2 in the reference)
below the previous check, training stops and, with ``action: rollback``, the weights of the last
good check are restored (the reference's ``best_state_dict``).

Differences from the reference: L2 works too (an L2-normalised step and projection); the FGSM
pass uses batch statistics as in the reference (train mode) but does not update the running
statistics; the guard attacks in eval mode, so checking does not change the model; the held batch
is a fixed seeded sample of the training set without augmentation (the reference keeps the
first batch of the last epoch, augmented); momentum stays at ``optimizer.momentum`` (0.9), where the
reference's ``CyclicLR`` also cycles it inversely to the rate (0.9 to 0.8 at the peak and back): the
schedule here changes the rate only, which keeps it a learning-rate tensor a CUDA graph can replay.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..attacks import ThreatModel
from ..evaluate import correct_counts
from ..models import Classifier
from .supervised import PGDRecipe

GUARD_ACTIONS = ("rollback", "stop")


class CollapseGuard:
    """Watches PGD accuracy on a held batch and reacts to a sudden collapse (see module docstring).

    :meth:`check` returns None while training is healthy, or the reason to stop. After a healthy
    check it keeps a copy of the weights (on the model's device), which ``rollback`` restores.
    """

    def __init__(self, model: Classifier, images: Tensor, labels: Tensor, threat: ThreatModel, *,
                 max_drop: float = 0.2, action: str = "rollback", seed: int = 0):
        if action not in GUARD_ACTIONS:
            raise ValueError(f"unknown guard action {action!r}: use one of {GUARD_ACTIONS}")
        if not 0 < max_drop <= 1:
            raise ValueError(f"guard max_drop must be in (0, 1], got {max_drop}")
        if images.dtype != torch.uint8 and not images.is_floating_point():
            raise TypeError(f"guard images must be uint8 or [0, 1] floats, got {images.dtype}")
        self.model, self.threat = model, threat
        self.images = images.float().div(255) if images.dtype == torch.uint8 else images
        self.labels = labels
        self.max_drop, self.action, self.seed = float(max_drop), action, seed
        self.previous: float | None = None
        self.history: list[float] = []
        self.good_state: dict[str, Tensor] | None = None

    def robust_accuracy(self) -> float:
        counts = correct_counts(self.model, (self.images, self.labels), self.threat, batch_size=len(self.labels), seed=self.seed)
        return int(counts["robust"]) / len(self.labels)  # the one host sync of a check

    def check(self) -> str | None:
        accuracy = self.robust_accuracy()
        self.history.append(accuracy)
        if self.previous is not None and accuracy < self.previous - self.max_drop:
            reason = (
                f"catastrophic overfitting: PGD accuracy on the held batch fell from {self.previous:.3f} to {accuracy:.3f} "
                f"(more than {self.max_drop:g})"
            )
            if self.action == "rollback" and self.good_state is not None:
                self.model.load_state_dict(self.good_state)
                reason += "; weights rolled back to the last healthy check"
            return reason
        self.previous = accuracy
        self.good_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous, "history": list(self.history), "good_state": self.good_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.previous, self.history = state.get("previous"), list(state.get("history", []))
        good = state.get("good_state")
        device = self.images.device
        self.good_state = None if good is None else {k: v.to(device) for k, v in good.items()}


class FastATRecipe(PGDRecipe):
    """FGSM adversarial training with the catastrophic-overfitting guard (see module docstring)."""

    name = "fast_at"
    graph_blocker = "its catastrophic-overfitting guard evaluates the model and may roll it back between steps"

    def __init__(self, model: Classifier, threat: ThreatModel, *, guard: CollapseGuard | None = None,
                 guard_every_steps: int | None = None, attack_bn: str = "train", **kwargs):
        super().__init__(model, threat, attack_bn=attack_bn, **kwargs)
        if guard_every_steps is not None and guard_every_steps < 1:
            raise ValueError(f"guard.every_steps must be a positive integer or null (every epoch), got {guard_every_steps}")
        self.guard, self.guard_every_steps = guard, guard_every_steps

    def after_step(self, step: int) -> str | None:
        if self.guard is not None and self.guard_every_steps and (step + 1) % self.guard_every_steps == 0:
            return self.guard.check()
        return None

    def after_epoch(self, epoch: int) -> str | None:
        if self.guard is not None and not self.guard_every_steps:
            return self.guard.check()
        return None

    def extra_state(self) -> dict[str, Any]:
        return {"guard": self.guard.state_dict()} if self.guard is not None else {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.guard is not None and "guard" in state:
            self.guard.load_state_dict(state["guard"])

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.guard is not None:
            out["guard"] = {"threat": self.guard.threat.to_dict(), "max_drop": self.guard.max_drop, "action": self.guard.action,
                            "held_images": len(self.guard.labels), "every_steps": self.guard_every_steps, "history": self.guard.history}
        return out


def held_batch(images: Tensor, labels: Tensor, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A fixed sample of ``size`` training images (uint8) chosen by ``seed``."""
    if size < 1:
        raise ValueError(f"guard batch_size must be positive, got {size}")
    index = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:size].to(labels.device)
    return images[index], labels[index]


__all__ = ["CollapseGuard", "FastATRecipe", "GUARD_ACTIONS", "held_batch"]
