"""Robust accuracy of PGD training vs standard training, restarts, and the gradient-masking report."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from training.attacks import AttackConfigError, ThreatModel
from training.data import load_dataset
from training.evaluate import clean_accuracy, correct_counts, gradient_masking_report, robust_accuracy
from training.trainer import train

from .conftest import compose_train

# The same short schedule for both: the tiny width-16 small CNN on all 1,347 digits, 2 epochs, batch 64, cosine
# from 0.05, no augmentation.
SCHEDULE = ["data_limit.train=null", "data_limit.test=200", "train.epochs=2", "train.batch_size=64", "train.optimizer.lr=0.05",
            "train.schedule.name=cosine", "train.augment.enabled=false", "train.eval.every=0", "train.eval.final_subset=200",
            "train.eval.attack.norm=l2", "train.eval.attack.eps=1.0", "train.eval.attack.steps=10"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A standard and a PGD-trained (L2, eps 1, 3 steps) small CNN on digits, after the same schedule."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: the autouse single_thread fixture has not run yet
    try:
        out = {}
        for recipe, extra in (("standard", []), ("pgd", ["train.attack.eps=1.0", "train.attack.steps=3"])):
            cfg = compose_train(f"train={recipe}", f"run_dir={tmp_path_factory.mktemp(recipe)}", *SCHEDULE, *extra)
            out[recipe] = train(cfg)
        return out
    finally:
        torch.set_num_threads(previous)


def test_pgd_training_gives_higher_robust_accuracy_than_standard_training(trained):
    """Seeds 0-3 (torch 2.15, CPU): robust accuracy PGD 0.285-0.49 vs standard 0.0-0.075 (a gap of 0.265-0.445);
    standard clean accuracy 0.545-0.725 after these 2 epochs (chance 0.1)."""
    standard, robust = trained["standard"].summary, trained["pgd"].summary
    assert standard["robust_images"] == robust["robust_images"] == 200
    assert robust["robust_accuracy"] > standard["robust_accuracy"] + 0.15, (standard["robust_accuracy"], robust["robust_accuracy"])
    assert standard["clean_accuracy"] > 0.3  # the standard model did learn


def test_more_restarts_never_raise_robust_accuracy_and_robust_never_exceeds_clean(trained):
    model = trained["pgd"].model
    test = load_dataset("digits", "test").subset(torch.arange(64))
    threat = ThreatModel("l2", 1.0, steps=5)
    one = robust_accuracy(model, test, threat, restarts=1, seed=3)
    three = robust_accuracy(model, test, threat, restarts=3, seed=3)
    assert three <= one <= clean_accuracy(model, test)
    assert robust_accuracy(model, test, threat, restarts=1, seed=3) == one  # seeded: reproducible


def test_float_pairs_are_checked_and_counted():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    images, labels = torch.rand(5, 3, 4, 4), torch.zeros(5, dtype=torch.long)
    counts = correct_counts(model, (images, labels), batch_size=2)
    assert int(counts["n"]) == 5 and 0 <= int(counts["clean"]) <= 5
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        correct_counts(model, (images * 255, labels))
    with pytest.raises(ValueError, match="one label per image"):
        correct_counts(model, (images, labels[:3]))
    for limit in (0, -2, 2.5, True):  # 0 evaluated nothing and reported 0 % accuracy; -2 dropped the last two images
        with pytest.raises(ValueError, match="limit must be a positive number of images"):
            correct_counts(model, (images, labels), limit=limit)
    with pytest.raises(ValueError, match="no images to evaluate"):
        correct_counts(model, (images[:0], labels[:0]))


def test_labels_are_checked_against_the_models_outputs_before_any_attack():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    images = torch.rand(6, 3, 4, 4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    threat = ThreatModel("l2", 0.5, steps=2)
    expected = robust_accuracy(model, (images, labels), threat)
    for dtype in (torch.int32, torch.int16, torch.uint8):  # int32 (numpy's default on Windows) crashed in cross-entropy
        assert robust_accuracy(model, (images, labels.to(dtype)), threat) == expected
    with pytest.raises(ValueError, match="label 3 has no output.*1-based"):  # was: a silently wrong clean accuracy
        clean_accuracy(model, (images, labels + 1))
    with pytest.raises(ValueError, match="label 3 has no output"):  # was: IndexError after the clean pass
        robust_accuracy(model, (images, labels + 1), threat)
    with pytest.raises(ValueError, match="found -1"):
        clean_accuracy(model, (images, labels - 1))
    with pytest.raises(ValueError, match="integer class indices"):
        clean_accuracy(model, (images, labels.float()))
    # an ImageSet's labels too: -1 was counted wrong by clean accuracy and an IndexError after the clean pass by PGD
    from training.data import ImageSet

    image_set = ImageSet("toy", "test", (images * 255).to(torch.uint8), labels - 1, ["a", "b", "c"])
    for evaluate in (clean_accuracy, lambda m, d: robust_accuracy(m, d, threat)):
        with pytest.raises(ValueError, match="found -1"):
            evaluate(model, image_set)
    with pytest.raises(ValueError, match="robust_accuracy needs a ThreatModel"):  # was: KeyError 'robust' after the clean pass
        robust_accuracy(model, (images, labels), None)


def test_a_float64_model_is_evaluated_in_its_own_dtype():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    images, labels = torch.rand(6, 3, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    threat = ThreatModel("l2", 0.5, steps=2)
    single = (clean_accuracy(model, (images, labels)), robust_accuracy(model, (images, labels), threat))
    model.double()  # crashed: the images were always cast to float32
    assert (clean_accuracy(model, (images, labels)), robust_accuracy(model, (images, labels), threat)) == single


def test_evaluation_gives_each_submodule_its_own_mode_back():
    """A model trained with frozen batch norm keeps it frozen after an evaluation: restoring only the top-level
    flag with ``model.train(was)`` had unfrozen it."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    model.train()
    model[1].eval()
    images, labels = torch.rand(6, 3, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    clean_accuracy(model, (images, labels))
    robust_accuracy(model, (images, labels), ThreatModel("l2", 0.5, steps=1))
    assert model.training and not model[1].training


def test_masking_report_settings_are_checked_before_the_sweeps(monkeypatch):
    import training.evaluate as evaluate

    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    data = (torch.rand(6, 3, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2]))
    passes = []
    real = evaluate._loss_and_accuracy
    monkeypatch.setattr(evaluate, "_loss_and_accuracy", lambda *a, **k: passes.append(1) or real(*a, **k))
    with pytest.raises(AttackConfigError, match="steps must be a positive integer"):
        gradient_masking_report(model, data, "linf", unbounded_steps=0)
    with pytest.raises(AttackConfigError, match="exceeds the image range"):  # 8 meant 8/255
        gradient_masking_report(model, data, "linf", eps=[2 / 255, 8])
    assert passes == []  # both were refused only after the clean pass and the sweeps before them
    report = gradient_masking_report(model, data, "linf", eps="8/255", steps=1, unbounded_steps=1)  # a scalar, config-style
    assert report.eps == [pytest.approx(8 / 255)]


def test_masking_report_passes_for_an_ordinary_model(trained):
    test = load_dataset("digits", "test")
    report = gradient_masking_report(trained["standard"].model, test, "l2", eps=[0.5, 1.0], steps=5, unbounded_steps=20, limit=64)
    assert report.checks["loss_rises_with_eps"] and report.checks["accuracy_falls_with_eps"], str(report)
    assert report.unbounded_accuracy <= 0.05 and report.passed, str(report)
    assert report.loss[-1] > report.clean_loss


class _Quantised(nn.Module):
    """A classic masked-gradient 'defence': inputs rounded to 4 levels, so the gradient is zero."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(torch.round(x * 3) / 3)


def test_masking_report_flags_a_model_with_masked_gradients(trained):
    test = load_dataset("digits", "test")
    masked = _Quantised(trained["standard"].model)
    report = gradient_masking_report(masked, test, "linf", eps=[2 / 255, 8 / 255], steps=5, unbounded_steps=10, limit=64)
    assert not report.checks["unbounded_attack_succeeds"] and not report.passed
    assert "masked" in " ".join(report.notes) and "SUSPICIOUS" in str(report)


@pytest.mark.parametrize("norm, eps", [("linf", 8 / 255), ("l2", 0.5)])
def test_a_half_precision_model_is_attacked_in_float32_inside_the_ball_around_the_real_images(monkeypatch, norm, eps):
    """The images were cast to the model's bfloat16 before PGD: rounded to 1/256 near 1, and the attacked images lay
    up to 6 % of an 8/255 ball outside the ball around the images given."""
    import training.evaluate as evaluate

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5)).to(torch.bfloat16)
    images, labels = torch.rand(64, 3, 8, 8) * 0.5 + 0.5, torch.randint(0, 5, (64,))
    attacked, pgd = [], evaluate.pgd
    monkeypatch.setattr(evaluate, "pgd", lambda *args, **kwargs: attacked.append(pgd(*args, **kwargs)) or attacked[-1])
    accuracy = robust_accuracy(model, (images, labels), ThreatModel(norm, eps, steps=5))
    (x_adv,) = attacked
    assert x_adv.dtype == torch.float32 and 0.0 <= accuracy <= 1.0
    delta = (x_adv.double() - images.double()).flatten(1)
    size = delta.abs().amax(1) if norm == "linf" else delta.norm(dim=1)
    assert float(size.max()) <= eps * (1 + 1e-6)
    assert clean_accuracy(model, (images, labels)) == float((model(images.bfloat16()).argmax(1) == labels).float().mean())
