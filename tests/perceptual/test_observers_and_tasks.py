"""Observers (batched = pair by pair, variants, offline errors) and task scoring on hand-built trials."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

from perceptual.observers import (
    LPIPSObserver,
    Panel,
    PixelL2Observer,
    SSIMObserver,
    default_panel,
    make_observer,
    quantize_8bit,
)
from perceptual.tasks import (
    bootstrap_interval,
    controversial_spread,
    judge_2afc,
    judge_clustering,
    panel_summary,
    summarize,
    wilson_interval,
)


def flat_images(values: dict[str, float]) -> tuple[torch.Tensor, dict[str, int]]:
    """Constant grey images: the pixel-L2 observer's distance between them is |v_a − v_b|."""
    ids = list(values)
    images = torch.stack([torch.full((3, 8, 8), values[i]) for i in ids])
    return images, {i: k for k, i in enumerate(ids)}


def test_2afc_scoring_with_known_distances_and_ties():
    images, index = flat_images({"q1": 0.5, "t1": 0.45, "s1": 0.9, "q2": 0.5, "t2": 0.9, "s2": 0.55, "q3": 0.5, "t3": 0.25, "s3": 0.75})
    trials = pd.DataFrame(
        {
            "trial": [0, 1, 2, 3],
            "query_id": ["q1", "q2", "q3", "t1"],
            "left_id": ["s1", "t2", "t3", "t1"],
            "right_id": ["t1", "s2", "s3", "s1"],
            "answer": ["right", "left", "left", "left"],
            "target_id": ["t1", "t2", "t3", "t1"],
            "seed_type": ["noise", "train", "noise", "noise"],
            "attention_check": [False, False, False, True],
        }
    )
    judged = judge_2afc(trials, images, index, PixelL2Observer(), tie_tolerance=1e-6)
    assert judged["choice"].tolist() == ["right", "right", "tie", "left"]
    assert judged["credit"].tolist() == [1.0, 0.0, 0.5, 1.0]
    summary = summarize(judged)
    assert summary["overall"]["accuracy"] == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3, the check left out
    assert summary["overall"]["ties"] == 1 and summary["overall"]["n"] == 3
    assert summary["by_seed_type"]["noise"]["accuracy"] == pytest.approx(0.75)
    assert summary["attention_pass_rate"] == 1.0
    assert summary["per_target"] == {"t1": 1.0, "t2": 0.0, "t3": 0.5}


def test_clustering_scoring_with_known_distances_and_three_way_ties():
    images, index = flat_images({"a": 0.1, "b": 0.5, "c": 0.9, "ra": 0.15, "rb": 0.8, "rc": 0.5 + 0.4, "mid": 0.5})
    trials = pd.DataFrame(
        {
            "trial": [0, 0, 0, 0],
            "query_id": ["ra", "rb", "rc", "mid"],
            "column_0": ["a"] * 4,
            "column_1": ["b"] * 4,
            "column_2": ["c"] * 4,
            "answer": [0, 1, 2, 1],
            "target_id": ["a", "b", "c", "b"],
            "seed_type": ["noise"] * 4,
            "attention_check": [False] * 4,
        }
    )
    judged = judge_clustering(trials, images, index, PixelL2Observer())
    assert judged["choice"].tolist() == [0, 2, 2, 1]
    assert judged["credit"].tolist() == [1.0, 0.0, 1.0, 1.0]
    # All three columns equal: a three-way tie earns 1/3.
    same, same_index = flat_images({"x": 0.3, "y": 0.3, "z": 0.3, "r": 0.6})
    tie = judge_clustering(
        pd.DataFrame({"query_id": ["r"], "column_0": ["x"], "column_1": ["y"], "column_2": ["z"], "answer": [2]}), same, same_index, PixelL2Observer()
    )
    assert tie["credit"].iloc[0] == pytest.approx(1 / 3) and bool(tie["tie"].iloc[0])


def test_a_nan_distance_is_refused_not_scored_as_a_choice():
    """A NaN is no tie and never nearer: 2AFC chose 'right' (credit by the answer's side), clustering gave NaN credit."""

    class NaNForOne(PixelL2Observer):
        name = "nan-for-one"

        def pairwise_images(self, a, b):
            d = super().pairwise_images(a, b)
            return torch.where((a - 0.7).abs().amax(dim=(1, 2, 3)) < 1e-6, torch.nan, d)

    images, index = flat_images({"q": 0.5, "t": 0.45, "s": 0.9, "odd": 0.7})
    two_afc = pd.DataFrame({"trial": [0, 7], "query_id": ["q", "odd"], "left_id": ["s", "s"], "right_id": ["t", "t"], "answer": ["right", "left"]})
    with pytest.raises(ValueError, match=r"observer 'nan-for-one' returned 2 non-finite distance\(s\), first in trial 7"):
        judge_2afc(two_afc, images, index, NaNForOne())
    rows = pd.DataFrame({"query_id": ["q", "odd"], "column_0": ["t"] * 2, "column_1": ["s"] * 2, "column_2": ["q"] * 2, "answer": [0, 1]})
    with pytest.raises(ValueError, match=r"returned 3 non-finite distance\(s\), first in trial 1"):
        judge_clustering(rows, images, index, NaNForOne())


def test_missing_trial_image_names_the_problem():
    images, index = flat_images({"q": 0.1, "t": 0.2})
    trials = pd.DataFrame({"query_id": ["q"], "left_id": ["t"], "right_id": ["gone"], "answer": ["left"]})
    with pytest.raises(KeyError, match="not in the stimulus set"):
        judge_2afc(trials, images, index, PixelL2Observer())


@pytest.mark.parametrize("k, n", [(8, 10), (0, 12), (45, 50), (1, 1)])
def test_wilson_interval_matches_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(ref.low, abs=1e-9) and high == pytest.approx(ref.high, abs=1e-9)
    assert math.isnan(wilson_interval(0, 0)[0])


def test_bootstrap_interval_covers_the_mean_and_respects_clusters():
    rng = np.random.default_rng(0)
    credit = rng.random(200) < 0.7
    low, high = bootstrap_interval(credit.astype(float), seed=1)
    assert low < credit.mean() < high and 0.05 < high - low < 0.2
    # Perfectly correlated within clusters of 10: the cluster bootstrap is wider than the naive one.
    clustered = np.repeat(rng.random(20) < 0.5, 10).astype(float)
    naive = bootstrap_interval(clustered, seed=2)
    by_cluster = bootstrap_interval(clustered, np.repeat(np.arange(20), 10), seed=2)
    assert (by_cluster[1] - by_cluster[0]) > 2 * (naive[1] - naive[0])


def test_default_interval_counts_targets_not_rows():
    """Copies of the same judgements (a result judged in several clustering rows) add no information: the default
    interval resamples targets and does not narrow, where Wilson's interval over rows shrinks as if they did."""
    rng = np.random.default_rng(0)
    targets = [f"t{i}" for i in range(30)]
    once = pd.DataFrame({"target_id": targets, "seed_type": "noise", "attention_check": False, "tie": False,
                         "credit": (rng.random(30) < 0.6).astype(float)})
    six_times = pd.concat([once] * 6, ignore_index=True)
    default_once, default_six = summarize(once)["overall"], summarize(six_times)["overall"]
    assert summarize(once)["interval"] == "bootstrap"
    assert (default_six["ci_low"], default_six["ci_high"]) == pytest.approx((default_once["ci_low"], default_once["ci_high"]))
    wilson_once, wilson_six = summarize(once, interval="wilson")["overall"], summarize(six_times, interval="wilson")["overall"]
    assert wilson_six["ci_high"] - wilson_six["ci_low"] < 0.5 * (wilson_once["ci_high"] - wilson_once["ci_low"])


def test_too_few_targets_to_resample_take_wilsons_interval():
    """One target with credits 1, 0, 1, 1 gave the interval [0.75, 0.75]: resampling one target always draws it again
    (a converged-only score can have that few targets)."""
    one = pd.DataFrame({"target_id": "t0", "seed_type": "noise", "attention_check": False, "tie": False, "credit": [1.0, 0.0, 1.0, 1.0]})
    overall = summarize(one)["overall"]
    assert overall["ci_method"] == "wilson" and overall["n_targets"] == 1
    assert (overall["ci_low"], overall["ci_high"]) == pytest.approx(wilson_interval(3.0, 4)) and overall["ci_high"] - overall["ci_low"] > 0.5
    many = pd.DataFrame({"target_id": [f"t{i}" for i in range(6)], "seed_type": "noise", "attention_check": False, "tie": False,
                         "credit": [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]})
    assert summarize(many)["overall"]["ci_method"] == "bootstrap"


def test_lpips_batched_equals_the_package_pair_by_pair():
    torch.manual_seed(0)
    x = torch.rand(5, 3, 32, 32)
    for heads in (True, False):
        observer = LPIPSObserver("alex", backbone="random", heads=heads)
        matrix = observer.matrix(x)
        reference = torch.tensor([[observer.lpips(x[i : i + 1], x[j : j + 1], normalize=True).item() for j in range(5)] for i in range(5)])
        torch.testing.assert_close(matrix, reference, atol=2e-6, rtol=1e-5)
        pairs = observer.pairwise(x, torch.tensor([0, 3, 4]), torch.tensor([1, 3, 2]))
        torch.testing.assert_close(pairs, reference[[0, 3, 4], [1, 3, 2]], atol=2e-6, rtol=1e-5)
        assert pairs[1] == pytest.approx(0.0, abs=1e-6)


def test_lpips_pairs_are_judged_batch_size_at_a_time(monkeypatch):
    # Each pair's weighted feature product is as large as an image's features (4 MB at 224 px): 18,000 clustering
    # pairs at once needed ~78 GB, so pairwise hands them to the distance in slices of batch_size.
    torch.manual_seed(0)
    x = torch.rand(6, 3, 32, 32)
    observer = LPIPSObserver("alex", backbone="random", heads=True)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    whole = observer.pairwise(x, i.flatten(), j.flatten())
    sizes, distances = [], type(observer)._distances

    def counting(self, fa, fb, pairs):
        sizes.append(len(pairs[0]))
        return distances(self, fa, fb, pairs)

    monkeypatch.setattr(type(observer), "_distances", counting)
    observer.batch_size = 8
    sliced = observer.pairwise(x, i.flatten(), j.flatten())
    assert sizes == [8, 8, 8, 8, 4]
    torch.testing.assert_close(sliced, whole, atol=0, rtol=0)
    assert len(observer.pairwise(x, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))) == 0


def test_weight_free_observers_batched_equal_pair_by_pair_and_are_metrics_like():
    torch.manual_seed(1)
    x = torch.rand(4, 3, 32, 32)
    for observer in (SSIMObserver(), SSIMObserver(multiscale=True), PixelL2Observer()):
        matrix = observer.matrix(x)
        single = torch.tensor([[observer.pairwise_images(x[i : i + 1], x[j : j + 1]).item() for j in range(4)] for i in range(4)])
        torch.testing.assert_close(matrix, single, atol=1e-5, rtol=1e-5)
        assert matrix.diag().abs().max() < 1e-6 and torch.allclose(matrix, matrix.T, atol=1e-6)
        assert (matrix + torch.eye(4)).min() > 0


def test_ssim_agrees_with_scikit_image():
    from skimage.metrics import structural_similarity

    torch.manual_seed(2)
    a = torch.rand(1, 3, 32, 32)
    b = (a + 0.1 * torch.randn_like(a)).clamp(0, 1)
    ours = 1 - SSIMObserver().pairwise_images(a, b).item()
    theirs = structural_similarity(
        a[0].permute(1, 2, 0).numpy(), b[0].permute(1, 2, 0).numpy(), channel_axis=2, data_range=1.0, gaussian_weights=True, sigma=1.5,
        use_sample_covariance=False
    )
    assert ours == pytest.approx(theirs, abs=0.02)  # border handling differs (reflect vs scikit-image's crop)


@pytest.mark.parametrize("sigma", [0.8, 3.0])
def test_single_scale_ssim_is_kornias_at_its_sigma_and_honours_another(sigma):
    """kornia.metrics.ssim fixes sigma at 1.5; the observer equals it there and follows its own sigma elsewhere, as
    scikit-image does with the same sigma (its crop of the border aside)."""
    import kornia
    from skimage.metrics import structural_similarity

    torch.manual_seed(3)
    a = torch.rand(2, 3, 32, 32)
    b = (a + 0.1 * torch.randn_like(a)).clamp(0, 1)
    torch.testing.assert_close(SSIMObserver().pairwise_images(a, b), 1 - kornia.metrics.ssim(a, b, 11).flatten(1).mean(1), atol=1e-6, rtol=0)
    ours = SSIMObserver(sigma=sigma).pairwise_images(a, b)
    assert (ours - SSIMObserver().pairwise_images(a, b)).abs().min() > 1e-3
    theirs = [1 - structural_similarity(a[i].permute(1, 2, 0).numpy(), b[i].permute(1, 2, 0).numpy(), channel_axis=2, data_range=1.0,
                                        gaussian_weights=True, sigma=sigma, use_sample_covariance=False) for i in range(2)]
    assert ours.tolist() == pytest.approx(theirs, abs=0.02)


def test_missing_lpips_weights_name_the_file_and_the_offline_variants(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"alexnet weights, not found at .*hub/checkpoints/alexnet-owt-7be5be79\.pth") as info:
        LPIPSObserver("alex")
    # the keys named are the command line's own
    assert "lpips_weights=FILE" in str(info.value) and "observers=[lpips-random-backbone" in str(info.value)
    assert "observer.weights_path" not in str(info.value) and "backbone=random (" not in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"LPIPS-alex weights file not found: .*missing\.pth\. lpips_weights="):
        LPIPSObserver("alex", weights_path=str(tmp_path / "missing.pth"))
    panel = default_panel()
    assert panel.names[:2] == ["lpips-alex [random backbone, real heads]", "lpips-alex [random backbone, no heads]"]
    assert "ssim" in panel.names and "pixel-l2" in panel.names


def test_pretrained_backbone_loads_from_the_cache_without_download(tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(3)
    alexnet = torchvision.models.alexnet(weights=None)
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(alexnet.state_dict(), tmp_path / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth")
    observer = LPIPSObserver("alex")
    assert observer.name == "lpips-alex" and observer.variant == "lpips"
    torch.testing.assert_close(getattr(observer.lpips.net.slice2, "3").weight, alexnet.features[3].weight)
    assert default_panel().names[0] == "lpips-alex"
    # an explicit file, written with a variable as a YAML config may, is the one the panel uses
    monkeypatch.setenv("REPALIGN_WEIGHTS", str(tmp_path / "hub" / "checkpoints"))
    assert default_panel(weights_path="$REPALIGN_WEIGHTS/alexnet-owt-7be5be79.pth").names[:2] == ["lpips-alex", "lpips-alex [pretrained backbone, no heads]"]
    # a mistyped one is an error, not a quiet switch to the random backbone
    with pytest.raises(FileNotFoundError, match=r"LPIPS-alex weights file not found: .*alexnet-owt\.pth"):
        default_panel(weights_path=str(tmp_path / "alexnet-owt.pth"))


def test_a_weights_file_of_another_shape_names_what_it_should_hold(tmp_path):
    import torchvision

    alexnet = torchvision.models.alexnet(weights=None).state_dict()
    files = {"wrapped": {"model": alexnet}, "prefixed": {f"module.{k}": v for k, v in alexnet.items()},
             "vgg": torchvision.models.vgg11(weights=None).features.state_dict()}
    files["vgg"] = {f"features.{k}": v for k, v in files["vgg"].items()}
    for name, state in files.items():  # were: KeyError 'features.0.weight' / a bare size mismatch
        torch.save(state, tmp_path / f"{name}.pth")
        with pytest.raises(ValueError, match=r"torchvision's ImageNet alexnet weights"):
            LPIPSObserver("alex", weights_path=str(tmp_path / f"{name}.pth"))


def test_an_image_given_as_lpips_weights_is_named_as_one(tmp_path):
    """A PNG gave torch's multi-line safe-load message, which advised weights_only=False and named no option."""
    png = tmp_path / "img.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    with pytest.raises(ValueError, match=r"^lpips_weights=.*img\.png is not a readable torchvision weights file .*: .*not a checkpoint") as info:
        LPIPSObserver("alex", weights_path=str(png))
    assert "\n" not in str(info.value) and "weights_only" not in str(info.value)


@pytest.mark.parametrize("observer", [PixelL2Observer(), SSIMObserver(), LPIPSObserver("alex", backbone="random")], ids=lambda o: o.name)
def test_pair_indices_must_pair_up_and_lie_among_the_images(observer):
    x = torch.rand(4, 3, 16, 16)
    with pytest.raises(ValueError, match="one length"):  # returned one distance for three pairs
        observer.pairwise(x, torch.tensor([0]), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="one length"):  # broadcast image 3 against three images
        observer.pairwise(x, torch.tensor([0, 1, 2]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\).*\[-1, 1\]"):  # wrapped round to the last image
        observer.pairwise(x, torch.tensor([0, 1]), torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="whole numbers .* dtype torch.float32"):  # truncated to [0], [1]
        observer.pairwise(x, torch.tensor([0.9]), torch.tensor([1.7]))
    with pytest.raises(ValueError, match="whole numbers .* dtype torch.bool.*nonzero"):  # read as the indices 1 and 0
        observer.pairwise(x, torch.tensor([True, False]), torch.tensor([1, 2]))


def test_lpips_distances_build_no_autograd_graph():
    """LPIPS's pairwise and matrix lost the base class's no_grad: images straight from an optimisation built a graph
    over every image's features (same values, far more memory)."""
    observer = LPIPSObserver("alex", backbone="random")
    x = torch.rand(3, 3, 32, 32, requires_grad=True)
    assert not observer.pairwise(x, [0, 1], [1, 2]).requires_grad and not observer.matrix(x).requires_grad


def test_lpips_matrix_checks_both_sets_before_embedding_either(monkeypatch):
    observer = LPIPSObserver("alex", backbone="random")
    embedded = []
    embed = type(observer).embed
    monkeypatch.setattr(type(observer), "embed", lambda self, images: embedded.append(len(images)) or embed(self, images))
    a = torch.rand(5, 3, 32, 32)
    with pytest.raises(ValueError, match="second set.*NaN"):
        observer.matrix(a, torch.full((2, 3, 32, 32), math.nan))
    with pytest.raises(ValueError, match=r"differ in shape: \(3, 32, 32\) and \(3, 40, 40\)"):  # was: "mm: mat1 and mat2 shapes"
        observer.matrix(a, torch.rand(2, 3, 40, 40))
    with pytest.raises(ValueError, match="channels-last"):
        observer.matrix(a.permute(0, 2, 3, 1).contiguous())
    assert embedded == []
    grey = torch.rand(3, 1, 32, 32)  # greyscale stays accepted: the package repeats it over RGB
    torch.testing.assert_close(observer.matrix(grey), observer.matrix(grey.repeat(1, 3, 1, 1)), atol=1e-6, rtol=1e-5)


def test_8bit_quantisation_and_unknown_observer():
    x = torch.tensor([0.0, 0.5, 1.0, 0.2])
    assert torch.equal(quantize_8bit(x) * 255, torch.round(x * 255))
    with pytest.raises(ValueError, match="unknown observer 'lpips2'"):
        make_observer("lpips2")


def test_panel_summary_and_unique_names():
    summary = panel_summary({"a": 0.6, "b": 0.8, "c": 0.7})
    assert summary["mean"] == pytest.approx(0.7) and summary["std"] == pytest.approx(0.1)
    for lone in ({"lpips": 0.71}, {"lpips": 0.71, "ssim": math.nan}):  # one score: no spread to show, not a perfect agreement
        assert panel_summary(lone)["mean"] == 0.71 and math.isnan(panel_summary(lone)["std"])
    with pytest.raises(ValueError, match="unique"):
        Panel([PixelL2Observer(), PixelL2Observer()])
    shouting = PixelL2Observer()
    shouting.name = "Pixel L2"  # the same slug, pixel-l2: the same file names and simulated subjects
    with pytest.raises(ValueError, match=r"observers \[\['pixel-l2', 'Pixel L2'\]\] differ only in case or punctuation"):
        Panel([PixelL2Observer(), shouting])


def test_controversial_spread_is_the_papers_table_2_score_with_the_origin():
    images, index = flat_images({"o1": 0.0, "o1-a": 0.1, "o1-b": 0.3, "o1-c": 0.5, "o2": 0.5, "o2-a": 0.5, "o2-b": 0.5,
                                 "p1-a": 0.0, "p1-b": 1.0})
    manifest = pd.DataFrame(
        {
            "id": ["o1-a", "o1-b", "o1-c", "o2-a", "o2-b", "p1-a", "p1-b"],
            "role": ["result"] * 7,
            "origin_id": ["o1", "o1", "o1", "o2", "o2", "o1", "o1"],
            "direction": ["A/B"] * 5 + ["B/A"] * 2,
        }
    )
    spread = controversial_spread(manifest, images, index, PixelL2Observer())
    # A/B, o1: {x0=0, .1, .3, .5}: pairs .1 .3 .5 .2 .4 .2 -> 1.7/6; o2: {x0=.5, .5, .5}: 0 -> mean 1.7/12
    assert spread["A/B"]["mean"] == pytest.approx(1.7 / 12, abs=1e-6) and spread["A/B"]["n_origins"] == 2
    assert spread["A/B"]["per_origin"]["o1"] == pytest.approx(1.7 / 6, abs=1e-6)
    # beside it: the distance to the origin (o1: .1 .3 .5 -> .3; o2: 0) and the spread without x0 (o1: .8/3; o2: 0)
    assert spread["A/B"]["to_origin"]["mean"] == pytest.approx(0.15, abs=1e-6)
    assert spread["A/B"]["among_results"]["mean"] == pytest.approx((0.8 / 3) / 2, abs=1e-6)
    # B/A, o1: {0, 0, 1}: pairs 0, 1, 1 -> 2/3
    assert spread["B/A"]["mean"] == pytest.approx(2 / 3, abs=1e-6) and spread["B/A"]["n_origins"] == 1
    with pytest.raises(KeyError, match="origin images .* are not in the set"):
        controversial_spread(manifest.assign(origin_id="nowhere"), images, index, PixelL2Observer())


def test_every_weight_free_observer_moves_with_to():
    """The pixel observer has no parameter or buffer: .to("cuda") moved nothing, its device stayed the CPU, and a GPU run
    judged every image on the CPU. The cache key is unchanged (the anchor is no weight)."""
    fingerprint = PixelL2Observer().fingerprint()
    for observer in (PixelL2Observer(), SSIMObserver(), SSIMObserver(multiscale=True)):
        assert observer.to("meta").device.type == "meta"
    assert PixelL2Observer().fingerprint() == fingerprint
