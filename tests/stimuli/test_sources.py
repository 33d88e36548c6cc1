"""Targets and seeds: seeded, keyed per item (never by batch), and what the paper describes."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from stimuli import DEFAULT_GAUSSIANS, gaussian_targets, make_seeds, select_targets
from stimuli.sources import stream_seed


def test_select_targets_are_distinct_test_images_from_a_seeded_draw(digits):
    test, _ = digits
    targets = select_targets(test, 12, seed=3)
    index = targets.source_index
    assert len(targets) == 12 and len(set(index.tolist())) == 12
    assert torch.equal(targets.images, test.float_images(index))
    assert torch.equal(targets.labels, test.labels[index])
    assert targets.sources == ["digits"] * 12 and targets.split == "test"
    assert targets.class_name(0) == test.classes[int(test.labels[index[0]])]
    assert torch.equal(select_targets(test, 12, seed=3).source_index, index)
    assert not torch.equal(select_targets(test, 12, seed=4).source_index, index)


def test_fewer_targets_are_a_prefix_of_more(digits):
    test, _ = digits
    assert torch.equal(select_targets(test, 5, seed=0).source_index, select_targets(test, 40, seed=0).source_index[:5])


def test_select_targets_refuses_impossible_counts(digits):
    test, _ = digits
    with pytest.raises(ValueError, match=r"cannot draw 451 images from a data set of 450: use 1 <= n_targets <= 450"):
        select_targets(test, 451)
    with pytest.raises(ValueError, match="cannot draw 0"):
        select_targets(test, 0)


def test_gaussian_targets_alternate_between_the_configured_gaussians():
    gaussians = [{"name": "dark", "mean": 0.2, "std": 0.05}, {"name": "light", "mean": 0.8, "std": 0.05}]
    targets = gaussian_targets(6, (3, 8, 8), gaussians, seed=1)
    assert targets.sources == ["gaussian:dark", "gaussian:light"] * 3
    means = targets.images.mean(dim=(1, 2, 3))
    assert torch.allclose(means[0::2], torch.full((3,), 0.2), atol=0.02)
    assert torch.allclose(means[1::2], torch.full((3,), 0.8), atol=0.02)
    assert (targets.labels == -1).all() and (targets.source_index == -1).all()
    # Per-item keys: target k is the same in a draw of 2 and of 6.
    assert torch.equal(gaussian_targets(2, (3, 8, 8), gaussians, seed=1).images, targets.images[:2])


def test_default_gaussians_are_clamped_to_the_unit_range():
    targets = gaussian_targets(4, (3, 16, 16), DEFAULT_GAUSSIANS)
    assert targets.images.min() >= 0 and targets.images.max() <= 1
    assert (targets.images == 0).float().mean() > 0.3  # N(0, 1) clamped: about half black


def test_gaussian_targets_refuse_bad_specs():
    with pytest.raises(ValueError, match="lacks"):
        gaussian_targets(2, (3, 4, 4), [{"name": "x", "mean": 0.5}])
    with pytest.raises(ValueError, match="non-negative std, got mean=0.5 std=-1.0"):
        gaussian_targets(2, (3, 4, 4), [{"mean": 0.5, "std": -1}])
    with pytest.raises(ValueError, match=r"Gaussian 0 has unknown keys \['sd'\]"):
        gaussian_targets(2, (3, 4, 4), [{"mean": 0.5, "std": 1, "sd": 1}])
    with pytest.raises(ValueError, match="finite mean"):
        gaussian_targets(2, (3, 4, 4), [{"mean": float("nan"), "std": 1}])
    with pytest.raises(ValueError, match="mean and std must be numbers"):
        gaussian_targets(2, (3, 4, 4), [{"mean": "dark", "std": 1}])


def test_seeds_one_per_target_and_type_with_exact_constants(digits):
    test, train = digits
    targets = select_targets(test, 4, seed=0)
    seeds = make_seeds(targets, ["noise", "train", "gray", "black", "white"], seed=0, train_set=train)
    assert len(seeds) == 20
    for k in range(4):
        assert torch.equal(seeds.images[seeds.lookup[(k, "gray")]], torch.full((3, 32, 32), 0.5))
        assert torch.equal(seeds.images[seeds.lookup[(k, "black")]], torch.zeros(3, 32, 32))
        assert torch.equal(seeds.images[seeds.lookup[(k, "white")]], torch.ones(3, 32, 32))
        row = seeds.lookup[(k, "train")]
        assert seeds.targets[row] == k
        assert torch.equal(seeds.images[row], train.float_images([int(seeds.train_index[row])])[0])
        assert int(seeds.labels[row]) == int(train.labels[seeds.train_index[row]])
        noise = seeds.images[seeds.lookup[(k, "noise")]]
        assert noise.min() >= 0 and noise.max() <= 1 and noise.std() > 0.25  # uniform: std 0.289
    noises = [seeds.images[seeds.lookup[(k, "noise")]] for k in range(4)]
    assert not torch.equal(noises[0], noises[1])


def test_seeds_are_keyed_by_target_not_by_batch(digits):
    test, train = digits
    few = make_seeds(select_targets(test, 2, seed=0), ["noise", "train"], seed=7, train_set=train)
    many = make_seeds(select_targets(test, 9, seed=0), ["noise", "train"], seed=7, train_set=train)
    for k in range(2):
        for seed_type in ("noise", "train"):
            assert torch.equal(few.images[few.lookup[(k, seed_type)]], many.images[many.lookup[(k, seed_type)]])
    other = make_seeds(select_targets(test, 2, seed=0), ["noise"], seed=8)
    assert not torch.equal(other.images[0], few.images[few.lookup[(0, "noise")]])


def test_shared_noise_is_one_seed_for_every_target(digits):
    test, _ = digits
    seeds = make_seeds(select_targets(test, 5, seed=0), ["noise", "gray"], shared_noise=True)
    assert len(seeds) == 1 + 5
    shared = {seeds.lookup[(k, "noise")] for k in range(5)}
    assert len(shared) == 1 and seeds.targets[shared.pop()] is None


def test_noise_seeds_follow_the_targets_colour_space(digits):
    """auto: grey noise (identical channels) for the greyscale digits, colour noise for colour targets; the
    choice is recorded only when it is grey, so colour sets keep the fingerprint they had before the option."""
    test, _ = digits
    targets = select_targets(test, 3, seed=0)
    assert "noise_channels" not in make_seeds(targets, ["noise"], seed=0).params  # colour by default
    gray = make_seeds(targets, ["noise"], seed=0, noise_channels="auto")
    assert all(torch.equal(image[0], image[c]) for image in gray.images for c in (1, 2))
    assert gray.images.std() > 0.25 and gray.params["noise_channels"] == "gray"
    colour_targets = replace(targets, images=torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    colour = make_seeds(colour_targets, ["noise"], seed=0, noise_channels="auto")
    assert not torch.equal(colour.images[0, 0], colour.images[0, 1]) and "noise_channels" not in colour.params
    assert torch.equal(make_seeds(targets, ["noise"], seed=0, noise_channels="color").images, colour.images)
    assert torch.equal(make_seeds(colour_targets, ["noise"], seed=0, noise_channels="gray").images, gray.images)
    with pytest.raises(ValueError, match="unknown noise_channels 'grey'"):
        make_seeds(targets, ["noise"], noise_channels="grey")


def test_noise_kind_draws_the_authors_seed_distributions(digits):
    """super: N(0, 1) clamped (about half the pixels black, 16 % white); light: N(0, 0.01²) clamped, nearly
    black. The kind is recorded in the seeds' parameters (and so in the set's fingerprint)."""
    test, _ = digits
    targets = select_targets(test, 4, seed=0)
    uniform = make_seeds(targets, ["noise"], seed=0)
    assert uniform.params["noise"] == "uniform" and 0.45 < float(uniform.images.mean()) < 0.55
    super_noise = make_seeds(targets, ["noise"], seed=0, noise_kind="super")
    assert super_noise.params["noise"] == "super"
    assert 0.47 < float((super_noise.images == 0).float().mean()) < 0.53
    assert 0.14 < float((super_noise.images == 1).float().mean()) < 0.18
    light = make_seeds(targets, ["noise"], seed=0, noise_kind="light", noise_channels="gray")
    assert float(light.images.max()) < 0.06 and 0.45 < float((light.images == 0).float().mean()) < 0.55
    assert all(torch.equal(image[0], image[c]) for image in light.images for c in (1, 2))
    with pytest.raises(ValueError, match="unknown noise_kind 'pink'"):
        make_seeds(targets, ["noise"], noise_kind="pink")


def test_seed_errors_say_what_to_do(digits):
    test, _ = digits
    targets = select_targets(test, 2)
    with pytest.raises(ValueError, match="needs train_set"):
        make_seeds(targets, ["train"])
    with pytest.raises(ValueError, match="unknown seed types"):
        make_seeds(targets, ["noise", "pink"])
    with pytest.raises(ValueError, match="repeat"):
        make_seeds(targets, ["noise", "noise"])


def test_fractional_counts_and_seeds_are_refused(digits):
    test, _ = digits
    with pytest.raises(ValueError, match="n_targets must be a whole number, got 2.5"):  # a bare slicing TypeError
        select_targets(test, 2.5)
    with pytest.raises(ValueError, match="seed must be a whole number, got 1.5"):  # drew what seed=1 draws, named apart
        select_targets(test, 2, seed=1.5)
    assert stream_seed(1.0, "targets") == stream_seed(1, "targets")


def test_stream_seeds_separate_purposes():
    assert stream_seed(0, "targets") != stream_seed(0, "noise_seeds") != stream_seed(1, "noise_seeds")
    assert stream_seed(5, "x") == stream_seed(5, "x") < 2**31


def test_keyed_generators_depend_on_seed_purpose_and_item_and_never_collide_within_a_purpose():
    from stimuli.sources import keyed_generator

    first = lambda *key: torch.rand(4, generator=keyed_generator(*key))  # noqa: E731
    assert torch.equal(first(0, "noise_seeds", 3), first(0, "noise_seeds", 3))
    for other in [(1, "noise_seeds", 3), (0, "train_seeds", 3), (0, "noise_seeds", 4)]:
        assert not torch.equal(first(0, "noise_seeds", 3), first(*other))
    seeds = {keyed_generator(0, "noise_seeds", k).initial_seed() for k in range(20000)}
    assert len(seeds) == 20000 and max(seeds) < 2**32  # all of it survives mt19937's 32-bit seeding
