"""PGD, FGSM and the generic maximiser: norm balls, the image box, reuse of invert's steppers, errors."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import invert.steps
from training.attacks import AttackConfigError, ThreatModel, attack_mode, bn_mode, fgsm, fgsm_threat, maximize, pgd
from training.models import build_model


@pytest.fixture(scope="module")
def model_and_batch():
    torch.manual_seed(0)
    model = build_model("small_cnn", "digits", width=8).eval()
    x = torch.rand(6, 3, 16, 16)
    y = torch.randint(0, 10, (6,))
    return model, x, y


def per_sample(delta: torch.Tensor, p: float) -> torch.Tensor:
    return torch.linalg.vector_norm(delta.flatten(1), ord=p, dim=1)


@pytest.mark.parametrize("norm,eps", [("l2", 0.5), ("linf", 8 / 255)])
def test_pgd_stays_in_the_ball_and_the_box_and_raises_the_loss(model_and_batch, norm, eps):
    model, x, y = model_and_batch
    threat = ThreatModel(norm, eps, steps=5)
    x_adv = pgd(model, x, y, threat, generator=torch.Generator().manual_seed(0))
    p = 2 if norm == "l2" else math.inf
    assert (per_sample(x_adv - x, p) <= eps * (1 + 1e-5)).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    with torch.no_grad():
        assert F.cross_entropy(model(x_adv), y) > F.cross_entropy(model(x), y)


@pytest.mark.parametrize("norm,eps", [("l2", 0.5), ("linf", 8 / 255)])
def test_fgsm_stays_in_the_ball_with_alpha_above_eps(model_and_batch, norm, eps):
    model, x, y = model_and_batch
    assert fgsm_threat(norm, eps).alpha == pytest.approx(1.25 * eps)
    x_adv = fgsm(model, x, y, eps, norm=norm, generator=torch.Generator().manual_seed(1))
    p = 2 if norm == "l2" else math.inf
    assert (per_sample(x_adv - x, p) <= eps * (1 + 1e-5)).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1


def test_fgsm_without_random_start_is_the_signed_gradient_step(model_and_batch):
    model, _, y = model_and_batch
    x = torch.full((6, 3, 16, 16), 0.5)  # far from the box edges: no clamping
    eps = 4 / 255
    x_adv = fgsm(model, x, y, eps, norm="linf", random_start=False)
    x_req = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(model(x_req), y, reduction="sum"), x_req)
    # alpha = 1.25 eps > eps, so every coordinate with a gradient lands on the ball's face
    assert torch.allclose(x_adv - x, eps * grad.sign(), atol=1e-6)


def test_attacks_reuse_invert_steppers():
    assert isinstance(ThreatModel("l2", 1.0).stepper(), invert.steps.L2Step)
    assert isinstance(ThreatModel("linf", 0.1).stepper(), invert.steps.LinfStep)


def test_default_step_size_is_madrys_rule():
    assert ThreatModel("l2", 1.0, steps=10).alpha == pytest.approx(0.25)
    assert ThreatModel("l2", 1.0, steps=10, step_size=0.3).alpha == pytest.approx(0.3)


def test_maximize_honours_an_explicit_start_and_projects_it():
    x = torch.full((2, 3, 4, 4), 0.5)
    far = x + 1.0  # outside both the ball and the box
    out = maximize(lambda z: z.sum(dim=(1, 2, 3)), x, ThreatModel("linf", 0.1, steps=1, step_size=0.05), start=far)
    assert torch.allclose(out, torch.full_like(x, 0.6))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"norm": "l3", "eps": 1.0}, "unknown norm 'l3'"),
        ({"norm": "l2", "eps": -1.0}, "positive finite"),
        ({"norm": "l2", "eps": float("nan")}, "positive finite"),
        ({"norm": "l2", "eps": float("inf")}, "positive finite"),
        ({"norm": "linf", "eps": 8.0}, "8.0/255"),
        ({"norm": "l2", "eps": 1.0, "steps": 0}, "steps must be a positive integer"),
        ({"norm": "l2", "eps": 1.0, "step_size": 0.0}, "step_size"),
    ],
)
def test_threat_model_rejects_bad_settings(kwargs, message):
    with pytest.raises(AttackConfigError, match=message):
        ThreatModel(**kwargs)


def test_bn_mode_eval_and_train_leave_running_statistics_untouched():
    model = build_model("small_cnn", "digits", width=8).train()
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    before = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())
    x = torch.rand(4, 3, 16, 16)
    with bn_mode(model, "train"):
        assert model.training
        model(x)
    with bn_mode(model, "eval"):
        assert not model.training
        model(x)
    assert model.training and bn.track_running_stats
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])
    assert torch.equal(bn.num_batches_tracked, before[2])
    # train-mode attacks do use batch statistics: the output differs from eval mode
    with torch.no_grad(), bn_mode(model, "train"):
        batch_stats = model(x)
    with torch.no_grad(), bn_mode(model, "eval"):
        running_stats = model(x)
    assert not torch.allclose(batch_stats, running_stats)
    with pytest.raises(AttackConfigError, match="batch-norm mode"):
        with bn_mode(model, "frozen"):
            pass


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_attack_modes_give_each_submodule_its_own_flag_back(mode):
    """A model trained with frozen batch norm (``model.train(); bn.eval()``) keeps it frozen: ``model.train(was)``
    alone had set every submodule to the top-level mode, and the next training forward updated its statistics."""
    model = build_model("small_cnn", "digits", width=8).train()
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn.eval()
    x = torch.rand(4, 3, 16, 16)
    with attack_mode(model, mode) as target:
        pgd(target, x, torch.zeros(4, dtype=torch.long), ThreatModel("l2", 0.5, steps=1))
    assert model.training and not bn.training
    before = bn.running_mean.clone()
    model(x)
    assert torch.equal(bn.running_mean, before)


def test_labels_of_any_integer_type_and_a_missing_batch_dimension(model_and_batch):
    model, x, y = model_and_batch
    threat = ThreatModel("linf", 8 / 255, steps=2)
    reference = pgd(model, x, y, threat, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.int32, torch.int16, torch.uint8):  # cross-entropy takes only int64: these crashed inside torch
        again = pgd(model, x, y.to(dtype), threat, generator=torch.Generator().manual_seed(0))
        assert torch.equal(again, reference)
    with pytest.raises(ValueError, match="batch dimension"):  # was: "labels must be ... of shape (3,)"
        pgd(model, x[0], y[:1], threat)


def test_config_numbers_may_be_fractions_and_images_are_checked(model_and_batch):
    threat = ThreatModel.from_config({"norm": "linf", "eps": "8/255", "steps": 3, "step_size": "2/255"})
    assert threat.eps == pytest.approx(8 / 255) and threat.alpha == pytest.approx(2 / 255)
    with pytest.raises(AttackConfigError, match="fraction like 8/255"):
        ThreatModel.from_config({"norm": "linf", "eps": "eight"})
    for text in ("no", "false", "off"):  # Hydra reads random_start=no as a text, which bool() turned into True
        with pytest.raises(AttackConfigError, match=f"random_start must be true or false, got '{text}'"):
            ThreatModel.from_config({"norm": "linf", "eps": 0.03, "random_start": text})
    assert ThreatModel.from_config({"norm": "linf", "eps": 0.03, "random_start": 0}).random_start is False
    model, x, y = model_and_batch
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pgd(model, x * 255, y, ThreatModel("l2", 1.0, steps=1))
