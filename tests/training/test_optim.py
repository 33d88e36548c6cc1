"""Learning-rate schedules, LARS against a hand-computed step, and config errors."""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from training.optim import LARS, ConfigError, build_optimizer, build_scheduler, lr_factor

from .conftest import compose_train


def factors(schedule, **kwargs):
    return [lr_factor(step, schedule=schedule, epochs=10, steps_per_epoch=10, **kwargs) for step in range(100)]


def test_step_schedule_drops_at_milestone_epochs():
    f = factors("step", milestones=(5, 8), gamma=0.1)
    assert f[49] == 1.0 and f[50] == pytest.approx(0.1) and f[80] == pytest.approx(0.01)


@pytest.mark.parametrize("recipe", ["trades", "mart"])
def test_trades_and_mart_drop_the_rate_in_the_references_epochs(recipe):
    """Both references set the rate before each 1-based epoch: x0.1 from 75, x0.01 from 90, x0.001 from 100."""
    cfg = compose_train(f"train={recipe}", tiny=False).train
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, cfg.schedule, epochs=cfg.epochs, steps_per_epoch=1)
    for epoch in range(1, cfg.epochs + 1):  # the references' loop and adjust_learning_rate
        reference = 0.001 if epoch >= 100 else 0.01 if epoch >= 90 else 0.1 if epoch >= 75 else 1.0
        assert optimizer.param_groups[0]["lr"] == pytest.approx(reference), f"1-based epoch {epoch}"
        optimizer.step()
        scheduler.step()


def test_cosine_after_warmup_decays_over_the_remaining_steps():
    """SimCLR's reference: linear warm-up to the base rate, then a cosine over total − warm-up steps."""
    f = factors("cosine", warmup_epochs=2)  # 20 warm-up steps of 100
    assert f[0] == pytest.approx(1 / 20) and f[19] == 1.0 and f[20] == 1.0
    assert f[60] == pytest.approx(0.5) and f[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 79 / 80)))
    assert factors("cosine", warmup_epochs=10)[99] == 1.0  # all warm-up: no decay left


def test_cosine_and_cyclic_shapes():
    cosine = factors("cosine")
    assert cosine[0] == 1.0 and cosine[50] == pytest.approx(0.5) and cosine[99] < 0.001
    cyclic = factors("cyclic", cyclic_peak=0.4)
    assert cyclic[0] == 0.0 and cyclic[40] == pytest.approx(1.0) and cyclic[20] == pytest.approx(0.5)
    assert cyclic[70] == pytest.approx(0.5)


def test_warmup_ramps_linearly():
    f = factors("constant", warmup_epochs=2)
    assert f[0] == pytest.approx(1 / 20) and f[9] == pytest.approx(10 / 20) and f[19] == 1.0 and f[30] == 1.0
    # 2.5 warm-up steps: the third step's (2 + 1) / 2.5 went 20% above the base rate
    fractional = [lr_factor(step, schedule="constant", epochs=2, steps_per_epoch=5, warmup_epochs=0.5) for step in range(5)]
    assert fractional == pytest.approx([0.4, 0.8, 1.0, 1.0, 1.0])


def test_lars_step_matches_hand_computation():
    weight = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||w|| = 5
    bias = torch.nn.Parameter(torch.tensor([1.0]))
    weight.grad = torch.tensor([[0.6, 0.8]])
    bias.grad = torch.tensor([0.5])
    lr, wd, eta = 0.1, 0.01, 0.001
    optimizer = LARS([{"params": [weight]}, {"params": [bias], "adapt": False, "weight_decay": 0.0}], lr=lr, momentum=0.9,
                     weight_decay=wd, eta=eta)
    optimizer.step()
    g = [0.6 + wd * 3.0, 0.8 + wd * 4.0]
    trust = eta * 5.0 / math.hypot(*g)
    expected = [3.0 - lr * trust * g[0], 4.0 - lr * trust * g[1]]
    assert weight.detach().flatten().tolist() == pytest.approx(expected, rel=1e-6)
    assert bias.item() == pytest.approx(1.0 - lr * 0.5)  # no decay, no trust ratio


def test_lars_excludes_biases_and_norm_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = build_optimizer(model.named_parameters(), OmegaConf.create({"name": "lars", "lr": 1.0, "weight_decay": 1e-6}))
    adapted, excluded = optimizer.param_groups
    assert [p.ndim for p in adapted["params"]] == [2]
    assert excluded["adapt"] is False and excluded["weight_decay"] == 0.0 and len(excluded["params"]) == 3


def test_unknown_names_and_bad_values_are_refused():
    params = list(torch.nn.Linear(2, 2).named_parameters())
    with pytest.raises(ConfigError, match="unknown optimizer 'adamw'"):
        build_optimizer(params, {"name": "adamw", "lr": 0.1})
    with pytest.raises(ConfigError, match="lr > 0"):
        build_optimizer(params, {"name": "sgd", "lr": -1})
    optimizer = build_optimizer(params, {"name": "sgd", "lr": 0.1})
    with pytest.raises(ConfigError, match="unknown schedule 'linear'"):
        build_scheduler(optimizer, {"name": "linear"}, epochs=2, steps_per_epoch=3)
    with pytest.raises(ConfigError, match="warmup_epochs"):
        build_scheduler(optimizer, {"name": "cosine", "warmup_epochs": 5}, epochs=2, steps_per_epoch=3)
