"""Every recipe trains on digits and its loss falls; recipes work with the k-WTA ResNet18; bad names are refused."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from training.data import load_dataset
from training.models import build_model
from training.optim import ConfigError
from training.recipes import build_recipe
from training.trainer import train

from .conftest import compose_train

# Short attacks, a learning rate that moves in 16 steps, the guard off (tested on its own).
RECIPE_OVERRIDES = {
    "standard": [],
    "pgd": ["train.attack.steps=2"],
    "trades": ["train.attack.steps=2"],
    "mart": ["train.attack.steps=2", "train.optimizer.lr=0.05"],
    "fast_at": ["train.guard.enabled=false"],
    "simclr": ["train.schedule.warmup_epochs=1", "train.probe.epochs=5"],
    "adv_simclr": ["train.schedule.warmup_epochs=1", "train.probe.epochs=5", "train.attack.steps=2"],
}


@pytest.mark.parametrize("recipe", list(RECIPE_OVERRIDES))
def test_recipe_trains_and_its_loss_falls(make_config, recipe):
    cfg = make_config(f"train={recipe}", "train.epochs=4", "train.eval.every=0", "train.eval.final_subset=0",
                      *RECIPE_OVERRIDES[recipe])
    result = train(cfg)
    losses = [epoch["train_loss"] for epoch in result.summary["history"]]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], f"{recipe}: loss did not fall: {losses}"
    assert result.summary["recipe"]["recipe"] == recipe
    assert 0.0 <= result.summary["clean_accuracy"] <= 1.0


@pytest.mark.parametrize("recipe", ["pgd", "adv_simclr"])
def test_recipes_run_on_the_kwta_resnet18(recipe):
    torch.manual_seed(0)
    cfg = compose_train(f"train={recipe}", "train.attack.steps=1")
    data = load_dataset("digits", "train").subset(torch.arange(4))
    model = build_model("kwta_resnet18", "digits", ratio=0.1)
    built = build_recipe(cfg.train, model, data).train()
    loss, stats = built(built.prepare(data.images), data.labels)
    loss.backward()
    assert torch.isfinite(loss) and 0 <= stats["acc"] <= 1
    assert model.net.conv1.weight.grad is not None and torch.isfinite(model.net.conv1.weight.grad).all()


def test_unknown_recipe_and_bad_attack_settings_are_refused():
    data = load_dataset("digits", "train").subset(torch.arange(8))
    model = build_model("small_cnn", "digits")
    cfg = compose_train("train=pgd")
    cfg.train.name = "free_at"
    with pytest.raises(ConfigError, match="unknown training recipe 'free_at'"):
        build_recipe(cfg.train, model, data)
    with pytest.raises(ValueError, match="unknown norm 'l1'"):
        build_recipe(compose_train("train=pgd", "train.attack.norm=l1").train, model, data)
    with pytest.raises(ValueError, match="positive finite"):
        build_recipe(compose_train("train=trades", "train.attack.eps=-0.1").train, model, data)
    with pytest.raises(ValueError, match="8/255"):
        build_recipe(compose_train("train=fast_at", "train.attack.eps=8").train, model, data)
    with pytest.raises(ValueError, match="batch-norm mode"):
        build_recipe(compose_train("train=pgd", "train.attack_bn=frozen").train, model, data)


@pytest.mark.parametrize("recipe", ["trades", "mart"])
def test_trades_and_mart_take_the_reference_step_for_each_norm(recipe):
    """The Linf step 0.007 stayed under attack.norm=l2: 10 steps moved at most 0.07 inside a ball of 0.5, near-clean
    training called TRADES. The TRADES reference's L2 branch steps 2 * eps / steps."""
    model = build_model("small_cnn", "digits", width=8)
    data = load_dataset("digits", "train")
    linf = compose_train(f"train={recipe}")
    assert linf.train.attack.step_size == 0.007 and build_recipe(linf.train, model, data).threat.alpha == 0.007
    l2 = compose_train(f"train={recipe}", "train.attack.norm=l2", "train.attack.eps=0.5")
    assert l2.train.attack.step_size == pytest.approx(0.1) and build_recipe(l2.train, model, data).threat.alpha == pytest.approx(0.1)
    assert compose_train(f"train={recipe}", "train.attack.norm=l2", "train.attack.eps=8/255", "train.attack.steps=4").train.attack.step_size == \
        pytest.approx(2 * 8 / 255 / 4)
    assert compose_train(f"train={recipe}", "train.attack.norm=l2", "train.attack.step_size=0.05").train.attack.step_size == 0.05
    for bad, message in (("train.attack.steps=0", "steps must be a positive integer"), ("train.attack.norm=l3", "unknown norm 'l3'")):
        with pytest.raises(Exception, match=message):  # named while the config resolves, not a division by zero
            OmegaConf.to_container(compose_train(f"train={recipe}", "train.attack.norm=l2", bad), resolve=True)
