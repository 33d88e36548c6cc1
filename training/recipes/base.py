"""The recipe interface the trainer drives: augmentation, training loss, hooks, and the final classifier.

A recipe is an ``nn.Module`` that owns the :class:`~training.models.Classifier` being trained
(``recipe.model``) and any auxiliary modules (SimCLR's projection head). The trainer calls

* ``prepare(images)``: uint8 batch on the device → augmented float inputs in [0, 1] (outside
  autocast and outside DDP);
* ``forward(inputs, labels)`` → ``(loss, stats)``: the scalar training loss and 0-d tensors of batch
  means to log (``acc`` at least); under autocast and, with several processes, through DDP, so
  attacks run inside it on the bare modules;
* ``after_step(step)`` / ``after_epoch(epoch)``: may return a reason to stop (fast AT's guard);
* ``finalize(train_data)``: the classifier to evaluate and save (SimCLR fits its linear probe here).

A recipe whose forward never synchronises with the host sets ``graph_blocker = None``; ``train.cuda_graph``
may then capture its step as one CUDA graph (``training.step``).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..augment import SupervisedAugment, to_float
from ..data import ImageSet
from ..models import Classifier


def batch_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    return (logits.detach().argmax(dim=1) == labels).float().mean()


class Recipe(nn.Module):
    """Base class; see the module docstring for the protocol."""

    name: ClassVar[str] = "recipe"
    # Whether ``model`` classifies during training (SimCLR's head only exists after the probe).
    supervised: ClassVar[bool] = True
    # Why ``train.cuda_graph`` cannot capture this recipe's step (``training.step``), or None when it can: its
    # forward must not synchronise with the host nor change shape with the data, and no hook may act between steps.
    graph_blocker: ClassVar[str | None] = "its step has not been checked for CUDA graph capture"

    def __init__(self, model: Classifier, *, augment=None, label_smoothing: float = 0.0):
        super().__init__()
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.model = model
        self.augment = augment
        self.label_smoothing = float(label_smoothing)
        self.channels_last = False

    def prepare(self, images: Tensor) -> Tensor:
        x = self.augment(images) if self.augment is not None else to_float(images)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)

    def hot_modules(self) -> list[nn.Module]:
        """Modules worth ``torch.compile`` (compiled in place, so state-dict keys do not change)."""
        return [self.model]

    def auxiliary_modules(self) -> dict[str, nn.Module]:
        """Trained modules besides ``model`` whose weights a checkpoint must keep."""
        return {}

    def after_step(self, step: int) -> str | None:
        return None

    def after_epoch(self, epoch: int) -> str | None:
        return None

    def extra_state(self) -> dict[str, Any]:
        """Python-side state to checkpoint (tensors, numbers, strings: loadable with weights_only)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def finalize(self, train_data: ImageSet) -> Classifier:
        return self.model

    def describe(self) -> dict[str, Any]:
        """The settings that define the recipe, for the run summary."""
        return {"recipe": self.name, "augment": repr(self.augment), "label_smoothing": self.label_smoothing}


def supervised_augment_from_config(cfg) -> SupervisedAugment | None:
    """``train.augment`` → :class:`SupervisedAugment`, or None when ``enabled`` is false."""
    if cfg is None or not cfg.get("enabled", True):
        return None
    return SupervisedAugment(
        crop_flip=bool(cfg.get("crop_flip", True)),
        padding=int(cfg.get("padding", 4)),
        color_jitter=float(cfg.get("color_jitter", 0.0)),
        rotation=float(cfg.get("rotation", 0.0)),
    )
