"""The zoo and the representation wrapper: shapes, gradients, layers, fake ReLU, refusals."""
from __future__ import annotations

import warnings

import pytest
import torch

from training.models import CIFAR_ARCHITECTURES, KWinnersTakeAll, build_model, list_models
from training.representation import Representation, list_layers

EXPECTED_FEATURES = {
    "resnet18": 512,
    "resnet50": 2048,
    "vgg16": 512,
    "densenet121": 1024,
    "inception_v3": 2048,
    "kwta_resnet18": 512,
    "small_cnn": 128,
    "kwta_small_cnn": 128,
    "wide_resnet": 640,
}


@pytest.mark.parametrize("name", sorted(CIFAR_ARCHITECTURES))
def test_every_architecture_forward_representation_and_input_gradients(name):
    torch.manual_seed(0)
    model = build_model(name, "cifar10")
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    assert model(x).shape == (2, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the architecture defaults never ask for a useless fake ReLU
        rep = Representation(model)
    features = rep(x)
    assert features.shape == (2, EXPECTED_FEATURES[name])
    features.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_penultimate_representation_equals_the_classifier_input():
    """The default layer is what the final linear layer sees."""
    model = build_model("resnet18", "cifar10")
    x = torch.rand(3, 3, 32, 32)
    features = Representation(model, fake_relu=False)(x)
    logits = model.net.linear(features)
    torch.testing.assert_close(logits, model(x), rtol=1e-5, atol=1e-5)


def test_fake_relu_same_forward_identity_backward():
    torch.manual_seed(1)
    model = build_model("resnet18", "cifar10")
    x = torch.rand(2, 3, 32, 32)
    plain, fake = Representation(model, fake_relu=False), Representation(model, fake_relu=True)
    assert plain.fake_relu is False and fake.fake_relu is True
    torch.testing.assert_close(plain(x), fake(x))
    # Gradient of the pre-activation: with a fake ReLU it flows through units that are switched off.
    grads = []
    for rep in (plain, fake):
        xi = x.clone().requires_grad_(True)
        (-rep(xi)).sum().backward()  # pushes every unit down: dead units pass no gradient with a real ReLU
        grads.append(xi.grad)
    assert not torch.allclose(grads[0], grads[1])


def test_fake_relu_warns_where_it_changes_nothing():
    model = build_model("vgg16", "cifar10")
    with pytest.warns(UserWarning, match="changes nothing at layer 'features'"):
        rep = Representation(model, fake_relu=True)
    assert rep.fake_relu is False


def test_named_layers_can_be_listed_and_chosen():
    model = build_model("resnet18", "cifar10")
    layers = list_layers(model)
    assert "layer3.1.act_out" in layers and "linear" in layers
    rep = Representation(model, layer="layer3")  # a module name = its last node
    assert rep(torch.rand(2, 3, 32, 32)).shape == (2, 256 * 8 * 8)  # flattened by default away from the penultimate
    pooled = Representation(model, layer="layer3", pool="avg")
    assert pooled(torch.rand(2, 3, 32, 32)).shape == (2, 256)


def test_a_defence_wrapping_a_zoo_classifier_is_traced_through_it_and_takes_its_penultimate_layer():
    """A defence written as a plain module around a zoo model (an input transform in front): tracing stopped at the
    classifier's input check (an fx Proxy is no tensor), so neither list_layers nor any layer= worked."""
    from torch import nn

    class Quantised(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = build_model("small_cnn", "digits", width=4)

        def forward(self, x):
            return self.base(torch.round(x * 3) / 3)

    defence, x = Quantised().eval(), torch.rand(2, 3, 32, 32)
    assert list_layers(defence)[:3] == ["mul", "round", "truediv"] and "base.net.linear" in list_layers(defence)
    rep = Representation(defence)
    assert rep.layer == "base.net.features" and rep.pool == "avg" and rep.fake_relu == defence.base.fake_relu
    assert torch.equal(rep(x), Representation(defence.base)(torch.round(x * 3) / 3))  # the inner penultimate, behind the transform
    two = nn.ModuleDict({"a": build_model("small_cnn", "digits", width=4), "b": build_model("small_cnn", "digits", width=4)})
    with pytest.raises(ValueError, match="names no penultimate layer and wraps no single zoo classifier that does: pass layer="):
        Representation(two)  # an ensemble: whose layer would it be?
    assert not Representation(defence, layer="base.net.features.2").fake_relu  # a layer asked for: the wrapper's default, as before
    defence.penultimate = None  # on purpose: no representation by default, whatever it wraps
    with pytest.raises(ValueError, match="names no penultimate layer"):
        Representation(defence)

    class PerImage(Quantised):  # a forward torch.fx cannot trace: a ValueError, which the feature scores' callers catch
        def forward(self, x):
            return self.base(torch.stack([x[i] for i in range(x.shape[0])]))

    with pytest.raises(ValueError, match=r"PerImage cannot be traced by torch.fx to cut it at a layer \(TypeError"):
        Representation(PerImage())


def test_representation_does_not_run_layers_after_the_chosen_one():
    model = build_model("resnet18", "cifar10")
    rep = Representation(model, layer="layer1")
    assert not hasattr(rep.extractor, "layer4") and not hasattr(rep.extractor, "linear")


def test_a_representation_leaves_the_models_layers_in_their_mode():
    """It froze the BatchNorm of a model training in the caller's loop, while model.training still said True."""
    model = build_model("small_cnn", "digits", width=4).train()
    model.net.features[1].eval()  # a layer the caller froze on purpose stays frozen
    modes = {name: m.training for name, m in model.named_modules()}
    Representation(model)
    assert {name: m.training for name, m in model.named_modules()} == modes
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]
    before = norms[0].running_mean.clone()
    model(torch.rand(8, 3, 32, 32))
    assert not torch.equal(norms[0].running_mean, before)  # a training forward still updates the statistics


def test_unknown_model_and_layer_names():
    with pytest.raises(ValueError, match="unknown model 'resnet19'.*resnet18"):
        build_model("resnet19", "cifar10")
    with pytest.raises(ValueError, match="unknown layer 'layer9'.*list_layers"):
        Representation(build_model("small_cnn", "digits"), layer="layer9")
    with pytest.raises(ValueError, match="unknown data set"):
        build_model("resnet18", "svhn")


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.rand(2, 3, 32, 32) * 255, "divide by 255"),
        (torch.rand(2, 3, 32, 32) - 0.5, "normalisation lives inside"),
        (torch.rand(3, 32, 32), "4-D.*unsqueeze"),
        (torch.rand(2, 32, 32, 3), "channels-last"),
        ((torch.rand(2, 3, 32, 32) * 255).to(torch.uint8), "uint8"),
    ],
)
def test_wrong_image_inputs_are_refused_with_a_fix(bad, message):
    model = build_model("small_cnn", "digits")
    with pytest.raises((ValueError, TypeError), match=message):
        Representation(model)(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        model(bad)


def test_range_check_is_skipped_in_the_hot_loop():
    from invert.validation import hot_loop

    model = build_model("small_cnn", "digits")
    with hot_loop():
        model(torch.rand(1, 3, 32, 32) * 2)  # no host sync, no error


def test_kwta_keeps_exactly_the_top_fraction_per_sample():
    x = torch.randn(3, 4, 5, 5)
    out = KWinnersTakeAll(ratio=0.2)(x)
    kept = (out != 0).flatten(1).sum(1)
    assert kept.tolist() == [20, 20, 20]  # 0.2 * 100 units each
    flat_in, flat_out = x.flatten(1), out.flatten(1)
    for i in range(3):
        top = flat_in[i].topk(20).values
        assert torch.equal(flat_out[i][flat_out[i] != 0].sort().values, top.sort().values)
    with pytest.raises(ValueError, match="ratio"):
        KWinnersTakeAll(1.5)


def test_kwta_resnet18_computes_xiao_et_al_sparse_resnet():
    """Xiao et al.'s SparseResNet (sparse_func 'vol', no ReLU in the blocks), written out from its forward: a ReLU
    stem, then per block kwta(bn1(conv1 x)) and kwta(bn2(conv2 .) + shortcut x); pooled features into the linear."""
    import torch.nn.functional as F

    from training.models.cifar import k_winners_take_all

    torch.manual_seed(0)
    model = build_model("kwta_resnet18", "cifar10", ratio=0.1, width=8).eval()
    for module in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    net, x = model.net, torch.rand(3, 3, 32, 32)

    def block(b, h):
        out = k_winners_take_all(b.bn1(b.conv1(h)), 0.1)
        return k_winners_take_all(b.bn2(b.conv2(out)) + b.shortcut(h), 0.1)

    with torch.no_grad():
        h = F.relu(net.bn1(net.conv1(model.normalize(x))))
        for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
            for b in layer:
                h = block(b, h)
        expected = net.linear(F.avg_pool2d(h, 4).flatten(1))
        torch.testing.assert_close(model(x), expected)


def test_imagenet_family_by_name_and_missing_pretrained_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    assert "resnet50" in list_models("imagenet") and "wide_resnet50_2" in list_models("imagenet")
    model = build_model("resnet18", "imagenet")
    assert model.net.fc.out_features == 1000 and model.penultimate == "layer4"
    rep = Representation(model)
    assert rep.fake_relu is True  # torchvision's shared ReLU module: only its last call is rewritten
    assert rep(torch.rand(1, 3, 64, 64)).shape == (1, 512)
    with pytest.raises(FileNotFoundError, match=r"resnet18-[0-9a-f]+\.pth.*hub/checkpoints"):
        build_model("resnet18", "imagenet", pretrained=True)
    with pytest.raises(ValueError, match="unknown torchvision architecture"):
        build_model("resnet1000", "imagenet")


def test_torchvision_architectures_take_their_own_arguments():
    """An Inception-v3 checkpoint saved without its auxiliary head could not be loaded: aux_logits=False was a TypeError."""
    model = build_model("inception_v3", "imagenet", aux_logits=False, init_weights=False)
    assert model.net.AuxLogits is None and not any(k.startswith("net.AuxLogits") for k in model.state_dict())
    assert build_model("mobilenet_v3_small", "imagenet", dropout=0.5).net.classifier[2].p == 0.5
    with pytest.raises(ValueError, match=r"torchvision's resnet18 does not take the arguments \['ratio'\]"):
        build_model("resnet18", "imagenet", ratio=0.5)


@pytest.mark.parametrize("name, fake_relu", [("densenet121", True), ("vgg11", True), ("alexnet", True), ("mobilenet_v3_small", False),
                                             ("convnext_tiny", False), ("resnet18", True)])
def test_imagenet_representation_is_the_final_linear_layers_input(name, fake_relu):
    """robustness's ``with_latent``: for VGG and AlexNet the 4096-d ReLU output of the MLP head, for DenseNet the ReLU
    after ``features`` (which ends in a BatchNorm), in general what the last Linear layer sees."""
    torch.manual_seed(0)
    model = build_model(name, "imagenet").eval()
    final = [m for m in model.net.modules() if isinstance(m, torch.nn.Linear)][-1]
    seen = {}
    hook = final.register_forward_hook(lambda module, inputs, output: seen.setdefault("input", inputs[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the default never asks for a fake ReLU that changes nothing
        rep = Representation(model)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        model(x)
        features = rep(x)
    hook.remove()
    assert rep.fake_relu is fake_relu
    torch.testing.assert_close(features, seen["input"].flatten(1))


def test_digits_model_has_digits_normalisation():
    model = build_model("small_cnn", "digits")
    assert model.num_classes == 10
    assert torch.allclose(model.normalize.mean.flatten(), torch.tensor([0.3052] * 3))


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
@pytest.mark.parametrize("width", [0, 2.5, True])
def test_a_width_that_is_no_channel_count_is_refused_by_name(name, width):
    """width=0 failed inside Conv2d ("weight of size [0, 3, 3, 3]"), 2.5 as "out_channels must be divisible by groups"."""
    with pytest.raises(ValueError, match=rf"width .* must be a whole number >= 1, got {width!r}"):
        build_model(name, "cifar10", width=width)
