"""TRADES, MART and NT-Xent against values computed by hand (plain Python arithmetic) on tiny inputs."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from training.losses import (
    boosted_cross_entropy,
    contrastive_accuracy,
    kl_divergence,
    mart_loss,
    nt_xent,
    trades_inner_loss,
    trades_loss,
)

NATURAL = [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]
ADVERSARIAL = [[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]
LABELS = [0, 2]


def softmax(row):
    exps = [math.exp(v) for v in row]
    return [e / sum(exps) for e in exps]


def hand_kl(p, q):
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q))


def tensors():
    return torch.tensor(NATURAL, dtype=torch.float64), torch.tensor(ADVERSARIAL, dtype=torch.float64), torch.tensor(LABELS)


def test_trades_loss_equals_hand_computed_value():
    beta = 6.0
    ce = [-math.log(softmax(n)[y]) for n, y in zip(NATURAL, LABELS)]
    kl = [hand_kl(softmax(n), softmax(a)) for n, a in zip(NATURAL, ADVERSARIAL)]
    expected = sum(ce) / 2 + beta * sum(kl) / 2
    nat, adv, y = tensors()
    loss, parts = trades_loss(nat, adv, y, beta)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert parts["kl"].item() == pytest.approx(sum(kl) / 2, rel=1e-6)
    # the reference's formulation: KLDivLoss(sum)(log_softmax(adv), softmax(nat)) / batch_size
    reference = nn.KLDivLoss(reduction="sum")(adv.log_softmax(1), nat.softmax(1)) / 2
    assert parts["kl"].item() == pytest.approx(reference.item(), rel=1e-6)


def test_trades_inner_loss_is_the_per_sample_kl():
    nat, adv, _ = tensors()
    inner = trades_inner_loss(adv, nat.float().log_softmax(1))
    expected = [hand_kl(softmax(n), softmax(a)) for n, a in zip(NATURAL, ADVERSARIAL)]
    assert inner.tolist() == pytest.approx(expected, rel=1e-5)
    assert kl_divergence(nat, adv).tolist() == pytest.approx(expected, rel=1e-5)


def test_mart_loss_equals_hand_computed_value():
    beta = 5.0
    total_bce, total_kl = 0.0, 0.0
    for n, a, y in zip(NATURAL, ADVERSARIAL, LABELS):
        p_nat, p_adv = softmax(n), softmax(a)
        max_wrong = max(p for k, p in enumerate(p_adv) if k != y)
        total_bce += -math.log(p_adv[y]) - math.log(1.0001 - max_wrong + 1e-12)
        kl = sum(pn * (math.log(pn) - math.log(pa + 1e-12)) for pn, pa in zip(p_nat, p_adv))
        total_kl += kl * (1.0000001 - p_nat[y])
    expected = total_bce / 2 + beta * total_kl / 2
    nat, adv, y = tensors()
    loss, parts = mart_loss(nat, adv, y, beta)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert parts["bce"].item() == pytest.approx(total_bce / 2, rel=1e-6)


def test_boosted_cross_entropy_uses_the_most_likely_wrong_class():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    p = softmax([0.0, 3.0, 1.0])
    expected = -math.log(p[0]) - math.log(1.0001 - p[1] + 1e-12)
    assert boosted_cross_entropy(logits, torch.tensor([0])).item() == pytest.approx(expected, rel=1e-6)


def test_nt_xent_equals_hand_computed_value():
    z1 = [[1.0, 0.0], [0.0, 1.0]]
    z2 = [[1.0, 1.0], [1.0, -1.0]]
    temperature = 0.5
    views = [[v / math.hypot(*row) for v in row] for row in z1 + z2]
    n = 2
    total = 0.0
    for i in range(2 * n):
        logits = {j: sum(a * b for a, b in zip(views[i], views[j])) / temperature for j in range(2 * n) if j != i}
        positive = (i + n) % (2 * n)
        total += -logits[positive] + math.log(sum(math.exp(v) for v in logits.values()))
    expected = total / (2 * n)
    got = nt_xent(torch.tensor(z1), torch.tensor(z2), temperature)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_nt_xent_is_lower_for_matching_views_and_accuracy_sees_it():
    torch.manual_seed(0)
    z = torch.randn(8, 16)
    assert nt_xent(z, z + 0.01 * torch.randn(8, 16)) < nt_xent(z, torch.randn(8, 16))
    assert contrastive_accuracy(z, z.clone()).item() == 1.0


def test_nt_xent_rejects_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        nt_xent(torch.zeros(4, 8), torch.zeros(3, 8))
    for temperature in (0.0, math.nan, math.inf):  # NaN gave a NaN loss, inf a constant one (nothing learnt)
        with pytest.raises(ValueError, match="temperature must be a positive finite number"):
            nt_xent(torch.ones(2, 3), torch.ones(2, 3), temperature=temperature)
    with pytest.raises(ValueError, match="at least 2 images"):  # no negatives: the loss is 0
        nt_xent(torch.ones(1, 3), torch.ones(1, 3))
