"""Batch norm folded into convolutions for eval-mode attacks: same function, live weights, fallbacks."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training.attacks import ThreatModel, attack_mode, pgd
from training.folding import FoldedClassifier, FoldedConvBatchNorm, eval_view, fold_batch_norms
from training.models import CIFAR_ARCHITECTURES, build_model


def with_running_stats(model: nn.Module, image_size: int = 32, batches: int = 3) -> nn.Module:
    """Non-trivial running statistics and affine parameters, then eval mode."""
    model.train()
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
        for _ in range(batches):
            model(torch.rand(8, 3, image_size, image_size))
    return model.eval()


def input_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), x)
    return grad


def test_folded_pair_equals_conv_then_eval_batch_norm_by_the_formula():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(3, 5, 3, padding=1, bias=True), nn.BatchNorm2d(5)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.1, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    bn.eval()
    folded = FoldedConvBatchNorm(conv, bn)
    weight, bias = folded.folded()
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # Jacob et al. 2018, eq. (folding)
    torch.testing.assert_close(weight, conv.weight * scale.view(-1, 1, 1, 1))
    torch.testing.assert_close(bias, (conv.bias - bn.running_mean) * scale + bn.bias)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(folded(x), bn(conv(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CIFAR_ARCHITECTURES))
def test_every_zoo_architecture_folds_to_the_same_function(name):
    torch.manual_seed(0)
    model = with_running_stats(build_model(name, "cifar10"))
    view = eval_view(model)
    assert isinstance(view, FoldedClassifier) and view.folded_pairs > 0
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(view(x), model(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["resnet18", "vgg16", "small_cnn"])
def test_input_gradients_match_the_unfolded_model(name):
    # In float64: in float32 a ReLU whose input is within rounding of zero may switch sides, which
    # changes a gradient discretely (as it would between two GPUs); float64 isolates the algebra.
    torch.manual_seed(1)
    model = with_running_stats(build_model(name, "cifar10")).double()
    x, y = torch.rand(4, 3, 32, 32, dtype=torch.float64), torch.arange(4)
    expected, got = input_gradient(model, x, y), input_gradient(eval_view(model), x, y)
    assert ((got - expected).norm() / expected.norm()) < 1e-10


def test_the_view_follows_parameter_and_statistic_updates():
    torch.manual_seed(0)
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    view = eval_view(model)
    assert eval_view(model) is view  # cached per model
    x = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        before = view(x)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # an optimizer step: in place, same tensors
        model.train()
        model(torch.rand(8, 3, 16, 16))  # running statistics move
        model.eval()
        after, expected = view(x), model(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-4)


def test_no_gradient_reaches_the_folded_parameters_through_the_view():
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    x = torch.rand(2, 3, 16, 16, requires_grad=True)
    view = eval_view(model)
    view(x).sum().backward()
    assert x.grad is not None
    folded = [m for m in view.modules() if isinstance(m, FoldedConvBatchNorm)]
    assert folded and all(p.grad is None for m in folded for p in m.parameters())


def test_train_mode_is_refused():
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    view = eval_view(model)
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        view(torch.rand(2, 3, 16, 16))


def test_untraceable_or_norm_free_modules_are_left_alone():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            if x.sum() > 0:  # Python control flow on values: FX cannot trace it
                x = -x
            return self.bn(self.conv(x))

    module = DataDependent()
    assert fold_batch_norms(module) == (module, 0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    assert fold_batch_norms(plain) == (plain, 0)
    assert fold_batch_norms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))[1] == 1


def test_a_conv_whose_output_is_also_used_elsewhere_is_not_folded():
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    module = Branches().eval()
    assert fold_batch_norms(module)[1] == 0


def test_models_without_batch_norm_are_attacked_directly():
    model = build_model("small_cnn", "digits", width=8)
    for m in list(model.net.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(m, name, nn.Identity())
    assert eval_view(model) is model


def test_a_classifier_with_its_own_forward_is_attacked_as_it_is():
    """InputQuantised rounds its input before the network: a folded net(normalize(x)) would attack another function."""
    from training.models.defences import input_quantised

    defence = input_quantised("small_cnn", "digits", levels=4, width=8).eval()
    assert eval_view(defence) is defence
    plain = build_model("small_cnn", "digits", width=8).eval()
    assert isinstance(eval_view(plain), FoldedClassifier)


def test_attack_mode_folds_only_in_eval_mode_and_restores_the_training_flag():
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16).train()
    with attack_mode(model, "eval") as target:
        assert isinstance(target, FoldedClassifier) and not model.training
    assert model.training
    with attack_mode(model, "eval", fold_bn=False) as target:
        assert target is model
    with attack_mode(model, "train") as target:
        assert target is model


def test_pgd_on_the_folded_view_gives_the_same_examples():
    torch.manual_seed(0)
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    x, y = torch.rand(6, 3, 16, 16), torch.randint(0, 10, (6,))
    threat = ThreatModel("l2", 0.5, steps=5)
    plain = pgd(model, x, y, threat, generator=torch.Generator().manual_seed(0))
    with attack_mode(model, "eval") as target:
        folded = pgd(target, x, y, threat, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(folded, plain, atol=1e-5, rtol=0)


def test_the_view_keeps_channels_last_kernels():
    model = with_running_stats(build_model("resnet18", "cifar10")).to(memory_format=torch.channels_last)
    view = eval_view(model)
    folded = next(m for m in view.modules() if isinstance(m, FoldedConvBatchNorm))
    weight, _ = folded.folded()
    assert weight.is_contiguous(memory_format=torch.channels_last)


def test_the_view_does_not_keep_its_model_alive():
    import gc
    import weakref

    model = build_model("small_cnn", "digits", width=8).eval()
    eval_view(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_a_deep_copy_gets_its_own_view():
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(0.5)
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(eval_view(clone)(x), clone(x), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(eval_view(model)(x), model(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("recipe_name", ["pgd", "trades", "mart"])
def test_adversarial_recipes_train_the_same_with_and_without_folding(recipe_name):
    from training.recipes import MartRecipe, PGDRecipe, TradesRecipe

    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16).train()
    x, y = torch.rand(6, 3, 16, 16), torch.randint(0, 10, (6,))
    threat = ThreatModel("linf", 8 / 255, steps=3, step_size=2 / 255)
    losses = []
    for fold_bn in (True, False):
        clone = copy.deepcopy(model)
        if recipe_name == "pgd":
            recipe = PGDRecipe(clone, threat, fold_bn=fold_bn)
        else:
            recipe = (TradesRecipe if recipe_name == "trades" else MartRecipe)(clone, threat, beta=6.0, fold_bn=fold_bn)
        assert recipe.describe()["fold_bn"] is fold_bn
        assert len(recipe.hot_modules()) == (2 if fold_bn else 1)  # the folded view is compiled with the model
        torch.manual_seed(0)
        losses.append(recipe(x, y)[0])
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)


def test_bad_inputs_are_refused_with_a_hint():
    model = with_running_stats(build_model("small_cnn", "digits", width=8), image_size=16)
    with pytest.raises(TypeError, match="nn.Module"):
        eval_view("resnet18")
    with pytest.raises(TypeError, match="nn.Module"):
        fold_batch_norms(lambda x: x)
    with pytest.raises(TypeError, match="Classifier"):
        FoldedClassifier(model.net)
    with pytest.raises(TypeError, match="running statistics"):
        FoldedConvBatchNorm(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))
    with pytest.raises(ValueError, match="4 channels"):
        FoldedConvBatchNorm(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="unknown attack batch-norm mode"):
        with attack_mode(model, "frozen"):
            pass
    with pytest.raises(TypeError, match="nn.Module"):
        with attack_mode(None):
            pass
    view = eval_view(model)
    with pytest.raises(ValueError, match="channels"):
        view(torch.rand(2, 1, 16, 16))
    with pytest.raises(ValueError, match=r"\[0, 1\]|range"):
        view(torch.rand(2, 3, 16, 16) * 255)
