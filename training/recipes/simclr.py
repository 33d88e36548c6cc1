"""SimCLR and adversarial SimCLR, and the linear probe that turns an encoder into a classifier.

SimCLR (Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
ICML 2020; google-research/simclr): two augmented views of every image (``SimCLRAugment``), the
encoder (the zoo network up to its pooled penultimate layer), a projection head
Linear-BN-ReLU-Linear to 128 dimensions, NT-Xent with temperature 0.5, LARS or SGD.

Adversarial SimCLR: before each step both views are perturbed within an L2 ball (eps 1, 5 steps
of 0.5 by default) to *maximise* the contrastive loss, and the encoder is trained on the perturbed
views: the "A2A" (adversarial-to-adversarial) variant of Jiang et al., ACL, NeurIPS 2020 (their paper's; their
released code implements only the dual-stream variant, clean and adversarial branches with separate batch norms).
Kim et al.'s RoCL (NeurIPS 2020) differs: it perturbs one view and trains on both clean views and the adversarial
one. Both references attack with Linf eps 8/255 in eval mode; here the threat is L2 (``train.attack``, eps 1 as
the digits presets use) and the attack uses batch statistics with the running statistics frozen
(``attack_bn: train``), because eval-mode statistics are poor early in contrastive training.

The encoder is a :class:`~training.representation.Representation` of the zoo classifier, so the
trained network is the classifier's own ``net``: after pre-training, :func:`linear_probe` fits the
classifier's last linear layer on frozen features and the result is an ordinary
:class:`~training.models.Classifier` (loadable with ``build_model(arch, dataset, checkpoint=...)``).

The training loss is the reference code's ``loss_a + loss_b`` (objective.py: one mean per direction), twice the
average over the 2N anchors of the paper's Eq. 1 that :func:`~training.losses.nt_xent` returns. The scale matters
under LARS: the trust ratio cancels it for the weights, but not against the weight decay, and the biases and
batch-norm parameters (no trust ratio) step by lr × gradient. With it, ``conf/train/simclr.yaml``'s lr and weight
decay are the reference's CIFAR-10 command's.

Differences from the reference: the projection head has two layers (SimCLR v1's; the code whose CIFAR-10 command
gives weight decay 1e-4 is v2's, with three by default, and v1's command gave 1e-6), batch norm on its hidden layer
only and biases on both linear layers (the reference code drops the biases and adds a batch norm without shift on the
output); with ``train.optimizer.name=sgd`` batch-norm parameters are decayed too (the reference's momentum path
leaves them out; LARS does here as there); with
several processes the negatives are the local batch's (the reference gathers across TPU cores); the probe is
trained on features of un-augmented images computed once (the reference trains it with crop and flip), with the
features standardised during fitting and the standardisation folded into the layer's weights afterwards.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import evaluation
from invert.validation import hot_loop

from ..attacks import ThreatModel, bn_mode, check_bn_mode, maximize
from ..augment import SimCLRAugment
from ..data import IMAGE_SIZE, ImageSet
from ..losses import check_temperature, contrastive_accuracy, nt_xent
from ..models import Classifier
from ..optim import lr_factor
from ..representation import Representation
from .base import Recipe

# google-research/simclr trains on loss_a + loss_b, twice Eq. 1's mean (see the module docstring).
REFERENCE_LOSS_SCALE = 2.0


class ProjectionHead(nn.Sequential):
    """SimCLR's projection g(h): Linear(d, hidden) - BatchNorm - ReLU - Linear(hidden, out)."""

    def __init__(self, in_features: int, hidden: int, out_features: int = 128):
        super().__init__(nn.Linear(in_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_features))


def classifier_head(model: Classifier) -> nn.Linear:
    """The network's last linear layer (the one a linear probe fits)."""
    linears = [m for m in model.net.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{getattr(model, 'arch', type(model).__name__)} has no linear layer to use as a probe head")
    return linears[-1]


def encoder_of(model: Classifier) -> Representation:
    """The pooled penultimate features of ``model`` (no fake ReLU: real gradients for training)."""
    encoder = Representation(model, layer=None, fake_relu=False, pool="avg")
    head = classifier_head(model)
    if head.bias is None:
        raise ValueError(f"{model.arch}: the last linear layer has no bias; the linear probe needs one")
    device = next(model.parameters()).device
    with torch.no_grad(), hot_loop(), evaluation(encoder):
        size = IMAGE_SIZE.get(model.dataset, 32)
        dim = encoder(torch.zeros(2, 3, size, size, device=device)).shape[1]
    if dim != head.in_features:
        raise ValueError(
            f"{model.arch}: the penultimate features have {dim} dimensions but the last linear layer takes {head.in_features}; "
            "a linear probe needs the representation to feed that layer directly"
        )
    return encoder


class SimCLRRecipe(Recipe):
    """SimCLR, or adversarial SimCLR when ``threat`` is given (see module docstring)."""

    name = "simclr"
    supervised = False

    def __init__(self, model: Classifier, augment: SimCLRAugment, *, temperature: float = 0.5, projection_dim: int = 128,
                 threat: ThreatModel | None = None, attack_bn: str = "train", probe: dict | None = None):
        super().__init__(model, augment=augment)
        check_temperature(temperature)  # before training, not at the first loss
        if isinstance(projection_dim, bool) or not isinstance(projection_dim, int) or projection_dim < 1:
            raise ValueError(f"projection_dim must be a whole number >= 1, got {projection_dim!r}")
        if threat is not None and threat.norm != "l2" and threat.eps > 0.5:
            raise ValueError(f"adversarial SimCLR with Linf eps {threat.eps} would destroy the views; use eps in [0, 1] units (8/255)")
        self.encoder = encoder_of(model)
        self.head = classifier_head(model)
        self.head.requires_grad_(False)  # trained by the probe, not by the contrastive loss
        dim = self.head.in_features
        self.projector = ProjectionHead(dim, dim, projection_dim).to(next(model.parameters()).device)
        self.temperature, self.threat, self.attack_bn = float(temperature), threat, check_bn_mode(attack_bn)
        self.probe = dict(probe or {})
        check_probe_settings(**self.probe)  # the probe runs after the last pre-training epoch: a bad value is named now

    def prepare(self, images: Tensor) -> Tensor:
        views = torch.cat([self.augment(images), self.augment(images)])
        return views.contiguous(memory_format=torch.channels_last) if self.channels_last else views.contiguous()

    def project(self, views: Tensor) -> tuple[Tensor, Tensor]:
        z = self.projector(self.encoder(views))
        return z.chunk(2)

    def contrastive_loss(self, views: Tensor) -> Tensor:
        return REFERENCE_LOSS_SCALE * nt_xent(*self.project(views), self.temperature)

    def forward(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        if self.threat is not None:
            with bn_mode(self, self.attack_bn):
                inputs = maximize(self.contrastive_loss, inputs, self.threat)
        z1, z2 = self.project(inputs)
        return REFERENCE_LOSS_SCALE * nt_xent(z1, z2, self.temperature), {"acc": contrastive_accuracy(z1.detach(), z2.detach())}

    def hot_modules(self) -> list[nn.Module]:
        return [self.encoder, self.projector]

    def auxiliary_modules(self) -> dict[str, nn.Module]:
        return {"projector": self.projector}

    def finalize(self, train_data: ImageSet) -> Classifier:
        self.probe_result = linear_probe(self.model, train_data, **self.probe)
        return self.model

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "temperature": self.temperature, "projection_dim": self.projector[-1].out_features, "probe": self.probe}
        if self.threat is not None:
            out.update(attack=self.threat.to_dict(), attack_bn=self.attack_bn)
        if hasattr(self, "probe_result"):
            out["probe_train_accuracy"] = self.probe_result
        return out


class AdversarialSimCLRRecipe(SimCLRRecipe):
    """Adversarial SimCLR: SimCLR on views perturbed to maximise the contrastive loss (see module docstring)."""

    name = "adv_simclr"

    def __init__(self, model: Classifier, augment: SimCLRAugment, *, threat: ThreatModel, **kwargs):
        if threat is None:
            raise ValueError("adversarial SimCLR needs a threat model (train.attack)")
        super().__init__(model, augment, threat=threat, **kwargs)


@torch.no_grad()
def _features(encoder: Representation, data: ImageSet, batch_size: int, device) -> Tensor:
    chunks = [encoder(data.float_images(slice(i, i + batch_size), device=device)).float() for i in range(0, len(data), batch_size)]
    return torch.cat(chunks)


def check_probe_settings(*, epochs: int = 100, lr: float = 0.1, batch_size: int = 256, momentum: float = 0.9, weight_decay: float = 0.0,
                         seed: int = 0, feature_batch_size: int = 512) -> None:
    """The settings :func:`linear_probe` takes (an unknown one is a TypeError naming it), in range."""
    if epochs < 1 or lr <= 0 or batch_size < 1 or feature_batch_size < 1 or momentum < 0 or weight_decay < 0:
        raise ValueError(f"linear probe needs epochs >= 1, lr > 0, batch_size >= 1, feature_batch_size >= 1, momentum >= 0 and "
                         f"weight_decay >= 0; got {epochs}, {lr}, {batch_size}, {feature_batch_size}, {momentum}, {weight_decay} (train.probe)")


def linear_probe(model: Classifier, data: ImageSet, *, epochs: int = 100, lr: float = 0.1, batch_size: int = 256,
                 momentum: float = 0.9, weight_decay: float = 0.0, seed: int = 0, feature_batch_size: int = 512) -> float:
    """Fit ``model``'s last linear layer on frozen penultimate features of ``data`` (eval mode).

    Features are computed once, standardised for fitting (better conditioning), and the
    standardisation is folded into the layer afterwards, so ``model`` stays a plain classifier.
    SGD with Nesterov momentum and a cosine schedule, like SimCLR's linear evaluation. Returns the
    probe's accuracy on ``data``; the model is left in eval mode.

    The probe starts from zeros, where SimCLR's code draws N(0, 0.01): the problem is convex, so the start hardly
    matters, and zeros give every DDP rank the same head (the global RNG is seeded per rank, so each rank fitted its
    own and the test set was scored half by one head, half by another). A feature constant on ``data`` (a dead
    ReLU) is scaled by 1, as scikit-learn's ``StandardScaler`` does, and keeps a zero weight: it gets no gradient,
    and a clamped standard deviation of 1e-6 folded its random start into a weight a million times larger.
    """
    check_probe_settings(epochs=epochs, lr=lr, batch_size=batch_size, momentum=momentum, weight_decay=weight_decay, seed=seed,
                         feature_batch_size=feature_batch_size)
    device = next(model.parameters()).device
    encoder = encoder_of(model).eval()
    model.eval()
    with hot_loop():
        features = _features(encoder, data, feature_batch_size, device)
    labels = data.labels.to(device)
    spread = features.std(0)
    mean, std = features.mean(0), torch.where(spread > 1e-6, spread, torch.ones_like(spread))
    standardised = (features - mean) / std
    probe = nn.Linear(features.shape[1], model.num_classes).to(device)
    nn.init.zeros_(probe.weight)
    nn.init.zeros_(probe.bias)
    optimizer = torch.optim.SGD(probe.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=momentum > 0)
    steps_per_epoch = max(1, -(-len(labels) // batch_size))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, schedule="cosine", epochs=epochs, steps_per_epoch=steps_per_epoch)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(labels), generator=generator).to(device)
            for start in range(0, len(labels), batch_size):
                index = order[start:start + batch_size]
                loss = F.cross_entropy(probe(standardised[index]), labels[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
    head = classifier_head(model)
    with torch.no_grad():
        # probe(z) = W (f - mean) / std + b = (W / std) f + (b - W (mean / std))
        head.weight.copy_(probe.weight / std)
        head.bias.copy_(probe.bias - probe.weight @ (mean / std))
        accuracy = (head(features).argmax(1) == labels).float().mean()
    head.requires_grad_(True)
    return float(accuracy)


__all__ = ["AdversarialSimCLRRecipe", "ProjectionHead", "SimCLRRecipe", "classifier_head", "encoder_of", "linear_probe"]
