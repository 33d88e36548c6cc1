"""Attacks stronger than PGD for auditing defences: APGD (CE and targeted DLR), Square, and the
per-sample worst case over several attacks.

* :func:`apgd` follows Croce and Hein, "Reliable evaluation of adversarial robustness with an
  ensemble of diverse parameter-free attacks" (ICML 2020) and its reference code
  (``fra31/auto-attack``, ``autopgd_base.py``): step size ``2 eps`` halved at checkpoints when the
  loss oscillates (fewer than 75 % of the steps since the last checkpoint increased it) or the
  best loss did not improve, a restart from the best point after each halving, momentum 0.75, and
  checkpoints ``k`` starting at 22 % of the budget and shrinking by 3 % to at least 6 %.
  ``loss="ce"`` is APGD-CE; ``loss="dlr-targeted"`` is APGD-T (the targeted DLR loss, one run per
  target class, the ``n_targets`` runner-up classes of the clean logits); ``loss="dlr"`` is the
  untargeted DLR loss.
* :func:`square_linf` is the Linf Square attack of Andriushchenko et al., "Square Attack: a
  query-efficient black-box adversarial attack via random search" (ECCV 2020; reference code
  ``fra31/auto-attack/autoattack/square.py``): it never looks at gradients, so it is what catches
  gradient masking.
* :func:`worst_case` runs a set of attacks and counts a sample as robust only if it is classified
  correctly clean and under *every* attack (AutoAttack's reporting).

The steps reuse the engine: each APGD step is ``invert.steps``' ``LinfStep`` / ``L2Step`` with a
per-sample step size, projected with :meth:`training.attacks.ThreatModel.project`; APGD's loop has
its own schedule (momentum, checkpoints), so it cannot be an instance of :func:`training.attacks.maximize`.

Deliberate differences from the reference code: the returned image of a sample that was not
fooled is its highest-loss iterate (the reference returns the clean image), which is the stronger
choice against a randomised defence; the random L2 start is uniform in the ball
(``invert.steps.random_start_l2``, the reference starts on the sphere); the oscillation count
ignores steps before the first (the reference wraps around to the last row of its buffer); all
randomness comes from a ``torch.Generator``. ``eot_samples`` averages the gradient over several
forward passes (the reference's ``eot_iter``) for randomised defences.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.steps import L2Step, LinfStep
from invert.validation import check_images

from .attacks import AttackConfigError, ThreatModel, check_norm

log = logging.getLogger(__name__)

APGD_LOSSES = ("ce", "dlr", "dlr-targeted")
MOMENTUM = 0.75  # Croce and Hein's alpha
OSCILLATION_FRACTION = 0.75  # rho: a checkpoint halves the step if at most this fraction of steps raised the loss


def dlr_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Untargeted DLR loss (Croce and Hein 2020, eq. 5), per sample:
    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3)``. Needs at least 3 classes."""
    if logits.shape[1] < 3:
        raise AttackConfigError(f"the DLR loss needs at least 3 classes, the model has {logits.shape[1]}")
    sorted_logits, _ = logits.sort(dim=1)
    true = logits.gather(1, y[:, None])[:, 0]
    top_is_true = (logits.argmax(dim=1) == y).to(logits.dtype)
    best_other = sorted_logits[:, -2] * top_is_true + sorted_logits[:, -1] * (1 - top_is_true)
    return -(true - best_other) / (sorted_logits[:, -1] - sorted_logits[:, -3] + 1e-12)


def dlr_targeted_loss(logits: Tensor, y: Tensor, target: Tensor) -> Tensor:
    """Targeted DLR loss (Croce and Hein 2020, eq. 6), per sample:
    ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``. Needs at least 4 classes."""
    if logits.shape[1] < 4:
        raise AttackConfigError(f"the targeted DLR loss needs at least 4 classes, the model has {logits.shape[1]}")
    sorted_logits, _ = logits.sort(dim=1)
    true = logits.gather(1, y[:, None])[:, 0]
    aimed = logits.gather(1, target[:, None])[:, 0]
    return -(true - aimed) / (sorted_logits[:, -1] - 0.5 * (sorted_logits[:, -3] + sorted_logits[:, -4]) + 1e-12)


def apgd_schedule(steps: int) -> tuple[int, int, int]:
    """``(first_checkpoint, min_checkpoint, decrement)``: 22 %, 6 % and 3 % of ``steps`` (at least 1 each)."""
    return max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)


def _loss_fn(loss: str, y: Tensor, target: Tensor | None) -> Callable[[Tensor], Tensor]:
    if loss == "ce":
        return lambda logits: F.cross_entropy(logits, y, reduction="none")
    if loss == "dlr":
        return lambda logits: dlr_loss(logits, y)
    return lambda logits: dlr_targeted_loss(logits, y, target)


def _loss_grad(model: nn.Module, x: Tensor, loss_of: Callable[[Tensor], Tensor], eot_samples: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample loss, its gradient (averaged over ``eot_samples`` forward passes) and the last logits."""
    grad = torch.zeros_like(x)
    loss_sum = torch.zeros(x.shape[0], device=x.device)
    with torch.enable_grad():
        for _ in range(eot_samples):
            x_var = x.detach().requires_grad_(True)
            logits = model(x_var)
            loss = loss_of(logits.float())
            (g,) = torch.autograd.grad(loss.sum(), x_var)
            grad += g
            loss_sum += loss.detach()
    return loss_sum / eot_samples, grad / eot_samples, logits.detach()


def _apgd_single_run(model: nn.Module, x: Tensor, y: Tensor, threat: ThreatModel, loss_of: Callable[[Tensor], Tensor],
                     eot_samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """One APGD run from a random start; returns (adversarial images, fooled mask)."""
    steps = threat.steps
    k, k_min, k_decrement = apgd_schedule(steps)
    n = x.shape[0]
    x_adv = threat.random_point(x, generator)
    step_size = torch.full((n,), 2.0 * threat.eps, device=x.device, dtype=x.dtype)
    stepper = L2Step(step_size) if threat.norm == "l2" else LinfStep(step_size)

    loss, grad, logits = _loss_grad(model, x_adv, loss_of, eot_samples)
    fooled = logits.argmax(dim=1) != y
    x_best_adv = torch.where(fooled.view(-1, 1, 1, 1), x_adv, x)
    loss_best, x_best, grad_best = loss.clone(), x_adv.clone(), grad.clone()
    loss_steps = torch.zeros(steps, n, device=x.device)
    loss_best_last_check = loss_best.clone()
    reduced_last_check = torch.ones(n, dtype=torch.bool, device=x.device)
    x_previous = x_adv.clone()
    since_check = 0
    for i in range(steps):
        with torch.no_grad():
            momentum_term = x_adv - x_previous
            x_previous = x_adv
            a = MOMENTUM if i > 0 else 1.0
            z = threat.project(stepper.step(x_adv, grad.neg(), {}), x)
            x_adv = threat.project(x_adv + (z - x_adv) * a + momentum_term * (1 - a), x)
        loss, grad, logits = _loss_grad(model, x_adv, loss_of, eot_samples)
        with torch.no_grad():
            now_fooled = logits.argmax(dim=1) != y
            x_best_adv = torch.where(now_fooled.view(-1, 1, 1, 1), x_adv, x_best_adv)
            fooled |= now_fooled
            loss_steps[i] = loss
            improved = loss > loss_best
            x_best = torch.where(improved.view(-1, 1, 1, 1), x_adv, x_best)
            grad_best = torch.where(improved.view(-1, 1, 1, 1), grad, grad_best)
            loss_best = torch.where(improved, loss, loss_best)
            since_check += 1
            if since_check == k:
                first = max(i - k + 1, 1)
                increases = (loss_steps[first:i + 1] > loss_steps[first - 1:i]).sum(dim=0)
                oscillating = increases <= k * OSCILLATION_FRACTION
                no_improvement = ~reduced_last_check & (loss_best_last_check >= loss_best)
                halve = oscillating | no_improvement
                reduced_last_check = halve
                loss_best_last_check = loss_best.clone()
                step_size.copy_(torch.where(halve, step_size / 2, step_size))  # the stepper holds this tensor
                x_adv = torch.where(halve.view(-1, 1, 1, 1), x_best, x_adv)
                grad = torch.where(halve.view(-1, 1, 1, 1), grad_best, grad)
                k = max(k - k_decrement, k_min)
                since_check = 0
    return torch.where(fooled.view(-1, 1, 1, 1), x_best_adv, x_best).detach(), fooled


def apgd(model: nn.Module, x: Tensor, y: Tensor, threat: ThreatModel, *, loss: str = "ce", restarts: int = 1,
         n_targets: int = 9, eot_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
    """APGD (Croce and Hein 2020) on ``model`` (which takes [0, 1] images); ``threat.steps`` is the
    iteration budget per run, ``threat.step_size`` and ``random_start`` are not used (APGD sets its own
    step size and always starts at a random point of the ball).

    ``loss``: ``"ce"`` (APGD-CE, ``restarts`` runs), ``"dlr"`` or ``"dlr-targeted"`` (APGD-T: one run per
    target, the ``n_targets`` best-scoring wrong classes of the clean logits, each repeated ``restarts``
    times). Later runs attack only the samples not yet fooled. Returns images in the ball and in [0, 1]:
    a misclassified point where one was found, otherwise the highest-loss point.
    """
    check_images(x, "images to attack")
    if loss not in APGD_LOSSES:
        raise AttackConfigError(f"unknown APGD loss {loss!r}: use one of {APGD_LOSSES}")
    if restarts < 1 or eot_samples < 1 or n_targets < 1:
        raise AttackConfigError(f"restarts, eot_samples and n_targets must be at least 1, got {restarts}, {eot_samples}, {n_targets}")
    x, y = x.detach(), y.detach()
    with torch.no_grad():
        clean_logits = model(x)
    n_classes = clean_logits.shape[1]
    x_out = x.clone()
    remaining = clean_logits.argmax(dim=1) == y  # misclassified clean images need no attack
    if loss == "dlr-targeted":
        order = clean_logits.sort(dim=1).indices
        targets = [order[:, -(t + 2)] for t in range(min(n_targets, n_classes - 1))]
    else:
        targets = [None]
    for target in targets:
        for _ in range(restarts):
            index = remaining.nonzero()[:, 0]
            if index.numel() == 0:
                return x_out
            loss_of = _loss_fn(loss, y[index], None if target is None else target[index])
            x_adv, fooled = _apgd_single_run(model, x[index], y[index], threat, loss_of, eot_samples, generator)
            x_out[index] = x_adv
            remaining[index[fooled]] = False
    return x_out


def _square_p(iteration: int, queries: int, p_init: float) -> float:
    """The fraction of pixels a square covers at ``iteration`` (Andriushchenko et al.'s piecewise
    schedule, rescaled to ``queries`` as the reference's ``rescale_schedule``)."""
    it = int(iteration / queries * 10000)
    for bound, divisor in ((8000, 512), (6000, 256), (4000, 128), (2000, 64), (1000, 32), (500, 16), (200, 8), (50, 4), (10, 2)):
        if it > bound:
            return p_init / divisor
    return p_init


def margin(logits: Tensor, y: Tensor) -> Tensor:
    """``z_y - max_{i != y} z_i`` per sample: positive while the sample is classified correctly."""
    true = logits.gather(1, y[:, None])[:, 0]
    others = logits.scatter(1, y[:, None], float("-inf"))
    return true - others.max(dim=1).values


def square_linf(model: nn.Module, x: Tensor, y: Tensor, eps: float, *, queries: int = 1000, p_init: float = 0.8,
                generator: torch.Generator | None = None) -> Tensor:
    """The Linf Square attack (Andriushchenko et al. 2020), untargeted with the margin loss.

    Starts from vertical stripes of +-eps, then proposes at each query a square of side
    ``round(sqrt(p * H * W))`` (``p`` from the schedule) filled with +-2 eps per channel at one random
    position (shared by the batch, as the reference), clipped to the ball and the box, and keeps it for
    the samples whose margin fell. Stops querying a sample once it is misclassified. No gradients.
    """
    check_images(x, "images to attack")
    ThreatModel("linf", eps)  # validates eps
    if queries < 1 or not 0 < p_init <= 1:
        raise AttackConfigError(f"queries must be positive and p_init in (0, 1], got {queries}, {p_init}")
    x, y = x.detach(), y.detach()
    n, c, h, w = x.shape
    device = x.device

    def rand_sign(*shape: int) -> Tensor:
        return torch.randint(0, 2, shape, generator=generator, device=device).to(x.dtype) * 2 - 1

    with torch.no_grad():
        x_best = (x + eps * rand_sign(n, c, 1, w)).clamp(0, 1)
        margin_best = margin(model(x_best), y)
        for iteration in range(queries):
            active = (margin_best > 0).nonzero()[:, 0]
            if active.numel() == 0:
                break
            x_curr, x_best_curr = x[active], x_best[active]
            side = min(max(int(round(math.sqrt(_square_p(iteration, queries, p_init) * h * w))), 1), h)
            vh = int(torch.randint(0, h - side + 1, (1,), generator=generator, device=device))
            vw = int(torch.randint(0, w - side + 1, (1,), generator=generator, device=device))
            delta = torch.zeros(c, h, w, device=device, dtype=x.dtype)
            delta[:, vh:vh + side, vw:vw + side] = 2 * eps * rand_sign(c, 1, 1)
            x_new = torch.minimum(torch.maximum(x_best_curr + delta, x_curr - eps), x_curr + eps).clamp(0, 1)
            margin_new = margin(model(x_new), y[active])
            better = margin_new < margin_best[active]
            x_best[active] = torch.where(better.view(-1, 1, 1, 1), x_new, x_best_curr)
            margin_best[active] = torch.where(better, margin_new, margin_best[active])
    return x_best


Attack = Callable[[nn.Module, Tensor, Tensor], Tensor]


@dataclass
class WorstCase:
    """Per-sample correctness under each attack (``correct[name]``, bool (N,)) and the worst case."""

    clean: Tensor
    correct: dict[str, Tensor] = field(default_factory=dict)

    @property
    def robust(self) -> Tensor:
        """Correct clean and under every attack."""
        ok = self.clean.clone()
        for mask in self.correct.values():
            ok &= mask
        return ok

    def accuracies(self) -> dict[str, float]:
        n = max(1, self.clean.numel())
        out = {"clean": int(self.clean.sum()) / n}
        out.update({name: int((mask & self.clean).sum()) / n for name, mask in self.correct.items()})
        out["worst_case"] = int(self.robust.sum()) / n
        return out


def worst_case(model: nn.Module, x: Tensor, y: Tensor, attacks: dict[str, Attack], *, predict: Callable[[Tensor], Tensor] | None = None) -> WorstCase:
    """Run every attack on all of ``x`` and record each one's per-sample correctness; the robust accuracy
    of the audit is :attr:`WorstCase.robust` (correct under every attack). ``predict`` (default
    ``model(x).argmax(1)``) classifies the adversarial images, e.g. averaged over a randomised model's passes."""
    check_images(x, "images to attack")
    if not attacks:
        raise ValueError("worst_case needs at least one attack")
    classify = predict or (lambda images: model(images).argmax(dim=1))
    with torch.no_grad():
        result = WorstCase(clean=classify(x) == y)
    for name, attack in attacks.items():
        x_adv = attack(model, x, y)
        with torch.no_grad():
            result.correct[name] = classify(x_adv) == y
        log.info("%s: accuracy %.3f", name, float(result.correct[name].float().mean()))
    return result


__all__ = ["APGD_LOSSES", "WorstCase", "apgd", "apgd_schedule", "check_norm", "dlr_loss", "dlr_targeted_loss", "margin", "square_linf", "worst_case"]
