"""Checkpoint import: robustness-library interop, formats, the converter, and refusals."""
from __future__ import annotations

import argparse
import pickle
import sys

import pytest
import torch

from training.checkpoints import CheckpointError, read_checkpoint, save_checkpoint
from training.convert import main as convert_main
from training.models import build_model
from training.representation import Representation


def _settle_batchnorm(net: torch.nn.Module, seed: int = 0) -> None:
    """Give BatchNorm non-trivial running statistics, so a wrong mapping would show."""
    torch.manual_seed(seed)
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(8, 3, 32, 32))
    net.eval()


def _robustness_compat():
    """benchmarks/robustness_compat.py (the library's torch-2.x patches live beside its only other users)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "robustness_compat.py"
    spec = importlib.util.spec_from_file_location("robustness_compat", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _robustness_checkpoint(arch: str, path, seed: int = 0):
    """Build the library's CIFAR model, save it exactly as its training code does."""
    robustness = _robustness_compat().import_robustness()
    import dill
    from robustness.attacker import AttackerModel

    torch.manual_seed(seed)
    net = getattr(robustness.cifar_models, arch)()
    _settle_batchnorm(net, seed)
    model = AttackerModel(net, robustness.datasets.CIFAR("/nonexistent")).eval()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 50)
    state = {"module." + k: v for k, v in model.state_dict().items()}  # saved from a DataParallel wrapper
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "epoch": 7}, path, pickle_module=dill)
    return model


@pytest.mark.parametrize("arch", ["resnet18", "vgg16"])
def test_robustness_checkpoint_gives_identical_logits_and_representations(tmp_path, arch):
    path = tmp_path / "checkpoint.pt.best"
    theirs = _robustness_checkpoint(arch, path)
    ours = build_model(arch, "cifar10", checkpoint=str(path))  # weights_only=True: no trust flag needed
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        their_logits, their_latent = theirs(x, with_latent=True, fake_relu=arch == "resnet18", with_image=False)
        rep = Representation(ours)
        torch.testing.assert_close(ours(x), their_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rep(x), their_latent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.normalize.mean.flatten(), theirs.normalizer.new_mean.flatten())


def test_fake_relu_gradients_equal_the_libraries(tmp_path):
    path = tmp_path / "checkpoint.pt"
    theirs = _robustness_checkpoint("resnet18", path, seed=3)
    rep = Representation(build_model("resnet18", "cifar10", checkpoint=str(path)), fake_relu=True)
    x = torch.rand(2, 3, 32, 32)
    target = torch.randn(2, 512)
    grads = []
    for f in (lambda v: theirs(v, with_latent=True, fake_relu=True, with_image=False)[1], rep):
        xi = x.clone().requires_grad_(True)
        (f(xi) - target).square().sum().backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_converter_round_trips_to_safetensors(tmp_path):
    src, dst = tmp_path / "robust.pt", tmp_path / "clean.safetensors"
    _robustness_checkpoint("resnet18", src, seed=5)
    convert_main([str(src), str(dst), "--arch", "resnet18", "--dataset", "cifar10"])
    state, metadata = read_checkpoint(dst)
    assert metadata["arch"] == "resnet18" and metadata["dataset"] == "cifar10"
    assert not any(k.startswith("module.") for k in state)
    x = torch.rand(2, 3, 32, 32)
    a = build_model("resnet18", "cifar10", checkpoint=str(src))
    b = build_model("resnet18", "cifar10", checkpoint=str(dst))
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)


def test_converter_arguments_are_checked_and_answered_in_one_line(tmp_path):
    src = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "src.safetensors")
    base = [str(src), str(tmp_path / "out.safetensors"), "--arch", "small_cnn", "--dataset", "digits", "--kwarg", "width=8"]
    for extra, message in ((["--num-classes", "0"], "num_classes must be a whole number >= 1, got 0"),  # 0 meant "the data set's"
                           (["--num-classes", "-3"], "num_classes must be a whole number >= 1, got -3"),
                           (["--kwarg", "nosuch=1"], r"small_cnn does not take \['nosuch', 'width'\].*its arguments are \['width'\]")):
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            convert_main(base + extra)
    with pytest.raises(SystemExit, match=r"^error: .* is a folder: give the file to write"):
        convert_main([str(src), str(tmp_path)] + base[2:])
    assert not (tmp_path / "out.safetensors").exists()


def test_the_converter_does_not_write_a_guessed_normalisation_as_the_files_own(tmp_path):
    """A raw-[0, 1] state dict (TRADES, MART, k-WTA) was written with CIFAR's statistics, and every later load used them
    without the warning the plain file gets."""
    model = build_model("small_cnn", "digits", width=8)
    torch.save({"net." + k: v for k, v in model.net.state_dict().items()}, tmp_path / "raw.pt")
    base = [str(tmp_path / "raw.pt"), str(tmp_path / "out.safetensors"), "--arch", "small_cnn", "--dataset", "digits", "--kwarg", "width=8"]
    with pytest.raises(SystemExit, match=r"holds no input normalisation.*--kwarg 'mean=\[0,0,0\]' --kwarg 'std=\[1,1,1\]'"):
        convert_main(base)
    assert not (tmp_path / "out.safetensors").exists()
    convert_main(base + ["--kwarg", "mean=[0,0,0]", "--kwarg", "std=[1,1,1]"])
    converted = build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "out.safetensors"))
    assert converted.normalization_from_checkpoint and converted.normalize.mean.flatten().tolist() == [0.0, 0.0, 0.0]


def test_half_a_normalisation_and_numpy_or_plain_pickle_files(tmp_path):
    model = build_model("small_cnn", "digits", width=8)
    weights = {"net." + k: v for k, v in model.net.state_dict().items()}
    torch.save({**weights, "normalize.mean": torch.full((1, 3, 1, 1), 0.5)}, tmp_path / "half.pt")
    with pytest.raises(CheckpointError, match="holds normalize.mean but not normalize.std"):  # it ran with the file's mean, the data set's std
        build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "half.pt"))
    torch.save({k: v.numpy() for k, v in weights.items()}, tmp_path / "numpy.pt")
    loaded = build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "numpy.pt"), trust_pickle=True)
    assert torch.equal(loaded.net.features[0].weight, model.net.features[0].weight)
    for protocol in (2, 4):  # safely loaded, torch talked about weights_only ("Unsupported operand 149") or trusting globals
        (tmp_path / "plain.pt").write_bytes(pickle.dumps(dict(model.net.state_dict()), protocol=protocol))
        for trust in (True, False):
            with pytest.raises(CheckpointError, match="looks like a plain pickle.dump file"):
                build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "plain.pt"), trust_pickle=trust)
    for protocol in (2, 4):  # torch's legacy format starts with a pickle too, and loads (torch's safe load: protocol 2 only)
        torch.save(weights, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False, pickle_protocol=protocol)
        legacy = build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "legacy.pt"), trust_pickle=protocol > 2)
        assert torch.equal(legacy.net.features[0].weight, model.net.features[0].weight)


def test_the_converter_takes_architecture_arguments_and_answers_in_one_line(tmp_path, capsys):
    """A width-16 small CNN could not be converted: the hint named +model.kwargs.width, which this command has not."""
    src = save_checkpoint(build_model("small_cnn", "digits", width=16), tmp_path / "wide.safetensors")
    with pytest.raises(SystemExit, match=r"^error: .*pass --kwarg width=16"):
        convert_main([str(src), str(tmp_path / "out.safetensors"), "--arch", "small_cnn", "--dataset", "digits"])
    convert_main([str(src), str(tmp_path / "out.safetensors"), "--arch", "small_cnn", "--dataset", "digits", "--kwarg", "width=16"])
    assert read_checkpoint(tmp_path / "out.safetensors")[1]["kwarg.width"] == "16"
    assert build_model("small_cnn", "digits", checkpoint=str(tmp_path / "out.safetensors"), width=16).net is not None
    with pytest.raises(SystemExit):
        convert_main([str(src), str(tmp_path / "x.safetensors"), "--arch", "small_cnn", "--kwarg", "width"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_a_config_under_model_does_not_hide_the_weights(tmp_path):
    model = build_model("small_cnn", "digits", width=4)
    torch.save({"model": {"name": "small_cnn", "width": 4}, "state_dict": model.state_dict()}, tmp_path / "m.pt")
    loaded = build_model("small_cnn", "digits", width=4, checkpoint=str(tmp_path / "m.pt"))
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_save_checkpoint_keeps_normalisation_and_loads_back(tmp_path):
    model = build_model("small_cnn", "digits")
    _settle_batchnorm(model.net)
    path = save_checkpoint(model, tmp_path / "m.safetensors", {"epoch": 3})
    again = build_model("small_cnn", "digits", checkpoint=str(path))
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), again(x), atol=0, rtol=0)
    assert read_checkpoint(path)[1]["epoch"] == "3"


def test_a_file_without_normalisation_warns_which_statistics_are_assumed(tmp_path, caplog):
    """A plain state dict (TRADES, MART: trained on raw [0, 1] inputs) loaded silently with CIFAR's statistics."""
    import logging

    net = build_model("resnet18", "cifar10", width=8).net
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    with caplog.at_level(logging.WARNING, logger="training.models"):
        assumed = build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "plain.pt"), width=8)
    assert "holds no input normalisation" in caplog.text and "mean=[0,0,0] std=[1,1,1]" in caplog.text
    assert assumed.normalize.mean.flatten()[0] == pytest.approx(0.4914, abs=1e-4)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="training.models"):
        raw = build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "plain.pt"), mean=(0, 0, 0), std=(1, 1, 1), width=8)
        save_checkpoint(raw, tmp_path / "ours.safetensors")
        build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "ours.safetensors"), width=8)
    assert "no input normalisation" not in caplog.text  # given explicitly, then carried by the file
    assert raw.normalize.mean.abs().sum() == 0


def test_a_files_normalisation_wins_and_an_explicit_contradiction_is_refused(tmp_path, caplog):
    """mean=/std= given with a file that normalises otherwise were silently replaced by the file's values."""
    path = save_checkpoint(build_model("small_cnn", "cifar10", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"normalises with mean \[0.5, 0.5, 0.5\].*not the mean=\[0.4"):
        build_model("small_cnn", "cifar10", checkpoint=str(path), mean=(0.4, 0.4, 0.4), std=(0.25, 0.25, 0.25))
    with caplog.at_level("WARNING", logger="training.models"):
        model = build_model("small_cnn", "cifar10", checkpoint=str(path))  # the file's statistics, stated
    assert model.normalize.mean.flatten().tolist() == [0.5, 0.5, 0.5] and "not cifar10's statistics" in caplog.text
    caplog.clear()
    build_model("small_cnn", "cifar10", checkpoint=str(path), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert not caplog.text


@pytest.mark.parametrize("prefix", ["", "module.", "_orig_mod."])
def test_plain_state_dicts_with_wrapper_prefixes(tmp_path, prefix):
    model = build_model("small_cnn", "digits")
    _settle_batchnorm(model.net)
    torch.save({prefix + k: v for k, v in model.net.state_dict().items()}, tmp_path / "sd.pth")
    again = build_model("small_cnn", "digits", checkpoint=str(tmp_path / "sd.pth"))
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), again(x), atol=0, rtol=0)


def _assert_same_as_torchvision(ours, reference) -> None:
    """Our Classifier on [0, 1] images equals the torchvision network on ImageNet-normalised ones."""
    x = torch.rand(1, 3, 64, 64)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference((x - mean) / std), atol=1e-5, rtol=1e-5)


def test_torchvision_weights_file(tmp_path):
    import torchvision

    torch.manual_seed(0)
    reference = torchvision.models.resnet18(weights=None).eval()
    torch.save(reference.state_dict(), tmp_path / "resnet18-f37072fd.pth")
    ours = build_model("resnet18", "imagenet", checkpoint=str(tmp_path / "resnet18-f37072fd.pth"))
    _assert_same_as_torchvision(ours, reference)


def test_torchvisions_released_densenet_weights_with_their_old_key_names(tmp_path):
    """densenet121-a639ec97.pth names a dense layer's modules norm.1, conv.2 ...: torchvision renames them on loading."""
    import re

    import torchvision

    torch.manual_seed(0)
    reference = torchvision.models.densenet121(weights=None).eval()
    legacy = {re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", k): v for k, v in reference.state_dict().items()}
    assert any(".norm.1." in k for k in legacy)
    torch.save(legacy, tmp_path / "densenet121-a639ec97.pth")
    ours = build_model("densenet121", "imagenet", checkpoint=str(tmp_path / "densenet121-a639ec97.pth"))
    _assert_same_as_torchvision(ours, reference)


def test_a_robustness_checkpoint_saved_without_dataparallel(tmp_path):
    """The library's keys without the module. prefix (model.*, attacker.model.*, normalizer.*) were not recognised."""
    theirs = _robustness_checkpoint("resnet18", tmp_path / "wrapped.pt")
    torch.save({"model": theirs.state_dict()}, tmp_path / "bare.pt")
    ours = build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "bare.pt"))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x, with_image=False), atol=1e-5, rtol=1e-5)


def test_a_file_saved_from_another_architecture_is_refused_and_other_arguments_are_named(tmp_path, caplog):
    """k-WTA layers hold no weight: a kwta_resnet18 file fitted resnet18 key for key, and one of ratio 0.3 a ratio 0.1
    build, so either loaded as another network without a word."""
    torch.manual_seed(0)
    kwta = save_checkpoint(build_model("kwta_resnet18", "cifar10", ratio=0.3, width=8), tmp_path / "kwta.safetensors")
    assert read_checkpoint(kwta)[1]["kwarg.ratio"] == "0.3"  # the builder's arguments travel with the weights
    with pytest.raises(ValueError, match=r"was saved from a kwta_resnet18 model, not resnet18: build it as kwta_resnet18"):
        build_model("resnet18", "cifar10", width=8, checkpoint=str(kwta))
    with caplog.at_level("WARNING", logger="training.models"):
        build_model("kwta_resnet18", "cifar10", width=8, checkpoint=str(kwta))  # the same weights at another ratio may be meant
    assert "saved from kwta_resnet18 with ratio=0.3; this build has ratio=0.1" in caplog.text and "model.kwargs.ratio=0.3" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="training.models"):
        loaded = build_model("kwta_resnet18", "cifar10", width=8, ratio=0.3, checkpoint=str(kwta))
    assert "was saved from" not in caplog.text
    assert loaded.arch_kwargs == {"width": 8, "ratio": 0.3}
    # a file of another tool (no metadata) is loaded as asked
    torch.save(loaded.state_dict(), tmp_path / "plain.pt")
    assert build_model("resnet18", "cifar10", width=8, checkpoint=str(tmp_path / "plain.pt")).arch == "resnet18"


def test_mean_and_std_may_be_tensors():
    """A robustness data set keeps its statistics as tensors (ds.mean): 'mean or default' asked a tensor for its truth."""
    model = build_model("small_cnn", "digits", width=4, mean=torch.tensor([0.5, 0.5, 0.5]), std=torch.tensor([0.25, 0.25, 0.25]))
    assert model.normalize.mean.flatten().tolist() == [0.5, 0.5, 0.5] and model.normalize.std.flatten().tolist() == [0.25, 0.25, 0.25]


def test_robustness_layouts_of_custom_forward_networks_and_imagenet_alexnet(tmp_path):
    """add_custom_forward=True nests the network one model. deeper (module.model.model.*), and robustness's AlexNet names its
    last layer last_layer: both were refused as not fitting."""
    from training.checkpoints import canonical_state_dict

    torch.manual_seed(0)
    ours = build_model("resnet18", "cifar10", width=8)
    net_state = {k[len("net."):]: v for k, v in ours.state_dict().items() if k.startswith("net.")}
    nested = {**{f"module.model.model.{k}": v for k, v in net_state.items()}, **{f"module.attacker.model.model.{k}": v for k, v in net_state.items()},
              "module.normalizer.new_mean": torch.full((3, 1, 1), 0.5), "module.normalizer.new_std": torch.full((3, 1, 1), 0.25)}
    torch.save({"model": nested}, tmp_path / "custom.pt")
    loaded = build_model("resnet18", "cifar10", width=8, checkpoint=str(tmp_path / "custom.pt"))
    assert torch.equal(loaded.net.conv1.weight, ours.net.conv1.weight) and loaded.normalize.mean.flatten().tolist() == [0.5] * 3
    alexnet = canonical_state_dict({"module.model.features.0.weight": torch.zeros(1), "module.model.last_layer.weight": torch.zeros(2),
                                    "module.model.last_layer.bias": torch.zeros(2)})
    assert sorted(alexnet) == ["net.classifier.6.bias", "net.classifier.6.weight", "net.features.0.weight"]


class NotATensor:  # a pickled object that a safe load must refuse
    def __init__(self):
        self.note = "arbitrary code could run here"


def test_untrusted_pickle_is_refused_and_names_the_trust_flag(tmp_path):
    model = build_model("small_cnn", "digits")
    path = tmp_path / "unsafe.pt"
    torch.save({"model": model.net.state_dict(), "args": argparse.Namespace(lr=0.1), "extra": NotATensor()}, path)
    with pytest.raises(CheckpointError, match="trust_pickle=True"):
        build_model("small_cnn", "digits", checkpoint=str(path))
    trusted = build_model("small_cnn", "digits", checkpoint=str(path), trust_pickle=True)
    assert torch.equal(trusted.net.linear.weight, model.net.linear.weight)


def test_corrupt_missing_and_mismatched_checkpoints(tmp_path):
    model = build_model("small_cnn", "digits")
    good = tmp_path / "good.pt"
    torch.save(model.net.state_dict(), good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        build_model("small_cnn", "digits", checkpoint=str(truncated))
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="safetensors"):
        build_model("small_cnn", "digits", checkpoint=str(bad_st))
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        build_model("small_cnn", "digits", checkpoint=str(tmp_path / "nope.pt"))
    with pytest.raises(CheckpointError, match="does not fit resnet18"):
        build_model("resnet18", "digits", checkpoint=str(good))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        build_model("small_cnn", "cifar100", checkpoint=str(good))
    diverged = {k: v.clone() for k, v in model.net.state_dict().items()}
    first_weight = next(k for k in diverged if k.endswith("weight"))
    diverged[first_weight][0] = float("nan")  # a run that diverged: a NaN objective at step 0 of an inversion, far from its cause
    torch.save(diverged, tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match=rf"nan\.pt holds NaN or Inf in 1 weight tensor\(s\) \(e\.g\. \['net\.{first_weight}'\]\): .*diverged"):
        build_model("small_cnn", "digits", checkpoint=str(tmp_path / "nan.pt"))


def test_random_bytes_and_text_files_are_not_checkpoints(tmp_path):
    noise = tmp_path / "noise.pt"
    noise.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).numpy().tobytes())
    with pytest.raises(CheckpointError, match="not a checkpoint.*binary data") as info:
        read_checkpoint(noise)
    assert "trust_pickle" not in str(info.value)
    text = tmp_path / "notes.pt"
    text.write_text("epoch 3: loss 0.2\n")
    with pytest.raises(CheckpointError, match=r"notes\.pt is not a checkpoint.*starts with text") as info:
        build_model("small_cnn", "digits", checkpoint=str(text))
    assert "trust_pickle" not in str(info.value)  # trusting a text file would not help
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is empty"):
        read_checkpoint(empty)


@pytest.mark.parametrize("head", [b"PK\x03\x04", b"\x80\x02"], ids=["zip", "pickle"])
def test_corrupt_files_with_a_valid_header_say_corrupt_not_trust(tmp_path, head):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(head + torch.randint(0, 256, (2048,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)).numpy().tobytes())
    with pytest.raises(CheckpointError, match="not a readable checkpoint .truncated or corrupt") as info:
        read_checkpoint(bad)
    assert "trust_pickle" not in str(info.value)


def test_a_checkpoint_of_another_width_names_the_kwarg(tmp_path):
    path = save_checkpoint(build_model("small_cnn", "digits", width=16), tmp_path / "w16.safetensors")
    with pytest.raises(CheckpointError, match=r"shape mismatch.*the checkpoint has width=16, the model width=32: pass \+model\.kwargs\.width=16"):
        build_model("small_cnn", "digits", checkpoint=str(path))
    with pytest.raises(CheckpointError, match=r"the checkpoint has width=16, the model width=8"):
        build_model("small_cnn", "digits", checkpoint=str(path), width=8)
    assert build_model("small_cnn", "digits", checkpoint=str(path), width=16).arch_kwargs == {"width": 16}


FACTORY_MODULE = '''
import torch
from torch import nn


class Defence(nn.Module):
    """A plain module (not a Classifier) whose submodule is called ``model``, like a Lightning wrapper's prefix."""

    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        return self.head(self.model(x))


def build():
    return Defence()


def bare_resnet18():
    from training.models import build_model
    return build_model("resnet18", "cifar10").net
'''


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    name = "checkpoint_test_defences"  # a name no other test's module takes: sys.modules would hand back that one
    (tmp_path / f"{name}.py").write_text(FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name


@pytest.mark.parametrize("prefix", ["", "module."])
def test_a_factory_model_loads_a_state_dict_saved_from_itself(tmp_path, factory_module, prefix):
    from training.models.defences import build_from_factory

    trained = build_from_factory(f"{factory_module}:build")
    _settle_batchnorm(trained)
    torch.save({prefix + k: v for k, v in trained.state_dict().items()}, tmp_path / "defence.pt")
    again = build_from_factory(f"{factory_module}:build", checkpoint=str(tmp_path / "defence.pt"))
    x = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(again(x), trained(x), atol=0, rtol=0)
    torch.save({"head.weight": torch.zeros(10, 4)}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match=r"missing \(e\.g\. \['head\.bias', 'model\.0\.bias'"):
        build_from_factory(f"{factory_module}:build", checkpoint=str(tmp_path / "partial.pt"))


def test_a_factory_returning_the_bare_network_takes_a_robustness_checkpoint(tmp_path, factory_module):
    from training.models.defences import build_from_factory

    theirs = _robustness_checkpoint("resnet18", tmp_path / "checkpoint.pt", seed=2)
    bare = build_from_factory(f"{factory_module}:bare_resnet18", checkpoint=str(tmp_path / "checkpoint.pt"))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():  # the bare network sees normalised images: its normalisation is the factory's business
        torch.testing.assert_close(bare(theirs.normalizer(x)), theirs(x, with_image=False), atol=1e-5, rtol=1e-5)


def test_checkpoints_without_num_batches_tracked_load(tmp_path):
    """Saved before PyTorch 0.4.1 (old torchvision files): ``load_state_dict`` accepts them, so do we."""
    model = build_model("small_cnn", "digits")
    _settle_batchnorm(model.net)
    old = {k: v for k, v in model.net.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert len(old) < len(model.net.state_dict())
    torch.save(old, tmp_path / "old.pth")
    again = build_model("small_cnn", "digits", checkpoint=str(tmp_path / "old.pth"))
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(again(x), model(x), atol=0, rtol=0)


def test_another_architectures_keys_get_no_width_advice(tmp_path):
    """A TRADES WideResNet loaded as resnet18 was told to pass +model.kwargs.width=16 (read off conv1), which failed again."""
    state = {k: v for k, v in build_model("resnet18", "cifar10", width=16).state_dict().items() if not k.startswith("net.layer4.")}
    state["net.block1.layer.0.bn1.bias"] = torch.zeros(128)
    torch.save(state, tmp_path / "wrn.pt")
    with pytest.raises(CheckpointError, match=r"missing .* unexpected .*shape mismatch.*Is it a checkpoint of another architecture") as info:
        build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "wrn.pt"))
    assert "width=16" not in str(info.value)
    torch.save({k: v for k, v in build_model("resnet18", "cifar10", width=16).state_dict().items()}, tmp_path / "narrow.pt")
    with pytest.raises(CheckpointError, match=r"the checkpoint has width=16"):  # the same keys: the width is the difference
        build_model("resnet18", "cifar10", checkpoint=str(tmp_path / "narrow.pt"))


def test_another_class_count_is_named_with_the_fix(tmp_path):
    save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "ten.safetensors")
    with pytest.raises(CheckpointError, match=r"the checkpoint has 10 outputs, the model 5: choose the data set .*num_classes=10"):
        build_model("small_cnn", "digits", width=8, num_classes=5, checkpoint=str(tmp_path / "ten.safetensors"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")  # torch's own note, on the trusted load
def test_a_file_the_safe_load_cannot_read_names_the_trust_flag_not_corruption(tmp_path):
    """A state dict saved with pickle protocol 4 loads with trust_pickle=True, but was called truncated or corrupt; the
    refusal's details were torch's first line, with terminal colour codes, not what it refused."""
    model = build_model("small_cnn", "digits", width=8)
    torch.save(model.state_dict(), tmp_path / "proto4.pt", pickle_protocol=4)
    with pytest.raises(CheckpointError, match=r"proto4\.pt holds what a safe load .* refuses \(Unsupported operand 149\).*trust_pickle=True") as info:
        build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "proto4.pt"))
    assert "corrupt" not in str(info.value) and "\x1b" not in str(info.value)
    loaded = build_model("small_cnn", "digits", width=8, checkpoint=str(tmp_path / "proto4.pt"), trust_pickle=True)
    assert torch.equal(loaded.net.features[0].weight, model.net.features[0].weight)
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, tmp_path / "args.pt")
    with pytest.raises(CheckpointError, match=r"refuses \(Unsupported global: GLOBAL argparse\.Namespace"):
        read_checkpoint(tmp_path / "args.pt")


def test_a_trusted_pickle_whose_code_is_missing_says_so(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "their_nets.py").write_text("import torch\nclass Net(torch.nn.Linear):\n    pass\n")
    monkeypatch.syspath_prepend(str(code))
    import their_nets

    torch.save(their_nets.Net(2, 2), tmp_path / "whole.pt")
    monkeypatch.delitem(sys.modules, "their_nets")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(code)])
    with pytest.raises(CheckpointError, match=r"whole\.pt is a pickle of Python objects whose code is not importable here "
                                              r"\(ModuleNotFoundError: No module named 'their_nets'\).*PYTHONPATH.*state_dict"):
        read_checkpoint(tmp_path / "whole.pt", trust_pickle=True)


def test_a_folder_given_as_the_checkpoint_lists_the_files_in_it(tmp_path):
    """A robustness output folder was reported as "checkpoint not found"."""
    folder = tmp_path / "run"
    folder.mkdir()
    save_checkpoint(build_model("small_cnn", "digits", width=8), folder / "checkpoint.pt.best")
    (folder / "log.txt").write_text("epoch 1")
    with pytest.raises(CheckpointError, match=r"run is a folder, not a checkpoint file: give the file inside it \(it holds \['checkpoint\.pt\.best'\]\)"):
        build_model("small_cnn", "digits", width=8, checkpoint=str(folder))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no \.pt"):
        read_checkpoint(tmp_path / "empty")


class _TradesWideBlock(torch.nn.Module):
    """TRADES's models/wideresnet.py BasicBlock, restated (its names, its pre-activation shortcut)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.bn1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.relu2 = nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.equalInOut = cin == cout
        self.convShortcut = None if self.equalInOut else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)

    def forward(self, x):
        if not self.equalInOut:
            x = self.relu1(self.bn1(x))
        else:
            out = self.relu1(self.bn1(x))
        out = self.relu2(self.bn2(self.conv1(out if self.equalInOut else x)))
        return torch.add(x if self.equalInOut else self.convShortcut(x), self.conv2(out))


class _TradesWideResNet(torch.nn.Module):
    """TRADES's WideResNet, restated: conv1, block1 (and the unused sub_block1), block2, block3, bn1, relu, fc."""

    def __init__(self, depth=10, widen_factor=2, num_classes=10):
        super().__init__()
        nn, n = torch.nn, (depth - 4) // 6
        c = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]

        def stage(cin, cout, stride):
            module = nn.Module()
            module.layer = nn.Sequential(*[_TradesWideBlock(cin if i == 0 else cout, cout, stride if i == 0 else 1) for i in range(n)])
            module.forward = module.layer.forward
            return module

        self.conv1 = nn.Conv2d(3, c[0], 3, 1, 1, bias=False)
        self.block1, self.sub_block1, self.block2, self.block3 = stage(c[0], c[1], 1), stage(c[0], c[1], 1), stage(c[1], c[2], 2), stage(c[2], c[3], 2)
        self.bn1, self.relu, self.fc, self.nChannels = nn.BatchNorm2d(c[3]), nn.ReLU(inplace=True), nn.Linear(c[3], num_classes), c[3]

    def forward(self, x):
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = torch.nn.functional.avg_pool2d(self.relu(self.bn1(out)), 8)
        return self.fc(out.view(-1, self.nChannels))


def test_trades_wide_resnet_checkpoints_load_as_saved_with_the_same_logits(tmp_path):
    """TRADES's and MART's WRN (and RobustBench's WideResNet) had no zoo architecture: their checkpoints could not be imported."""
    torch.manual_seed(0)
    reference = _TradesWideResNet(depth=10, widen_factor=2)
    for module in reference.modules():  # trained-looking batch-norm statistics, so that eval mode matters
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
    reference.eval()
    torch.save({"module." + k: v for k, v in reference.state_dict().items()}, tmp_path / "model-wideres-epoch76.pt")  # DataParallel, as saved
    x = torch.rand(4, 3, 32, 32)
    ours = build_model("wide_resnet", "cifar10", depth=10, widen_factor=2, mean=[0, 0, 0], std=[1, 1, 1],
                       checkpoint=str(tmp_path / "model-wideres-epoch76.pt"))
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)
    assert Representation(ours)(x).shape == (4, 128)
    with pytest.raises(CheckpointError, match=r"the checkpoint has depth=10, widen_factor=2.*\+model\.kwargs\.depth=10 \+model\.kwargs\.widen_factor=2"):
        build_model("wide_resnet", "cifar10", checkpoint=str(tmp_path / "model-wideres-epoch76.pt"), mean=[0, 0, 0], std=[1, 1, 1])
    with pytest.raises(ValueError, match=r"depth must be 6n \+ 4"):
        build_model("wide_resnet", "cifar10", depth=12)


def test_the_converter_replaces_an_existing_file_only_when_asked(tmp_path, capsys):
    """An unrelated text file given as the destination was replaced by safetensors without a word."""
    src = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "src.safetensors")
    notes = tmp_path / "notes.txt"
    notes.write_text("months of work")
    base = ["--arch", "small_cnn", "--dataset", "digits", "--kwarg", "width=8"]
    with pytest.raises(SystemExit, match=r"^error: .*notes\.txt exists: give another destination, or replace it with --overwrite"):
        convert_main([str(src), str(notes), *base])
    assert notes.read_text() == "months of work"
    convert_main([str(src), str(notes), *base, "--overwrite"])
    assert build_model("small_cnn", "digits", width=8, checkpoint=str(notes)).net is not None
