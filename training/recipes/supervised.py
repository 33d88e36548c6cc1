"""Supervised recipes: standard cross-entropy, PGD adversarial training, TRADES and MART.

Each attack runs on the bare classifier with batch norm in eval mode (running statistics), as the
``robustness`` library's PGD training and the reference code of TRADES and MART do (Madry et al.'s own
``cifar10_challenge`` attacked its train-mode model: ``attack_bn: train`` is that, without its updates of the
running statistics), and the training forward runs in train mode. With
``fold_bn`` (the default) the attack differentiates the classifier with its batch norms folded into
the convolutions (``training.folding``): the same function, fewer operations per attack step.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attacks import ThreatModel, attack_mode, check_bn_mode, maximize, pgd
from ..folding import eval_view
from ..losses import mart_loss, trades_inner_loss, trades_loss
from ..models import Classifier
from .base import Recipe, batch_accuracy


def _with_eval_view(model: Classifier, fold_bn: bool) -> list[nn.Module]:
    """The modules to compile: the classifier, and its folded eval view when the attacks use it."""
    view = eval_view(model) if fold_bn else model
    return [model] if view is model else [model, view]


# TRADES and MART start their inner maximisation from x + 0.001 * N(0, 1) (both reference codes).
INNER_START_NOISE = 0.001


class StandardRecipe(Recipe):
    """Standard training: cross-entropy on (optionally augmented) clean images, optionally with label
    smoothing. With the default config this is the ``robustness`` library's CIFAR recipe (Engstrom et
    al. 2019): SGD, lr 0.1, momentum 0.9, weight decay 5e-4, lr / 10 every 50 of 150 epochs, crop +
    flip + colour jitter 0.25 + rotation 2°."""

    name = "standard"
    graph_blocker = None

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        logits = self.model(inputs)
        return self.cross_entropy(logits, labels), {"acc": batch_accuracy(logits, labels)}


class PGDRecipe(Recipe):
    """PGD adversarial training (Madry et al., ICLR 2018; the ``robustness`` library's ``adv_train``):
    minimise the cross-entropy on the PGD example of each (augmented) image. L2 or Linf; the paper trained
    CIFAR at Linf 8/255 (2/255 x 7 steps), the robustness library (Engstrom et al.) its CIFAR L2 models at
    eps 1.0. The attack runs in eval batch-norm mode, as the library's
    ``AttackerModel`` does; the last iterate is used (its ``use_best=False``; the library's training default
    is ``use_best=1``), from a random start by default (``random_start``: as Madry et al.'s code; the
    library's default is no random start)."""

    name = "pgd"
    graph_blocker = None

    def __init__(self, model: Classifier, threat: ThreatModel, *, attack_bn: str = "eval", fold_bn: bool = True, **kwargs):
        super().__init__(model, **kwargs)
        self.threat = threat
        self.attack_bn = check_bn_mode(attack_bn)
        self.fold_bn = bool(fold_bn)

    def attack(self, inputs: Tensor, labels: Tensor) -> Tensor:
        with attack_mode(self.model, self.attack_bn, fold_bn=self.fold_bn) as target:
            return pgd(target, inputs, labels, self.threat)

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        adversarial = self.attack(inputs, labels)
        logits = self.model(adversarial)
        return self.cross_entropy(logits, labels), {"acc": batch_accuracy(logits, labels)}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "attack": self.threat.to_dict(), "attack_bn": self.attack_bn, "fold_bn": self.fold_bn}

    def hot_modules(self) -> list[nn.Module]:
        return _with_eval_view(self.model, self.fold_bn and self.attack_bn == "eval")


class _InnerMaxRecipe(Recipe):
    """Shared by TRADES and MART: a threat model, a beta, and the 0.001 * N(0, 1) start."""

    graph_blocker = None

    def __init__(self, model: Classifier, threat: ThreatModel, *, beta: float, fold_bn: bool = True, **kwargs):
        super().__init__(model, **kwargs)
        if not beta >= 0:
            raise ValueError(f"{self.name}: beta must be non-negative, got {beta}")
        self.threat, self.beta, self.fold_bn = threat, float(beta), bool(fold_bn)

    def start(self, inputs: Tensor) -> Tensor:
        return inputs + INNER_START_NOISE * torch.randn_like(inputs)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "attack": self.threat.to_dict(), "beta": self.beta, "fold_bn": self.fold_bn}

    def hot_modules(self) -> list[nn.Module]:
        return _with_eval_view(self.model, self.fold_bn)


class TradesRecipe(_InnerMaxRecipe):
    """TRADES (Zhang et al., "Theoretically Principled Trade-off between Robustness and Accuracy",
    ICML 2019; yaodongyu/TRADES): ``CE(f(x), y) + beta * KL(f(x) || f(x_adv))``, with x_adv
    maximising the KL from ``x + 0.001 N(0, 1)``. L2 and Linf; the paper sweeps beta (6 for CIFAR).

    Differences from the reference: p(x) for the inner KL is computed once per batch instead of once
    per step (the model is in eval mode, so the values are identical); the start is clamped to [0, 1];
    the L2 inner loop uses the normalised-gradient step and projection of ``invert.steps`` (the
    reference's SGD on delta with gradient renormalisation takes the same steps), but projects onto the
    ball and then the image box (as the ``robustness`` library), where the reference clamps to the box and
    then renormalises (with saturated pixels the two give different points), and a zero gradient gives a zero
    step (the reference replaces it with a random direction); the natural logits of the outer loss are reused
    for its KL instead of a second forward pass. The loss and its gradients are the same, but batch norm's
    running statistics see one natural and one adversarial batch per step, where the reference's three train-mode
    forwards (natural, adversarial, natural) weigh the natural batch twice; the evaluated model's statistics
    differ slightly from the reference's."""

    name = "trades"

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        with attack_mode(self.model, "eval", fold_bn=self.fold_bn) as target:
            with torch.no_grad():
                log_p_natural = target(inputs).float().log_softmax(dim=1)
            adversarial = maximize(
                lambda z: trades_inner_loss(target(z), log_p_natural), inputs, self.threat, start=self.start(inputs)
            )
        logits_natural = self.model(inputs)
        logits_adversarial = self.model(adversarial)
        loss, parts = trades_loss(logits_natural, logits_adversarial, labels, self.beta, self.label_smoothing)
        return loss, {"acc": batch_accuracy(logits_adversarial, labels), "clean_acc": batch_accuracy(logits_natural, labels), **parts}


class MartRecipe(_InnerMaxRecipe):
    """MART (Wang et al., "Improving Adversarial Robustness Requires Revisiting Misclassified Examples",
    ICLR 2020; YisenWang/MART): boosted CE on x_adv + beta * KL(p(x) || p(x_adv)) * (1 - p_y(x)),
    x_adv maximising the cross-entropy from ``x + 0.001 N(0, 1)``.

    The reference code implements Linf only; here L2 works too (same loss, L2 steps and projection).
    The start is clamped to [0, 1] (the reference feeds it unclamped to the first step)."""

    name = "mart"

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        with attack_mode(self.model, "eval", fold_bn=self.fold_bn) as target:
            adversarial = maximize(
                lambda z: F.cross_entropy(target(z), labels, reduction="none"), inputs, self.threat, start=self.start(inputs)
            )
        logits_natural = self.model(inputs)
        logits_adversarial = self.model(adversarial)
        loss, parts = mart_loss(logits_natural, logits_adversarial, labels, self.beta, self.label_smoothing)
        return loss, {"acc": batch_accuracy(logits_adversarial, labels), "clean_acc": batch_accuracy(logits_natural, labels), **parts}
