"""Device augmentations: crops are crops, ranges hold, switches switch, bad strengths are refused."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.augment import SimCLRAugment, SupervisedAugment, color_jitter, random_crop_flip, random_resized_crop_flip


@pytest.fixture()
def uint8_batch():
    torch.manual_seed(0)
    return (torch.rand(6, 3, 32, 32) * 255).to(torch.uint8)


def test_crop_flip_returns_a_crop_of_the_padded_image_or_its_mirror(uint8_batch):
    out = random_crop_flip(uint8_batch, padding=4)
    assert out.dtype == torch.uint8 and out.shape == uint8_batch.shape
    padded = F.pad(uint8_batch, (4, 4, 4, 4))
    flips = 0
    for i in range(len(out)):
        crops = [padded[i, :, a:a + 32, b:b + 32] for a in range(9) for b in range(9)]
        plain = any(torch.equal(out[i], c) for c in crops)
        mirrored = any(torch.equal(out[i], c.flip(-1)) for c in crops)
        assert plain or mirrored
        flips += mirrored and not plain
    torch.manual_seed(1)
    no_flip = random_crop_flip(uint8_batch, padding=0, flip=False)
    assert torch.equal(no_flip, uint8_batch)


def test_supervised_augment_gives_floats_in_range_and_depends_on_the_seed(uint8_batch):
    augment = SupervisedAugment(crop_flip=True, color_jitter=0.25, rotation=2)
    torch.manual_seed(3)
    a = augment(uint8_batch)
    torch.manual_seed(3)
    b = augment(uint8_batch)
    c = augment(uint8_batch)
    assert a.dtype == torch.float32 and a.shape == (6, 3, 32, 32)
    assert a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_supervised_augment_off_is_the_identity(uint8_batch):
    out = SupervisedAugment(crop_flip=False, color_jitter=0, rotation=0)(uint8_batch)
    assert torch.equal(out, uint8_batch.float() / 255)


def test_zero_jitter_changes_nothing_and_jitter_changes_something():
    x = torch.rand(4, 3, 8, 8)
    assert torch.equal(color_jitter(x), x)
    assert not torch.allclose(color_jitter(x, 0.5, 0.5, 0.5, 0.1), x)


def test_full_resized_crop_without_flip_is_the_identity():
    x = torch.rand(3, 3, 16, 16)
    out = random_resized_crop_flip(x, 16, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
    assert torch.allclose(out, x, atol=1e-6)


@pytest.mark.parametrize("height, width, aspect", [(32, 64, 1.0), (64, 32, 1.0), (32, 64, 0.75), (48, 48, 4 / 3)])
def test_a_resized_crop_has_the_pixel_aspect_and_area_it_drew_on_non_square_images(height, width, aspect):
    """The aspect ratio is drawn in pixels, as torchvision's: a square crop of a 32 x 64 image is square, not 2:1."""
    ys, xs = torch.meshgrid((torch.arange(height) + 0.5) / height, (torch.arange(width) + 0.5) / width, indexing="ij")
    coordinates = torch.stack([xs, ys, torch.zeros_like(xs)])[None].expand(8, 3, height, width)  # each pixel holds where it is
    out = random_resized_crop_flip(coordinates, 16, scale=(0.25, 0.25), ratio=(aspect, aspect), flip=False)
    # A linear ramp sampled bilinearly inside the image: 16 samples span 15/16 of the box.
    box_width = (out[:, 0].amax(dim=(1, 2)) - out[:, 0].amin(dim=(1, 2))) * width * 16 / 15
    box_height = (out[:, 1].amax(dim=(1, 2)) - out[:, 1].amin(dim=(1, 2))) * height * 16 / 15
    torch.testing.assert_close(box_width / box_height, torch.full((8,), aspect), rtol=1e-4, atol=0)
    torch.testing.assert_close(box_width * box_height, torch.full((8,), 0.25 * height * width), rtol=1e-4, atol=0)


def test_float_input_outside_the_unit_range_is_refused():
    with pytest.raises(ValueError, match=r"augmentation input.*\[0, 1\]"):
        SupervisedAugment()(torch.rand(2, 3, 8, 8) * 255)  # a forgotten / 255
    assert SupervisedAugment()(torch.rand(2, 3, 8, 8)).max() <= 1


def test_simclr_views_differ_and_stay_in_range(uint8_batch):
    augment = SimCLRAugment(32)
    v1, v2 = augment(uint8_batch), augment(uint8_batch)
    assert v1.shape == (6, 3, 32, 32) and v1.min() >= 0 and v1.max() <= 1
    assert not torch.allclose(v1, v2)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: SupervisedAugment(color_jitter=-0.1), "non-negative"),
        (lambda: SimCLRAugment(32, scale=(0.5, 0.2)), "crop scale"),
        (lambda: SimCLRAugment(32, jitter_p=1.5), "probability"),
        (lambda: SimCLRAugment(32, jitter_p=float("nan")), "probability"),
        (lambda: SimCLRAugment(32, scale=0.5), r"two numbers \[low, high\]"),
        (lambda: SimCLRAugment(32, strength=-0.5), "strength must be >= 0"),
        (lambda: SimCLRAugment(32, strength=float("nan")), "strength must be >= 0"),
        (lambda: SimCLRAugment(0), "positive number of pixels"),
    ],
)
def test_bad_augmentation_settings_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_rotation_by_a_quarter_turn_is_rot90(monkeypatch):
    import training.augment as augment

    x = torch.rand(2, 3, 8, 8)
    monkeypatch.setattr(augment, "_uniform", lambda n, low, high, like: torch.full((n,), 90.0))
    assert torch.equal(augment.random_rotation(x, 90), torch.rot90(x, 3, (2, 3)))
    monkeypatch.setattr(augment, "_uniform", lambda n, low, high, like: torch.zeros(n))
    assert torch.equal(augment.random_rotation(x, 2), x)
