"""Clean and robust accuracy, and a gradient-masking sanity report.

* :func:`clean_accuracy`: top-1 accuracy on [0, 1] images.
* :func:`robust_accuracy`: accuracy under PGD (``training.attacks``) with random restarts; a sample
  counts as robust only if it is classified correctly clean *and* under every restart (the
  per-sample worst case, as in Madry et al.'s evaluation and AutoAttack's reporting).
* :func:`gradient_masking_report`: the sanity checks of Carlini et al., "On Evaluating Adversarial
  Robustness" (2019) and Athalye et al. (2018) that a defence audit starts from: the attack loss
  rises and accuracy falls as eps grows, robust accuracy never exceeds clean accuracy, and an
  unbounded attack drives accuracy to about 0. A failed check is a sign of masked gradients
  (e.g. k-WTA), not a proof.

Data is an :class:`~training.data.ImageSet` (uint8, converted per batch) or an ``(images, labels)``
pair of [0, 1] float images. Counts stay on the device until the end (one host sync per call).
Random starts come from a generator seeded by ``seed``, so an evaluation is reproducible and does
not disturb the global random state of a training run.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import evaluation, module_device
from invert.validation import check_images, hot_loop

from .attacks import ThreatModel, check_norm, config_number, pgd
from .data import ImageSet

Data = Union[ImageSet, tuple[Tensor, Tensor]]


def _length(data: Data) -> int:
    return len(data) if isinstance(data, ImageSet) else data[0].shape[0]


def _prepare(data: Data, limit: int | None) -> Data:
    """Validate once (so batches can skip the device-syncing range check) and cut to ``limit``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1):
        raise ValueError(f"limit must be a positive number of images (or None for all), got {limit!r}: "
                         "0 would evaluate nothing and report 0 % accuracy, a negative limit would drop images from the end")
    if _length(data) == 0:
        raise ValueError("no images to evaluate: the data set is empty")
    labels = data.labels if isinstance(data, ImageSet) else data[1]
    if labels.numel() and not (labels.dtype.is_floating_point or labels.dtype == torch.bool) and int(labels.min()) < 0:
        raise ValueError(f"labels must be class indices 0, 1, ...; found {int(labels.min())}")
    if isinstance(data, ImageSet):
        return data if limit is None or limit >= len(data) else data.subset(torch.arange(limit))
    images, labels = data
    check_images(images, "evaluation images", channels=3)
    if labels.shape != images.shape[:1]:
        raise ValueError(f"need one label per image: {tuple(labels.shape)} labels for {images.shape[0]} images")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images, labels.long()


def _check_label_range(data: Data, logits: Tensor) -> None:
    """Refuse labels the model has no output for (e.g. 1-based labels), from the first batch's logits, before an
    attack indexes past them (on a GPU, a device-side assert that ends the process's CUDA use)."""
    labels = data.labels if isinstance(data, ImageSet) else data[1]
    highest = int(labels.max())
    if highest >= logits.shape[1]:
        raise ValueError(f"label {highest} has no output: the model has {logits.shape[1]} (classes 0 to {logits.shape[1] - 1}); "
                         "are the labels 1-based?")


def _model_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of the model's first floating parameter or buffer (float32 when it has none)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _image_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the images and of an attack's steps and projections: the model's, but never below float32. In
    bfloat16 the images themselves were rounded (to 1/256 near 1) before the attack, and its results lay up to 6 % of
    an 8/255 ball outside the ball around the real images."""
    dtype = _model_dtype(model)
    return dtype if dtype == torch.float64 else torch.float32


class _CastInput(nn.Module):
    """A half-precision model that takes float32 images: the cast is the model's own first step, so an attack steps
    and projects in float32 and differentiates through it."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x.to(self.dtype))


def _evaluated(model: nn.Module) -> nn.Module:
    """``model`` as the evaluation runs it on :func:`_batches`' images (wrapped in :class:`_CastInput` when half precision)."""
    dtype = _model_dtype(model)
    return model if dtype == _image_dtype(model) else _CastInput(model, dtype)


def _batches(data: Data, batch_size: int, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
    """``(images, labels)`` batches on the model's device, in :func:`_image_dtype` and the model's memory format."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    device, dtype, channels_last = module_device(model), _image_dtype(model), _uses_channels_last(model)
    n = _length(data)
    for start in range(0, n, batch_size):
        index = slice(start, min(start + batch_size, n))
        if isinstance(data, ImageSet):
            x = data.float_images(index, device=device).to(dtype)
            y = data.labels[index].to(device, non_blocking=True).long()
        else:
            x = data[0][index].to(device, non_blocking=True).to(dtype)
            y = data[1][index].to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        yield x, y


def _uses_channels_last(model: nn.Module) -> bool:
    for p in model.parameters():
        if p.ndim == 4:
            return p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
    return False


def correct_counts(model: nn.Module, data: Data, threat: ThreatModel | None = None, *, restarts: int = 1,
                   batch_size: int = 256, limit: int | None = None, seed: int = 0) -> dict[str, Tensor]:
    """On-device counts ``{"n", "clean", "robust"}`` (``robust`` only with a threat model), for callers
    that sum them across processes before dividing."""
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, got {restarts}")
    data = _prepare(data, limit)
    device = module_device(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    clean = torch.zeros((), dtype=torch.long, device=device)
    robust = torch.zeros((), dtype=torch.long, device=device)
    with evaluation(model), hot_loop():
        batches, model = _batches(data, batch_size, model), _evaluated(model)
        for batch, (x, y) in enumerate(batches):
            with torch.no_grad():
                logits = model(x)
            if batch == 0:
                _check_label_range(data, logits)
            ok = logits.argmax(dim=1) == y
            clean += ok.sum()
            if threat is not None:
                for _ in range(restarts):
                    x_adv = pgd(model, x, y, threat, generator=generator)
                    with torch.no_grad():
                        ok &= model(x_adv).argmax(dim=1) == y
                robust += ok.sum()
    counts = {"n": torch.tensor(_length(data), device=device), "clean": clean}
    if threat is not None:
        counts["robust"] = robust
    return counts


def clean_accuracy(model: nn.Module, data: Data, *, batch_size: int = 256, limit: int | None = None) -> float:
    """Top-1 accuracy of ``model`` (which takes [0, 1] images) on ``data``."""
    counts = correct_counts(model, data, batch_size=batch_size, limit=limit)
    return int(counts["clean"]) / max(1, int(counts["n"]))


def robust_accuracy(model: nn.Module, data: Data, threat: ThreatModel, *, restarts: int = 1, batch_size: int = 256,
                    limit: int | None = None, seed: int = 0) -> float:
    """Accuracy under PGD with ``restarts`` random restarts (worst case per sample, clean-correct required)."""
    if not isinstance(threat, ThreatModel):
        raise ValueError(f"robust_accuracy needs a ThreatModel (norm, eps, steps), got {threat!r}; clean_accuracy takes no threat")
    counts = correct_counts(model, data, threat, restarts=restarts, batch_size=batch_size, limit=limit, seed=seed)
    return int(counts["robust"]) / max(1, int(counts["n"]))


DEFAULT_MASKING_EPS = {"l2": (0.125, 0.25, 0.5, 1.0, 2.0), "linf": (1 / 255, 2 / 255, 4 / 255, 8 / 255, 16 / 255)}


@dataclass
class MaskingReport:
    """The outcome of :func:`gradient_masking_report`: the eps sweep, the unbounded attack, the checks."""

    norm: str
    eps: list[float]
    loss: list[float]
    accuracy: list[float]
    clean_loss: float
    clean_accuracy: float
    unbounded_eps: float
    unbounded_accuracy: float
    n: int
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def __str__(self) -> str:
        rows = [f"gradient-masking report ({self.norm}, {self.n} images): {'PASSED' if self.passed else 'SUSPICIOUS'}",
                f"  eps 0: loss {self.clean_loss:.4f}, accuracy {self.clean_accuracy:.3f}"]
        rows += [f"  eps {e:.4g}: loss {l:.4f}, accuracy {a:.3f}" for e, l, a in zip(self.eps, self.loss, self.accuracy)]
        rows.append(f"  unbounded (eps {self.unbounded_eps:.4g}): accuracy {self.unbounded_accuracy:.3f}")
        rows += [f"  [{'ok' if ok else 'FAIL'}] {name}" for name, ok in self.checks.items()]
        rows += [f"  note: {note}" for note in self.notes]
        return "\n".join(rows)


def _loss_and_accuracy(model: nn.Module, data: Data, threat: ThreatModel | None, batch_size: int, seed: int) -> tuple[float, float]:
    device = module_device(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    with evaluation(model), hot_loop():
        batches, model = _batches(data, batch_size, model), _evaluated(model)
        for batch, (x, y) in enumerate(batches):
            if threat is not None:
                x = pgd(model, x, y, threat, generator=generator)
            with torch.no_grad():
                logits = model(x).float()
            if batch == 0 and threat is None:  # the clean pass runs first: labels are checked before any attack
                _check_label_range(data, logits)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
            correct += (logits.argmax(dim=1) == y).sum()
    n = _length(data)
    return float(loss_sum) / n, int(correct) / n


def gradient_masking_report(
    model: nn.Module,
    data: Data,
    norm: str = "l2",
    eps: Sequence[float | str] | float | str | None = None,
    *,
    steps: int = 20,
    unbounded_steps: int = 50,
    limit: int | None = 256,
    batch_size: int = 256,
    max_unbounded_accuracy: float = 0.05,
    tolerance: float = 1e-3,
    seed: int = 0,
) -> MaskingReport:
    """Sweep PGD over ``eps`` (default: a doubling ladder for the norm) and run an unbounded attack.

    Checks: ``loss_rises_with_eps`` (mean adversarial cross-entropy never falls by more than
    ``tolerance`` relative as eps grows, starting from the clean loss), ``accuracy_falls_with_eps``
    (never rises by more than one sample), ``robust_below_clean``, and
    ``unbounded_attack_succeeds`` (accuracy at most ``max_unbounded_accuracy`` when the ball covers
    the whole image box: Linf 1, L2 sqrt(C*H*W)). Each PGD uses ``steps`` steps of 2.5 eps / steps
    from a random start.
    """
    check_norm(norm)
    if eps is None:
        eps = DEFAULT_MASKING_EPS[norm]
    elif isinstance(eps, (numbers.Number, str)):
        eps = [eps]
    eps_values = sorted(config_number(e, "eps") for e in eps)
    if not eps_values:
        raise ValueError("gradient_masking_report needs at least one eps")
    data = _prepare(data, limit)
    n = _length(data)
    sample = data.images if isinstance(data, ImageSet) else data[0]
    unbounded = 1.0 if norm == "linf" else math.sqrt(math.prod(sample.shape[1:]))
    # Every threat model first: a bad eps or step count is refused before the sweeps, not after them.
    threats = [ThreatModel(norm, value, steps=steps) for value in eps_values]
    unbounded_threat = ThreatModel(norm, unbounded, steps=unbounded_steps)
    clean_loss, clean_acc = _loss_and_accuracy(model, data, None, batch_size, seed)
    losses, accuracies = [], []
    for threat in threats:
        loss, acc = _loss_and_accuracy(model, data, threat, batch_size, seed)
        losses.append(loss)
        accuracies.append(acc)
    _, unbounded_acc = _loss_and_accuracy(model, data, unbounded_threat, batch_size, seed)

    all_losses, all_accs = [clean_loss] + losses, [clean_acc] + accuracies
    one_sample = 1.0 / n + 1e-12
    checks = {
        "loss_rises_with_eps": all(b >= a - tolerance * max(1.0, abs(a)) for a, b in zip(all_losses, all_losses[1:])),
        "accuracy_falls_with_eps": all(b <= a + one_sample for a, b in zip(all_accs, all_accs[1:])),
        "robust_below_clean": all(acc <= clean_acc + one_sample for acc in accuracies),
        "unbounded_attack_succeeds": unbounded_acc <= max_unbounded_accuracy,
    }
    notes = []
    if not checks["unbounded_attack_succeeds"]:
        notes.append(f"an attack that may reach any image still leaves {unbounded_acc:.1%} accuracy: gradients are likely masked or obfuscated")
    if not checks["loss_rises_with_eps"]:
        notes.append("a larger ball gave a lower attack loss: the attack is failing to follow the gradient")
    return MaskingReport(norm, eps_values, losses, accuracies, clean_loss, clean_acc, unbounded, unbounded_acc, n, checks, notes)


__all__ = [
    "MaskingReport",
    "clean_accuracy",
    "correct_counts",
    "gradient_masking_report",
    "robust_accuracy",
]
