"""Training losses: TRADES, MART and SimCLR's NT-Xent, written from the papers and checked against the
reference code (tests compare them with hand-computed values on tiny inputs).

All losses are computed in float32 whatever the autocast dtype of the logits.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# MART's reference code (YisenWang/MART, mart.py) keeps logs finite with these constants; kept so that
# results are comparable with the paper's.
MART_BOOST_MARGIN = 1.0001
MART_LOG_EPS = 1e-12
MART_WEIGHT_MARGIN = 1.0000001


def kl_divergence(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """Per-sample KL(p || q) with p = softmax(logits_p), q = softmax(logits_q); shape (N,)."""
    log_p = F.log_softmax(logits_p.float(), dim=1)
    log_q = F.log_softmax(logits_q.float(), dim=1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=1)


def trades_loss(
    logits_natural: Tensor, logits_adversarial: Tensor, labels: Tensor, beta: float, label_smoothing: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """TRADES (Zhang et al., ICML 2019; yaodongyu/TRADES ``trades_loss``):
    ``CE(f(x), y) + beta * mean_i KL(p(x_i) || p(x_adv_i))``.

    The reference's ``KLDivLoss(size_average=False) / batch_size`` is the batch mean of the
    per-sample KL. Gradients flow through both distributions, as in the reference.
    Returns (loss, {"ce": ..., "kl": ...}).
    """
    ce = F.cross_entropy(logits_natural.float(), labels, label_smoothing=label_smoothing)
    kl = kl_divergence(logits_natural, logits_adversarial).mean()
    return ce + beta * kl, {"ce": ce.detach(), "kl": kl.detach()}


def trades_inner_loss(logits_adversarial: Tensor, log_probs_natural: Tensor) -> Tensor:
    """TRADES' inner objective: per-sample KL(p(x) || p(x_adv)) with p(x) fixed (its log given)."""
    log_q = F.log_softmax(logits_adversarial.float(), dim=1)
    return (log_probs_natural.exp() * (log_probs_natural - log_q)).sum(dim=1)


def boosted_cross_entropy(logits_adversarial: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """MART's boosted CE, per sample: ``CE(f(x_adv), y) - log(1.0001 - max_{k != y} p_k(x_adv) + 1e-12)``."""
    logits = logits_adversarial.float()
    ce = F.cross_entropy(logits, labels, reduction="none", label_smoothing=label_smoothing)
    probs = logits.softmax(dim=1)
    # The label's probability scattered to -inf, not masked by F.one_hot: off CUDA one_hot reads the labels' range on the
    # host, which the tests' capture proxy refuses.
    max_wrong = probs.scatter(1, labels[:, None], float("-inf")).amax(dim=1)
    return ce - torch.log(MART_BOOST_MARGIN - max_wrong + MART_LOG_EPS)


def mart_loss(
    logits_natural: Tensor, logits_adversarial: Tensor, labels: Tensor, beta: float, label_smoothing: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """MART (Wang et al., ICLR 2020; YisenWang/MART ``mart_loss``):
    ``mean_i [BCE(x_adv_i, y_i) + beta * KL(p(x_i) || p(x_adv_i)) * (1 - p_y(x_i))]``.

    As in the reference, the adversarial log-probabilities inside the KL are ``log(p + 1e-12)``
    and the weight is ``1.0000001 - p_y(x)``. Returns (loss, {"bce": ..., "kl": ...}).
    """
    nat = logits_natural.float()
    adv_probs = logits_adversarial.float().softmax(dim=1)
    bce = boosted_cross_entropy(logits_adversarial, labels, label_smoothing).mean()
    log_p = F.log_softmax(nat, dim=1)
    kl = (log_p.exp() * (log_p - torch.log(adv_probs + MART_LOG_EPS))).sum(dim=1)
    weight = MART_WEIGHT_MARGIN - log_p.exp().gather(1, labels[:, None]).squeeze(1)
    weighted_kl = (kl * weight).mean()
    return bce + beta * weighted_kl, {"bce": bce.detach(), "kl": weighted_kl.detach()}


def check_temperature(temperature: float) -> None:
    """NT-Xent's temperature must be positive and finite: NaN gives a NaN loss, inf a constant one; nothing is learnt."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = 0.5) -> Tensor:
    """SimCLR's NT-Xent (Chen et al., ICML 2020, eq. 1), averaged over all 2N anchors.

    ``z1[i]`` and ``z2[i]`` are the projections of two views of image i. Each of the 2N normalised
    projections is classified among the other 2N - 1 by cosine similarity / temperature, its
    positive being the other view of the same image.
    """
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"nt_xent needs two (N, D) projections of the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    check_temperature(temperature)
    if z1.shape[0] < 2:
        raise ValueError("nt_xent needs at least 2 images: with one, there are no negatives and the loss is 0")
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    n = z1.shape[0]
    similarity = (z @ z.T) / temperature
    self_pairs = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    similarity = similarity.masked_fill(self_pairs, float("-inf"))
    positives = _positive_index(n, z.device)
    return F.cross_entropy(similarity, positives)


def _positive_index(n: int, device) -> Tensor:
    """Row i of the 2N views has its positive at i + N (first half) or i - N (second half)."""
    return torch.arange(2 * n, device=device).add_(n).remainder_(2 * n)


def contrastive_accuracy(z1: Tensor, z2: Tensor) -> Tensor:
    """Fraction of the 2N views whose most similar other view is their positive (a training monitor)."""
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    n = z1.shape[0]
    similarity = (z @ z.T).fill_diagonal_(float("-inf"))
    positives = _positive_index(n, z.device)
    return (similarity.argmax(dim=1) == positives).float().mean()


__all__ = [
    "boosted_cross_entropy",
    "check_temperature",
    "contrastive_accuracy",
    "kl_divergence",
    "mart_loss",
    "nt_xent",
    "trades_inner_loss",
    "trades_loss",
]
