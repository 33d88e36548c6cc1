"""Attacks stronger than PGD for auditing defences: APGD (CE and targeted DLR), Square, and the
per-sample worst case over several attacks.

* :func:`apgd` follows Croce and Hein, "Reliable evaluation of adversarial robustness with an
  ensemble of diverse parameter-free attacks" (ICML 2020) and its reference code
  (``fra31/auto-attack``, ``autopgd_base.py``): step size ``2 eps`` halved at checkpoints when the
  loss oscillates (at most 75 % of the steps since the last checkpoint increased it) or the
  best loss did not improve, a restart from the best point after each halving, momentum 0.75, and
  checkpoints ``k`` starting at 22 % of the budget and shrinking by 3 % to at least 6 %.
  ``loss="ce"`` is APGD-CE; ``loss="dlr-targeted"`` is APGD-T (the targeted DLR loss, one run per
  target class, the ``n_targets`` runner-up classes of the clean logits); ``loss="dlr"`` is the
  untargeted DLR loss.
* :func:`square_linf` and :func:`square_l2` are the Square attack of Andriushchenko et al., "Square
  Attack: a query-efficient black-box adversarial attack via random search" (ECCV 2020; reference code
  ``fra31/auto-attack/autoattack/square.py``) for Linf and L2 (:func:`square` picks by norm): they
  never look at gradients, so they are what catches gradient masking.
* :func:`straight_through` is BPDA (Athalye et al., ICML 2018) with the identity as the approximation:
  a named non-differentiable submodule keeps its forward pass and passes gradients through unchanged.
* :func:`worst_case` runs a set of attacks and counts a sample as robust only if it is classified
  correctly clean and under *every* attack (AutoAttack's reporting).

The steps reuse the engine: each APGD step is ``invert.steps``' ``LinfStep`` / ``L2Step`` with a
per-sample step size, projected with :meth:`training.attacks.ThreatModel.project`; APGD's loop has
its own schedule (momentum, checkpoints), so it cannot be an instance of :func:`training.attacks.maximize`.

Deliberate differences from the reference code: the returned image of a sample that was not
fooled is its highest-loss iterate (the reference returns the clean image), which is the stronger
choice against a randomised defence; the random start is uniform in the ball (``invert.steps``'
``random_start_l2`` / ``random_start_linf``; the reference starts on the L2 sphere, and in Linf at
``x + eps t / ||t||_inf``, which puts one coordinate of each sample on the boundary); the first checkpoint's
oscillation count compares the first step with the start point, as the paper's condition 1 does (the reference
compares it with a buffer row not yet written, 0, which counts as an increase for CE and as none for DLR); all
randomness comes from a ``torch.Generator``. ``eot_samples`` averages the gradient over several
forward passes (the reference's ``eot_iter``) for randomised defences, and the loss too: the mean loss of
those passes decides the best point and the checkpoints, where the reference uses the last pass's loss.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invert.modules import evaluation
from invert.steps import L2Step, LinfStep
from invert.validation import check_images

from .attacks import AttackConfigError, ThreatModel, check_labels, check_norm

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


def _in_eval_mode(attack: Callable) -> Callable:
    """Run ``attack(model, ...)`` with ``model`` in eval mode, as the defence is deployed (batch norm on its running
    statistics, which an attack must not update), and give every submodule its own mode back afterwards."""
    @functools.wraps(attack)
    def run(model: nn.Module, *args, **kwargs):
        with evaluation(model):
            return attack(model, *args, **kwargs)
    return run


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
    loss_sum = torch.zeros(x.shape[0], device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
    with torch.enable_grad():
        for _ in range(eot_samples):
            x_var = x.detach().requires_grad_(True)
            logits = model(x_var)
            loss = loss_of(_at_least_float32(logits))
            (g,) = torch.autograd.grad(loss.sum(), x_var)
            grad += g
            loss_sum += loss.detach()
    return loss_sum / eot_samples, grad / eot_samples, logits.detach()


def smoothed_loss_grad(model: nn.Module, x: Tensor, loss_of: Callable[[Tensor], Tensor], sigma: float, samples: int,
                       generator: torch.Generator | None = None, max_batch: int = 2048) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample loss and gradient of the Gaussian-smoothed loss ``E_u[L(x + sigma u)]``, u ~ N(0, I),
    estimated from queries alone, and the logits of ``x`` itself (which decide whether a sample is fooled).

    The gradient is the antithetic finite-difference estimate over ``samples // 2`` random directions,
    ``mean_u[(L(x + sigma u) - L(x - sigma u)) u] / (2 sigma)`` (Stein's identity), as in the adaptive attack
    of Tramer et al., "On Adaptive Attacks to Adversarial Example Defenses" (NeurIPS 2020), on k-WTA, whose
    loss is discontinuous: autograd sees only the linear piece around ``x`` and misses the jumps, which the
    finite differences see. The returned loss is the mean of the ``samples`` noisy losses. Noisy points are
    clamped to [0, 1]; ``max_batch`` bounds the images per forward pass."""
    pairs = max(samples // 2, 1)
    n, shape = x.shape[0], x.shape[1:]
    per_pass = max(max_batch // (2 * n), 1)
    grad = torch.zeros_like(x)
    loss_sum = torch.zeros(n, device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
    with torch.no_grad():
        for start in range(0, pairs, per_pass):
            count = min(per_pass, pairs - start)
            u = torch.randn((count, n, *shape), generator=generator, device=x.device, dtype=x.dtype)
            both = torch.cat([(x + sigma * u).clamp(0, 1), (x - sigma * u).clamp(0, 1)]).reshape(2 * count * n, *shape)
            losses = _losses_of_copies(model, both, loss_of, 2 * count).view(2, count, n)
            grad += ((losses[0] - losses[1]).view(count, n, *([1] * len(shape))) * u).sum(0)
            loss_sum += losses.sum((0, 1))
        logits = model(x)
    return loss_sum / (2 * pairs), grad / (2 * sigma * pairs), logits


def _losses_of_copies(model: nn.Module, images: Tensor, loss_of: Callable[[Tensor], Tensor], repeats: int) -> Tensor:
    """``loss_of`` (a per-sample loss of n samples) on each of ``repeats`` stacked copies of n samples' images, in one forward."""
    n = images.shape[0] // repeats
    logits = _at_least_float32(model(images))
    return torch.stack([loss_of(logits[i * n:(i + 1) * n]) for i in range(repeats)])


def _at_least_float32(logits: Tensor) -> Tensor:
    """Losses of half-precision logits in float32; a float64 model's stay float64 (the losses decide the best point)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


LossGrad = Callable[[nn.Module, Tensor, Callable[[Tensor], Tensor]], tuple[Tensor, Tensor, Tensor]]


def _apgd_single_run(model: nn.Module, x: Tensor, y: Tensor, threat: ThreatModel, loss_of: Callable[[Tensor], Tensor],
                     loss_grad: LossGrad, generator: torch.Generator | None, highest_loss: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """One APGD run from a random start; returns (adversarial images, fooled mask, the highest loss found: the loss of
    the returned image of a sample that was not fooled). The images are the last misclassified iterate of a fooled
    sample (as the reference keeps them), else its highest-loss point; with ``highest_loss`` every sample's highest-loss point."""
    steps = threat.steps
    k, k_min, k_decrement = apgd_schedule(steps)
    n = x.shape[0]
    x_adv = threat.random_point(x, generator)
    step_size = torch.full((n,), 2.0 * threat.eps, device=x.device, dtype=x.dtype)
    stepper = L2Step(step_size) if threat.norm == "l2" else LinfStep(step_size)

    loss, grad, logits = loss_grad(model, x_adv, loss_of)
    fooled = logits.argmax(dim=1) != y
    x_best_adv = torch.where(fooled.view(-1, 1, 1, 1), x_adv, x)
    loss_best, x_best, grad_best = loss.clone(), x_adv.clone(), grad.clone()
    loss_steps = torch.zeros(steps + 1, n, device=x.device)  # row 0: the start point's loss; row i + 1: step i's
    loss_steps[0] = loss
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
        loss, grad, logits = loss_grad(model, x_adv, loss_of)
        with torch.no_grad():
            now_fooled = logits.argmax(dim=1) != y
            x_best_adv = torch.where(now_fooled.view(-1, 1, 1, 1), x_adv, x_best_adv)
            fooled |= now_fooled
            loss_steps[i + 1] = loss
            improved = loss > loss_best
            x_best = torch.where(improved.view(-1, 1, 1, 1), x_adv, x_best)
            grad_best = torch.where(improved.view(-1, 1, 1, 1), grad, grad_best)
            loss_best = torch.where(improved, loss, loss_best)
            since_check += 1
            if since_check == k:
                # Croce and Hein's condition 1: the k steps since the last checkpoint, the first against its start
                increases = (loss_steps[i - k + 2:i + 2] > loss_steps[i - k + 1:i + 1]).sum(dim=0)
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
    if highest_loss:
        return x_best.detach(), fooled, loss_best.detach()
    return torch.where(fooled.view(-1, 1, 1, 1), x_best_adv, x_best).detach(), fooled, loss_best.detach()


@_in_eval_mode
def apgd(model: nn.Module, x: Tensor, y: Tensor, threat: ThreatModel, *, loss: str = "ce", restarts: int = 1,
         n_targets: int = 9, eot_samples: int = 1, smoothing_sigma: float = 0.0, smoothing_samples: int = 64,
         every_image: bool = False, generator: torch.Generator | None = None) -> Tensor:
    """APGD (Croce and Hein 2020) on ``model`` (which takes [0, 1] images); ``threat.steps`` is the
    iteration budget per run, ``threat.step_size`` and ``random_start`` are not used (APGD sets its own
    step size and always starts at a random point of the ball).

    ``loss``: ``"ce"`` (APGD-CE, ``restarts`` runs), ``"dlr"`` or ``"dlr-targeted"`` (APGD-T: one run per
    target, the ``n_targets`` best-scoring wrong classes of the clean logits, each repeated ``restarts``
    times). Later runs attack only the samples not yet fooled. Returns images in the ball and in [0, 1]:
    a misclassified point where one was found, otherwise the highest-loss point of all runs (for APGD-T, whose
    targets' losses do not compare, the point of the run whose margin, the highest wrong logit minus the true
    one, is largest).

    ``every_image=True`` is the transfer attack's setting, where ``model`` is a surrogate and fooling it is not the
    goal: every image is attacked (those ``model`` misclassifies clean too) for all runs, and the highest-loss point
    is returned whether or not ``model`` is fooled there.

    ``smoothing_sigma`` > 0 attacks the Gaussian-smoothed loss instead, with gradients estimated from
    ``smoothing_samples`` queries per step (:func:`smoothed_loss_grad`, Tramer et al. 2020's attack on
    k-WTA; ``eot_samples`` is then unused: the estimate already averages many passes).
    """
    check_images(x, "images to attack")
    y = check_labels(y, x)
    if loss not in APGD_LOSSES:
        raise AttackConfigError(f"unknown APGD loss {loss!r}: use one of {APGD_LOSSES}")
    if restarts < 1 or eot_samples < 1 or n_targets < 1:
        raise AttackConfigError(f"restarts, eot_samples and n_targets must be at least 1, got {restarts}, {eot_samples}, {n_targets}")
    if not smoothing_sigma >= 0 or (smoothing_sigma > 0 and smoothing_samples < 2):
        raise AttackConfigError(f"smoothing_sigma must be >= 0 (a standard deviation in image units) and smoothing_samples >= 2 when it is set, "
                                f"got {smoothing_sigma} and {smoothing_samples}")
    loss_grad: LossGrad = (partial(smoothed_loss_grad, sigma=smoothing_sigma, samples=smoothing_samples, generator=generator)
                           if smoothing_sigma > 0 else partial(_loss_grad, eot_samples=eot_samples))
    x, y = x.detach(), y.detach()
    with torch.no_grad():
        clean_logits = model(x)
    n_classes = clean_logits.shape[1]
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= n_classes):  # such a sample counted as misclassified: never attacked
        raise AttackConfigError(f"labels must lie in 0..{n_classes - 1} (the model's outputs), got {int(y.min())}..{int(y.max())}; "
                                "are they 1-based?")
    x_out = x.clone()
    kept_score = torch.full((x.shape[0],), -math.inf, device=x.device)  # of each unfooled sample's point in x_out
    remaining = torch.ones_like(y, dtype=torch.bool) if every_image else clean_logits.argmax(dim=1) == y  # else: misclassified need no attack
    if loss == "dlr-targeted":
        # The reference's order[:, -(t + 2)] assumes the top class is y: true of the correctly classified points it attacks,
        # not of the misclassified ones every_image attacks too (a target could be y itself). Rank the wrong classes only.
        order = clean_logits.scatter(1, y[:, None], -math.inf).sort(dim=1).indices
        targets = [order[:, -(t + 1)] for t in range(min(n_targets, n_classes - 1))]
    else:
        targets = [None]
    for target in targets:
        for _ in range(restarts):
            index = remaining.nonzero()[:, 0]
            if index.numel() == 0:
                return x_out
            loss_of = _loss_fn(loss, y[index], None if target is None else target[index])
            x_adv, fooled, run_loss = _apgd_single_run(model, x[index], y[index], threat, loss_of, loss_grad, generator, every_image)
            if every_image:
                fooled = torch.zeros_like(fooled)  # the surrogate's answer does not matter: keep the highest loss, attack on
            if len(targets) == 1:
                score = run_loss
            else:
                with torch.no_grad():
                    score = -margin(model(x_adv), y[index])  # higher: nearer to a wrong answer
            better = fooled | (score > kept_score[index])  # a later run replaces a point only with a stronger one
            x_out[index[better]] = x_adv[better]
            kept_score[index[better]] = score[better]
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


def _check_square(x: Tensor, y: Tensor, norm: str, eps: float, queries: int, p_init: float) -> Tensor:
    """The Square attacks' inputs, checked before the first query; returns the labels as int64."""
    check_images(x, "images to attack")
    y = check_labels(y, x)
    ThreatModel(norm, eps)  # validates eps
    if queries < 1 or not 0 < p_init <= 1:
        raise AttackConfigError(f"queries must be positive and p_init in (0, 1], got {queries}, {p_init}")
    return y


def _random_sign(shape: tuple[int, ...], generator: torch.Generator | None, like: Tensor) -> Tensor:
    """Uniform +-1 of ``shape`` on ``like``'s device and dtype, drawn from ``generator``."""
    return torch.randint(0, 2, shape, generator=generator, device=like.device).to(like.dtype) * 2 - 1


@_in_eval_mode
def square_linf(model: nn.Module, x: Tensor, y: Tensor, eps: float, *, queries: int = 1000, p_init: float = 0.8,
                generator: torch.Generator | None = None) -> Tensor:
    """The Linf Square attack (Andriushchenko et al. 2020), untargeted with the margin loss.

    Starts from vertical stripes of +-eps, then proposes at each query a square of side
    ``round(sqrt(p * H * W))`` (``p`` from the schedule) filled with +-2 eps per channel at one random
    position (shared by the batch, as the reference), clipped to the ball and the box, and keeps it for
    the samples whose margin fell. Stops querying a sample once it is misclassified. No gradients.
    Positions range over every place the square fits (0 to H - side); the reference's ``random_int`` never
    draws the last row and column of places.
    """
    y = _check_square(x, y, "linf", eps, queries, p_init)
    x, y = x.detach(), y.detach()
    n, c, h, w = x.shape
    device = x.device

    def rand_sign(*shape: int) -> Tensor:
        return _random_sign(shape, generator, x)

    with torch.no_grad():
        x_best = (x + eps * rand_sign(n, c, 1, w)).clamp(0, 1)
        margin_best = margin(model(x_best), y)
        for iteration in range(queries):
            active = (margin_best > 0).nonzero()[:, 0]
            if active.numel() == 0:
                break
            x_curr, x_best_curr = x[active], x_best[active]
            side = min(max(int(round(math.sqrt(_square_p(iteration, queries, p_init) * h * w))), 1), h, w)  # as the reference: min(h, w)
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


def _centred_rectangles(height: int, width: int, device, dtype) -> Tensor:
    """Concentric rectangles around the centre of a (height, width) patch, ring k weighted 1 / (k + 1)^2."""
    patch = torch.zeros(height, width, device=device, dtype=dtype)
    top, left = height // 2, width // 2
    for ring in range(max(top, left) + 1):
        patch[max(top - ring, 0):min(top + ring + 1, height), max(left - ring, 0):min(left + ring + 1, width)] += 1.0 / (ring + 1) ** 2
    return patch / patch.norm()


def square_l2_patch(side: int, transpose: bool, device=None, dtype=torch.float32) -> Tensor:
    """The L2 Square attack's unit-norm (side, side) update: rectangles of one sign in the top half and the other
    sign in the bottom half (the paper's "meta pseudo-Gaussian" perturbation), optionally transposed."""
    patch = torch.cat([_centred_rectangles(side // 2, side, device, dtype), -_centred_rectangles(side - side // 2, side, device, dtype)])
    patch = patch / patch.norm()
    return patch.T.contiguous() if transpose else patch


def _per_sample_l2(delta: Tensor) -> Tensor:
    return delta.flatten(1).norm(dim=1).view(-1, 1, 1, 1)


def _per_channel_l2(delta: Tensor) -> Tensor:
    return delta.flatten(2).norm(dim=2)[..., None, None]


def square_l2_proposal(delta: Tensor, first: tuple[int, int], second: tuple[int, int], side: int, patch: Tensor,
                       eps: float) -> Tensor:
    """One L2 Square proposal (Andriushchenko et al. 2020, Algorithm 3; auto-attack's ``square.py``): a new
    perturbation from ``delta`` (N, C, H, W) with the window of side ``side`` at ``first`` (top, left) set to ``patch``
    (N, C, side, side, already signed) plus the window's old content, and the window at ``second`` emptied. Per
    channel, the first window's new norm is sqrt((eps² - ||delta||²) / C + ||both windows' content in that channel||²),
    so the mass of both windows moves into the first and a ``delta`` of norm eps keeps norm eps."""
    if delta.ndim != 4:
        raise ValueError(f"delta must be a (N, C, H, W) perturbation, got shape {tuple(delta.shape)}")
    n, c, h, w = delta.shape
    if tuple(patch.shape) != (n, c, side, side):
        raise ValueError(f"patch must be (N, C, side, side) = {(n, c, side, side)} for this delta, got {tuple(patch.shape)}")
    for name, (top, left) in (("first", first), ("second", second)):
        if not (0 <= top <= h - side and 0 <= left <= w - side):
            raise ValueError(f"the {name} window at (top, left) = {(top, left)} with side {side} does not fit a {h}x{w} image: "
                             f"top must lie in [0, {h - side}] and left in [0, {w - side}]")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    (vh, vw), (vh2, vw2) = first, second
    first_window = (slice(None), slice(None), slice(vh, vh + side), slice(vw, vw + side))
    second_window = (slice(None), slice(None), slice(vh2, vh2 + side), slice(vw2, vw2 + side))
    windows = torch.zeros_like(delta)
    windows[first_window], windows[second_window] = 1.0, 1.0
    norm_image = _per_sample_l2(delta)
    norm_windows = _per_channel_l2(delta * windows)
    old = delta[first_window]
    proposal = patch + old / (_per_channel_l2(old) + 1e-12)
    budget = ((eps ** 2 - norm_image ** 2).clamp_min(0) / delta.shape[1] + norm_windows ** 2).sqrt()
    new = delta.clone()
    new[second_window] = 0.0
    new[first_window] = proposal / (_per_channel_l2(proposal) + 1e-12) * budget
    return new


@_in_eval_mode
def square_l2(model: nn.Module, x: Tensor, y: Tensor, eps: float, *, queries: int = 1000, p_init: float = 0.8,
              generator: torch.Generator | None = None) -> Tensor:
    """The L2 Square attack (Andriushchenko et al. 2020, Algorithm 3), untargeted with the margin loss.

    Starts from a grid of ``H // 5`` tiles, each a :func:`square_l2_patch` with a random sign per sample and
    channel, scaled to norm ``eps``. Each query picks two windows of side ``s`` (odd, at least 3, ``p`` from the
    schedule) and makes a :func:`square_l2_proposal`: the first gets a new patch plus its old content, the second's
    mass moves into the first, channel by channel, so the whole perturbation keeps norm ``eps``; the proposal is kept
    for the samples whose margin fell. No gradients.

    Differences from the reference: window positions and the patch's orientation are shared by the batch (the
    reference's too) but drawn from ``generator``; the rescaling adds a tiny constant only to divisors, like the
    reference; a sample stops being queried once misclassified.
    """
    y = _check_square(x, y, "l2", eps, queries, p_init)
    x, y = x.detach(), y.detach()
    n, c, h, w = x.shape
    device, dtype = x.device, x.dtype

    def rand_sign(*shape: int) -> Tensor:
        return _random_sign(shape, generator, x)

    def coin() -> bool:
        return bool(torch.randint(0, 2, (1,), generator=generator, device=device))

    def position(side: int) -> tuple[int, int]:
        return (int(torch.randint(0, h - side + 1, (1,), generator=generator, device=device)),
                int(torch.randint(0, w - side + 1, (1,), generator=generator, device=device)))

    with torch.no_grad():
        tile = max(h // 5, 1)
        start = (h - tile * 5) // 2 if h >= 5 else 0
        delta = torch.zeros_like(x)
        for top in range(start, h - tile + 1, tile):
            for left in range(start, w - tile + 1, tile):
                delta[:, :, top:top + tile, left:left + tile] += square_l2_patch(tile, coin(), device, dtype) * rand_sign(n, c, 1, 1)
        x_best = (x + eps * delta / (_per_sample_l2(delta) + 1e-12)).clamp(0, 1)
        margin_best = margin(model(x_best), y)
        for iteration in range(queries):
            active = (margin_best > 0).nonzero()[:, 0]
            if active.numel() == 0:
                break
            x_curr, x_best_curr = x[active], x_best[active]
            delta = x_best_curr - x_curr
            side = max(int(round(math.sqrt(_square_p(iteration, queries, p_init) * h * w))), 3)
            side = min(side + 1 - side % 2, min(h, w) - (1 - min(h, w) % 2))  # odd, and not larger than the image
            first, second = position(side), position(side)
            patch = square_l2_patch(side, coin(), device, dtype) * rand_sign(len(active), c, 1, 1)
            delta = square_l2_proposal(delta, first, second, side, patch, eps)
            x_new = (x_curr + eps * delta / (_per_sample_l2(delta) + 1e-12)).clamp(0, 1)
            margin_new = margin(model(x_new), y[active])
            better = margin_new < margin_best[active]
            x_best[active] = torch.where(better.view(-1, 1, 1, 1), x_new, x_best_curr)
            margin_best[active] = torch.where(better, margin_new, margin_best[active])
    return x_best


def square(model: nn.Module, x: Tensor, y: Tensor, norm: str, eps: float, **kwargs) -> Tensor:
    """:func:`square_linf` or :func:`square_l2` by ``norm``."""
    return {"linf": square_linf, "l2": square_l2}[check_norm(norm)](model, x, y, eps, **kwargs)


@contextlib.contextmanager
def straight_through(model: nn.Module, module_name: str) -> Iterator[nn.Module]:
    """BPDA with the identity (Athalye et al. 2018, Sec. 4.1): inside the block, submodule ``module_name`` of
    ``model`` (a ``named_modules`` name, e.g. ``"quantise"``) computes its usual output in the forward pass and
    passes the gradient through unchanged (``x + (f(x) - x).detach()``). Its output must have its input's shape."""
    modules = dict(model.named_modules())
    if module_name not in modules or not module_name:
        close = [name for name in modules if name and module_name.split(".")[-1] in name][:5]
        raise AttackConfigError(f"bpda={module_name!r}: the model has no submodule of that name"
                                + (f" (did you mean {close}?)" if close else "; list them with dict(model.named_modules())"))

    def identity_backward(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
        (inp,) = inputs
        if not isinstance(output, Tensor) or output.shape != inp.shape:
            raise AttackConfigError(f"bpda={module_name!r}: its output {tuple(getattr(output, 'shape', ()))} differs from its input "
                                    f"{tuple(inp.shape)} in shape, so the identity cannot stand in for its gradient")
        return inp + (output - inp).detach()

    handle = modules[module_name].register_forward_hook(identity_backward)
    try:
        yield model
    finally:
        handle.remove()


Attack = Callable[[nn.Module, Tensor, Tensor], Tensor]


class AttackStore(Protocol):
    """Where :func:`worst_case` keeps each attack's per-sample correctness, so an interrupted audit resumes."""

    def load(self, name: str) -> Tensor | None: ...

    def save(self, name: str, correct: Tensor) -> None: ...


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


@_in_eval_mode
def worst_case(model: nn.Module, x: Tensor, y: Tensor, attacks: dict[str, Attack], *, predict: Callable[[Tensor], Tensor] | None = None,
               store: AttackStore | None = None) -> WorstCase:
    """Run every attack on all of ``x`` and record each one's per-sample correctness; the robust accuracy
    of the audit is :attr:`WorstCase.robust` (correct under every attack). ``predict`` (default
    ``model(x).argmax(1)``) classifies the adversarial images, e.g. averaged over a randomised model's passes.
    ``store`` (optional) returns a finished attack's correctness instead of running it again."""
    check_images(x, "images to attack")
    y = check_labels(y, x)  # (N, 1) labels would broadcast to an (N, N) mask: accuracies over N^2 "samples"
    if not attacks:
        raise ValueError("worst_case needs at least one attack")
    classify = predict or (lambda images: model(images).argmax(dim=1))
    with torch.no_grad():
        result = WorstCase(clean=classify(x) == y)
    for name, attack in attacks.items():
        cached = store.load(name) if store is not None else None
        if cached is not None:
            result.correct[name] = cached.to(x.device)
            continue
        x_adv = attack(model, x, y)
        with torch.no_grad():
            result.correct[name] = classify(x_adv) == y
        if store is not None:
            store.save(name, result.correct[name])
        log.info("%s: accuracy %.3f", name, float((result.correct[name] & result.clean).float().mean()))  # as accuracies() counts
    return result


__all__ = ["APGD_LOSSES", "AttackStore", "WorstCase", "apgd", "apgd_schedule", "check_norm", "dlr_loss", "dlr_targeted_loss", "margin", "square", "square_l2",
           "square_l2_patch", "square_linf", "straight_through", "worst_case"]
