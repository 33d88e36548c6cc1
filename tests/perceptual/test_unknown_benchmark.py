"""Kim et al.'s unknown-detection benchmark (perceptual.unknown_benchmark) on a CIFAR-100-format folder the test writes."""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from perceptual.metrics import auroc, fpr_at_tpr
from perceptual.unknown_benchmark import cifar_benchmark, evaluate_scores, known_unknown_split, read_far_unknown, unknown_table
from training import load_dataset

NAMES = ["apple", "bear", "cloud", "dolphin", "girl"]


def write_cifar100(root, per_class=4):
    """cifar-100-python/{train,test,meta} with 5 classes; image i of class c is filled with the value 10·c + i."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        labels = [c for c in range(len(NAMES)) for _ in range(per_class)]
        data = np.stack([np.full(3072, 10 * c + i, dtype=np.uint8) for c in range(len(NAMES)) for i in range(per_class)])
        with open(folder / split, "wb") as f:
            pickle.dump({"data": data, "fine_labels": labels}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": NAMES}, f)
    return root


def test_known_and_near_unknown_classes(tmp_path):
    root = write_cifar100(tmp_path)
    known, unknown = cifar_benchmark(root, ["girl", "bear"])
    assert known.classes == ["girl", "bear"] and unknown.classes == ["apple", "cloud", "dolphin"]
    assert len(known) == 8 and len(unknown) == 12
    # relabelled in the given order: girl (old 4) → 0, bear (old 1) → 1; the first pixel tells the old class
    assert known.labels.tolist() == [1] * 4 + [0] * 4
    assert (known.images[:, 0, 0, 0] // 10).tolist() == [1] * 4 + [4] * 4
    assert unknown.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    full = load_dataset("cifar100", "test", root=root)
    with pytest.raises(ValueError, match=r"known classes \['zebra'\] are not classes"):
        known_unknown_split(full, ["zebra"])
    with pytest.raises(ValueError, match="repeats"):
        known_unknown_split(full, ["bear", "bear"])
    with pytest.raises(ValueError, match="every class is known"):
        known_unknown_split(full, NAMES)


def test_far_unknown_folder_is_read_and_resized(tmp_path):
    (tmp_path / "svhn" / "a").mkdir(parents=True)
    Image.fromarray(np.full((64, 64, 3), 200, dtype=np.uint8)).save(tmp_path / "svhn" / "a" / "1.png")
    Image.fromarray(np.full((32, 32, 3), 7, dtype=np.uint8)).save(tmp_path / "svhn" / "2.jpg", quality=100)
    images = read_far_unknown(tmp_path / "svhn")
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.uint8
    assert int(images[0].float().mean().round()) == 7 and int(images[1, 0, 0, 0]) == 200  # sorted by path: 2.jpg < a/1.png
    (tmp_path / "svhn" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"1 unreadable image\(s\).*bad.png"):
        read_far_unknown(tmp_path / "svhn")
    with pytest.raises(FileNotFoundError, match="no far-unknown image folder"):
        read_far_unknown(tmp_path / "lsun")


def test_a_far_unknown_limit_is_a_seeded_draw_over_the_whole_folder(tmp_path):
    """far_limit took the first files by path: of a folder per class (DTD's textures), the first classes only."""
    for k, texture in enumerate(["banded", "zigzagged"]):
        (tmp_path / texture).mkdir()
        for i in range(20):
            Image.fromarray(np.full((8, 8, 3), 100 * k + i, dtype=np.uint8)).save(tmp_path / texture / f"{i:02d}.png")
    levels = [read_far_unknown(tmp_path, size=8, limit=10, seed=seed)[:, 0, 0, 0].tolist() for seed in range(3)]
    # both classes in every draw (a draw of 10 of 40 misses one with probability 4e-4), in path order
    assert all(len(drawn) == 10 and min(drawn) < 100 <= max(drawn) and drawn == sorted(drawn) for drawn in levels)
    assert levels[0] == read_far_unknown(tmp_path, size=8, limit=10, seed=0)[:, 0, 0, 0].tolist() and levels[0] != levels[1]
    assert len(read_far_unknown(tmp_path, size=8, limit=100)) == 40
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        read_far_unknown(tmp_path, size=8, limit=0)


def test_the_table_and_its_improvement_ratio():
    results = {
        "max_softmax": {"accuracy": 0.8, "unknown_aurc": 0.4, "aurc": 0.2, "eaurc": 0.1, "ece": 0.05, "auroc": {"near": 0.8},
                        "fpr_at_95_tpr": {"near": 0.5}},
        "energy": {"accuracy": 0.8, "unknown_aurc": 0.3, "aurc": 0.1, "eaurc": 0.1, "ece": None, "auroc": {"near": 0.9},
                   "fpr_at_95_tpr": {"near": 0.6}},
        "mc_dropout": {"error": "no dropout layers"},
    }
    table = unknown_table(results).set_index("score")
    assert table.loc["energy", "aurc_improvement"] == pytest.approx(0.5)          # (0.2 − 0.1) / 0.2
    assert table.loc["energy", "unknown_aurc_improvement"] == pytest.approx(0.25)  # (0.4 − 0.3) / 0.4: lower is better
    assert table.loc["energy", "accuracy_improvement"] == pytest.approx(0.0)
    assert table.loc["energy", "eaurc_improvement"] == pytest.approx(0.0)
    assert table.loc["energy", "auroc_near_improvement"] == pytest.approx(0.125)   # (0.9 − 0.8) / 0.8
    assert table.loc["energy", "fpr_at_95_tpr_near_improvement"] == pytest.approx(-0.2)  # worse: negative
    assert math.isnan(table.loc["energy", "ece_improvement"])
    assert table.loc["max_softmax", "aurc_improvement"] == 0.0
    assert table.loc["mc_dropout", "error"] == "no dropout layers" and math.isnan(table.loc["mc_dropout", "aurc"])
    with pytest.raises(ValueError, match="baseline 'odin'"):
        unknown_table(results, baseline="odin")


def test_scores_of_a_model_on_known_and_unknown_images(tmp_path):
    root = write_cifar100(tmp_path)
    known, near = cifar_benchmark(root, ["apple", "bear"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2)).eval()
    results = evaluate_scores(model, known, {"near": near.images}, ["max_softmax", "energy"])
    with torch.no_grad():
        id_logits = model(known.images.float() / 255).double()
        ood_logits = model(near.images.float() / 255).double()
    msp_id, msp_ood = id_logits.softmax(1).max(1).values.numpy(), ood_logits.softmax(1).max(1).values.numpy()
    assert results["max_softmax"]["auroc"]["near"] == pytest.approx(auroc(msp_id, msp_ood))
    assert results["max_softmax"]["fpr_at_95_tpr"]["near"] == pytest.approx(fpr_at_tpr(msp_id, msp_ood, 0.95))
    energy_id, energy_ood = torch.logsumexp(id_logits, 1).numpy(), torch.logsumexp(ood_logits, 1).numpy()
    assert results["energy"]["auroc"]["near"] == pytest.approx(auroc(energy_id, energy_ood))
    assert results["max_softmax"]["accuracy"] == pytest.approx(float((id_logits.argmax(1) == known.labels).double().mean()))
    table = unknown_table(results)
    assert list(table["score"]) == ["max_softmax", "energy"] and "auroc_near_improvement" in table.columns


def test_scores_that_do_not_apply_are_refused_before_any_image_is_scored(tmp_path, monkeypatch):
    """Feature scores on a model without a penultimate layer: every row an error gave a bare KeyError in the figure, after
    every image was scored; a baseline that does not apply left every improvement ratio NaN."""
    import perceptual.scores

    root = write_cifar100(tmp_path)
    known, near = cifar_benchmark(root, ["apple", "bear"])
    fit, _ = cifar_benchmark(root, ["apple", "bear"], split="train")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2)).eval()
    scored = []
    monkeypatch.setattr(perceptual.scores, "model_outputs", lambda *a, **k: scored.append(1))
    with pytest.raises(ValueError, match=r"none of the scores \['mahalanobis', 'knn'\] applies to this model \(mahalanobis: needs the "
                                         r"penultimate layer's features.*add max_softmax"):
        evaluate_scores(model, known, {"near": near.images}, ["mahalanobis", "knn"], fit=fit)
    with pytest.raises(ValueError, match=r"mahalanobis, the baseline of the improvement ratios, does not apply .*baseline=max_softmax"):
        evaluate_scores(model, known, {"near": near.images}, ["max_softmax", "mahalanobis"], fit=fit, required=["mahalanobis"])
    assert scored == []
