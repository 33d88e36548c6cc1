"""SimCLR's encoder is the classifier's own network; the linear probe turns it into an ordinary Classifier."""
from __future__ import annotations

import re

import pytest
import torch

from training.checkpoints import save_checkpoint
from training.config import ConfigError
from training.data import load_dataset
from training.evaluate import clean_accuracy
from training.losses import nt_xent
from training.models import build_model
from training.recipes import ProjectionHead, build_recipe, classifier_head, encoder_of, linear_probe

from .conftest import compose_train


@pytest.mark.parametrize("arch", ["small_cnn", "resnet18", "vgg16", "kwta_resnet18"])
def test_encoder_feeds_the_classifier_head(arch):
    model = build_model(arch, "cifar10").eval()
    encoder, head = encoder_of(model), classifier_head(model)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(head(encoder(x)), model(x), atol=1e-5)


@pytest.mark.parametrize("override, message", [("train.simclr.temperature=nan", "temperature must be a positive finite number"),
                                               ("train.simclr.temperature=inf", "temperature must be a positive finite number"),
                                               ("train.simclr.projection_dim=0", "projection_dim must be a whole number >= 1"),
                                               ("train.simclr.strength=-0.5", "strength must be >= 0"),
                                               ("train.simclr.crop_scale=0.2", r"two numbers \[low, high\]")])
def test_simclr_settings_that_learn_nothing_are_refused(override, message):
    data = load_dataset("digits", "train").subset(torch.arange(4))
    with pytest.raises(ValueError, match=message):
        build_recipe(compose_train("train=simclr", override).train, build_model("small_cnn", "digits", width=4), data)


@pytest.mark.parametrize("recipe", ["simclr", "adv_simclr"])
@pytest.mark.parametrize("override, message", [("train.label_smoothing=0.1", "train.label_smoothing=0.1 has no effect"),
                                               ("train.augment.enabled=true", "train.augment.enabled=True"),
                                               ("train.augment.color_jitter=0.5", "train.augment.color_jitter=0.5")])
def test_supervised_settings_that_simclr_would_ignore_are_refused(recipe, override, message):
    """SimCLR inherits standard.yaml's keys; its loss has no labels and it draws its views with train.simclr.*, so a
    label smoothing or a supervised augmentation used to be accepted and silently ignored."""
    data = load_dataset("digits", "train").subset(torch.arange(4))
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_recipe(compose_train(f"train={recipe}", override).train, build_model("small_cnn", "digits", width=4), data)


def _reference_contrastive_loss(z1, z2, temperature):
    """google-research/simclr objective.py's add_contrastive_loss on one core, transcribed: loss_a + loss_b."""
    large_num = 1e9
    h1, h2 = torch.nn.functional.normalize(z1, dim=1), torch.nn.functional.normalize(z2, dim=1)
    n = h1.shape[0]
    masks = torch.eye(n)
    logits_aa = h1 @ h1.T / temperature - masks * large_num
    logits_bb = h2 @ h2.T / temperature - masks * large_num
    logits_ab, logits_ba = h1 @ h2.T / temperature, h2 @ h1.T / temperature
    labels = torch.arange(n)  # one_hot(range(n), 2n): the positive is column i of the first block
    loss_a = torch.nn.functional.cross_entropy(torch.cat([logits_ab, logits_aa], 1), labels)
    loss_b = torch.nn.functional.cross_entropy(torch.cat([logits_ba, logits_bb], 1), labels)
    return loss_a + loss_b


def test_simclr_trains_on_the_reference_codes_loss_scale():
    """The reference trains on loss_a + loss_b, twice Eq. 1's mean; under LARS the scale sets the weight decay's
    weight and the untrusted bias/BN steps, so the config's lr and weight decay are the reference's only on its scale."""
    torch.manual_seed(0)
    data = load_dataset("digits", "train").subset(torch.arange(12))
    recipe = build_recipe(compose_train("train=simclr").train, build_model("small_cnn", "digits", width=4), data).train()
    views = recipe.prepare(data.images)
    loss, _ = recipe(views, data.labels)
    z1, z2 = recipe.project(views)
    assert loss.item() == pytest.approx(_reference_contrastive_loss(z1.detach(), z2.detach(), 0.5).item(), rel=1e-5)
    assert loss.item() == pytest.approx(2 * nt_xent(z1, z2, 0.5).item(), rel=1e-6)


def test_simclr_step_trains_the_shared_encoder_and_projector_but_not_the_head():
    torch.manual_seed(0)
    data = load_dataset("digits", "train").subset(torch.arange(16))
    model = build_model("small_cnn", "digits", width=8)
    recipe = build_recipe(compose_train("train=simclr").train, model, data).train()
    assert isinstance(recipe.projector, ProjectionHead) and recipe.projector[-1].out_features == 128
    conv_before = model.net.features[0].weight.detach().clone()
    head_before = model.net.linear.weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in recipe.parameters() if p.requires_grad], lr=0.5)
    views = recipe.prepare(data.images)
    assert views.shape == (32, 3, 32, 32)
    loss, stats = recipe(views, data.labels)
    loss.backward()
    optimizer.step()
    assert recipe.projector[0].weight.grad is not None
    assert not torch.equal(model.net.features[0].weight, conv_before)
    assert torch.equal(model.net.linear.weight, head_before) and not model.net.linear.weight.requires_grad


def test_linear_probe_makes_a_classifier_that_reloads(tmp_path):
    torch.manual_seed(0)
    train_set = load_dataset("digits", "train").subset(torch.arange(300))
    model = build_model("small_cnn", "digits", width=16)
    accuracy = linear_probe(model, train_set, epochs=20, lr=0.1, batch_size=64)
    # the folded head on the encoder is the model's own forward: the same accuracy through model(x)
    assert clean_accuracy(model, train_set) == pytest.approx(accuracy, abs=1 / 300)
    assert accuracy > 0.5  # random conv features are linearly informative on digits
    assert model.net.linear.weight.requires_grad
    path = save_checkpoint(model, tmp_path / "probe.safetensors", {"recipe": "simclr"})
    reloaded = build_model("small_cnn", "digits", width=16, checkpoint=str(path))
    assert clean_accuracy(reloaded, train_set) == clean_accuracy(model, train_set)


def test_linear_probe_rejects_bad_settings():
    model = build_model("small_cnn", "digits", width=8)
    data = load_dataset("digits", "train").subset(torch.arange(8))
    with pytest.raises(ValueError, match="epochs >= 1"):
        linear_probe(model, data, epochs=0)


def test_linear_probe_is_the_same_on_every_rank_and_ignores_a_dead_unit():
    """Each DDP rank drew its own random probe from a per-rank seeded RNG and fitted its own head; a unit constant on
    the training images (a dead ReLU) kept its random start, folded by 1 / 1e-6 into a weight that swamped the logits
    wherever a test image woke it."""
    data = load_dataset("digits", "train").subset(torch.arange(200))
    heads = []
    for rank_seed in (0, 1):
        torch.manual_seed(0)
        model = build_model("small_cnn", "digits", width=8).eval()
        bn = model.net.features[10]
        with torch.no_grad():
            bn.weight[3], bn.bias[3] = 0.0, -1.0  # feature 3 is ReLU(-1) = 0 on every image
        torch.manual_seed(rank_seed)  # the trainer seeds the global RNG with seed + rank
        linear_probe(model, data, epochs=5, lr=0.1, batch_size=64)
        heads.append((model.net.linear.weight.detach().clone(), model.net.linear.bias.detach().clone()))
    assert torch.equal(heads[0][0], heads[1][0]) and torch.equal(heads[0][1], heads[1][1])
    assert torch.all(heads[0][0][:, 3] == 0)
    x = data.float_images(slice(0, 32))
    with torch.no_grad():
        before = model(x)
        bn.bias[3] = 5.0  # the unit wakes on new images: the head does not see it
        assert torch.allclose(model(x), before)


def test_the_probe_settings_keep_their_types_from_the_recipe_config():
    """A probe seed or feature batch size read as a float failed in linear_probe, after the whole pre-training."""
    from omegaconf import OmegaConf

    from training.recipes import _simclr_kwargs

    train = load_dataset("digits", "train")
    probe = _simclr_kwargs(OmegaConf.create({"probe": {"epochs": 2, "batch_size": 32, "seed": 3, "feature_batch_size": 64, "lr": 1}}), train)["probe"]
    assert probe == {"epochs": 2, "batch_size": 32, "seed": 3, "feature_batch_size": 64, "lr": 1.0}
    assert all(type(probe[k]) is int for k in ("epochs", "batch_size", "seed", "feature_batch_size")) and type(probe["lr"]) is float
