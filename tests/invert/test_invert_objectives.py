"""Objectives: values, per-item indexing, reproducible randomness, and their error messages."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from invert.objectives import (
    ClassControversialLoss,
    ControversialLoss,
    Distance,
    InversionLoss,
    LpPrior,
    TotalVariation,
    TransformRobust,
    TwoWayControversialLoss,
)
from invert.rng import hashed_uniform, noise_images


def test_inversion_loss_of_a_target_against_itself_is_zero(tiny_representation, wave_images):
    targets = wave_images(4)
    loss = InversionLoss(tiny_representation(), targets)
    assert torch.equal(loss(targets), torch.zeros(4))
    others = noise_images(4, (3, 16, 16))
    assert (loss(others) > 0.05).all()


def test_inversion_loss_is_the_normalised_distance_and_indexes_items(tiny_representation, wave_images):
    rep = tiny_representation()
    targets, x = wave_images(5), noise_images(5, (3, 16, 16))
    loss = InversionLoss(rep, targets)
    with torch.no_grad():
        expected = (rep(x) - rep(targets)).norm(dim=1) / rep(targets).norm(dim=1)
    torch.testing.assert_close(loss(x), expected)
    items = torch.tensor([3, 0])
    torch.testing.assert_close(loss(x[items], items), expected[items])
    from_features = InversionLoss.from_features(rep, rep(targets).detach())
    torch.testing.assert_close(from_features(x), expected)


def test_precomputed_target_features_that_cannot_be_right_are_refused_before_a_step(tiny_representation, wave_images):
    """Features of another width broadcast into a loss that meant nothing, 1-D ones gave an IndexError, and NaN ones
    ran a step before an error that blamed the objective, the seeds or the step size."""
    rep = tiny_representation()
    targets, x = wave_images(4), noise_images(4, (3, 16, 16))
    features = rep(targets).detach()
    with pytest.raises(ValueError, match=r"gives \d+ features per image but the targets have 1: .*same representation"):
        InversionLoss.from_features(rep, features[:, :1])(x)
    with pytest.raises(ValueError, match=r"shape \(N, \.\.\.\).*got \(\d+,\).*features\[None\]"):
        InversionLoss.from_features(rep, features[0])
    with pytest.raises(ValueError, match="floating point"):
        InversionLoss.from_features(rep, features.long())
    broken = features.clone()
    broken[2, 1] = float("nan")
    broken[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or Inf for 2 item\(s\) \[2, 3\]"):
        InversionLoss.from_features(rep, broken)


def test_inversion_loss_computes_targets_in_eval_mode(wave_images):
    torch.manual_seed(0)
    rep = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten()).train()
    targets = wave_images(3)
    loss = InversionLoss(rep, targets)
    assert rep.training  # restored
    rep.eval()
    assert torch.allclose(loss(targets), torch.zeros(3), atol=1e-6)


def test_controversial_loss_is_eq2_for_representations_and_distances(tiny_representation, wave_images):
    g1, g2 = tiny_representation(0), tiny_representation(1)
    origins, x = wave_images(3), noise_images(3, (3, 16, 16))
    loss = ControversialLoss(g1, g2, origins, lam=0.3)
    assert torch.equal(loss(origins), torch.zeros(3))
    expected = InversionLoss(g1, origins)(x) - 0.3 * InversionLoss(g2, origins)(x)
    torch.testing.assert_close(loss(x), expected)

    def pixel_distance(a, b):
        return (a - b).flatten(1).norm(dim=1)

    with_distance = ControversialLoss(g1, Distance(pixel_distance), origins, lam=0.3)
    expected = InversionLoss(g1, origins)(x) - 0.3 * pixel_distance(x, origins)
    torch.testing.assert_close(with_distance(x), expected)
    torch.testing.assert_close(with_distance(x[[2]], torch.tensor([2])), expected[[2]])
    with pytest.raises(TypeError, match=r"g2 must be a representation \(nn.Module\) or a Distance\(fn\)"):
        ControversialLoss(g1, "lpips", origins)


def test_class_controversial_loss_is_the_negative_smooth_minimum(tiny_classifier):
    m1, m2 = tiny_classifier(0), tiny_classifier(1)
    x = noise_images(4, (3, 16, 16))
    loss = ClassControversialLoss(m1, m2, class1=[0, 1, 2, 0], class2=2, alpha=100.0)
    with torch.no_grad():
        logp1 = m1(x).log_softmax(1)[torch.arange(4), torch.tensor([0, 1, 2, 0])]
        logp2 = m2(x).log_softmax(1)[:, 2]
        values = torch.stack([logp1, logp2], 1)
    expected = torch.logsumexp(-100.0 * values, 1) / 100.0
    torch.testing.assert_close(loss(x), expected)
    # A smooth minimum: close to (and at most log(2)/alpha above) the hard one, negated.
    assert ((loss(x) + values.min(1).values).abs() <= torch.log(torch.tensor(2.0)) / 100 + 1e-6).all()
    torch.testing.assert_close(loss(x[[1, 3]], torch.tensor([1, 3])), expected[[1, 3]])


def test_total_variation_counts_every_neighbour_difference_once():
    """At beta 2 the authors' TVLoss (full difference arrays) over C*H*W; the crop to pixels with both neighbours left the
    last row and column half-penalised and the corner pixel free."""
    x = torch.rand(2, 3, 7, 5, dtype=torch.float64)
    authors = ((x[..., 1:, :] - x[..., :-1, :]) ** 2).sum((1, 2, 3)) + ((x[..., :, 1:] - x[..., :, :-1]) ** 2).sum((1, 2, 3))
    torch.testing.assert_close(TotalVariation(1.0)(x).double(), authors / (3 * 7 * 5))
    stripes = torch.tensor([0.0, 1.0, 0.0, 1.0])
    top, bottom = torch.zeros(2, 1, 4, 4), torch.zeros(2, 1, 4, 4)
    top[..., 0, :], bottom[..., -1, :] = stripes, stripes
    torch.testing.assert_close(TotalVariation(1.0)(top), TotalVariation(1.0)(bottom))
    corner = torch.rand(1, 3, 6, 6, requires_grad=True)
    (grad,) = torch.autograd.grad(TotalVariation(1.0)(corner).sum(), corner)
    assert (grad[0, :, -1, -1] != 0).all()
    assert torch.isfinite(TotalVariation(1.0)(torch.rand(1, 3, 1, 8))).all()  # one row: NaN before


def test_total_variation_equals_the_replicated_edge_and_its_backward_has_no_replicate_pad():
    """The replicate pad's CUDA backward sums with atomic adds (not deterministic); padding the differences with zeros
    gives the same values (bit for bit) and gradients, with a backward that is a slice."""
    x = torch.rand(2, 3, 7, 5, requires_grad=True)
    for beta in (2.0, 1.0):
        edged = F.pad(x, (0, 1, 0, 1), mode="replicate")
        squared = (edged[..., :-1, 1:] - x) ** 2 + (edged[..., 1:, :-1] - x) ** 2
        replicated = (squared if beta == 2.0 else (squared + 1e-8) ** (beta / 2)).mean(dim=(1, 2, 3))
        loss = TotalVariation(1.0, beta=beta)(x)
        assert torch.equal(loss, replicated)
        # equal up to rounding: the replicated edge's gradient is +g - g summed, here it is left out
        torch.testing.assert_close(torch.autograd.grad(loss.sum(), x)[0], torch.autograd.grad(replicated.sum(), x)[0], rtol=1e-6, atol=1e-9)
    seen, stack = set(), [TotalVariation(1.0)(x).sum().grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    assert not [type(node).__name__ for node in seen if "Replication" in type(node).__name__]


@pytest.mark.gpu
def test_total_variation_backward_is_deterministic_on_cuda():
    x = torch.rand(4, 3, 32, 32, device="cuda", requires_grad=True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # raised for replication_pad2d_backward_cuda
    try:
        grads = [torch.autograd.grad(TotalVariation(1.0)(x).sum(), x)[0] for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(*grads)


def test_priors():
    flat = torch.full((2, 3, 8, 8), 0.3)
    noise = torch.rand(2, 3, 8, 8)
    assert torch.equal(TotalVariation(1.0)(flat), torch.zeros(2))
    assert (TotalVariation(1.0)(noise) > 0).all()
    assert torch.allclose(TotalVariation(1.0, beta=1.0)(flat), torch.zeros(2), atol=1e-3)
    assert torch.equal(LpPrior(1.0, 6.0)(torch.full((2, 3, 8, 8), 0.5)), torch.zeros(2))
    torch.testing.assert_close(LpPrior(2.0, 2.0)(flat), torch.full((2,), 2 * 0.2**2))
    with pytest.raises(ValueError, match="p must be a finite number >= 1"):  # |t|^0.5 has an infinite slope at mid-grey: NaN gradients
        LpPrior(1.0, 0.5)


@pytest.mark.parametrize("build,match", [
    # Used directly (InversionLoss(...) + TotalVariation(w)), the priors and the transformations took these without a word:
    (lambda: TotalVariation(-1e-3), r"weight must be a finite number >= 0 \(a negative prior weight rewards rough"),
    (lambda: TotalVariation(float("nan")), "weight must be a finite number >= 0"),  # a NaN loss blamed on the objective
    (lambda: TotalVariation(1.0, beta=0), "beta must be a positive finite number, got 0"),  # (0 + 1e-8) ** 0: a constant
    (lambda: TotalVariation("1e-3"), "weight must be a finite number >= 0.*got '1e-3'"),
    (lambda: LpPrior(-1.0), "weight must be a finite number >= 0"),
    (lambda: LpPrior(1.0, float("inf")), "p must be a finite number >= 1"),
    (lambda: TransformRobust(TotalVariation(), samples=1.5), "samples must be a whole number >= 1, got 1.5"),
    (lambda: TransformRobust(TotalVariation(), jitter=(8,)), r"jitter must be two shifts in pixels .*got \(8,\)"),
    (lambda: TransformRobust(TotalVariation(), jitter=(-2, 4)), "jitter must be a whole number >= 0 pixels, got -2"),
    (lambda: TransformRobust(TotalVariation(), jitter=(2.5, 4)), "jitter must be a whole number >= 0 pixels, got 2.5"),
    (lambda: TransformRobust(TotalVariation(), scales=()), "scales and angles must each list at least one choice"),
    (lambda: TransformRobust(TotalVariation(), scales=(1.0, 0.0)), "scales must be a positive finite number, got 0.0"),
    (lambda: TransformRobust(TotalVariation(), angles=(float("nan"),)), "angles must be a finite number, got nan"),
    (lambda: TransformRobust(TotalVariation(), padding_mode="reflect"), "unknown padding_mode 'reflect': use one of"),
    (lambda: TransformRobust(TotalVariation(), item_offset=1.5), "item_offset must be a whole number >= 0, got 1.5"),
    (lambda: TransformRobust(TotalVariation(), seed="0"), "seed must be a whole number, got '0'"),
])
def test_priors_and_transformations_refuse_settings_they_cannot_use(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_the_engine_puts_priors_on_the_image_and_transformations_on_the_representation_term_only():
    """deep-learning-base warps only its representation losses' input ("regularization must be applied to the original
    image"); a prior on warped copies would see a blurred image (a third of its total variation, measured)."""
    from invert import Objective, invert_batch

    class Zero(Objective):
        def forward(self, x, items=None, step=0):
            return x.new_zeros(x.shape[0])

    x = noise_images(4, (3, 16, 16), seed=3)
    result = invert_batch(Zero(), x, steps=0, tv_weight=1.0, lp_weight=0.5, transform_robust=True, transform_samples=4, progress=False)
    torch.testing.assert_close(result.initial_loss, TotalVariation(1.0)(x) + LpPrior(0.5)(x))


def test_objectives_add(tiny_representation, wave_images):
    targets = wave_images(2)
    inversion = InversionLoss(tiny_representation(), targets)
    total = inversion + TotalVariation(0.5) + LpPrior(0.1, 2.0)
    assert len(total.terms) == 3
    x = noise_images(2, (3, 16, 16))
    torch.testing.assert_close(total(x), inversion(x) + TotalVariation(0.5)(x) + LpPrior(0.1, 2.0)(x))


def test_transform_robust_is_reproducible_per_item_and_changes_with_the_step(tiny_representation, wave_images):
    targets = wave_images(4)
    robust = TransformRobust(InversionLoss(tiny_representation(), targets), samples=3, seed=7)
    x = noise_images(4, (3, 16, 16))
    full = robust(x, step=5)
    alone = robust(x[[2]], torch.tensor([2]), step=5)
    torch.testing.assert_close(alone, full[[2]])  # batch composition does not matter
    torch.testing.assert_close(robust(x, step=torch.tensor(5)), full)
    assert not torch.allclose(robust(x, step=6), full)  # new draws every step
    assert not torch.allclose(TransformRobust(robust.objective, samples=3, seed=8)(x, step=5), full)
    assert robust(targets, step=5).abs().max() > 0  # transformed targets no longer match exactly


def test_transform_robust_with_identity_transforms_is_the_objective(tiny_representation, wave_images):
    inversion = InversionLoss(tiny_representation(), wave_images(3))
    identity = TransformRobust(inversion, samples=2, jitter=(0, 0), scales=(1.0,), angles=(0.0,))
    x = noise_images(3, (3, 16, 16))
    torch.testing.assert_close(identity(x), inversion(x), atol=1e-5, rtol=1e-5)


def test_transform_draws_follow_the_authors_ranges():
    robust = TransformRobust(TotalVariation(), samples=1)
    matrices = robust.transforms(torch.arange(2000), 0, 32, 32)
    linear = matrices[:, :, :2]
    scale = torch.linalg.det(linear).sqrt()
    assert scale.min() >= 0.9 - 1e-5 and scale.max() <= 1.1 + 1e-5
    angle = torch.rad2deg(torch.atan2(linear[:, 1, 0], linear[:, 0, 0])).abs()
    assert angle.max() <= 10 + 1e-3
    assert (angle < 1e-3).float().mean() > 0.2  # 0 degrees is six times as likely as any other angle


def test_hashed_uniform_is_batch_independent():
    full = hashed_uniform(3, torch.arange(10), 4, 5)
    assert full.min() >= 0 and full.max() < 1
    torch.testing.assert_close(hashed_uniform(3, torch.tensor([7, 2]), torch.tensor(4), 5), full[[7, 2]])
    assert not torch.allclose(hashed_uniform(3, torch.arange(10), 5, 5), full)


def test_noise_seeds_depend_on_the_base_seed_and_the_item_only():
    images = noise_images(5, (3, 4, 4), seed=3)
    torch.testing.assert_close(noise_images(2, (3, 4, 4), seed=3, first_item=3), images[3:])
    assert not torch.equal(noise_images(5, (3, 4, 4), seed=4), images)  # the CPU generator keeps 32 bits only
    assert len({tuple(image.flatten()[:4].tolist()) for image in images}) == 5
    gaussian = noise_images(200, (3, 4, 4), kind="gaussian")
    assert gaussian.min() >= 0 and gaussian.max() <= 1 and abs(gaussian.mean().item() - 0.5) < 0.01
    light = noise_images(200, (3, 4, 4), kind="light")
    assert light.max() < 0.06 and abs((light == 0).float().mean().item() - 0.5) < 0.05  # the authors' light-noise
    with pytest.raises(ValueError, match="unknown noise kind 'pink'"):
        noise_images(1, (3, 4, 4), kind="pink")


def test_error_messages(tiny_representation, wave_images):
    rep = tiny_representation()
    with pytest.raises(TypeError, match="uint8.*images.float\\(\\) / 255"):
        InversionLoss(rep, (wave_images(2) * 255).to(torch.uint8))
    with pytest.raises(ValueError, match="must lie in \\[0, 1\\].*divide by 255"):
        InversionLoss(rep, wave_images(2) * 255)
    with pytest.raises(ValueError, match="must be 4-D.*unsqueeze"):
        InversionLoss(rep, wave_images(1)[0])
    with pytest.raises(ValueError, match="exactly one of targets"):
        InversionLoss(rep)
    loss = InversionLoss(rep, wave_images(3))
    with pytest.raises(ValueError, match="the batch has 2 rows but the objective holds 3 targets; pass items="):
        loss(wave_images(2))
    with pytest.raises(ValueError, match="samples must be a whole number >= 1"):
        TransformRobust(loss, samples=0)


def test_controversial_weights_that_reverse_the_objective_are_refused(tiny_representation, tiny_classifier, wave_images):
    """A negative lambda pulls model 2 towards the origin (Eq. 2 pushes it away); alpha <= 0 is no smooth minimum."""
    rep, origins = tiny_representation(), wave_images(2)
    for lam in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lambda .* must be a finite number >= 0"):
            ControversialLoss(rep, rep, origins, lam=lam)
        with pytest.raises(ValueError, match="lambda .* must be a finite number >= 0"):
            TwoWayControversialLoss(rep, rep, origins, torch.tensor([True, False]), lam=lam)
    assert ControversialLoss(rep, rep, origins, lam=0).lam == 0.0
    model = tiny_classifier()
    for alpha in (0, -10, float("inf")):
        with pytest.raises(ValueError, match="alpha .* must be a finite number > 0"):
            ClassControversialLoss(model, model, 0, 1, alpha=alpha)


def test_class_labels_that_are_not_whole_numbers_are_refused(tiny_classifier):
    """torch.as_tensor(..., dtype=long) read the classes [0.9, 2.7] as [0, 2] without a word."""
    model = tiny_classifier()
    with pytest.raises(ValueError, match=r"class1 must be whole class indices, got torch.float32 values \[0.9"):
        ClassControversialLoss(model, model, [0.9, 2.7], [1, 0])
    with pytest.raises(ValueError, match="class2 must be whole class indices, got torch.bool"):
        ClassControversialLoss(model, model, [0, 2], [True, False])
    loss = ClassControversialLoss(model, model, torch.tensor([0, 2], dtype=torch.int32), [1, 0])
    assert loss.class1.dtype == torch.long and loss.class1.tolist() == [0, 2]


def test_seeded_rng_seeds_only_the_generators_it_restores(monkeypatch):
    """torch.manual_seed inside fork_rng(devices=[]) reseeded every CUDA generator and restored none: an observer built
    with seed 0 left the process's CUDA draws at seed 0. seeded_rng touches the CPU generator (and one given CUDA
    device's) only, and restores it."""
    from invert import seeded_rng

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    reseeded_all = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded_all.append(seed))
    with seeded_rng(7):
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected)  # the draws after the block are those without it
    with seeded_rng(7, "cpu"):
        assert torch.equal(torch.rand(3), inside)  # the same seed, the same draws
    assert reseeded_all == []


def test_transform_robust_samples_the_input_at_the_documented_map():
    """The docstring's map, s R (q + t1 - c) + c + t2 from an output pixel q to where it samples the input: with scale 2,
    no rotation and only the first shift, an output column q samples x = 2 (q + t1 - c) + c."""
    from invert import Objective

    class Grab(Objective):
        def forward(self, x, items=None, step=0):
            self.seen = x.detach()
            return x.flatten(1).sum(1)

    size, centre = 33, 16
    columns = (torch.arange(size, dtype=torch.float32) / (size - 1)).expand(1, 1, size, size).clone()  # value = source x / 32
    grab = Grab()
    warp = TransformRobust(grab, samples=1, jitter=(4, 0), scales=(2.0,), angles=(0.0,), seed=0)
    shift = warp.transforms(torch.tensor([0]), 0, size, size)[0, 0, 2] - (centre - 2 * centre)  # b = 2 (t1 - c) + c
    t1 = float(shift) / 2
    warp(columns, torch.tensor([0]), 0)
    sampled = grab.seen[0, 0, centre] * (size - 1)
    for q in (12, 14, 16):
        assert float(sampled[q]) == pytest.approx(2 * (q + t1 - centre) + centre, abs=1e-3)
