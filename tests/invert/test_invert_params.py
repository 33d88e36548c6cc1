"""Parametrisations: exact round trips, feasibility after projection, gradients flow."""
from __future__ import annotations

import pytest
import torch

from invert.params import PARAMETRIZATIONS, Fourier, Pixel, clamp_stops_gradient_at_bounds, make_parametrization


@pytest.mark.parametrize("name", sorted(PARAMETRIZATIONS))
def test_round_trip_returns_the_image(name):
    x = torch.rand(2, 3, 8, 7)  # odd width: the Fourier map must remember the size
    parametrization = make_parametrization(name)
    param = parametrization.from_image(x)
    torch.testing.assert_close(parametrization.to_image(param), x, atol=2e-4, rtol=0)


@pytest.mark.parametrize("name", sorted(PARAMETRIZATIONS))
def test_projection_keeps_images_in_range_and_gradients_flow(name):
    parametrization = make_parametrization(name)
    param = parametrization.from_image(torch.rand(2, 3, 8, 8))
    moved = parametrization.project(param + 3 * torch.randn_like(param))
    image = parametrization.to_image(moved)
    assert image.min() >= -1e-6 and image.max() <= 1 + 1e-6
    leaf = moved.detach().requires_grad_(True)
    parametrization.to_image(leaf).sum().backward()
    assert leaf.grad.abs().sum() > 0


def test_pixels_on_the_bounds_get_no_gradient_like_the_reference():
    param = torch.tensor([0.0, 0.3, 1.0, 0.7]).view(1, 1, 2, 2).requires_grad_(True)
    Pixel(stop_at_bounds=True).to_image(param).sum().backward()
    assert param.grad.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    plain = param.detach().clone().requires_grad_(True)
    Pixel().to_image(plain).sum().backward()  # the default: plain gradients
    assert plain.grad.flatten().tolist() == [1.0, 1.0, 1.0, 1.0]
    assert make_parametrization("pixel", stop_at_bounds=True).stop_at_bounds


def test_the_probed_setting_gives_the_gradient_of_a_clamped_input():
    """robustness clamps its input inside the model: the gradient at the bounds is whatever this torch's clamp gives
    (1 from 2018 to 2026, 0 since). Pixel(stop_at_bounds=probe) must give the same gradient under any torch."""
    image = torch.tensor([0.0, 0.3, 1.0, 0.7]).view(1, 1, 2, 2)
    weights = torch.tensor([2.0, -1.0, 3.0, 0.5]).view(1, 1, 2, 2)
    through_clamp = image.clone().requires_grad_(True)
    (through_clamp.clamp(0, 1) * weights).sum().backward()
    ours = image.clone().requires_grad_(True)
    (Pixel(stop_at_bounds=clamp_stops_gradient_at_bounds()).to_image(ours) * weights).sum().backward()
    assert torch.equal(ours.grad, through_clamp.grad)


def test_fourier_clamps_in_image_space_not_parameter_space():
    fourier = Fourier()
    x = torch.rand(1, 3, 8, 8)
    param = fourier.from_image(x)
    pushed = param + torch.randn_like(param)
    raw = fourier.to_image(pushed)
    assert raw.min() < 0 or raw.max() > 1  # the push left the box
    torch.testing.assert_close(fourier.to_image(fourier.project(pushed)), raw.clamp(0, 1), atol=1e-5, rtol=0)
    # An in-range image is a fixed point of the projection.
    torch.testing.assert_close(fourier.project(param), param, atol=1e-5, rtol=0)


def test_fourier_steps_favour_low_frequencies():
    fourier = Fourier()
    param = fourier.from_image(torch.full((1, 3, 16, 16), 0.5))
    kick = torch.zeros_like(param)
    kick[0, 0, 0, 0, 0] = 1.0  # DC
    dc = fourier.to_image(param + kick) - 0.5
    kick.zero_()
    kick[0, 0, 8, 8, 0] = 1.0  # the highest frequency
    high = fourier.to_image(param + kick) - 0.5
    assert dc.norm() > 5 * high.norm()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sigmoid_starts_white_and_black_pixels_at_finite_logits_with_gradient_in_half_precision(dtype):
    """1 - 1e-4 rounds to 1 in half precision: a white pixel started at logit inf and could never move."""
    sigmoid = make_parametrization("sigmoid")
    logits = sigmoid.from_image(torch.tensor([0.0, 0.5, 1.0], dtype=dtype).view(1, 1, 1, 3)).requires_grad_(True)
    (grad,) = torch.autograd.grad(sigmoid.to_image(logits).sum(), logits)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all() and (grad > 0).all()


def test_errors():
    with pytest.raises(ValueError, match="unknown parametrization 'wavelet'.*fourier.*pixel.*sigmoid"):
        make_parametrization("wavelet")
    with pytest.raises(RuntimeError, match="call from_image first"):
        Fourier().to_image(torch.zeros(1, 3, 4, 3, 2))
