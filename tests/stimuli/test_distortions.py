"""Distortion conditions against direct numpy/scipy/skimage references, determinism, and condition sets on disk."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy.ndimage import gaussian_filter
from skimage.color import lab2rgb, rgb2gray, rgb2lab

from invert.rng import hashed_uniform
from stimuli import distortions as C
from stimuli.distortions import MVH_GREY, Distortion, parse_conditions


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """Five small colour images with structure (smooth ramps plus noise), in [0, 1]."""
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 16), torch.linspace(0, 1, 16), indexing="ij")
    base = torch.stack([yy, xx, (yy + xx) / 2])
    return (0.6 * base + 0.4 * torch.rand(5, 3, 16, 16, generator=g)).clamp(0, 1)


IDS = torch.tensor([3, 17, 4, 99, 250])


def grey_np(images: torch.Tensor) -> np.ndarray:
    """(N, H, W) float64 greyscale with skimage's rgb2gray (the reference code's conversion)."""
    return np.stack([rgb2gray(im.permute(1, 2, 0).double().numpy()) for im in images])


def channels_equal(out: torch.Tensor) -> bool:
    return bool(torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2]))


def test_greyscale_matches_skimage(images):
    out = C.to_greyscale(images)
    assert channels_equal(out)
    np.testing.assert_allclose(out[:, 0].double().numpy(), grey_np(images), atol=1e-6)


@pytest.mark.parametrize("contrast", [1.0, 0.3, 0.01])
def test_contrast_matches_reference(images, contrast):
    out = Distortion("contrast", contrast)(images, IDS)
    expected = (1 - contrast) / 2 + contrast * grey_np(images)
    np.testing.assert_allclose(out[:, 0].double().numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("sigma_224", [1, 15, 40])
def test_low_pass_matches_scipy_with_constant_padding(images, sigma_224):
    distortion = Distortion("low_pass", sigma_224)
    sigma = sigma_224 * 16 / 224  # the grid is given for 224 px images
    assert distortion.pixel_sigma(16) == pytest.approx(sigma)
    out = distortion(images, IDS)
    expected = np.clip([gaussian_filter(g, sigma, mode="constant", cval=0.4423) for g in grey_np(images)], 0, 1)
    assert channels_equal(out)
    np.testing.assert_allclose(out[:, 0].double().numpy(), expected, atol=1e-5)


def test_blur_on_pixel_sigmas_larger_than_the_image(images):
    out = C.gaussian_blur(images[:, :1].double(), 20.0)  # kernel radius 80 px on a 16 px image
    expected = [gaussian_filter(g, 20.0, mode="constant", cval=MVH_GREY) for g in images[:, 0].double().numpy()]
    np.testing.assert_allclose(out[:, 0].numpy(), expected, atol=1e-10)
    with pytest.raises(TypeError, match="uint8"):  # the kernel rounded to zeros: an all-black image, no error
        C.gaussian_blur((images * 255).to(torch.uint8), 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        C.gaussian_blur(images * 255, 1.0)
    with pytest.raises(ValueError, match="no images to distort"):
        C.apply_batched(Distortion("low_pass", 1), images[:0], IDS[:0], seed=0)


@pytest.mark.parametrize("sigma_224", [3, 0.45])
def test_high_pass_matches_reference(images, sigma_224):
    out = Distortion("high_pass", sigma_224)(images, IDS)
    sigma = sigma_224 * 16 / 224
    expected = []
    for g in grey_np(images):
        detail = g - gaussian_filter(g, sigma, mode="constant", cval=0.4423)
        expected.append(np.clip(detail + (0.4423 - detail.mean()), 0, 1))
    np.testing.assert_allclose(out[:, 0].double().numpy(), np.array(expected), atol=1e-5)


def test_high_pass_infinite_sigma_is_the_original_greyscale_image(images):
    """The benchmark's 'inf (original image)' (Geirhos et al. 2018), like low_pass=0: not x − mean(x) + 0.4423."""
    out = Distortion("high_pass", "inf")(images, IDS)
    np.testing.assert_array_equal(out[:, 0].numpy(), Distortion("low_pass", 0)(images, IDS)[:, 0].numpy())
    np.testing.assert_allclose(out[:, 0].double().numpy(), grey_np(images), atol=1e-6)
    assert torch.equal(C.high_pass(images, math.inf), images)


def test_uniform_noise_matches_reference_and_is_keyed_by_image_not_batch(images):
    width, seed = 0.2, 7
    out = Distortion("uniform_noise", width)(images, IDS, seed=seed)
    u = hashed_uniform(seed, IDS, C._salt("uniform_noise"), 16 * 16).double().numpy().reshape(5, 16, 16)
    expected = np.clip(0.35 + 0.3 * grey_np(images) + (2 * u - 1) * width, 0, 1)
    np.testing.assert_allclose(out[:, 0].double().numpy(), expected, atol=1e-6)
    assert channels_equal(out)
    # the same image with the same id gets the same noise, alone or in any batch; another seed differs
    alone = Distortion("uniform_noise", width)(images[2:3], IDS[2:3], seed=seed)
    assert torch.equal(alone, out[2:3])
    assert not torch.equal(Distortion("uniform_noise", width)(images, IDS, seed=seed + 1), out)


def test_phase_shift_field_is_odd_bounded_and_zero_where_self_conjugate():
    for h, w in ((8, 8), (7, 6)):
        shifts = C.phase_shift_field(h, w, 90, image_ids=torch.tensor([1, 2]), seed=0)
        ky, kx = C.conjugate_index(h, w)
        assert torch.allclose(shifts, -shifts[:, ky, kx])
        assert shifts.abs().max() <= math.pi / 2 and shifts.abs().max() > 1.0
        self_conjugate = (ky == torch.arange(h).view(-1, 1)) & (kx == torch.arange(w).view(1, -1))
        assert (shifts[:, self_conjugate] == 0).all() and self_conjugate[0, 0]


@pytest.mark.parametrize("size", [16, 15])
def test_phase_noise_matches_numpy_fft_keeps_amplitude_and_stays_real(images, size):
    x = images[:, :, :size, :size]
    width, seed = 120, 3
    unclipped = C.phase_noise(x, width, image_ids=IDS, seed=seed, clip=False).double().numpy()
    shifts = C.phase_shift_field(size, size, width, image_ids=IDS, seed=seed).double().numpy()
    spectrum = np.fft.fft2(x.double().numpy())
    reference = np.fft.ifft2(spectrum * np.exp(1j * shifts)[:, None])
    assert np.abs(reference.imag).max() < 1e-12  # Hermitian symmetry kept: the image stays real
    np.testing.assert_allclose(unclipped, reference.real, atol=1e-5)
    np.testing.assert_allclose(np.abs(np.fft.fft2(unclipped)), np.abs(spectrum), atol=1e-3)
    assert np.abs(unclipped - x.double().numpy()).max() > 0.05  # it did change the image
    clipped = Distortion("phase_noise", width)(x, IDS, seed=seed)
    assert clipped.min() >= 0 and clipped.max() <= 1 and channels_equal(clipped)


def test_phase_noise_zero_width_is_identity(images):
    out = C.phase_noise(images, 0, image_ids=IDS, seed=0)
    torch.testing.assert_close(out, images, atol=1e-5, rtol=0)


def test_power_equalisation_matches_numpy_reference(images):
    distortion = Distortion("power_equalisation", "equalised").fit(images)
    out = distortion(images, IDS)
    g = grey_np(images)
    mean_amplitude = np.abs(np.fft.fft2(g)).mean(0)
    unclipped = np.fft.ifft2(mean_amplitude * np.exp(1j * np.angle(np.fft.fft2(g)))).real
    np.testing.assert_allclose(out[:, 0].double().numpy(), np.clip(unclipped, 0, 1), atol=1e-5)
    raw = C.power_equalisation(C.to_greyscale(images), distortion.amplitude, clip=False)
    np.testing.assert_allclose(np.abs(np.fft.fft2(raw[:, 0].double().numpy())), np.broadcast_to(mean_amplitude, g.shape), atol=1e-3)
    assert torch.equal(Distortion("power_equalisation", "original")(images, IDS), C.to_greyscale(images))
    with pytest.raises(RuntimeError, match="fit"):
        Distortion("power_equalisation", "equalised")(images, IDS)


@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_rotation_matches_numpy_rot90(images, degrees):
    out = Distortion("rotation", degrees)(images, IDS)
    expected = np.rot90(grey_np(images), degrees // 90, axes=(1, 2))
    np.testing.assert_allclose(out[:, 0].double().numpy(), expected, atol=1e-6)


def test_opponent_colour_matches_skimage_lab(images):
    out = Distortion("opponent_colour", "opponent")(images, IDS)
    for image, result in zip(images, out):
        lab = rgb2lab(image.permute(1, 2, 0).double().numpy())
        lab[..., 1:] *= -1
        expected = np.clip(lab2rgb(lab), 0, 1)
        np.testing.assert_allclose(result.permute(1, 2, 0).double().numpy(), expected, atol=2e-3)
    assert torch.equal(Distortion("opponent_colour", "true")(images, IDS), images)
    # a YAML config's `params: [true, opponent]` gives the bool True
    yaml = OmegaConf.to_container(OmegaConf.create("- {generator: opponent_colour, params: [true, opponent]}"))
    assert [d.name for d in parse_conditions(yaml)] == ["opponent_colour=true", "opponent_colour=opponent"]


def test_colour_condition_keeps_colour_or_converts_to_greyscale(images):
    assert torch.equal(Distortion("colour", "colour")(images, IDS), images)
    assert torch.equal(Distortion("colour", "greyscale")(images, IDS), C.to_greyscale(images))


def test_every_grid_condition_gives_valid_images_of_the_same_shape(images):
    for distortion in parse_conditions(sorted(C.GENERATORS)):
        out = distortion.fit(images)(images, IDS, seed=1)
        assert out.shape == images.shape and out.dtype == images.dtype, distortion.name
        assert out.min() >= 0 and out.max() <= 1, distortion.name


def test_parse_conditions_grids_names_and_errors():
    names = [d.name for d in parse_conditions(["contrast", "low_pass=40", {"generator": "rotation", "params": [90]}])]
    assert names[:8] == [f"contrast={v}" for v in ("1", "0.5", "0.3", "0.15", "0.1", "0.05", "0.03", "0.01")]
    assert names[8:] == ["low_pass=40", "rotation=90"]
    assert [d.name for d in parse_conditions("high_pass")][0] == "high_pass=inf"
    # the benchmark's names that are not generators here say why and what to use
    for name, why in (("eidolonI=8", "eidolon I-III are not implemented"), ("false-colour=True", "is opponent_colour here"),
                      ("salt_and_pepper=0.1", "salt-and-pepper noise is not implemented"), ("phase_scrambling=90", "is phase_noise here")):
        with pytest.raises(ValueError, match=f"unknown distortion generator '{name.split('=')[0]}': .*{why}.*use one of"):
            parse_conditions([name], 224)
    with pytest.raises(ValueError, match="unknown distortion generator 'blur'"):
        parse_conditions(["blur"])
    with pytest.raises(ValueError, match="listed twice"):
        parse_conditions(["contrast=0.5", {"generator": "contrast", "params": [0.5]}])
    for params in (0.5, "0.5"):  # YAML without brackets: "'float' object is not iterable", or the characters of "0.5"
        with pytest.raises(ValueError, match=r"params of 'contrast' must be a list, e.g. params: \[0.5\]"):
            parse_conditions([{"generator": "contrast", "params": params}])
    with pytest.raises(ValueError, match=r"contrast must lie in \[0, 1\]"):
        Distortion("contrast", 1.5)
    with pytest.raises(ValueError, match="0, 90, 180 or 270"):
        Distortion("rotation", 45)
    with pytest.raises(ValueError, match="takes one of"):
        Distortion("colour", "sepia")
    with pytest.raises(ValueError, match="takes a number"):
        Distortion("low_pass", "wide")


def test_bad_images_and_ids_are_refused(images):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Distortion("contrast", 0.5)(images * 255, IDS)
    with pytest.raises(TypeError, match="uint8"):
        Distortion("contrast", 0.5)((images * 255).to(torch.uint8), IDS)
    with pytest.raises(ValueError, match="one image id per image"):
        Distortion("uniform_noise", 0.1)(images, IDS[:2])
    with pytest.raises(ValueError, match="square"):
        Distortion("rotation", 90)(images[:, :, :8, :], IDS)


def test_condition_set_is_a_stimulus_set_and_is_reused_when_unchanged(tmp_path, images):
    import stimuli

    distortion = Distortion("uniform_noise", 0.35)
    out = C.apply_batched(distortion, images, IDS, seed=5, batch_size=2)
    assert torch.equal(out, distortion(images, IDS, seed=5))  # batching changes nothing
    labels = torch.tensor([0, 1, 2, 1, 0])
    kwargs = dict(classes=["zero", "one", "two"], dataset="toy", split="test", seed=5, batch_size=2)
    made = C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **kwargs)
    loaded = stimuli.load_set(tmp_path / "set")  # verifies hashes, PNGs and the manifest
    assert loaded.kind == "condition" and loaded.parameters["generator"] == "uniform_noise"
    assert loaded.parameters["parameter"] == "0.35" and loaded.parameters["seed"] == 5
    assert torch.equal(loaded.images, stimuli.quantise(out).float() / 255)  # the 8-bit pixels people see
    row = loaded.manifest.iloc[1]
    assert (row["id"], row["role"], row["label"], row["class_name"], row["source_index"]) == ("toy-test-00017", "query", 1, "one", 17)
    stamp = (tmp_path / "set" / "manifest.json").stat().st_mtime_ns
    again = C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **kwargs)
    assert (tmp_path / "set" / "manifest.json").stat().st_mtime_ns == stamp and again.fingerprint == made.fingerprint
    other = C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **{**kwargs, "seed": 6})
    assert other.fingerprint != made.fingerprint and not torch.equal(other.images, made.images)
    darker = C.make_condition_set(tmp_path / "set", distortion, images * 0.5, labels, IDS, **kwargs)  # new preprocessing
    assert darker.fingerprint != made.fingerprint and torch.equal(darker.images, stimuli.quantise(distortion(images * 0.5, IDS, seed=5)).float() / 255)
    relabelled = C.make_condition_set(tmp_path / "set", distortion, images, labels.roll(1), IDS, **kwargs)
    assert relabelled.fingerprint != made.fingerprint and relabelled.manifest["label"].tolist() == labels.roll(1).tolist()
    with pytest.raises(ValueError, match="one label and one source index per image"):
        C.make_condition_set(tmp_path / "bad", distortion, images, labels[:2], IDS, **kwargs)
    with pytest.raises(ValueError, match="no images for the condition set"):  # torch.cat's "expected a non-empty list" before
        C.make_condition_set(tmp_path / "bad", distortion, images[:0], labels[:0], [], **kwargs)
    renamed = C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **{**kwargs, "classes": ["nil", "uno", "dos"]})
    assert renamed.manifest["class_name"].tolist() == ["nil", "uno", "dos", "uno", "nil"]  # the cache kept the old names
    C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **kwargs)
    # a damaged cache is made again (it stopped compare, whose advice overwrite=true compare does not take)
    with open(tmp_path / "set" / "tensors.safetensors", "r+b") as f:
        f.truncate(100)
    remade = C.make_condition_set(tmp_path / "set", distortion, images, labels, IDS, **kwargs)
    assert remade.fingerprint == made.fingerprint and torch.equal(stimuli.load_set(tmp_path / "set").images, made.images)


def test_a_high_pass_set_made_before_inf_meant_the_original_is_rebuilt(tmp_path, images, monkeypatch):
    """The generator's description is part of the set's fingerprint: its new wording rebuilds the old sets."""
    import dataclasses

    labels, kwargs = torch.tensor([0, 1, 2, 1, 0]), dict(classes=["zero", "one", "two"], dataset="toy", split="test")
    old_spec = dataclasses.replace(C.GENERATORS["high_pass"], description="x − G_sigma(x) shifted to mean 0.4423, sigma in px at 224 px",
                                   identity=(), apply=lambda d, x, ids, seed: (x - x.mean(dim=(2, 3), keepdim=True) + MVH_GREY).clamp(0, 1))
    monkeypatch.setitem(C.GENERATORS, "high_pass", old_spec)
    stale = C.make_condition_set(tmp_path / "set", Distortion("high_pass", "inf"), images, labels, IDS, **kwargs)
    monkeypatch.undo()
    rebuilt = C.make_condition_set(tmp_path / "set", Distortion("high_pass", "inf"), images, labels, IDS, **kwargs)
    assert rebuilt.fingerprint != stale.fingerprint
    assert torch.equal(rebuilt.images, stimuli_quantised(Distortion("low_pass", 0)(images, IDS)))


def stimuli_quantised(images):
    import stimuli

    return stimuli.quantise(images).float() / 255


@pytest.mark.gpu
def test_distortions_run_on_the_inputs_device_with_the_same_result(images):
    for distortion in parse_conditions(["uniform_noise=0.2", "phase_noise=90", "low_pass=15", "opponent_colour=opponent"]):
        cpu = distortion(images, IDS, seed=2)
        gpu = distortion(images.cuda(), IDS.cuda(), seed=2)
        assert gpu.device.type == "cuda"
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=0)


def test_high_pass_below_the_images_resolution_is_named_and_is_flat_grey(tmp_path, caplog):
    import stimuli

    g = torch.Generator().manual_seed(1)
    photos = torch.rand(4, 3, 32, 32, generator=g)
    flagged = [p for p in C.GRIDS["high_pass"] if Distortion("high_pass", p).below_resolution(32)]
    assert flagged == [1.5, 1, 0.7, 0.55, 0.45, 0.4]  # at 32 px; 3 (sigma 0.43 px) still keeps edges
    assert not [p for p in C.GRIDS["high_pass"] if Distortion("high_pass", p).below_resolution(224)]
    for parameter in C.GRIDS["high_pass"]:
        levels = stimuli.quantise(Distortion("high_pass", parameter)(photos, torch.arange(4))).unique().numel()
        assert (levels == 1) == (parameter in flagged)  # the criterion is exactly "one 8-bit level is left"
    assert "sigma 0.214 px, below the image's resolution" in Distortion("high_pass", 1.5).below_resolution(32)
    assert Distortion("low_pass", 1).below_resolution(32) is None
    # sigma 0.30 px at 96 px: a neighbour weighs 1/255, but four of them leave a checkerboard 4 levels (it was called flat)
    checker = ((torch.arange(96)[:, None] + torch.arange(96)[None]) % 2).float().expand(1, 3, 96, 96)
    assert stimuli.quantise(Distortion("high_pass", 0.7)(checker, torch.arange(1))).unique().numel() > 1
    assert Distortion("high_pass", 0.7).below_resolution(96) is None
    with caplog.at_level("WARNING", logger="stimuli.distortions"):
        C.make_condition_set(tmp_path / "set", Distortion("high_pass", 1), photos, torch.zeros(4, dtype=torch.long), range(4),
                             classes=["a"], dataset="toy")
    assert "high_pass=1 at 32 px" in caplog.text and "flat grey" in caplog.text
